"""A run stopped half way (Ctrl-C, SIGTERM, SIGKILL) leaves nothing behind.

Each test makes a demo engine repository in a temp folder play the user's own
checkout, dirty (a staged new file and an unstaged edit), and snapshots every
byte of it (``.git`` included) with HEAD, status, refs and worktrees. The real
``harness run`` is started on it in a session of its own; once the ledger holds
a sample (a server is up, mid-benchmark) the harness is signalled. Afterwards:
the exit status says what happened, the ledger keeps what was measured, no
process runs inside the cache's worktrees, no supervisor lingers, and the
checkout is exactly as it was.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from bisect_harness.demo import create_demo_repo
from bisect_harness.record.ledger import Ledger
from helpers import (HARNESS, SMALL_BENCH, diff_snapshots, git, processes_under, query, reapers_of,
                     snapshot_checkout, wait_for, write_spec)

pytestmark = pytest.mark.slow

FIRST_SAMPLE_TIMEOUT_S = 150.0


@pytest.fixture
def dirty_checkout(tmp_path):
    """The demo engine as a user's checkout with a staged new file and an unstaged edit."""
    repo = tmp_path / "checkout"
    create_demo_repo(repo)
    (repo / "NOTES.md").write_text("a staged file that is not committed\n")
    git(repo, "add", "NOTES.md")
    with open(repo / "serve.py", "a") as f:
        f.write("\n# a local edit, not staged\n")
    # Let the index settle (racy-git timestamps) so our own `git status` has nothing to refresh.
    time.sleep(1.1)
    git(repo, "update-index", "-q", "--refresh")
    return repo


def _sample_count(db: Path) -> int:
    try:
        return query(db, "SELECT COUNT(*) FROM samples")[0][0]
    except sqlite3.Error:  # not created yet, or the schema is being written
        return 0


def _hangup_as_from_a_terminal() -> None:
    """The harness keeps an ignored SIGHUP ignored (a run under ``nohup`` outlives its
    terminal); a test run under ``nohup`` would pass that on, so start as a terminal does."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _start(tmp_path: Path, checkout: Path) -> tuple[subprocess.Popen, Path, Path]:
    spec = write_spec(
        tmp_path / "hypotheses.yaml", engine={"preset": "demo", "repo": checkout.name}, benchmark=SMALL_BENCH,
        # Far more boots than the test waits for: the signal always lands mid-run.
        defaults={"samples_per_boot": 3, "boots_per_arm": 3, "max_boots_per_arm": 4},
        hypotheses=[{"id": "head-regression", "baseline": {"commit": "HEAD~26"}, "treatment": {"commit": "HEAD"},
                     "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}])
    db = tmp_path / "r.db"
    with open(tmp_path / "harness.out", "wb") as out, open(tmp_path / "harness.err", "wb") as err:
        proc = subprocess.Popen(
            [*HARNESS, "run", str(spec), "--no-calibration", "--ledger", f"sqlite:///{db}",
             "--journal-dir", str(tmp_path / "exp"), "--json"],
            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
            preexec_fn=_hangup_as_from_a_terminal)
    return proc, db, tmp_path / "harness.err"


def _run_until_first_sample(tmp_path, checkout, worktrees_root):
    """Start the harness and return once a sample is in the ledger and a server runs."""
    proc, db, err = _start(tmp_path, checkout)
    try:
        wait_for(lambda: _sample_count(db) >= 1 or proc.poll() is not None, timeout=FIRST_SAMPLE_TIMEOUT_S,
                 what="the first sample row")
        assert proc.poll() is None, f"harness exited early ({proc.returncode}):\n{err.read_text()[-3000:]}"
        # A server of this run lives in a worktree right now: the later check for
        # leftovers looks at the right place.
        assert processes_under(worktrees_root), "no server process found inside the cache's worktrees"
    except BaseException:
        _kill_group(proc)
        raise
    return proc, db, err


def _kill_group(proc: subprocess.Popen) -> None:
    """Clean-up after a failed assertion: the harness we started and its group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def _run_status(db: Path) -> str:
    (status,), = query(db, "SELECT status FROM runs")
    return status


def test_ctrl_c_stops_every_server_keeps_samples_and_leaves_the_checkout_alone(tmp_path, dirty_checkout,
                                                                               harness_cache):
    before = snapshot_checkout(dirty_checkout)
    worktrees = harness_cache / "repos"
    proc, db, err = _run_until_first_sample(tmp_path, dirty_checkout, worktrees)
    samples_before = _sample_count(db)

    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(timeout=30)
    finally:
        _kill_group(proc)
    stderr = err.read_text()
    assert rc == 130, stderr[-3000:]
    assert "Traceback" not in stderr

    assert _run_status(db) == "interrupted"
    assert _sample_count(db) >= samples_before >= 1
    # The harness stopped its servers before it exited: nothing to wait for.
    assert processes_under(worktrees) == []
    assert reapers_of(proc.pid) == []
    # The journal was still written, and says what happened.
    (journal,) = (tmp_path / "exp").glob("*-run*.md")
    assert "**status**: interrupted" in journal.read_text()
    assert diff_snapshots(before, snapshot_checkout(dirty_checkout)) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGHUP], ids=["SIGKILL", "SIGTERM", "SIGHUP"])
def test_killed_harness_leaves_no_orphans_and_the_checkout_alone(tmp_path, dirty_checkout, harness_cache, sig):
    before = snapshot_checkout(dirty_checkout)
    worktrees = harness_cache / "repos"
    proc, db, err = _run_until_first_sample(tmp_path, dirty_checkout, worktrees)
    samples_before = _sample_count(db)

    killed_at = time.monotonic()
    proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=30)
    finally:
        _kill_group(proc)
    stderr = err.read_text()
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
        # Nobody could record anything: the run row stays as it was, its samples kept.
        assert _run_status(db) == "running"
        # The supervisor notices the harness is gone and takes the server's tree down.
        try:
            wait_for(lambda: not processes_under(worktrees) and not reapers_of(proc.pid), timeout=15,
                     what="the supervisor to stop the server's tree")
        except AssertionError:
            pytest.fail(f"left 15 s after SIGKILL: {processes_under(worktrees)}, "
                        f"supervisors {reapers_of(proc.pid)}")
        assert time.monotonic() - killed_at < 15
        # The next open of the ledger sees the run's harness process is gone and says so.
        Ledger(f"sqlite:///{db}").close()
        assert _run_status(db) == "interrupted"
        assert query(db, "SELECT COUNT(*) FROM boots WHERE status = 'running'")[0][0] == 0
    else:
        assert rc == 128 + sig, stderr[-3000:]
        assert "Traceback" not in stderr
        assert _run_status(db) == "interrupted"
        (journal,) = (tmp_path / "exp").glob("*-run*.md")
        assert "**status**: interrupted" in journal.read_text()
        assert processes_under(worktrees) == []
        assert reapers_of(proc.pid) == []
    assert _sample_count(db) >= samples_before >= 1
    assert diff_snapshots(before, snapshot_checkout(dirty_checkout)) == []
