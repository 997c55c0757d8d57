"""A ledger written by an older harness opens, renders as it did, and resumes.

``fixtures/old_ledger/results.db`` was written by the harness of the commit its README
names (``fixtures/old_ledger/make.py`` made it): seven runs whose verdicts carry
warnings of every kind, a noise prior, a bisection on a busy host, an explanation, a
run resumed once and a run left interrupted. Today's harness must

* open it (``Ledger`` migrates an older schema) and find every run as it was;
* render each run's journal, as ``harness journal RUN`` does, byte for byte as that
  commit rendered it (``fixtures/old_ledger/journals``): a warning that moves to
  another table, a figure printed otherwise, a sentence reworded, all show here as a
  diff to read. The goldens are never written again to follow a change: a journal
  that reads an old ledger differently is what this test is there to show;
* resume the interrupted run with ``harness run interrupted.yaml --resume`` to its
  end, every hypothesis decided, the boots and verdicts from before the
  interruption kept and counted.

The plots beside the journals are not compared (they are made, and written empty).
The harness runs in this process (``old_ledger.harness_in_process``); the resume's
boots are answered by the mock backend, lent under the name the run recorded, with
the samples the run's first part drew from the same law. The resume reads the host
the run recorded as its own (``old_ledger.recorded_host``), as a resume on the
machine that made the run does: its boots from before then count.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bisect_harness.backends.mock import MockBackend
from bisect_harness.record.ledger import Ledger
from helpers import last_json
from old_ledger import (BACKEND_NAME, GOLDEN, INTERRUPTED_SPEC, LEDGER, SPECS, empty_png, harness_in_process,
                        interrupted_samples, query, recorded_host, render_journals)

#: The runs of the fixture: id -> (kind, status, experiment).
RUNS = {1: ("run", "done", "warnings"), 2: ("run", "done", "noise-first"), 3: ("run", "done", "noise"),
        4: ("bisect", "done", "bisect"), 5: ("explain", "done", "explain"), 6: ("run", "done", "resumed"),
        7: ("run", "interrupted", "interrupted")}
INTERRUPTED_RUN = 7
GOLDEN_NAMES = sorted(p.name for p in GOLDEN.glob("*.md"))


def _copy(folder: Path) -> Path:
    """A copy of the fixture's ledger in ``folder`` (the fixture itself is never opened)."""
    db = folder / "results.db"
    shutil.copyfile(LEDGER, db)
    return db


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, str]:
    """Each journal (and the index) today's harness renders from a copy of the fixture."""
    folder = tmp_path_factory.mktemp("old-ledger")
    return render_journals(_copy(folder), folder)


def test_the_old_ledger_opens_with_every_run_and_row_it_held(tmp_path):
    db = _copy(tmp_path)  # a reader of a WAL ledger writes beside it: never the fixture itself
    tables = ("runs", "configs", "boots", "samples", "hypotheses", "verdicts", "calibrations", "bisections")
    counts = {t: query(db, f"SELECT COUNT(*) FROM {t}")[0][0] for t in tables}
    with Ledger(f"sqlite:///{db}") as led:  # migrates an older schema in place
        runs = {r.id: (r.kind, r.status, Path(r.spec_path).stem) for r in led.runs(limit=100)}
        hypotheses = {r.id: [h.hid for h in r.hypotheses] for r in led.runs(limit=100)}
    assert runs == RUNS
    assert hypotheses[1] == ["marked", "busy", "drift", "devices", "refused"]
    assert hypotheses[INTERRUPTED_RUN] == ["big", "none", "small"]
    assert {t: query(db, f"SELECT COUNT(*) FROM {t}")[0][0] for t in tables} == counts
    assert min(counts.values()) > 0


def test_every_journal_of_the_old_ledger_is_rendered_and_no_other(rendered):
    assert sorted(rendered) == GOLDEN_NAMES
    assert len(GOLDEN_NAMES) == len(RUNS) + 1  # one journal per run, and index.md


@pytest.mark.parametrize("name", GOLDEN_NAMES)
def test_the_journal_renders_byte_for_byte_as_the_older_harness_rendered_it(rendered, name):
    golden = (GOLDEN / name).read_text()
    text = rendered[name]
    if text != golden:
        a, b = golden.splitlines(), text.splitlines()
        diff = [f"line {i + 1}:\n  golden: {x}\n  now:    {y}" for i, (x, y) in enumerate(zip(a, b)) if x != y][:5]
        if not diff:
            diff = [f"the golden file has {len(a)} lines, the journal now {len(b)} (or they differ in line ends)"]
        pytest.fail(f"{name}: the journal rendered from the old ledger differs from the one the older harness "
                    f"rendered ({len(a)} lines golden, {len(b)} now):\n" + "\n".join(diff))


def _section(text: str, hid: str) -> str:
    return text.split(f"\n### `{hid}`\n", 1)[1].split("\n### ", 1)[0]


def test_the_goldens_hold_each_kind_of_evidence_where_the_older_harness_put_it():
    """What the fixture is for: each kind of warning is there, in its table or list (a
    fixture made again with less in it fails here)."""
    (warnings,) = [(GOLDEN / n).read_text() for n in GOLDEN_NAMES if n.endswith("-warnings-run1.md")]
    marked, busy, drift, devices, refused = (_section(warnings, h) for h in
                                             ("marked", "busy", "drift", "devices", "refused"))
    for mark, boots in (("env_missing", "treatment 11"), ("flag_mismatch", "treatment 14"),
                        ("usage_mismatch", "baseline 17")):
        assert f"| `{mark}` | 1 | {boots} |" in marked
    assert "| `host_busy` | 3 | treatment 1, 9, 12 |" in busy and "| `log_capped` | 1 | treatment 1 |" in busy
    assert "Boots that ran on a busy host" in busy and "| 1 | treatment | ok | 12 | **91%** |" in busy
    assert "- warning: contention differed between the sides: baseline 0 of 3 boots busy" in busy
    assert "<details><summary>11 more warnings</summary>" in drift
    assert "- warning: engine version: treatment boots report different code" in drift
    assert drift.count("- warning: host drift: ") == 8 and "| driver_version | 550.54.15 | 550.90.07 |" in drift
    assert "| `stop_unclean` | 1 | treatment 10 |" in drift
    assert "- warning: device sets confounded with the sides" in devices
    assert "| `mechanism_not_seen` | 1 | treatment 7 |" in devices
    assert "**Not measured: treatment never booted" in refused and "| `flag_not_accepted` | 1 |" in refused
    for section in (marked, busy, drift, devices, refused):
        assert "calibration (before, run 1): matmul@cpu varied 34%" in section
        assert "host busy at the start of run 1 (beside the first boot)" in section
    (noise,) = [(GOLDEN / n).read_text() for n in GOLDEN_NAMES if n.endswith("-noise-run3.md")]
    assert "- noise prior: " in noise
    (bisect,) = [(GOLDEN / n).read_text() for n in GOLDEN_NAMES if n.endswith("-bisect-run4.md")]
    assert "**Culprit: `" in bisect and "boots ran on a busy host" in bisect
    (explain,) = [(GOLDEN / n).read_text() for n in GOLDEN_NAMES if n.endswith("-explain-run5.md")]
    assert "## Explanation: tuned.baseline (fast) vs tuned.treatment (slow)" in explain
    (resumed,) = [(GOLDEN / n).read_text() for n in GOLDEN_NAMES if n.endswith("-resumed-run6.md")]
    assert "- **resumed**: at " in resumed and "ok, from before the resume" in resumed
    (interrupted,) = [(GOLDEN / n).read_text() for n in GOLDEN_NAMES if n.endswith("-interrupted-run7.md")]
    assert "- **status**: interrupted (interrupted by the user)" in interrupted
    assert f"--resume {INTERRUPTED_RUN}` boots only what this run still lacks" in interrupted


def test_the_interrupted_run_resumes_to_its_end_keeping_what_it_had(tmp_path, monkeypatch):
    db = _copy(tmp_path)
    shutil.copyfile(SPECS / INTERRUPTED_SPEC, tmp_path / INTERRUPTED_SPEC)
    run = INTERRUPTED_RUN
    boots_before = query(db, "SELECT id, config_id, seq, status FROM boots WHERE run_id = ? ORDER BY id", (run,))
    samples_before = query(db, "SELECT s.boot_id, s.seq, s.metrics FROM samples s JOIN boots b ON b.id = s.boot_id "
                               "WHERE b.run_id = ? ORDER BY s.id", (run,))
    finals_before = query(db, "SELECT h.hid, v.id, v.outcome FROM verdicts v JOIN hypotheses h "
                              "ON h.id = v.hypothesis_id WHERE h.run_id = ? AND v.final = 1 ORDER BY h.hid", (run,))
    others_before = query(db, "SELECT id, status, finished_at FROM runs WHERE id != ? ORDER BY id", (run,))
    ok_before = {i for i, _c, _s, status in boots_before if status == "ok"}
    cut_short = {i for i, _c, _s, status in boots_before if status == "interrupted"}
    assert [h for h, _v, _o in finals_before] == ["big", "none"] and len(ok_before) == 13 and len(cut_short) == 1

    host, fingerprint = recorded_host(db, run)
    monkeypatch.setattr("bisect_harness.run.scheduler.this_host", lambda: (host, fingerprint))
    monkeypatch.setattr("matplotlib.figure.Figure.savefig", empty_png)  # the journal's plots: not looked at
    backend = MockBackend(interrupted_samples, name=BACKEND_NAME)
    done = harness_in_process("run", INTERRUPTED_SPEC, "--resume", "--ledger", f"sqlite:///{db}", "--journal-dir",
                              "journals", "--no-calibration", "--json", cwd=tmp_path, backend=backend)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = last_json(done.stdout)
    assert summary["run_id"] == run and summary["status"] == "done"
    assert f"resuming run {run} (interrupted): 13 ok boots from before count" in " ".join(done.stderr.split())

    # Every hypothesis decided; those decided before the interruption keep their verdicts.
    finals = query(db, "SELECT h.hid, v.id, v.outcome, v.baseline_boot_ids, v.treatment_boot_ids FROM verdicts v "
                       "JOIN hypotheses h ON h.id = v.hypothesis_id WHERE h.run_id = ? AND v.final = 1 ORDER BY h.hid",
                   (run,))
    assert [h for h, *_ in finals] == ["big", "none", "small"]
    assert [(h, v, o) for h, v, o, *_ in finals if h != "small"] == finals_before
    # The boots and samples from before are kept as they were, and counted; the one cut short feeds no verdict.
    after = query(db, "SELECT id, config_id, seq, status FROM boots WHERE run_id = ? ORDER BY id", (run,))
    assert after[:len(boots_before)] == boots_before and len(after) > len(boots_before) and backend.requests
    assert query(db, "SELECT s.boot_id, s.seq, s.metrics FROM samples s JOIN boots b ON b.id = s.boot_id "
                     "WHERE b.run_id = ? AND b.id <= ? ORDER BY s.id", (run, boots_before[-1][0])) == samples_before
    (host_row,), = query(db, "SELECT host FROM runs WHERE id = ?", (run,))
    (record,) = json.loads(host_row)["resumed"]
    assert set(record["counted_ok_boot_ids"]) == ok_before and set(record["cut_short_boot_ids"]) == cut_short
    used = {i for *_, b, t in finals for i in json.loads(b) + json.loads(t)}
    assert not cut_short & used
    small_used = {i for h, *_, b, t in finals if h == "small" for i in json.loads(b) + json.loads(t)}
    assert small_used & ok_before, "the resumed hypothesis was decided without the boots from before"
    for config_id, good in query(db, "SELECT config_id, COUNT(*) FROM boots WHERE run_id = ? AND status = 'ok' "
                                     "GROUP BY config_id", (run,)):
        assert good <= 6, f"config {config_id} has {good} good boots, more than its budget of 6"
    # The other runs are untouched, and the resumed run's journal says what came from before.
    assert query(db, "SELECT id, status, finished_at FROM runs WHERE id != ? ORDER BY id", (run,)) == others_before
    (journal,) = (tmp_path / "journals").glob(f"*-run{run}.md")
    text = journal.read_text()
    assert "- **resumed**: at " in text and "13 ok boots from before counted" in text
