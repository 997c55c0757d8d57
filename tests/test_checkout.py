"""Checkout: worktrees in the cache, never a byte of the user's checkout touched."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from bisect_harness.engines.checkout import CHECKOUT_MODES, Workspace
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


# --------------------------------------------------------------------------- checkout modes

READS_GIT_INDEX = ("import pathlib, sys\n"
                   "# as llama.cpp's CMake of 2023 did: build-info depends on .git/index, .git taken as a folder\n"
                   "sys.exit(0 if pathlib.Path('.git/index').is_file() else 4)\n")


@pytest.mark.parametrize("mode", ["worktree", "tree", "clone"])
def test_each_checkout_mode_gives_the_commit_and_leaves_the_user_alone(repo, tmp_path, mode):
    before = snapshot(repo)
    ws = Workspace(repo, tmp_path / "cache")
    first, head = ws.resolve("HEAD~3"), ws.resolve("HEAD")
    for sha, version in ((first, "1\n"), (head, "4\n")):
        tree = ws.checkout(sha, mode)
        assert tree.is_relative_to(tmp_path / "cache") and tree.name == sha
        assert (tree / "VERSION").read_text() == version
        assert ws.checkout(sha, mode) == tree  # made once
    git_path = ws.checkout(head, mode) / ".git"
    if mode == "worktree":
        assert git_path.is_file()
    elif mode == "tree":
        assert not git_path.exists()
    else:  # a repository of its own: the commit checked out, clean, with the history and tags
        assert git_path.is_dir()
        clone = ws.checkout(head, mode)
        assert git(clone, "rev-parse", "HEAD") == head
        assert git(clone, "status", "--porcelain") == ""
        assert git(clone, "rev-list", "--count", "HEAD") == "4"
    assert snapshot(repo) == before
    assert not (repo / ".git" / "worktrees").exists()


def test_a_build_that_reads_git_index_needs_a_clone(repo, tmp_path):
    """The worktree symptom (``.git`` is a file) and its cure (``checkout: clone``)."""
    git(repo, "stash", "-q")
    (repo / "build.py").write_text(READS_GIT_INDEX)
    git(repo, "add", "build.py")
    git(repo, "commit", "-q", "-m", "build reads .git/index")
    ws = Workspace(repo, tmp_path / "cache")
    sha = ws.resolve("HEAD")
    argv = [sys.executable, "build.py"]
    with pytest.raises(BuildFailed, match="exit 4"):
        ws.build(sha, argv, dict(os.environ))
    with pytest.raises(BuildFailed, match="exit 4"):
        ws.build(sha, argv, dict(os.environ), mode="tree")
    result = ws.build(sha, argv, dict(os.environ), mode="clone")
    assert result.ok and not result.cached


def test_a_half_made_checkout_is_never_used_or_listed(repo, tmp_path):
    from bisect_harness.plan.cache import list_cache

    ws = Workspace(repo, tmp_path / "cache")
    sha = ws.resolve("HEAD")
    # a run killed while exporting: its temporary folder is left behind
    half = ws.root / "trees" / f".{sha}.tmp-999999"
    half.mkdir(parents=True)
    (half / "VERSION").write_text("half\n")
    assert [e for e in list_cache(tmp_path / "cache") if e.kind == "tree"] == []
    tree = ws.checkout(sha, "tree")
    assert (tree / "VERSION").read_text() == "4\n"
    kinds = {e.kind for e in list_cache(tmp_path / "cache")}
    assert kinds == {"tree"}


def test_the_build_key_is_the_builds_variables_not_the_whole_environment(repo, tmp_path):
    ws = Workspace(repo, tmp_path / "cache")
    sha = ws.resolve("HEAD~3")
    counter = tmp_path / "builds-run.txt"
    argv = [sys.executable, "-c", "import sys; open(sys.argv[1], 'a').write('x')", str(counter)]
    base = {"PATH": os.environ["PATH"]}

    def built(env, **kw) -> bool:
        return not ws.build(sha, argv, env, **kw).cached

    assert built(base)
    assert not built({**base, "NCCL_ALGO": "Ring", "CI_JOB_ID": "7"})  # an arm's variable: same build
    assert built({**base, "CMAKE_ARGS": "-DGGML_CUDA=ON"})              # a compiler's variable: another
    assert not built({**base, "CMAKE_ARGS": "-DGGML_CUDA=ON"})
    assert built({**base, "GGML_CUDA": "1"}, build_env=("GGML_CUDA",))  # declared by the spec
    assert not built({**base, "GGML_CUDA": "1", "OTHER": "x"}, build_env=("GGML_CUDA",))
    assert built(base, mode="clone")                                    # another checkout, another build
    assert counter.read_text() == "xxxx"


def test_cache_list_and_prune_cover_every_checkout_mode(repo, tmp_path):
    from bisect_harness.plan.cache import list_cache, prune

    ws = Workspace(repo, tmp_path / "cache")
    sha = ws.resolve("HEAD")
    paths = {mode: ws.checkout(sha, mode) for mode in ("worktree", "tree", "clone")}
    ws.build(sha, [sys.executable, "-c", "pass"], dict(os.environ), mode="clone")
    entries = list_cache(tmp_path / "cache")
    assert {e.kind: e.path for e in entries} == paths
    assert all(e.commit == sha and e.size_bytes > 0 for e in entries)
    assert list((ws.root / "builds").glob(f"{sha}-*"))
    assert {e.kind for e in prune(entries)} == {"worktree", "tree", "clone"}
    assert not any(p.exists() for p in paths.values())
    assert not list((ws.root / "builds").glob(f"{sha}-*"))  # their builds are redone on next use
    assert "worktree" not in git(ws.mirror_path, "worktree", "list").split("\n", 1)[-1]
    assert ws.checkout(sha, "clone").is_dir()  # made again on next use


@pytest.mark.parametrize("mode", ["worktree", "clone"])
def test_a_checkout_moved_to_another_commit_is_made_again(repo, tmp_path, mode):
    ws = Workspace(repo, tmp_path / "cache")
    first, head = ws.resolve("HEAD~3"), ws.resolve("HEAD")
    tree = ws.checkout(head, mode)
    git(tree, "checkout", "-q", "--detach", first)  # a build script that ran git checkout, say
    assert (tree / "VERSION").read_text() == "1\n"
    again = ws.checkout(head, mode)
    assert again == tree and (again / "VERSION").read_text() == "4\n"
    assert git(again, "rev-parse", "HEAD").strip() == head


def test_a_link_in_the_cache_is_never_followed(repo, tmp_path):
    ws = Workspace(repo, tmp_path / "cache")
    sha = ws.resolve("HEAD")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not the cache's\n")
    for mode in ("tree", "worktree"):
        link = ws.root / CHECKOUT_MODES[mode].folder / sha
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(elsewhere, target_is_directory=True)
        got = ws.checkout(sha, mode)
        assert not got.is_symlink() and (got / "VERSION").read_text() == "4\n"
    assert (elsewhere / "keep.txt").read_text() == "not the cache's\n" and len(list(elsewhere.iterdir())) == 1
