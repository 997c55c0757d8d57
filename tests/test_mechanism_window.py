"""Mechanism evidence from the measured window (``boot.mechanisms``): the rule, each
preset's evidence as its engine really reports it (SGLang's counters, gauges and
log lines quoted from its 0.5.23 source in fixtures; vLLM's written by the installed
vLLM itself), and the demo engine booted for real on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_harness.evidence import BootEvidence
from bisect_harness.observe import mechanisms
from bisect_harness.observe.mechanisms import (
    Counter, Gauge, InfoField, LogLine, Mechanism, StartupLine, Window, check,
)
from bisect_harness.engines.presets import canonical_flag, get_preset
from bisect_harness.measure.sources.prometheus import parse_prometheus

ENGINES = Path(__file__).parent / "fixtures" / "engines"


def _metrics(*rows: tuple[str, dict, float]) -> list:
    return [(n, dict(lab), float(v)) for n, lab, v in rows]


GRAPHS = Mechanism("CUDA graphs", ("graph-bs",), evidence=(
    Counter("x:passes_total", by="mode", ran=("decode_cuda_graph",), skipped=("decode_none",)),
    LogLine(engaged=r"cuda graph: True", disengaged=r"cuda graph: False"),
), startup=(InfoField("graphs", lambda v: v if isinstance(v, bool) else None),
            StartupLine(set_up=r"Capture .* graph end")),
    source="test", default_on=True, off_flags=("no-graphs",))


def _passes(graph: float, eager: float, **labels) -> list:
    rows = []
    for rank in ("0", "1"):  # per rank: summed over the other labels
        if graph is not None:
            rows.append(("x:passes_total", {"mode": "decode_cuda_graph", "tp_rank": rank, **labels}, graph / 2))
        rows.append(("x:passes_total", {"mode": "decode_none", "tp_rank": rank, **labels}, eager / 2))
        rows.append(("x:passes_total", {"mode": "prefill_none", "tp_rank": rank, **labels}, 3))
    return _metrics(*rows)


# ---------------------------------------------------------------- the rule


def test_four_states_from_the_window_and_the_start():
    before = _passes(10, 4)
    # graph passes moved in the window: engaged, whatever start-up said
    (r,) = check([GRAPHS], {}, Window(before=before, after=_passes(410, 4), server_info={"graphs": True}))
    assert r.state == "engaged" and r.on_by_default and r.flags == ()
    assert r.evidence.startswith("x:passes_total over the window: decode_cuda_graph +400, decode_none +0, "
                                 "prefill_none +0; 400 of 400 passes through it (100%)")
    # captured at start, only eager passes in the window: set up, not seen
    (r,) = check([GRAPHS], {}, Window(before=before, after=_passes(10, 416), startup_log="Capture decode graph end\n"))
    assert r.state == "set_up_not_seen" and r.set_up is True
    assert "decode_cuda_graph +0, decode_none +412" in r.window and "'Capture decode graph end'" in r.startup
    # eager passes, nothing said at start: not engaged
    (r,) = check([GRAPHS], {"graph-bs": 8}, Window(before=before, after=_passes(10, 416)))
    assert (r.state, r.flags, r.on_by_default, r.set_up) == ("not_engaged", ("graph-bs",), False, None)
    # set up at start, no window evidence: not observable, the start quoted
    (r,) = check([GRAPHS], {}, Window(server_info={"graphs": True}))
    assert r.state == "not_observable"
    assert r.evidence.startswith("set up at start (server info graphs = True); the engine gives no evidence over "
                                 "the window")
    # nothing at all
    (r,) = check([GRAPHS], {}, Window())
    assert r.state == "not_observable" and r.evidence.startswith("no evidence could be read (tried: /metrics ")
    # never set up: it could not run
    (r,) = check([GRAPHS], {}, Window(server_info={"graphs": False}))
    assert r.state == "not_engaged" and "could not run" in r.evidence


def test_start_up_evidence_alone_never_reads_engaged():
    for w in (Window(server_info={"graphs": True}), Window(startup_log="Capture decode graph end\n"),
              Window(startup_log="cuda graph: True\n")):  # a line before the window is not window evidence
        (r,) = check([GRAPHS], {}, w)
        assert r.state == "not_observable", (w, r)


def test_a_counter_reads_only_what_moved_between_the_scrapes():
    m = Mechanism("spec", ("draft",), evidence=(Counter("d:draft_tokens_total", accepted="d:accepted_total"),),
                  source="t")
    before = _metrics(("d:draft_tokens_total", {}, 100), ("d:accepted_total", {}, 50))
    # warm-up drafted 100 tokens: a window that drafted none is not engaged
    (r,) = check([m], {"draft": "x"}, Window(before=before, after=before))
    assert (r.state, r.evidence) == ("not_engaged", "d:draft_tokens_total +0 over the window")
    after = _metrics(("d:draft_tokens_total", {}, 300), ("d:accepted_total", {}, 200))
    (r,) = check([m], {"draft": "x"}, Window(before=before, after=after))
    assert r.evidence == "d:draft_tokens_total +200 over the window, d:accepted_total +150 (acceptance 75%)"
    # a labelled series born in the window counts from 0; a reset is no delta at all
    (r,) = check([m], {"draft": "x"}, Window(before=[], after=after))
    assert r.state == "engaged" and "+300" in r.evidence
    (r,) = check([m], {"draft": "x"}, Window(before=after, after=before))
    assert r.state == "not_observable"
    # split by mode, nothing moved: no answer from the counter (the log line decides)
    (r,) = check([GRAPHS], {}, Window(before=_passes(10, 4), after=_passes(10, 4), log="x cuda graph: False\n"))
    assert r.state == "not_engaged" and r.evidence.startswith("log in the window: 0 line(s) saying it ran, 1 line(s)")


def test_a_gauge_is_read_at_the_windows_end():
    m = Mechanism("spec", ("s",), evidence=(Gauge("g:accept", lambda v: v > 0, labels={"tp_rank": "0"}),), source="t")
    after = _metrics(("g:accept", {"tp_rank": "0"}, 2.5), ("g:accept", {"tp_rank": "1"}, 0))
    (r,) = check([m], {"s": 1}, Window(after=after))
    assert (r.state, r.evidence) == ("engaged", "g:accept = 2.5 at the window's end")


def test_default_on_off_flags_and_values_that_turn_it_off():
    assert GRAPHS.applies({}) and GRAPHS.applies({"graph-bs": 4})
    assert not GRAPHS.applies({"no-graphs": True})
    assert GRAPHS.applies({"no-graphs": False})
    assert not GRAPHS.applies({"graph-bs": "disabled"})  # a claiming flag's value that claims nothing
    plain = Mechanism("spec", ("draft",), evidence=(), source="t")
    assert not plain.applies({}) and plain.applies({"draft": "m.gguf"}) and not plain.applies({"draft": "none"})


def test_marks_per_state():
    before = _passes(10, 4)
    seen = check([GRAPHS], {}, Window(before=before, after=_passes(10, 40), server_info={"graphs": True}))
    assert mechanisms.marks(seen) == [mechanisms.NOT_SEEN] == ["mechanism_not_seen"]
    claimed = check([GRAPHS], {"graph-bs": 8}, Window(before=before, after=_passes(10, 40)))
    assert mechanisms.marks(claimed) == [mechanisms.NOT_ENGAGED] == ["mechanism_not_engaged"]
    # on by default, and the engine said at start it did not set it up (a CPU): nothing asked, nothing prepared
    cpu = check([GRAPHS], {}, Window(before=before, after=_passes(10, 40), server_info={"graphs": False}))
    assert cpu[0].state == "not_engaged" and mechanisms.marks(cpu) == []
    assert mechanisms.marks(check([GRAPHS], {}, Window())) == []  # not observable: no mark, and no pass


def test_the_words_are_the_same_everywhere():
    from bisect_harness.decide.verdict import checks_done
    from bisect_harness.report.config_view import mechanism_cell

    assert mechanisms.STATES == ("engaged", "not_engaged", "set_up_not_seen", "not_observable")
    assert dict(mechanisms.WORDS) == {"engaged": "engaged in the window",
                                      "not_engaged": "not engaged in the window",
                                      "set_up_not_seen": "set up at start, not seen in the window",
                                      "not_observable": "not observable"}
    results = [{"name": n, "state": s, "flags": [], "on_by_default": True, "evidence": "e"}
               for n, s in (("a", "engaged"), ("b", "not_engaged"), ("c", "set_up_not_seen"), ("d", "not_observable"),
                            ("e", "unknown"))]
    assert mechanism_cell(results) == ("a: engaged in the window, b: **not engaged in the window**, "
                                        "c: **set up at start, not seen in the window**, d: not observable, "
                                        "e: not observable")
    assert "c (on by default): **set up at start, not seen in the window** (e)" in mechanisms.summary(results)

    class _B:
        status, env_report, flag_report = "ok", {}, {}

        def __init__(self, state):
            self.evidence = BootEvidence(mechanisms=({"state": state},))

    assert checks_done([_B(s) for s in mechanisms.STATES])["mechanisms"] == 3
    assert checks_done([_B("not_observable"), _B("unknown")])["mechanisms"] == 0


# ---------------------------------------------------------------- SGLang, from its 0.5.23 source


def _sglang_window(run: str, *, info: dict | None = None, with_log: bool = True) -> Window:
    before, after = (parse_prometheus((ENGINES / f"sglang-0.5.23-window-{run}-{s}.txt").read_text())
                     for s in ("before", "after"))
    log = (ENGINES / f"sglang-0.5.23-window-{run}.log").read_text() if with_log else ""
    startup, _, window = log.partition("# ---- the measured window starts here")
    return Window(before=before, after=after, log=window, startup_log=startup, server_info=info)


def _sglang_info() -> dict:
    text = (ENGINES / "sglang-0.5.23-server_info.json").read_text()
    return json.loads("\n".join(ln for ln in text.splitlines() if not ln.startswith("#")))


def _sglang(flags: dict, w: Window) -> dict[str, mechanisms.MechanismResult]:
    preset = get_preset("sglang")
    canon = {canonical_flag(k, preset): v for k, v in flags.items()}
    return {r.name: r for r in check(preset.mechanisms, canon, w)}


def test_sglang_eagle3_with_graphs_captured_and_verify_run_eagerly_is_set_up_not_seen():
    """The essays' case: the verify graph captured at start (server info and its log
    line), every verify pass eager in the window (sglang:cuda_graph_passes_total
    decode_none only), drafting itself engaged."""
    r = _sglang({"speculative-algorithm": "EAGLE3", "speculative-attention-mode": "decode"},
                _sglang_window("eagle3-eager-verify", info=_sglang_info()))
    graphs, spec = r["CUDA graphs"], r["speculative decoding"]
    assert graphs.state == "set_up_not_seen" and graphs.on_by_default  # attention mode claims no graphs
    assert graphs.window == ("sglang:cuda_graph_passes_total over the window: decode_cuda_graph +0, decode_none "
                             "+412, prefill_none +14; 0 of 412 passes through it (0%)")
    assert graphs.startup == "server info cuda_graph_config.decode.backend = 'full'"
    assert spec.state == "engaged" and spec.window == "sglang:spec_verify_calls_total +412 over the window"
    # without server info the capture line in the start-up log says the same
    r = _sglang({"speculative-algorithm": "EAGLE3"}, _sglang_window("eagle3-eager-verify"))
    assert r["CUDA graphs"].state == "set_up_not_seen"
    assert "Capture target verify CUDA graph end" in r["CUDA graphs"].startup
    # the same counters with nothing said at start: not engaged
    w = _sglang_window("eagle3-eager-verify", with_log=False)
    assert _sglang({"cuda-graph-max-bs-decode": 8}, w)["CUDA graphs"].state == "not_engaged"


def test_sglang_plain_decoding_replaying_its_graphs_is_engaged():
    r = _sglang({"cuda-graph-bs-decode": [1, 2, 4, 8]}, _sglang_window("decode-graphs"))
    assert set(r) == {"CUDA graphs"}
    graphs = r["CUDA graphs"]
    assert graphs.state == "engaged" and graphs.flags == ("cuda-graph-bs-decode",)
    assert "decode_cuda_graph +3570, decode_none +0" in graphs.window and "100%" in graphs.window


def test_sglang_decode_log_line_is_window_evidence_when_metrics_are_off():
    for run, state in (("decode-graphs", "engaged"), ("eagle3-eager-verify", "set_up_not_seen")):
        w = _sglang_window(run)
        w = Window(log=w.log, startup_log=w.startup_log)  # no --enable-metrics: no /metrics
        r = _sglang({"speculative-algorithm": "EAGLE3"} if "eagle" in run else {}, w)
        assert r["CUDA graphs"].state == state, r
        assert r["CUDA graphs"].window.startswith("log in the window: ")
    spec = _sglang({"speculative-algorithm": "EAGLE3"}, Window(log=_sglang_window("eagle3-eager-verify").log))
    assert spec["speculative decoding"].state == "engaged" and "accept len: 2.41" in spec["speculative decoding"].window


def test_sglang_is_cuda_graph_gauge_is_not_read():
    """0.5.23 exports sglang:is_cuda_graph but never sets it: 0 while graphs replay."""
    after = parse_prometheus((ENGINES / "sglang-0.5.23-window-decode-graphs-after.txt").read_text())
    assert [v for n, _, v in after if n == "sglang:is_cuda_graph"] == [0.0]
    probes = [p for m in get_preset("sglang").mechanisms for p in (*m.evidence, *m.startup)]
    assert not [p for p in probes if getattr(p, "series", "") == "sglang:is_cuda_graph"]


def test_sglang_claiming_and_off_flags():
    preset = get_preset("sglang")
    graphs = next(m for m in preset.mechanisms if m.name == "CUDA graphs")
    canon = lambda d: {canonical_flag(k, preset): v for k, v in d.items()}  # noqa: E731
    assert graphs.applies({})  # on by default
    for off in ({"disable-cuda-graph": True}, {"disable-decode-cuda-graph": True},
                {"cuda-graph-backend-decode": "disabled"}, {"cuda-graph-config": {"decode": {"backend": "disabled"}}}):
        assert not graphs.applies(canon(off)), off
    assert graphs.claimed_by(canon({"cuda-graph-backend-decode": "full"})) == ("cuda-graph-backend-decode",)
    assert graphs.claimed_by(canon({"speculative-attention-mode": "decode"})) == ()
    assert graphs.claimed_by(canon({"speculative-attention-mode": "prefill"})) == ()
    # the start-up fields: the resolved decode backend, and the legacy switch
    w = Window(before=[], after=[], server_info={"cuda_graph_config": {"decode": {"backend": "disabled"}}})
    (r,) = check([graphs], {"cuda-graph-max-bs-decode": 8}, w)
    assert r.state == "not_engaged" and "cuda_graph_config.decode.backend = 'disabled'" in r.evidence


def test_sglang_window_fixtures_are_what_their_generator_writes(tmp_path):
    subprocess.run([sys.executable, str(ENGINES / "make_sglang_window.py"), "--out", str(tmp_path)], check=True,
                   capture_output=True, timeout=120)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert len(written) == 6
    for name in written:
        assert (tmp_path / name).read_text() == (ENGINES / name).read_text(), name


# ---------------------------------------------------------------- vLLM, written by the installed vLLM

VENV = Path(os.environ.get("BISECT_HARNESS_VLLM_VENV", Path.home() / ".cache" / "bisect-harness" / "vllm-venv"))


@pytest.fixture(scope="module")
def vllm_output() -> dict:
    if not (VENV / "bin" / "python").exists():
        msg = f"no vLLM venv at {VENV}"
        if os.environ.get("BISECT_HARNESS_REQUIRE_REAL_ENGINES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    out = subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).with_name("vllm_mechanism_output.py"))],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_vllm_speculative_decoding_from_its_own_counters_and_line(vllm_output):
    preset = get_preset("vllm")
    flags = {"speculative-config": {"method": "ngram", "num_speculative_tokens": 3}}
    w = Window(before=parse_prometheus(vllm_output["before"]), after=parse_prometheus(vllm_output["after"]))
    r = next(r for r in check(preset.mechanisms, flags, w) if r.name == "speculative decoding")
    assert r.state == "engaged"
    assert r.window == ("vllm:spec_decode_num_draft_tokens_total +120 over the window, "
                        "vllm:spec_decode_num_accepted_tokens_total +80 (acceptance 67%)")
    (r,) = check([m for m in preset.mechanisms if m.name == "speculative decoding"], flags,
                 Window(before=w.before, after=w.before))
    assert r.state == "not_engaged"
    (r,) = check([m for m in preset.mechanisms if m.name == "speculative decoding"], flags,
                 Window(log="INFO 12-04 [metrics.py:120] " + vllm_output["spec_log"] + "\n"))
    assert r.state == "engaged" and "SpecDecoding metrics: Mean acceptance length: 3.00" in r.window


def test_vllm_cuda_graphs_from_its_cudagraph_metrics_table(vllm_output):
    preset = get_preset("vllm")
    graphs = next(m for m in preset.mechanisms if m.name == "CUDA graphs")
    for flags in ({"cudagraph-capture-sizes": [1, 2, 4]}, {"max-cudagraph-capture-size": 8}, {"enforce-eager": False}):
        assert graphs.claimed_by(flags), flags
    assert not graphs.applies({"enforce-eager": True}) and not graphs.applies({"max-cudagraph-capture-size": 0})
    info = {"vllm_config": {"compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}}}
    log = "INFO 12-04 10:00:00 [loggers.py:344] " + vllm_output["graph_table"]
    (r,) = check([graphs], {"enforce-eager": False}, Window(log=log, server_info=info))
    assert r.state == "engaged" and "1 line(s) saying it did not" in r.window
    eager = "INFO 12-04 10:00:00 [loggers.py:344] " + vllm_output["eager_table"]
    (r,) = check([graphs], {"enforce-eager": False}, Window(log=eager, server_info=info))
    assert r.state == "set_up_not_seen" and "cudagraph_mode = 'FULL_AND_PIECEWISE'" in r.startup
    (r,) = check([graphs], {"enforce-eager": False}, Window(server_info=info))  # no --cudagraph-metrics
    assert r.state == "not_observable"


# ---------------------------------------------------------------- the demo engine, booted for real on the CPU


@pytest.mark.slow
def test_the_demo_on_a_cpu_reads_graphs_not_engaged_and_drafting_engaged(tmp_path):
    """One boot per config, run as the local backend runs it: CUDA graphs (on by
    default) are "not engaged in the window" on a CPU, never engaged, and not marked
    (the engine said at start that it captured none); speculative decoding is
    engaged, its verify passes counted per mode over the window, warm-up excluded."""
    from bisect_harness.backends.procedure import run_boot
    from bisect_harness.spec import load_spec
    from bisect_harness.plan.build import make_plan
    from helpers import write_spec

    spec = load_spec(write_spec(
        tmp_path / "h.yaml", engine={"preset": "demo", "flags": {"device": "cpu"}},
        benchmark={"prompt_tokens": 8, "output_tokens": 16, "requests_per_sample": 2, "warmup_requests": 1},
        defaults={"samples_per_boot": 2, "host_preflight_s": 0},
        hypotheses=[{"id": "spec", "baseline": {}, "treatment": {"flags": {"speculative-num-steps": 2}},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]))
    plan = make_plan(spec)
    for i, config in enumerate(plan.configs, 1):
        out = run_boot(plan.boot_request(config, boot_id=i, seq=1, log_path=tmp_path / f"boot-{i}.log"))
        assert out.status == "ok", (out.failure, out.log_tail)
        got = {m["name"]: m for m in out.evidence.mechanisms}
        graphs = got["CUDA graphs"]
        assert graphs["state"] == "not_engaged" and graphs["on_by_default"] and graphs["set_up"] is False, graphs
        assert graphs["window"].startswith("demo:cuda_graph_passes_total over the window: decode_cuda_graph +0, ")
        assert graphs["startup"] == "server info cuda_graph = False"
        assert not {"mechanism_not_engaged", "mechanism_not_seen"} & set(out.marks), out.marks
        if "speculative-num-steps" in " ".join(out.argv):
            spec_ = got["speculative decoding"]
            assert spec_["state"] == "engaged" and spec_["flags"] == ["speculative-num-steps"], spec_
            assert "verify_none +" in spec_["window"] and "decode_none +0" in spec_["window"], spec_
            assert "draft_none +" in graphs["window"] and " 0 of " in graphs["window"], graphs
        else:  # 2 samples of 2 requests of 16 tokens: 15 decode steps each after the prefill
            assert set(got) == {"CUDA graphs"}
            assert "decode_none +60, draft_none +0, verify_none +0, prefill_none +4" in graphs["window"], graphs
