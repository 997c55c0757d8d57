"""The report reads what a verdict or a search found by its kind, never by its words.

A verdict written by this harness carries typed findings (``verdicts.findings``);
one written before (findings NULL) carries only sentences, which ``record.legacy``
reads once. Both must land in the same rows of the journal's tables (the marks, the
busy boots), the same verdict-table checks cell and the same ``--json`` word. The
typed verdict here says every finding in words no older harness ever wrote, so a
report that parsed sentences would list them all as plain warnings and count none.
Real ledger rows (SQLite), a real contention record for the busy boot.
"""

from __future__ import annotations

from bisect_harness.cli.summary import run_summary
from bisect_harness.evidence import Finding, FindingKind, findings_to_json
from bisect_harness.observe.contention import Crossing, Thresholds, Window, record
from bisect_harness.record.ledger import (Bisection, Boot, Config, HypothesisRow, Ledger, Run, SampleRow,
                                          VerdictRow)
from bisect_harness.report import bisection_view, journal

SPEC_TEXT = "version: 1\nengine:\n  preset: demo\nhypotheses: []\n"

#: boot 4 ran while a foreign process held 93% of its cores (the threshold 25%)
BUSY = record(Window(30.0, 4, {"foreign_cpu_share": 0.93, "foreign_cpu": 3.72}, {},
                     {"top_foreign": [{"name": "stress", "pid": 4242, "cores": 3.7}]}),
              [], [Crossing("foreign_cpu_share", 0.93, 0.25, "foreign CPU 93% of the server's cores (limit 25%)")],
              Thresholds())

#: what the verdict found, said in words no harness ever wrote (the figures are what count)
TYPED = (
    Finding(FindingKind.MARKED_BOOT, "the treatment's third boot carried two marks", side="treatment", boots=(3,),
            figures={"marks": ["usage_mismatch", "env_missing"]}),
    Finding(FindingKind.MARKED_BOOT, "one baseline boot is marked", side="baseline", boots=(1,),
            figures={"marks": ["usage_mismatch"]}),
    Finding(FindingKind.BUSY_BOOT, "boot four shared its machine", side="treatment", boots=(4,)),
    Finding(FindingKind.HOST_DRIFT, "the driver moved between the sides", figures={"field": "driver"}),
    Finding(FindingKind.ENGINE_VERSIONS, "the treatment's boots name two builds", side="treatment", boots=(3, 4)),
    Finding(FindingKind.CONTENTION_DIFFERED, "one side ran on a louder machine"),
    Finding(FindingKind.CALIBRATION_NOISY, "the first probe wobbled"),
    Finding(FindingKind.CALIBRATION_NOISY, "the last probe wobbled too"),
    Finding(FindingKind.PREFLIGHT_BUSY, "the machine was loud before the first boot"),
)

#: the same findings as an older harness said them (``verdicts.warnings`` alone)
OLD = [
    "treatment boot 3: usage_mismatch, env_missing",
    "baseline boot 1: usage_mismatch",
    "host busy during treatment boot 4: foreign CPU 93% of the server's cores (limit 25%)",
    "host drift: driver 550.54 vs 555.42",
    "engine version: treatment boots report different code (abc in boot 3; def in boot 4)",
    "contention differed: treatment 1 of 2 boots busy, baseline 0 of 2",
    "calibration (before): matmul spread 14% over 5 repetitions",
    "calibration (after): matmul spread 12% over 5 repetitions",
    "host busy at the start of run 1 (before the first boot): foreign CPU 80%",
]

CHECKS = ("**engine versions differ x1, env_missing x1, usage_mismatch x2, contention differs, calibration noisy x2, "
          "busy at preflight**")
MARKS = """\
| mark | boots | which |
| --- | --- | --- |
| `usage_mismatch` | 2 | treatment 3; baseline 1 |
| `env_missing` | 1 | treatment 3 |
"""
BUSY_ROW = "| 4 | treatment | ok | 30 | **93%** | stress (pid 4242), 3.70 cores |"


def _run(led: Ledger, *, findings, warnings) -> Run:
    run = led.add(Run(spec_path="h.yaml", spec_text=SPEC_TEXT, spec_hash="h", harness_version="x"))
    a = led.add(Config(run_id=run.id, key="a", label="A"))
    b = led.add(Config(run_id=run.id, key="b", label="B"))
    ids: dict[str, list[int]] = {"baseline": [], "treatment": []}
    for side, cfg, prov in (("baseline", a, {}), ("baseline", a, {}), ("treatment", b, {}),
                            ("treatment", b, {"contention": BUSY})):
        boot = led.add(Boot(run_id=run.id, config_id=cfg.id, config_key=cfg.key, seq=len(ids[side]), status="ok",
                            provenance=prov))
        led.add(SampleRow(boot_id=boot.id, seq=0, requests=1, output_tokens=10, duration_s=1.0,
                          metrics={"tok_s": 100.0}))
        ids[side].append(boot.id)
    assert ids == {"baseline": [1, 2], "treatment": [3, 4]}  # the boot numbers the findings name
    h = led.add(HypothesisRow(run_id=run.id, hid="h", metric="tok_s", expect="increase", min_effect=0.1,
                              baseline_config_id=a.id, treatment_config_id=b.id))
    led.add(VerdictRow(hypothesis_id=h.id, outcome="inconclusive", final=True, ratio=1.0, alpha=0.05,
                       baseline_boot_ids=ids["baseline"], treatment_boot_ids=ids["treatment"],
                       warnings=warnings, findings=findings))
    return run


def _section(text: str) -> str:
    return text.split("### `h`", 1)[1].split("| side | boot |", 1)[0]


def _word(run: Run) -> str:
    (h,) = run_summary(run)["hypotheses"]
    return h["checks"]["word"]


def test_typed_findings_in_new_words_land_in_the_same_rows(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = _run(led, findings=findings_to_json(TYPED), warnings=[f.text for f in TYPED])
        text = journal.render(led, run)
        word = _word(run)
    section = _section(text)
    assert f"checks: {CHECKS}." in section, section
    assert MARKS in section, section
    assert BUSY_ROW in section, section
    # the marked and the busy boots are rows, not sentences; the rest are listed as said
    for f in TYPED:
        listed = f"- warning: {f.text}\n" in section
        assert listed == (f.kind not in (FindingKind.MARKED_BOOT, FindingKind.BUSY_BOOT)), (f, section)
    # the CLI counts host drift by kind (the journal reads drift from the boots themselves)
    assert word == CHECKS.replace("usage_mismatch x2, ", "usage_mismatch x2, host drift (1), ").replace("**", "")


def test_an_older_verdicts_sentences_read_as_they_did(tmp_path):
    """A verdict of a ledger written before findings were stored (findings NULL): its
    sentences land in the same rows and cells as the typed findings above."""
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = _run(led, findings=None, warnings=OLD)
        text = journal.render(led, run)
        word = _word(run)
    section = _section(text)
    assert f"checks: {CHECKS}." in section, section
    assert MARKS in section, section
    assert BUSY_ROW in section, section
    listed = [line.removeprefix("- warning: ") for line in section.splitlines() if line.startswith("- warning: ")]
    assert listed == OLD[3:], listed
    assert word == CHECKS.replace("usage_mismatch x2, ", "usage_mismatch x2, host drift (1), ").replace("**", "")


def test_a_searchs_busy_boot_is_read_by_kind_from_its_result(tmp_path):
    """A bisection's stored result: ``findings`` when present (here in new words),
    else its ``warnings`` read once as findings."""
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = _run(led, findings=None, warnings=[])
        views = []
        for result in ({"findings": findings_to_json([Finding(FindingKind.BUSY_BOOT, "step 4 was crowded",
                                                                    side="commit abc", boots=(4,)),
                                                            Finding.note("a note as it was said")])},
                       {"warnings": ["host busy during boot 4 (commit abc, probe): foreign CPU 93%",
                                     "a note as it was said"]}):
            bis = led.add(Bisection(run_id=run.id, good="g" * 40, bad="b" * 40, metric="tok_s", status="done",
                                    result=result))
            views.append(bisection_view.view(bis, boot_of=lambda i: led.session.get(Boot, i), plots_dir=None,
                                             stem="x")["warnings"])
    typed, old = views
    for w in (typed, old):
        assert [(r["boot"], r["where"]) for r in w["busy"]["rows"]] == [(4, "commit abc")], w
        assert w["other"] == ["a note as it was said"], w
