"""``harness doctor`` on recorded figures: an idle H200 whose own probe power-caps it is ok,
an idle H100 whose probe's repetitions the power cap spreads by 9-14% is ok judged per SM
clock (its own records), a GPU shared with a second process still warns,
with the cap said as a fact of the probe; what the probe does not cause stays a warning;
every figure beside its limit prints with the digits that show it crossed.

The H200's figures are those of the report behind this test: one GPU, idle before the
probe, 691 W of its 700 W limit and ``sw_power_cap`` while the probe's matrix product
ran, a matmul spread of 0.1045 over its five repetitions, every contention figure 0.
The report gave the spread, not the five rates: the rates here are five that give it,
the first one the fast one (the boost clock before the power cap engaged).
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from pathlib import Path

from bisect_harness.observe import contention
from bisect_harness.observe.calibration import (Calibration, Measurement, RepReading, judged_spread, percent_beyond,
                                              steady_spread)
from bisect_harness.observe.doctor import Doctor, doctor_report, judge, render_doctor_text
from bisect_harness.observe.host_state import calibration_spreads
from bisect_harness.observe.provenance import GpuSummary, SamplerSummary, Stat
from test_calibration import gpu, host
from test_provenance import FakeNvml, fake_gpu

H200_MATMUL = (757.3, 685.4, 690.1, 686.0, 688.2)  # TFLOP/s x 1000: spread 0.1045, the first the fast one
GPU_IDLE, SW_POWER_CAP, HW_THERMAL = 0x1, 0x4, 0x40


def h200_probe(device: str, seconds: float) -> Calibration:
    return Calibration("cuda", (
        Measurement.of("matmul", "cuda:0", "GFLOP/s", H200_MATMUL, "n=8192 bfloat16, 190 ops/rep"),
        Measurement.of("memcpy", "cuda:0", "GB/s", (3911.0, 3902.5, 3915.2, 3909.8, 3907.1),
                       "1024 MiB device-to-device, read+written bytes, 25 ops/rep")),
        seconds, seconds + 0.8, "2.5.1+cu124", 16)


class H200:
    """An H200 as NVML reports it: idle (gpu_idle, 75 W, 345 MHz) until the probe runs,
    then power-capped by it (sw_power_cap, 691 W of 700 W, SM 1755 MHz)."""

    def __init__(self, *, idle_mask=GPU_IDLE, load_mask=SW_POWER_CAP, load_mw=691_000):
        self.loaded = threading.Event()
        self.idle_mask, self.load_mask, self.load_mw = idle_mask, load_mask, load_mw
        state = lambda idle, load: (lambda: load if self.loaded.is_set() else idle)  # noqa: E731
        self.nvml = FakeNvml([fake_gpu(sm=state(345, 1755), power_mw=state(75_000, load_mw), temp=state(31, 52),
                                       mask=state(idle_mask, load_mask))])

    def probe(self, device: str, seconds: float) -> Calibration:
        self.loaded.set()
        try:
            time.sleep(0.3)  # the sampler reads the loaded GPU
            return h200_probe(device, seconds)
        finally:
            self.loaded.clear()


#: contention is judged on this shared host by its own figures; the H200's were all 0,
#: so only the calibration spread's limit is the default here
NOT_JUDGED = contention.Thresholds(**{name: 1e9 for name in contention.Thresholds.names()
                                      if name != "calibration_spread"})


def test_the_doctor_on_an_idle_h200_whose_probe_power_caps_it_reports_ok_with_its_figures():
    gpu_ = H200()
    doctor = doctor_report(seconds_budget=3.0, nvml=gpu_.nvml, probe=gpu_.probe, contention_s=0.3,
                           sample_interval_s=0.05, thresholds=NOT_JUDGED)
    text = render_doctor_text(doctor)
    assert doctor.ok, text
    facts = [w.message for w in doctor.warnings if w.severity.value == "info"]
    assert any("GPU 0 held at its power limit by the probe's own matrix product (sw_power_cap): 691 W of its "
               "700 W limit, SM 345-1755 MHz (max 1980 MHz)" in f for f in facts), facts
    assert "sw_power_cap" in doctor.samples.gpus[0].throttle_reasons_seen
    assert doctor.idle_samples.gpus[0].throttle_reasons_seen == ("gpu_idle",)
    # the spread is recorded as measured, and judged once the probe settled
    assert re.search(r"matmul@cuda:0 .* spread 10\.4[45]% \(after the first 0\.68%\)", text), text
    assert text.endswith("doctor    ok\n")
    assert Doctor.from_dict(json.loads(json.dumps(doctor.to_dict()))) == doctor


def test_what_the_probe_does_not_cause_stays_a_warning():
    for gpu_, expected in ((H200(idle_mask=SW_POWER_CAP), "GPU 0 was throttled while idle, before the probe: "
                                                          "sw_power_cap"),
                           (H200(load_mask=SW_POWER_CAP | HW_THERMAL), "GPU 0 was throttled during the probe: "
                                                                       "hw_thermal_slowdown"),
                           (H200(load_mw=420_000), "sw_power_cap below its power limit: something else capped it")):
        doctor = doctor_report(nvml=gpu_.nvml, probe=gpu_.probe, contention_s=0.3, sample_interval_s=0.05,
                               thresholds=NOT_JUDGED)
        warned = [w.message for w in doctor.warnings if w.severity.value != "info"]
        assert not doctor.ok and any(expected in w for w in warned), warned


def test_a_spread_that_crosses_its_limit_prints_the_digits_that_show_it():
    assert percent_beyond(0.1045, 0.10) in (("10.4%", "10%"), ("10.5%", "10%"))
    assert percent_beyond(0.10004, 0.10) == ("10.004%", "10%")
    assert percent_beyond(0.25, 0.10) == ("25%", "10%")
    assert percent_beyond(0.0996, 0.10) == ("9.96%", "10%")
    # busy in the middle of the run: a settled repetition slow by 10.45%
    noisy = (700.0, 700.0, 626.85, 700.0, 700.0)
    assert abs(steady_spread(noisy) - 0.1045) < 1e-9
    probe = Calibration("cuda", (Measurement.of("matmul", "cuda:0", "GFLOP/s", noisy, "n=8192"),), 3.0, 3.5, "2", 1)
    h = host(gpus=(gpu(0),))
    (w,) = [w for w in judge(h, probe, None, None) if w.field.startswith("calibration.")]
    assert re.fullmatch(r"calibration matmul@cuda:0 varied 10\.[45]% between its repetitions after the first "
                        r"\(> 10%; 10\.[45]% over all 5\): the host is not quiet", w.message), w.message
    (said,) = calibration_spreads({"measurements": [m.to_dict() for m in probe.measurements]}, 0.10)
    assert re.match(r"matmul@cuda:0 varied 10\.[45]% between its repetitions after the first \(> 10%\)", said)


def test_a_first_repetition_outlier_does_not_make_a_run_calibration_noisy():
    fast_first = {"measurements": [dataclasses.asdict(Measurement.of("matmul", "cuda:0", "GFLOP/s", H200_MATMUL))]}
    assert calibration_spreads(fast_first, 0.10) == []


def test_clocks_held_by_the_probes_own_power_cap_are_a_fact_not_a_warning():
    h = host(gpus=(gpu(0),))
    probe = SamplerSummary(0.25, 3.0, 12, {}, (GpuSummary(0, {"power_w": Stat(80.0, 600.0, 698.0, 12),
                                                               "sm_clock_mhz": Stat(1410.0, 1500.0, 1590.0, 12)},
                                                           ("sw_power_cap",), 1980),))
    out = judge(h, None, probe, None)
    assert [w.severity.value for w in out] == ["info", "info"], out
    assert "1590 MHz, 80% of its 1980 MHz maximum (below 90%): held there by the probe's own power capping" in out[1].message
    thermal = dataclasses.replace(probe, gpus=(dataclasses.replace(probe.gpus[0], throttle_reasons_seen=()),))
    (w,) = judge(h, None, thermal, None)
    assert w.severity.value == "warning" and "clocks held low" in w.message


def _probe_with_reps(values, clocks, powers, reasons, limit=700.0) -> Measurement:
    reps = tuple(RepReading(c, p, tuple(r), 40) for c, p, r in zip(clocks, powers, reasons))
    return Measurement.of("matmul", "cuda:0", "GFLOP/s", values, "n=8192 bfloat16").with_reps(reps, limit)


#: the issue's idle H100: 703 W against 700 W, the repetitions falling as the cap bit, the
#: SM clock falling with them (within about 1% of what a constant work per cycle implies)
H100_CAPPED = dict(values=(724e3, 707e3, 701e3, 625e3), clocks=(1980.0, 1925.0, 1910.0, 1720.0),
                   powers=(703.0, 701.0, 699.0, 702.0), reasons=((), ("sw_power_cap",), ("sw_power_cap",),
                                                                 ("sw_power_cap",)))


def test_a_probe_that_power_caps_itself_is_judged_per_clock_and_says_so():
    m = _probe_with_reps(**H100_CAPPED)
    judged = judged_spread(m)
    assert judged.per_clock and judged.value < 0.02 and judged.throughput > 0.10, judged
    assert "sw_power_cap, 702 W of 700 W" in judged.why
    out = judge(host(gpus=(gpu(0),)), Calibration("cuda", (m,), 3.0, 3.5, "2", 1), None, None)
    assert [w.severity.value for w in out] == ["info"], out
    assert out[0].message.startswith("calibration matmul@cuda:0 judged on its throughput per SM clock: the probe "
                                     "held the GPU at its power limit"), out[0].message
    assert re.search(r"the throughput varied 11\.7% between its repetitions after the first, per clock 1\.\d% "
                     r"\(limit 10%\)", out[0].message), out[0].message
    # the record keeps the readings, and a run's calibration is judged the same way
    again = Measurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again == m
    assert calibration_spreads({"measurements": [m.to_dict()]}, 0.10) == []


def test_a_gpu_shared_with_a_second_process_still_warns_per_clock():
    # the clock holds (the board is not at its limit for the probe alone) but the probe
    # gets fewer cycles: the work per clock falls in the repetitions the neighbour shared
    shared = dict(H100_CAPPED, values=(724e3, 707e3, 520e3, 610e3))
    judged = judged_spread(_probe_with_reps(**shared))
    assert judged.per_clock and judged.value > 0.10
    m = _probe_with_reps(**shared)
    (w,) = [w for w in judge(host(gpus=(gpu(0),)), Calibration("cuda", (m,), 3.0, 3.5, "2", 1), None, None)
            if w.severity.value == "warning"]
    assert "in throughput per SM clock between its repetitions after the first" in w.message
    assert w.message.endswith("the host is not quiet")


def test_a_cap_the_probe_did_not_cause_is_judged_on_throughput():
    for change, why in ((dict(powers=(420.0, 430.0, 425.0, 428.0)), "something else capped it"),
                        (dict(reasons=((), ("sw_power_cap", "hw_slowdown"), ("sw_power_cap",), ("sw_power_cap",))),
                         "clock-event reasons beyond the probe's own: hw_slowdown"),
                        (dict(reasons=((), (), (), ())), "did not reach its power limit")):
        judged = judged_spread(_probe_with_reps(**{**H100_CAPPED, **change}))
        assert not judged.per_clock and judged.value == judged.throughput > 0.10 and why in judged.why, judged
    plain = Measurement.of("matmul", "cuda:0", "GFLOP/s", H100_CAPPED["values"])  # no readings (an older record)
    assert judged_spread(plain).basis == "throughput" and judged_spread(plain).why == ""


#: ``harness doctor``'s own records (``Doctor.to_dict``) from an idle H100 80GB HBM3 (700 W,
#: 1980 MHz), four in a row, and three while a second process ran bf16 matrix products on
#: the same GPU (tests/fixtures/doctor; made with doctor_report on that machine)
RECORDED = Path(__file__).parent / "fixtures" / "doctor"


def _recorded(name: str) -> tuple[Doctor, list]:
    """The recorded report, and its figures judged again by today's rule."""
    d = Doctor.from_dict(json.loads((RECORDED / f"{name}.json").read_text()))
    window = contention.Window.from_dict(d.contention)
    again = judge(d.host, d.calibration, d.samples, d.idle_samples, contention.judge(window, contention.Thresholds()))
    return d, again


def test_an_idle_h100_whose_probe_power_caps_it_reads_ok_judged_per_clock():
    raw_over = 0
    for i in range(4):
        d, again = _recorded(f"h100-idle-{i}")
        assert [w for w in again if w.severity.value != "info"] == [], again
        m = d.calibration.get("matmul")
        judged = judged_spread(m)
        assert judged.per_clock and judged.value <= 0.10, judged
        assert all("sw_power_cap" in r.reasons for r in m.reps[1:]), m.reps
        raw_over += judged.throughput > 0.10
        # the copy is judged on its throughput: its work per cycle is not fixed
        assert not judged_spread(d.calibration.get("memcpy")).per_clock
    assert raw_over == 3  # judged on the throughput, three of the four would have warned


def test_a_gpu_shared_with_a_second_process_still_warns():
    for i in range(3):
        d, again = _recorded(f"h100-shared-{i}")
        warned = [w.message for w in again if w.severity.value != "info"]
        assert any("other processes on the server's GPUs" in w for w in warned), warned
        assert not d.ok
