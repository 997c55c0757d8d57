"""The record a performance engineer reads: the journal (plots, means, commands, commits,
calibration figures), the journal folder's index, ``harness compare``, ``harness ledger
export``, ``harness schema`` and ``--version``.

One module-scoped pair of real runs on the demo engine (two commits, two boots a side)
feeds every test that needs a ledger: the first with the calibration probe, the second
without.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import pytest

from helpers import SMALL_BENCH, harness, last_json, query, write_spec

ROOT = Path(__file__).resolve().parents[1]

HYP = {"id": "head-regression", "statement": "HEAD decodes at least 10% slower than HEAD~26.",
       "baseline": {"commit": "HEAD~26"}, "treatment": {"commit": "HEAD"},
       "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}
DEFAULTS = {"samples_per_boot": 2, "boots_per_arm": 2, "max_boots_per_arm": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("record")
    (root / "demo-small").mkdir()
    spec = write_spec(root / "demo-small" / "hypotheses.yaml", engine={"preset": "demo"}, benchmark=SMALL_BENCH,
                      defaults=DEFAULTS, hypotheses=[HYP])
    db, jdir = root / "r.db", root / "exp"
    first = harness("run", spec, "--ledger", f"sqlite:///{db}", "--journal-dir", jdir, "--json", cwd=root,
                    timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    second = harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir", jdir, "--json",
                     cwd=root, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    return {"root": root, "spec": spec, "db": db, "url": f"sqlite:///{db}", "jdir": jdir,
            "ids": [last_json(first.stdout)["run_id"], last_json(second.stdout)["run_id"]]}


def _journal(runs, run_id: int) -> tuple[Path, str]:
    (path,) = runs["jdir"].glob(f"*-run{run_id}.md")
    return path, path.read_text()


@pytest.mark.slow
def test_journal_is_named_after_the_experiment_and_indexed(runs):
    a, b = runs["ids"]
    path, _ = _journal(runs, a)
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d-demo-small-run{a}\.md", path.name), path.name
    index = (runs["jdir"] / "index.md").read_text()
    rows = [ln for ln in index.splitlines() if ln.startswith(f"| {a} |") or ln.startswith(f"| {b} |")]
    assert len(rows) == 2, index
    for run_id, row in zip((b, a), rows):  # newest first
        (outcome,) = query(runs["db"], "SELECT v.outcome FROM verdicts v JOIN hypotheses h ON h.id = v.hypothesis_id "
                                       "WHERE h.run_id = ? ORDER BY v.id DESC LIMIT 1", (run_id,))[0:1]
        assert f"`head-regression` {outcome[0]}" in row
        assert f"-demo-small-run{run_id}.md](" in row
        assert "demo-small" in row and "| run |" in row


@pytest.mark.slow
def test_journal_plot_means_commands_commits_and_calibration(runs):
    run_id = runs["ids"][0]
    path, text = _journal(runs, run_id)
    (plot,) = re.findall(r"!\[head-regression: [^\]]*\]\(([^)]+\.png)\)", text)
    assert plot.startswith(path.stem) and (runs["jdir"] / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the absolute means are the mean of the used boots' means, from the ledger's samples
    (hid,) = query(runs["db"], "SELECT id FROM hypotheses WHERE run_id = ?", (run_id,))[0]
    (b_ids, t_ids), = query(runs["db"], "SELECT baseline_boot_ids, treatment_boot_ids FROM verdicts "
                                        "WHERE hypothesis_id = ? ORDER BY id DESC LIMIT 1", (hid,))
    for side, ids in (("baseline", json.loads(b_ids)), ("treatment", json.loads(t_ids))):
        means = []
        for bid in ids:
            vals = [json.loads(m)["tok_s"] for (m,) in query(runs["db"], "SELECT metrics FROM samples WHERE boot_id = ?",
                                                             (bid,))]
            means.append(sum(vals) / len(vals))
        expected = f"{side} mean: {sum(means) / len(means):.2f} tok/s (mean of {len(ids)} boot means)"
        assert expected in text, (expected, text[:3000])

    # each boot's command is its argv as it ran (the real port, the commit's interpreter), in its worktree
    for argv, prov in query(runs["db"], "SELECT argv, provenance FROM boots WHERE run_id = ?", (run_id,)):
        argv, launch = json.loads(argv), json.loads(prov)["launch"]
        assert f"`cd {launch['cwd']} && {' '.join(argv)}`" in text
        assert "{port}" not in " ".join(argv) and Path(launch["cwd"]).is_dir()
    assert f"- **run again**: `harness run {runs['spec']}`" in text

    # git log --oneline of the range, read from the demo repository
    shas = [c for (c,) in query(runs["db"], "SELECT \"commit\" FROM configs WHERE run_id = ? ORDER BY id", (run_id,))]
    m = re.search(r"Commits between the sides: (\d+) commit\(s\) in (\w+)\.\.(\w+), newest first\.", text)
    assert m, text
    assert int(m.group(1)) == 26 and {m.group(2), m.group(3)} <= {s[:12] for s in shas}
    block = text.split(m.group(0), 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    assert len(block.splitlines()) == 26 and block.splitlines()[0].split()[0] in {s[:7] for s in shas}

    # calibration figures (the probe's medians), not only its settings
    (result,) = query(runs["db"], "SELECT result FROM calibrations WHERE run_id = ? AND phase = 'before'", (run_id,))[0]
    for meas in json.loads(result)["measurements"]:
        assert f"| before | {meas['name']} | {meas['device']} | {meas['median']:.2f} {meas['unit']} |" in text


def test_journals_and_plots_are_committable_and_logs_are_not():
    for rel, ignored in (("experiments/2026-11-30-demo-run7.md", False), ("experiments/index.md", False),
                         ("experiments/2026-11-30-demo-run7-h1.png", False), ("experiments/logs/run-7/boot-1.log", True)):
        proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=ROOT)
        assert proc.returncode == (0 if ignored else 1), rel
