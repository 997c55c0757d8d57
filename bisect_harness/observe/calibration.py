"""How fast is this machine right now, and did it differ between two sides?

* :func:`calibrate` runs a short, fixed torch workload -- a matmul (GFLOP/s) and a
  memory copy (GB/s) per GPU, an all-reduce across GPUs when there are several,
  or the CPU versions on a host without GPUs -- repeated, with median and spread.
  The workload sizes are fixed per device kind, so two calibrations of the same
  kind are comparable; only the number of repetitions adapts to the time budget.
* :func:`compare_hosts` lists each :class:`Drift` between the two sides of a
  comparison: driver, CUDA, boot id, kernel, GPU model, packages, governor,
  calibration beyond a threshold, and on either side clocks held low or
  throttle reasons active.
* :func:`steady_spread` is how much a probe's repetitions varied once it settled,
  the figure judged against ``calibration_spread`` (``harness doctor``, a run's
  calibrations; see its docstring for why the first repetition is left out);
  :func:`percent_beyond` prints a figure and its limit with the digits that show
  which side of the limit it is.
* :func:`judged_spread` is the spread that is judged: on a GPU the probe's repetitions
  carry the SM clock, power and clock-event reasons NVML read while each ran
  (:class:`RepReading`); where the probe itself held the board at its power limit
  (``sw_power_cap`` at :data:`POWER_CAP_FRACTION` of the limit, and no other reason),
  the driver's lowering of the clock is the probe's own doing, so the spread judged is
  that of the throughput per SM clock; anything else (another process on the GPU, a
  clock held low from outside, a thermal slowdown) is judged on the throughput.

Example::

    cal = calibrate(seconds_budget=3.0)
    print(cal.get("matmul").median, cal.get("matmul").unit)
    for d in compare_hosts(host_a, host_b, cal_a, cal_b):
        print(d.severity.value, d.message)
"""

from __future__ import annotations

import enum
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from bisect_harness.errors import UserError
from bisect_harness.model import jsonable
from bisect_harness.secrets import redact_env
from bisect_harness.process.ports import free_port
from bisect_harness.observe.probe_trace import RepReading, RepTrace
from bisect_harness.observe.provenance import SCHEMA_VERSION, HostInfo, SamplerSummary, _check_schema

#: Fixed workload sizes: changing them makes old calibrations incomparable, so a
#: calibration records them in each measurement's ``detail``.
CPU_MATMUL_N = 512
CPU_COPY_BYTES = 64 * 2**20
GPU_MATMUL_N = 8192
GPU_COPY_BYTES = 1024 * 2**20
ALLREDUCE_BYTES = 256 * 2**20
CPU_ALLREDUCE_BYTES = 16 * 2**20

#: The probes whose work per SM clock cycle is fixed (compute-bound): only their spread may be
#: judged per clock. A copy is bound by memory, not the SM clock: on an idle H100 a capped
#: memcpy's throughput spread 0.1% and its throughput per SM clock 4.6%.
PER_CLOCK_PROBES = frozenset({"matmul"})

#: Clock-event reasons a full-load probe causes by itself (NVML names, as decoded by
#: ``provenance.decode_throttle_reasons``): the driver holding the board at its power limit.
PROBE_REASONS = frozenset({"sw_power_cap"})

#: The probe's own power capping: its sampled power reached this share of the enforced
#: limit. NVML's power reading is averaged over about a second, so a capped board reads
#: a little below its limit (691 W of 700 W, 98.7%); well below it, something else capped it.
POWER_CAP_FRACTION = 0.9



# ------------------------------------------------------------------ measurements


@dataclass(frozen=True)
class Measurement:
    """One calibrated quantity: the per-repetition rates, their median and their
    relative spread ``(max - min) / median``. On a GPU, ``reps`` holds what NVML read
    while each repetition ran (one :class:`RepReading` per value) and ``power_limit_w``
    the board's enforced power limit; both are empty where they were not read (a CPU,
    no NVML, an older record)."""

    name: str            # matmul | memcpy | allreduce
    device: str          # cpu | cuda:0 | cuda:0-7 (an all-reduce over GPUs 0..7)
    unit: str            # GFLOP/s | GB/s
    median: float
    spread: float
    values: tuple[float, ...]
    detail: str = ""     # the fixed workload, e.g. "n=512 float32, 8 ops/rep"
    reps: tuple[RepReading, ...] = ()
    power_limit_w: float | None = None

    @property
    def key(self) -> str:
        return f"{self.name}@{self.device}"

    @property
    def steady_spread(self) -> float:
        """:func:`steady_spread` of the repetitions: the figure judged against a limit."""
        return steady_spread(self.values)

    @classmethod
    def of(cls, name: str, device: str, unit: str, values: Sequence[float],
           detail: str = "") -> "Measurement":
        vals = tuple(float(v) for v in values)
        if not vals:
            raise ValueError(f"no values for {name}@{device}")
        med = statistics.median(vals)
        spread = (max(vals) - min(vals)) / med if med > 0 else float("inf")
        return cls(name, device, unit, med, spread, vals, detail)

    def with_reps(self, reps: Sequence[RepReading], power_limit_w: float | None) -> "Measurement":
        """This measurement with what NVML read during its repetitions."""
        return Measurement(self.name, self.device, self.unit, self.median, self.spread, self.values, self.detail,
                           tuple(reps), power_limit_w)

    def to_dict(self) -> dict:
        out = {"name": self.name, "device": self.device, "unit": self.unit,
               "median": self.median, "spread": self.spread, "values": list(self.values),
               "detail": self.detail}
        if self.reps:
            out.update(reps=[r.to_dict() for r in self.reps], power_limit_w=self.power_limit_w)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Measurement":
        return cls(d["name"], d["device"], d["unit"], d["median"], d["spread"],
                   tuple(d["values"]), d.get("detail", ""),
                   tuple(RepReading.from_dict(r) for r in d.get("reps") or ()), d.get("power_limit_w"))


def steady_spread(values: Sequence[float]) -> float:
    """How much a probe's repetitions varied once it settled: ``(max - min) / median``
    of the repetitions after the first, where four or more ran (of all of them else).

    The first timed repetition is the probe's own settling, not the host: a GPU runs
    the first few hundred milliseconds of a full-load matrix product at its boost
    clock, until its power controller pulls the clock down to the power limit
    (``sw_power_cap``), so that repetition can come out faster by up to the boost's
    margin over the capped clock; a CPU's first repetition carries the frequency ramp. The warm-up op before it pays for allocation and kernel choice but is too
    short for the power controller. A host that is not quiet (another process on the
    GPU or the cores) slows repetitions anywhere in the run, so it still shows in the
    later ones, and in the same unit as before: a range over a median, judged against
    the same ``calibration_spread``. The range, not a deviation, because a single slow
    repetition among the settled ones is what contention looks like and should count.
    ``(max - min) / median`` of all repetitions stays recorded as ``spread``."""
    vals = [float(v) for v in values]
    settled = vals[1:] if len(vals) >= 4 else vals
    if not settled:
        return float("nan")
    med = statistics.median(settled)
    return (max(settled) - min(settled)) / med if med > 0 else float("inf")


@dataclass(frozen=True)
class JudgedSpread:
    """The spread a measurement is judged by, and on what: ``basis`` is ``throughput``
    (:func:`steady_spread` of the rates) or ``throughput per SM clock`` (of each rate
    over its repetition's mean SM clock, where the probe held the GPU at its power
    limit); ``throughput`` is the rates' own steady spread either way, and ``why`` says
    what the readings showed (empty on the throughput basis with no readings)."""

    value: float
    basis: str
    throughput: float
    why: str = ""

    @property
    def per_clock(self) -> bool:
        return self.basis == PER_CLOCK


PER_CLOCK = "throughput per SM clock"


def judged_spread(m: "Measurement", cap_fraction: float = POWER_CAP_FRACTION) -> JudgedSpread:
    """The spread of ``m`` that is judged against ``calibration_spread``.

    Under a full-load matrix product a GPU's driver lowers the SM clock to hold the
    board at its power limit, and it keeps moving it: an idle H100's repetitions read
    724, 707, 701 and 625 TFLOP/s as the cap bit. The probe then measures its own
    power management, not the host. So where every settled repetition (the ones
    :func:`steady_spread` reads) has NVML readings, showed no clock-event reason but
    the probe's own (:data:`PROBE_REASONS`), and at least one showed ``sw_power_cap``
    at ``cap_fraction`` of the enforced limit or above, the spread judged is that of
    the throughput per SM clock: the work a clock cycle did, which the cap does not
    change and which another process sharing the GPU (time-sliced: fewer cycles for
    the probe) still lowers. Anything else (no readings, a thermal or hardware
    slowdown, ``sw_power_cap`` well below the limit: something else capped it) is
    judged on the throughput, as before; so is a probe whose work per cycle is not fixed
    (a memory copy: :data:`PER_CLOCK_PROBES`)."""
    raw = steady_spread(m.values)
    if not m.reps or len(m.reps) != len(m.values) or m.name not in PER_CLOCK_PROBES:
        return JudgedSpread(raw, "throughput", raw)
    settled = list(range(1, len(m.values))) if len(m.values) >= 4 else list(range(len(m.values)))
    reps = [m.reps[i] for i in settled]
    if any(r.readings == 0 or not r.sm_clock_mhz for r in reps):
        return JudgedSpread(raw, "throughput", raw, "NVML read no clock during some repetitions")
    others = sorted({x for r in reps for x in r.reasons if x not in PROBE_REASONS and x != "gpu_idle"})
    if others:
        return JudgedSpread(raw, "throughput", raw, f"clock-event reasons beyond the probe's own: {', '.join(others)}")
    capped = [r for r in reps if "sw_power_cap" in r.reasons]
    if not capped:
        return JudgedSpread(raw, "throughput", raw, "the probe did not reach its power limit")
    limit = m.power_limit_w
    top = max((r.power_w for r in capped if r.power_w is not None), default=None)
    if not limit or top is None or top < cap_fraction * limit:
        at = f"{top:.0f} W" if top is not None else "an unknown power"
        return JudgedSpread(raw, "throughput", raw, f"sw_power_cap at {at}, below {cap_fraction:.0%} of "
                                                    f"{'its limit' if not limit else f'its {limit:.0f} W limit'}: "
                                                    "something else capped it")
    per_clock = steady_spread([v / m.reps[i].sm_clock_mhz for i, v in enumerate(m.values)])
    clocks = [r.sm_clock_mhz for r in reps]
    return JudgedSpread(per_clock, PER_CLOCK, raw,
                        f"the probe held the GPU at its power limit (sw_power_cap, {top:.0f} W of {limit:.0f} W; "
                        f"SM clock {min(clocks):.0f}-{max(clocks):.0f} MHz over the repetitions)")


def percent_beyond(value: float, limit: float) -> tuple[str, str]:
    """``value`` and ``limit`` as percentages with as few decimals as tell them apart
    (``("10.4%", "10%")``, never ``("10%", "10%")``): a figure printed beside the limit
    it crossed shows that it did. The limit is printed as it is set."""
    lim = f"{limit * 100:.6f}".rstrip("0").rstrip(".") + "%"
    for digits in range(0, 7):
        if round(value * 100, digits) != round(limit * 100, digits):
            return f"{value * 100:.{digits}f}%", lim
    return f"{value * 100:.6f}%", lim


@dataclass(frozen=True)
class Calibration:
    """The result of :func:`calibrate`. ``elapsed_s`` includes warm-up and, for an
    all-reduce, the start of its worker processes."""

    device: str                      # cpu | cuda
    measurements: tuple[Measurement, ...]
    seconds_budget: float
    elapsed_s: float
    torch_version: str
    threads: int
    nccl_env: Mapping[str, str] = field(default_factory=dict)
    note: str = ""

    def get(self, name: str, device: str | None = None) -> Measurement:
        """The first measurement called ``name`` (on ``device`` when given)."""
        for m in self.measurements:
            if m.name == name and (device is None or m.device == device):
                return m
        raise KeyError(f"{name}@{device}" if device else name)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "device": self.device,
                "measurements": [m.to_dict() for m in self.measurements],
                "seconds_budget": self.seconds_budget, "elapsed_s": self.elapsed_s,
                "torch_version": self.torch_version, "threads": self.threads,
                "nccl_env": dict(self.nccl_env), "note": self.note}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Calibration":
        _check_schema(d, "Calibration")
        return cls(d["device"], tuple(Measurement.from_dict(m) for m in d["measurements"]),
                   d["seconds_budget"], d["elapsed_s"], d["torch_version"], d["threads"],
                   dict(d.get("nccl_env", {})), d.get("note", ""))


def _time_op(op: Callable[[], Any], sync: Callable[[], None], budget_s: float,
             repeats: int, min_repeats: int = 4,
             on_rep: Callable[[float, float], None] | None = None) -> tuple[list[float], int]:
    """Seconds per op over up to ``repeats`` repetitions within ``budget_s``.

    Two warm-up ops (the second timed) size the repetitions: each runs ``inner`` ops so that all
    repetitions together take about the budget. At least ``min_repeats`` run, so
    the spread after the settling repetition (:func:`steady_spread`) is defined even
    when one op alone exceeds the budget.
    ``on_rep(start, end)`` is told each repetition's ``perf_counter`` span.
    Returns ``(seconds_per_op for each repetition, inner)``.
    """
    t_start = time.perf_counter()
    op()  # warm-up: allocations, thread pools, kernel selection
    sync()
    t0 = time.perf_counter()
    op()
    sync()
    first = max(time.perf_counter() - t0, 1e-7)
    remaining = max(budget_s - (time.perf_counter() - t_start), 0.0)
    inner = int(max(1, min(1000, (remaining / max(repeats, 1)) / first)))
    start = time.perf_counter()
    per_op: list[float] = []
    while len(per_op) < repeats:
        t = time.perf_counter()
        for _ in range(inner):
            op()
        sync()
        end = time.perf_counter()
        dt = end - t
        per_op.append(dt / inner)
        if on_rep is not None:
            on_rep(t, end)
        spent = time.perf_counter() - start
        if len(per_op) >= min_repeats and spent + dt > remaining:
            break
    return per_op, inner


def _allreduce_worker(rank: int, world_size: int, port: int, backend: str, numel: int,
                      budget_s: float, repeats: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        sync = torch.cuda.synchronize
    else:
        dev = torch.device("cpu")

        def sync() -> None:
            return None
    extra = {"device_id": dev} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world_size, **extra)
    try:
        x = torch.ones(numel, dtype=torch.float32, device=dev)

        def op() -> None:
            dist.all_reduce(x)

        # Every rank must run the same number of ops: rank 0 decides the plan from
        # its second warm-up op (the first pays for communicator set-up) and
        # broadcasts it.
        op()
        sync()
        t0 = time.perf_counter()
        op()
        sync()
        first = max(time.perf_counter() - t0, 1e-7)
        plan = torch.tensor([max(1, min(1000, int(budget_s / max(repeats, 1) / first)))],
                            dtype=torch.int64, device=dev)
        dist.broadcast(plan, 0)
        inner = int(plan.item())
        per_op = []
        for _ in range(repeats):
            dist.barrier()
            t = time.perf_counter()
            for _ in range(inner):
                op()
            sync()
            per_op.append((time.perf_counter() - t) / inner)
        if rank == 0:
            Path(out_path).write_text(json.dumps({"per_op": per_op, "inner": inner}))
    finally:
        dist.destroy_process_group()


def allreduce_bandwidth(world_size: int, *, backend: str = "nccl",
                        size_bytes: int | None = None, seconds_budget: float = 1.0,
                        repeats: int = 5) -> Measurement:
    """Bus bandwidth (GB/s, as nccl-tests defines it: ``size * 2(n-1)/n / time``)
    of an all-reduce of float32 across ``world_size`` processes on this host,
    spawned with ``torch.multiprocessing.spawn`` and rendezvous on
    ``tcp://127.0.0.1``. ``backend`` ``nccl`` uses GPUs 0..n-1; ``gloo`` runs on
    the CPU. The workers inherit this process's environment unchanged
    (``NCCL_NVLS_ENABLE`` and friends apply as set)."""
    import torch.multiprocessing as mp

    if world_size < 2:
        raise ValueError("an all-reduce needs at least 2 processes")
    if size_bytes is None:
        size_bytes = ALLREDUCE_BYTES if backend == "nccl" else CPU_ALLREDUCE_BYTES
    numel = size_bytes // 4
    with tempfile.TemporaryDirectory(prefix="allreduce-") as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(_allreduce_worker,
                 args=(world_size, free_port(), backend, numel, seconds_budget, repeats, out),
                 nprocs=world_size, join=True)
        result = json.loads(Path(out).read_text())
    factor = 2 * (world_size - 1) / world_size
    rates = [numel * 4 * factor / t / 1e9 for t in result["per_op"]]
    device = f"cuda:0-{world_size - 1}" if backend == "nccl" else f"cpu:x{world_size}"
    return Measurement.of("allreduce", device, "GB/s", rates,
                          f"{numel * 4 // 2**20} MiB float32, {backend}, "
                          f"{world_size} ranks, {result['inner']} ops/rep")


def _cpu_measurements(budget_s: float, repeats: int) -> list[Measurement]:
    import torch

    n = CPU_MATMUL_N
    a = torch.randn(n, n, dtype=torch.float32)
    b = torch.randn(n, n, dtype=torch.float32)
    c = torch.empty(n, n, dtype=torch.float32)
    per_op, inner = _time_op(lambda: torch.mm(a, b, out=c), lambda: None, budget_s / 2, repeats)
    mm = Measurement.of("matmul", "cpu", "GFLOP/s", [2 * n**3 / t / 1e9 for t in per_op],
                        f"n={n} float32, {inner} ops/rep")
    numel = CPU_COPY_BYTES // 4
    src = torch.ones(numel, dtype=torch.float32)
    dst = torch.zeros_like(src)  # touched now, so no page faults inside the timing
    # One thread: a copy split over the cores is the probe's own noise, not the host's. On a
    # quiet 2-core VM two threads' repetitions jumped between ~30 and ~44 GB/s (spreads up
    # to 34% after the first), one thread's stayed within 1-6%; the matmul above uses
    # every core and so still sees a neighbour on any of them.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        per_op, inner = _time_op(lambda: dst.copy_(src), lambda: None, budget_s / 2, repeats)
    finally:
        torch.set_num_threads(threads)
    cp = Measurement.of("memcpy", "cpu", "GB/s", [2 * numel * 4 / t / 1e9 for t in per_op],
                        f"{CPU_COPY_BYTES // 2**20} MiB, read+written bytes, one thread, {inner} ops/rep")
    return [mm, cp]


def _gpu_measurements(index: int, budget_s: float, repeats: int, nvml: Any | None = None) -> list[Measurement]:
    import torch

    dev = torch.device("cuda", index)

    def sync() -> None:
        torch.cuda.synchronize(dev)
    n = GPU_MATMUL_N
    with torch.cuda.device(dev), RepTrace(index, nvml) as trace:
        a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
        b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
        c = torch.empty(n, n, dtype=torch.bfloat16, device=dev)
        per_op, inner = _time_op(lambda: torch.mm(a, b, out=c), sync, budget_s / 2, repeats, on_rep=trace.span)
        mm = Measurement.of("matmul", f"cuda:{index}", "GFLOP/s",
                            [2 * n**3 / t / 1e9 for t in per_op],
                            f"n={n} bfloat16, {inner} ops/rep")
        mm = mm.with_reps(trace.readings(), trace.power_limit_w) if trace.power_limit_w is not None else mm
        del a, b, c
        numel = GPU_COPY_BYTES // 4
        src = torch.empty(numel, dtype=torch.float32, device=dev).fill_(1.0)
        dst = torch.empty_like(src)
        first = len(per_op)
        per_op, inner = _time_op(lambda: dst.copy_(src), sync, budget_s / 2, repeats, on_rep=trace.span)
        cp = Measurement.of("memcpy", f"cuda:{index}", "GB/s",
                            [2 * numel * 4 / t / 1e9 for t in per_op],
                            f"{GPU_COPY_BYTES // 2**20} MiB device-to-device, read+written bytes, "
                            f"{inner} ops/rep")
        cp = cp.with_reps(trace.readings(first), trace.power_limit_w) if trace.power_limit_w is not None else cp
        del src, dst
        torch.cuda.empty_cache()
    return [mm, cp]


def calibrate(device: str = "auto", seconds_budget: float = 3.0, *,
              repeats: int = 5) -> Calibration:
    """Measure this machine with a short fixed workload.

    ``device``: ``auto`` (GPUs when torch sees any, else the CPU), ``cpu`` or
    ``cuda``. ``seconds_budget`` bounds the timed repetitions (split evenly over
    the workloads); warm-up ops and, with several GPUs, the start of the
    all-reduce processes come on top. Each measurement reports the median rate
    over at most ``repeats`` repetitions (at least 4: :func:`steady_spread` judges the
    three after the first) and its relative spread.
    """
    import torch

    if seconds_budget <= 0:
        raise UserError(f"seconds_budget must be positive, got {seconds_budget}")
    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"calibration device must be auto, cpu or cuda, got {device!r}")
    has_cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if device == "cuda" and not has_cuda:
        raise UserError("calibration on cuda was asked for but torch sees no GPU; "
                        "use device='cpu' or 'auto'")
    kind = "cuda" if (device == "cuda" or (device == "auto" and has_cuda)) else "cpu"
    t0 = time.perf_counter()
    notes: list[str] = []
    measurements: list[Measurement] = []
    if kind == "cpu":
        measurements += _cpu_measurements(seconds_budget, repeats)
    else:
        count = torch.cuda.device_count()
        parts = count + (1 if count > 1 else 0)
        share = seconds_budget / parts
        for i in range(count):
            measurements += _gpu_measurements(i, share, repeats)
        if count > 1:
            try:
                measurements.append(allreduce_bandwidth(count, backend="nccl",
                                                        seconds_budget=share, repeats=repeats))
            except Exception as exc:  # recorded: a broken all-reduce is itself a finding
                notes.append(f"all-reduce across {count} GPUs failed: {type(exc).__name__}: {exc}")
    return Calibration(
        device=kind, measurements=tuple(measurements), seconds_budget=seconds_budget,
        elapsed_s=time.perf_counter() - t0, torch_version=torch.__version__,
        threads=torch.get_num_threads(),
        nccl_env=redact_env({k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}),
        note="; ".join(notes))


# -------------------------------------------------------------------------- drift


class Severity(str, enum.Enum):
    """How much a drift undermines a comparison."""

    INFO = "info"            # worth knowing; rarely changes a number
    WARNING = "warning"      # may explain a difference; read before trusting a verdict
    CRITICAL = "critical"    # the two sides ran on different hardware


@dataclass(frozen=True)
class Drift:
    """One way the two sides of a comparison differed (or one side was unhealthy:
    then the other side's value is None)."""

    field: str
    a: Any
    b: Any
    severity: Severity
    message: str

    def to_dict(self) -> dict:
        return {"field": self.field, "a": jsonable(self.a), "b": jsonable(self.b),
                "severity": self.severity.value, "message": self.message}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Drift":
        return cls(d["field"], d["a"], d["b"], Severity(d["severity"]), d["message"])


def host_warnings(host: HostInfo, samples: SamplerSummary | None = None, *,
                  clock_fraction: float = 0.9, side: str = "") -> list[Drift]:
    """Problems of one host on its own: throttle reasons active (other than an idle
    GPU), a dirty engine worktree, and -- from a sampling window under load -- an
    SM clock that never reached ``clock_fraction`` of its maximum. With ``side``
    ``"a"`` or ``"b"`` the value is placed on that side of each :class:`Drift`."""
    out: list[Drift] = []
    label = f"side {side.upper()}: " if side else ""

    def drift(fld: str, value: Any, severity: Severity, message: str) -> Drift:
        a, b = (None, value) if side == "b" else (value, None)
        return Drift(fld, a, b, severity, label + message)

    for g in host.gpus:
        if g.active_throttle_reasons:
            out.append(drift(f"gpu[{g.index}].throttle_reasons", list(g.active_throttle_reasons),
                             Severity.WARNING,
                             f"GPU {g.index} clocks limited by {', '.join(g.active_throttle_reasons)}"))
    if host.engine_dirty:
        out.append(drift("engine_dirty", True, Severity.WARNING,
                         "engine worktree had uncommitted changes; the commit alone does not "
                         "say what ran"))
    if samples is not None:
        for gs in samples.gpus:
            if gs.active_throttle_reasons:
                out.append(drift(f"gpu[{gs.index}].sampled_throttle_reasons",
                                 list(gs.active_throttle_reasons), Severity.WARNING,
                                 f"GPU {gs.index} was throttled during sampling: "
                                 f"{', '.join(gs.active_throttle_reasons)}"))
            sm = gs.stats.get("sm_clock_mhz")
            if sm is not None and gs.sm_clock_max_mhz:
                ratio = sm.max / gs.sm_clock_max_mhz
                if ratio < clock_fraction:
                    out.append(drift(f"gpu[{gs.index}].sm_clock_max_sampled", sm.max,
                                     Severity.WARNING,
                                     f"GPU {gs.index} SM clock peaked at {sm.max:.0f} MHz, "
                                     f"{ratio:.0%} of its {gs.sm_clock_max_mhz} MHz maximum "
                                     f"(below {clock_fraction:.0%}): clocks held low"))
    return out


def _rel(a: float, b: float) -> float:
    return (b - a) / a if a else float("inf")


def compare_hosts(a: HostInfo, b: HostInfo, cal_a: Calibration | None,
                  cal_b: Calibration | None, *, threshold: float = 0.05,
                  samples_a: SamplerSummary | None = None,
                  samples_b: SamplerSummary | None = None,
                  clock_fraction: float = 0.9) -> list[Drift]:
    """Every way side B's host differed from side A's, plus each side's own problems
    (:func:`host_warnings`). Identical healthy hosts give an empty list.

    Calibration measurements present on both sides are compared by median; a
    relative change beyond ``threshold`` is a drift, whose message gives both
    spreads so a reader can tell a noisy calibration from a slower machine.
    """
    out: list[Drift] = []

    def cmp(fld: str, va: Any, vb: Any, severity: Severity, what: str) -> None:
        if va is None or vb is None or va == vb:
            return
        out.append(Drift(fld, va, vb, severity, f"{what} changed: {va} -> {vb}"))

    cmp("boot_id", a.boot_id, b.boot_id, Severity.WARNING,
        "host boot id (the host or container was rebooted between the sides)")
    cmp("hostname", a.hostname, b.hostname, Severity.WARNING, "hostname")
    cmp("kernel", a.kernel, b.kernel, Severity.WARNING, "kernel")
    cmp("os", a.os, b.os, Severity.INFO, "OS")
    cmp("cpu_model", a.cpu_model, b.cpu_model, Severity.WARNING, "CPU model")
    cmp("cpu_governor", a.cpu_governor, b.cpu_governor, Severity.WARNING, "CPU governor")
    cmp("python_version", a.python_version, b.python_version, Severity.WARNING, "Python")
    cmp("torch_version", a.torch_version, b.torch_version, Severity.WARNING, "torch")
    cmp("packages_hash", a.packages_hash[:12], b.packages_hash[:12], Severity.WARNING,
        "installed packages (hash of name==version)")
    cmp("driver_version", a.driver_version, b.driver_version, Severity.WARNING, "GPU driver")
    cmp("cuda_version", a.cuda_version, b.cuda_version, Severity.WARNING, "CUDA driver version")
    if len(a.gpus) != len(b.gpus):
        out.append(Drift("gpu_count", len(a.gpus), len(b.gpus), Severity.CRITICAL,
                         f"GPU count changed: {len(a.gpus)} -> {len(b.gpus)}"))
    for ga, gb in zip(a.gpus, b.gpus):
        i = ga.index
        cmp(f"gpu[{i}].name", ga.name, gb.name, Severity.CRITICAL, f"GPU {i} model")
        cmp(f"gpu[{i}].uuid", ga.uuid, gb.uuid, Severity.INFO, f"GPU {i} (another physical device)")
        cmp(f"gpu[{i}].sm_clock_max_mhz", ga.sm_clock_max_mhz, gb.sm_clock_max_mhz,
            Severity.WARNING, f"GPU {i} max SM clock")
        cmp(f"gpu[{i}].power_limit_w", ga.power_limit_w, gb.power_limit_w, Severity.WARNING,
            f"GPU {i} power limit")
        cmp(f"gpu[{i}].ecc_mode", ga.ecc_mode, gb.ecc_mode, Severity.WARNING, f"GPU {i} ECC mode")
        cmp(f"gpu[{i}].mig_mode", ga.mig_mode, gb.mig_mode, Severity.WARNING, f"GPU {i} MIG mode")
        cmp(f"gpu[{i}].persistence_mode", ga.persistence_mode, gb.persistence_mode,
            Severity.INFO, f"GPU {i} persistence mode")
    out += host_warnings(a, samples_a, clock_fraction=clock_fraction, side="a")
    out += host_warnings(b, samples_b, clock_fraction=clock_fraction, side="b")

    if cal_a is not None and cal_b is not None:
        if cal_a.device != cal_b.device:
            out.append(Drift("calibration.device", cal_a.device, cal_b.device, Severity.WARNING,
                             f"calibrated on {cal_a.device} vs {cal_b.device}: not comparable"))
        else:
            mb = {m.key: m for m in cal_b.measurements}
            for ma in cal_a.measurements:
                other = mb.get(ma.key)
                if other is None or ma.detail.split(",")[0] != other.detail.split(",")[0]:
                    continue
                change = _rel(ma.median, other.median)
                if abs(change) > threshold:
                    out.append(Drift(
                        f"calibration.{ma.key}", round(ma.median, 3), round(other.median, 3),
                        Severity.WARNING,
                        f"{ma.key} {change:+.1%} ({ma.median:.4g} -> {other.median:.4g} {ma.unit}; "
                        f"beyond {threshold:.0%}; spreads {ma.spread:.1%} and {other.spread:.1%})"))
    return out


__all__ = [
    "Calibration", "Drift", "Measurement", "Severity", "allreduce_bandwidth", "calibrate", "compare_hosts",
    "host_warnings", "percent_beyond", "steady_spread",
]
