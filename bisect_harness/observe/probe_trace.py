"""What NVML read of a GPU while each repetition of a calibration probe ran.

A full-load probe moves the GPU's clock as it runs (the driver holds the board at its
power limit), so the calibration keeps, beside each repetition's rate, the SM clock,
the power and the clock-event reasons read inside that repetition
(:class:`RepReading`); ``calibration.judged_spread`` reads them. :class:`RepTrace`
takes the readings on a thread every :data:`REP_TRACE_INTERVAL_S` and cuts them by
the repetitions' spans.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from bisect_harness.observe.provenance import decode_throttle_reasons, sample_gpu

__all__ = ["REP_TRACE_INTERVAL_S", "RepReading", "RepTrace"]

#: Seconds between the NVML readings taken while a GPU probe runs.
REP_TRACE_INTERVAL_S = 0.005


@dataclass(frozen=True)
class RepReading:
    """What NVML read of the GPU while one repetition of a probe ran: the mean SM clock
    and the highest power over the readings inside it, the clock-event reasons any of
    them showed, and how many readings there were (0: none fell inside it)."""

    sm_clock_mhz: float | None
    power_w: float | None
    reasons: tuple[str, ...]
    readings: int

    def to_dict(self) -> dict:
        return {"sm_clock_mhz": self.sm_clock_mhz, "power_w": self.power_w, "reasons": list(self.reasons),
                "readings": self.readings}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RepReading":
        return cls(d["sm_clock_mhz"], d["power_w"], tuple(d["reasons"]), int(d["readings"]))


class RepTrace:
    """NVML readings of one GPU every :data:`REP_TRACE_INTERVAL_S` on a thread while a
    probe runs, and the repetitions' spans, so each repetition gets what was read inside
    it (:meth:`readings`). Without NVML (or a GPU it cannot open) it reads nothing and
    every repetition gets no readings. Its thread is stopped on exit, always."""

    def __init__(self, index: int, nvml: Any | None = None):
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:  # no NVML: the repetitions go unread
                nvml = None
        self._nvml = nvml
        self._index = index
        self._handle = None
        self.power_limit_w: float | None = None
        self._rows: list[tuple[float, Mapping[str, Any]]] = []
        self._spans: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "RepTrace":
        try:
            self._nvml.nvmlInit()
            self._handle = self._nvml.nvmlDeviceGetHandleByIndex(self._index)
        except Exception:  # no NVML, no such GPU: the probe runs, its repetitions unread
            self._handle = None
            return self
        try:
            self.power_limit_w = self._nvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1000.0
        except Exception:
            self.power_limit_w = None
        self._thread = threading.Thread(target=self._run, name="rep-trace", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._handle is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                row = sample_gpu(self._nvml, self._handle)
            except Exception:
                return
            self._rows.append((time.perf_counter(), row))
            self._stop.wait(REP_TRACE_INTERVAL_S)

    def span(self, start: float, end: float) -> None:
        """One repetition's ``perf_counter`` span (``_time_op``'s ``on_rep``)."""
        self._spans.append((start, end))

    def readings(self, first: int = 0) -> list[RepReading]:
        """One reading per repetition recorded from the ``first`` span on."""
        out = []
        for start, end in self._spans[first:]:
            rows = [r for t, r in self._rows if start <= t <= end]
            clocks = [float(r["sm_clock_mhz"]) for r in rows if r.get("sm_clock_mhz") is not None]
            powers = [float(r["power_w"]) for r in rows if r.get("power_w") is not None]
            reasons: list[str] = []
            for r in rows:
                for name in decode_throttle_reasons(int(r["throttle_mask"] or 0)):
                    if name not in reasons:
                        reasons.append(name)
            out.append(RepReading(round(statistics.fmean(clocks), 1) if clocks else None,
                                  round(max(powers), 1) if powers else None, tuple(reasons), len(rows)))
        return out
