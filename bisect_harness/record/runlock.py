"""One controller per run: a run row is held by one live harness at a time.

A harness holds its run from the moment the row exists (a new run) or is taken
up (``--resume``) until it records the run's end. How a run is held depends on
the database (:func:`hold` asks the kinds, :data:`KINDS`):

- **SQLite**: an OS file lock (``flock``) on ``<ledger file>.run-<id>.lock``. The
  kernel drops it when its holder exits, SIGKILL included, so a killed harness
  never leaves a run locked. The file names its holder (pid, host, start time)
  for the message a refused harness prints. A holder that records the run's end
  removes the file; one that could not (killed, or the ledger refused the write)
  leaves it behind, free: a ``running`` row whose lock file is there and free has
  no controller, and the next open of the ledger marks it ``interrupted``
  (``Ledger._mark_stale``), on any host that shares the ledger's folder.
- **PostgreSQL**: a session-level advisory lock (``pg_try_advisory_lock``) keyed
  by the ledger (a namespace drawn from the ledger's schema, within its database)
  and the run id, held on a connection of its own for the life of the run. The
  server drops it when that connection closes: its holder exited or was killed
  (a node that vanishes is found by the TCP keepalives that connection asks for,
  in about a minute). The connection's ``application_name`` names the holder
  (``harness PID@HOST``, which the server cuts at 63 bytes: a host name past 47
  characters is shown cut), read through ``pg_locks`` and ``pg_stat_activity``
  by a refused harness. Every harness that writes a Postgres ledger holds its
  runs, so a ``running`` row whose lock nobody holds (``pg_locks``) has no
  controller, and the next open marks it ``interrupted``.
- **Other databases**: nothing is held; the row's conditional claim
  (``interrupted``/``failed`` to ``running`` in one UPDATE, ``resume.take_up``)
  keeps two resumes from both taking a run up.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from bisect_harness.errors import InfrastructureError, UserError
from bisect_harness.record import database, liveness

__all__ = ["RunHeld", "RunLock", "FileLock", "SessionLock", "KINDS", "lock_path", "advisory_key", "hold",
           "left_free"]


class RunHeld(UserError):
    """Another live harness controls the run (exit 2: wait for it, or stop it)."""

    def __init__(self, run_id: int, holder: dict | None):
        self.run_id, self.holder = run_id, holder or {}
        pid, host = self.holder.get("pid", "?"), self.holder.get("hostname", "?")
        super().__init__(f"run {run_id} is still running (harness pid {pid} on {host}): one harness controls a "
                         f"run at a time. Wait for that harness to end, or stop pid {pid} on {host}; then "
                         f"`--resume {run_id}` continues what it leaves")


class RunLock:
    """A run held by this process; this base holds nothing (a ledger whose database
    has no lock: the stand-in, so no caller asks whether there is one)."""

    @property
    def held(self) -> bool:
        return False

    def release(self, *, ended: bool = True) -> None:
        """Let go, once. ``ended``: the run's end is recorded (see the kinds)."""


class FileLock(RunLock):
    """A SQLite ledger's run held by ``flock`` on its lock file."""

    def __init__(self, path: Path, fd: int):
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


class SessionLock(RunLock):
    """A Postgres ledger's run held by an advisory lock on a connection of its own.
    Letting go closes that connection; whether the end was recorded is the row's to
    say (a ``running`` row nobody holds has no controller)."""

    def __init__(self, connection: Connection, key: tuple[int, int]):
        self.connection, self.key = connection, key

    @property
    def held(self) -> bool:
        return self.connection is not None

    def release(self, *, ended: bool = True) -> None:
        if self.connection is None:
            return
        connection, self.connection = self.connection, None
        try:
            connection.execute(text("SELECT pg_advisory_unlock(:ns, :run)"), {"ns": self.key[0], "run": self.key[1]})
        except SQLAlchemyError:
            pass  # the connection is gone already, and the lock with it
        finally:
            engine = connection.engine
            connection.close()
            engine.dispose()


# --------------------------------------------------------------------------- SQLite: a file lock


class _FileLocks:
    backend = database.SQLITE

    @staticmethod
    def hold(url: str, run_id: int) -> RunLock:
        path = lock_path(url, run_id)
        if path is None:  # an in-memory ledger: one process, nothing to share
            return RunLock()
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise InfrastructureError(f"cannot make the run lock {path}: {exc.strerror}; the ledger's folder "
                                          "must be writable (make it so, or pass --ledger with a writable "
                                          "ledger)") from None
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
        return FileLock(path, fd)

    @staticmethod
    def left_free(url: str, run_id: int, connection: Connection | None = None) -> bool:
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


# --------------------------------------------------------------------------- PostgreSQL: an advisory lock

#: Settings of a holder's connection: the server probes it after 30 s of silence and
#: drops it (and the lock) when a holder's host is gone for about a minute, and no
#: server-wide idle timeout ends it while the run goes on.
_HOLD_OPTIONS = ("-c tcp_keepalives_idle=30 -c tcp_keepalives_interval=10 -c tcp_keepalives_count=3 "
                 "-c idle_session_timeout=0 -c idle_in_transaction_session_timeout=0")
#: ``application_name`` of a holder's connection: ``harness PID@HOST``.
_HOLDER_PREFIX = "harness "
#: The holders of one run's advisory key in this database, their connections' names.
_HOLDERS = text(
    "SELECT a.application_name FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid::bigint = :ns AND l.objid::bigint = :run")


def advisory_key(schema: str, run_id: int) -> tuple[int, int]:
    """The two 32-bit keys of run ``run_id``'s advisory lock in a ledger whose tables
    live in ``schema``: a namespace (non-negative, so ``pg_locks`` shows it as given)
    drawn from the harness's name and the schema, and the run id. Advisory locks are
    per database already; the schema keeps two ledgers of one database apart."""
    digest = hashlib.sha256(f"bisect-harness run lock\0{schema}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF, int(run_id)


def _key(connection: Connection, run_id: int) -> tuple[int, int]:
    return advisory_key(connection.execute(text("SELECT current_schema()")).scalar() or "", run_id)


def _holder(connection: Connection, key: tuple[int, int]) -> dict | None:
    """The holder of ``key`` as its connection names it (``pid``, ``hostname``), {} for
    a holder of another name, None when nobody holds it."""
    names = connection.execute(_HOLDERS, {"ns": key[0], "run": key[1]}).scalars().all()
    if not names:
        return None
    name = names[0] or ""
    if not name.startswith(_HOLDER_PREFIX):
        return {}
    pid, _, host = name[len(_HOLDER_PREFIX):].partition("@")
    return {"pid": int(pid) if pid.isdigit() else pid, "hostname": host or "?"}


class _AdvisoryLocks:
    backend = database.POSTGRES

    @staticmethod
    def hold(url: str, run_id: int) -> RunLock:
        me = liveness.owner_record()
        name = f"{_HOLDER_PREFIX}{me['pid']}@{me['hostname'] or socket.gethostname()}"
        target = database.engine_url(url)
        given = target.query.get("options")  # the URL's own (a search_path, say) come first
        options = " ".join(o for o in (given if isinstance(given, str) else "", _HOLD_OPTIONS) if o)
        engine = create_engine(target, poolclass=NullPool,
                               connect_args={"application_name": name[:63], "options": options})
        try:
            connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except SQLAlchemyError as exc:
            engine.dispose()
            raise InfrastructureError(f"cannot hold run {run_id} of the ledger {database.shown(url)}: "
                                      f"{_said(exc)}") from None
        try:
            key = _key(connection, run_id)
            for _attempt in range(3):  # a holder that lets go between our try and our look: try again
                if connection.execute(text("SELECT pg_try_advisory_lock(:ns, :run)"),
                                      {"ns": key[0], "run": key[1]}).scalar():
                    return SessionLock(connection, key)
                holder = _holder(connection, key)
                if holder is not None:
                    raise RunHeld(run_id, holder)
            raise RunHeld(run_id, {})
        except SQLAlchemyError as exc:
            connection.close()
            engine.dispose()
            raise InfrastructureError(f"cannot hold run {run_id} of the ledger {database.shown(url)}: "
                                      f"{_said(exc)}") from None
        except BaseException:
            connection.close()
            engine.dispose()
            raise

    @staticmethod
    def left_free(url: str, run_id: int, connection: Connection | None = None) -> bool:
        if connection is not None:
            return _holder(connection, _key(connection, run_id)) is None
        engine = create_engine(database.engine_url(url), poolclass=NullPool)
        try:
            with engine.connect() as own:
                return _holder(own, _key(own, run_id)) is None
        finally:
            engine.dispose()


def _said(exc: BaseException) -> str:
    return (str(getattr(exc, "orig", None) or exc).strip() or type(exc).__name__).splitlines()[0]


class _NoLocks:
    """A database with neither a file nor advisory locks: nothing held, nothing left."""

    backend = None

    @staticmethod
    def hold(url: str, run_id: int) -> RunLock:
        return RunLock()

    @staticmethod
    def left_free(url: str, run_id: int, connection: Connection | None = None) -> bool:
        return False


#: How each database holds a run, asked by its backend name; any other: :class:`_NoLocks`.
KINDS = (_FileLocks, _AdvisoryLocks)


def _kind(url: str):
    backend = database.kind(url)
    return next((k for k in KINDS if k.backend == backend), _NoLocks)


def lock_path(url: str, run_id: int) -> Path | None:
    """``<ledger file>.run-<id>.lock``, or None where the ledger is not a SQLite file."""
    try:
        parsed = database.engine_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != database.SQLITE:
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
    holder when another process holds it, ``InfrastructureError`` when the lock cannot
    be made (a folder that is not writable, a database that does not answer)."""
    return _kind(url).hold(url, run_id)


def left_free(url: str, run_id: int, connection: Connection | None = None) -> bool:
    """True when the run's lock says its last holder went without recording the run's
    end: on SQLite its file is there and nobody holds it; on PostgreSQL nobody holds
    its key (asked on ``connection`` where given). False when it is held, or where the
    database has no lock."""
    return _kind(url).left_free(url, run_id, connection)


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
