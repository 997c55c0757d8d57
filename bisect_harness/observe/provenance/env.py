"""Did the env reach every worker? :func:`env_report` walks a server's process tree.

The classic failure: tensor-parallel workers started with a scrubbed env, so
``NCCL_*`` tuning never reached them. Example::

    report = env_report(server.pid, {"NCCL_NVLS_ENABLE": "0"})
    if report.state != "ok":          # "missing" or "unverified"
        print(report.describe())

Real engines rename their processes: vLLM (``VLLM::EngineCore``, ``VLLM::Worker``)
and SGLang (``sglang::scheduler``) call ``setproctitle``, which by default writes the
new title over the memory that holds the process's argv *and* its environ block, so
``/proc/PID/environ`` then reads as NUL bytes, or NUL bytes up to where the title's
padding stopped and the later entries intact (vLLM 0.32's ``VLLM::EngineCore`` shows
14 of 40 variables): the environment a process started with is partly or wholly
gone from view, not absent. Such a block (an empty entry, or an entry with no
``=``) is told apart from an empty environment (a zero-length block) and reported
as *overwritten*: a variable still seen in it counts; one not seen is *unseen*,
and the check answers ``unverified`` ("unreadable in N processes"), never
``missing`` and never a pass. ``SPT_NOENV=1`` tells ``setproctitle`` to leave environ alone
(the title is then limited to the argv area); the presets of engines that use it
set it, so the check can answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

import psutil

from bisect_harness.observe.provenance._schema import SCHEMA_VERSION, _check_schema

_CMDLINE_MAX = 300

#: Why a process's environment could not be read. ``overwritten`` and ``denied``
#: leave a live process unverified; ``gone`` (it exited, a zombie) is a process
#: that no longer runs anything and is counted neither way.
UNREADABLE_CAUSES = ("overwritten", "denied", "gone", "error")

#: What :attr:`EnvReport.state` can be: every requested var seen in every process
#: (``ok``), one absent or different in a process that could be read (``missing``),
#: or neither shown because a live process could not be read (``unverified``).
ENV_STATES = ("ok", "missing", "unverified")

OVERWRITTEN = ("environ block overwritten (the process renamed itself with setproctitle; "
               "SPT_NOENV=1 in the launch env keeps it readable)")


class _Overwritten(Exception):
    """The environ block holds no ``KEY=VALUE`` entry although it is not empty."""


@dataclass(frozen=True)
class ProcessEnv:
    """One process of the server's tree. ``readable`` is False when its environment
    could not be read (``error`` says why, ``cause`` is one of
    :data:`UNREADABLE_CAUSES`); such a process is not counted for or against
    propagation, but a live one (``overwritten``, ``denied``) leaves the report
    unverified."""

    pid: int
    ppid: int | None
    name: str
    cmdline: str
    depth: int          # 0 for the root, 1 for its children, ...
    readable: bool
    error: str = ""
    cause: str = ""
    overwritten: bool = False  # readable, but a process title overwrote part of the block

    @property
    def unverified(self) -> bool:
        """A live process whose environment could not be read."""
        return not self.readable and self.cause in ("overwritten", "denied", "error")

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
    unseen: tuple[int, ...] = ()  # not in a block a process title partly overwrote: unverified

    @property
    def ok(self) -> bool:
        return not self.mismatched and not self.absent

    def to_dict(self) -> dict:
        return {"name": self.name, "requested": self.requested, "matched": list(self.matched),
                "mismatched": {str(k): v for k, v in self.mismatched.items()},
                "absent": list(self.absent), "unseen": list(self.unseen)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "VarReport":
        return cls(name=d["name"], requested=d["requested"], matched=tuple(d["matched"]),
                   mismatched={int(k): v for k, v in d["mismatched"].items()},
                   absent=tuple(d["absent"]), unseen=tuple(d.get("unseen", ())))


@dataclass(frozen=True)
class EnvReport:
    """The env each process of a server's tree started with, for the requested vars.

    :attr:`state` is the answer: ``missing`` when a requested var is absent or has
    another value in a process that could be read; else ``unverified`` when no
    process could be read or a live one could not (its block overwritten by a
    process title, access denied); else ``ok``. ``ok`` is ``state == "ok"``.
    Linux exposes the environment a process was *started* with; a later
    ``os.environ`` edit inside the process is not visible here.
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
    def unverified(self) -> tuple[ProcessEnv, ...]:
        """Live processes whose environment could not be read."""
        return tuple(p for p in self.processes if p.unverified)

    @property
    def unseen_pids(self) -> tuple[int, ...]:
        """Processes whose partly overwritten block does not show a requested var."""
        return tuple(sorted({pid for v in self.vars for pid in v.unseen}))

    @property
    def state(self) -> str:
        if not all(v.ok for v in self.vars):
            return "missing"
        if not self.readable_pids or self.unverified or self.unseen_pids:
            return "unverified"
        return "ok"

    @property
    def ok(self) -> bool:
        return self.state == "ok"

    def unverified_text(self) -> str:
        """``unreadable in N of M processes (VLLM::EngineCore: environ block overwritten ...)``."""
        bad = [*self.unverified, *(self.process(pid) for pid in self.unseen_pids)]
        if not bad and not self.readable_pids:
            return self.note or f"no process of {len(self.processes)} could be read"
        causes = sorted({f"{p.name}: {p.error or OVERWRITTEN}" for p in bad})
        return (f"unreadable in {len(bad)} of {len(self.processes)} processes ("
                + "; ".join(causes[:3]) + (f"; +{len(causes) - 3} more" if len(causes) > 3 else "") + ")")

    def process(self, pid: int) -> ProcessEnv:
        for p in self.processes:
            if p.pid == pid:
                return p
        raise KeyError(pid)

    def describe(self) -> str:
        """A few lines naming each var that did not reach a process, and where."""
        state = self.state
        lines = [f"env of process tree {self.root_pid}: {len(self.processes)} processes, "
                 f"{len(self.unreadable)} unreadable -> "
                 f"{ {'ok': 'ok', 'missing': 'NOT OK', 'unverified': 'UNVERIFIED'}[state]}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        for p in self.unverified:
            lines.append(f"  pid {p.pid} ({p.name}) unreadable: {p.error}")
        for v in self.vars:
            for pid in v.unseen:
                lines.append(f"  {v.name} not seen in pid {pid} ({self.process(pid).name}): {OVERWRITTEN}")
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
                "state": self.state, "note": self.note, "processes": [asdict(p) for p in self.processes],
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


def _environ(proc: psutil.Process) -> tuple[dict[str, str], bool]:
    """The environment ``proc`` started with, and whether a process title overwrote
    part of its block (an empty entry, or one with no ``=``: ``execve`` writes neither).
    On Linux the raw block is read; one that holds no entry at all, yet is not empty,
    raises :class:`_Overwritten` instead of reading as an empty environment."""
    try:
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if not psutil.pid_exists(proc.pid):
            raise psutil.NoSuchProcess(proc.pid) from None
        return dict(proc.environ()), False  # not Linux: psutil's own reader
    except PermissionError:
        raise psutil.AccessDenied(proc.pid) from None
    env, overwritten = parse_environ(raw)
    if overwritten and not env:
        raise _Overwritten()
    return env, overwritten


def parse_environ(raw: bytes) -> tuple[dict[str, str], bool]:
    """The ``KEY=VALUE`` entries of a raw ``/proc/PID/environ`` block, and whether a
    process title overwrote part or all of it (an empty entry, or one without ``=``).

    >>> parse_environ(b"A=1\\0B=2\\0")
    ({'A': '1', 'B': '2'}, False)
    >>> parse_environ(b"\\0\\0\\0B=2\\0")      # the title's NUL padding, then what survived
    ({'B': '2'}, True)
    """
    if not raw:
        return {}, False
    parts = (raw[:-1] if raw.endswith(b"\0") else raw).split(b"\0")
    overwritten = any(not e or b"=" not in e for e in parts)
    env: dict[str, str] = {}
    for e in parts:
        key, sep, value = e.decode("utf-8", "surrogateescape").partition("=")
        if sep and key:
            env[key] = value
    return env, overwritten


def env_report(root_pid: int, requested: Mapping[str, str]) -> EnvReport:
    """Check that every ``requested`` var reached the process tree rooted at ``root_pid``.

    Walks the root and all its descendants (recursively), reads each one's
    environment and reports, per var, the pids where it has the requested value,
    another value, or is absent. A process whose environment cannot be read
    (permissions, it exited meanwhile, a zombie) is recorded as unreadable and
    counted neither way; a live one (its block overwritten by a process title,
    access denied) leaves the report ``unverified``. Never raises for a process that vanished, including the
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
    partial: set[int] = set()
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
        def unreadable(cause: str, error: str) -> None:
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, False, error, cause))

        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                raise psutil.ZombieProcess(proc.pid)
            envs[proc.pid], partly = _environ(proc)
            if partly:
                partial.add(proc.pid)
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, True, overwritten=partly))
        except _Overwritten:
            unreadable("overwritten", OVERWRITTEN)
        except psutil.ZombieProcess:
            unreadable("gone", "zombie: exited, environment gone")
        except psutil.NoSuchProcess:
            unreadable("gone", "exited while being read")
        except psutil.AccessDenied:
            unreadable("denied", "access denied (another user's process?)")
        except OSError as exc:
            unreadable("error", f"{type(exc).__name__}: {exc}")
    if members and not envs:
        note = note or "no process of the tree could be read; propagation is unverified"

    vars_: list[VarReport] = []
    for var, want in requested.items():
        matched, absent, unseen, mismatched = [], [], [], {}
        for pid, env in envs.items():
            if var not in env:
                (unseen if pid in partial else absent).append(pid)
            elif env[var] == want:
                matched.append(pid)
            else:
                mismatched[pid] = env[var]
        vars_.append(VarReport(var, want, tuple(matched), mismatched, tuple(absent), tuple(unseen)))
    return EnvReport(root_pid=root_pid, processes=tuple(processes), vars=tuple(vars_), note=note)


__all__ = ["ENV_STATES", "EnvReport", "OVERWRITTEN", "ProcessEnv", "UNREADABLE_CAUSES", "VarReport", "env_report",
           "parse_environ"]
