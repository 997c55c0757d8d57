"""Whether a cached checkout or environment is still what it was made from.

A commit's checkout (``engines.checkout``) and its Python environment
(``engines.envs``) are made once and used by every boot of the commit; anything
may change them in between: a person's edit, a build script, another commit's
files copied into the folder, a link to another commit's file put where a file
was. So when one is made (and again when a build has run in it), a *record* is
written beside it in the cache, ``<folder>.record.json``: what it was made from
(the commit, its tree id, the checkout mode; for an environment, the distributions
installed into it and where each was installed from) and a manifest of its files,
each path with its kind, size, mtime, ctime, inode, mode and the SHA-256 of its
content (a link: its target).

:func:`verify` compares a folder with its record the cheap way: every file is
stat'ed, and only a file whose stat differs from the record is read and hashed
(the one place content is read: :func:`file_digest`). A file added or removed, a
link where a file was, or content that differs is a change; a file whose stat
changed and whose content did not is written back into the record with its new
stat (``Check.refreshed``), so the next check of it is a stat again. Python's
bytecode caches (``__pycache__``, written by the interpreter that imports the
code and checked by it against its source) are never compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

__all__ = ["CHECKOUT_CHANGED", "Record", "Check", "record_path", "make", "update", "verify", "load", "save",
           "held", "changed_since", "file_digest", "describe"]

#: The boot mark of a boot whose checkout or environment changed while it ran: never counted.
CHECKOUT_CHANGED = "checkout_changed"
SUFFIX = ".record.json"
#: Folders never compared, anywhere in the tree.
SKIP_DIRS = frozenset({"__pycache__"})
#: Changes named in a sentence; the rest are counted.
SHOWN = 5


def record_path(folder: Path) -> Path:
    """Where the record of ``folder`` lives: beside it, ``<folder>.record.json``."""
    folder = Path(folder)
    return folder.with_name(folder.name + SUFFIX)


def file_digest(path: str) -> str:
    """The SHA-256 of a file's content: the only read of a file's bytes a check makes."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


@dataclass
class Record:
    """What a folder was made from (``about``) and its files: relative path ->
    ``[kind, size, mtime_ns, ctime_ns, inode, mode, digest]`` (kind ``f`` a file,
    ``l`` a link whose digest is its target, ``o`` anything else). ``skip``: names
    at the folder's top never compared (a worktree's ``.git``)."""

    about: dict
    files: dict[str, list]
    skip: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"version": 1, "about": self.about, "skip": list(self.skip), "files": self.files})

    @classmethod
    def from_json(cls, text: str) -> "Record":
        data = json.loads(text)
        return cls(about=dict(data["about"]), files=dict(data["files"]), skip=tuple(data.get("skip") or ()))


@dataclass(frozen=True)
class Check:
    """A folder compared with its record: the changes found (sentences), how many
    files were stat'ed and how many read, and whether the record took new stats."""

    changes: tuple[str, ...]
    files: int = 0
    hashed: int = 0
    refreshed: bool = False

    @property
    def ok(self) -> bool:
        return not self.changes


def _kind(mode: int) -> str:
    return "f" if stat.S_ISREG(mode) else "l" if stat.S_ISLNK(mode) else "o"


_WORD = {"f": "a file", "l": "a link", "o": "not a file"}


def _scan(root: Path, skip: Sequence[str]) -> dict[str, os.stat_result]:
    """Every entry under ``root`` that is not a folder, by relative path, as lstat
    sees it (links never followed)."""
    out: dict[str, os.stat_result] = {}
    stack = [("", str(root))]
    while stack:
        rel, folder = stack.pop()
        with os.scandir(folder) as entries:
            for e in entries:
                if (not rel and e.name in skip) or e.name in SKIP_DIRS and e.is_dir(follow_symlinks=False):
                    continue
                if e.is_dir(follow_symlinks=False):
                    stack.append((f"{rel}{e.name}/", e.path))
                else:
                    out[rel + e.name] = e.stat(follow_symlinks=False)
    return out


def _content(path: str, st: os.stat_result) -> str:
    kind = _kind(st.st_mode)
    if kind == "l":
        return "->" + os.readlink(path)
    return file_digest(path) if kind == "f" else ""


def _entry(st: os.stat_result, digest: str) -> list:
    return [_kind(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode, digest]


def _same_stat(entry: Sequence, st: os.stat_result) -> bool:
    return list(entry[1:6]) == [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode]


def make(root: Path, about: Mapping, *, skip: Sequence[str] = ()) -> Record:
    """The record of ``root`` as it is now: every file read and hashed."""
    files = {rel: _entry(st, _content(os.path.join(root, rel), st)) for rel, st in _scan(Path(root), skip).items()}
    return Record(about=dict(about), files=files, skip=tuple(skip))


def update(root: Path, old: Record, about: Mapping | None = None) -> Record:
    """The record of ``root`` as it is now, taking ``old``'s digest where a file's stat
    is unchanged (after a build: only what the build wrote is read)."""
    files = {}
    for rel, st in _scan(Path(root), old.skip).items():
        prev = old.files.get(rel)
        files[rel] = prev if prev is not None and _same_stat(prev, st) else \
            _entry(st, _content(os.path.join(root, rel), st))
    return Record(about=dict(old.about if about is None else about), files=files, skip=old.skip)


def verify(root: Path, record: Record) -> Check:
    """``root`` compared with ``record`` (see the module's docstring). Files whose
    stat changed and content did not take their new stat in ``record``."""
    try:
        now = _scan(Path(root), record.skip)
    except OSError as exc:
        return Check((f"cannot be read ({exc.strerror or exc})",))
    changes: list[str] = [f"{rel}: removed" for rel in sorted(record.files.keys() - now.keys())]
    changes += [f"{rel}: added ({_WORD[_kind(now[rel].st_mode)]})" for rel in sorted(now.keys() - record.files.keys())]
    hashed, refreshed = 0, False
    for rel in sorted(now.keys() & record.files.keys()):
        entry, st = record.files[rel], now[rel]
        if _same_stat(entry, st):
            continue
        kind = _kind(st.st_mode)
        if kind != entry[0]:
            changes.append(f"{rel}: {_WORD[kind]} where {_WORD[entry[0]]} was")
            continue
        try:
            hashed += kind == "f"
            digest = _content(os.path.join(root, rel), st)
        except OSError as exc:
            changes.append(f"{rel}: cannot be read ({exc.strerror or exc})")
            continue
        if digest != entry[6]:
            changes.append(f"{rel}: {'points elsewhere' if kind == 'l' else 'content differs'}")
        elif (entry[5] & 0o7777) != (st.st_mode & 0o7777):
            changes.append(f"{rel}: mode {entry[5] & 0o7777:o} became {st.st_mode & 0o7777:o}")
        else:
            record.files[rel] = _entry(st, digest)
            refreshed = True
    return Check(tuple(changes), files=len(now), hashed=hashed, refreshed=refreshed)


def describe(changes: Sequence[str]) -> str:
    """The first few changes, and how many more."""
    shown = "; ".join(changes[:SHOWN])
    return shown + (f"; and {len(changes) - SHOWN} more" if len(changes) > SHOWN else "")


def load(folder: Path) -> Record | None:
    """The record of ``folder``, or None when there is none (or it cannot be read)."""
    try:
        return Record.from_json(record_path(folder).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(folder: Path, record: Record) -> None:
    """Write the record of ``folder`` whole (a temporary file renamed into place)."""
    path = record_path(folder)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(record.to_json())
    os.replace(tmp, path)


@dataclass(frozen=True)
class Held:
    """Folders as a boot is about to use them, with their records as verified."""

    records: tuple[tuple[Path, Record], ...] = field(default_factory=tuple)


def held(folders: Iterable[Path | None]) -> Held:
    """The records of ``folders`` (those that have one), read before a boot, so
    :func:`changed_since` compares after it with what the boot started on."""
    out = []
    for folder in folders:
        if folder is not None:
            rec = load(Path(folder))
            if rec is not None:
                out.append((Path(folder), rec))
    return Held(tuple(out))


def changed_since(h: Held) -> list[str]:
    """What changed in the held folders since they were read: ``<folder>: <change>``."""
    out = []
    for folder, rec in h.records:
        check = verify(folder, rec)
        out += [f"{folder.name}: {c}" for c in check.changes]
    return out
