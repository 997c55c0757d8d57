"""Did the env reach every worker? :func:`env_report` walks a server's process tree.

The classic failure: tensor-parallel workers started with a scrubbed env, so
``NCCL_*`` tuning never reached them. Example::

    report = env_report(server.pid, {"NCCL_NVLS_ENABLE": "0"})
    if not report.ok:
        print(report.describe())
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import psutil

from ._schema import SCHEMA_VERSION, _check_schema

_CMDLINE_MAX = 300


@dataclass(frozen=True)
class ProcessEnv:
    """One process of the server's tree. ``readable`` is False when its environment
    could not be read (``error`` says why); such a process is not counted for or
    against propagation."""

    pid: int
    ppid: int | None
    name: str
    cmdline: str
    depth: int          # 0 for the root, 1 for its children, ...
    readable: bool
    error: str = ""

    @property
    def is_worker(self) -> bool:
        return self.depth > 0


@dataclass(frozen=True)
class VarReport:
    """Where one requested env var arrived. ``mismatched`` maps pid -> the value seen."""

    name: str
    requested: str
    matched: tuple[int, ...]
    mismatched: Mapping[int, str]
    absent: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatched and not self.absent

    def to_dict(self) -> dict:
        return {"name": self.name, "requested": self.requested, "matched": list(self.matched),
                "mismatched": {str(k): v for k, v in self.mismatched.items()},
                "absent": list(self.absent)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "VarReport":
        return cls(name=d["name"], requested=d["requested"], matched=tuple(d["matched"]),
                   mismatched={int(k): v for k, v in d["mismatched"].items()},
                   absent=tuple(d["absent"]))


@dataclass(frozen=True)
class EnvReport:
    """The env each process of a server's tree started with, for the requested vars.

    ``ok`` is True only when at least one process could be read and every requested
    var is present, with the requested value, in every readable process (root and
    all descendants). Linux exposes the environment a process was *started* with;
    a later ``os.environ`` edit inside the process is not visible here.
    """

    root_pid: int
    processes: tuple[ProcessEnv, ...]
    vars: tuple[VarReport, ...]
    note: str = ""

    @property
    def readable_pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.processes if p.readable)

    @property
    def unreadable(self) -> tuple[ProcessEnv, ...]:
        return tuple(p for p in self.processes if not p.readable)

    @property
    def workers(self) -> tuple[ProcessEnv, ...]:
        return tuple(p for p in self.processes if p.is_worker)

    @property
    def ok(self) -> bool:
        return bool(self.readable_pids) and all(v.ok for v in self.vars)

    def process(self, pid: int) -> ProcessEnv:
        for p in self.processes:
            if p.pid == pid:
                return p
        raise KeyError(pid)

    def describe(self) -> str:
        """A few lines naming each var that did not reach a process, and where."""
        lines = [f"env of process tree {self.root_pid}: {len(self.processes)} processes, "
                 f"{len(self.unreadable)} unreadable -> {'ok' if self.ok else 'NOT OK'}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        for v in self.vars:
            if v.ok:
                continue
            for pid in v.absent:
                p = self.process(pid)
                lines.append(f"  {v.name} missing in pid {pid} ({p.name}): {p.cmdline[:80]}")
            for pid, val in v.mismatched.items():
                p = self.process(pid)
                lines.append(f"  {v.name}={val!r} (want {v.requested!r}) in pid {pid} ({p.name})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "root_pid": self.root_pid, "ok": self.ok,
                "note": self.note, "processes": [asdict(p) for p in self.processes],
                "vars": [v.to_dict() for v in self.vars]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EnvReport":
        _check_schema(d, "EnvReport")
        return cls(root_pid=d["root_pid"], note=d.get("note", ""),
                   processes=tuple(ProcessEnv(**p) for p in d["processes"]),
                   vars=tuple(VarReport.from_dict(v) for v in d["vars"]))


def _truncate(s: str, n: int = _CMDLINE_MAX) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _tree(root: psutil.Process) -> list[tuple[psutil.Process, int]]:
    """Root and all descendants with their depth, breadth first."""
    out: list[tuple[psutil.Process, int]] = []
    frontier = [(root, 0)]
    seen: set[int] = set()
    while frontier:
        proc, depth = frontier.pop(0)
        if proc.pid in seen:
            continue
        seen.add(proc.pid)
        out.append((proc, depth))
        try:
            children = proc.children(recursive=False)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            children = []
        frontier.extend((c, depth + 1) for c in children)
    return out


def env_report(root_pid: int, requested: Mapping[str, str]) -> EnvReport:
    """Check that every ``requested`` var reached the process tree rooted at ``root_pid``.

    Walks the root and all its descendants (recursively), reads each one's
    environment and reports, per var, the pids where it has the requested value,
    another value, or is absent. A process whose environment cannot be read
    (permissions, it exited meanwhile, a zombie) is recorded as unreadable and
    counted neither way. Never raises for a process that vanished, including the
    root: that yields an empty, not-ok report with a note.
    """
    requested = {str(k): str(v) for k, v in requested.items()}
    note = ""
    try:
        root = psutil.Process(root_pid)
        members = _tree(root)
    except psutil.NoSuchProcess:
        members = []
        note = f"process {root_pid} does not exist (the server exited?)"

    processes: list[ProcessEnv] = []
    envs: dict[int, Mapping[str, str]] = {}
    for proc, depth in members:
        try:
            name = proc.name()
        except (psutil.Error, OSError):
            name = "?"
        try:
            cmdline = _truncate(" ".join(proc.cmdline()))
        except (psutil.Error, OSError):
            cmdline = ""
        try:
            ppid: int | None = proc.ppid()
        except (psutil.Error, OSError):
            ppid = None
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                raise psutil.ZombieProcess(proc.pid)
            envs[proc.pid] = proc.environ()
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, True))
        except psutil.ZombieProcess:
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, False,
                                        "zombie: exited, environment gone"))
        except psutil.NoSuchProcess:
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, False,
                                        "exited while being read"))
        except psutil.AccessDenied:
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, False,
                                        "access denied (another user's process?)"))
        except OSError as exc:
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, False,
                                        f"{type(exc).__name__}: {exc}"))
    if members and not envs:
        note = note or "no process of the tree could be read; propagation is unverified"

    vars_: list[VarReport] = []
    for var, want in requested.items():
        matched, absent, mismatched = [], [], {}
        for pid, env in envs.items():
            if var not in env:
                absent.append(pid)
            elif env[var] == want:
                matched.append(pid)
            else:
                mismatched[pid] = env[var]
        vars_.append(VarReport(var, want, tuple(matched), mismatched, tuple(absent)))
    return EnvReport(root_pid=root_pid, processes=tuple(processes), vars=tuple(vars_), note=note)


__all__ = ["EnvReport", "ProcessEnv", "VarReport", "env_report"]
