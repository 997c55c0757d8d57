"""Each contention source on recorded /proc text and NVML process lists; the judgement,
the policy keys in hypotheses.yaml, and the sentences built from stored figures."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest

from bisect_harness.evidence import FindingKind
from bisect_harness.errors import HarnessError, NotObserved, SpecError
from bisect_harness.observe import contention as c
from bisect_harness.observe import host_state
from bisect_harness.record.ledger import Boot
from bisect_harness.spec import load_spec

# Recorded on a 2-core VM (kernel 6.x): before and 2 s into a window with two busy loops.
PSI_CPU_0 = "some avg10=0.83 avg60=1.32 avg300=0.65 total=2780458\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
PSI_CPU_1 = "some avg10=40.10 avg60=9.32 avg300=2.10 total=3780458\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
PSI_IO = "some avg10=0.36 avg60=0.49 avg300=0.19 total=885810\nfull avg10=0.36 avg60=0.47 avg300=0.17 total=818850\n"
PSI_OLD_KERNEL_CPU = "some avg10=0.00 avg60=0.00 avg300=0.00 total=12\n"  # before 5.13 cpu had no full line
STAT_0 = textwrap.dedent("""\
    cpu  3124 0 1528 15840 99 0 23 5 0 0
    cpu0 310 0 452 9521 13 0 5 1 0 0
    cpu1 2814 0 1075 6319 86 0 17 4 0 0
    intr 1 2 3
    ctxt 123
    procs_running 2
    procs_blocked 0
    """)
STAT_1 = textwrap.dedent("""\
    cpu  3424 0 1548 15860 99 0 23 25 0 0
    procs_running 5
    """)


def reader(files: dict):
    def read(path: str) -> str:
        if path not in files:
            raise FileNotFoundError(path)
        value = files[path]
        return value.pop(0) if isinstance(value, list) else value
    return read


CTX = c.Context(own_pids=frozenset({100, 101}), cores=2)


def test_parse_pressure_and_old_kernels():
    assert c.parse_pressure(PSI_CPU_0) == {"some": 2780458.0, "full": 0.0}
    assert c.parse_pressure(PSI_OLD_KERNEL_CPU) == {"some": 12.0}
    with pytest.raises(ValueError):
        c.parse_pressure("nonsense")


def test_pressure_source_differences_total_counters_over_the_window():
    files = {"/p/cpu": [PSI_CPU_0, PSI_CPU_1], "/p/io": PSI_IO, "/p/memory": PSI_OLD_KERNEL_CPU}
    src = c.PressureSource(read=reader(files), root="/p")
    r0, r1 = src.read(CTX), src.read(CTX)
    fig = src.figures([(10.0, r0), (12.0, r1)], CTX)
    assert fig["cpu_pressure"] == pytest.approx(0.5)  # 1 s of stall in a 2 s window
    assert fig["cpu_pressure_full"] == 0.0 and fig["io_pressure"] == 0.0
    assert "memory_pressure_full" not in fig  # the kernel did not report it: absent, not zero


def test_pressure_source_without_psi_is_unavailable_with_the_reason():
    src = c.PressureSource(read=reader({}), root="/p")
    with pytest.raises(c.SourceUnavailable, match="no PSI"):
        src.read(CTX)


def test_an_unavailable_source_is_a_harness_error_that_says_nothing_was_observed():
    src = c.PressureSource(read=reader({}), root="/p")
    with pytest.raises(NotObserved) as got:
        src.read(CTX)
    assert isinstance(got.value, c.SourceUnavailable) and isinstance(got.value, HarnessError)


def test_steal_from_proc_stat():
    st = c.parse_proc_stat(STAT_0)
    assert (st.user, st.steal, st.procs_running) == (3124, 5, 2)
    src = c.StealSource(read=reader({"/s": [STAT_0, STAT_1]}), path="/s")
    fig = src.figures([(0.0, src.read(CTX)), (1.0, src.read(CTX))], CTX)
    # deltas: user 300, system 20, idle 20, steal 20 -> total 360
    assert fig["steal"] == pytest.approx(20 / 360)
    assert fig["host_cpu_busy"] == pytest.approx(1 - 20 / 360)
    assert c.parse_proc_stat("cpu 1 2 3 4\n").steal == 0  # an old kernel's short line


def test_task_state_survives_odd_process_names():
    assert c.parse_task_state("1234 (python) R 1 2 3") == "R"
    assert c.parse_task_state("1234 (my (odd) name) S 1 2 3") == "S"


def test_runqueue_subtracts_our_own_running_threads(tmp_path):
    (tmp_path / "stat").write_text(STAT_1)  # procs_running 5
    for pid, states in {100: "RRS", 101: "R"}.items():
        for tid, state in enumerate(states):
            d = tmp_path / str(pid) / "task" / str(pid * 10 + tid)
            d.mkdir(parents=True)
            (d / "stat").write_text(f"{pid} (srv) {state} 1 1 1\n")
    src = c.RunQueueSource(proc=str(tmp_path))
    reading = src.read(CTX)
    assert reading == (5, 3)
    fig = src.figures([(0.0, reading), (1.0, (2, 2))], CTX)
    assert fig["foreign_runnable"] == pytest.approx(1.0)  # (5-3 + 2-2) / 2
    assert fig["foreign_runnable_per_core"] == pytest.approx(0.5)


def test_foreign_cpu_counts_only_processes_outside_our_tree():
    # Recorded process lists: (pid, name, start time, user+system seconds).
    t = 1_000_000.0
    lists = [
        [c.ProcCpu(1, "init", 10.0, 5.0), c.ProcCpu(100, "harness", t - 50, 30.0),
         c.ProcCpu(200, "make", t - 100, 40.0), c.ProcCpu(300, "cc1", t - 5, 1.0)],
        [c.ProcCpu(1, "init", 10.0, 5.01), c.ProcCpu(100, "harness", t - 50, 32.0),
         c.ProcCpu(200, "make", t - 100, 41.5),  # cc1 exited: its last seen time stays counted
         c.ProcCpu(400, "ld", t + 1, 0.5),       # started during the window: counted from zero
         c.ProcCpu(500, "late", t - 300, 99.0)],  # existed before but first seen now: no base, left out
    ]
    src = c.ForeignCpuSource(iterate=lambda: iter(lists.pop(0)), command={200: "make -j8"}.get)
    clock = iter([t, t + 2.0])
    import bisect_harness.observe.contention.sources as mod
    real_time = mod.time.time
    mod.time.time = lambda: next(clock)
    try:
        r0, r1 = src.read(CTX), src.read(CTX)
    finally:
        mod.time.time = real_time
    readings = [(0.0, r0), (2.0, r1)]
    fig = src.figures(readings, CTX)
    assert fig["foreign_cpu"] == pytest.approx((0.01 + 1.5 + 0.0 + 0.5) / 2.0)
    assert fig["foreign_cpu_share"] == pytest.approx(fig["foreign_cpu"] / 2)
    top = src.details(readings, CTX)["top_foreign"]
    assert [p["name"] for p in top] == ["make", "ld"]  # harness is ours; init below 1% of a core
    assert [p["command"] for p in top] == ["make -j8", None]  # ld is gone: its name stays


class FakeNvml:
    """The NVML seam: recorded process lists per GPU, one list per reading."""

    def __init__(self, per_reading, fail_init=False):
        self.per_reading, self.fail_init, self.n = per_reading, fail_init, 0
        self.shut = False

    def nvmlInit(self):
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.per_reading[0])

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        procs = self.per_reading[min(self.n, len(self.per_reading) - 1)][h]
        if h == len(self.per_reading[0]) - 1:
            self.n += 1
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in procs]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []


def test_gpu_processes_counts_others_on_the_servers_gpus_only():
    mib = 2**20
    nvml = FakeNvml([
        [[(100, 4000 * mib)], [(900, 100 * mib)]],                  # GPU 1 is not ours: 900 is not counted
        [[(100, 4000 * mib), (777, 2000 * mib)], [(900, 100 * mib)]],  # a neighbour lands on our GPU 0
    ])
    src = c.GpuProcessSource(nvml=nvml)
    readings = [(0.0, src.read(CTX)), (1.0, src.read(CTX))]
    assert src.figures(readings, CTX) == {"gpu_foreign_processes": 1.0}
    assert src.details(readings, CTX)["gpu_foreign"] == [{"pid": 777, "gpu": 0, "memory_mib": 2000.0}]
    src.close()
    assert nvml.shut


def test_gpu_processes_without_nvml_is_unavailable():
    with pytest.raises(c.SourceUnavailable, match="NVML unavailable"):
        c.GpuProcessSource(nvml=FakeNvml([[[]]], fail_init=True)).read(CTX)


def test_monitor_windows_and_judgement_from_recorded_sources():
    files = {"/p/cpu": [PSI_CPU_0, PSI_CPU_1, PSI_CPU_1], "/p/io": PSI_IO, "/p/memory": PSI_IO}
    class Missing(c.PressureSource):  # a second, unreadable copy (not registered)
        name = "pressure_missing"

    sources = [c.PressureSource(read=reader(files), root="/p"), Missing(read=reader({}), root="/none")]
    mon = c.Monitor(sources=sources, interval_s=3600, roots=[])
    mon.start()
    mon.split()
    mon.stop()
    assert mon.n_windows == 2
    w = mon.window()
    assert w.sources["pressure_missing"]["available"] is False
    assert "no PSI" in w.unavailable()["pressure_missing"]
    crossed = c.judge(c.Window(2.0, 2, {"cpu_pressure": 0.5, "foreign_cpu": 1.6, "foreign_cpu_share": 0.8},
                               {}, {"top_foreign": [{"pid": 7, "name": "burn", "cores": 0.98}]}),
                      c.Thresholds(cpu_pressure=0.6))
    assert [x.figure for x in crossed] == ["foreign_cpu_share"]
    assert "80% > 25%" in crossed[0].message and "burn (pid 7) 0.98" in crossed[0].message
    again = c.Window.from_dict(w.to_dict())
    assert again.figures == pytest.approx(w.figures, abs=1e-5) and again.sources == w.sources


SPEC = textwrap.dedent("""\
    version: 1
    engine: {{preset: demo}}
    defaults:
      samples_per_boot: 1
      {extra}
    hypotheses:
      - {{id: h, baseline: {{commit: HEAD}}, treatment: {{commit: HEAD}}, metric: tok_s, expect: increase,
          min_effect: 5%}}
    """)


def test_host_check_and_thresholds_in_hypotheses_yaml(tmp_path):
    p = tmp_path / "h.yaml"
    p.write_text(SPEC.format(extra="host_check: retry\n  host_thresholds: {foreign_cpu_share: 0.4, steal: 0.1}"))
    d = load_spec(p).defaults
    assert d.host_check == "retry"
    assert d.host_thresholds.foreign_cpu_share == 0.4 and d.host_thresholds.steal == 0.1
    assert d.host_thresholds.cpu_pressure == c.Thresholds().cpu_pressure
    assert d.host_preflight_s == 2.0

    p.write_text(SPEC.format(extra="host_check: ignore"))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.key == "defaults.host_check" and e.value.line == 5 and "retry" in str(e.value)

    p.write_text(SPEC.format(extra="host_thresholds: {foreign_cpu: 0.4}"))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert e.value.key == "defaults.host_thresholds.foreign_cpu" and "foreign_cpu_share" in str(e.value)


def _boot(bid, figures, crossed=()):
    w = c.Window(5.0, 2, figures, {"foreign_cpu": {"available": True}})
    return Boot(id=bid, run_id=1, provenance={"contention": c.record(
        w, [w], [c.Crossing(x, figures[x], 0.25, f"{x} high") for x in crossed], c.Thresholds())})


def test_warnings_name_busy_boots_and_a_difference_between_the_sides():
    quiet = [_boot(1, {"foreign_cpu_share": 0.01}), _boot(3, {"foreign_cpu_share": 0.02})]
    busy = [_boot(2, {"foreign_cpu_share": 0.8}, ["foreign_cpu_share"]), _boot(4, {"foreign_cpu_share": 0.03})]
    found = host_state.contention_findings({"baseline": quiet, "treatment": busy})
    out = [f.text for f in found]
    assert out[0] == "host busy during treatment boot 2: foreign_cpu_share high"
    assert out[1].startswith("contention differed between the sides: baseline 0 of 2 boots busy")
    assert "treatment 1 of 2 boots busy, mean foreign CPU 42%" in out[1]
    assert (found[0].kind, found[0].side, found[0].boots) == (FindingKind.BUSY_BOOT, "treatment", (2,))
    assert found[0].figures == {"crossed": [{"figure": "foreign_cpu_share", "value": 0.8, "limit": 0.25,
                                             "message": "foreign_cpu_share high"}]}
    assert found[1].kind is FindingKind.CONTENTION_DIFFERED and found[1].side is None
    assert found[1].figures["sides"]["treatment"] == {"busy_boots": 1, "measured_boots": 2,
                                                      "mean_foreign_cpu_share": pytest.approx(0.415)}
    assert found[1].figures["sides"]["baseline"]["busy_boots"] == 0
    assert found[1].figures["foreign_cpu_share"] == c.Thresholds().foreign_cpu_share
    assert host_state.contention_findings({"baseline": quiet, "treatment": quiet}) == []
    same, why = host_state.same_host_state(quiet, busy, [])
    assert not same and why == ["1 of 2 treatment boots ran on a busy host"]
    same, why = host_state.same_host_state(quiet, [Boot(id=9, run_id=1, provenance={})], [])
    assert not same and why == ["contention was not measured for 1 of 1 treatment boots"]


def test_calibration_spread_is_judged():
    result = {"measurements": [
        {"name": "matmul", "device": "cpu", "unit": "GFLOP/s", "median": 40.0, "spread": 0.20, "values": []},
        {"name": "memcpy", "device": "cpu", "unit": "GB/s", "median": 10.0, "spread": 0.03, "values": []}]}
    out = host_state.calibration_spreads(result, 0.10)
    assert out == ["matmul@cpu varied 20% between repetitions (> 10%): the host was not quiet while it was "
                   "calibrated"]


def test_noisy_calibration_and_a_busy_preflight_are_findings_with_their_figures():
    noisy = {"measurements": [{"name": "matmul", "device": "cpu", "spread": 0.20, "values": []}],
             "judged": {"spread_limit": 0.10}}
    busy = {"watched": "before the first boot", "crossed": [{"figure": "cpu_pressure", "value": 0.95,
                                                               "limit": 0.9, "message": "CPU pressure 95% > 90%"}]}
    run = SimpleNamespace(id=7, calibrations=[SimpleNamespace(phase="before", result=noisy),
                                              SimpleNamespace(phase="preflight", result=busy),
                                              SimpleNamespace(phase="after", result={"measurements": []})])
    cal, pre = host_state.calibration_findings([run])
    assert cal.kind is FindingKind.CALIBRATION_NOISY and cal.boots == () and cal.side is None
    assert cal.figures == {"run": 7, "phase": "before", "name": "matmul", "device": "cpu", "spread": 0.20,
                           "limit": 0.10}
    assert cal.text == ("calibration (before, run 7): matmul@cpu varied 20% between repetitions (> 10%): the host "
                        "was not quiet while it was calibrated")
    assert pre.kind is FindingKind.PREFLIGHT_BUSY and pre.figures["run"] == 7
    assert pre.figures["crossed"] == busy["crossed"] and pre.figures["watched"] == "before the first boot"
    assert pre.text == "host busy at the start of run 7 (before the first boot): CPU pressure 95% > 90%"
    quiet = SimpleNamespace(id=8, calibrations=[SimpleNamespace(phase="before", result={**noisy, "judged": {
        "spread_limit": 0.25}})])
    assert host_state.calibration_findings([quiet]) == []


def test_a_crossing_never_reads_as_equal_to_its_limit():
    (x,) = c.judge(c.Window(1.0, 2, {"cpu_pressure": 0.9003}, {}), c.Thresholds())
    assert x.message.endswith("90.03% > 90%")


def test_wait_quiet_takes_an_optional_value():
    from bisect_harness.cli import WAIT_QUIET_DEFAULT_S, _wait_quiet_value

    default = str(WAIT_QUIET_DEFAULT_S)
    assert _wait_quiet_value(["run", "--wait-quiet", "h.yaml"]) == ["run", "--wait-quiet", default, "h.yaml"]
    assert _wait_quiet_value(["run", "h.yaml", "--wait-quiet"]) == ["run", "h.yaml", "--wait-quiet", default]
    assert _wait_quiet_value(["run", "h.yaml", "--wait-quiet", "30"]) == ["run", "h.yaml", "--wait-quiet", "30"]
    assert _wait_quiet_value(["run", "h.yaml", "--wait-quiet=30"]) == ["run", "h.yaml", "--wait-quiet=30"]


def test_a_watch_cut_short_ends_at_once_and_keeps_what_it_read():
    import time

    t0 = time.monotonic()
    w = c.Watch(30.0, interval_s=0.05)
    time.sleep(0.2)
    window = w.window(cut_short=True)
    assert time.monotonic() - t0 < 5.0
    assert 0.1 <= window.seconds < 5.0 and window.sources["foreign_cpu"]["available"]
