"""hypotheses.yaml: every bad input gets one clear error naming the key and the line."""

from __future__ import annotations

import textwrap

import pytest

from bisect_harness.errors import SpecError
from bisect_harness.model import Expect
from bisect_harness.spec import load_spec, parse_spec

GOOD = textwrap.dedent("""\
    version: 1
    engine:
      preset: openai
      launch: [my-server, --port, "{port}"]
      env: {NCCL_NVLS_ENABLE: "0"}
      flags: {tp: 2}
    benchmark:
      output_tokens: 32
    defaults:
      boots_per_arm: 2
      max_boots_per_arm: 4
    hypotheses:
      - id: steps
        statement: more draft steps are faster
        baseline: {flags: {speculative-num-steps: 0}}
        treatment: {env: {NCCL_ALGO: Ring}}
        metric: tok_s
        expect: increase
        min_effect: 10%
        matrix:
          flags.speculative-num-steps: [1, 2, 3]
    """)


def parse(text, tmp_path):
    return parse_spec(textwrap.dedent(text), tmp_path / "hypotheses.yaml")


def test_good_spec_freezes_and_expands_matrix(tmp_path):
    spec = parse(GOOD, tmp_path)
    assert [h.id for h in spec.hypotheses] == [
        "steps[speculative-num-steps=1]", "steps[speculative-num-steps=2]", "steps[speculative-num-steps=3]"]
    h = spec.hypotheses[1]
    assert h.expect is Expect.INCREASE and h.min_effect == pytest.approx(0.10)
    assert h.treatment.flags == {"speculative-num-steps": 2}
    assert h.treatment.env == {"NCCL_ALGO": "Ring"}
    assert h.baseline.flags == {"speculative-num-steps": 0}
    assert spec.engine.launch == ("my-server", "--port", "{port}")
    assert spec.benchmark.output_tokens == 32
    assert spec.defaults.max_boots_per_arm == 4
    with pytest.raises(Exception):
        spec.defaults.alpha = 0.1  # frozen


def test_select_only(tmp_path):
    spec = parse(GOOD, tmp_path)
    assert len(spec.select(["steps"]).hypotheses) == 3
    assert len(spec.select(["steps[speculative-num-steps=2]"]).hypotheses) == 1
    with pytest.raises(SpecError, match="no such hypothesis"):
        spec.select(["nope"])


@pytest.mark.parametrize("bad, key, line, words", [
    (GOOD.replace("expect: increase", "expect: faster"), "hypotheses[0].expect", 18, "increase"),
    (GOOD.replace("metric: tok_s", "metric: tokps"), "hypotheses[0].metric", 17, "unknown metric"),
    (GOOD.replace("min_effect: 10%", "min_effect: 250%"), "hypotheses[0].min_effect", 19, "between 0 and 1"),
    (GOOD.replace("min_effect: 10%", "min_effect: lots"), "hypotheses[0].min_effect", 19, "percentage"),
    (GOOD.replace("  boots_per_arm: 2", "  boots_per_arm: two"), "defaults.boots_per_arm", 10, "integer"),
    (GOOD.replace("  boots_per_arm: 2", "  boots_per_arms: 2"), "defaults.boots_per_arms", 10, "did you mean"),
    (GOOD.replace("benchmark:", "benchmarks:"), "benchmarks", 7, "unknown key"),
    (GOOD.replace("flags.speculative", "flag.speculative"), "hypotheses[0].matrix.flag.speculative-num-steps",
     21, "matrix keys"),
    (GOOD.replace('NCCL_ALGO: Ring', 'NCCL_ALGO: [a, b]'), "hypotheses[0].treatment.env.NCCL_ALGO", 16, "string"),
    (GOOD.replace("preset: openai", "preset: tgi"), "engine.preset", 3, "sglang"),
    (GOOD.replace("max_boots_per_arm: 4", "max_boots_per_arm: 1"), "defaults.max_boots_per_arm", 11, ">= 2"),
    (GOOD.replace("flags: {tp: 2}", "flags: {--tp: 2}"), "engine.flags.--tp", 6, "without leading dashes"),
    (GOOD.replace("- id: steps", "- id: 'bad id'"), "hypotheses[0].id", 13, "letters"),
    # a NUL byte cannot reach a process: refused by the loader (and so by --dry-run), not by every boot
    (GOOD.replace('NCCL_ALGO: Ring', 'NCCL_ALGO: "Ri\\0ng"'), "hypotheses[0].treatment.env.NCCL_ALGO", 16, "NUL"),
    (GOOD.replace("flags: {tp: 2}", 'flags: {tp: "2\\0"}'), "engine.flags.tp", 6, "NUL"),
    (GOOD.replace('"{port}"]', '"{port}", "a\\0b"]'), "engine.launch[3]", 4, "NUL"),
    (GOOD.replace("[1, 2, 3]", '[1, "2\\0"]'), "hypotheses[0].matrix.flags.speculative-num-steps", 21, "NUL"),
    (GOOD.replace("  output_tokens: 32", "  output_tokens: 32\n  request_timeout_s: 0"),
     "benchmark.request_timeout_s", 9, "positive"),
    (GOOD.replace("version: 1", "version: true"), "version", 1, "reads version 1"),
    (GOOD.replace("version: 1", "version: 1.0"), "version", 1, "reads version 1"),
    (GOOD.replace("  launch: [my-server, --port, \"{port}\"]\n", "  base_url: 'http://[::1'\n")
     .replace("  env: {NCCL_NVLS_ENABLE: \"0\"}\n  flags: {tp: 2}\n", ""), "engine.base_url", 4, "cannot read"),
    (GOOD.replace("  env: {NCCL", "  checkout: git-worktree\n  env: {NCCL"), "engine.checkout", 5, "'clone' (a full"),
    (GOOD.replace("  env: {NCCL", "  build_env: CMAKE_ARGS\n  env: {NCCL"), "engine.build_env", 5, "a list"),
    (GOOD.replace("  env: {NCCL", "  build_env: [CMAKE_ARGS, 'A B']\n  env: {NCCL"), "engine.build_env[1]", 5,
     "variable name"),
])
def test_bad_input_names_key_and_line(tmp_path, bad, key, line, words):
    with pytest.raises(SpecError) as err:
        parse(bad, tmp_path)
    assert err.value.key == key
    assert err.value.line == line
    assert words in str(err.value)
    assert f"hypotheses.yaml:{line}" in str(err.value)


def test_missing_required_and_empty(tmp_path):
    with pytest.raises(SpecError, match="missing required key 'hypotheses'"):
        parse("engine: {preset: openai, launch: [x]}\n", tmp_path)
    with pytest.raises(SpecError, match="empty"):
        parse("\n", tmp_path)
    with pytest.raises(SpecError, match="not valid YAML") as err:
        parse("engine: [unclosed\n", tmp_path)
    assert err.value.line is not None


def test_duplicate_key_and_commit_without_repo(tmp_path):
    with pytest.raises(SpecError, match="duplicate key"):
        parse(GOOD.replace("  output_tokens: 32", "  output_tokens: 32\n  output_tokens: 16"), tmp_path)
    with pytest.raises(SpecError, match="no repository") as err:
        parse(GOOD.replace("baseline: {flags", "baseline: {commit: HEAD~1, flags"), tmp_path)
    assert err.value.key == "hypotheses[0].baseline.commit"


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "nope.yaml")


def test_openai_preset_needs_launch(tmp_path):
    with pytest.raises(SpecError, match="engine.launch"):
        parse(GOOD.replace('  launch: [my-server, --port, "{port}"]\n', ""), tmp_path)


def test_launch_string_is_split_not_shelled(tmp_path):
    spec = parse(GOOD.replace('launch: [my-server, --port, "{port}"]',
                              "launch: \"my-server --name 'a b; rm -rf /' --port {port}\""), tmp_path)
    assert spec.engine.launch == ("my-server", "--name", "a b; rm -rf /", "--port", "{port}")


def test_yaml_merge_keys(tmp_path):
    spec = parse(GOOD.replace("    baseline: {flags: {speculative-num-steps: 0}}",
                              "    baseline: &base {flags: {speculative-num-steps: 0}}")
                 .replace("    treatment: {env: {NCCL_ALGO: Ring}}",
                          "    treatment: {<<: *base, env: {NCCL_ALGO: Ring}}"), tmp_path)
    assert spec.hypotheses[0].treatment.env == {"NCCL_ALGO": "Ring"}


def test_server_info_paths_are_checked(tmp_path):
    spec = parse(GOOD.replace("  flags: {tp: 2}", "  flags: {tp: 2}\n  server_info: /info"), tmp_path)
    assert spec.engine.server_info == ("/info",)
    with pytest.raises(SpecError, match="starting with '/'") as err:
        parse(GOOD.replace("  flags: {tp: 2}", "  flags: {tp: 2}\n  server_info: [info]"), tmp_path)
    assert err.value.key == "engine.server_info"
    with pytest.raises(SpecError, match="a path or a list"):
        parse(GOOD.replace("  flags: {tp: 2}", "  flags: {tp: 2}\n  server_info: 7"), tmp_path)


def test_checkout_and_build_env_reach_the_boot_request(tmp_path):
    from bisect_harness.plan.build import engine_fingerprint

    spec = parse(GOOD.replace("  env: {NCCL", "  checkout: clone\n  build_env: [GGML_CUDA, GGML_CUDA]\n  env: {NCCL"),
                 tmp_path)
    assert spec.engine.checkout == "clone" and spec.engine.build_env == ("GGML_CUDA",)
    plain = parse(GOOD, tmp_path)
    assert plain.engine.checkout == "worktree" and plain.engine.build_env == ()
    # a file that leaves checkout out keeps the config keys its ledger holds; clone is another engine build
    assert engine_fingerprint(plain) == engine_fingerprint(parse(GOOD.replace(
        "  env: {NCCL", "  checkout: worktree\n  env: {NCCL"), tmp_path))
    assert engine_fingerprint(plain) != engine_fingerprint(spec)


def test_prompt_reuse_is_a_benchmark_key_and_measures_another_thing(tmp_path):
    """``benchmark.prompt_reuse``: false by default (each sample's prompts its own); true
    measures a prefix cache. The two measure different things, so their configs differ;
    a file with true keeps the keys of ledgers written when every sample repeated its prompts."""
    from bisect_harness.spec.schema import hypotheses_schema
    from bisect_harness.plan.build import engine_fingerprint

    plain = parse(GOOD, tmp_path)
    reused = parse(GOOD.replace("  output_tokens: 32", "  output_tokens: 32\n  prompt_reuse: true"), tmp_path)
    assert plain.benchmark.prompt_reuse is False and reused.benchmark.prompt_reuse is True
    assert engine_fingerprint(plain) != engine_fingerprint(reused)
    with pytest.raises(SpecError, match="true or false") as err:
        parse(GOOD.replace("  output_tokens: 32", "  output_tokens: 32\n  prompt_reuse: sometimes"), tmp_path)
    assert err.value.key == "benchmark.prompt_reuse"
    prop = hypotheses_schema()["properties"]["benchmark"]["properties"]["prompt_reuse"]
    assert prop["type"] == "boolean" and prop["default"] is False


# --------------------------------------------------------------------------- derived metrics

DERIVED = textwrap.dedent("""\
    version: 1
    engine:
      preset: openai
      launch: [my-server, --port, "{port}"]
      metrics:
        - {name: verify_s, from: log, pattern: 'verify took (?P<value>[0-9.]+) s', reduce: sum, unit: s, better: lower}
        - {name: passes, from: log, pattern: 'verify pass (?P<value>[0-9]+)', reduce: count, better: higher}
        - {name: verify_ms_per_cycle, from: derived, ratio: [verify_s, passes], scale: 1000, unit: ms, better: lower}
    hypotheses:
      - id: spec
        baseline: {flags: {speculative-num-steps: 1}}
        treatment: {flags: {speculative-num-steps: 2}}
        metric: verify_ms_per_cycle
        expect: decrease
        min_effect: 10%
    """)


def test_a_derived_metric_loads_and_a_hypothesis_may_name_it(tmp_path):
    spec = parse(DERIVED, tmp_path)
    src = spec.engine.metrics[2]
    assert src.kind_name == "derived" and src.inputs == ("verify_s", "passes") and src.scale == 1000
    m = spec.metrics()["verify_ms_per_cycle"]
    assert m.unit == "ms" and m.description.startswith("verify_s / passes x 1000, from each sample window's values")
    assert "; where verify_s: log lines matching" in m.description and "passes: log lines matching" in m.description


@pytest.mark.parametrize("old, new, key, line, words", [
    ("ratio: [verify_s, passes]", "ratio: [verify_s, tok_s]", "engine.metrics[2].ratio", 8,
     "names 'tok_s', which is not a metric of engine.metrics"),
    ("ratio: [verify_s, passes]", "ratio: [verify_s, verify_ms_per_cycle]", "engine.metrics[2].ratio", 8,
     "cannot be derived from itself"),
    ("ratio: [verify_s, passes]", "difference: [verify_s]", "engine.metrics[2].difference", 8, "must name two"),
    ("- {name: passes, from: log, pattern: 'verify pass (?P<value>[0-9]+)', reduce: count, better: higher}",
     "- {name: passes, from: derived, ratio: [verify_ms_per_cycle, verify_s], better: higher}",
     "engine.metrics[1].ratio", 7, "a cycle: passes -> verify_ms_per_cycle -> passes"),
])
def test_derived_metric_errors_name_key_and_line(tmp_path, old, new, key, line, words):
    assert old in DERIVED
    with pytest.raises(SpecError) as err:
        parse(DERIVED.replace(old, new), tmp_path)
    assert (err.value.key, err.value.line) == (key, line) and words in str(err.value)


def test_a_derived_metric_is_judged_only_where_its_inputs_are_collected(tmp_path):
    text = DERIVED.replace("reduce: sum, unit: s, better: lower}",
                           "reduce: sum, unit: s, better: lower, when: {speculative-num-steps: 2}}")
    with pytest.raises(SpecError) as err:
        parse(text, tmp_path)
    assert "metric 'verify_ms_per_cycle' is collected only where its input 'verify_s' is, and the baseline arm " \
           "does not match it" in str(err.value)
    parse(text.replace("{speculative-num-steps: 1}", "{speculative-num-steps: 2, x: 1}"), tmp_path)  # both match


def test_the_dry_run_prints_a_derived_metric_definition(tmp_path):
    from helpers import harness

    (tmp_path / "h.yaml").write_text(DERIVED)
    proc = harness("run", "h.yaml", "--dry-run", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("  derived source 'verify_ms_per_cycle': verify_s / passes x 1000, from each sample window's values "
            "of those sources [ms], lower is better\n") in proc.stdout


@pytest.mark.parametrize("key, line, value", [
    ("engine.checkout", "  launch: [my-server, --port, \"{port}\"]\n", "  checkout: []\n"),
    ("engine.checkout", "  launch: [my-server, --port, \"{port}\"]\n", "  checkout: {mode: tree}\n"),
    ("backend.kind", "hypotheses:\n", "backend: {kind: [local]}\n"),
    ("defaults.analysis", "  max_boots_per_arm: 4\n", "  analysis: [robust]\n"),
    ("benchmark.api", "  output_tokens: 32\n", "  api: {name: chat}\n"),
])
def test_a_kind_named_by_a_list_or_a_mapping_is_a_spec_error_naming_its_key(tmp_path, key, line, value):
    """A registry is asked with whatever the file holds: a list is no kind's name, and
    the answer is the key's own error, not a TypeError from inside the check."""
    text = GOOD.replace(line, line + value, 1) if key != "backend.kind" else GOOD.replace(line, value + line, 1)
    with pytest.raises(SpecError) as info:
        parse_spec(text, tmp_path / "hypotheses.yaml")
    assert info.value.key == key, str(info.value)
