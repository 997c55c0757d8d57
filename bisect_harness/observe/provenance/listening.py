"""Which addresses does the launched server's process tree listen on, and for whom?

The harness launches every server on 127.0.0.1. An engine that binds all
interfaces anyway (``0.0.0.0``, ``::``; a launch template with a fixed host, a
metrics exporter on a side port) is reachable from the network while it is
measured: the boot says so (``BootEvidence.listening``, mark
``listens_beyond_loopback``). The sockets are read from every process of the tree,
those that left the server's session included (they are the supervisor's
descendants).

Not every socket beyond loopback is a server's. The collective-communication
libraries (NCCL, gloo, torch's rendezvous store) open their own for their
bootstrap, on the host's own address unless told otherwise (``NCCL_SOCKET_IFNAME``,
``GLOO_SOCKET_IFNAME``): every multi-GPU engine does, on every boot. A socket beyond
loopback is told apart as the tree's own (:attr:`ListeningReport.collective`, a
fact of the boot, not the mark) when it is not a port the server serves (its HTTP
port) and

* another process of the tree, or the same one, holds a connection to it: a
  bootstrap's ranks stay connected to each other and to the store, where a
  server's port is connected to from outside the tree; or
* its process has a collective-communication library loaded (``libnccl``,
  ``librccl``, ``libgloo``, ``libucc``, ``libmpi``, by ``/proc/PID/maps``) and it is
  bound to one of the host's addresses, not to every address: NCCL binds the
  interface it picked, an exporter or a server binds ``0.0.0.0``.

Everything else beyond loopback marks the boot (:attr:`ListeningReport.beyond_loopback`).

    report = listening_report(server.supervisor_pid, server_ports=(port,))
    report.beyond_loopback  # (ListeningSocket(pid=..., process="python", address="0.0.0.0", port=9100),)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import psutil

__all__ = ["ListeningReport", "ListeningSocket", "listening_report"]

#: Shared libraries whose sockets are a collective-communication bootstrap's.
COLLECTIVE_LIBRARIES = ("libnccl", "librccl", "libgloo", "libucc", "libmpi")


@dataclass(frozen=True)
class ListeningSocket:
    pid: int
    process: str
    address: str
    port: int
    peers: tuple[int, ...] = ()       # processes of the tree holding a connection to it
    libraries: tuple[str, ...] = ()   # collective-communication libraries its process has loaded

    def _ip(self):
        """The address as an IP (a scope ``%eth0`` left out), or None where it is none."""
        try:
            return ipaddress.ip_address(self.address.split("%", 1)[0])
        except ValueError:
            return None

    @property
    def loopback(self) -> bool:
        ip = self._ip()
        return ip is not None and ip.is_loopback

    @property
    def wildcard(self) -> bool:
        """Bound to every address (``0.0.0.0``, ``::``)."""
        ip = self._ip()
        return ip is not None and ip.is_unspecified

    def describe(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port} ({self.process}, pid {self.pid})"

    def evidence(self) -> str:
        """Why it is the tree's own (:attr:`ListeningReport.collective`)."""
        said = []
        if self.peers:
            said.append("connected to by pid " + ", ".join(map(str, self.peers)))
        if self.libraries:
            said.append(", ".join(self.libraries) + " loaded")
        return "; ".join(said)


@dataclass(frozen=True)
class ListeningReport:
    sockets: tuple[ListeningSocket, ...]
    unreadable: int = 0  # processes whose sockets could not be read (gone, or not ours)
    server_ports: tuple[int, ...] = ()  # the ports the server serves (its HTTP port)

    def _own(self, s: ListeningSocket) -> bool:
        return s.port not in self.server_ports and bool(s.peers or (s.libraries and not s.wildcard))

    @property
    def collective(self) -> tuple[ListeningSocket, ...]:
        """Sockets beyond loopback that the tree's own processes use between them (a
        collective library's bootstrap, a rendezvous store): facts, not the mark."""
        return tuple(s for s in self.sockets if not s.loopback and self._own(s))

    @property
    def beyond_loopback(self) -> tuple[ListeningSocket, ...]:
        """Sockets beyond loopback that a server serves: reachable from the network (the mark)."""
        return tuple(s for s in self.sockets if not s.loopback and not self._own(s))

    def describe(self) -> str:
        wide = self.beyond_loopback
        own = (f"; the tree's own (collective bootstrap) beyond loopback: "
               + ", ".join(f"{s.describe()} [{s.evidence()}]" for s in self.collective)) if self.collective else ""
        if wide:
            return ("the server's tree listens beyond loopback, reachable from the network while it is measured: "
                    + ", ".join(s.describe() for s in wide) + own)
        return f"the server's tree serves on loopback only ({len(self.sockets)} socket(s)){own}"

    def to_dict(self) -> dict:
        return {"sockets": [{"pid": s.pid, "process": s.process, "address": s.address, "port": s.port,
                             "peers": list(s.peers), "libraries": list(s.libraries)} for s in self.sockets],
                "server_ports": list(self.server_ports),
                "beyond_loopback": [s.describe() for s in self.beyond_loopback],
                "collective": [f"{s.describe()} [{s.evidence()}]" for s in self.collective],
                "unreadable_processes": self.unreadable}


def _connections(proc: psutil.Process):
    read = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6 has connections()
    return read(kind="inet")


def _libraries(pid: int) -> tuple[str, ...]:
    """The collective-communication libraries mapped into ``pid`` (Linux; () elsewhere)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return ()
    found = set()
    for line in maps.splitlines():
        name = line.rsplit(b"/", 1)[-1].decode("utf-8", "replace") if b"/" in line else ""
        if name.startswith(COLLECTIVE_LIBRARIES) and ".so" in name:
            found.add(name)
    return tuple(sorted(found))


def listening_report(root_pid: int, *, include_root: bool = False, server_ports=()) -> ListeningReport:
    """The listening TCP sockets of ``root_pid``'s descendants (and of ``root_pid``
    itself with ``include_root``: the server's pid rather than its supervisor's), each
    with the tree's processes connected to it and its process's collective libraries;
    ``server_ports``: the ports the server serves (its HTTP port), never the tree's own."""
    try:
        root = psutil.Process(root_pid)
        procs = ([root] if include_root else []) + root.children(recursive=True)
    except psutil.Error:
        return ListeningReport((), unreadable=1, server_ports=tuple(server_ports))
    found: dict[tuple[int, str, int], tuple[str, int]] = {}
    dialled: list[tuple[int, str, int]] = []  # (pid, remote address, remote port) of the tree's connections
    unreadable = 0
    for proc in procs:
        try:
            name = proc.name()
            for c in _connections(proc):
                if c.status == psutil.CONN_LISTEN and c.laddr:
                    found.setdefault((proc.pid, c.laddr.ip, c.laddr.port), (name, proc.pid))
                elif c.status == psutil.CONN_ESTABLISHED and c.raddr:
                    dialled.append((proc.pid, c.raddr.ip, c.raddr.port))
        except psutil.Error:
            unreadable += 1
    libs = {pid: _libraries(pid) for pid in {pid for pid, _, _ in found}}
    out = []
    for (pid, address, port), (name, _) in found.items():
        sock = ListeningSocket(pid, name, address, port)
        peers = sorted({p for p, ip, rport in dialled if rport == port and (sock.wildcard or ip == address)})
        out.append(ListeningSocket(pid, name, address, port, tuple(peers), libs.get(pid, ())))
    return ListeningReport(tuple(sorted(out, key=lambda s: (s.pid, s.port, s.address))), unreadable,
                           tuple(server_ports))
