"""The process table, read from ``/proc`` and signalled without hitting a recycled pid.

Both sides of :mod:`bisect_harness.process.supervisor` use it: the supervisor
process, which lists its tree again and again while it stops it, and the
harness (:mod:`bisect_harness.process.supervised`), which kills what a dead
supervisor left. A process is named by its pid *and* its start time (clock
ticks since boot), so a pid reused by another process is never taken for it.
Where there is no ``/proc`` (macOS), psutil stands in.

This module imports nothing of the package: the supervisor process runs
without it (``python -I``), importing this file from its own folder.
"""

from __future__ import annotations

import errno
import os
import signal
from typing import Mapping


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
