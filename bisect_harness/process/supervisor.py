"""A supervisor process that owns every descendant of one command (a server boot, a build).

The harness is threaded, so it never runs Python code between ``fork`` and
``exec``: it starts this module as a separate, single-threaded process::

    python -I .../bisect_harness/process/supervisor.py --harness PID --status-fd FD

with the command's exact environment, its working folder and its log as
stdout/stderr, in a process group of its own in the harness's session (one
scheduling group with the harness's client: ``supervised`` says why). The harness
writes one JSON line to the supervisor's stdin (argv, env, timeout, grace, record
file) and keeps the pipe open. The supervisor then

- makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux), so a
  worker that double-forks or calls ``setsid`` is reparented to it, not to init,
  and stays its descendant;
- starts the command in a process group of its own (the harness's session still)
  and sends its pid back on the status pipe (``pid N``), then its exit code
  (``exit RC``) when it ends;
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
  the next start of a harness kills the leftovers
  (:func:`bisect_harness.process.supervised.reap_leftovers`).

The harness's side is :class:`bisect_harness.process.supervised.Supervised`.
Run as the supervisor process, this file imports nothing of the package, only
its two siblings (:mod:`~bisect_harness.process.proctree`,
:mod:`~bisect_harness.process.capped_log`), from its own folder.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

if __package__:  # imported by the harness's side
    from bisect_harness.process.capped_log import _LOG_REWRITE_S, _CappedLog, _read_output
    from bisect_harness.process.proctree import TREE_ENV, _descendants, _signal, _stat, _table
else:  # the supervisor process: ``python -I`` puts no folder on sys.path, and the package there may be
    # another copy or none; its siblings come from this file's own folder, as a plain script run would.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from capped_log import _LOG_REWRITE_S, _CappedLog, _read_output
    from proctree import TREE_ENV, _descendants, _signal, _stat, _table

_PR_SET_CHILD_SUBREAPER = 36
_SCRIPT = str(Path(__file__).resolve())
#: How often the supervisor lists its tree for the record: often at first (engines
#: spawn their workers while they start), then rarely (each listing reads /proc).
_SCAN_FAST_S, _SCAN_SLOW_S, _FAST_PERIOD_S = 0.1, 0.5, 10.0
#: After SIGKILL, how long to wait for processes stuck in the kernel before giving up.
_KILL_WAIT_S = 10.0


class _Record:
    """The supervisor's record file: the harness and the supervisor (pid, start time) and every
    process of the tree seen so far, with the sessions its processes made (never the harness's
    own, ``shared``, which the tree only sits in); what
    :func:`bisect_harness.process.supervised.reap_leftovers` reads after both are gone."""

    def __init__(self, path: str | None, harness: tuple[int, int], me: tuple[int, int], token: str | None = None,
                 shared: int | None = None):
        self.path = Path(path) if path else None
        self.head = {"version": 1, "harness": list(harness), "supervisor": list(me), "token": token}
        self.shared = shared
        self.last: frozenset | None = None

    def update(self, tree: Mapping[int, tuple[int, int, float, str]]) -> None:
        if self.path is None:
            return
        now = frozenset((pid, st[2], st[1]) for pid, st in tree.items())
        if now == self.last or (self.last is not None and now <= self.last):
            return  # only new processes need recording; the dead ones cost nothing to keep
        self.last = now if self.last is None else self.last | now
        body = dict(self.head, processes=sorted([p, t] for p, t, _ in self.last),
                    sessions=sorted({s for _, _, s in self.last} - {self.shared}))
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



_F_SETPIPE_SZ = 1031

#: Popen's arguments that start a process in a process group of its own, in its parent's
#: session (module docstring). Python 3.10 has no ``process_group``: ``setpgrp`` between fork
#: and exec, which only a single-threaded parent may run (the supervisor is one; the harness,
#: threaded, passes nothing there and the supervisor moves itself first thing, :func:`main`).
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


def main(args: Sequence[str]) -> int:
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)  # Python 3.10 started us in the harness's group (OWN_GROUP)
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
    record = _Record(request.get("record"), (harness_pid, harness_st[2]), (me, _stat(me)[2]), token,
                     shared=harness_st[1])
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
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, **OWN_GROUP,
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
        failure = log.failure()
        if failure:  # the log could not be written: why, and the newest output, from memory
            status.send(f"logerr {log.unwritten} {failure}")
            status.send("logtail " + base64.b64encode(log.memory_tail()).decode())
        status.send(f"log {log.total} {log.dropped}")
    status.send(f"done {left}")
    if left == 0:
        record.remove()
    if rc is None:
        return 125
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
