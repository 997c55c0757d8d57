"""Which harness process owns a "running" row, and whether it is still alive.

A run killed with SIGKILL (or a machine that lost power) cannot record its own
end: its run row and its boot rows would say ``running`` forever. Each run
records the process that owns it (pid, host name and the process's start
time, in ``runs.host["harness_process"]``); the next open of the ledger marks
``interrupted`` those rows whose owner is gone (``Ledger`` asks :func:`owner_gone`), or
whose run lock was left behind free (``runlock.left_free``, which sees a holder
on another host go too). Any other row owned by a live process, by a process
on another host, or with no owner recorded is left alone: only a process we
can see to be gone is declared so.
"""

from __future__ import annotations

import os
import socket

import psutil

OWNER_KEY = "harness_process"
STALE_REASON = "the harness process that ran it (pid {pid} on {hostname}) is gone; found on a later open"
#: A run whose lock was left behind free (``runlock``): its holder went without recording the end.
LEFT_REASON = ("the harness that ran it (pid {pid} on {hostname}) let go of it without recording its end "
               "(killed, or the ledger refused the write); found on a later open")


def owner_record() -> dict:
    """This process, as a run's owner."""
    pid = os.getpid()
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = None
    return {"pid": pid, "hostname": socket.gethostname(), "create_time": started}


def owner_gone(owner: dict | None) -> bool:
    """True only when ``owner`` names a process of this host that no longer runs
    (a reused pid is told apart by its start time)."""
    if not isinstance(owner, dict) or owner.get("hostname") != socket.gethostname():
        return False
    try:
        pid = int(owner["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return True
        started = owner.get("create_time")
        return started is not None and abs(proc.create_time() - float(started)) > 1.0
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
