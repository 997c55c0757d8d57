"""Was the box busy? Host contention measured over a window, judged against thresholds.

A :class:`Monitor` reads every registered :class:`Source` when it starts, about once
per ``interval_s`` on a background thread, at each :meth:`Monitor.split` (a sample
boundary) and when it stops; :meth:`Monitor.window` turns the readings between two
boundaries into a :class:`Window` of figures. :func:`judge` compares a window's
figures with :class:`Thresholds` and returns the :class:`Crossing` s, each a
sentence that names the figure, its value, the limit and (for foreign CPU) the
busiest processes outside the server's tree.

Sources (one class each, registered by name, each describing itself):

* ``pressure`` -- Linux pressure stall information (``/proc/pressure/cpu|io|memory``):
  the share of the window in which some task waited, from the ``total`` counters.
* ``steal`` -- CPU time taken by the hypervisor from this guest (``/proc/stat``).
* ``runqueue`` -- runnable tasks (``procs_running``) minus the runnable threads of the
  harness and the server's tree, per core the server may use (its affinity).
* ``foreign_cpu`` -- CPU seconds used during the window by processes outside the
  harness's own process tree (which holds the server's), per core the server may use.
* ``gpu_processes`` -- processes on the server's GPUs that are not in its tree (NVML).

A source that cannot be read here (no PSI in a container, no NVML) is recorded as
unavailable with the reason, and the others are used. Parsing is done by pure
functions (:func:`parse_pressure`, :func:`parse_proc_stat`, :func:`parse_task_state`)
so each source is testable on recorded text; each source reads through a ``read``
callable (a path to text) and the GPU source through an ``nvml`` object, the seams.

Example::

    with Monitor(server_pid=server.pid) as mon:
        run_benchmark()
    window = mon.window()
    for c in judge(window, Thresholds()):
        print(c.message)
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

import psutil

from bisect_harness.kinds import Registry

#: Version of the dicts this module writes (``Window.to_dict``).
SCHEMA_VERSION = 1

Reader = Callable[[str], str]


def read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read()


class SourceUnavailable(Exception):
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


# ------------------------------------------------------------------ thresholds and judgement


@dataclass(frozen=True)
class Thresholds:
    """Limits above which a window counts as busy (``defaults.host_thresholds``).
    Shares are fractions (0.25 = 25%). Chosen from quiet and busy windows measured
    with ``bench/bench_contention.py`` (see docs/hypotheses-format.md)."""

    foreign_cpu_share: float = 0.25          # CPU outside our tree, share of the server's cores
    foreign_runnable_per_core: float = 0.5   # runnable foreign tasks per server core (mean)
    cpu_pressure: float = 0.9                # PSI cpu "some": share of the window a task waited for CPU (host-wide)
    io_pressure: float = 0.25                # PSI io "some"
    memory_pressure: float = 0.10            # PSI memory "some"
    steal: float = 0.05                      # CPU time stolen by the hypervisor
    gpu_foreign_processes: float = 0         # other processes on the server's GPUs
    calibration_spread: float = 0.10         # (max - min) / median of a calibration probe

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


_WHAT = {
    "foreign_cpu_share": "CPU used by other processes (outside the harness and server tree)",
    "foreign_runnable_per_core": "runnable foreign tasks per server core",
    "cpu_pressure": "CPU pressure (PSI some: tasks waiting for a CPU)",
    "io_pressure": "IO pressure (PSI some)",
    "memory_pressure": "memory pressure (PSI some)",
    "steal": "CPU steal time",
    "gpu_foreign_processes": "other processes on the server's GPUs",
}


@dataclass(frozen=True)
class Crossing:
    """One figure of a window above its threshold."""

    figure: str
    value: float
    limit: float
    message: str

    def to_dict(self) -> dict:
        return {"figure": self.figure, "value": self.value, "limit": self.limit, "message": self.message}


@dataclass(frozen=True)
class Window:
    """The contention figures of one window: per source available or why not, the
    figures, and the busiest foreign processes."""

    seconds: float
    cores: int
    figures: Mapping[str, float]
    sources: Mapping[str, Mapping[str, Any]]
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "seconds": self.seconds, "cores": self.cores,
                "figures": {k: round(v, 5) for k, v in self.figures.items()},
                "sources": {k: dict(v) for k, v in self.sources.items()}, "details": dict(self.details)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Window":
        return cls(d.get("seconds", 0.0), d.get("cores", 0), dict(d.get("figures", {})),
                   dict(d.get("sources", {})), dict(d.get("details", {})))

    def unavailable(self) -> dict[str, str]:
        return {k: v.get("note", "") for k, v in self.sources.items() if not v.get("available")}


def _fmt_value(figure: str, v: float) -> str:
    if figure == "gpu_foreign_processes":
        return f"{v:.0f}"
    if figure == "foreign_runnable_per_core":
        return f"{v:.2f}"
    return f"{v:.0%}"


def judge(window: Window, thresholds: Thresholds) -> list[Crossing]:
    """Every figure of ``window`` above its limit, as sentences."""
    out = []
    for name, what in _WHAT.items():
        v = window.figures.get(name)
        limit = getattr(thresholds, name)
        if v is None or v <= limit:
            continue
        shown, lim = _fmt_value(name, v), _fmt_value(name, limit)
        if shown == lim:  # 90.3% > 90%: show the digit that makes the sentence true
            shown = f"{v:.2%}" if "%" in lim else f"{v:.3f}"
        msg = f"{what} {shown} > {lim}"
        if name == "foreign_cpu_share":
            msg += f" ({window.figures.get('foreign_cpu', 0):.2f} of {window.cores} cores"
            top = window.details.get("top_foreign") or []
            if top:
                msg += "; top: " + ", ".join(f"{p.get('command') or p['name']} (pid {p['pid']}) {p['cores']:.2f}"
                                             for p in top[:3])
            msg += ")"
        elif name == "gpu_foreign_processes":
            pids = [str(p["pid"]) for p in window.details.get("gpu_foreign", [])[:5]]
            msg += f" (pids {', '.join(pids)})" if pids else ""
        out.append(Crossing(name, float(v), float(limit), msg))
    return out


#: The mark a boot gets when its window saw contention above a threshold.
HOST_BUSY = "host_busy"


def record(window: Window, samples: Sequence[Window], crossed: Sequence[Crossing], thresholds: Thresholds) -> dict:
    """The JSON stored with a boot (``provenance["contention"]``): its window, one
    window per sample, what crossed and the thresholds applied."""
    return {"window": window.to_dict(), "samples": [{k: round(v, 5) for k, v in w.figures.items()} for w in samples],
            "crossed": [c.to_dict() for c in crossed], "thresholds": thresholds.to_dict()}


def summary_line(window: Window) -> str:
    """The figures of a window in one line (for the journal and ``harness doctor``)."""
    f = window.figures
    parts = []
    if "foreign_cpu" in f:
        parts.append(f"foreign CPU {f['foreign_cpu']:.2f} of {window.cores} cores ({f['foreign_cpu_share']:.0%})")
    if "foreign_runnable_per_core" in f:
        parts.append(f"foreign runnable {f['foreign_runnable_per_core']:.2f}/core")
    for res in ("cpu", "io", "memory"):
        if f"{res}_pressure" in f:
            parts.append(f"PSI {res} {f[f'{res}_pressure']:.0%}")
    if "steal" in f:
        parts.append(f"steal {f['steal']:.1%}")
    if "gpu_foreign_processes" in f:
        parts.append(f"other GPU processes {f['gpu_foreign_processes']:.0f}")
    for name in window.unavailable():
        parts.append(f"{name} n/a")
    return "; ".join(parts) + f" over {window.seconds:.1f}s"


# ------------------------------------------------------------------ the monitor


def own_pids(roots: Iterable[int]) -> frozenset[int]:
    """The given pids and all their descendants that exist now."""
    out: set[int] = set()
    for pid in roots:
        try:
            p = psutil.Process(pid)
            out.add(pid)
            out.update(c.pid for c in p.children(recursive=True))
        except psutil.Error:
            continue
    return frozenset(out)


def allowed_cores(pid: int | None) -> int:
    try:
        return len(psutil.Process(pid).cpu_affinity()) if pid else len(os.sched_getaffinity(0))
    except (psutil.Error, AttributeError, OSError):
        return os.cpu_count() or 1


class Monitor:
    """Reads every source over a window, on a background thread every ``interval_s``.

    ``server_pid``: the server's root process; its tree is ours, as are the trees of
    ``roots`` (default: this process, the harness). ``sources``: instances to use instead of one of each registered
    class (tests pass sources with recorded text). :meth:`split` marks a boundary
    (between benchmark samples); :meth:`window` gives the figures between two
    boundaries (default: the whole window)."""

    def __init__(self, server_pid: int | None = None, *, interval_s: float = 1.0,
                 sources: Sequence[Source] | None = None, roots: Sequence[int] | None = None):
        self.server_pid = server_pid
        self.interval_s = interval_s
        self._roots = [*(roots if roots is not None else (os.getpid(),)), *([server_pid] if server_pid else [])]
        self.sources = list(sources) if sources is not None else [cls() for cls in SOURCES.values()]
        self._readings: dict[str, list[tuple[float, Any]]] = {s.name: [] for s in self.sources}
        self._unavailable: dict[str, str] = {}
        self._bounds: list[dict[str, int]] = []
        self._ctx = Context(frozenset(), allowed_cores(server_pid), server_pid)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Monitor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _tick(self) -> None:
        with self._lock:
            self._ctx.own_pids = own_pids(self._roots)
            now = time.monotonic()
            for s in self.sources:
                if s.name in self._unavailable:
                    continue
                try:
                    self._readings[s.name].append((now, s.read(self._ctx)))
                except SourceUnavailable as exc:
                    if not self._readings[s.name]:
                        self._unavailable[s.name] = str(exc)
                except Exception as exc:  # a source that breaks mid-window keeps what it had
                    self._unavailable.setdefault(s.name, f"stopped: {type(exc).__name__}: {exc}")

    def _mark(self) -> None:
        self._tick()
        with self._lock:
            self._bounds.append({k: len(v) for k, v in self._readings.items()})

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("Monitor already started")
        self._mark()
        self._thread = threading.Thread(target=self._run, name="contention", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick()

    def split(self) -> None:
        """A boundary between two windows (say, two benchmark samples)."""
        self._mark()

    def stop(self) -> None:
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._mark()
        for s in self.sources:
            s.close()

    @property
    def n_windows(self) -> int:
        return max(0, len(self._bounds) - 1)

    def window(self, start: int = 0, end: int | None = None) -> Window:
        """Figures between boundary ``start`` and ``end`` (0 = start, -1 = last)."""
        with self._lock:
            bounds = list(self._bounds)
            readings = {k: list(v) for k, v in self._readings.items()}
            unavailable = dict(self._unavailable)
        if len(bounds) < 2:
            raise RuntimeError("a window needs the monitor started and split or stopped")
        b0, b1 = bounds[start], bounds[end if end is not None else -1]
        figures: dict[str, float] = {}
        sources: dict[str, dict] = {}
        details: dict[str, Any] = {}
        seconds = 0.0
        for s in self.sources:
            if s.name in unavailable:
                sources[s.name] = {"available": False, "note": unavailable[s.name], "description": s.description}
                continue
            rs = readings[s.name][max(0, b0[s.name] - 1):b1[s.name]]
            figures.update(s.figures(rs, self._ctx))
            details.update(s.details(rs, self._ctx))
            seconds = max(seconds, _span(rs))
            sources[s.name] = {"available": True, "readings": len(rs), "description": s.description}
        return Window(seconds, self._ctx.cores, figures, sources, details)

    def samples(self) -> list[Window]:
        """One window per pair of consecutive boundaries."""
        return [self.window(i, i + 1) for i in range(self.n_windows)]


def sample_host(seconds: float = 3.0, *, interval_s: float = 0.5, roots: Sequence[int] | None = None) -> Window:
    """Watch this host for ``seconds``; only the trees of ``roots`` (default: this
    process) count as ours."""
    with Monitor(interval_s=interval_s, roots=roots) as mon:
        time.sleep(seconds)  # the window itself: the sources measure what happens during it
    return mon.window()


def wait_quiet(thresholds: Thresholds, *, timeout_s: float, window_s: float = 3.0,
               say: Callable[[str], None] = lambda s: None) -> tuple[bool, Window]:
    """Sample windows until one is quiet or ``timeout_s`` has passed. Returns
    ``(quiet, last window)``."""
    deadline = time.monotonic() + timeout_s
    while True:
        w = sample_host(window_s)
        crossed = judge(w, thresholds)
        if not crossed:
            return True, w
        if time.monotonic() + window_s > deadline:
            return False, w
        say("host busy, waiting: " + "; ".join(c.message for c in crossed))


__all__ = [
    "Context", "Crossing", "ForeignCpuSource", "HOST_BUSY", "GpuProcessSource", "Monitor", "PressureSource", "ProcCpu",
    "ProcStat", "RunQueueSource", "SOURCES", "Source", "SourceUnavailable", "StealSource", "Thresholds",
    "Window", "allowed_cores", "judge", "own_pids", "parse_pressure", "parse_proc_stat", "parse_task_state",
    "record", "register", "sample_host", "summary_line", "wait_quiet",
]
