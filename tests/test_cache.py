"""``harness cache list`` / ``harness cache prune``: real worktrees and environments in a real cache."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from bisect_harness.plan.cache import CacheEntry, parse_age, parse_size, select_for_prune
from bisect_harness.engines.checkout import Workspace
from bisect_harness.errors import UserError
from helpers import diff_snapshots, git, harness, last_json, snapshot_checkout
from packaged_engine import make_packaged_engine

DAY = 86400.0


def _entry(commit: str, size: int, last_used: float, kind: str = "worktree") -> CacheEntry:
    return CacheEntry(kind=kind, repo="r", commit=commit, path=Path("/cache/repos/r/worktrees") / commit,
                      size_bytes=size, last_used=last_used)


def test_select_by_age_then_by_size_oldest_first():
    now = 100 * DAY
    a, b, c = _entry("a", 300, now - 10 * DAY), _entry("b", 200, now - 5 * DAY), _entry("c", 100, now - DAY)
    assert select_for_prune([c, a, b], older_than_s=7 * DAY, max_bytes=None, now=now) == [a]
    assert select_for_prune([c, a, b], older_than_s=None, max_bytes=250, now=now) == [a, b]
    assert select_for_prune([c, a, b], older_than_s=None, max_bytes=600, now=now) == []
    assert select_for_prune([c, a, b], older_than_s=7 * DAY, max_bytes=100, now=now) == [a, b]
    with pytest.raises(UserError, match="--older-than"):
        select_for_prune([a], older_than_s=None, max_bytes=None)


def test_sizes_and_ages_parse_and_bad_ones_name_the_flag():
    assert parse_size("0") == 0 and parse_size("500M") == 500 * 1024 ** 2 and parse_size("1.5GiB") == int(1.5 * 1024 ** 3)
    assert parse_age("30m") == 1800 and parse_age("7d") == 7 * DAY and parse_age("2w") == 14 * DAY
    with pytest.raises(UserError, match="--max-size 'lots'"):
        parse_size("lots")
    with pytest.raises(UserError, match="--older-than '7 days'"):
        parse_age("7 days")


@pytest.mark.slow
def test_cache_list_and_prune_through_the_cli(tmp_path):
    repo = tmp_path / "engine"
    shas = make_packaged_engine(repo, ["1.0.0", "2.0.0"])
    cache = tmp_path / "cache"
    ws = Workspace(repo, cache)
    build = ["-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "python"]
    for sha in shas:
        ws.worktree(sha)
        env = ws.environment(sha, sys.executable)
        assert not ws.build(sha, [env.python, *build], env.apply(os.environ), python=env.python).cached
    before = snapshot_checkout(repo)

    proc = harness("cache", "list", "--cache-dir", cache, "--json")
    assert proc.returncode == 0, proc.stderr
    listed = last_json(proc.stdout)
    entries = listed["entries"]
    assert sorted((e["kind"], e["commit"]) for e in entries) == sorted(
        (k, s) for k in ("worktree", "environment") for s in shas)
    assert all(e["size_bytes"] > 0 and e["age_s"] < 600 for e in entries)
    assert listed["total_bytes"] == sum(e["size_bytes"] for e in entries)
    text = harness("cache", "list", "--cache-dir", cache).stdout
    assert "4 entries" in text and shas[0][:12] in text

    # the old commit was last used ten days ago
    old = time.time() - 10 * DAY
    for path in (cache / "repos").glob(f"*/*/{shas[0]}*"):
        if path.is_dir():
            os.utime(path, (old, old))
    proc = harness("cache", "prune", "--older-than", "7d", "--dry-run", "--json", "--cache-dir", cache)
    assert proc.returncode == 0, proc.stderr
    dry = last_json(proc.stdout)
    assert dry["dry_run"] and {(e["kind"], e["commit"]) for e in dry["removed"]} == {
        ("worktree", shas[0]), ("environment", shas[0])}
    assert all(Path(e["path"]).exists() for e in dry["removed"]), "a dry run removes nothing"

    proc = harness("cache", "prune", "--older-than", "7d", "--json", "--cache-dir", cache)
    assert proc.returncode == 0, proc.stderr
    done = last_json(proc.stdout)
    assert {e["commit"] for e in done["removed"]} == {shas[0]} and done["kept_entries"] == 2
    assert done["freed_bytes"] == dry["freed_bytes"] > 0
    assert not any(Path(e["path"]).exists() for e in done["removed"])
    mirror = next((cache / "repos").glob("*/mirror.git"))
    assert shas[0] not in git(mirror, "worktree", "list")
    builds = [p.name for p in next((cache / "repos").glob("*/builds")).iterdir()]
    assert not any(b.startswith(shas[0]) for b in builds) and any(b.startswith(shas[1]) for b in builds)

    # a pruned commit is checked out, given an environment and built again on next use
    ws = Workspace(repo, cache)
    env = ws.environment(shas[0], sys.executable)
    assert not ws.build(shas[0], [env.python, *build], env.apply(os.environ), python=env.python).cached

    proc = harness("cache", "prune", "--max-size", "0", "--cache-dir", cache)
    assert proc.returncode == 0, proc.stderr
    assert "4 of 4 entries, freed" in proc.stdout
    assert last_json(harness("cache", "list", "--json", "--cache-dir", cache).stdout)["entries"] == []
    assert diff_snapshots(before, snapshot_checkout(repo)) == [], "the user's repository is never touched"

    proc = harness("cache", "prune", "--cache-dir", cache)
    assert proc.returncode == 2 and "needs --older-than" in proc.stderr and "Traceback" not in proc.stderr
