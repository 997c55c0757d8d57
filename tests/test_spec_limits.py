"""Input with limits: hostile or mistyped hypotheses files get a clean error at once.

Aliases other than merge keys are refused, alias cycles and expansion bombs are
caught before anything expands, a matrix's size is computed before expanding,
names from matrix keys are checked like the others, numbers have upper bounds,
and a property-based fuzz test drives the loader with generated documents.
"""

from __future__ import annotations

import math
import textwrap
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_harness.spec import reader, sections
from bisect_harness.errors import SpecError, UserError
from bisect_harness.spec import Spec, load_spec, parse_spec

from helpers import SMALL_BENCH, harness, last_json, write_spec

SKELETON = {
    "version": 1,
    "engine": {"preset": "openai", "launch": ["my-server", "--port", "{port}"]},
    "benchmark": {"output_tokens": 32},
    "defaults": {"boots_per_arm": 2, "max_boots_per_arm": 4},
    "hypotheses": [{"id": "h", "baseline": {"flags": {"tp": 1}}, "treatment": {"flags": {"tp": 2}},
                    "metric": "tok_s", "expect": "increase", "min_effect": "10%"}],
}

BILLION_LAUGHS = textwrap.dedent("""\
    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
    b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
    """)


def parse(text: str, tmp_path) -> Spec:
    return parse_spec(textwrap.dedent(text), tmp_path / "hypotheses.yaml")


class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


def dump(doc) -> str:
    """Block YAML; objects used twice are written out twice, never as anchors and aliases."""
    return yaml.dump(doc, Dumper=_NoAliases, sort_keys=False)


def with_hypothesis(**extra) -> dict:
    doc = yaml.safe_load(dump(SKELETON))
    doc["hypotheses"][0].update(extra)
    return doc


def test_billion_laughs_is_refused_at_once(tmp_path):
    start = time.monotonic()
    with pytest.raises(SpecError, match="merge key") as info:
        parse(BILLION_LAUGHS, tmp_path)
    assert time.monotonic() - start < 2.0
    assert info.value.line == 2  # the first alias


def test_billion_laughs_through_merge_keys_is_bounded(tmp_path):
    levels = ["l0: &l0 {" + ", ".join(f"k{i}: {i}" for i in range(9)) + "}"]
    for n in range(1, 9):
        merges = ", ".join(f"*l{n - 1}" for _ in range(9))
        levels.append(f"l{n}: &l{n} {{<<: [{merges}], x{n}: 0}}")
    start = time.monotonic()
    with pytest.raises(SpecError, match=f"more than {reader.MAX_NODES} YAML nodes"):
        parse("\n".join(levels) + "\n", tmp_path)
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("text, match", [
    ("a: &a [*a]\n", "cycle"),
    ("a: &a {b: *a}\n", "cycle"),
    ("a: &a {<<: *a}\n", "cycle"),
    ("x: &x 1\ny: *x\n", "merge key"),
    ("[" * 2000 + "]" * 2000 + "\n", "nested too deeply"),
    ("a: " + "[" * 80 + "]" * 80 + "\n", "nested too deeply"),
])
def test_aliases_cycles_and_depth_give_a_clean_error(tmp_path, text, match):
    with pytest.raises(SpecError, match=match):
        parse(text, tmp_path)


def test_merge_keys_still_work(tmp_path):
    spec = parse("""\
        version: 1
        engine: {preset: openai, launch: [srv, "{port}"]}
        hypotheses:
          - id: a
            baseline: &base {flags: {tp: 1}}
            treatment: {<<: *base, env: {A: "1"}}
            metric: tok_s
            expect: increase
            min_effect: 5%
        """, tmp_path)
    assert spec.hypotheses[0].treatment.flags == {"tp": 1}
    assert spec.hypotheses[0].treatment.env == {"A": "1"}


def test_matrix_size_is_refused_before_expanding(tmp_path):
    doc = with_hypothesis(matrix={f"flags.f{i}": list(range(40)) for i in range(4)})
    start = time.monotonic()
    with pytest.raises(SpecError, match=r"2560000 points \(40 x 40 x 40 x 40\)") as info:
        parse_spec(dump(doc), tmp_path / "h.yaml")
    assert time.monotonic() - start < 2.0
    assert info.value.key == "hypotheses[0].matrix"
    at_cap = with_hypothesis(matrix={"flags.a": list(range(16)), "flags.b": list(range(16))})
    assert len(parse_spec(dump(at_cap), tmp_path / "h.yaml").hypotheses) == reader.MAX_MATRIX_POINTS


def test_hypotheses_in_the_file_are_capped(tmp_path):
    doc = yaml.safe_load(dump(SKELETON))
    hyp = doc["hypotheses"][0]
    doc["hypotheses"] = [{**hyp, "id": f"h{i}", "matrix": {"flags.a": list(range(200))}} for i in range(6)]
    with pytest.raises(SpecError, match=f"more than {reader.MAX_HYPOTHESES} hypotheses") as info:
        parse_spec(dump(doc), tmp_path / "h.yaml")
    assert info.value.key == "hypotheses[5].matrix"


@pytest.mark.parametrize("key, match", [
    ("env.B=C; touch x", "not a valid environment variable name"),
    ("both.env.1ABC", "not a valid environment variable name"),
    ("flags.tp; rm -rf x", "not a valid flag name"),
    ("flags.--tp", "without leading dashes"),
    ("baseline.flags.a b", "not a valid flag name"),
])
def test_matrix_key_names_are_validated(tmp_path, key, match):
    with pytest.raises(SpecError, match=match) as info:
        parse_spec(dump(with_hypothesis(matrix={key: [1]})), tmp_path / "h.yaml")
    assert info.value.key == f"hypotheses[0].matrix.{key}"


def test_matrix_values_are_scalars(tmp_path):
    with pytest.raises(SpecError, match="must be a string, number or boolean, got a mapping"):
        parse_spec(dump(with_hypothesis(matrix={"flags.tp": [1, {"a": 1}]})), tmp_path / "h.yaml")


def test_arm_flag_names_are_validated(tmp_path):
    with pytest.raises(SpecError, match="not a valid flag name") as info:
        parse_spec(dump(with_hypothesis(treatment={"flags": {"tp=2 --x": 1}})), tmp_path / "h.yaml")
    assert info.value.key == "hypotheses[0].treatment.flags.tp=2 --x"


@pytest.mark.parametrize("section, key, value, match", [
    ("benchmark", "requests_per_sample", 10**12, f"must be <= {reader.MAX_COUNT}"),
    ("benchmark", "output_tokens", 10**7, f"must be <= {reader.MAX_COUNT}"),
    ("benchmark", "seed", 2**64, "must be <="),
    ("benchmark", "request_timeout_s", 1e12, "must be <= 604800"),
    ("benchmark", "request_timeout_s", float("nan"), "finite"),
    ("benchmark", "temperature", float("inf"), "finite"),
    ("defaults", "samples_per_boot", 10**6, f"must be <= {reader.MAX_SAMPLES_PER_BOOT}"),
    ("defaults", "max_boots_per_arm", 10**9, f"must be <= {reader.MAX_BOOTS}"),
    ("defaults", "boot_retries", 10**9, f"must be <= {reader.MAX_BOOTS}"),
    ("defaults", "host_wait_s", 1e9, "must be <="),
    ("defaults", "host_preflight_s", float("nan"), "finite"),
    ("engine", "ready_timeout_s", 1e9, "must be <="),
    ("engine", "ready_timeout_s", 0, "positive"),
])
def test_numbers_are_bounded(tmp_path, section, key, value, match):
    doc = yaml.safe_load(dump(SKELETON))
    doc[section][key] = value
    with pytest.raises(SpecError, match=match) as info:
        parse_spec(dump(doc), tmp_path / "h.yaml")
    assert info.value.key == f"{section}.{key}"


def test_the_documented_caps_are_in_the_format_doc():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "hypotheses-format.md").read_text()
    for name in ("MAX_SPEC_BYTES", "MAX_NODES", "MAX_DEPTH", "MAX_MATRIX_POINTS", "MAX_HYPOTHESES", "MAX_SWEEP_POINTS",
                 "MAX_COUNT", "MAX_BOOTS", "MAX_SAMPLES_PER_BOOT"):
        assert f"{getattr(reader, name):,}" in doc, name


def test_a_huge_file_is_refused(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text(dump(SKELETON) + "#" * reader.MAX_SPEC_BYTES)
    with pytest.raises(SpecError, match="above the cap"):
        load_spec(path)


# --------------------------------------------------------------------------- property-based fuzzing

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.dates(), st.binary(max_size=4))
trees = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                     max_leaves=12)
SECTIONS = ("engine", "benchmark", "defaults", "hypotheses")
HYP_KEYS = ("id", "statement", "baseline", "treatment", "metric", "expect", "min_effect", "matrix", "sweep", "bisect")


@st.composite
def mutated_specs(draw) -> str:
    """The valid skeleton with a few keys replaced by generated trees (or generated keys added)."""
    doc = yaml.safe_load(dump(SKELETON))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(("top", "section", "hypothesis", "arm", "matrix")))
        value = draw(trees)
        if where == "top":
            doc[draw(st.sampled_from(SECTIONS + ("version", "extra")))] = value
        elif where == "section":
            section = draw(st.sampled_from(("engine", "benchmark", "defaults")))
            if isinstance(doc.get(section), dict):
                known = {"engine": sections._ENGINE, "benchmark": sections._BENCH, "defaults": sections._DEFAULTS}
                key = draw(st.sampled_from(known[section]) | st.text(max_size=8))
                doc[section][key] = value
        elif where == "hypothesis" and isinstance(doc.get("hypotheses"), list) and doc["hypotheses"]:
            if isinstance(doc["hypotheses"][0], dict):
                doc["hypotheses"][0][draw(st.sampled_from(HYP_KEYS))] = value
        elif where == "arm" and isinstance(doc.get("hypotheses"), list) and doc["hypotheses"]:
            h = doc["hypotheses"][0]
            if isinstance(h, dict):
                h[draw(st.sampled_from(("baseline", "treatment")))] = {
                    draw(st.sampled_from(("commit", "env", "flags", "base_url"))): value}
        elif where == "matrix" and isinstance(doc.get("hypotheses"), list) and doc["hypotheses"]:
            h = doc["hypotheses"][0]
            if isinstance(h, dict):
                key = draw(st.sampled_from(("flags.", "env.", "both.env.", "baseline.flags.", "x.")))
                h["matrix"] = {key + draw(st.text(max_size=8)): value}
    return dump(doc)


def check_loader(text: str, tmp_path) -> None:
    start = time.monotonic()
    try:
        spec = parse_spec(text, tmp_path / "hypotheses.yaml")
    except (SpecError, UserError) as exc:
        assert str(exc)
    else:
        assert isinstance(spec, Spec) and spec.hypotheses
        for h in spec.hypotheses:
            assert all(reader._ENV_NAME_RE.match(n) for n in (*h.baseline.env, *h.treatment.env))
        assert math.isfinite(spec.benchmark.request_timeout_s)
    assert time.monotonic() - start < 2.0


FUZZ = settings(max_examples=400, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow], derandomize=True)


@FUZZ
@given(text=mutated_specs())
def test_fuzz_generated_documents_around_a_valid_skeleton(tmp_path, text):
    check_loader(text, tmp_path)


@FUZZ
@given(text=st.one_of(st.text(max_size=300), trees.map(dump),
                      st.lists(st.sampled_from(["a:", " ", "\n", "- ", "&x ", "*x ", "<<: ", "[", "]", "{", "}",
                                                "'", '"', "!!python/object ", "?", ":", "%YAML 1.1\n", "---\n",
                                                "1e999", ".nan", "~"]), max_size=60).map("".join)))
def test_fuzz_raw_text(tmp_path, text):
    check_loader(text, tmp_path)


# --------------------------------------------------------------------------- the real command

def test_cli_refuses_billion_laughs_with_exit_2_at_once(tmp_path):
    path = tmp_path / "hypotheses.yaml"
    path.write_text(BILLION_LAUGHS)
    start = time.monotonic()
    proc = harness("run", path, "--dry-run", cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - start < 30
    said = " ".join(proc.stderr.split())
    assert "aliases" in said and "merge key" in said and "hypotheses.yaml:2" in "".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


RED = "[/red]"
MISSING = "ok [env_missing]"


def markup_spec(tmp_path):
    return write_spec(tmp_path / "hypotheses.yaml", engine={"preset": "demo"}, benchmark=SMALL_BENCH,
                      defaults={"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 2},
                      hypotheses=[{"id": "markup", "baseline": {"commit": "HEAD"}, "treatment": {"commit": "HEAD"},
                                   "metric": "tok_s", "expect": "increase", "min_effect": "50%",
                                   "matrix": {"env.TAG": [RED, MISSING]}}])


def test_cli_dry_run_shows_rich_markup_values_verbatim(tmp_path):
    spec = markup_spec(tmp_path)
    proc = harness("run", spec, "--dry-run", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TAG='[/red]'" in proc.stdout and "TAG='ok [env_missing]'" in proc.stdout
    ids = {h["id"] for h in last_json(harness("run", spec, "--dry-run", "--json", cwd=tmp_path,
                                              timeout=120).stdout)["hypotheses"]}
    assert ids == {f"markup[TAG={RED}]", f"markup[TAG={MISSING}]"}


@pytest.mark.slow
def test_cli_real_run_with_rich_markup_values(tmp_path):
    spec = markup_spec(tmp_path)
    db = tmp_path / "r.db"
    proc = harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir",
                   tmp_path / "exp", cwd=tmp_path, timeout=600, env={"COLUMNS": "250", **__import__("os").environ})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "MarkupError" not in proc.stderr and "Traceback" not in proc.stderr
    # The values are shown as written: in the verdict table and in the progress lines.
    assert f"markup[TAG={RED}]" in proc.stdout
    assert f"TAG={MISSING}" in proc.stdout


def test_progress_line_shows_marks_and_labels_verbatim():
    """A boot's status and marks (``ok [env_missing]``) and a label with markup survive Rich."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from bisect_harness.report.progress import BarsObserver

    out = io.StringIO()
    console = Console(file=out, width=200, force_terminal=False, color_system=None)
    config = SimpleNamespace(label=f"HEAD TAG={RED}")
    with BarsObserver(console) as obs:
        obs.boot_started(config, 1, 1)
        obs.boot_finished(config, SimpleNamespace(seq=1, status="ok", marks=["env_missing"]))
        obs.message(f"note {RED} [bold]x")
    text = out.getvalue()
    assert f"boot 1 HEAD TAG={RED}: ok [env_missing]" in text
    assert f"note {RED} [bold]x" in text


def test_piped_progress_is_a_plain_line_per_boot_and_per_step():
    """Not a terminal (CI, a pipe, a batch job): nothing held back to the end, no bars."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from bisect_harness.report.progress import BarsObserver, LinesObserver, observer_for

    console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    assert isinstance(observer_for(console), LinesObserver)
    assert isinstance(observer_for(Console(file=io.StringIO(), force_terminal=True)), BarsObserver)
    lines = io.StringIO()
    config = SimpleNamespace(label=f"HEAD TAG={RED}")
    with LinesObserver(console, budget=40, stream=lines) as obs:
        obs.boot_started(config, 1, 2)
        obs.sample_done(config, 0, {})
        obs.boot_finished(config, SimpleNamespace(id=7, seq=1, status="ok", marks=["host_busy"]))
        obs.search_step("bisect step 1: endpoints abc 1 boot")
    got = lines.getvalue().splitlines()
    assert len(got) == 2 and got[1] == "bisect step 1: endpoints abc 1 boot"
    assert got[0].startswith(f"boot 7 (HEAD TAG={RED}, #1): ok [host_busy] in ") and got[0].endswith("; 1/40 boots")
    assert console.file.getvalue() == ""  # the run's own lines stay on the console; the boots go to stderr


def test_a_search_after_the_rounds_counts_its_boots_against_its_own_budget():
    """A run's bisection (or explanation) boots past the rounds' planned boots: the line
    counts them against the search's budget, never as '31/25 boots' of the run."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from bisect_harness.report.progress import BarsObserver, LinesObserver

    lines = io.StringIO()
    config = SimpleNamespace(label="HEAD")
    console = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    with LinesObserver(console, budget=2, stream=lines) as obs:
        for i in (1, 2, 3):
            if i == 3:
                obs.search_started("bisection", 150)
            obs.boot_started(config, i, 1)
            obs.boot_finished(config, SimpleNamespace(id=i, seq=i, status="ok", marks=[]))
        obs.search_started("explanation", None)
        obs.boot_finished(config, SimpleNamespace(id=4, seq=4, status="ok", marks=[]))
    got = [line.rsplit("; ", 1)[1] for line in lines.getvalue().splitlines()]
    assert got == ["1/2 boots", "2/2 boots", "1/150 boots of the bisection", "1 boot of the explanation"]
    bars = Console(file=io.StringIO(), width=200, force_terminal=True)
    with BarsObserver(bars, budget=2) as obs:
        obs.boot_finished(config, SimpleNamespace(id=1, seq=1, status="ok", marks=[]))
        obs.search_started("bisection", 150)
        obs.boot_finished(config, SimpleNamespace(id=2, seq=2, status="ok", marks=[]))
        shown = {t.description: (t.completed, t.total) for t in obs.progress.tasks}
    assert shown["boots done / budget"] == (1, 2) and shown["bisection: boots done / budget"] == (1, 150)


# --------------------------------------------------------------------------- limits: what is read from a server


@pytest.mark.parametrize("given, size", [(1 << 20, 1 << 20), ("64 MiB", 64 << 20), ("1.5GiB", 3 << 29),
                                         ("512 KiB", 512 << 10), ("131072", 131072), ("200000 b", 200000)])
def test_limits_take_bytes_or_a_size_with_a_unit(tmp_path, given, size):
    doc = yaml.safe_load(dump(SKELETON))
    doc["limits"] = {"body_bytes": given, "log_tail_bytes": "1 GiB"}
    spec = parse_spec(dump(doc), tmp_path / "h.yaml")
    assert spec.benchmark.limits.body_bytes == size and spec.benchmark.limits.log_tail_bytes == 1 << 30
    assert spec.benchmark.limits.stream_line_bytes == 16 << 20  # the default where unset


@pytest.mark.parametrize("limits, key, match", [
    ({"body_bytes": "lots"}, "limits.body_bytes", "a size like '64 MiB'"),
    ({"body_bytes": "64 MB"}, "limits.body_bytes", "units: B, KiB, MiB, GiB"),
    ({"body_bytes": True}, "limits.body_bytes", "must be a size"),
    ({"log_head_bytes": 1000}, "limits.log_head_bytes", "between 64 KiB and 64 GiB"),
    ({"stream_line_bytes": "100 GiB"}, "limits.stream_line_bytes", "between 64 KiB and 64 GiB"),
    ({"metrics_bytes": "1 MiB"}, "limits.metrics_bytes", "unknown key"),
])
def test_a_bad_limit_names_its_key(tmp_path, limits, key, match):
    doc = yaml.safe_load(dump(SKELETON))
    doc["limits"] = limits
    with pytest.raises(SpecError, match=match) as info:
        parse_spec(dump(doc), tmp_path / "h.yaml")
    assert info.value.key == key


def test_limits_are_no_part_of_a_configs_identity(tmp_path):
    from bisect_harness.plan.build import engine_fingerprint

    doc = yaml.safe_load(dump(SKELETON))
    plain = parse_spec(dump(doc), tmp_path / "h.yaml")
    doc["limits"] = {"body_bytes": "64 MiB", "log_head_bytes": "1 GiB"}
    raised = parse_spec(dump(doc), tmp_path / "h.yaml")
    assert engine_fingerprint(plain) == engine_fingerprint(raised)


def test_the_supervisors_log_cap_is_the_limits_default():
    from bisect_harness.process.capped_log import LOG_HEAD_BYTES, LOG_TAIL_BYTES
    from bisect_harness.model import Limits

    assert (LOG_HEAD_BYTES, LOG_TAIL_BYTES) == (Limits().log_head_bytes, Limits().log_tail_bytes)
