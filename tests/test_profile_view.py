"""Where the time goes: the journal's profile section and ``--json``'s ``profile``,
from ledger rows built here (each boot's ``provenance["profile"]`` as the capture
side stores it)."""

from __future__ import annotations

import json

from bisect_harness.observe.trace_summary import TraceRow, TraceSummary, summarize_trace
from bisect_harness.cli.summary import run_summary
from bisect_harness.report import journal
from bisect_harness.record.ledger import Boot, Config, HypothesisRow, Ledger, Run, VerdictRow
from bisect_harness.report.profile_view import difference

SPEC_TEXT = "version: 1\nengine: {preset: demo}\nhypotheses: []\n"


def summary(**kw) -> TraceSummary:
    base = dict(tokens=100, steps=100, events=5000, span_ms=400.0, ops=(), op_ms=0.0, op_count=0, kernels=(),
                kernel_ms=0.0, kernel_count=0, runtime_events=0, kernel_launches=0, graph_launches=0,
                copy_calls=0, copies=0, copy_bytes=0, copy_ms=0.0, memsets=0, memset_bytes=0)
    return TraceSummary(**{**base, **kw})


# plain decoding: one graph replay a step, few launches
DECODE = summary(
    ops=(TraceRow("aten::mm", "cpu_op", 400, 120.0), TraceRow("cudaGraphLaunch", "cuda_runtime", 100, 2.0),
         TraceRow("decode_step", "user_annotation", 100, 30.0)),
    op_ms=152.0, op_count=600, op_names=3,
    kernels=(TraceRow("sm90_gemm", "kernel", 800, 90.0), TraceRow("flash_fwd", "kernel", 400, 40.0)),
    kernel_ms=130.0, kernel_count=1200, kernel_names=2, runtime_events=300, kernel_launches=100,
    graph_launches=100, copy_calls=100, copies=100, copy_bytes=409600, copy_ms=1.0)
# speculative: verify runs eagerly: no graph launches, many kernel launches, aten::mm slower
VERIFY = summary(
    steps=40,
    ops=(TraceRow("aten::mm", "cpu_op", 1200, 161.0), TraceRow("cudaLaunchKernel", "cuda_runtime", 3000, 45.0),
         TraceRow("verify_step", "user_annotation", 40, 12.0)),
    op_ms=218.0, op_count=4300, op_names=9,  # six more names below the cut
    kernels=(TraceRow("sm90_gemm", "kernel", 2400, 150.0), TraceRow("flash_fwd", "kernel", 1200, 35.0)),
    kernel_ms=185.0, kernel_count=3600, kernel_names=2, runtime_events=3200, kernel_launches=3000,
    graph_launches=0, copy_calls=200, copies=200, copy_bytes=819200, copy_ms=2.0,
    truncated=True, truncated_why="stopped after 4000000 events (the cap)")


def profile(state="taken", summ=None, **kw):
    rec = {"state": state, "why": kw.pop("why", ""), "profiler": "torch.profiler", "trace": kw.pop("trace", None),
           "trace_bytes": 1234567, "kept": kw.pop("kept", True), "tokens": 100, "requests": 2, "steps": None,
           "seconds": 1.5, "summary": summ.to_dict() if summ else None}
    rec.update(kw)
    return rec


def build(led, tmp_path, profiles):
    """One run, two configs, one hypothesis per (baseline profile, treatment profile) pair."""
    run = led.add(Run(spec_path="h.yaml", spec_text=SPEC_TEXT, spec_hash="h", harness_version="x"))
    for i, (bp, tp) in enumerate(profiles):
        a = led.add(Config(run_id=run.id, key=f"a{i}", label=f"HEAD #{i}"))
        b = led.add(Config(run_id=run.id, key=f"b{i}", label=f"HEAD --speculative #{i}"))
        ids = {}
        for side, cfg, prof in (("baseline", a, bp), ("treatment", b, tp)):
            ids[side] = []
            for seq in range(2):  # the profile on the second boot only
                p = {"profile": prof} if (prof is not None and seq == 1) else {}
                boot = led.add(Boot(run_id=run.id, config_id=cfg.id, config_key=cfg.key, seq=seq, status="ok",
                                    provenance=p))
                ids[side].append(boot.id)
        h = led.add(HypothesisRow(run_id=run.id, hid=f"h{i}", metric="tok_s", expect="decrease", min_effect=0.1,
                                  baseline_config_id=a.id, treatment_config_id=b.id))
        led.add(VerdictRow(hypothesis_id=h.id, outcome="confirmed", final=True, ratio=0.8, alpha=0.05,
                           baseline_boot_ids=ids["baseline"], treatment_boot_ids=ids["treatment"]))
    return run


def section(text: str, hid: str) -> str:
    part = text.split(f"### `{hid}`", 1)[1]
    return part.split("Where the time goes:", 1)[1].split("\nCommits between", 1)[0] if "Where the time goes" in \
        part.split("### `", 1)[0] else ""


GOLDEN = """\
 each arm's profiled sample (not a sample of the verdict), summed per generated token:

- baseline (boot 2, torch.profiler): 100 tokens from 2 request(s) in 100 steps, 1.50 s profiled; 5000 trace events; host self time 1.52 ms per token; kernel time 1.30 ms per token; [trace](traces/b.json.gz) (1.2 MiB)
- treatment (boot 4, torch.profiler): 100 tokens from 2 request(s) in 40 steps, 1.50 s profiled; 5000 trace events; host self time 2.18 ms per token; kernel time 1.85 ms per token; **truncated**: stopped after 4000000 events (the cap) (the figures cover what was read); trace not kept (1.2 MiB)
- +0.600 ms per token in sm90_gemm (kernel; baseline 0.900, treatment 1.50)
- +0.450 ms per token in cudaLaunchKernel (CUDA call; baseline 0.00, treatment 0.450)
- +0.410 ms per token in aten::mm (op; baseline 1.20, treatment 1.61)
- host self time per token (operators, annotations, CUDA calls): 1.52 vs 2.18 ms (+0.660)
- kernel time per token: 1.30 vs 1.85 ms
- graph launches per step: 1.00 vs 0.00 (100 in 100 steps vs 0 in 40)
- kernel launches per step: 1.0 vs 75.0
- kernel launches per token: 1.0 vs 30.0
- memory copies per token: 1.00 vs 2.00 (4.0 KiB vs 8.0 KiB per token; copy calls 1.00 vs 2.00)

| kind | name | baseline ms/token | treatment ms/token | difference |
| --- | --- | --- | --- | --- |
| kernel | sm90_gemm | 0.900 | 1.50 | +0.600 |
| CUDA call | cudaLaunchKernel | 0.00 | 0.450 | +0.450 |
| op | aten::mm | 1.20 | 1.61 | +0.410 |
| annotation | decode_step | 0.300 | <= 0.120 | <= -0.180 |
| annotation | verify_step | 0.00 | 0.120 | +0.120 |
| kernel | flash_fwd | 0.400 | 0.350 | -0.0500 |
| CUDA call | cudaGraphLaunch | 0.0200 | <= 0.120 | <= +0.100 |
"""
# by hand: per token = ms / 100 tokens. decode_step: the treatment lists 3 of its 9 names, so a name
# it does not list took at most its smallest row (12 ms / 100); verify_step: the baseline lists all 3
# of its names, so it took 0 there. Largest difference first (a bound counts by the least it can be).


def test_journal_sets_the_two_arms_side_by_side(tmp_path):
    trace = tmp_path / "traces" / "b.json.gz"
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = build(led, tmp_path, [
            (profile(summ=DECODE, trace=str(trace)), profile(summ=VERIFY, trace="/elsewhere/t.json.gz", kept=False)),
            (profile(summ=DECODE, trace="logs/run-1/boot-6.trace.json.gz", kept=False,
                     kept_note="the trace (9,000,000 bytes) is over limits.profile_trace_bytes (8,000,000): "
                               "summed, then removed"),
             profile("no_profiler", why="no profiler endpoint: llama-server has none")),
            (profile("failed", why="profile trace t.json.gz: the trace has no traceEvents array"), None),
            (None, None),
        ])
        text = journal.render(led, run, plots_dir=tmp_path)
        js = run_summary(run)
    got = section(text, "h0")
    assert got == GOLDEN, got
    # an arm without a profile says why, and no difference is claimed
    h1 = section(text, "h1")
    assert "; trace not kept: the trace (9,000,000 bytes) is over limits.profile_trace_bytes (8,000,000): summed, " \
           "then removed\n" in h1
    assert "- treatment (boot 8): no profile: no profiler endpoint: llama-server has none\n" in h1
    assert "- no difference to show: treatment without a profile\n" in h1 and "| kind |" not in h1
    h2 = section(text, "h2")
    assert "- baseline (boot 10): no profile: profile trace t.json.gz: the trace has no traceEvents array" in h2
    assert "- treatment: no profile: no boot of this arm was profiled" in h2
    assert section(text, "h3") == ""  # no boot profiled: no section

    hyps = {h["id"]: h for h in js["hypotheses"]}
    p0 = json.loads(json.dumps(hyps["h0"]["profile"]))
    assert p0["baseline"]["boot"] == 2 and p0["baseline"]["trace"] == str(trace)
    assert p0["treatment"]["trace"] is None and p0["treatment"]["summary"]["truncated"] is True
    assert TraceSummary.from_dict(p0["baseline"]["summary"]) == DECODE
    first = p0["difference"][0]
    assert first["name"] == "sm90_gemm" and abs(first["difference_ms_per_token"] - 0.6) < 1e-9
    below = next(r for r in p0["difference"] if r["name"] == "decode_step")
    assert below["treatment_ms_per_token"] is None and abs(below["treatment_at_most"] - 0.12) < 1e-9
    assert hyps["h1"]["profile"]["treatment"]["state"] == "no_profiler" and hyps["h1"]["profile"]["difference"] == []
    assert hyps["h2"]["profile"]["treatment"] == {"state": "not_taken", "why": "no boot of this arm was profiled",
                                                  "summary": None}
    assert "profile" not in hyps["h3"]


def test_cpu_traces_do_not_claim_zero_launches(tmp_path):
    """Two CPU traces: operators compared, launches said to be uncounted, per step missing."""
    cpu_a = summary(steps=None, ops=(TraceRow("aten::mm", "cpu_op", 10, 50.0),), op_ms=50.0, op_count=10, op_names=1)
    cpu_b = summary(steps=None, ops=(TraceRow("aten::mm", "cpu_op", 10, 80.0),), op_ms=80.0, op_count=10, op_names=1)
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = build(led, tmp_path, [(profile(summ=cpu_a), profile(summ=cpu_b))])
        text = journal.render(led, run)
    got = section(text, "h0")
    assert "- +0.300 ms per token in aten::mm (op; baseline 0.500, treatment 0.800)\n" in got
    assert ("- kernel launches, graph launches and memory copies: not counted: neither trace has any CUDA "
            "activity (no CUDA runtime call, kernel or copy: a CPU run, or a profiler without CUDA)\n") in got
    assert "per step" not in got and "kernel time" not in got and "0.00 vs" not in got
    with Ledger(f"sqlite:///{tmp_path / 'r2.db'}") as led:  # one CPU arm, one GPU arm: still not counted
        run = build(led, tmp_path, [(profile(summ=cpu_a), profile(summ=DECODE))])
        mixed = section(journal.render(led, run), "h0")
    assert ("- kernel launches, graph launches and memory copies: not counted: the baseline's trace has no CUDA "
            "activity") in mixed and "launches per" not in mixed


def test_a_real_trace_round_trips_through_the_ledger(tmp_path):
    """summarize_trace's dict, stored and read back, gives the same table as the summary itself."""
    from test_trace_summary import HANDMADE

    path = tmp_path / "t.json"
    path.write_text(json.dumps(HANDMADE))
    s = summarize_trace(path, tokens=4, steps=2)
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = build(led, tmp_path, [(profile(summ=s, trace=str(path)), profile(summ=s, trace=str(path)))])
        text = journal.render(led, run, plots_dir=tmp_path)
    got = section(text, "h0")
    assert "- graph launches per step: 0.50 vs 0.50 (1 in 2 steps vs 1 in 2)\n" in got
    assert "| op | aten::mm | 0.0175 | 0.0175 | +0.00 |" in got and "[trace](t.json)" in got
    assert all(r.difference == 0 for r in difference(s, s))
