"""Watchdog that kills a server's process group when the harness dies.

Started by :class:`bisect_harness.boot.server.ServerProcess` in a session of its own::

    python -m bisect_harness._reaper HARNESS_PID HARNESS_CREATE_TIME PGID LEADER_PID GRACE_S

The harness holds the write end of this process's stdin. A normal shutdown
writes ``q`` and closes it: the reaper exits without touching anything. If the
harness disappears instead (SIGKILL, OOM killer, a crash in C code), stdin hits
end-of-file, or the harness pid stops matching its creation time; the reaper
then sends SIGTERM to the server's process group and to every descendant of the
leader it has seen (workers that called ``setsid`` leave the group, so they are
remembered while the leader is alive), waits ``GRACE_S`` seconds, and SIGKILLs
whatever is left.

It also exits by itself once the group and every remembered descendant are gone.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

import psutil

_POLL_S = 0.25
_REFRESH_S = 1.0


def _harness_alive(pid: int, create_time: float) -> bool:
    try:
        proc = psutil.Process(pid)
        # A recycled pid has a different creation time.
        return abs(proc.create_time() - create_time) < 0.5 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie.

    Members reparented to an init that never reaps stay zombies forever; they
    hold no resources and must not make a teardown wait.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            pass
    return False


def alive(procs: dict[int, psutil.Process]) -> list[psutil.Process]:
    """The processes of ``procs`` still running (zombies and recycled pids excluded)."""
    out = []
    for proc in procs.values():
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            pass
    return out


def _snapshot(leader: psutil.Process | None, known: dict[int, psutil.Process]) -> None:
    if leader is None:
        return
    try:
        if not leader.is_running():
            return
        for child in leader.children(recursive=True):
            known.setdefault(child.pid, child)
    except psutil.Error:
        pass


def kill_tree(pgid: int, known: dict[int, psutil.Process], grace_s: float) -> None:
    """SIGTERM the group and the known processes, wait, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for proc in alive(known):
            try:
                proc.send_signal(sig)  # psutil refuses a recycled pid
            except psutil.Error:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            if not group_alive(pgid) and not alive(known):
                return
            time.sleep(0.05)


def main(argv: list[str]) -> int:
    harness_pid, harness_ctime, pgid, leader_pid, grace_s = (
        int(argv[0]), float(argv[1]), int(argv[2]), int(argv[3]), float(argv[4]))
    # Ctrl-C in the harness's terminal must not take the watchdog down first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        leader: psutil.Process | None = psutil.Process(leader_pid)
    except psutil.Error:
        leader = None
    known: dict[int, psutil.Process] = {}
    if leader is not None:
        known[leader.pid] = leader
    stdin_fd = sys.stdin.fileno()
    next_refresh = 0.0
    while True:
        now = time.monotonic()
        if now >= next_refresh:
            _snapshot(leader, known)
            next_refresh = now + _REFRESH_S
            if not group_alive(pgid) and not alive(known):
                return 0
        ready, _, _ = select.select([stdin_fd], [], [], _POLL_S)
        if ready:
            data = os.read(stdin_fd, 64)
            if data.startswith(b"q"):
                return 0  # disarmed: the harness stopped the server itself
            if not data:
                break  # end-of-file: the harness is gone
        if not _harness_alive(harness_pid, harness_ctime):
            break
    _snapshot(leader, known)
    kill_tree(pgid, known, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
