"""The cache's worktrees and environments: what is there, and reclaiming it.

The cache folder holds, per engine repository, a bare mirror, a checkout per
commit and mode (``worktrees/<sha>``, ``trees/<sha>``, ``clones/<sha>``: see
``boot.checkout``), a Python environment per commit and base
interpreter (``envs/<sha>-<base>``) and build markers with their logs
(``builds/<sha>-<key>.json``); beside each checkout and environment, the record of
what it was made from (``<folder>.record.json``, ``engines.integrity``), which
every boot verifies it against. ``list_cache`` reports every worktree and
environment with its size and when it was last used (a half-made checkout, a
dot-folder, is not listed); ``prune`` removes them
by age and/or until the total fits a size, oldest first.

Only the cache folder is touched, never the user's repository: a worktree is
removed with ``git worktree remove`` run on the *mirror*. Removing a commit's
worktree or environment also removes that commit's build markers, so the next
boot builds it again instead of trusting a build whose output is gone. The
mirror stays (it is what makes a new worktree cheap).

    >>> entries = list_cache(cache_dir)                  # doctest: +SKIP
    >>> prune(entries, older_than_s=7 * 86400, max_bytes=None)   # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from bisect_harness.engines import integrity
from bisect_harness.engines.checkout import CHECKOUT_MODES
from bisect_harness.errors import UserError

__all__ = ["CacheEntry", "list_cache", "select_for_prune", "prune", "parse_size", "parse_age", "human_size",
           "human_age"]

#: Each kind of entry and its folder in a repository's cache folder: the checkouts, then environments.
FOLDERS = {**{m.name: m.folder for m in CHECKOUT_MODES.values()}, "environment": "envs"}
KINDS = tuple(FOLDERS)


@dataclass(frozen=True)
class CacheEntry:
    """One checkout (worktree, tree or clone) or environment in the cache."""

    kind: str
    repo: str  # the repository's folder in the cache: <name>-<hash of its path>
    commit: str
    path: Path
    size_bytes: int
    last_used: float  # epoch seconds: when a run last used it

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.last_used)

    def to_dict(self, now: float | None = None) -> dict:
        return {"kind": self.kind, "repo": self.repo, "commit": self.commit, "path": str(self.path),
                "size_bytes": self.size_bytes, "last_used": self.last_used, "age_s": round(self.age_s(now), 1)}


def _size(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed, each inode once)."""
    total, seen = 0, set()
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def _last_used(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def list_cache(cache_dir: Path) -> list[CacheEntry]:
    """Every worktree and environment under ``cache_dir``, oldest use first."""
    out = []
    repos = Path(cache_dir) / "repos"
    if not repos.is_dir():
        return out
    for repo in sorted(p for p in repos.iterdir() if p.is_dir()):
        for kind, name in FOLDERS.items():
            folder = repo / name
            if not folder.is_dir():
                continue
            for path in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
                commit = path.name.split("-", 1)[0]
                out.append(CacheEntry(kind=kind, repo=repo.name, commit=commit, path=path,
                                      size_bytes=_size(path), last_used=_last_used(path)))
    out.sort(key=lambda e: (e.last_used, e.kind, e.commit))
    return out


def select_for_prune(entries: Sequence[CacheEntry], *, older_than_s: float | None, max_bytes: int | None,
                     now: float | None = None) -> list[CacheEntry]:
    """What to remove: everything unused for longer than ``older_than_s``, then the
    least recently used until the rest fits in ``max_bytes``."""
    if older_than_s is None and max_bytes is None:
        raise UserError("harness cache prune needs --older-than (e.g. 7d) and/or --max-size (e.g. 20G); "
                        "`harness cache list` shows what is there")
    now = time.time() if now is None else now
    ordered = sorted(entries, key=lambda e: e.last_used)
    chosen = [e for e in ordered if older_than_s is not None and e.age_s(now) > older_than_s]
    if max_bytes is not None:
        total = sum(e.size_bytes for e in ordered if e not in chosen)
        for e in ordered:
            if total <= max_bytes:
                break
            if e not in chosen:
                chosen.append(e)
                total -= e.size_bytes
    return chosen


def _remove_worktree(entry: CacheEntry) -> None:
    mirror = entry.path.parent.parent / "mirror.git"
    if (mirror / "HEAD").exists():
        subprocess.run(["git", "--git-dir", str(mirror), "worktree", "remove", "--force", "--force", str(entry.path)],
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    if entry.path.exists():
        shutil.rmtree(entry.path, ignore_errors=True)
    if (mirror / "HEAD").exists():
        subprocess.run(["git", "--git-dir", str(mirror), "worktree", "prune"], capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=300)


def _drop_builds(entry: CacheEntry) -> None:
    """The commit's build markers and logs: its build is redone on next use."""
    builds = entry.path.parent.parent / "builds"
    if builds.is_dir():
        for marker in builds.glob(f"{entry.commit}-*"):
            marker.unlink(missing_ok=True)


def prune(entries: Iterable[CacheEntry]) -> list[CacheEntry]:
    """Remove ``entries`` (inside the cache only); returns those removed."""
    done = []
    for e in entries:
        if e.kind not in KINDS or e.path.parent.name != FOLDERS[e.kind]:
            raise ValueError(f"not a cache entry: {e.path}")
        _drop_builds(e)
        if e.kind == "worktree":
            _remove_worktree(e)
        else:
            shutil.rmtree(e.path, ignore_errors=True)
            e.path.with_name(e.path.name + ".log").unlink(missing_ok=True)
        integrity.record_path(e.path).unlink(missing_ok=True)  # what it was made from: gone with it
        done.append(e)
    return done


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)
_AGE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*$", re.I)


def parse_size(text: str, *, flag: str = "--max-size") -> int:
    """``500M``, ``20G``, ``1.5GiB``, ``0`` -> bytes (powers of 1024)."""
    m = _SIZE.match(text or "")
    if not m:
        raise UserError(f"{flag} {text!r}: expected a size such as 500M, 20G or 1.5T")
    unit = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}[m.group(2).lower()]
    return int(float(m.group(1)) * 1024 ** unit)


def parse_age(text: str, *, flag: str = "--older-than") -> float:
    """``30m``, ``12h``, ``7d``, ``2w`` -> seconds."""
    m = _AGE.match(text or "")
    if not m:
        raise UserError(f"{flag} {text!r}: expected an age such as 30m, 12h, 7d or 2w")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2).lower()]


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
