"""``harness run --backend slurm``: a demo experiment whose confirmed regression is
bisected, each boot a job on the real two-node test cluster (``slurm_cluster.py``),
against the same run on the local backend. Same verdict, same culprit; every Slurm
boot's outcome came back to the controller's ledger with its node and job."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bisect_harness.demo import create_demo_repo

from test_bisect_cli import write_spec

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, spec: Path, *extra: str) -> tuple[dict, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "run", str(spec), "--json", "--no-calibration",
                           "--ledger", f"sqlite:///{tmp_path / 'results.db'}",
                           "--journal-dir", str(tmp_path / "journal"), *extra],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.monotonic() - t0


def _culprit(db: Path) -> str | None:
    with sqlite3.connect(db) as con:
        (result,) = con.execute("SELECT result FROM bisections ORDER BY id DESC LIMIT 1").fetchone()
    return json.loads(result)["culprit"]


def test_a_run_with_a_bisection_through_slurm_agrees_with_the_local_backend(slurm_cluster, tmp_path):
    hist = create_demo_repo(tmp_path / "engine")
    i_reg = hist.index(hist.events["regression"])
    good, bad = hist.shas[i_reg - 1], hist.shas[i_reg + 2]
    verdicts, culprits = {}, {}
    for backend, extra in (("local", ()), ("slurm", ("--backend", "slurm", "--slots", "2"))):
        where = tmp_path / backend
        where.mkdir()
        spec = write_spec(where / "spec.yaml", hist, good=good, bad=bad, bisect=True, max_boots=6, alpha=0.2)
        summary, seconds = _run(where, spec, *extra)
        print(f"{backend}: {seconds:.0f} s")
        verdicts[backend] = [(h["id"], h["verdict"]) for h in summary["hypotheses"]]
        culprits[backend] = _culprit(where / "results.db")
    assert verdicts["slurm"] == verdicts["local"] == [("regression", "confirmed")]
    assert culprits["slurm"] == culprits["local"] == hist.events["regression"]

    with sqlite3.connect(tmp_path / "slurm" / "results.db") as con:
        boots = con.execute("SELECT status, provenance FROM boots").fetchall()
        (host,) = con.execute("SELECT host FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    assert json.loads(host)["backend"]["name"] == "slurm"
    ok = [json.loads(p) for s, p in boots if s == "ok"]
    assert ok and all(p["slurm"]["node"] in slurm_cluster.node_names and p["slurm"]["job_id"] for p in ok)
    assert all(p["devices"]["node"] == p["slurm"]["node"] for p in ok)
    assert slurm_cluster.jobs() == []
