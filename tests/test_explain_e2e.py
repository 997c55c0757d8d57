"""``harness explain`` end to end on the demo engine's planted interaction.

The demo runs every plain decode step twice when ``--attention-mode decode`` and
``NCCL_PROTO=Simple`` are both set; either alone changes nothing. The slow arm sets
both; the search must name exactly the pair, record
every configuration it booted in ``runs.summary`` with the boots behind each verdict,
and the journal must show the search.
"""

from __future__ import annotations

import json

import pytest

from helpers import SMALL_BENCH, harness, last_json, query, write_spec

pytestmark = pytest.mark.slow  # every test reads the module's search, which boots real demo servers

DEFAULTS = {"samples_per_boot": 1, "boots_per_arm": 3, "max_boots_per_arm": 6}
# decode_tok_s (first to last token of each stream): the doubled decode steps show in it
# without the request overhead that dominates end-to-end tok/s on so short a benchmark;
# one sample of two 32-token streams per boot is enough for a halving.
BENCH = SMALL_BENCH
HYPOTHESES = [
    {"id": "tuned",
     "statement": "The tuned config is at least 20% slower.",
     "baseline": {"commit": "HEAD"},
     "treatment": {"commit": "HEAD", "env": {"NCCL_PROTO": "Simple"},
                   "flags": {"attention-mode": "decode"}},
     "metric": "decode_tok_s", "expect": "decrease", "min_effect": "20%"},
]


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain")
    spec = write_spec(root / "hypotheses.yaml", engine={"preset": "demo"}, benchmark=BENCH,
                      defaults=DEFAULTS, hypotheses=HYPOTHESES)
    db, journal_dir = root / "r.db", root / "exp"
    proc = harness("explain", spec, "--fast", "tuned.baseline", "--slow", "tuned.treatment", "--alpha", "0.05",
                   "--ledger", f"sqlite:///{db}", "--journal-dir", journal_dir, "--json", cwd=root, timeout=900)
    return {"root": root, "spec": spec, "db": db, "journal_dir": journal_dir, "proc": proc}


def test_explain_names_the_interacting_pair(explained):
    proc = explained["proc"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json(proc.stdout)
    pair = ["env:NCCL_PROTO", "flag:attention-mode"]
    assert [d["name"] for d in out["differences"]] == pair
    if out["slowdown"]["outcome"] != "confirmed":
        # Only a host busy in every boot may hide a halving of decode speed; then nothing is claimed.
        marks = query(explained["db"], "SELECT marks FROM boots")
        assert marks and all("host_busy" in (m or "") for m, in marks), out["slowdown"]
        assert out["members"] == [] and out["tests"][1:] == []
        return
    # Both differences matter: each is a member or (on a host too noisy to decide within
    # the budget) left undecided; neither is ever cleared, nor given the opposite sign.
    assert sorted(out["members"] + out["undecided"]) == pair and not out["opposite"]
    # A difference is left undecided only when its own leave-out test spent the budget.
    last = {tuple(sorted(set(t["baseline"]) - set(t["treatment"]))): t for t in out["tests"]
            if t["purpose"] == "leave out"}
    for n in out["undecided"]:
        t = last[(n,)]
        assert t["outcome"] == "inconclusive" and t["boots"] == [DEFAULTS["max_boots_per_arm"]] * 2, t
    for n in out["members"]:
        assert out["confidence"][n]["outcome"] == "confirmed"
    if out["confident"]:
        assert sorted(out["members"]) == pair
        alone = [t for t in out["tests"] if t["purpose"] == "alone vs fast"]
        assert len(alone) == 2 and all(t["outcome"] != "confirmed" for t in alone)
        if all(t["outcome"] == "refuted" for t in alone):
            assert [sorted(p) for p in out["interactions"]] == [pair]


def test_search_is_in_the_ledger_with_its_boots(explained):
    assert explained["proc"].returncode == 0, explained["proc"].stderr[-4000:]
    out = last_json(explained["proc"].stdout)
    (kind, summary), = query(explained["db"], "SELECT kind, summary FROM runs WHERE id = ?", (out["run_id"],))
    assert kind == "explain"
    record, = json.loads(summary)["explain"]
    assert record["members"] == out["members"]
    booted = {r[0] for r in query(explained["db"], "SELECT b.id FROM boots b JOIN configs c ON b.config_id = c.id "
                                  "WHERE c.run_id = ? AND b.status = 'ok'", (out["run_id"],))}
    used = {i for t in record["tests"] for i in t["baseline_boot_ids"] + t["treatment_boot_ids"]}
    assert len(used) == record["boots"] and used <= booted  # a shared boot serves several tests
    for t in record["tests"]:
        assert len(t["baseline_boot_ids"]) == t["boots"][0] and len(t["treatment_boot_ids"]) == t["boots"][1]


def test_journal_shows_the_search(explained):
    assert explained["proc"].returncode == 0, explained["proc"].stderr[-4000:]
    out = last_json(explained["proc"].stdout)
    journals = list(explained["journal_dir"].glob(f"*-run{out['run_id']}.md"))
    assert len(journals) == 1
    text = journals[0].read_text()
    assert "## Explanation: tuned.baseline (fast) vs tuned.treatment (slow)" in text
    # the command that makes this search again is the explain command, not `harness run`
    assert "- **run again**: `harness explain " in text
    assert "--fast tuned.baseline --slow tuned.treatment --min-effect 0.2 --alpha 0.05` (with the spec" in text
    if out["members"]:
        head = "Minimal set: " if out["confident"] else "so not claimed as the whole minimal set): "
        assert head + ", ".join(f"`{m}`" for m in out["members"]) in text
    else:
        assert "nothing to explain" in text
    for n in out["undecided"]:
        assert f"undecided: `{n}`" in text
    for n in out["sign_open"]:
        assert f"sign open: `{n}`" in text
    for t in out["tests"]:
        assert t["reason"].split(":")[0] in text


def test_bad_arm_is_a_clear_error(explained, tmp_path):
    proc = harness("explain", explained["spec"], "--fast", "tuned.base", "--slow", "tuned.treatment",
                   "--ledger", f"sqlite:///{tmp_path / 'x.db'}", "--journal-dir", tmp_path, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "HID.baselineorHID.treatment" in "".join(proc.stderr.split())
