"""What happened during sampling? :class:`GpuSampler` records GPU clocks,
temperature, power and throttle reasons, and CPU load and frequency, over a
benchmark window; :class:`SamplerSummary` is what it saw."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import psutil

from bisect_harness.observe.provenance._schema import SCHEMA_VERSION, _check_schema
from bisect_harness.observe.provenance.host import (
    _NVML_CLOCK_MEM, _NVML_CLOCK_SM, _NVML_TEMPERATURE_GPU, BENIGN_THROTTLE_REASONS, _default_nvml,
    _throttle_mask, decode_throttle_reasons,
)

@dataclass(frozen=True)
class Stat:
    """min / mean / max of one sampled field."""

    min: float
    mean: float
    max: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> "Stat | None":
        vals = [float(v) for v in values if v is not None]
        if not vals:
            return None
        return cls(min(vals), sum(vals) / len(vals), max(vals), len(vals))


@dataclass(frozen=True)
class GpuSummary:
    """One GPU over a sampling window. ``sm_clock_max_mhz`` is the GPU's maximum SM
    clock (the ceiling), so ``stats['sm_clock_mhz'].max / sm_clock_max_mhz`` says
    whether the clock ever reached it under load."""

    index: int
    stats: Mapping[str, Stat]
    throttle_reasons_seen: tuple[str, ...]
    sm_clock_max_mhz: int | None

    @property
    def active_throttle_reasons(self) -> tuple[str, ...]:
        return tuple(r for r in self.throttle_reasons_seen if r not in BENIGN_THROTTLE_REASONS)

    def to_dict(self) -> dict:
        return {"index": self.index, "stats": {k: asdict(v) for k, v in self.stats.items()},
                "throttle_reasons_seen": list(self.throttle_reasons_seen),
                "sm_clock_max_mhz": self.sm_clock_max_mhz}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GpuSummary":
        return cls(d["index"], {k: Stat(**v) for k, v in d["stats"].items()},
                   tuple(d["throttle_reasons_seen"]), d.get("sm_clock_max_mhz"))


@dataclass(frozen=True)
class SamplerSummary:
    """What :class:`GpuSampler` saw: CPU fields (``load1``, ``cpu_percent``,
    ``cpu_freq_mhz``) and per-GPU fields (``sm_clock_mhz``, ``mem_clock_mhz``,
    ``temperature_c``, ``power_w``)."""

    interval_s: float
    duration_s: float
    n_samples: int
    cpu: Mapping[str, Stat]
    gpus: tuple[GpuSummary, ...]
    note: str = ""

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "interval_s": self.interval_s,
                "duration_s": self.duration_s, "n_samples": self.n_samples,
                "cpu": {k: asdict(v) for k, v in self.cpu.items()},
                "gpus": [g.to_dict() for g in self.gpus], "note": self.note}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SamplerSummary":
        _check_schema(d, "SamplerSummary")
        return cls(d["interval_s"], d["duration_s"], d["n_samples"],
                   {k: Stat(**v) for k, v in d["cpu"].items()},
                   tuple(GpuSummary.from_dict(g) for g in d["gpus"]), d.get("note", ""))


_GPU_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w")


def sample_gpu(nvml: Any, handle: Any) -> dict[str, Any]:
    """One cheap reading of a GPU (clocks, temperature, power, throttle mask); a
    field the device does not support is None."""
    out: dict[str, Any] = {}
    readers = {
        "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(
            handle, getattr(nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)),
        "mem_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(
            handle, getattr(nvml, "NVML_CLOCK_MEM", _NVML_CLOCK_MEM)),
        "temperature_c": lambda: nvml.nvmlDeviceGetTemperature(
            handle, getattr(nvml, "NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU)),
        "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        "throttle_mask": lambda: _throttle_mask(nvml, handle),
    }
    for k, fn in readers.items():
        try:
            out[k] = fn()
        except Exception:
            out[k] = None
    return out


class GpuSampler:
    """Samples GPU clocks, temperature, power and throttle reasons, and CPU load and
    frequency, every ``interval_s`` seconds on a background thread.

    ::

        with GpuSampler(interval_s=1.0) as sampler:
            run_benchmark()
        ledger.store(sampler.summary().to_dict())

    A sample is taken on entry and on exit, so even a short window has two. On a
    host without NVML it samples the CPU side only (``summary().note`` says so).
    """

    def __init__(self, interval_s: float = 1.0, *, nvml: Any | None = None,
                 use_gpu: bool = True):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = float(interval_s)
        self._nvml = nvml if nvml is not None else (_default_nvml() if use_gpu else None)
        self._use_gpu = use_gpu
        self._handles: list[tuple[int, Any]] = []
        self._max_clocks: dict[int, int | None] = {}
        self._cpu: list[dict[str, float | None]] = []
        self._gpu: dict[int, list[dict[str, Any]]] = {}
        self._note = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._t0 = self._t1 = 0.0
        self._nvml_open = False
        self._error: BaseException | None = None

    def __enter__(self) -> "GpuSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("GpuSampler already started")
        if self._use_gpu and self._nvml is not None:
            try:
                self._nvml.nvmlInit()
                self._nvml_open = True
                for i in range(int(self._nvml.nvmlDeviceGetCount())):
                    h = self._nvml.nvmlDeviceGetHandleByIndex(i)
                    self._handles.append((i, h))
                    try:
                        self._max_clocks[i] = int(self._nvml.nvmlDeviceGetMaxClockInfo(
                            h, getattr(self._nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)))
                    except Exception:
                        self._max_clocks[i] = None
                    self._gpu[i] = []
                if not self._handles:
                    self._note = "NVML reports no GPU; CPU samples only"
            except Exception as exc:
                self._note = f"NVML unavailable ({type(exc).__name__}); CPU samples only"
        else:
            self._note = "GPU sampling off or pynvml missing; CPU samples only"
        psutil.cpu_percent(interval=None)  # prime: the first call has no interval
        self._t0 = time.monotonic()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._sample()
        self._t1 = time.monotonic()
        if self._nvml_open:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml_open = False

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception as exc:  # keep the first failure; summary() reports it
                self._error = self._error or exc
                return

    def _sample(self) -> None:
        try:
            freq = psutil.cpu_freq()
            freq_mhz = float(freq.current) if freq else None
        except (OSError, NotImplementedError, AttributeError):
            freq_mhz = None
        try:
            load1 = float(os.getloadavg()[0])
        except OSError:
            load1 = None
        # cpu_percent is measured since the previous call; the first sample has no
        # meaningful interval behind it.
        pct = float(psutil.cpu_percent(interval=None)) if self._cpu else None
        cpu = {"load1": load1, "cpu_percent": pct,
               "cpu_freq_mhz": freq_mhz}
        gpu = {i: sample_gpu(self._nvml, h) for i, h in self._handles}
        with self._lock:
            self._cpu.append(cpu)
            for i, s in gpu.items():
                self._gpu[i].append(s)

    @property
    def n_samples(self) -> int:
        with self._lock:
            return len(self._cpu)

    def summary(self) -> SamplerSummary:
        """min / mean / max per field (and per GPU) over the samples so far."""
        with self._lock:
            cpu_rows = list(self._cpu)
            gpu_rows = {i: list(rows) for i, rows in self._gpu.items()}
        end = self._t1 if self._t1 else time.monotonic()
        cpu = {}
        for k in ("load1", "cpu_percent", "cpu_freq_mhz"):
            st = Stat.of([r[k] for r in cpu_rows])
            if st is not None:
                cpu[k] = st
        gpus = []
        for i, rows in sorted(gpu_rows.items()):
            stats = {}
            for k in _GPU_FIELDS:
                st = Stat.of([r[k] for r in rows])
                if st is not None:
                    stats[k] = st
            seen: list[str] = []
            for r in rows:
                if r["throttle_mask"] is not None:
                    for name in decode_throttle_reasons(int(r["throttle_mask"])):
                        if name not in seen:
                            seen.append(name)
            gpus.append(GpuSummary(i, stats, tuple(seen), self._max_clocks.get(i)))
        note = self._note
        if self._error is not None:
            note = (note + "; " if note else "") + \
                f"sampling stopped early: {type(self._error).__name__}: {self._error}"
        return SamplerSummary(self.interval_s, max(0.0, end - self._t0) if self._t0 else 0.0,
                              len(cpu_rows), cpu, tuple(gpus), note)


__all__ = ["GpuSampler", "GpuSummary", "SamplerSummary", "Stat", "sample_gpu"]
