"""A window's contention figures, the thresholds they are judged against, and the sentences that say so.

:class:`Window` holds the figures of one window (and which sources were
unavailable, and why); :func:`judge` compares them with :class:`Thresholds` and
returns a :class:`Crossing` per figure above its limit, each a sentence naming the
figure, its value, the limit and (for foreign CPU) the busiest processes outside
the server's tree. Pure: no reading of the host here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

#: Version of the dicts this module writes (``Window.to_dict``).
SCHEMA_VERSION = 1


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
    """The JSON stored with a boot (``BootEvidence.contention``): its window, one
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
