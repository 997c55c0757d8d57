import subprocess
from pathlib import Path

import pytest
import yaml

from bisect_harness.engines import presets
from bisect_harness.plan.flag_check import check_argv
from bisect_harness.errors import UserError
from bisect_harness.engines.presets import (
    PRESETS, canonical_flag, flags_to_argv, get_preset, info_key, render_argv, server_info_candidates,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "experiments" / "sglang-eagle3" / "hypotheses.yaml"

#: The options SGLang 0.5.23 accepts, read from its source (the fixture's header says where).
SGLANG_OPTIONS = frozenset(
    line.strip() for line in (Path(__file__).parent / "fixtures" / "engines" / "sglang-0.5.23-options.txt")
    .read_text().splitlines() if line.strip() and not line.startswith("#"))
SGLANG_KNOWN_FLAGS = {o[2:] for o in SGLANG_OPTIONS}


def test_get_preset_known_and_unknown():
    assert get_preset("sglang").name == "sglang"
    with pytest.raises(UserError) as exc:
        get_preset("sglangg")
    msg = str(exc.value)
    assert "'sglangg'" in msg
    for name in ("demo", "openai", "sglang", "vllm", "llamacpp"):
        assert name in msg


def test_preset_contents():
    s, v, o, d = (get_preset(n) for n in ("sglang", "vllm", "openai", "demo"))
    assert s.launch == ("{python}", "-m", "sglang.launch_server", "--host", "{host}", "--port", "{port}")
    assert s.health_path == "/health_generate" and s.ready_timeout_s >= 1200
    assert s.server_info_paths == ("/server_info", "/get_server_info")
    assert v.launch[:2] == ("vllm", "serve") and v.health_path == "/health" and v.ready_timeout_s >= 1200
    assert v.server_info_paths[0].startswith("/server_info") and v.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert o.launch == ()
    assert d.launch == ("{python}", "serve.py", "--host", "{host}", "--port", "{port}")
    assert d.build == ("{python}", "build.py") and d.server_info_paths == ("/server_info",)
    assert set(PRESETS) == {"sglang", "vllm", "llamacpp", "openai", "demo"}
    ll = get_preset("llamacpp")
    assert ll.launch[0] == "llama-server" and "--metrics" in ll.launch and ll.server_info_paths == ("/props",)
    assert v.env["SPT_NOENV"] == "1" and s.env["SPT_NOENV"] == "1"  # renamed processes stay readable


@pytest.mark.parametrize("flags, expected", [
    ({"tp-size": 8}, ["--tp-size", "8"]),
    ({"disable-cuda-graph": True}, ["--disable-cuda-graph"]),
    ({"disable-cuda-graph": False}, []),
    ({"speculative-num-steps": None}, []),
    ({"cuda-graph-bs": [1, 2, 4]}, ["--cuda-graph-bs", "1", "2", "4"]),
    ({"mem-fraction-static": 0.85}, ["--mem-fraction-static", "0.85"]),
    ({"tp": 8}, ["--tp-size", "8"]),
    ({"tensor_parallel_size": 4}, ["--tp-size", "4"]),
    ({"--model": "/m"}, ["--model-path", "/m"]),
    ({"json-model-override-args": {"a": {"b": 1}}}, ["--json-model-override-args", '{"a":{"b":1}}']),
])
def test_sglang_flags(flags, expected):
    assert flags_to_argv(flags, get_preset("sglang")) == expected


@pytest.mark.parametrize("flags, expected", [
    ({"tp": 8}, ["--tensor-parallel-size", "8"]),
    ({"tensor-parallel-size": 8}, ["--tensor-parallel-size", "8"]),
    ({"enforce-eager": False}, ["--no-enforce-eager"]),
    ({"enable-prefix-caching": False}, ["--no-enable-prefix-caching"]),
    ({"enforce-eager": True}, ["--enforce-eager"]),
    ({"speculative-config": {"method": "eagle3", "model": "/d", "num_speculative_tokens": 2}},
     ["--speculative-config", '{"method":"eagle3","model":"/d","num_speculative_tokens":2}']),
    # The model is positional for `vllm serve` and comes before every option.
    ({"tp": 2, "model": "/models/k2"}, ["/models/k2", "--tensor-parallel-size", "2"]),
])
def test_vllm_flags(flags, expected):
    assert flags_to_argv(flags, get_preset("vllm")) == expected


def test_generic_preset_keeps_underscores_and_omits_false():
    assert flags_to_argv({"n_ctx": 512, "verbose": False, "x": True}, get_preset("openai")) == [
        "--n_ctx", "512", "--x"]


def test_flag_errors():
    s = get_preset("sglang")
    with pytest.raises(UserError, match="both set --tp-size"):
        flags_to_argv({"tp": 8, "tp-size": 8}, s)
    with pytest.raises(UserError, match="empty list"):
        flags_to_argv({"cuda-graph-bs": []}, s)
    with pytest.raises(UserError, match="not a name"):
        flags_to_argv({"--": 1}, s)
    with pytest.raises(UserError, match="mapping"):
        flags_to_argv(["tp", 8], s)
    with pytest.raises(UserError, match="positional"):
        flags_to_argv({"model": ["/a", "/b"]}, get_preset("vllm"))
    with pytest.raises(UserError, match="list item"):
        flags_to_argv({"x": [{"a": 1}]}, s)


def test_render_argv_substitutes_per_element():
    out = render_argv(["{python}", "-m", "srv", "--port", "{port}", "--x", "a {host} b", "{{port}}"],
                      python="/usr/bin/python3", port=30000, host="127.0.0.1")
    assert out == ["/usr/bin/python3", "-m", "srv", "--port", "30000", "--x", "a 127.0.0.1 b", "{port}"]
    # A value with spaces or shell characters stays one element, unquoted.
    assert render_argv(["{p}"], p="a b; rm -rf /") == ["a b; rm -rf /"]


def test_render_argv_leaves_json_alone():
    argv = flags_to_argv({"speculative-config": {"method": "eagle3", "k": {"n": 2}}, "e": {}}, get_preset("vllm"))
    assert render_argv(argv) == argv


def test_render_argv_unknown_placeholder():
    with pytest.raises(UserError) as exc:
        render_argv(["--port", "{prot}"], port=1, host="h")
    msg = str(exc.value)
    assert "{prot}" in msg and "{port}" in msg and "{host}" in msg
    with pytest.raises(UserError, match="list of strings"):
        render_argv("serve --port {port}", port=1)


def test_server_info_candidates():
    s = get_preset("sglang")
    assert server_info_candidates(s) == ("/server_info", "/get_server_info")
    assert server_info_candidates(s, "/info") == ("/info",)
    assert server_info_candidates(s, ["/a", "/b"]) == ("/a", "/b")
    assert server_info_candidates(s, []) == ()
    with pytest.raises(UserError, match="starting with '/'"):
        server_info_candidates(s, ["server_info"])


def test_info_keys():
    s, v, o = get_preset("sglang"), get_preset("vllm"), get_preset("openai")
    assert info_key("tp", s) == "tp_size"
    assert info_key("tensor-parallel-size", s) == "tp_size"
    assert info_key("speculative-num-steps", s) == "speculative_num_steps"
    assert info_key("-tp", v) == "vllm_config.parallel_config.tensor_parallel_size"
    assert info_key("speculative-config", v) == "vllm_config.speculative_config"
    assert info_key("some-new-flag", v) is None
    assert info_key("anything", o) is None
    assert canonical_flag("model_path", s) == "model-path"


def _arm_flags(doc):
    yield "engine.flags", doc["engine"].get("flags") or {}
    for h in doc["hypotheses"]:
        for arm in ("baseline", "treatment"):
            yield f"{h['id']}.{arm}", (h.get(arm) or {}).get("flags") or {}
        for k in (h.get("matrix") or {}):
            parts = k.split(".")
            if "flags" in parts:
                yield f"{h['id']}.matrix", {parts[parts.index("flags") + 1]: None}


def test_example_yaml_parses_and_uses_known_preset_and_flags():
    doc = yaml.safe_load(EXAMPLE.read_text())
    preset = get_preset(doc["engine"]["preset"])
    assert preset.name == "sglang"
    assert doc["engine"]["env"]["NCCL_NVLS_ENABLE"] == "0"
    used = set()
    for where, flags in _arm_flags(doc):
        for name in flags:
            canon = canonical_flag(name, preset)
            assert canon in SGLANG_KNOWN_FLAGS, f"{where}: flag {name!r} is not a known SGLang flag"
            used.add(canon)
        template = list(preset.launch) + flags_to_argv({k: v for k, v in flags.items() if v is not None}, preset)
        argv = render_argv(template, python="python3", port=30000, host="127.0.0.1")
        assert check_argv(argv, SGLANG_OPTIONS) == [], f"{where}: SGLang 0.5.23 would not take {argv}"
    assert {"speculative-attention-mode", "speculative-num-steps", "speculative-algorithm"} <= used
    ids = [h["id"] for h in doc["hypotheses"]]
    assert len(ids) == len(set(ids))
    assert any(h.get("bisect") for h in doc["hypotheses"])
    modes = {h["id"]: (h["baseline"].get("flags", {}).get("speculative-attention-mode"),
                       h["treatment"].get("flags", {}).get("speculative-attention-mode")) for h in doc["hypotheses"]}
    assert ("prefill", "decode") in modes.values()


def test_example_yaml_metric_sources_parse():
    from bisect_harness.measure.sources import parse_source

    doc = yaml.safe_load(EXAMPLE.read_text())
    names = {parse_source(m, f"engine.metrics[{i}]").name for i, m in enumerate(doc["engine"]["metrics"])}
    metrics_used = {h["metric"] for h in doc["hypotheses"]}
    assert metrics_used <= names | {"tok_s"}


def test_old_sglang_flag_is_ambiguous_in_0_5_23_and_the_preset_says_why():
    argv = render_argv(list(get_preset("sglang").launch) + ["--cuda-graph-max-bs", "8"], python="python3",
                       port=30000, host="127.0.0.1")
    (problem,) = check_argv(argv, SGLANG_OPTIONS)
    assert problem.status == "ambiguous" and problem.refused
    assert problem.candidates == ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill")
    note = presets.flag_note("--cuda-graph-max-bs", get_preset("sglang"))
    assert "0.5.22" in note and "cuda_graph_config.decode.max_bs" in note


def test_compare_modes_and_help_args():
    s, v = get_preset("sglang"), get_preset("vllm")
    assert presets.compare_mode("dtype", v) == "dtype" and presets.compare_mode("speculative-config", v) == "subset"
    assert presets.compare_mode("tp", v) == "equal"
    assert v.help_args == ("--help=all",) and s.help_args == ("--help",)
    assert info_key("cuda-graph-max-bs-decode", s) == "cuda_graph_config.decode.max_bs"
    with pytest.raises(ValueError):
        presets.Preset(name="x", info_compare={"dtype": "fuzzy"})


def test_module_exports():
    assert set(presets.__all__) == {"Preset", "PRESETS", "get_preset", "canonical_flag", "flags_to_argv",
                                    "render_argv", "server_info_candidates", "info_key", "compare_mode",
                                    "flag_note", "COMPARE_MODES", "launch_argv", "devices_needed",
                                    "DemoPreset", "register_preset"}


def test_vllm_model_comes_right_after_serve():
    v = get_preset("vllm")
    argv = presets.launch_argv(v.launch, {"tp": 2, "model": "/m", "served-model-name": "k2"}, v)
    assert argv == ["vllm", "serve", "/m", "--host", "{host}", "--port", "{port}", "--tensor-parallel-size", "2",
                    "--served-model-name", "k2"]
    # a template without `serve` keeps the flags after it; other presets are unchanged
    assert presets.launch_argv(["x", "--port", "1"], {"model": "/m"}, v) == ["x", "--port", "1", "/m"]
    s = get_preset("sglang")
    assert presets.launch_argv(s.launch, {"tp": 2}, s) == list(s.launch) + ["--tp-size", "2"]


# --------------------------------------------------------------------------- the registry of presets


def test_presets_are_registered_by_name_and_describe_themselves():
    assert set(PRESETS) == {"sglang", "vllm", "llamacpp", "openai", "demo"}
    assert all(PRESETS[name].name == name for name in PRESETS)
    with pytest.raises(TypeError):
        PRESETS["mine"] = get_preset("openai")  # a read-only view: add a preset with register_preset
    with pytest.raises(ValueError, match="already registered"):
        presets.register_preset(presets.Preset(name="sglang", description="another"))
    assert get_preset("sglang").describe() == (
        "sglang (SGLang: python -m sglang.launch_server; readiness by /health_generate)")
    assert get_preset("demo").describe() == ("demo (the built-in demo engine (a small torch model over HTTP); "
                                             "makes its own repository when engine.repo is left out)")
    # only the demo makes its own repository; the others have none without engine.repo
    assert [n for n, p in PRESETS.items() if p.has_default_repo] == ["demo"]
    assert all(PRESETS[n].default_repo(Path("unused")) is None for n in ("sglang", "vllm", "openai"))


class _LocalHistory(presets.Preset):
    """A preset that, like the demo, makes its own repository: a real git history in the cache."""

    has_default_repo = True

    def default_repo(self, cache_dir):
        from bisect_harness.demo import create_demo_repo

        path = Path(cache_dir) / "local-history"
        if not path.exists():
            create_demo_repo(path)
        return path


LOCAL_HISTORY_SPEC = """\
version: 1
engine:
  preset: local-history-for-test
  environment: venv
hypotheses:
  - id: head-vs-older
    statement: HEAD is slower than HEAD~3
    baseline: {commit: HEAD~3}
    treatment: {}
    metric: tok_s
    expect: decrease
    min_effect: 10%
"""


def test_a_preset_that_makes_its_repository_needs_no_name_check(tmp_path):
    """What the demo preset could do by name (commits without engine.repo, an
    environment per commit, a repository made in the cache), any registered preset
    with a default_repo can do: spec, plan and dry-run ask the preset."""
    from bisect_harness.plan.dryrun import describe_plan
    from bisect_harness.errors import SpecError
    from bisect_harness.plan.build import engine_repo, make_plan
    from bisect_harness.spec import load_spec

    spec_file = tmp_path / "hypotheses.yaml"
    spec_file.write_text(LOCAL_HISTORY_SPEC)
    with pytest.raises(SpecError, match="unknown engine preset 'local-history-for-test'"):
        load_spec(spec_file)
    preset = presets.register_preset(_LocalHistory(name="local-history-for-test", launch=get_preset("demo").launch,
                                                   description="a test's history"))
    try:
        spec = load_spec(spec_file)
        cache = tmp_path / "cache"
        repo = engine_repo(spec, cache)
        assert repo == cache / "local-history" and (repo / ".git").exists()
        plan = make_plan(spec, cache_dir=cache)
        shas = subprocess.run(["git", "-C", str(repo), "rev-list", "-n", "4", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.split()
        (h,) = plan.hypotheses
        assert (h.baseline.arm.commit, h.treatment.arm.commit) == (shas[3], shas[0])
        text, obj = describe_plan(spec, cache_dir=cache)
        assert "engine: preset local-history-for-test (a test's history; makes its own repository" in text
        assert obj["preset"] == preset.describe()
    finally:
        presets.PRESETS.discard("local-history-for-test")
    # the same file with a preset that has no repository: commits and environments are refused
    spec_file.write_text(LOCAL_HISTORY_SPEC.replace("local-history-for-test", "openai\n  launch: [x, '{port}']"))
    with pytest.raises(SpecError, match="engine.environment"):
        load_spec(spec_file)
