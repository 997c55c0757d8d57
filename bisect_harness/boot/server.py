"""Start an inference server, wait until it is ready, and always take it down.

Every process we start is owned, whatever happens to the harness:

- the server runs in a process group (and session) of its own, with stdout and
  stderr in one log file per boot;
- :meth:`ServerProcess.stop` SIGTERMs the whole group, waits, SIGKILLs it, and
  also kills descendants that left the group with ``setsid`` (collected before
  any signal is sent, and at every readiness poll);
- a ``with`` block stops the server on any exception;
- SIGINT and SIGTERM to the harness stop every live server first (handlers are
  installed on the first start from the main thread, see
  :func:`install_signal_handlers`); Ctrl-C still raises ``KeyboardInterrupt``;
- SIGKILL of the harness: a watchdog process (``bisect_harness._reaper``, in a
  session of its own) notices that the harness is gone and kills the group; on
  Linux the leader also gets ``PR_SET_PDEATHSIG`` so it receives SIGTERM the
  moment its parent dies.

Example::

    port = free_port()
    with ServerProcess([sys.executable, "-m", "engine", "--port", str(port)],
                       env=dict(os.environ), cwd=workdir, log_path=workdir / "boot.log",
                       base_url=f"http://127.0.0.1:{port}") as server:
        ...  # the server answers 200 on /health here
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Mapping, Sequence

import httpx
import psutil

from .. import _reaper
from ..input.engine_flags import ARGPARSE_EXIT, argparse_rejection
from ..errors import BootFailed, BootTimeout, FlagNotAccepted

__all__ = ["ServerProcess", "free_port", "install_signal_handlers", "live_servers", "stop_all"]

_PR_SET_PDEATHSIG = 1
_TAIL_BYTES = 256 * 1024


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now.

    The port is only free at the moment of the call; bind it soon.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- registry

_LIVE: dict[int, "ServerProcess"] = {}
_LIVE_LOCK = threading.RLock()
_HANDLERS_INSTALLED = False
_PREVIOUS_HANDLERS: dict[int, object] = {}


def live_servers() -> list["ServerProcess"]:
    """Servers started and not yet stopped, in start order."""
    with _LIVE_LOCK:
        return list(_LIVE.values())


def stop_all(grace_s: float = 10.0) -> None:
    """Stop every live server (used by the signal handlers and at interpreter exit)."""
    for server in reversed(live_servers()):
        server.stop(grace_s=grace_s)


def _on_signal(signum, frame) -> None:
    stop_all()
    previous = _PREVIOUS_HANDLERS.get(signum)
    if signum == signal.SIGINT:
        if callable(previous) and previous is not signal.default_int_handler:
            previous(signum, frame)
        raise KeyboardInterrupt
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # SIG_DFL for SIGTERM means "terminate": do so, but let finally blocks and
    # atexit handlers run on the way out.
    raise SystemExit(128 + signum)


def install_signal_handlers() -> bool:
    """Make SIGINT, SIGTERM and SIGHUP stop every live server before the harness goes on.

    SIGINT then raises ``KeyboardInterrupt``; SIGTERM (and SIGHUP, unless ignored) calls the handler that was
    there before, or raises ``SystemExit(143)`` where that was the default.
    Only the main thread can install handlers: returns False elsewhere (the
    watchdog process still covers that case). Idempotent.
    """
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a closed terminal ends a run as SIGTERM does
        if signum == signal.SIGHUP and signal.getsignal(signum) == signal.SIG_IGN:
            continue  # started under nohup: a closed terminal is meant to change nothing
        _PREVIOUS_HANDLERS[signum] = signal.getsignal(signum)
        signal.signal(signum, _on_signal)
    _HANDLERS_INSTALLED = True
    return True


atexit.register(stop_all)


# --------------------------------------------------------------------------- process

def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def _make_preexec(parent_pid: int):
    prctl = _PRCTL

    def preexec() -> None:  # runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(111)

    return preexec


class ServerProcess:
    """One boot of an inference server: a process group we start, watch and end.

    ``argv`` is run as a list (never through a shell) with exactly ``env`` (the
    caller builds the whole environment) in ``cwd``; stdout and stderr go to
    ``log_path`` (appended). :meth:`start` returns once ``base_url + health_path``
    answers HTTP 200; it raises :class:`BootFailed` when the process exits first
    (with its exit code and the log tail; :class:`FlagNotAccepted` when it exited 2
    with argparse's refusal of an option, the engine's message attached) and :class:`BootTimeout` when
    ``ready_timeout_s`` passes, and in both cases the process group is already
    gone. Used as a context manager it starts on entry and always stops on exit.
    Each readiness probe may take up to ``health_request_timeout_s`` (SGLang's
    ``/health_generate`` runs a generation), never past the deadline.
    """

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path,
                 log_path: Path, base_url: str, health_path: str = "/health",
                 ready_timeout_s: float = 120, poll_interval_s: float = 0.25,
                 health_request_timeout_s: float = 5.0):
        if not argv:
            raise ValueError("argv is empty: nothing to launch")
        self.argv = [str(a) for a in argv]
        self.env = {str(k): str(v) for k, v in env.items()}
        self.cwd = Path(cwd)
        self.log_path = Path(log_path)
        self.base_url = base_url.rstrip("/")
        self.health_path = health_path if health_path.startswith("/") else "/" + health_path
        self.ready_timeout_s = float(ready_timeout_s)
        self.poll_interval_s = float(poll_interval_s)
        if not health_request_timeout_s > 0:
            raise ValueError(f"health_request_timeout_s must be positive, got {health_request_timeout_s!r}")
        self.health_request_timeout_s = float(health_request_timeout_s)
        self._proc: subprocess.Popen | None = None
        self._pgid: int | None = None
        self._log: IO[bytes] | None = None
        self._reaper: subprocess.Popen | None = None
        self._known: dict[int, psutil.Process] = {}
        self._lock = threading.RLock()
        self._stopped = False
        self.ready_after_s: float | None = None

    # ---------------------------------------------------------------- properties

    @property
    def pid(self) -> int | None:
        """The leader's pid, or None before :meth:`start`."""
        return self._proc.pid if self._proc is not None else None

    @property
    def pgid(self) -> int | None:
        """The server's process group id (equal to the leader's pid)."""
        return self._pgid

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def __repr__(self) -> str:
        return f"ServerProcess(pid={self.pid}, base_url={self.base_url!r}, log={str(self.log_path)!r})"

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the boot log ("" when there is none)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - _TAIL_BYTES))
                data = f.read()
        except OSError:
            return ""
        text = data.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> "ServerProcess":
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "ServerProcess":
        """Launch the server and block until it is ready. See the class docstring."""
        with self._lock:
            if self._proc is not None:
                raise RuntimeError(f"{self!r} was already started; make a new ServerProcess per boot")
            install_signal_handlers()
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")
            # PR_SET_PDEATHSIG fires when the *thread* that forked exits, so only
            # use it from the main thread; the watchdog covers every other case.
            use_pdeathsig = _PRCTL is not None and threading.current_thread() is threading.main_thread()
            try:
                self._proc = subprocess.Popen(
                    self.argv, env=self.env, cwd=str(self.cwd),
                    stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                    start_new_session=True, close_fds=True,
                    preexec_fn=_make_preexec(os.getpid()) if use_pdeathsig else None)
            except OSError as e:
                self._log.close()
                self._stopped = True
                raise BootFailed(f"could not launch {self.argv[0]!r}: {e}. Check the launch command "
                                 f"and that cwd {self.cwd} exists.", log_path=str(self.log_path)) from e
            self._pgid = self._proc.pid  # start_new_session: the leader leads its group
            with _LIVE_LOCK:
                _LIVE[id(self)] = self
        try:
            self._start_reaper()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_reaper(self) -> None:
        me = psutil.Process()
        self._reaper = subprocess.Popen(
            [sys.executable, "-m", "bisect_harness._reaper", str(me.pid), repr(me.create_time()),
             str(self._pgid), str(self._proc.pid), "5"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True, env=_reaper_env())

    def _remember_descendants(self) -> None:
        try:
            leader = psutil.Process(self._proc.pid)
            self._known.setdefault(leader.pid, leader)
            for child in leader.children(recursive=True):
                self._known.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def _wait_ready(self) -> None:
        url = self.base_url + self.health_path
        started = time.monotonic()
        deadline = started + self.ready_timeout_s
        with httpx.Client(trust_env=False) as http:
            while True:
                self._remember_descendants()
                rc = self._proc.poll()
                if rc == ARGPARSE_EXIT:
                    self._log.flush()
                    refused = argparse_rejection(self.log_tail(200))
                    if refused:
                        raise FlagNotAccepted(
                            f"flag not accepted at this commit: {refused} (exit {rc} from the engine's "
                            f"argument parser; command: {' '.join(self.argv)}). Rename the flag for this "
                            f"commit (see `harness run --dry-run --check-flags`); log: {self.log_path}",
                            engine_message=refused, log_tail=self.log_tail(), log_path=str(self.log_path))
                if rc is not None:
                    raise BootFailed(
                        f"server exited with code {rc} before it was ready at {url} "
                        f"(command: {' '.join(self.argv)}); log: {self.log_path}\n"
                        f"--- last lines of the log ---\n{self.log_tail()}",
                        log_tail=self.log_tail(), log_path=str(self.log_path))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise BootTimeout(
                        f"server was not ready at {url} after {self.ready_timeout_s:g} s "
                        f"(command: {' '.join(self.argv)}); raise ready_timeout_s if it is "
                        f"just slow; log: {self.log_path}\n"
                        f"--- last lines of the log ---\n{self.log_tail()}",
                        log_tail=self.log_tail(), log_path=str(self.log_path))
                try:
                    r = http.get(url, timeout=max(0.05, min(self.health_request_timeout_s, remaining)))
                    if r.status_code == 200:
                        self.ready_after_s = time.monotonic() - started
                        self._remember_descendants()
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(max(0.0, min(self.poll_interval_s, deadline - time.monotonic())))

    def stop(self, grace_s: float = 10) -> None:
        """SIGTERM the group, wait up to ``grace_s``, SIGKILL what is left. Idempotent.

        Descendants that escaped the group (their own session) are collected
        before the first signal and killed the same way.
        """
        with self._lock:
            if self._stopped or self._proc is None:
                return
            self._remember_descendants()
            self._signal_all(signal.SIGTERM)
            if not self._wait_gone(grace_s):
                self._signal_all(signal.SIGKILL)
                self._wait_gone(5.0)
            try:
                self._proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            self._disarm_reaper()
            if self._log is not None:
                self._log.close()
            self._stopped = True
            with _LIVE_LOCK:
                _LIVE.pop(id(self), None)

    def _alive_known(self) -> list[psutil.Process]:
        return _reaper.alive(self._known)

    def _group_exists(self) -> bool:
        return _reaper.group_alive(self._pgid)

    def _signal_all(self, sig: int) -> None:
        if self._proc.poll() is None or self._group_exists():
            try:
                os.killpg(self._pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self._alive_known():
            try:
                proc.send_signal(sig)  # psutil checks the pid was not recycled
            except psutil.Error:
                pass

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self._proc.poll()  # reap the leader so it does not linger as a zombie
            if not self._group_exists() and not self._alive_known():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def _disarm_reaper(self) -> None:
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            disarm_reaper(reaper)


def disarm_reaper(reaper: subprocess.Popen) -> None:
    """Tell a watchdog (``_reaper``) that its group was stopped by us: it exits without killing."""
    try:
        reaper.stdin.write(b"q")
        reaper.stdin.close()
        reaper.wait(timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        reaper.kill()
        reaper.wait()


def _reaper_env() -> dict[str, str]:
    # The watchdog must import this package the way the harness did.
    env = dict(os.environ)
    import bisect_harness

    pkg_root = str(Path(bisect_harness.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
