"""What a verdict, a search and a night found about their boots, as findings.

Each producer hands back :class:`~bisect_harness.evidence.Finding` values: the kind,
the side and boots it concerns, the figures it was decided from, and the sentence
made from them (the same sentence as before findings existed, so journals read the
same). A verdict is a frozen ``decide.verdict.Verdict`` that the record layer stores
(``record.ledger.verdict_row``), its statistics as ``VerdictStats``. The runs here
are the journal's golden scenarios: the real hypothesis loop and bisection on a real
SQLite ledger, boots from the seeded mock backend.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from bisect_harness.boot import BootRecord, SampleOutcome
from bisect_harness.decide.design import Design
from bisect_harness.decide.evaluate import StatVerdict, evaluate
from bisect_harness.decide.verdict import Question, Rules, Side, checks_done, judge, side_findings
from bisect_harness.engines.attach import verdict_findings
from bisect_harness.evidence import STAT_FIELDS, BootEvidence, Finding, FindingKind, VerdictStats
from bisect_harness.model import Expect, Outcome, jsonable
from bisect_harness.observe.drift import drift_findings, host_drift
from bisect_harness.record.ledger import Bisection, Ledger, VerdictRow, verdict_row
from journal_scenarios import busy_bisection, verdicts_run

RULES = Rules(design=Design(alpha=0.05, min_boots=3, max_boots=10, analysis="robust"), family_size=1)


def _boot(boot_id: int, level: float, *, marks=(), **evidence) -> BootRecord:
    return BootRecord(id=boot_id, run_id=1, status="ok", marks=tuple(marks), evidence=BootEvidence(**evidence),
                      samples=tuple(SampleOutcome(metrics={"tok_s": level * f}, requests=1, output_tokens=8,
                                                  duration_s=0.1, seq=j + 1) for j, f in enumerate((0.99, 1.01))))


def _device(slot: int) -> dict:
    return {"slot": slot, "gpus": [slot], "cpus": None, "node": None, "label": f"slot {slot} gpus {slot}"}


def test_marked_boots_and_confounded_devices_are_findings_with_their_figures():
    base = [_boot(1, 100.0, devices=_device(0)), _boot(3, 101.0, marks=("env_missing", "host_busy"),
                                                      devices=_device(0))]
    treat = [_boot(2, 90.0, devices=_device(1)), _boot(4, 91.0, devices=_device(1))]
    found = side_findings(RULES, Side("baseline", base), Side("treatment", treat))
    marked, devices = found
    assert marked == Finding(FindingKind.MARKED_BOOT, "baseline boot 3: env_missing, host_busy", side="baseline",
                             boots=(3,), figures={"marks": ["env_missing", "host_busy"]})
    assert devices.kind is FindingKind.DEVICES_CONFOUNDED and devices.boots == (1, 3, 2, 4)
    assert devices.figures["baseline"] == ["slot 0 gpus 0"] and devices.figures["treatment"] == ["slot 1 gpus 1"]
    assert devices.figures["blocks"]["baseline"] == {"slot 0 gpus 0": 2, "slot 1 gpus 1": 0}
    assert devices.text.startswith("device sets confounded with the sides: baseline ran only on slot 0 gpus 0, "
                                   "treatment only on slot 1 gpus 1; ")
    shared = [_boot(2, 90.0, devices=_device(0)), _boot(4, 91.0, devices=_device(1))]
    assert [f.kind for f in side_findings(RULES, Side("baseline", base), Side("treatment", shared))] == \
        [FindingKind.MARKED_BOOT]


def test_host_drift_is_a_finding_whose_figures_are_the_drift():
    from bisect_harness.observe.provenance import collect_host

    host = collect_host().to_dict()
    a = [_boot(1, 100.0, host=host), _boot(3, 100.0, host=host)]
    b = [_boot(2, 100.0, host={**host, "kernel": "6.1.0-other"}), _boot(4, 100.0, host=host)]
    (drift,) = [d for d in host_drift(a, b) if d.field == "kernel"]
    (found,) = [f for f in drift_findings(a, b) if f.figures["field"] == "kernel"]
    assert found.kind is FindingKind.HOST_DRIFT and found.figures == drift.to_dict()
    assert found.text == f"host drift: {drift.message}" and found.boots == (3, 2)  # a's last, b's first
    assert [f.text for f in drift_findings(a, b)] == [f"host drift: {d.message}" for d in host_drift(a, b)]


def test_an_attached_server_is_a_finding_naming_its_endpoints():
    configs = [SimpleNamespace(arm=SimpleNamespace(endpoint=url)) for url in ("http://b:1", "http://a:2", "http://b:1")]
    (found,) = verdict_findings(configs)
    assert found.kind is FindingKind.ATTACHED and found.figures == {"endpoints": ["http://a:2", "http://b:1"]}
    assert found.text.startswith("attached server: the boots are measurement sessions of http://a:2 and "
                                 "http://b:1, which the harness did not start")
    assert verdict_findings([SimpleNamespace(arm=SimpleNamespace(endpoint=None))]) == []


def test_a_verdict_is_a_value_and_its_stats_keep_every_figure_stored_before():
    """The stats a verdict stores hold each key the verdict rule stored when it was a
    dict of a row's fields, with the same value (a key whose value was null is left out:
    ``VerdictStats`` reads both as None), so a later run's prior reads what it read."""
    base = [_boot(i, 100.0 + i % 3) for i in range(1, 6)]
    treat = [_boot(10 + i, 90.0 + (i * 7) % 3) for i in range(1, 6)]
    v = judge(RULES, Side("baseline", base), Side("treatment", treat), Question("tok_s", Expect.DECREASE, 0.04),
              order_seed=11, config_findings=(Finding.note("said by the caller"),))
    rounds = ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    res = evaluate([list(b.values("tok_s")) for b in base], [list(t.values("tok_s")) for t in treat],
                   expect=Expect.DECREASE, min_effect=0.04, design=RULES.design, alpha=RULES.alpha_each, rounds=rounds)
    before = jsonable({**dataclasses.asdict(res), "family_size": 1, "checks": checks_done([*base, *treat]),
                       "family_alpha": 0.05, "rounds": rounds, "order_seed": 11})
    stored = v.stats.to_json()
    assert {k: x for k, x in stored.items() if k != "schema_version"} == \
        {k: x for k, x in before.items() if x is not None}
    assert v.outcome is Outcome.CONFIRMED and v.final and v.ci == res.ci and v.p_value == res.p_value
    assert v.baseline_boot_ids == (1, 2, 3, 4, 5) and v.warnings == ("said by the caller",)
    assert VerdictStats.from_json(json.loads(json.dumps(stored))) == v.stats
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.outcome = Outcome.REFUTED  # type: ignore[misc]
    # every figure of the statistical answer lands in a field of VerdictStats or is the verdict's own
    answer = {f.name for f in dataclasses.fields(StatVerdict)}
    assert answer - set(STAT_FIELDS) == {"outcome", "final", "ratio", "ci", "p_value", "test", "alpha", "reason"}


def test_a_row_of_a_verdict_holds_its_findings_and_their_sentences():
    boots = [_boot(1, 100.0, marks=("env_missing",))]
    never = judge(RULES, Side("baseline", boots), Side("treatment", [], failed="the build failed"),
                  Question("tok_s", Expect.DECREASE, 0.04))
    row = verdict_row(7, never)
    assert (row.hypothesis_id, row.outcome, row.final, row.ratio, row.ci_low) == (7, "inconclusive", True, None, None)
    assert row.reason == "not measured: treatment never booted: the build failed"
    assert row.warnings == ["baseline boot 1: env_missing"] and row.found == never.findings
    assert row.stats == {"family_size": 1, "checks": checks_done(boots), "schema_version": 1}
    assert (row.baseline_boot_ids, row.treatment_boot_ids) == ([], [])


def test_the_rows_a_run_writes_carry_findings_whose_sentences_are_its_warnings(tmp_path):
    db = verdicts_run(tmp_path).db
    with Ledger(f"sqlite:///{db}") as led:
        rows = led.session.query(VerdictRow).all()
        assert rows and all(r.findings is not None for r in rows)
        assert all([f.text for f in r.found] == r.warnings for r in rows)
        marked = [f for r in rows for f in r.found if f.kind is FindingKind.MARKED_BOOT]
        assert marked, "the borderline claim's treatment boots carry usage_mismatch"
        for f in marked:
            assert f.side == "treatment" and len(f.boots) == 1 and f.figures == {"marks": ["usage_mismatch"]}
            assert f.text == f"treatment boot {f.boots[0]}: usage_mismatch"
        final = [r for r in rows if r.final]
        assert all(r.figures.min_effect in (0.2, 0.1) and r.figures.cost is not None for r in final)


def test_a_bisection_stores_its_findings_beside_its_warnings(tmp_path):
    db = busy_bisection(tmp_path).db
    with Ledger(f"sqlite:///{db}") as led:
        (bis,) = led.session.query(Bisection).all()
        result = bis.result
    found = [Finding.from_json(f) for f in result["findings"]]
    assert found and [f.text for f in found] == result["warnings"]
    busy = [f for f in found if f.kind is FindingKind.BUSY_BOOT]
    assert busy and all(len(f.boots) == 1 and f.figures["crossed"] for f in busy)
    for f in busy:
        assert f.side == f.figures["revision"] and f.figures["status"] in ("ok", "excluded")
        assert f.text.startswith(f"host busy during boot {f.boots[0]} ({f.side}, {f.figures['status']}): ")
        assert all({"figure", "value", "limit", "message"} <= set(c) for c in f.figures["crossed"])
