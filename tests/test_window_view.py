"""What ran in the measured windows: the journal's section and ``--json``'s
``window_metrics``, from ledger rows built here (each boot's mechanism results as
the boot check stores them, each sample's declared metrics)."""

from __future__ import annotations

from bisect_harness.cli.summary import run_summary
from bisect_harness.report import journal
from bisect_harness.record.ledger import Boot, Config, HypothesisRow, Ledger, Run, SampleRow, VerdictRow

SPEC_TEXT = """\
version: 1
engine:
  preset: demo
  metrics:
    - {name: cycle_s, from: prometheus, metric: demo_decode_cycle_seconds_sum, unit: s, better: lower}
    - {name: cycles, from: prometheus, metric: demo_decode_cycles_total, better: lower}
    - {name: ms_per_cycle, from: derived, ratio: [cycle_s, cycles], scale: 1000, unit: ms, better: lower}
hypotheses: []
"""

GRAPHS = {"name": "CUDA graphs", "flags": [], "on_by_default": True, "source": "demo"}


def mech(state, evidence):
    return {**GRAPHS, "state": state, "evidence": evidence}


def build(led):
    run = led.add(Run(spec_path="h.yaml", spec_text=SPEC_TEXT, spec_hash="h", harness_version="x"))
    plain = led.add(Config(run_id=run.id, key="a", label="HEAD"))
    spec = led.add(Config(run_id=run.id, key="b", label="HEAD --speculative-num-steps=2"))
    ids = {"baseline": [], "treatment": []}
    rows = (("baseline", plain, "engaged", "decode_cuda_graph +500", (0.4, 0.5)),
            ("baseline", plain, "engaged", "decode_cuda_graph +500", (0.6, 0.6)),
            ("treatment", spec, "set_up_not_seen", "decode_cuda_graph +0, verify_none +250", (7.0, 9.0)),
            ("treatment", spec, "set_up_not_seen", "decode_cuda_graph +0, verify_none +260", (8.0, 8.0)),
            # a boot the verdict did not use: never counted
            ("treatment", spec, "engaged", "decode_cuda_graph +999", (1.0, 1.0)))
    for i, (side, cfg, state, evidence, ms) in enumerate(rows):
        boot = led.add(Boot(run_id=run.id, config_id=cfg.id, config_key=cfg.key, seq=i, status="ok",
                            provenance={"mechanisms": [mech(state, evidence)]}))
        for seq, v in enumerate(ms):
            led.add(SampleRow(boot_id=boot.id, seq=seq, requests=1, output_tokens=10, duration_s=1.0,
                              metrics={"tok_s": 100.0, "ms_per_cycle": v, "cycles": 100.0, "tool_extra": 1.0}))
        if i < 4:
            ids[side].append(boot.id)
    h = led.add(HypothesisRow(run_id=run.id, hid="spec", metric="tok_s", expect="decrease", min_effect=0.1,
                              baseline_config_id=plain.id, treatment_config_id=spec.id))
    led.add(VerdictRow(hypothesis_id=h.id, outcome="confirmed", final=True, ratio=0.2, alpha=0.05,
                       baseline_boot_ids=ids["baseline"], treatment_boot_ids=ids["treatment"]))
    return run


GOLDEN = """\
What ran in the measured windows (the verdict's boots; the engine's own counters and log lines, read around the samples):

- CUDA graphs: baseline: engaged in the window in 2 of 2 boot(s); treatment: set up at start, not seen in the window in 2 of 2 boot(s)<br>baseline boot 1 (engaged in the window): decode_cuda_graph +500<br>treatment boot 3 (set up at start, not seen in the window): decode_cuda_graph +0, verify_none +250

| declared metric | unit | baseline | treatment | treatment / baseline | boots (b / t) |
| --- | --- | --- | --- | --- | --- |
| cycles |  | 100 | 100 | 1.000x | 2 / 2 |
| ms_per_cycle | ms | 0.525 | 8 | 15.238x | 2 / 2 |

(each arm's mean of its boot means: described here, tested only where the hypothesis names it under `mechanism:`)
"""
# by hand: baseline boot means 0.45 and 0.6 -> 0.525; treatment 8.0 and 8.0 -> 8; 8 / 0.525 = 15.238.
# Rows in the order engine.metrics declares them; cycle_s is declared but no sample holds it. The
# hypothesis' own metric (tok_s) and the client's are not declared metrics; nor is "tool_extra", a
# sample metric no engine.metrics entry declares.


def test_the_journal_says_what_ran_in_each_arms_windows(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = build(led)
        text = journal.render(led, run)
    section = "What ran in the measured windows" + text.split("What ran in the measured windows", 1)[1]
    section = section.split("\n\nCommits between", 1)[0] + "\n"
    assert section == GOLDEN, section


def test_run_json_carries_each_arms_declared_metrics(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        (h,) = run_summary(build(led))["hypotheses"]
    by = {m["metric"]: m for m in h["window_metrics"]}
    assert set(by) == {"ms_per_cycle", "cycles"}
    m = by["ms_per_cycle"]
    assert (m["baseline_boots"], m["treatment_boots"]) == (2, 2)
    assert abs(m["baseline"] - 0.525) < 1e-12 and abs(m["treatment"] - 8.0) < 1e-12
    assert abs(m["ratio"] - 8.0 / 0.525) < 1e-12


def test_an_arm_with_nothing_recorded_says_nothing(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        _nothing_recorded(led)


def _nothing_recorded(led):
    run = led.add(Run(spec_path="h.yaml", spec_text=SPEC_TEXT, spec_hash="h", harness_version="x"))
    a = led.add(Config(run_id=run.id, key="a", label="A"))
    b = led.add(Config(run_id=run.id, key="b", label="B"))
    ids = []
    for cfg in (a, b):
        boot = led.add(Boot(run_id=run.id, config_id=cfg.id, config_key=cfg.key, seq=0, status="ok"))
        led.add(SampleRow(boot_id=boot.id, seq=0, requests=1, output_tokens=10, duration_s=1.0,
                          metrics={"tok_s": 100.0}))
        ids.append(boot.id)
    h = led.add(HypothesisRow(run_id=run.id, hid="x", metric="tok_s", expect="decrease", min_effect=0.1,
                              baseline_config_id=a.id, treatment_config_id=b.id))
    led.add(VerdictRow(hypothesis_id=h.id, outcome="inconclusive", final=True, ratio=1.0, alpha=0.05,
                       baseline_boot_ids=[ids[0]], treatment_boot_ids=[ids[1]]))
    text = journal.render(led, run)
    assert "What ran in the measured windows" not in text
    assert run_summary(run)["hypotheses"][0]["window_metrics"] == []
