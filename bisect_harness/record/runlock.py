"""One controller per run: a run row is held by one live harness at a time.

A harness holds its run from the moment the row exists (a new run) or is taken
up (``--resume``) until it records the run's end. On a SQLite ledger the hold is
an OS file lock (``flock``) on ``<ledger file>.run-<id>.lock``: the kernel drops
it when its holder exits, SIGKILL included, so a killed harness never leaves a
run locked. The file names its holder (pid, host, start time) for the message a
refused harness prints.

A holder that records the run's end removes the file. A holder that could not
(killed, or the ledger refused the write) leaves it behind, free: a ``running``
row whose lock file is there and free has no controller, and the next open of
the ledger marks it ``interrupted`` (``Ledger._mark_stale``), on any host that
shares the ledger's folder.

Other databases have no file next to them; there the row's conditional claim
(``interrupted``/``failed`` to ``running`` in one UPDATE, ``resume.take_up``) keeps
two resumes from both taking a run up.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from bisect_harness.errors import InfrastructureError, UserError
from bisect_harness.record import liveness

__all__ = ["RunHeld", "RunLock", "lock_path", "hold", "left_free"]


class RunHeld(UserError):
    """Another live harness controls the run (exit 2: wait for it, or stop it)."""

    def __init__(self, run_id: int, holder: dict | None):
        self.run_id, self.holder = run_id, holder or {}
        pid, host = self.holder.get("pid", "?"), self.holder.get("hostname", "?")
        super().__init__(f"run {run_id} is still running (harness pid {pid} on {host}): one harness controls a "
                         f"run at a time. Wait for that harness to end, or stop pid {pid} on {host}; then "
                         f"`--resume {run_id}` continues what it leaves")


class RunLock:
    """A held run lock (or none, for a ledger with no file); :meth:`release` lets go once."""

    def __init__(self, path: Path | None = None, fd: int | None = None):
        self.path, self.fd = path, fd

    @property
    def held(self) -> bool:
        return self.fd is not None

    def release(self, *, ended: bool = True) -> None:
        """Let go. ``ended``: the run's end is recorded, so the file goes; otherwise it
        stays behind, free, and says the run has no controller."""
        if self.fd is None:
            return
        if ended:
            try:
                os.unlink(self.path)  # while still held: no one can lock this file in between
            except OSError:
                pass
        os.close(self.fd)
        self.fd = None


def lock_path(url: str, run_id: int) -> Path | None:
    """``<ledger file>.run-<id>.lock``, or None where the ledger is not a SQLite file."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite":
        return None
    db = parsed.database or ""
    if db.startswith("file:"):  # a SQLite URI: file:PATH?mode=...
        db = db[len("file:"):].split("?", 1)[0]
    if not db or db == ":memory:":
        return None
    path = Path(db)
    return path.with_name(f"{path.name}.run-{run_id}.lock")


def hold(url: str, run_id: int) -> RunLock:
    """Hold run ``run_id`` of the ledger at ``url``; raises :class:`RunHeld` naming the
    holder when another process holds it, ``InfrastructureError`` when the lock file
    cannot be made."""
    path = lock_path(url, run_id)
    if path is None:
        return RunLock()
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise InfrastructureError(f"cannot make the run lock {path}: {exc.strerror}; the ledger's folder must "
                                      "be writable (make it so, or pass --ledger with a writable ledger)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunHeld(run_id, holder) from None
            raise InfrastructureError(f"cannot lock {path}: {exc.strerror}") from None
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder removed the file between our open and our lock: try the new one
    try:  # the holder's name for a refused harness; the lock holds even where this cannot be written
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(liveness.owner_record()).encode(), 0)
    except OSError:
        pass
    return RunLock(path, fd)


def left_free(url: str, run_id: int) -> bool:
    """True when the run's lock file is there and nobody holds it: its last holder went
    without recording the run's end. False when there is no file, or it is held."""
    path = lock_path(url, run_id)
    if path is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def _read(fd: int) -> dict | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
