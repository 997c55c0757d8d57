"""A supervisor process that owns every descendant of one command (a server boot, a build).

The harness is threaded, so it never runs Python code between ``fork`` and
``exec``: it starts this module as a separate, single-threaded process::

    python -I .../bisect_harness/supervisor.py --harness PID --status-fd FD

with the command's exact environment, its working folder and its log as
stdout/stderr, in a session of its own. The harness writes one JSON line to the
supervisor's stdin (argv, env, timeout, grace, record file) and keeps the pipe open.
The supervisor then

- makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux), so a
  worker that double-forks or calls ``setsid`` is reparented to it, not to init,
  and stays its descendant;
- starts the command in a session of its own and sends its pid back on the
  status pipe (``pid N``), then its exit code (``exit RC``) when it ends;
- kills its whole tree -- every descendant, listed again and again from
  ``/proc`` until none is left: SIGTERM to the command alone for half the grace
  (a server stops its own workers), then to every descendant left, SIGKILL after
  the grace -- when the
  harness writes ``stop GRACE``, when the timeout passes, when the harness dies
  (its stdin reaches end-of-file, or the harness's pidfd says it exited: any
  signal, SIGKILL included), when the supervisor itself gets SIGTERM, SIGINT or
  SIGHUP, and when the command exits (whatever it left running is killed too);
- keeps a record file (pid and start time of the harness, itself, every
  descendant, and their session ids) so that, if the supervisor dies as well,
  the next start of a harness kills the leftovers (:func:`reap_leftovers`).

:class:`Supervised` is the harness's side. Without a cgroup, a process that
double-forks *and* leaves its session within the last tenth of a second before
the supervisor itself is SIGKILLed can escape the record; everything else is
found.

Example::

    with open(log_path, "ab") as log:
        job = Supervised(["make", "-j8"], env=env, cwd=tree, stdout=log, timeout_s=3600).start()
        rc = job.wait()          # None: it ran past its timeout, and its tree is gone
"""

from __future__ import annotations

import collections
import ctypes
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

__all__ = ["LaunchError", "Supervised", "reap_leftovers", "registry_dir", "supervisors_of"]

_PR_SET_CHILD_SUBREAPER = 36
_SCRIPT = str(Path(__file__).resolve())
#: How often the supervisor lists its tree for the record: often at first (engines
#: spawn their workers while they start), then rarely (each listing reads /proc).
_SCAN_FAST_S, _SCAN_SLOW_S, _FAST_PERIOD_S = 0.1, 0.5, 10.0
#: After SIGKILL, how long to wait for processes stuck in the kernel before giving up.
_KILL_WAIT_S = 10.0


class LaunchError(OSError):
    """The command could not be started (not found, not executable, bad cwd)."""


# --------------------------------------------------------------------------- /proc


_PROC = os.path.isdir("/proc/self")


#: The state :func:`_stat` gives a process whose leader thread is a zombie while others still run.
ZOMBIE_LEADER = "Z+threads"


def _stat(pid: int | str) -> tuple[int, int, float, str] | None:
    """(ppid, session id, start time, state) of ``pid``, or None when it is gone. The start
    time is in clock ticks since boot where /proc exists (exact), else psutil's create time."""
    if not _PROC:
        return _stat_psutil(int(pid))
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2:].split()
    state = rest[0].decode()
    if state == "Z" and int(rest[17]) > 1:
        # The leader thread has exited and other threads still run (a process ending
        # with many threads, or a main thread that called pthread_exit): not reapable
        # yet, and alive; a signal to its pid still reaches the rest of the group.
        state = ZOMBIE_LEADER
    return int(rest[1]), int(rest[3]), int(rest[19]), state


def _stat_psutil(pid: int) -> tuple[int, int, float, str] | None:  # macOS and other systems without /proc
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            zombie = proc.status() == psutil.STATUS_ZOMBIE
            return proc.ppid(), os.getsid(pid), proc.create_time(), "Z" if zombie else "R"
    except (psutil.Error, OSError):
        return None


def _table() -> dict[int, tuple[int, int, float, str]]:
    """Every live process (zombies excluded): pid -> (ppid, sid, start time, state)."""
    if _PROC:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
    else:
        import psutil

        names = psutil.pids()
    out = {}
    for name in names:
        st = _stat(name)
        if st is not None and st[3] not in ("Z", "X", "x"):
            out[int(name)] = st
    return out


#: The variable every supervised command (and all it starts) carries: its supervisor's token.
TREE_ENV = "BISECT_HARNESS_TREE"


def _carrying(name: str, value: str, table: Mapping[int, tuple[int, int, float, str]]) -> list[int]:
    """Processes whose environment holds ``name=value`` (those we may read)."""
    needle = f"{name}={value}".encode()
    out = []
    for pid in table:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(pid)
        except OSError:
            continue
    return out


def _descendants(root: int, table: Mapping[int, tuple[int, int, float, str]]) -> dict[int, tuple[int, int, float, str]]:
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st[0], []).append(pid)
    out, frontier = {}, [root]
    while frontier:
        for pid in children.get(frontier.pop(), ()):
            if pid not in out:
                out[pid] = table[pid]
                frontier.append(pid)
    return out


def _alive(pid: int, ticks: float) -> bool:
    st = _stat(pid)
    return st is not None and st[2] == ticks and st[3] not in ("Z", "X", "x")


def _signal(pid: int, ticks: float, sig: int) -> None:
    """Signal ``pid`` only if it is still the process that started at ``ticks`` (a pidfd
    pins the process between the check and the signal, so a recycled pid is never hit)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError) as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ESRCH:
            return
        if _alive(pid, ticks):  # no pidfds (an old kernel, not Linux): check, then signal
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        return
    try:
        if _alive(pid, ticks):
            signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- records


def registry_dir() -> Path:
    """Where supervisors record their trees: ``supervised/`` in the harness's cache folder."""
    from bisect_harness.places import default_cache_dir  # late: this file also runs as a script (-I), without the package

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


class _Record:
    def __init__(self, path: str | None, harness: tuple[int, int], me: tuple[int, int], token: str | None = None):
        self.path = Path(path) if path else None
        self.head = {"version": 1, "harness": list(harness), "supervisor": list(me), "token": token}
        self.last: frozenset | None = None

    def update(self, tree: Mapping[int, tuple[int, int, float, str]]) -> None:
        if self.path is None:
            return
        now = frozenset((pid, st[2], st[1]) for pid, st in tree.items())
        if now == self.last or (self.last is not None and now <= self.last):
            return  # only new processes need recording; the dead ones cost nothing to keep
        self.last = now if self.last is None else self.last | now
        body = dict(self.head, processes=sorted([p, t] for p, t, _ in self.last),
                    sessions=sorted({s for _, _, s in self.last}))
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(body))
            os.replace(tmp, self.path)
        except OSError:
            pass

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.unlink()
            except OSError:
                pass


# --------------------------------------------------------------------------- the supervisor process


def _set_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class _Status:
    def __init__(self, fd: int):
        self.fd = fd

    def send(self, line: str) -> None:
        try:
            os.write(self.fd, (line + "\n").encode())
        except OSError:
            pass  # the harness is gone; the tree is killed all the same


def _decode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _reap(main_pid: int) -> int | None:
    """Collect every exited child (reparented orphans too); the command's exit code if it ended."""
    rc = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return rc
        if pid == 0:
            return rc
        if pid == main_pid:
            rc = _decode(status)


def _kill_tree(grace_s: float, wake_fd: int, main_pid: int) -> tuple[int, int | None]:
    """Stop the tree in the order a server expects: SIGTERM the command alone and give
    it half the grace to stop its own workers (a server that sees a worker die before
    its own SIGTERM arrives reports a crash and exits 1: the race every tree-wide
    SIGTERM runs); then SIGTERM every descendant left, SIGKILL what is left at the end
    of ``grace_s``, list again until none is left. Returns (processes still alive when
    it gave up, the command's exit code)."""
    me = os.getpid()
    start = time.monotonic()
    deadline, leader_until = start + grace_s, start + grace_s / 2
    termed: set[tuple[int, int]] = set()
    killing_since = None
    rc = None
    while True:
        got = _reap(main_pid)
        rc = got if got is not None else rc
        tree = _descendants(me, _table())
        if not tree:  # the command may have ended after the reap above: a zombie, not listed
            got = _reap(main_pid)
            return 0, got if got is not None else rc
        now = time.monotonic()
        if now < deadline:
            leader_only = rc is None and now < leader_until and main_pid in tree
            for pid, st in tree.items():
                if (pid, st[2]) not in termed and (not leader_only or pid == main_pid):
                    _signal(pid, st[2], signal.SIGTERM)
                    termed.add((pid, st[2]))
        else:
            killing_since = killing_since or now
            if now - killing_since > _KILL_WAIT_S:
                return len(tree), rc
            for pid, st in tree.items():
                _signal(pid, st[2], signal.SIGKILL)
        select.select([wake_fd], [], [], 0.02)
        _drain(wake_fd)


def _is_file(fd: int) -> bool:
    import stat

    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def _read_request(fd: int, timeout_s: float) -> tuple[dict | None, bytes]:
    """The JSON line the harness sends first, and what came after it (a ``stop`` already)."""
    buf = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None, b""
        chunk = os.read(fd, 65536)
        if not chunk:
            return None, b""
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    try:
        return json.loads(line), rest
    except ValueError:
        return None, b""  # "stop" before any request: the harness changed its mind


#: A command's output kept in its log: the first LOG_HEAD_BYTES and the last
#: LOG_TAIL_BYTES, what came between them dropped and counted. An engine's whole
#: boot log fits by far; a server that floods stdout cannot fill the disk.
LOG_HEAD_BYTES = 32 << 20  # model.Limits' defaults (this file runs alone, importing nothing of the package)
LOG_TAIL_BYTES = 32 << 20
_LOG_REWRITE_S = 1.0
_F_SETPIPE_SZ = 1031


class _CappedLog:
    """The supervisor's writer of the command's output into the log (its own fd 1).

    The head is written as it comes. Past it, the newest ``tail`` bytes are kept in
    memory and written after a marker line, the file cut back to the marker first,
    at most once a second and at the end: the log stays readable while the command
    runs (about a second behind once capped), and never holds more than head +
    marker + tail."""

    def __init__(self, fd: int, head: int, tail: int):
        self.fd, self.head, self.tail = fd, head, tail
        try:
            self.start = os.lseek(fd, 0, os.SEEK_END)  # the log may hold lines written before this command
        except OSError:
            self.start = 0
        self.total = 0         # bytes of output the command wrote
        self.dropped = 0       # of them, those neither in the head nor in the tail
        self.ring: collections.deque[bytes] = collections.deque()  # the newest output, at most ``tail`` bytes
        self.ring_bytes = 0
        self.mark_at: int | None = None
        self.dirty = False
        self.rewritten = 0.0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        if self.mark_at is None:
            room = self.head - (self.total - len(data))
            if len(data) <= room:
                self._raw(data)
                return
            self._raw(data[:room])
            self.mark_at = self.start + self.head
            data = data[room:]
        self.ring.append(data)
        self.ring_bytes += len(data)
        while self.ring_bytes > self.tail:  # drop from the oldest end, a chunk (or part of one) at a time
            over = self.ring_bytes - self.tail
            first = self.ring[0]
            if len(first) <= over:
                self.ring.popleft()
                cut = len(first)
            else:
                self.ring[0] = first[over:]
                cut = over
            self.ring_bytes -= cut
            self.dropped += cut
        self.dirty = True

    def _raw(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except OSError:  # a full disk: the output is lost, the command is not held up
                return

    def flush(self, now: float | None = None) -> None:
        """Write the tail after the marker (no more than once a second unless ``now`` is None)."""
        if not self.dirty or self.mark_at is None:
            return
        if now is not None and now - self.rewritten < _LOG_REWRITE_S:
            return
        try:
            os.ftruncate(self.fd, self.mark_at)
        except OSError:
            return
        self._raw((f"\n[bisect-harness supervisor] log capped: the first {self.head:,} bytes of the output are "
                   f"above, the last {self.ring_bytes:,} below; {self.dropped:,} bytes between them were "
                   f"dropped\n").encode())
        for chunk in self.ring:
            self._raw(chunk)
        self.dirty, self.rewritten = False, time.monotonic()


def _read_output(fd: int, log: _CappedLog, most: int = 8 << 20) -> bool:
    """Move what the command wrote into the log (up to ``most`` bytes a call). False at
    end-of-file: every process holding the pipe has closed it."""
    moved = 0
    while moved < most:
        try:
            chunk = os.read(fd, 1 << 20)
        except (BlockingIOError, InterruptedError):
            return True
        if not chunk:
            return False
        log.write(chunk)
        moved += len(chunk)
    return True


def main(args: Sequence[str]) -> int:
    harness_pid = int(args[args.index("--harness") + 1])
    status = _Status(int(args[args.index("--status-fd") + 1]))
    harness_st = _stat(harness_pid)
    try:
        harness_fd = os.pidfd_open(harness_pid)
    except (OSError, AttributeError):
        harness_fd = None  # end-of-file on stdin still says the harness is gone
    if os.getppid() != harness_pid or harness_st is None:
        return 0  # the harness died before we could watch it; nothing was started
    _set_subreaper()
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    asked: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, f: asked.append(s))
    signal.signal(signal.SIGCHLD, lambda s, f: None)  # wakes the select below

    ctl = sys.stdin.fileno()
    request, pending = _read_request(ctl, 60.0)
    if request is None:
        return 0
    argv, grace_s, timeout_s = request["argv"], float(request["grace_s"]), request.get("timeout_s")
    me = os.getpid()
    token = f"{me}-{_stat(me)[2]}"
    record = _Record(request.get("record"), (harness_pid, harness_st[2]), (me, _stat(me)[2]), token)
    record.update({})
    try:
        # The environment comes in the request: this interpreter may have changed its own
        # (PEP 538 sets LC_CTYPE under the C locale), and the command gets exactly the caller's,
        # plus this tree's token: inherited through double forks and new sessions, it lets the
        # next start find what escaped the record (a fork in the last moment before a SIGKILL).
        env = dict(request["env"], **{TREE_ENV: token})
        cap = request.get("log_cap")
        out_r = out_w = None
        if cap is not None and _is_file(1):  # a log file: the command writes into a pipe we read
            out_r, out_w = os.pipe()
            try:
                import fcntl
                fcntl.fcntl(out_w, _F_SETPIPE_SZ, 1 << 20)  # room for bursts while the tree is listed
            except (OSError, ImportError):
                pass
        log = _CappedLog(1, int(cap[0]), int(cap[1])) if out_r is not None else None
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                 close_fds=True, stdout=out_w, stderr=out_w)
        if out_w is not None:
            os.close(out_w)
            os.set_blocking(out_r, False)
    except OSError as exc:
        status.send(f"error {exc.errno or 0} {exc.strerror or exc}")
        record.remove()
        return 127

    def note(text: str) -> None:  # the supervisor's own lines go where the output goes
        if log is not None:
            log.write(text.encode())
        else:
            sys.stderr.write(text)
            sys.stderr.flush()

    status.send(f"pid {child.pid}")
    started = time.monotonic()
    deadline = started + float(timeout_s) if timeout_s is not None else None
    rc = None
    reason = None
    next_scan = 0.0
    while reason is None:
        now = time.monotonic()
        if now >= next_scan:
            record.update(_descendants(me, _table()))
            next_scan = now + (_SCAN_FAST_S if now - started < _FAST_PERIOD_S else _SCAN_SLOW_S)
        wait = max(0.0, next_scan - now)
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - now))
        if pending:
            wait = 0.0
        fds = [ctl, wake_r] + ([harness_fd] if harness_fd is not None else []) + ([out_r] if out_r is not None else [])
        if log is not None and log.dirty:
            wait = min(wait, _LOG_REWRITE_S)
        ready = select.select(fds, [], [], wait)[0]
        _drain(wake_r)
        if out_r is not None and out_r in ready and not _read_output(out_r, log):
            os.close(out_r)
            out_r = None
        if log is not None:
            log.flush(time.monotonic())
        got = _reap(child.pid)
        if got is not None:
            rc = got
            status.send(f"exit {rc}")
            reason = "exited"
        if ctl in ready or pending:
            data, pending = pending or os.read(ctl, 256), b""
            if data.startswith(b"stop"):
                reason = "stop"
                try:
                    grace_s = float(data.split()[1])
                except (IndexError, ValueError):
                    pass
            elif not data:
                reason = "harness gone"
        if harness_fd is not None and harness_fd in ready:
            reason = "harness gone"
        if asked:
            reason = reason or f"signal {asked[0]}"
        if reason is None and deadline is not None and time.monotonic() >= deadline:
            reason = "timeout"
            status.send("timeout")
    child.returncode = rc if rc is not None else 0  # reaped by us, not by Popen
    if reason in ("exited",):
        left_behind = _descendants(me, _table())
        if left_behind:
            note(f"[bisect-harness supervisor] the command exited ({rc}); stopping "
                 f"{len(left_behind)} process(es) it left running\n")
    elif reason not in ("stop",):
        note(f"[bisect-harness supervisor] {reason}: stopping the command's process tree\n")
    left, got = _kill_tree(grace_s, wake_r, child.pid)
    if rc is None and got is not None:
        rc = got
        status.send(f"exit {rc}")
    if log is not None:
        if out_r is not None:  # what the tree wrote before it was gone (the pipe's writers are)
            while _read_output(out_r, log):
                if not select.select([out_r], [], [], 0.2)[0]:
                    break
            os.close(out_r)
        log.flush()
        status.send(f"log {log.total} {log.dropped}")
    status.send(f"done {left}")
    if left == 0:
        record.remove()
    if rc is None:
        return 125
    return rc if rc >= 0 else 128 - rc


# --------------------------------------------------------------------------- the harness's side


class Supervised:
    """One command run under its own supervisor process (see the module docstring).

    ``argv`` runs with exactly ``env`` in ``cwd``, stdout and stderr to ``stdout``
    (a file opened for writing), stdin from /dev/null, in a session of its own.
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
                pass_fds=(w,), start_new_session=True, close_fds=True)
        except OSError as exc:
            os.close(r)
            raise LaunchError(exc.errno, f"cannot start in {self.cwd}: {exc.strerror or exc}") from exc
        finally:
            os.close(w)
        self._status_fd = r
        os.set_blocking(r, False)
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
        if self.pid is not None:  # its session: the command started one (the supervisor's start_new_session)
            targets.update({pid: st[2] for pid, st in table.items() if st[1] == self.pid})
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
