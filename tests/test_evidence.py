"""The evidence vocabulary: every stored shape round-trips through its type, carries its
version, reads an older record (a field missing is None) and refuses a newer one."""

from __future__ import annotations

import json

import pytest

from bisect_harness.evidence import (BOOT_EVIDENCE_FIELDS, EVIDENCE_VERSION, STAT_FIELDS, VERSION_KEY, BootEvidence,
                                     BootStatus, Finding, FindingKind, NewerRecordError, VerdictStats,
                                     findings_from_json, findings_to_json)


def test_boot_status_compares_equal_to_its_stored_string():
    assert BootStatus.OK == "ok" and BootStatus("excluded") is BootStatus.EXCLUDED
    assert f"{BootStatus.FAILED}" == "failed" and json.dumps(BootStatus.RUNNING) == '"running"'
    assert [s for s in BootStatus if s.measured] == [BootStatus.OK]
    assert {s for s in BootStatus if s.booted} == {BootStatus.OK, BootStatus.EXCLUDED}


def test_boot_evidence_round_trips_and_keeps_what_it_does_not_know():
    stored = {"host": {"hostname": "n1"}, "settle_s": 0.5, "mechanisms": [{"name": "CUDA graphs", "state": "engaged"}],
              "checkout_changed": ["a.py"], "from_a_newer_harness": {"x": 1}}
    ev = BootEvidence.from_json(stored)
    assert ev.host == {"hostname": "n1"} and ev.settle_s == 0.5 and ev.checkout_changed == ("a.py",)
    assert ev.mechanisms == ({"name": "CUDA graphs", "state": "engaged"},) and ev.contention is None
    assert ev.extra == {"from_a_newer_harness": {"x": 1}}
    again = ev.to_json()
    assert again == {**stored, VERSION_KEY: EVIDENCE_VERSION}
    assert BootEvidence.from_json(json.loads(json.dumps(again))) == ev
    assert BootEvidence.from_json(None) == BootEvidence() == BootEvidence.from_json({})
    assert "extra" not in BOOT_EVIDENCE_FIELDS and "contention" in BOOT_EVIDENCE_FIELDS


@pytest.mark.parametrize("read", [BootEvidence.from_json, VerdictStats.from_json,
                                  lambda d: Finding.from_json({"kind": "note", "text": "", **d})])
def test_a_record_newer_than_the_harness_is_refused_with_the_version(read):
    with pytest.raises(NewerRecordError, match=f"schema_version {EVIDENCE_VERSION + 1}.*upgrade bisect-harness"):
        read({VERSION_KEY: EVIDENCE_VERSION + 1})


def test_finding_round_trips_and_an_unknown_kind_is_a_note():
    f = Finding(FindingKind.MARKED_BOOT, "baseline boot 3: host_busy", side="baseline", boots=(3,),
                figures={"marks": ["host_busy"]})
    assert findings_from_json(json.loads(json.dumps(findings_to_json([f])))) == (f,)
    later = Finding.from_json({"kind": "a_kind_of_tomorrow", "text": "said as it was"})
    assert later.kind is FindingKind.NOTE and later.text == "said as it was"
    assert Finding.note("x") == Finding(FindingKind.NOTE, "x")


def test_verdict_stats_round_trip_old_rows_read_none():
    old = {"family_size": 2, "checks": {"env": 1}, "rounds": [[0, 1], [0, 1]], "n_boots": [2, 2],
           "round_log_ratios": [0.01, -0.02], "ratio": 1.01, "outcome": "refuted"}
    st = VerdictStats.from_json(old)
    assert st.rounds == ((0, 1), (0, 1)) and st.n_boots == (2, 2) and st.round_log_ratios == (0.01, -0.02)
    assert st.noise_prior is None and st.cost is None and st.extra == {"ratio": 1.01, "outcome": "refuted"}
    assert st.to_json() == {**old, VERSION_KEY: EVIDENCE_VERSION}
    assert VerdictStats.from_json(st.to_json()) == st
    assert "extra" not in STAT_FIELDS


def test_an_older_ledgers_sentences_read_as_the_findings_they_stood_for():
    from bisect_harness.record.legacy import findings_of_sentences

    said = ["baseline boot 12: host_busy, usage_mismatch", "host busy during treatment boot 7: foreign CPU 93%",
            "host busy during boot 9 (abc1234, probe): steal 20%", "host drift: driver 550 vs 555",
            "engine version: treatment boots report different code (...)", "calibration (before, run 1): x",
            "host busy at the start of run 2 (before the first boot): y", "contention differed between the sides: z",
            "attached server: the boots are ...", "device sets confounded with the sides: ...",
            "treatment boot x: not a mark line", "something else entirely"]
    got = findings_of_sentences(said)
    assert [f.text for f in got] == said  # each said as it was
    assert [f.kind for f in got] == [
        FindingKind.MARKED_BOOT, FindingKind.BUSY_BOOT, FindingKind.BUSY_BOOT, FindingKind.HOST_DRIFT,
        FindingKind.ENGINE_VERSIONS, FindingKind.CALIBRATION_NOISY, FindingKind.PREFLIGHT_BUSY,
        FindingKind.CONTENTION_DIFFERED, FindingKind.ATTACHED, FindingKind.DEVICES_CONFOUNDED, FindingKind.NOTE,
        FindingKind.NOTE]
    assert (got[0].side, got[0].boots, got[0].figures) == ("baseline", (12,), {"marks": ["host_busy", "usage_mismatch"]})
    assert (got[1].side, got[1].boots) == ("treatment", (7,)) and (got[2].side, got[2].boots) == ("abc1234", (9,))
