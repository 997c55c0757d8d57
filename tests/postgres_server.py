"""A real PostgreSQL server on this host, for the ledger's tests.

The distribution's own binaries (``initdb``, ``postgres``; Debian keeps them in
``/usr/lib/postgresql/VERSION/bin``) make a cluster in a scratch folder and run it
in the foreground, in its own process group, on a free port of 127.0.0.1 (and a
Unix socket in the scratch folder, nowhere shared). PostgreSQL refuses to run as
root: as root the cluster belongs to the ``postgres`` user the package creates,
its folder made under the system's temp folder and handed to that user.

The cluster has an administrator and a role the tests use, both with passwords
(``scram-sha-256`` on TCP), so a test can check that the URL's password is never
stored or printed. :meth:`PostgresServer.new_database` makes a fresh database
owned by that role, one per test.

``stop`` asks the postmaster for a fast shutdown (SIGINT: sessions ended, no
waiting for clients), then SIGKILLs the process group if it lingers, so nothing
is left running; the scratch folder goes with it.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

#: ``BISECT_HARNESS_REQUIRE_POSTGRES=1`` (CI): a missing server fails its tests instead of skipping them.
REQUIRE = "BISECT_HARNESS_REQUIRE_POSTGRES"
ROLE = "harness"


class ServerUnavailable(RuntimeError):
    """PostgreSQL is not installed here, or would not start: the reason says which."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_bin() -> Path | None:
    """The folder of ``initdb`` and ``postgres``: on PATH, else the newest of Debian's."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).resolve().parent
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                    key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parent.parent.name.split(".")])
    return Path(debian[-1]).parent if debian else None


class PostgresServer:
    """One PostgreSQL cluster: :meth:`start`, :meth:`new_database`, :meth:`stop`."""

    def __init__(self):
        self.port = 0
        self.root: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.admin_password = secrets.token_urlsafe(18)
        self.password = "pw-" + secrets.token_urlsafe(18)  # the role's: what must never be stored or printed
        self.user: pwd.struct_passwd | None = None

    # -- set-up --------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> "PostgresServer":
        bin_dir = server_bin()
        if bin_dir is None:
            raise ServerUnavailable("no initdb/postgres binaries (apt-get install postgresql)")
        if os.geteuid() == 0:  # postgres refuses root: the cluster is the package's user's
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                raise ServerUnavailable("running as root and there is no 'postgres' user to run the server "
                                        "as (the postgresql package makes it)") from None
        # under the system's temp folder: the server's user must reach it, which pytest's
        # own folders (mode 0700, root's) do not let it do
        self.root = Path(tempfile.mkdtemp(prefix="bh-postgres-"))
        try:
            self._initdb(bin_dir)
            self.port = free_port()
            log = open(self.root / "server.log", "ab")
            try:
                self.proc = subprocess.Popen(
                    [str(bin_dir / "postgres"), "-D", str(self.root / "data"), "-p", str(self.port),
                     "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}",
                     "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                     "-c", "max_connections=200"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.root,
                    start_new_session=True, **self._as_user())
            finally:
                log.close()
            self._wait_ready(timeout_s)
            self._admin(f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{self.password}'")
        except BaseException:
            self.stop()
            raise
        return self

    def _as_user(self) -> dict:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": [],
                "env": {"PATH": os.environ.get("PATH", ""), "HOME": self.user.pw_dir, "LC_ALL": "C"}}

    def _initdb(self, bin_dir: Path) -> None:
        pwfile = self.root / "admin.pw"
        pwfile.write_text(self.admin_password + "\n")
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
            os.chown(pwfile, self.user.pw_uid, self.user.pw_gid)
        os.chmod(pwfile, 0o600)
        done = subprocess.run([str(bin_dir / "initdb"), "-D", str(self.root / "data"), "-U", "admin",
                               f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256",
                               "-E", "UTF8", "--locale=C", "--no-sync"],
                              capture_output=True, text=True, timeout=120, cwd=self.root, start_new_session=True,
                              **self._as_user())
        if done.returncode != 0:
            raise ServerUnavailable(f"initdb exited with {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")

    def _wait_ready(self, timeout_s: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise ServerUnavailable(f"postgres exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                psycopg.connect(self.admin_dsn("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise ServerUnavailable(f"postgres did not answer in {timeout_s:.0f} s:\n{self.log_tail()}")
                time.sleep(0.1)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.root / "server.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    # -- use -----------------------------------------------------------------

    def admin_dsn(self, db: str) -> str:
        return f"host=127.0.0.1 port={self.port} dbname={db} user=admin password={self.admin_password}"

    def _admin(self, sql: str, db: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.admin_dsn(db), autocommit=True) as conn:
            conn.execute(sql)

    def url(self, db: str, *, driver: str = "postgresql+psycopg") -> str:
        """The ledger URL of database ``db``, as the test role, password included."""
        return f"{driver}://{ROLE}:{self.password}@127.0.0.1:{self.port}/{db}"

    def new_database(self, template: str | None = None) -> str:
        """A fresh database owned by the test role (a copy of ``template`` where given,
        which nobody may be connected to); its name."""
        name = f"ledger_{uuid.uuid4().hex[:12]}"
        self._admin(f"CREATE DATABASE {name} OWNER {ROLE}" + (f" TEMPLATE {template}" if template else ""))
        return name

    def drop_database(self, name: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    # -- tear-down -----------------------------------------------------------

    def stop(self, grace_s: float = 15.0) -> None:
        """Fast shutdown, then SIGKILL on the process group; the scratch folder goes."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGINT)  # fast shutdown: sessions ended, not waited for
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # whatever outlived the postmaster
            except (ProcessLookupError, PermissionError):
                pass
            if self.proc.poll() is None:
                self.proc.wait(timeout=grace_s)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[int]:
        """Pids still running in the server's process group."""
        if self.proc is None:
            return []
        out = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(proc.pid) == self.proc.pid and proc.status() != psutil.STATUS_ZOMBIE:
                    out.append(proc.pid)
            except (psutil.Error, OSError):
                continue
        return out


# --------------------------------------------------------------------------- the fixtures


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server per session (per xdist worker), stopped at its end.
    Skipped with the reason where PostgreSQL or psycopg is not installed, unless
    ``BISECT_HARNESS_REQUIRE_POSTGRES=1`` (CI), where that fails."""
    required = os.environ.get(REQUIRE) == "1"
    try:
        import psycopg  # noqa: F401 - the driver the ledger uses
    except ImportError as exc:
        if required:
            raise
        pytest.skip(f"no PostgreSQL driver: {exc} (pip install 'bisect-harness[postgres]')")
    server = PostgresServer()
    try:
        server.start()
    except ServerUnavailable as exc:
        if required:
            raise
        pytest.skip(f"no PostgreSQL server on this host: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_url(request, tmp_path):
    """A fresh, empty ledger's URL on each database: a SQLite file, then a PostgreSQL
    database of its own (dropped at the end)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'r.db'}"
        return
    server = request.getfixturevalue("postgres_server")
    name = server.new_database()
    try:
        yield server.url(name)
    finally:
        server.drop_database(name)
