"""Start an inference server, wait until it is ready, and always take it down.

Every process we start is owned, whatever happens to the harness:

- the server runs under a supervisor process (:mod:`bisect_harness.process.supervisor`,
  a child subreaper) in a process group of its own, with stdout and stderr in one log
  file per boot; workers that double-fork or call ``setsid`` stay the
  supervisor's descendants;
- :meth:`ServerProcess.stop` has the supervisor SIGTERM every descendant, wait,
  and SIGKILL what is left, listing the tree again until nothing remains;
- a ``with`` block stops the server on any exception;
- SIGINT, SIGTERM and SIGHUP to the harness stop every live server first (handlers
  are installed on the first start from the main thread, see
  :func:`install_signal_handlers`); Ctrl-C still raises ``KeyboardInterrupt``;
- SIGKILL of the harness: the supervisor sees its harness exit (a pidfd, and
  end-of-file on the pipe from it) and kills the tree itself;
- if the supervisor dies too, the next start of a harness on the same cache
  kills what its record lists (:func:`bisect_harness.process.supervised.reap_leftovers`).

Example::

    port = free_port()
    with ServerProcess([sys.executable, "-m", "engine", "--port", str(port)],
                       env=dict(os.environ), cwd=workdir, log_path=workdir / "boot.log",
                       base_url=f"http://127.0.0.1:{port}") as server:
        ...  # the server answers 200 on /health here
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO, Mapping, Sequence

import httpx

from bisect_harness.measure.apis import ReadyProbe
from bisect_harness.measure.deadline import deadline_client, total_deadline
from bisect_harness.engines.rejection import REJECTION_EXITS, argparse_rejection
from bisect_harness.errors import BootFailed, BootTimeout, FlagNotAccepted
from bisect_harness.process.ports import free_port
from bisect_harness.process.capped_log import LOG_HEAD_BYTES, LOG_TAIL_BYTES
from bisect_harness.process.supervised import LaunchError, Supervised

__all__ = ["ServerProcess", "free_port", "install_signal_handlers", "live_servers", "stop_all"]

_TAIL_BYTES = 256 * 1024
FIRST_POLLS_S, FIRST_POLLS_FOR_S = 0.05, 5.0  # readiness asked every 50 ms for the first 5 s


# --------------------------------------------------------------------------- registry

_LIVE: dict[int, "ServerProcess"] = {}
_LIVE_LOCK = threading.RLock()
_HANDLERS_INSTALLED = False
_PREVIOUS_HANDLERS: dict[int, object] = {}


def live_servers() -> list["ServerProcess"]:
    """Servers started and not yet stopped, in start order."""
    with _LIVE_LOCK:
        return list(_LIVE.values())


def stop_all(grace_s: float | None = None) -> None:
    """Stop every live server (used by the signal handlers and at interpreter exit);
    ``grace_s`` None: each server's own ``grace_s``."""
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
    supervisor still covers that case: it sees the harness exit). Idempotent.
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


class ServerProcess:
    """One boot of an inference server: a process group we start, watch and end.

    ``argv`` is run as a list (never through a shell) with exactly ``env`` (the
    caller builds the whole environment) in ``cwd``; stdout and stderr go to
    ``log_path`` (appended). :meth:`start` returns once ``base_url + health_path``
    answers HTTP 200; it raises :class:`BootFailed` when the process exits first
    (with its exit code and the log tail; :class:`FlagNotAccepted` when it exited 2
    with argparse's refusal of an option, or 1 with llama.cpp's, the engine's message attached) and :class:`BootTimeout` when
    ``ready_timeout_s`` passes, and in both cases the process group is already
    gone. Used as a context manager it starts on entry and always stops on exit.
    Each readiness probe may take up to ``health_request_timeout_s`` (SGLang's
    ``/health_generate`` runs a generation) in all, its body included however slowly
    it comes, never past the deadline.
    ``grace_s`` is SIGTERM to SIGKILL when stopping (``stop()`` without an argument,
    a signal to the harness, the harness's death). ``record`` is where the
    supervisor keeps its record for the next start (None: the cache's
    ``supervised/`` folder; False: none).
    """

    def __init__(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path,
                 log_path: Path, base_url: str, health_path: str = "/health",
                 ready_timeout_s: float = 120, poll_interval_s: float = 0.25,
                 health_request_timeout_s: float = 5.0, grace_s: float = 10.0,
                 record: Path | bool | None = None, ready_probe: ReadyProbe | None = None,
                 log_cap: tuple[int, int] | None = (LOG_HEAD_BYTES, LOG_TAIL_BYTES)):
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
        self.grace_s = float(grace_s)
        self._record = record
        self._proc: Supervised | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.RLock()
        self._stopped = False
        self.ready_after_s: float | None = None
        # the benchmark API's own probe, used where health_path answers 404 (no such route)
        self.ready_probe = ready_probe
        self.log_cap = log_cap  # (head, tail) bytes of the server's output kept in its log
        self.ready_by: str | None = None  # what said "ready": "GET /health", "POST /completion (one token)"

    # ---------------------------------------------------------------- properties

    @property
    def pid(self) -> int | None:
        """The server's own pid (the command we launched, the supervisor's child), or None
        before :meth:`start`; the root of the tree whose environments provenance reads."""
        return self._proc.pid if self._proc is not None else None

    @property
    def pgid(self) -> int | None:
        """The server's process group id (equal to its pid: it leads a process group of its own)."""
        return self.pid

    @property
    def supervisor_pid(self) -> int | None:
        """The supervisor process's pid (the server's parent), or None before :meth:`start`."""
        return self._proc.supervisor_pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    @property
    def log_output(self) -> tuple[int, int] | None:
        """Once stopped: (bytes the server tree wrote, of them bytes dropped from the
        middle of the capped log); None before, or where the log was not capped."""
        if self._proc is None or self._proc.log_bytes is None:
            return None
        return self._proc.log_bytes, self._proc.log_dropped

    @property
    def log_unwritten(self) -> str | None:
        """Once stopped, where the log could not be written (a full disk): how much of the
        server's output is missing from it and why; None when every write reached it."""
        lost = self._proc.log_unwritten if self._proc is not None else None
        if lost is None:
            return None
        return f"{lost[0]:,} bytes of the server's output could not be written to {self.log_path} ({lost[1]})"

    def __repr__(self) -> str:
        return f"ServerProcess(pid={self.pid}, base_url={self.base_url!r}, log={str(self.log_path)!r})"

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the boot log ("" when there is none); once stopped, where
        the log could not be written, the newest output the supervisor kept in memory."""
        kept = self._proc.log_memory_tail if self._proc is not None and self._proc.log_unwritten else None
        if kept is not None:
            return "\n".join(kept.decode("utf-8", errors="replace").splitlines()[-lines:])
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
            self._proc = Supervised(self.argv, env=self.env, cwd=self.cwd, stdout=self._log, log_cap=self.log_cap,
                                    grace_s=self.grace_s, record=self._record)
            with _LIVE_LOCK:  # before the supervisor exists: a signal from here on stops it
                _LIVE[id(self)] = self
        try:
            try:
                self._proc.start()
            except LaunchError as e:
                raise BootFailed(f"could not launch {self.argv[0]!r}: {e}. Check the launch command "
                                 f"and that cwd {self.cwd} exists.", log_path=str(self.log_path)) from e
            self._wait_ready()
        except BaseException as exc:
            self.stop()
            if isinstance(exc, BootFailed) and self.log_unwritten:  # the log's tail came from memory
                exc.log_tail, exc.log_unwritten = self.log_tail(), self.log_unwritten
            raise
        return self

    def _wait_ready(self) -> None:
        url = self.base_url + self.health_path
        probe: ReadyProbe | None = None  # the API's probe, once health_path answered 404
        last = "no answer"
        started = time.monotonic()
        deadline = started + self.ready_timeout_s
        with deadline_client() as http:
            while True:
                rc = self._proc.poll()
                if rc in REJECTION_EXITS:
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
                    route = (f"; GET {self.health_path} answered 404: the server has no such route, set "
                             f"engine.health to one it serves" if last == "HTTP 404" and probe is None else "")
                    raise BootTimeout(
                        f"server was not ready at {probe and self.base_url + probe.path or url} after "
                        f"{self.ready_timeout_s:g} s (last: {last}{route}; command: {' '.join(self.argv)}); "
                        f"raise ready_timeout_s if it is just slow; log: {self.log_path}\n"
                        f"--- last lines of the log ---\n{self.log_tail()}",
                        log_tail=self.log_tail(), log_path=str(self.log_path))
                timeout = max(0.05, min(self.health_request_timeout_s, remaining))
                try:
                    # a total for the probe, its body included: a per-read timeout restarts with every byte
                    with total_deadline(timeout):
                        r, by = self._probe(http, url, probe, timeout)
                    if r is None:  # the server is up and has no such route: the API's own probe from now
                        probe, last = self.ready_probe, "HTTP 404"
                        continue
                    last = f"HTTP {r.status_code}"
                    if r.status_code == 200:
                        self.ready_after_s = time.monotonic() - started
                        self.ready_by = by
                        return
                except httpx.HTTPError as exc:
                    last = type(exc).__name__ + (f" (no whole answer within {timeout:.1f} s)"
                                                 if isinstance(exc, httpx.TimeoutException) else "")
                # every 50 ms in the first seconds (a small server ready in 1.3 s is not left idle for
                # a quarter of a second), then every poll_interval_s (a large one loads for minutes)
                pause = min(self.poll_interval_s, FIRST_POLLS_S) if time.monotonic() - started < FIRST_POLLS_FOR_S \
                    else self.poll_interval_s
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))

    def _probe(self, http: httpx.Client, url: str, probe: ReadyProbe | None,
               timeout: float) -> tuple[httpx.Response | None, str]:
        """One readiness probe: the answer and what asked; (None, "") where health_path
        answered 404 and the API has a probe of its own."""
        if probe is None:
            r = http.get(url, timeout=timeout)
            if r.status_code == 404 and self.ready_probe is not None:
                return None, ""
            return r, f"GET {self.health_path}"
        # Connection: close: a probe's body is never left for the next request
        r = http.request(probe.method, self.base_url + probe.path, json=probe.body, timeout=timeout,
                         headers={"Connection": "close"})
        return r, f"{probe.describe()}, GET {self.health_path} answering 404"

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM every process of the server's tree, wait up to ``grace_s`` (None: the
        server's ``grace_s``), SIGKILL what is left. Idempotent.

        The supervisor lists its descendants again until none is left, so workers
        that double-forked or left the session with ``setsid`` go too.
        """
        with self._lock:
            if self._stopped or self._proc is None:
                return
            self._proc.stop(self.grace_s if grace_s is None else float(grace_s))
            if self._log is not None:
                self._log.close()
            self._stopped = True
            with _LIVE_LOCK:
                _LIVE.pop(id(self), None)
