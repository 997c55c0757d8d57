"""``harness run --backend slurm``: a demo experiment whose confirmed regression is
bisected, each boot a job on the real two-node test cluster (``slurm_cluster.py``).
The verdict and the culprit are the planted ones, as the same spec gives on the local
backend (tests/test_bisect_cli.py runs it there); every Slurm boot's outcome came back
to the controller's ledger with its node and job."""

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


def test_a_run_with_a_bisection_through_slurm_finds_the_planted_culprit(slurm_cluster, tmp_path):
    hist = create_demo_repo(tmp_path / "engine")
    i_reg = hist.index(hist.events["regression"])
    good, bad = hist.shas[i_reg - 1], hist.shas[i_reg + 2]
    where = tmp_path / "slurm"
    where.mkdir()
    spec = write_spec(where / "spec.yaml", hist, good=good, bad=bad, bisect=True, max_boots=6, alpha=0.2)
    # The test cluster's two nodes are one machine: each job's server is the other's neighbour, so
    # nearly every sample reads busy. Under the default (quiet samples) the search boots the first
    # boots busy throughout again until the host reads busy all the time (run/busy_host: it did at
    # its 17th and 23rd boot), and took 59-67 s here (168-290 s before that rule); every sample
    # counts here, as on a node shared with other jobs, which takes about 40 s.
    spec.write_text(spec.read_text().replace("  alpha:", "  search_samples: all\n  alpha:", 1))
    summary, seconds = _run(where, spec, "--backend", "slurm", "--slots", "2")
    print(f"slurm: {seconds:.0f} s")
    assert [(h["id"], h["verdict"]) for h in summary["hypotheses"]] == [("regression", "confirmed")]
    assert _culprit(where / "results.db") == hist.events["regression"]

    with sqlite3.connect(tmp_path / "slurm" / "results.db") as con:
        boots = con.execute("SELECT status, provenance FROM boots").fetchall()
        (host,) = con.execute("SELECT host FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    assert json.loads(host)["backend"]["name"] == "slurm"
    ok = [json.loads(p) for s, p in boots if s == "ok"]
    assert ok and all(p["slurm"]["node"] in slurm_cluster.node_names and p["slurm"]["job_id"] for p in ok)
    assert all(p["devices"]["node"] == p["slurm"]["node"] for p in ok)
    assert slurm_cluster.jobs() == []


def test_sigterm_on_harness_run_cancels_its_jobs_and_records_them_interrupted(slurm_cluster, tmp_path):
    import signal

    import yaml

    from helpers import wait_for
    from test_slurm import _job_processes

    hyps = [{"id": "comm", "baseline": {"commit": "HEAD"},
             "treatment": {"commit": "HEAD", "env": {"DEMO_COMM_TUNING": "1"}},
             "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]
    # many samples a boot: the jobs are still measuring when the harness is stopped
    spec = tmp_path / "h.yaml"
    spec.write_text(yaml.safe_dump({
        "version": 1, "engine": {"preset": "demo"},
        "benchmark": {"prompt_tokens": 8, "output_tokens": 8, "requests_per_sample": 2},
        "defaults": {"samples_per_boot": 400, "boots_per_arm": 2, "max_boots_per_arm": 2},
        "backend": {"kind": "slurm", "slots": 2, "cpus_per_boot": 2, "time_limit_min": 5},
        "hypotheses": hyps}, sort_keys=False))
    proc = subprocess.Popen([sys.executable, "-m", "bisect_harness.cli", "run", str(spec), "--no-calibration",
                             "--ledger", f"sqlite:///{tmp_path / 'results.db'}",
                             "--journal-dir", str(tmp_path / "journal")],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def two_running():
            out = slurm_cluster.run("squeue", "--noheader", "--states=RUNNING", "--format=%i").stdout.split()
            logs = list((tmp_path / "journal").rglob("*.log"))
            return out if len(out) == 2 and sum(p.stat().st_size > 0 for p in logs) >= 2 else None

        jobs = wait_for(two_running, timeout=120, what="two running jobs with booting servers")
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-2000:]  # SIGTERM: every job cancelled, then the exit it asks for
    assert slurm_cluster.jobs() == [], "every job was cancelled"
    with sqlite3.connect(tmp_path / "results.db") as con:
        rows = con.execute("SELECT status, failure, provenance FROM boots").fetchall()
    cancelled = {json.loads(p)["slurm"]["job_id"]: (s, f) for s, f, p in rows if p and "slurm" in json.loads(p)}
    assert set(jobs) <= set(cancelled), (jobs, rows)
    assert all(s == "interrupted" and "cancelled" in f for s, f in cancelled.values()), cancelled
    assert {s for s, _, _ in rows} == {"interrupted"}
    for job_id in jobs:
        state = slurm_cluster.run("scontrol", "show", "job", job_id).stdout
        assert "JobState=CANCELLED" in state, state
    wait_for(lambda: not _job_processes(jobs), timeout=15, what="the cancelled jobs' processes to end")
