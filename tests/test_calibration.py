"""Calibration workload, host drift, the doctor report."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch

from bisect_harness.observe.calibration import (
    Calibration, Drift, Measurement, Severity, allreduce_bandwidth, calibrate, compare_hosts, host_warnings,
)
from bisect_harness.observe.doctor import Doctor, doctor_report, render_doctor_text
from bisect_harness.errors import UserError
from bisect_harness.observe.provenance import GpuInfo, GpuSummary, HostInfo, SamplerSummary, Stat


def gpu(i=0, **over) -> GpuInfo:
    base = GpuInfo(index=i, name="NVIDIA H200", uuid=f"GPU-{i:04d}", driver_version="550.54.15",
                   cuda_version="12.4", sm_clock_mhz=1980, sm_clock_max_mhz=1980,
                   mem_clock_mhz=2619, mem_clock_max_mhz=2619, temperature_c=40, power_w=120.0,
                   power_limit_w=700.0, throttle_mask=0, throttle_reasons=(), ecc_mode=True,
                   mig_mode=False, persistence_mode=True)
    return dataclasses.replace(base, **over)


def host(**over) -> HostInfo:
    base = HostInfo(
        hostname="node1", kernel="5.15.0-105-generic", os="Ubuntu 22.04.4 LTS",
        boot_id="2f1c8a36-7e55-4bf0-9a5b-1d1b3f0c9e11", boot_time=1_700_000_000.0,
        cpu_model="AMD EPYC 9654", cpu_count_logical=192, cpu_count_physical=96,
        cpu_governor="performance", load_avg=(0.5, 0.4, 0.3), mem_total_bytes=2 * 2**40,
        mem_available_bytes=2**40, python_version="3.11.7", torch_version="2.5.1+cu124",
        torch_cuda_available=True, torch_cuda_version="12.4", packages_hash="a" * 64,
        packages_count=200, engine_commit="c0ffee" * 6 + "abcd", engine_dirty=False,
        engine_note="", gpus=(gpu(0), gpu(1)), gpu_note="", collected_at=1_700_000_100.0)
    return dataclasses.replace(base, **over)


def cal(matmul=1000.0, memcpy=100.0, device="cpu") -> Calibration:
    return Calibration(device=device, measurements=(
        Measurement.of("matmul", device, "GFLOP/s", [matmul * 0.99, matmul, matmul * 1.01],
                       "n=512 float32, 4 ops/rep"),
        Measurement.of("memcpy", device, "GB/s", [memcpy, memcpy, memcpy],
                       "64 MiB, read+written bytes, 2 ops/rep")),
        seconds_budget=1.0, elapsed_s=1.1, torch_version="2.5.1", threads=8)


# ----------------------------------------------------------------- calibrate


def test_calibrate_cpu_within_budget():
    t = time.perf_counter()
    c = calibrate("cpu", seconds_budget=0.4, repeats=5)
    wall = time.perf_counter() - t
    # The budget bounds the timed repetitions; warm-up ops and sizing come on top.
    assert wall < 0.4 + 2.0
    assert c.device == "cpu" and c.elapsed_s <= wall
    mm, cp = c.get("matmul"), c.get("memcpy")
    assert mm.unit == "GFLOP/s" and cp.unit == "GB/s"
    for m in (mm, cp):
        assert 3 <= len(m.values) <= 5
        assert min(m.values) <= m.median <= max(m.values)
        assert m.median > 0 and m.spread >= 0
    assert mm.detail.startswith("n=512 float32")
    assert c.threads == torch.get_num_threads()
    assert Calibration.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_the_cpu_copy_probe_runs_on_one_thread_and_gives_the_others_back(monkeypatch):
    # a copy split over the cores jumps between two rates on a quiet VM (the probe's own
    # noise, read as "the host was not quiet"); one thread's copy is repeatable
    seen = []
    real = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src: seen.append(torch.get_num_threads()) or real(self, src))
    before = torch.get_num_threads()
    c = calibrate("cpu", seconds_budget=0.2, repeats=4)
    assert seen and set(seen) == {1}
    assert "one thread" in c.get("memcpy").detail
    assert torch.get_num_threads() == before


def test_calibrate_rejects_bad_arguments():
    with pytest.raises(UserError, match="positive"):
        calibrate("cpu", seconds_budget=0)
    with pytest.raises(UserError, match="auto, cpu or cuda"):
        calibrate("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has a GPU")
def test_calibrate_cuda_without_gpu_says_what_to_do():
    with pytest.raises(UserError, match="device='cpu'"):
        calibrate("cuda", seconds_budget=0.1)


def test_measurement_median_and_spread():
    m = Measurement.of("matmul", "cpu", "GFLOP/s", [90, 100, 110])
    assert m.median == 100 and m.spread == pytest.approx(0.2)
    assert m.key == "matmul@cpu"
    with pytest.raises(ValueError):
        Measurement.of("matmul", "cpu", "GFLOP/s", [])


@pytest.mark.slow
def test_allreduce_over_gloo_on_cpu():
    m = allreduce_bandwidth(2, backend="gloo", size_bytes=2**20, seconds_budget=0.2, repeats=3)
    assert m.name == "allreduce" and m.device == "cpu:x2" and m.unit == "GB/s"
    assert len(m.values) == 3 and m.median > 0
    with pytest.raises(ValueError):
        allreduce_bandwidth(1, backend="gloo")


@pytest.mark.gpu
def test_calibrate_on_gpus():
    if not torch.cuda.is_available():
        pytest.skip("no GPU here")
    c = calibrate("cuda", seconds_budget=2.0)
    n = torch.cuda.device_count()
    assert {m.device for m in c.measurements if m.name == "matmul"} == {
        f"cuda:{i}" for i in range(n)}
    assert c.get("matmul", "cuda:0").median > 1000  # any datacenter GPU beats 1 TFLOP/s bf16
    if n > 1:
        assert c.get("allreduce").median > 0, c.note


# -------------------------------------------------------------------- drift


def test_identical_hosts_have_no_drift():
    assert compare_hosts(host(), host(), cal(), cal()) == []
    assert compare_hosts(host(), host(), None, None) == []


def test_changed_boot_id_and_driver_are_flagged():
    b = host(boot_id="99999999-0000-0000-0000-000000000000",
             gpus=(gpu(0, driver_version="560.35.03"), gpu(1, driver_version="560.35.03")))
    drifts = {d.field: d for d in compare_hosts(host(), b, None, None)}
    assert set(drifts) == {"boot_id", "driver_version"}
    assert drifts["boot_id"].severity is Severity.WARNING
    assert "rebooted" in drifts["boot_id"].message
    assert drifts["driver_version"].a == "550.54.15" and drifts["driver_version"].b == "560.35.03"


def test_other_gpu_model_is_critical():
    b = host(gpus=(gpu(0, name="NVIDIA H100 80GB HBM3"),))
    drifts = {d.field: d for d in compare_hosts(host(), b, None, None)}
    assert drifts["gpu_count"].severity is Severity.CRITICAL
    assert drifts["gpu[0].name"].severity is Severity.CRITICAL


def test_host_level_changes_are_flagged():
    b = host(kernel="6.8.0", cpu_governor="powersave", packages_hash="b" * 64)
    fields = {d.field for d in compare_hosts(host(), b, None, None)}
    assert fields == {"kernel", "cpu_governor", "packages_hash"}


def test_calibration_beyond_threshold_is_flagged_and_within_is_not():
    assert compare_hosts(host(), host(), cal(matmul=1000), cal(matmul=1040), threshold=0.05) == []
    (d,) = compare_hosts(host(), host(), cal(matmul=1000), cal(matmul=900), threshold=0.05)
    assert d.field == "calibration.matmul@cpu"
    assert (d.a, d.b) == (1000.0, 900.0)
    assert "-10.0%" in d.message and "beyond 5%" in d.message
    (d,) = compare_hosts(host(), host(), cal(), cal(device="cuda"))
    assert d.field == "calibration.device"


def test_throttling_on_one_side_is_flagged_on_that_side():
    b = host(gpus=(gpu(0), gpu(1, throttle_mask=0x40, throttle_reasons=("hw_thermal_slowdown",))))
    (d,) = compare_hosts(host(), b, None, None)
    assert d.field == "gpu[1].throttle_reasons"
    assert d.a is None and d.b == ["hw_thermal_slowdown"]
    assert d.message.startswith("side B:")
    idle = host(gpus=(gpu(0, throttle_mask=1, throttle_reasons=("gpu_idle",), sm_clock_mhz=345),
                      gpu(1)))
    assert compare_hosts(idle, host(), None, None) == []


def _samples(sm_max_seen: float, reasons=()) -> SamplerSummary:
    st = Stat(min=sm_max_seen - 100, mean=sm_max_seen - 50, max=sm_max_seen, n=10)
    return SamplerSummary(interval_s=1.0, duration_s=10.0, n_samples=10,
                          cpu={"load1": Stat(1, 1, 1, 10)},
                          gpus=(GpuSummary(0, {"sm_clock_mhz": st}, tuple(reasons), 1980),))


def test_clocks_held_low_during_sampling_are_flagged():
    ok = _samples(1980)
    low = _samples(1410, reasons=("gpu_idle", "sw_power_cap"))
    assert compare_hosts(host(), host(), None, None, samples_a=ok, samples_b=ok) == []
    drifts = compare_hosts(host(), host(), None, None, samples_a=ok, samples_b=low)
    fields = {d.field: d for d in drifts}
    assert set(fields) == {"gpu[0].sampled_throttle_reasons", "gpu[0].sm_clock_max_sampled"}
    assert fields["gpu[0].sampled_throttle_reasons"].b == ["sw_power_cap"]
    assert "71% of its 1980 MHz maximum" in fields["gpu[0].sm_clock_max_sampled"].message
    assert host_warnings(host(), low, clock_fraction=0.7) != [] and \
        all(d.field != "gpu[0].sm_clock_max_sampled"
            for d in host_warnings(host(), low, clock_fraction=0.7))


def test_dirty_engine_worktree_is_flagged():
    (d,) = compare_hosts(host(engine_dirty=True), host(), None, None)
    assert d.field == "engine_dirty" and d.a is True


def test_drift_round_trip():
    d = compare_hosts(host(), host(boot_id="x"), cal(), cal(memcpy=50))
    again = [Drift.from_dict(json.loads(json.dumps(x.to_dict()))) for x in d]
    assert again == d and len(d) == 2


# ------------------------------------------------------------------- doctor


def test_doctor_report_on_this_host():
    doctor = doctor_report(seconds_budget=0.3, device="cpu", sample_interval_s=0.05)
    assert doctor.calibration is not None and doctor.calibration.device == "cpu"
    assert doctor.samples is not None and doctor.samples.n_samples >= 2
    text = render_doctor_text(doctor)
    assert f"boot id   {doctor.host.boot_id}" in text
    assert "matmul@cpu" in text and "memcpy@cpu" in text
    d = json.loads(json.dumps(doctor.to_dict()))
    assert Doctor.from_dict(d) == doctor


def test_doctor_text_golden():
    h = host(gpus=(gpu(0, throttle_mask=0x4, throttle_reasons=("sw_power_cap",)),),
             load_avg=(1.0, 2.0, 3.0))
    c = dataclasses.replace(cal(), elapsed_s=1.25)
    doctor = Doctor(h, c, None, tuple(host_warnings(h)))
    assert not doctor.ok
    assert render_doctor_text(doctor) == (
        "host      node1  (Ubuntu 22.04.4 LTS, kernel 5.15.0-105-generic)\n"
        "boot id   2f1c8a36-7e55-4bf0-9a5b-1d1b3f0c9e11\n"
        "cpu       AMD EPYC 9654, 192 logical cores, governor performance, load 1.00 2.00 3.00\n"
        "memory    1024.0 GiB free of 2048.0 GiB\n"
        "python    3.11.7, torch 2.5.1+cu124 (CUDA available, 12.4)\n"
        "packages  200 installed, hash aaaaaaaaaaaa\n"
        "engine    c0ffeec0ffeec0ffeec0ffeec0ffeec0ffeeabcd (clean)\n"
        "gpus      1 x NVIDIA H200, driver 550.54.15, CUDA 12.4\n"
        "  [0] SM 1980/1980 MHz, mem 2619/2619 MHz, 40 C, 120/700 W, throttle sw_power_cap, "
        "ECC True, MIG False, persistence True\n"
        "calibration (cpu, 1.2 s, 8 threads)\n"
        "  matmul@cpu             1000.0 GFLOP/s  spread 2.00%  [n=512 float32, 4 ops/rep]\n"
        "  memcpy@cpu              100.0 GB/s     spread 0.00%  "
        "[64 MiB, read+written bytes, 2 ops/rep]\n"
        "warnings\n"
        "  warning  GPU 0 clocks limited by sw_power_cap\n"
        "doctor    not ok (1 warning(s))\n")
