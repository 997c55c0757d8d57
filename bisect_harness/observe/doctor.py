"""``harness doctor``: this host now, a calibration probe, and what looks wrong.

:func:`doctor_report` reads the host (:func:`~bisect_harness.observe.provenance.collect_host`),
watches it idle for a contention window while sampling its GPUs, then runs the
calibration probe (:func:`~bisect_harness.observe.calibration.calibrate`) while
sampling them again; :func:`judge` turns those figures into warnings and facts.
:func:`judge` is pure: recorded figures in, the same answer out.

The probe is a full-load matrix product: on a GPU it drives the board to its power
limit, and the driver then lowers the clocks to stay under it, reporting the
``sw_power_cap`` clock-event reason (NVML's ``nvmlClocksEventReasonSwPowerCap``).
That is the probe's own doing, not a busy host: seen while the probe ran, with the
power sampled at :data:`POWER_CAP_FRACTION` of the enforced limit or above, it is a
fact of the probe, printed with its power and clocks (an idle H200 capped at 691 W
of 700 W). Everything else stays a warning: any reason seen while the GPU was idle,
before the probe; the thermal slowdowns (``sw_thermal_slowdown``,
``hw_thermal_slowdown``) and ``hw_slowdown``, which the board asserts when it is
too hot or its power supply says so; ``hw_power_brake_slowdown``, asserted by the
system from outside the GPU (a power supply or chassis brake), never by the load;
and ``sw_power_cap`` at a power well below the limit (something else capped it).
The calibration's spread is judged after its settling repetition, and where the
probe held the GPU at its power limit, on its throughput per SM clock
(:func:`~bisect_harness.observe.calibration.judged_spread`: the cap moves the clock
from one repetition to the next, and so the throughput; the work per clock cycle
stays, unless another process shares the GPU); which basis was judged is said as a
fact. Every figure beside its limit prints with the digits that show it crossed
(:func:`~bisect_harness.observe.calibration.percent_beyond`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from bisect_harness.observe.calibration import (
    POWER_CAP_FRACTION, PROBE_REASONS, Calibration, Drift, Severity, calibrate, host_warnings, judged_spread,
    percent_beyond,
)
from bisect_harness.observe.provenance import (
    SCHEMA_VERSION, GpuSampler, HostInfo, SamplerSummary, _check_schema, collect_host,
)

__all__ = ["Doctor", "POWER_CAP_FRACTION", "PROBE_REASONS", "doctor_report", "judge", "render_doctor_text"]


@dataclass(frozen=True)
class Doctor:
    """This host now: a snapshot, a calibration run under a sampler, and the
    problems found (``warnings``; ``Severity.INFO`` ones are facts, the rest make it
    not ok). ``idle_samples``: the GPUs sampled over the contention window, before
    the probe; ``samples``: while the probe ran."""

    host: HostInfo
    calibration: Calibration | None
    samples: SamplerSummary | None
    warnings: tuple[Drift, ...]
    note: str = ""
    contention: Mapping[str, Any] | None = None  # contention.Window.to_dict() of a window before calibrating
    idle_samples: SamplerSummary | None = None

    @property
    def ok(self) -> bool:
        return not any(w.severity is not Severity.INFO for w in self.warnings)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "ok": self.ok, "host": self.host.to_dict(),
                "calibration": self.calibration.to_dict() if self.calibration else None,
                "samples": self.samples.to_dict() if self.samples else None,
                "idle_samples": self.idle_samples.to_dict() if self.idle_samples else None,
                "warnings": [w.to_dict() for w in self.warnings], "note": self.note,
                "contention": dict(self.contention) if self.contention else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Doctor":
        _check_schema(d, "Doctor")
        return cls(HostInfo.from_dict(d["host"]),
                   Calibration.from_dict(d["calibration"]) if d.get("calibration") else None,
                   SamplerSummary.from_dict(d["samples"]) if d.get("samples") else None,
                   tuple(Drift.from_dict(w) for w in d["warnings"]), d.get("note", ""), d.get("contention"),
                   SamplerSummary.from_dict(d["idle_samples"]) if d.get("idle_samples") else None)


def _range(stats: Mapping[str, Any], key: str, unit: str) -> str:
    st = stats.get(key)
    return f"{st.min:.0f}-{st.max:.0f} {unit}" if st is not None else f"n/a {unit}"


def _probe_gpus(host: HostInfo, probe: SamplerSummary, clock_fraction: float) -> list[Drift]:
    """What the GPUs showed while the probe ran: its own power capping as a fact, any
    other reason (and a power cap well below the limit) as a warning, and clocks that
    never came near their maximum as a warning unless the probe's own cap held them."""
    out: list[Drift] = []
    limits = {g.index: g.power_limit_w for g in host.gpus}
    for gs in probe.gpus:
        power = gs.stats.get("power_w")
        limit = limits.get(gs.index)
        capped_by_probe = (power is not None and limit is not None and limit > 0
                           and power.max >= POWER_CAP_FRACTION * limit)
        own = [r for r in gs.active_throttle_reasons if r in PROBE_REASONS and capped_by_probe]
        other = [r for r in gs.active_throttle_reasons if r not in own]
        clocks = (f"SM {_range(gs.stats, 'sm_clock_mhz', 'MHz')} (max {gs.sm_clock_max_mhz} MHz), "
                  f"{_range(gs.stats, 'temperature_c', 'C')}")
        watts = (f"{power.max:.0f} W of its {limit:.0f} W limit" if power is not None and limit
                 else f"power {'n/a' if power is None else f'{power.max:.0f} W'}, limit {limit or 'unknown'}")
        if own:
            out.append(Drift(f"gpu[{gs.index}].probe_throttle_reasons", own, None, Severity.INFO,
                             f"GPU {gs.index} held at its power limit by the probe's own matrix product "
                             f"({', '.join(own)}): {watts}, {clocks}"))
        if other:
            out.append(Drift(f"gpu[{gs.index}].sampled_throttle_reasons", other, None, Severity.WARNING,
                             f"GPU {gs.index} was throttled during the probe: {', '.join(other)} ({watts}, "
                             f"{clocks})" + ("; sw_power_cap below its power limit: something else capped it"
                                             if "sw_power_cap" in other else "")))
        sm = gs.stats.get("sm_clock_mhz")
        if sm is not None and gs.sm_clock_max_mhz and sm.max / gs.sm_clock_max_mhz < clock_fraction:
            seen, lim = percent_beyond(sm.max / gs.sm_clock_max_mhz, clock_fraction)
            out.append(Drift(f"gpu[{gs.index}].sm_clock_max_sampled", sm.max, None,
                             Severity.INFO if own else Severity.WARNING,
                             f"GPU {gs.index} SM clock peaked at {sm.max:.0f} MHz, {seen} of its "
                             f"{gs.sm_clock_max_mhz} MHz maximum (below {lim}): "
                             + ("held there by the probe's own power capping" if own else "clocks held low")))
    return out


def judge(host: HostInfo, calibration: Calibration | None, probe: SamplerSummary | None,
          idle: SamplerSummary | None, crossings=(), *, spread_limit: float = 0.10,
          clock_fraction: float = 0.9) -> list[Drift]:
    """The doctor's warnings and facts from its figures: the host snapshot's own
    problems (``calibration.host_warnings``), GPUs throttled while idle, what the GPUs
    showed under the probe (module docstring), contention ``crossings``
    (``contention.judge`` of the window before the probe) and calibration
    measurements whose judged spread (:func:`~bisect_harness.observe.calibration.judged_spread`)
    is above ``spread_limit``. Pure."""
    out = host_warnings(host)
    for gs in idle.gpus if idle is not None else ():
        if gs.active_throttle_reasons:
            out.append(Drift(f"gpu[{gs.index}].idle_throttle_reasons", list(gs.active_throttle_reasons), None,
                             Severity.WARNING, f"GPU {gs.index} was throttled while idle, before the probe: "
                                               f"{', '.join(gs.active_throttle_reasons)}"))
    if probe is not None:
        out += _probe_gpus(host, probe, clock_fraction)
    for c in crossings:
        out.append(Drift(f"contention.{c.figure}", round(c.value, 4), None, Severity.WARNING,
                         f"host busy: {c.message}"))
    for m in calibration.measurements if calibration is not None else ():
        out += _spread_findings(m, spread_limit)
    if host.cpu_governor not in (None, "performance"):
        out.append(Drift("cpu_governor", host.cpu_governor, None, Severity.INFO,
                         f"CPU governor is {host.cpu_governor!r}, not 'performance'"))
    return out


def _spread_findings(m, spread_limit: float) -> list[Drift]:
    """A calibration measurement's spread judged against ``spread_limit``
    (:func:`~bisect_harness.observe.calibration.judged_spread`): a warning above it, and
    as a fact the basis, where it is the throughput per SM clock."""
    judged = judged_spread(m)
    out = []
    if judged.per_clock:
        _, lim = percent_beyond(judged.value, spread_limit)
        out.append(Drift(f"calibration.{m.key}.spread_basis", judged.basis, None, Severity.INFO,
                         f"calibration {m.key} judged on its {judged.basis}: {judged.why}; the throughput varied "
                         f"{judged.throughput:.1%} between its repetitions after the first, per clock "
                         f"{judged.value:.1%} (limit {lim})"))
    if judged.value > spread_limit:
        seen, lim = percent_beyond(judged.value, spread_limit)
        every, _ = percent_beyond(m.spread, spread_limit)
        what = "" if not judged.per_clock else f" in {judged.basis}"
        which = (f"its repetitions after the first (> {lim}; {every} over all {len(m.values)})"
                 if len(m.values) >= 4 else f"repetitions (> {lim})")
        out.append(Drift(f"calibration.{m.key}.spread", round(judged.value, 4), None, Severity.WARNING,
                         f"calibration {m.key} varied {seen}{what} between {which}: the host is not quiet"))
    return out


def doctor_report(*, seconds_budget: float = 3.0, device: str = "auto",
                  engine_repo: Path | None = None, sample_interval_s: float = 0.25, contention_s: float = 2.0,
                  thresholds: Any | None = None, nvml: Any | None = None,
                  probe: Callable[[str, float], Calibration] = calibrate) -> Doctor:
    """Snapshot the host, watch it for ``contention_s`` seconds (foreign CPU, pressure,
    run queue, steal, other GPU processes) while sampling its GPUs idle, calibrate it
    while sampling them again (so "clocks held low" is judged under load), and
    :func:`judge` the figures against ``thresholds`` (``contention.Thresholds``), as
    for a run's boots. ``nvml`` and ``probe`` are the seams to the hardware (the real
    ``pynvml`` and :func:`~bisect_harness.observe.calibration.calibrate` by default)."""
    from bisect_harness.observe import contention

    thresholds = thresholds or contention.Thresholds()
    host = collect_host(engine_repo, nvml=nvml)
    idle = window = None
    if contention_s > 0:
        with GpuSampler(sample_interval_s, nvml=nvml) as idle_sampler:
            window = contention.sample_host(contention_s)
        idle = idle_sampler.summary()
    with GpuSampler(sample_interval_s, nvml=nvml) as sampler:
        cal = probe(device, seconds_budget)
    samples = sampler.summary()
    crossings = contention.judge(window, thresholds) if window is not None else ()
    warnings = judge(host, cal, samples, idle, crossings, spread_limit=thresholds.calibration_spread)
    note = "" if host.gpus else host.gpu_note
    return Doctor(host, cal, samples, tuple(warnings), note or "",
                  window.to_dict() if window is not None else None, idle)


def _fmt_bytes(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def render_doctor_text(doctor: Doctor) -> str:
    """Plain text for ``harness doctor`` (no markup; safe to print through rich)."""
    h = doctor.host
    lines = [
        f"host      {h.hostname}  ({h.os}, kernel {h.kernel})",
        f"boot id   {h.boot_id or '(unknown)'}",
        f"cpu       {h.cpu_model}, {h.cpu_count_logical} logical cores, governor "
        f"{h.cpu_governor or '(no cpufreq)'}, load {h.load_avg[0]:.2f} {h.load_avg[1]:.2f} "
        f"{h.load_avg[2]:.2f}",
        f"memory    {_fmt_bytes(h.mem_available_bytes)} free of {_fmt_bytes(h.mem_total_bytes)}",
        f"python    {h.python_version}, torch {h.torch_version or '(not installed)'}"
        f" (CUDA {'available' if h.torch_cuda_available else 'not available'}"
        f"{', ' + h.torch_cuda_version if h.torch_cuda_version else ''})",
        f"packages  {h.packages_count} installed, hash {h.packages_hash[:12]}",
    ]
    if h.engine_commit or h.engine_note != "no engine repository given":
        dirty = {True: " (dirty)", False: " (clean)", None: ""}[h.engine_dirty]
        lines.append(f"engine    {h.engine_commit or '(unknown)'}{dirty}"
                     + (f"  {h.engine_note}" if h.engine_note else ""))
    if h.gpus:
        lines.append(f"gpus      {len(h.gpus)} x {h.gpus[0].name}, driver {h.driver_version}, "
                     f"CUDA {h.cuda_version}")
        for g in h.gpus:
            thr = ",".join(g.throttle_reasons) or "none"
            lines.append(
                f"  [{g.index}] SM {g.sm_clock_mhz}/{g.sm_clock_max_mhz} MHz, "
                f"mem {g.mem_clock_mhz}/{g.mem_clock_max_mhz} MHz, {g.temperature_c} C, "
                f"{g.power_w if g.power_w is None else round(g.power_w)}/"
                f"{g.power_limit_w if g.power_limit_w is None else round(g.power_limit_w)} W, "
                f"throttle {thr}, ECC {g.ecc_mode}, MIG {g.mig_mode}, "
                f"persistence {g.persistence_mode}")
    else:
        lines.append(f"gpus      none: {h.gpu_note}")
    if doctor.contention:
        from bisect_harness.observe.contention import Window, summary_line

        w = Window.from_dict(doctor.contention)
        lines.append(f"contention {summary_line(w)}")
        for p in w.details.get("top_foreign", [])[:5]:
            lines.append(f"  foreign  {p.get('command') or p['name']} (pid {p['pid']}) {p['cores']:.2f} cores")
    cal = doctor.calibration
    if cal is not None:
        lines.append(f"calibration ({cal.device}, {cal.elapsed_s:.1f} s, {cal.threads} threads)")
        for m in cal.measurements:
            steady = (f" (after the first {m.steady_spread:.2%})" if len(m.values) >= 4 else "")
            lines.append(f"  {m.key:<16} {m.median:>12.1f} {m.unit:<8} spread {m.spread:.2%}{steady}"
                         f"  [{m.detail}]")
        if cal.note:
            lines.append(f"  note: {cal.note}")
    for label, s in (("idle", doctor.idle_samples), ("probe", doctor.samples)):
        if s is None:
            continue
        cpu = ", ".join(f"{k} {v.min:.1f}/{v.mean:.1f}/{v.max:.1f}" for k, v in s.cpu.items())
        lines.append(f"sampled   {label}: {s.n_samples} samples over {s.duration_s:.1f} s (min/mean/max): {cpu}")
        for g in s.gpus:
            st = ", ".join(f"{k} {v.min:.0f}/{v.mean:.0f}/{v.max:.0f}" for k, v in g.stats.items())
            lines.append(f"  [{g.index}] {st}; throttle seen: "
                         f"{','.join(g.throttle_reasons_seen) or 'none'}")
    facts = [w for w in doctor.warnings if w.severity is Severity.INFO]
    warned = [w for w in doctor.warnings if w.severity is not Severity.INFO]
    if facts:
        lines.append("facts")
        lines += [f"  {w.message}" for w in facts]
    if warned:
        lines.append("warnings")
        lines += [f"  {w.severity.value:<8} {w.message}" for w in warned]
    else:
        lines.append("warnings  none")
    if doctor.note:
        lines.append(f"note      {doctor.note}")
    lines.append("doctor    " + ("ok" if doctor.ok else f"not ok ({len(warned)} warning(s))"))
    return "\n".join(lines) + "\n"


