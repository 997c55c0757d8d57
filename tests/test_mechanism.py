"""Mechanisms: the spec key, the three layers over fake boots and a fake judge (seams),
and the demo's "accepted but inert" flag end to end."""

from __future__ import annotations

import json
import textwrap
from types import SimpleNamespace

import pytest

from bisect_harness.decide.layers import flag_layer, layers
from bisect_harness.decide.verdict import Verdict
from bisect_harness.observe.provenance import FlagReport
from bisect_harness.observe.provenance.flags import FlagCheck
from bisect_harness.errors import SpecError
from bisect_harness.spec import parse_spec
from bisect_harness.model import Expect, Outcome
from helpers import SMALL_BENCH, harness, last_json, query, write_spec

SPEC = """\
version: 1
engine:
  preset: demo
  metrics:
    - {name: decode_ms, from: log, pattern: 'decode cycle: (?P<value>[0-9.]+) ms/cyc', unit: ms, better: lower}
hypotheses:
  - id: mode
    baseline: {commit: HEAD}
    treatment: {commit: HEAD, flags: {attention-mode: decode}}
    metric: tok_s
    expect: increase
    min_effect: 5%
    explain: true
    mechanism: MECH
"""


def parse(mech, tmp_path):
    return parse_spec(SPEC.replace("MECH", mech), tmp_path / "hypotheses.yaml")


def test_mechanism_key_parses_with_default_min_effect(tmp_path):
    h, = parse("[{metric: decode_ms, expect: decrease}, {metric: tok_s, expect: increase, min_effect: 2%}]",
               tmp_path).hypotheses
    assert h.explain is True
    assert [(m.metric, m.expect, m.min_effect) for m in h.mechanism] == [
        ("decode_ms", Expect.DECREASE, 0.05), ("tok_s", Expect.INCREASE, 0.02)]


@pytest.mark.parametrize("mech, needle", [
    ("[{metric: verify_ms, expect: decrease}]", "unknown metric 'verify_ms'"),
    ("[{metric: decode_ms, expect: down}]", "must be 'increase' or 'decrease'"),
    ("[{metric: decode_ms}]", "expect"),
    ("[{metric: decode_ms, expect: decrease, size: 1}]", "unknown key"),
    ("[]", "an empty mechanism"),
    ("decode_ms", "a list of"),
])
def test_bad_mechanism_names_the_key(tmp_path, mech, needle):
    with pytest.raises(SpecError) as err:
        parse(mech, tmp_path)
    assert needle in str(err.value) and "mechanism" in str(err.value)


def _boot(i, *checks, status="ok"):
    rep = FlagReport(tuple(FlagCheck(f, f, r, e, s) for f, r, e, s in checks)).to_dict()
    return SimpleNamespace(id=i, status=status, flag_report=rep)


def test_flag_layer_reads_the_boots_flag_checks():
    ok = _boot(1, ("attention-mode", "decode", "decode", "matched"))
    bad = _boot(2, ("attention-mode", "decode", "prefill", "mismatched"))
    assert flag_layer([ok])["accepted"] == "yes"
    assert flag_layer([ok, bad])["accepted"] == "no"
    assert flag_layer([_boot(3)])["accepted"] == "unknown"
    assert flag_layer([_boot(4, ("x", 1, 2, "mismatched"), status="boot_failed")])["accepted"] == "unknown"


def test_accepted_but_inert_is_a_finding():
    mech = parse_spec(SPEC.replace("MECH", "[{metric: decode_ms, expect: decrease}]"),
                      __import__("pathlib").Path("h.yaml")).hypotheses[0].mechanism
    ok = _boot(1, ("attention-mode", "decode", "decode", "matched"))
    asked = []

    def judge(m):
        asked.append((m.metric, m.expect, m.min_effect))
        return Verdict(Outcome.REFUTED, True, "t", 0.05, "r", ratio=1.0, p_value=0.5)
    confirmed = Verdict(Outcome.CONFIRMED, True, "t", 0.05, "c", ratio=0.8, ci=(0.7, 0.9))
    lay = layers(judge, flag_boots=[ok], mechanism=mech, outcome="refuted")
    assert asked == [("decode_ms", Expect.DECREASE, 0.05)]
    assert lay["flag_accepted"]["accepted"] == "yes" and lay["mechanism_engaged"] == "no"
    assert lay["finding"].startswith("accepted but inert")
    assert lay["mechanism"][0]["ratio"] == 1.0 and lay["mechanism"][0]["ci_low"] is None
    lay = layers(lambda m: confirmed, flag_boots=[ok], mechanism=mech, outcome="refuted")
    assert lay["mechanism_engaged"] == "yes" and "not the bottleneck" in lay["finding"]
    assert (lay["mechanism"][0]["ci_low"], lay["mechanism"][0]["ci_high"]) == (0.7, 0.9)
    lay = layers(lambda m: confirmed, flag_boots=[ok], mechanism=mech, outcome="confirmed")
    assert lay["finding"] is None


def test_demo_attention_mode_is_accepted_but_inert(tmp_path):
    """--attention-mode decode: the demo server reports it (accepted), decode cycles do not
    get faster (mechanism inert), tok/s does not move (outcome refuted)."""
    spec = write_spec(tmp_path / "hypotheses.yaml", engine={"preset": "demo", "metrics": [
        {"name": "decode_ms", "from": "log", "pattern": "decode cycle: (?P<value>[0-9.]+) ms/cyc", "unit": "ms",
         "better": "lower"}]}, benchmark=SMALL_BENCH,
        defaults={"samples_per_boot": 2, "boots_per_arm": 3, "max_boots_per_arm": 4},
        hypotheses=[{"id": "mode", "baseline": {"commit": "HEAD"},
                     "treatment": {"commit": "HEAD", "flags": {"attention-mode": "decode"}},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%",
                     "mechanism": [{"metric": "decode_ms", "expect": "decrease"}]}])
    db = tmp_path / "r.db"
    proc = harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir",
                   tmp_path / "exp", "--json", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_id = last_json(proc.stdout)["run_id"]
    (stats,), = query(db, "SELECT v.stats FROM verdicts v JOIN hypotheses h ON v.hypothesis_id = h.id "
                          "WHERE h.run_id = ? ORDER BY v.id DESC LIMIT 1", (run_id,))
    lay = json.loads(stats)["layers"]
    assert lay["flag_accepted"]["accepted"] == "yes"
    assert lay["mechanism"][0]["metric"] == "decode_ms" and lay["mechanism"][0]["outcome"] != "confirmed"
    assert lay["outcome_moved"] != "confirmed"
    text = next((tmp_path / "exp").glob(f"*-run{run_id}.md")).read_text()
    assert "layer 1, flag accepted: **yes**" in text and "layer 2, mechanism engaged" in text
    if lay["mechanism_engaged"] == "no":
        assert "accepted but inert" in text
