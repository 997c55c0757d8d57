"""Checkout: worktrees in the cache, never a byte of the user's checkout touched."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from bisect_harness.boot.checkout import Workspace
from bisect_harness.errors import BuildFailed, CommitError

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00"}


def git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def snapshot(repo) -> dict:
    """Every byte of the user's checkout that a harness run must leave alone."""
    out = {}
    for root, dirs, files in os.walk(repo):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, repo)
            if rel.startswith(os.path.join(".git", "objects")):
                continue  # object store: checked via the refs and HEAD below
            with open(path, "rb") as fh:
                out[rel] = hashlib.sha256(fh.read()).hexdigest()
    out["HEAD"] = git(repo, "rev-parse", "HEAD")
    out["status"] = git(repo, "status", "--porcelain")
    return out


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "engine"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    build = "import sys, pathlib\nv = pathlib.Path('VERSION').read_text().strip()\n" \
            "sys.exit(3 if v == 'broken' else 0)\n"
    (repo / "build.py").write_text(build)
    for v in ("1", "2", "broken", "4"):
        (repo / "VERSION").write_text(v + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"version {v}")
    # the user's own uncommitted work: a staged change and an unstaged one
    (repo / "notes.txt").write_text("work in progress\n")
    git(repo, "add", "notes.txt")
    (repo / "VERSION").write_text("local edit\n")
    return repo


def test_worktrees_leave_user_checkout_identical(repo, tmp_path):
    before = snapshot(repo)
    ws = Workspace(repo, tmp_path / "cache")
    shas = ws.commits_between(ws.resolve("HEAD~3"), ws.resolve("HEAD"))
    assert len(shas) == 4
    for sha in shas:
        tree = ws.worktree(sha)
        assert tree.is_relative_to(tmp_path / "cache")
        assert (tree / "VERSION").exists()
    assert (ws.worktree(shas[0]) / "VERSION").read_text() == "1\n"
    assert ws.build(shas[0], [sys.executable, "build.py"], dict(os.environ)).ok
    with pytest.raises(BuildFailed) as err:
        ws.build(shas[2], [sys.executable, "build.py"], dict(os.environ))
    assert "exit 3" in str(err.value)
    with pytest.raises(BuildFailed, match="cached"):  # a failed build is remembered, not re-run
        ws.build(shas[2], [sys.executable, "build.py"], dict(os.environ))
    assert snapshot(repo) == before
    assert not (repo / ".git" / "worktrees").exists()


def test_unknown_commit_is_named(repo, tmp_path):
    ws = Workspace(repo, tmp_path / "cache")
    with pytest.raises(CommitError) as err:
        ws.resolve("deadbeef", where="hypothesis h1, baseline.commit")
    assert "deadbeef" in str(err.value) and "baseline.commit" in str(err.value)
    with pytest.raises(CommitError, match="not an ancestor"):
        ws.commits_between(ws.resolve("HEAD"), ws.resolve("HEAD~2"))


def test_not_a_repository(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(CommitError, match="not a git repository"):
        Workspace(tmp_path / "plain", tmp_path / "cache")


def test_new_commits_are_fetched_into_the_mirror(repo, tmp_path):
    ws = Workspace(repo, tmp_path / "cache")
    ws.worktree(ws.resolve("HEAD"))
    git(repo, "stash", "-q")
    (repo / "extra.txt").write_text("x\n")
    git(repo, "add", "extra.txt")
    git(repo, "commit", "-q", "-m", "later")
    sha = ws.resolve("HEAD")
    assert (ws.worktree(sha) / "extra.txt").exists()


def test_a_commit_builds_once_when_two_slots_ask_at_once(repo, tmp_path):
    """Parallel slots boot two configs of one commit at the same moment: the build runs
    once (the second waits on the build's lock and finds its marker), never twice into
    one environment."""
    import threading

    ws = Workspace(repo, tmp_path / "cache")
    sha = ws.resolve("HEAD")
    counter = tmp_path / "builds-run.txt"
    argv = [sys.executable, "-c", "import sys, time; open(sys.argv[1], 'a').write('x'); time.sleep(1.0)",
            str(counter)]
    results, errors = [], []

    def build():
        try:
            results.append(ws.build(sha, argv, {"PATH": "/usr/bin:/bin"}))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert counter.read_text() == "x"
    assert sorted(r.cached for r in results) == [False, True]
