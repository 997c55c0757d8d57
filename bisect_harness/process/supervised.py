"""The harness's side of a supervised command: start it, read its status, stop its whole tree.

:class:`Supervised` starts :mod:`bisect_harness.process.supervisor` as a process of
its own, which starts the command and owns every process the command starts; the
two talk through the supervisor's stdin (the request, ``stop``) and a status pipe
(``pid``, ``exit``, ``timeout``, ``log``, ``done``; ``logerr`` and ``logtail`` when
the log could not be written). :func:`run` runs a command to
its end; :func:`reap_leftovers` kills what supervisors that died themselves left
behind (their record files); :func:`supervisors_of` lists the live supervisors of
a harness.

Without a cgroup, a process that double-forks *and* leaves its session within the
last tenth of a second before the supervisor itself is SIGKILLed can escape the
record; everything else is found.

The supervisor and the command lead process groups of their own but stay in the
harness's session. Linux's autogroup scheduler (``CONFIG_SCHED_AUTOGROUP``, on by
default on Ubuntu) shares a core between *sessions* before it shares it between
their tasks, and a server in a session of its own whose processes spin on
``sched_yield`` while they serve (vLLM's engine and worker waiting on each other's
shared-memory queue) kept the harness's client off a core for 0.1-0.6 s at a time,
several seconds on a busy host: its requests left late and its clock read their
first tokens late (measured on two cores: p99 send lag 0.5-8.6 s and TTFT p50
0.25-2.6 s at 2-16 req/s, against 1-9 ms and 10-90 ms with the server in the
harness's session). Nothing here needs the session: the tree is found by parentage
(the supervisor is a subreaper) and by its token (``TREE_ENV``).

Example::

    with open(log_path, "ab") as log:
        job = Supervised(["make", "-j8"], env=env, cwd=tree, stdout=log, timeout_s=3600).start()
        rc = job.wait()          # None: it ran past its timeout, and its tree is gone
"""

from __future__ import annotations

import base64
import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Mapping, Sequence

from bisect_harness.errors import InfrastructureError
from bisect_harness.places import default_cache_dir
from bisect_harness.process.capped_log import LOG_HEAD_BYTES, LOG_TAIL_BYTES
from bisect_harness.process.proctree import TREE_ENV, _alive, _carrying, _descendants, _signal, _stat, _table
from bisect_harness.process.supervisor import _KILL_WAIT_S, _SCRIPT, OWN_GROUP

__all__ = ["LaunchError", "Supervised", "reap_leftovers", "registry_dir", "run", "supervisors_of"]


class LaunchError(InfrastructureError, OSError):
    """The command could not be started (not found, not executable, bad cwd).

    An OSError too (``errno``, ``strerror``): callers that can route around it say
    so in their own terms (a boot's becomes :class:`~bisect_harness.errors.BootFailed`,
    a build's a failed build, a tool's a result of its own)."""


def registry_dir() -> Path:
    """Where supervisors record their trees: ``supervised/`` in the harness's cache folder."""
    return default_cache_dir() / "supervised"


def reap_leftovers(registry: Path | None = None) -> int:
    """Kill what supervisors that died without cleaning up left behind; return how many.

    A record is acted on only when its supervisor *and* the harness that started it
    are gone (pid and start time both checked). Its processes still alive with their
    recorded start time, their descendants now, and the members of their sessions
    that started after the supervisor are SIGKILLed; then the record is removed.
    """
    registry = registry_dir() if registry is None else Path(registry)
    try:
        files = sorted(registry.glob("*.json"))
    except OSError:
        return 0
    killed = 0
    for path in files:
        try:
            rec = json.loads(path.read_text())
            harness, sup = rec["harness"], rec["supervisor"]
            procs = {int(p): t for p, t in rec["processes"]}
            sessions = [int(s) for s in rec["sessions"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours: leave it
        if _alive(*sup) or _alive(*harness):
            continue
        for _ in range(50):
            table = _table()
            targets = {pid: t for pid, t in procs.items() if pid in table and table[pid][2] == t}
            for sid in sessions:
                leader = table.get(sid)
                if leader is not None and procs.get(sid) != leader[2]:
                    continue  # the session id now belongs to a process we never saw
                targets.update((pid, st[2]) for pid, st in table.items() if st[1] == sid and st[2] >= sup[1])
            if rec.get("token"):  # whatever inherited the tree's token, wherever it went
                targets.update((pid, table[pid][2]) for pid in _carrying(TREE_ENV, rec["token"], table)
                               if table[pid][2] >= sup[1])
            for pid in list(targets):
                targets.update((d, st[2]) for d, st in _descendants(pid, table).items())
            targets.pop(os.getpid(), None)
            if not targets:
                break
            for pid, ticks in targets.items():
                _signal(pid, ticks, signal.SIGKILL)
            killed += len(targets)
            time.sleep(0.02)
        try:
            path.unlink()
        except OSError:
            pass
    return killed


class Supervised:
    """One command run under its own supervisor process (see the module docstring).

    ``argv`` runs with exactly ``env`` in ``cwd``, stdout and stderr to ``stdout``
    (a file opened for writing), stdin from /dev/null, in a process group of its own in the
    harness's session (the module docstring says why).
    ``timeout_s``: the supervisor kills the tree when it passes (:attr:`timed_out`).
    ``grace_s``: SIGTERM to SIGKILL when the supervisor stops the tree by itself
    (timeout, harness death, the command's exit); :meth:`stop` takes its own.
    ``record``: the record file's folder (None: :func:`registry_dir`; False: none).
    """

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | str, stdout: IO[bytes] | int,
                 timeout_s: float | None = None, grace_s: float = 5.0, record: Path | bool | None = None,
                 log_cap: tuple[int, int] | None = (LOG_HEAD_BYTES, LOG_TAIL_BYTES)):
        if not argv:
            raise ValueError("argv is empty: nothing to run")
        self.argv = [str(a) for a in argv]
        self.env = {str(k): str(v) for k, v in env.items()}
        self.cwd = str(cwd)
        self.stdout = stdout
        self.timeout_s = timeout_s
        self.grace_s = float(grace_s)
        self.record_dir = None if record is False else (registry_dir() if record in (None, True) else Path(record))
        self.pid: int | None = None
        self.supervisor: subprocess.Popen | None = None
        self._token: str | None = None
        self.timed_out = False
        self.left_alive: int | None = None
        self._rc: int | None = None
        self._exited = False
        self._status_fd: int | None = None
        self._buf = b""
        self._eof = False
        # the log's cap, (head, tail) bytes: None, the output goes to ``stdout`` uncut
        self.log_cap = log_cap
        self.log_bytes: int | None = None    # what the command wrote, once it is over (capped logs)
        self.log_dropped: int | None = None  # of it, bytes dropped from the log's middle
        # the log could not be written (capped logs): (bytes lost, the first refused write,
        # e.g. "ENOSPC: No space left on device"), and the newest output from the supervisor's memory
        self.log_unwritten: tuple[int, str] | None = None
        self.log_memory_tail: bytes | None = None

    @property
    def supervisor_pid(self) -> int | None:
        return self.supervisor.pid if self.supervisor is not None else None

    def start(self) -> "Supervised":
        """Start the supervisor and the command; raise :class:`LaunchError` when it cannot start."""
        if self.record_dir is not None:
            reap_leftovers(self.record_dir)  # "at the next start": what a dead harness left
        r, w = os.pipe()
        try:
            self.supervisor = subprocess.Popen(
                [sys.executable, "-I", _SCRIPT, "--harness", str(os.getpid()), "--status-fd", str(w)],
                env=self.env, cwd=self.cwd, stdin=subprocess.PIPE, stdout=self.stdout, stderr=subprocess.STDOUT,
                pass_fds=(w,), close_fds=True, **(OWN_GROUP if sys.version_info >= (3, 11) else {}))
        except OSError as exc:
            os.close(r)
            raise LaunchError(exc.errno, f"cannot start in {self.cwd}: {exc.strerror or exc}") from exc
        finally:
            os.close(w)
        self._status_fd = r
        os.set_blocking(r, False)
        st = _stat(self.supervisor.pid)
        # the token the supervisor gives its tree (its pid and start time): what finds a process
        # that left the tree while the supervisor died, as the leftovers' reaper finds it
        self._token = f"{self.supervisor.pid}-{st[2]}" if st is not None else None
        record = None
        if self.record_dir is not None:
            record = str(self.record_dir / f"{self.supervisor.pid}.json")
        request = {"argv": self.argv, "env": self.env, "grace_s": self.grace_s, "timeout_s": self.timeout_s,
                   "record": record, "log_cap": list(self.log_cap) if self.log_cap else None}
        try:
            self.supervisor.stdin.write(json.dumps(request).encode() + b"\n")
            self.supervisor.stdin.flush()
        except OSError:
            pass  # it died at once; reported below
        deadline = time.monotonic() + 60.0
        while self.pid is None:
            line = self._next_line(max(0.0, deadline - time.monotonic()))
            if line is None:
                self._give_up()
                raise LaunchError(errno.ECHILD, f"the supervisor for {self.argv[0]!r} did not start "
                                                f"(exit {self.supervisor.poll()})")
            if line.startswith("error "):
                _, code, text = (line.split(" ", 2) + [""])[:3]
                self.supervisor.wait(timeout=10)
                self._close()
                raise LaunchError(int(code) or errno.ENOENT, f"cannot run {self.argv[0]!r}: {text}")
            self._handle(line)
        return self

    # ------------------------------------------------------------- status

    def _next_line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            if self._eof:
                return None
            left = max(0.0, deadline - time.monotonic())
            if not select.select([self._status_fd], [], [], left)[0]:
                return None
            try:
                chunk = os.read(self._status_fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                self._eof = True
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode(errors="replace")

    def _handle(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "pid":
            self.pid = int(rest)
        elif word == "exit":
            self._rc, self._exited = int(rest), True
        elif word == "timeout":
            self.timed_out = True
        elif word == "done":
            self.left_alive = int(rest)
        elif word == "log":
            self.log_bytes, self.log_dropped = (int(x) for x in rest.split())
        elif word == "logerr":
            n, _, why = rest.partition(" ")
            self.log_unwritten = (int(n), why)
        elif word == "logtail":
            self.log_memory_tail = base64.b64decode(rest)

    def _pump(self) -> None:
        if self._status_fd is None:
            return
        while (line := self._next_line(0.0)) is not None:
            self._handle(line)

    def poll(self) -> int | None:
        """The command's exit code once it has ended (and its tree is being or was stopped), else None.

        If the supervisor itself was killed, its own code stands in (negative: a signal)."""
        self._pump()
        if self._exited:
            return self._rc
        if self.supervisor is not None and self.supervisor.poll() is not None:
            self._pump()
            if self._exited:
                return self._rc
            return self.supervisor.returncode
        return None

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the supervisor to end (the command and its whole tree gone) and return
        the command's exit code; None when it was killed at its timeout."""
        try:
            self.supervisor.wait(timeout=timeout)
        finally:
            self._pump()
        self._close()
        return None if self.timed_out else self.poll()

    # ------------------------------------------------------------- stop

    def stop(self, grace_s: float = 10.0) -> None:
        """Kill the whole tree (SIGTERM, then SIGKILL after ``grace_s``) and wait for it. Idempotent."""
        sup = self.supervisor
        if sup is None:
            return
        if sup.poll() is None:
            try:
                sup.stdin.write(f"stop {grace_s}\n".encode())
                sup.stdin.flush()
            except OSError:
                pass
            try:
                sup.wait(timeout=grace_s + _KILL_WAIT_S + 5.0)
            except subprocess.TimeoutExpired:
                pass
        self._pump()
        if sup.poll() is None or self.left_alive is None:
            self._give_up()  # the supervisor hung or was killed: kill what we can see of its tree
        self._close()

    def _give_up(self) -> None:
        sup = self.supervisor
        sup_st = _stat(sup.pid)
        table = _table()
        targets = {}
        if sup_st is not None and sup.poll() is None:
            targets.update({pid: st[2] for pid, st in _descendants(sup.pid, table).items()})
            targets[sup.pid] = sup_st[2]
        if self.pid is not None:  # its session, where the command started one itself (setsid)
            targets.update({pid: st[2] for pid, st in table.items() if st[1] == self.pid})
        if self._token is not None:  # whatever carries the tree's token, wherever it went
            targets.update({pid: table[pid][2] for pid in _carrying(TREE_ENV, self._token, table)})
        for pid in list(targets):
            targets.update({d: st[2] for d, st in _descendants(pid, table).items()})
        for pid, ticks in targets.items():
            _signal(pid, ticks, signal.SIGKILL)
        try:
            sup.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def _close(self) -> None:
        if self.supervisor is not None and self.supervisor.stdin is not None and self.supervisor.poll() is not None:
            try:
                self.supervisor.stdin.close()
            except OSError:
                pass
        if self._status_fd is not None and self.supervisor is not None and self.supervisor.poll() is not None:
            self._pump()
            os.close(self._status_fd)
            self._status_fd = None


def supervisors_of(harness_pid: int) -> list[int]:
    """Supervisor processes started by the harness with pid ``harness_pid`` that still run."""
    out = []
    for pid, st in _table().items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if _SCRIPT.encode() in cmd and b"--harness" in cmd:
            i = cmd.index(b"--harness")
            if len(cmd) > i + 1 and cmd[i + 1] == str(harness_pid).encode():
                out.append(pid)
    return out


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | str, stdout: IO[bytes] | int,
        timeout_s: float | None, grace_s: float = 5.0, record: Path | bool | None = None) -> int | None:
    """Run ``argv`` supervised to its end; return its exit code, or None when it ran past
    ``timeout_s``. Its whole tree is gone on return, on any exception too (Ctrl-C included)."""
    job = Supervised(argv, env=env, cwd=cwd, stdout=stdout, timeout_s=timeout_s, grace_s=grace_s,
                     record=record).start()
    try:
        return job.wait()
    finally:
        job.stop(grace_s)
