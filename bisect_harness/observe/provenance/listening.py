"""Which addresses does the launched server's process tree listen on?

The harness launches every server on 127.0.0.1. An engine that binds all
interfaces anyway (``0.0.0.0``, ``::``; a launch template with a fixed host, a
worker's side port, a metrics exporter) is reachable from the network while it is
measured: the boot says so (``provenance["listening"]``, mark
``listens_beyond_loopback``). The sockets are read from every process of the tree,
those that left the server's session included (they are the supervisor's
descendants).

    report = listening_report(server.supervisor_pid)
    report.beyond_loopback  # (ListeningSocket(pid=..., process="python", address="0.0.0.0", port=9100),)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import psutil

__all__ = ["ListeningReport", "ListeningSocket", "listening_report"]


@dataclass(frozen=True)
class ListeningSocket:
    pid: int
    process: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.address.split("%", 1)[0]).is_loopback
        except ValueError:
            return False

    def describe(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port} ({self.process}, pid {self.pid})"


@dataclass(frozen=True)
class ListeningReport:
    sockets: tuple[ListeningSocket, ...]
    unreadable: int = 0  # processes whose sockets could not be read (gone, or not ours)

    @property
    def beyond_loopback(self) -> tuple[ListeningSocket, ...]:
        return tuple(s for s in self.sockets if not s.loopback)

    def describe(self) -> str:
        wide = self.beyond_loopback
        if wide:
            return ("the server's tree listens beyond loopback, reachable from the network while it is measured: "
                    + ", ".join(s.describe() for s in wide))
        return f"the server's tree listens on loopback only ({len(self.sockets)} socket(s))"

    def to_dict(self) -> dict:
        return {"sockets": [{"pid": s.pid, "process": s.process, "address": s.address, "port": s.port}
                            for s in self.sockets],
                "beyond_loopback": [s.describe() for s in self.beyond_loopback],
                "unreadable_processes": self.unreadable}


def _connections(proc: psutil.Process):
    read = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6 has connections()
    return read(kind="inet")


def listening_report(root_pid: int, *, include_root: bool = False) -> ListeningReport:
    """The listening TCP sockets of ``root_pid``'s descendants (and of ``root_pid``
    itself with ``include_root``: the server's pid rather than its supervisor's)."""
    try:
        root = psutil.Process(root_pid)
        procs = ([root] if include_root else []) + root.children(recursive=True)
    except psutil.Error:
        return ListeningReport((), unreadable=1)
    found: dict[tuple[int, str, int], ListeningSocket] = {}
    unreadable = 0
    for proc in procs:
        try:
            name = proc.name()
            for c in _connections(proc):
                if c.status == psutil.CONN_LISTEN and c.laddr:
                    found.setdefault((proc.pid, c.laddr.ip, c.laddr.port),
                                     ListeningSocket(proc.pid, name, c.laddr.ip, c.laddr.port))
        except psutil.Error:
            unreadable += 1
    return ListeningReport(tuple(sorted(found.values(), key=lambda s: (s.pid, s.port, s.address))), unreadable)
