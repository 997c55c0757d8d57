"""Contention sources: one class per figure of a busy host, registered by name (:data:`SOURCES`).

A :class:`Source` reads one kind of figure at a moment (``read``), turns the
readings of a window into named numbers (``figures``) and adds what a reader wants
(``details``: the busiest foreign processes). A source that cannot be read on this
host raises :class:`SourceUnavailable` with the reason. The parsers are pure
functions, so each source is testable on recorded text; each source reads through
a ``read`` callable (a path to text), the foreign CPU source through an
``iterate`` callable, and the GPU source through an ``nvml`` object: the seams.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Sequence

import psutil

from bisect_harness.errors import NotObserved
from bisect_harness.kinds import Registry
from bisect_harness.secrets import redact_text

Reader = Callable[[str], str]


def read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


class SourceUnavailable(NotObserved):
    """A source cannot be read on this host; the message says why."""


# ------------------------------------------------------------------ pure parsers


def parse_pressure(text: str) -> dict[str, float]:
    """``/proc/pressure/*`` text to ``{"some": total_us, "full": total_us}``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] not in ("some", "full"):
            continue
        for p in parts[1:]:
            k, _, v = p.partition("=")
            if k == "total":
                out[parts[0]] = float(v)
    if "some" not in out:
        raise ValueError(f"no 'some ... total=' line in pressure text: {text[:80]!r}")
    return out


@dataclass(frozen=True)
class ProcStat:
    """The parts of ``/proc/stat`` used here: the aggregate CPU jiffies and ``procs_running``."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int
    procs_running: int | None

    @property
    def total(self) -> int:  # guest time is already inside user and nice
        return (self.user + self.nice + self.system + self.idle + self.iowait + self.irq + self.softirq
                + self.steal)


def parse_proc_stat(text: str) -> ProcStat:
    """``/proc/stat`` text to a :class:`ProcStat` (older kernels without steal read 0)."""
    cpu = None
    running = None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "cpu":
            vals = [int(x) for x in parts[1:9]] + [0] * (8 - len(parts[1:9]))
            cpu = vals
        elif parts[0] == "procs_running" and len(parts) > 1:
            running = int(parts[1])
    if cpu is None:
        raise ValueError("no aggregate 'cpu' line in /proc/stat text")
    return ProcStat(*cpu, procs_running=running)


def parse_task_state(text: str) -> str:
    """The state letter of a ``/proc/PID/task/TID/stat`` line (``R`` runnable)."""
    end = text.rfind(")")
    if end < 0:
        raise ValueError(f"not a stat line: {text[:60]!r}")
    rest = text[end + 1:].split()
    if not rest:
        raise ValueError(f"no state in stat line: {text[:60]!r}")
    return rest[0]


# ------------------------------------------------------------------ context and sources


@dataclass
class Context:
    """What every source may need at a reading: which pids are ours (the harness and
    the server's tree) and which cores the server may use."""

    own_pids: frozenset[int]
    cores: int
    server_pid: int | None = None


class Source:
    """One kind of contention figure. ``read`` returns a reading (any value) or raises
    :class:`SourceUnavailable`; ``figures`` turns the readings of a window into named
    numbers; ``details`` adds lists a reader wants (top processes)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def read(self, ctx: Context) -> Any:
        raise NotImplementedError

    def figures(self, readings: Sequence[tuple[float, Any]], ctx: Context) -> dict[str, float]:
        raise NotImplementedError

    def details(self, readings: Sequence[tuple[float, Any]], ctx: Context) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None


#: name -> contention source class, filled by :func:`register` as each class is defined.
SOURCES: Registry[type[Source]] = Registry("contention source")


def register(cls: type[Source]) -> type[Source]:
    """Class decorator: make ``cls`` a source every :class:`Monitor` reads."""
    return SOURCES.add(cls)


def _span(readings: Sequence[tuple[float, Any]]) -> float:
    return max(readings[-1][0] - readings[0][0], 1e-9) if len(readings) > 1 else 0.0


@register
class PressureSource(Source):
    name = "pressure"
    description = "Linux pressure stall information: share of the window some (full: all) tasks waited"
    RESOURCES = ("cpu", "io", "memory")

    def __init__(self, read: Reader = read_text, root: str = "/proc/pressure"):
        self._read, self._root = read, root

    def read(self, ctx: Context) -> dict[str, dict[str, float]]:
        out = {}
        for res in self.RESOURCES:
            try:
                out[res] = parse_pressure(self._read(f"{self._root}/{res}"))
            except (OSError, ValueError) as exc:
                raise SourceUnavailable(f"{self._root}/{res} unreadable ({type(exc).__name__}): no PSI "
                                        "on this kernel or in this container") from None
        return out

    def figures(self, readings, ctx) -> dict[str, float]:
        dt = _span(readings)
        if not dt:
            return {}
        a, b = readings[0][1], readings[-1][1]
        out = {}
        for res in self.RESOURCES:
            for kind in ("some", "full"):
                if kind in a[res] and kind in b[res]:
                    name = f"{res}_pressure" + ("_full" if kind == "full" else "")
                    out[name] = max(0.0, (b[res][kind] - a[res][kind]) / (dt * 1e6))
        return out


@register
class StealSource(Source):
    name = "steal"
    description = "CPU time the hypervisor gave to other guests (/proc/stat steal), as a share of all CPU time"

    def __init__(self, read: Reader = read_text, path: str = "/proc/stat"):
        self._read, self._path = read, path

    def read(self, ctx: Context) -> ProcStat:
        try:
            return parse_proc_stat(self._read(self._path))
        except (OSError, ValueError) as exc:
            raise SourceUnavailable(f"{self._path} unreadable ({type(exc).__name__})") from None

    def figures(self, readings, ctx) -> dict[str, float]:
        if len(readings) < 2:
            return {}
        a, b = readings[0][1], readings[-1][1]
        total = b.total - a.total
        if total <= 0:
            return {}
        return {"steal": (b.steal - a.steal) / total,
                "host_cpu_busy": 1.0 - ((b.idle + b.iowait) - (a.idle + a.iowait)) / total}


@register
class RunQueueSource(Source):
    name = "runqueue"
    description = ("runnable tasks (/proc/stat procs_running) that are not threads of the harness or the "
                   "server, per core the server may use")

    def __init__(self, read: Reader = read_text, proc: str = "/proc"):
        self._read, self._proc = read, proc

    def own_running(self, pids: Iterable[int]) -> int:
        n = 0
        for pid in pids:
            try:
                tids = os.listdir(f"{self._proc}/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    if parse_task_state(self._read(f"{self._proc}/{pid}/task/{tid}/stat")) == "R":
                        n += 1
                except (OSError, ValueError):
                    continue
        return n

    def read(self, ctx: Context) -> tuple[int, int]:
        try:
            stat = parse_proc_stat(self._read(f"{self._proc}/stat"))
        except (OSError, ValueError) as exc:
            raise SourceUnavailable(f"{self._proc}/stat unreadable ({type(exc).__name__})") from None
        if stat.procs_running is None:
            raise SourceUnavailable(f"{self._proc}/stat has no procs_running line")
        return stat.procs_running, self.own_running(ctx.own_pids)

    def figures(self, readings, ctx) -> dict[str, float]:
        if not readings:
            return {}
        foreign = [max(0, total - own) for _, (total, own) in readings]
        mean = sum(foreign) / len(foreign)
        return {"runnable_mean": sum(t for _, (t, _) in readings) / len(readings),
                "foreign_runnable": mean, "foreign_runnable_per_core": mean / max(ctx.cores, 1)}


@dataclass(frozen=True)
class ProcCpu:
    pid: int
    name: str
    created: float
    cpu_s: float


@register
class ForeignCpuSource(Source):
    name = "foreign_cpu"
    description = ("CPU time used during the window by processes outside the harness's and the server's "
                   "process tree, in cores (1.0 = one core busy) and as a share of the server's cores")

    def __init__(self, iterate: Callable[[], Iterable[ProcCpu]] | None = None,
                 command: Callable[[int], str | None] | None = None):
        self._iterate = iterate or self._psutil_processes
        self._command = command or self._psutil_command

    @staticmethod
    def _psutil_command(pid: int) -> str | None:
        """The command line of a (top) foreign process, shortened, or None once it is gone."""
        try:
            cmd = " ".join(" ".join(psutil.Process(pid).cmdline()).split())  # one line, even for `-c` code
        except psutil.Error:
            return None
        cmd = redact_text(cmd)  # before it is cut: a secret cut in two is no longer found (another harness's --ledger)
        return cmd if len(cmd) <= 80 else cmd[:77] + "..."

    @staticmethod
    def _psutil_processes() -> Iterable[ProcCpu]:
        for p in psutil.process_iter(["pid", "name", "create_time", "cpu_times"]):
            info = p.info
            t = info.get("cpu_times")
            if t is None:
                continue
            yield ProcCpu(info["pid"], info.get("name") or "?", info.get("create_time") or 0.0,
                          float(t.user + t.system))

    def read(self, ctx: Context) -> tuple[float, dict[tuple[int, float], ProcCpu]]:
        """``(wall time, {(pid, start time): ProcCpu})`` of the processes not ours."""
        try:
            return time.time(), {(p.pid, p.created): p for p in self._iterate() if p.pid not in ctx.own_pids}
        except (psutil.Error, OSError) as exc:
            raise SourceUnavailable(f"process table unreadable ({type(exc).__name__}: {exc})") from None

    @staticmethod
    def used(readings) -> dict[tuple[int, float], tuple[str, float]]:
        """CPU seconds per foreign process over the readings: its last seen value minus
        its value at the window's start (0 for a process started after it)."""
        if not readings:
            return {}
        t0_wall, first = readings[0][1]
        last: dict = {}
        for _, (_, procs) in readings:
            last.update(procs)
        out = {}
        for key, p in last.items():
            if key in first:
                base = first[key].cpu_s
            elif p.created < t0_wall - 1.0:
                continue  # it existed before the window but was first seen later: unknown base
            else:
                base = 0.0
            out[key] = (p.name, max(0.0, p.cpu_s - base))
        return out

    def figures(self, readings, ctx) -> dict[str, float]:
        dt = _span(readings)
        if not dt:
            return {}
        total = sum(cpu for _, cpu in self.used(readings).values())
        return {"foreign_cpu": total / dt, "foreign_cpu_share": total / dt / max(ctx.cores, 1)}

    def details(self, readings, ctx) -> dict[str, Any]:
        dt = _span(readings)
        if not dt:
            return {}
        top = sorted(((cpu, key, name) for key, (name, cpu) in self.used(readings).items()), reverse=True)[:5]
        return {"top_foreign": [{"pid": key[0], "name": name, "cores": round(cpu / dt, 3),
                                 "command": self._command(key[0])}
                                for cpu, key, name in top if cpu / dt >= 0.01]}


@register
class GpuProcessSource(Source):
    name = "gpu_processes"
    description = "processes on the server's GPUs that are not in the server's tree (NVML)"

    def __init__(self, nvml: Any | None = None):
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError:
                nvml = None
        self._nvml = nvml
        self._open = False
        self._handles: list[tuple[int, Any]] = []

    def _init(self) -> None:
        if self._open:
            return
        if self._nvml is None:
            raise SourceUnavailable("nvidia-ml-py is not installed")
        try:
            self._nvml.nvmlInit()
        except Exception as exc:
            raise SourceUnavailable(f"NVML unavailable ({type(exc).__name__}): no GPU driver here") from None
        self._open = True
        n = int(self._nvml.nvmlDeviceGetCount())
        self._handles = [(i, self._nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]
        if not self._handles:
            raise SourceUnavailable("NVML reports no GPU")

    def read(self, ctx: Context) -> dict[int, list[tuple[int, float | None]]]:
        self._init()
        out = {}
        for i, h in self._handles:
            procs = []
            for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    got = getattr(self._nvml, fn)(h)
                except Exception:
                    continue
                for p in got or ():
                    mem = getattr(p, "usedGpuMemory", None)
                    procs.append((int(p.pid), float(mem) / 2**20 if isinstance(mem, (int, float)) else None))
            out[i] = procs
        return out

    def figures(self, readings, ctx) -> dict[str, float]:
        return {"gpu_foreign_processes": float(len(self.foreign(readings, ctx)))}

    @staticmethod
    def foreign(readings, ctx) -> dict[int, dict]:
        """Foreign pids on the server's GPUs (those where one of our pids runs; all GPUs when none)."""
        ours = {i for _, r in readings for i, procs in r.items() if any(pid in ctx.own_pids for pid, _ in procs)}
        out: dict[int, dict] = {}
        for _, r in readings:
            for i, procs in r.items():
                if ours and i not in ours:
                    continue
                for pid, mem in procs:
                    if pid not in ctx.own_pids:
                        out[pid] = {"pid": pid, "gpu": i, "memory_mib": mem}
        return out

    def details(self, readings, ctx) -> dict[str, Any]:
        return {"gpu_foreign": list(self.foreign(readings, ctx).values())[:10]}

    def close(self) -> None:
        if self._open:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._open = False
