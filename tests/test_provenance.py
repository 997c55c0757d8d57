"""Provenance: env through a real process tree, flags, host snapshot, NVML readers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bisect_harness.errors import UserError
from bisect_harness.observe.provenance import (
    EnvReport, FlagReport, GpuInfo, GpuSampler, HostInfo, SamplerSummary, collect_host, decode_throttle_reasons,
    env_report, flag_report, read_gpus,
)
from bisect_harness.measure.values import values_equal

VAR = "BH_TEST_NCCL_TUNING"

# The child runs with VAR set; it starts a grandchild whose env is given as JSON
# (None: inherit), waits until the grandchild has exec'd, prints its pid, sleeps.
CHILD = textwrap.dedent("""
    import json, subprocess, sys, time
    env = json.loads(sys.argv[1])
    prelude = sys.argv[2] if len(sys.argv) > 2 else ""
    gc = subprocess.Popen([sys.executable, "-c",
                           prelude + "; import sys, time; print('ready', flush=True); time.sleep(60)"],
                          env=env, stdout=subprocess.PIPE, text=True)
    assert gc.stdout.readline().strip() == "ready"
    print(gc.pid, flush=True)
    time.sleep(60)
""")


@pytest.fixture
def tree():
    """Start child+grandchild in their own session; yield (child_pid, grandchild_pid)."""
    procs = []

    def start(grandchild_env, prelude: str = "pass"):
        env = dict(os.environ, **{VAR: "2"})
        p = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(grandchild_env), prelude],
                             env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(p)
        line = p.stdout.readline().strip()
        assert line, "child did not report its grandchild"
        return p.pid, int(line)

    yield start
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)
        p.stdout.close()


def test_env_missing_in_grandchild_with_scrubbed_env(tree):
    child, grandchild = tree({"PATH": os.environ.get("PATH", "")})
    report = env_report(child, {VAR: "2"})
    assert [p.pid for p in report.processes] == [child, grandchild]
    assert report.process(grandchild).depth == 1
    assert report.process(grandchild).is_worker
    assert "python" in report.process(grandchild).name.lower()
    (var,) = report.vars
    assert var.matched == (child,)
    assert var.absent == (grandchild,)
    assert not report.ok
    assert f"{VAR} missing in pid {grandchild}" in report.describe()


def test_env_reaches_every_process(tree):
    child, grandchild = tree(None)
    report = env_report(child, {VAR: "2", "PATH": os.environ["PATH"]})
    assert report.ok
    for v in report.vars:
        assert set(v.matched) == {child, grandchild}
    assert report.readable_pids == (child, grandchild)


def test_env_other_value_is_a_mismatch(tree):
    child, grandchild = tree({VAR: "0"})
    report = env_report(child, {VAR: "2"})
    assert report.vars[0].mismatched == {grandchild: "0"}
    assert not report.ok
    again = EnvReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    assert not again.ok


# What vLLM's workers do (vllm/utils/system_utils.py set_process_title) and SGLang's
# scheduler too: the real setproctitle package renames the process.
RENAME = "import setproctitle; setproctitle.setproctitle('VLLM::EngineCore')"


def test_a_worker_renamed_by_setproctitle_is_unverified_not_missing(tree):
    pytest.importorskip("setproctitle")
    child, grandchild = tree(None, RENAME)
    report = env_report(child, {VAR: "2"})
    gc = report.process(grandchild)
    assert not gc.readable and gc.cause == "overwritten" and gc.unverified
    (var,) = report.vars
    assert var.matched == (child,) and var.absent == () and var.mismatched == {}
    assert report.state == "unverified" and not report.ok
    assert "unreadable in 1 of 2 processes" in report.unverified_text()
    assert "setproctitle" in report.describe() and "UNVERIFIED" in report.describe()
    again = EnvReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.state == "unverified" and again.to_dict()["state"] == "unverified"


def test_spt_noenv_keeps_a_renamed_worker_readable(tree):
    pytest.importorskip("setproctitle")
    child, grandchild = tree(dict(os.environ, **{VAR: "2", "SPT_NOENV": "1"}), RENAME)
    report = env_report(child, {VAR: "2"})
    assert report.process(grandchild).readable
    assert "VLLM::EngineCore" in " ".join(psutil_cmdline(grandchild))
    assert report.state == "ok"


def test_a_partly_overwritten_block_shows_what_survived_and_leaves_the_rest_unseen():
    """What vLLM 0.32's VLLM::EngineCore looked like without SPT_NOENV: the title's NUL
    padding over the first entries, the later ones intact (14 of 40 seen)."""
    from bisect_harness.observe.provenance.env import parse_environ

    env, overwritten = parse_environ(b"\0" * 300 + b"HOME=/root\0NCCL_ALGO=Ring\0")
    assert env == {"HOME": "/root", "NCCL_ALGO": "Ring"} and overwritten
    assert parse_environ(b"VLLM::EngineCore tail\0A=1\0") == ({"A": "1"}, True)  # title text spilled over
    assert parse_environ(b"A=1\0B=\0") == ({"A": "1", "B": ""}, False)


def test_an_empty_environment_is_read_as_empty_not_overwritten(tree):
    child, grandchild = tree({})
    report = env_report(child, {VAR: "2"})
    assert report.process(grandchild).readable
    assert report.vars[0].absent == (grandchild,)
    assert report.state == "missing"


def psutil_cmdline(pid: int) -> list[str]:
    import psutil

    return psutil.Process(pid).cmdline()


def test_env_report_for_a_process_that_is_gone():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    report = env_report(p.pid, {VAR: "1"})
    assert not report.ok
    assert report.processes == ()
    assert "does not exist" in report.note


def test_env_report_rejects_a_newer_schema():
    d = env_report(os.getpid(), {}).to_dict()
    d["schema_version"] = 99
    with pytest.raises(UserError, match="newer"):
        EnvReport.from_dict(d)


# ------------------------------------------------------------------------ flags


def test_flag_report_matches_with_normalised_keys_and_tolerant_types():
    info = {"attention_mode": "decode", "speculative_num_steps": "2", "tp_size": 8,
            "disable_cuda_graph": "false", "cuda_graph_bs": [1, 2, 4], "ratio": 0.5}
    report = flag_report({"attention-mode": "decode", "speculative-num-steps": 2, "tp": "8",
                          "disable-cuda-graph": False, "cuda-graph-bs": "1,2,4",
                          "ratio": "0.50"}, info)
    assert report.ok
    assert [c.status for c in report.checks] == ["matched"] * 6
    assert report.check("tp").key == "tp_size"


def test_flag_report_mismatch_and_not_reported():
    report = flag_report({"speculative-num-steps": 3, "cuda-graph": True, "missing-flag": 1},
                         {"speculative_num_steps": 2, "cuda_graph": "false"})
    assert not report.ok
    assert report.check("speculative-num-steps").status == "mismatched"
    assert report.check("speculative-num-steps").effective == 2
    assert report.check("cuda-graph").status == "mismatched"
    assert report.check("missing-flag").status == "not_reported"
    assert "--speculative-num-steps: requested 3" in report.describe()
    assert FlagReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_flag_report_explicit_alias():
    report = flag_report({"attn": "flashinfer"}, {"attention_backend": "flashinfer"},
                         aliases={"attn": "attention-backend"})
    assert report.check("attn").status == "matched"
    assert report.check("attn").key == "attention_backend"


def test_flag_report_without_server_info():
    report = flag_report({"tp": 2}, None)
    assert report.ok
    assert report.not_reported and not report.matched
    assert "no server-info endpoint" in report.note


@pytest.mark.parametrize("a,b,eq", [
    (2, "2", True), (2, 2.0, True), ("2", "3", False), (True, "true", True), (True, "1", True),
    (False, None, True), (True, None, False), (True, "false", False), ([1, 2], (1, 2), True),
    ([1, 2], [1, 3], False), ({"a": 1}, '{"a": "1"}', True), ({"a": 1}, {"a": 1, "b": 2}, False),
    ("EAGLE3", "EAGLE3", True), ("EAGLE3", "NEXTN", False), ("1", "true", True),
    (2, "two", False),
])
def test_values_equal(a, b, eq):
    assert values_equal(a, b) is eq


# ------------------------------------------------------------------------- NVML


class FakeNvml:
    """The handful of pynvml calls provenance uses, over scripted values."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, gpus, *, init_error=None, driver="550.54.15", cuda=12040):
        self.gpus, self.init_error, self.driver, self.cuda = gpus, init_error, driver, cuda
        self.inits = self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def _get(self, h, key):
        v = h[key]
        if isinstance(v, Exception):
            raise v
        return v() if callable(v) else v

    def nvmlDeviceGetName(self, h):
        return self._get(h, "name")

    def nvmlDeviceGetUUID(self, h):
        return self._get(h, "uuid")

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._get(h, "sm" if kind == 1 else "mem")

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return self._get(h, "sm_max" if kind == 1 else "mem_max")

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == 0
        return self._get(h, "temp")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._get(h, "power_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._get(h, "limit_mw")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._get(h, "mask")

    def nvmlDeviceGetEccMode(self, h):
        return self._get(h, "ecc")

    def nvmlDeviceGetMigMode(self, h):
        return self._get(h, "mig")

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._get(h, "persistence")


class NotSupported(Exception):
    pass


def fake_gpu(**over):
    gpu = {"name": b"NVIDIA H200", "uuid": "GPU-0000", "sm": 1980, "sm_max": 1980, "mem": 2619,
           "mem_max": 2619, "temp": 41, "power_mw": 120_000, "limit_mw": 700_000, "mask": 0,
           "ecc": (1, 1), "mig": (0, 0), "persistence": 1}
    gpu.update(over)
    return gpu


def test_decode_throttle_reasons():
    assert decode_throttle_reasons(0) == ()
    assert decode_throttle_reasons(0x1) == ("gpu_idle",)
    assert decode_throttle_reasons(0x44) == ("sw_power_cap", "hw_thermal_slowdown")
    assert decode_throttle_reasons(0x8 | 0x1000) == ("hw_slowdown", "unknown_0x1000")


def test_read_gpus_through_fake_nvml():
    nvml = FakeNvml([fake_gpu(), fake_gpu(uuid="GPU-0001", sm=1200, mask=0x24,
                                          mig=NotSupported("Not Supported"))])
    gpus, note = read_gpus(nvml)
    assert note == ""
    assert nvml.inits == 1 and nvml.shutdowns == 1
    g0, g1 = gpus
    assert g0.name == "NVIDIA H200" and g0.driver_version == "550.54.15"
    assert g0.cuda_version == "12.4"
    assert g0.power_w == 120.0 and g0.power_limit_w == 700.0
    assert g0.ecc_mode is True and g0.mig_mode is False and g0.persistence_mode is True
    assert g0.throttle_reasons == () and g0.errors == ()
    assert g1.sm_clock_mhz == 1200 and g1.sm_clock_max_mhz == 1980
    assert g1.throttle_reasons == ("sw_power_cap", "sw_thermal_slowdown")
    assert g1.active_throttle_reasons == g1.throttle_reasons
    assert g1.mig_mode is None and g1.errors == ("mig_mode: Not Supported",)
    assert GpuInfo.from_dict(json.loads(json.dumps(g1.to_dict()))) == g1


def test_idle_is_not_an_active_throttle_reason():
    (g,), _ = read_gpus(FakeNvml([fake_gpu(mask=0x1, sm=345)]))
    assert g.throttle_reasons == ("gpu_idle",)
    assert g.active_throttle_reasons == ()


def test_read_gpus_when_nvml_cannot_start():
    gpus, note = read_gpus(FakeNvml([], init_error=RuntimeError("NVML Shared Library Not Found")))
    assert gpus == []
    assert "NVML unavailable" in note and "Library Not Found" in note


def test_gpu_sampler_with_fake_nvml_sees_low_clocks_and_throttling():
    clocks = iter([1980, 1400, 1300, 1350] + [1350] * 100)
    nvml = FakeNvml([fake_gpu(sm=lambda: next(clocks), mask=0x4)])
    with GpuSampler(0.02, nvml=nvml) as sampler:
        time.sleep(0.1)
    s = sampler.summary()
    (g,) = s.gpus
    assert g.sm_clock_max_mhz == 1980
    assert g.stats["sm_clock_mhz"].n == s.n_samples >= 2
    assert g.stats["sm_clock_mhz"].max == 1980 and g.stats["sm_clock_mhz"].min == 1300
    assert g.stats["power_w"].mean == 120.0
    assert g.throttle_reasons_seen == ("sw_power_cap",)
    assert nvml.shutdowns == 1
    assert SamplerSummary.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_gpu_sampler_cpu_only():
    with GpuSampler(0.05, use_gpu=False) as sampler:
        t = time.monotonic()
        while time.monotonic() - t < 0.2:
            sum(range(10_000))
    s = sampler.summary()
    assert s.gpus == ()
    assert s.n_samples >= 3
    assert "CPU samples only" in s.note
    assert s.cpu["load1"].n == s.n_samples
    assert s.cpu["cpu_percent"].n == s.n_samples - 1  # the first sample has no interval
    assert 0.0 <= s.cpu["cpu_percent"].min <= s.cpu["cpu_percent"].max <= 100.0
    assert s.duration_s >= 0.2


def test_gpu_sampler_rejects_a_second_start():
    sampler = GpuSampler(1.0, use_gpu=False)
    with sampler:
        with pytest.raises(RuntimeError):
            sampler.start()


# ------------------------------------------------------------------------- host


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_collect_host_on_this_box(tmp_path):
    repo = tmp_path / "engine"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(repo, "rev-parse", "HEAD")

    no_nvml = FakeNvml([], init_error=RuntimeError("NVML Shared Library Not Found"))
    host = collect_host(repo, nvml=no_nvml)
    assert host.gpus == ()
    assert "NVML unavailable" in host.gpu_note
    assert host.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert host.boot_time and host.boot_time < time.time()
    assert host.cpu_count_logical >= 1 and host.mem_total_bytes > 0
    assert len(host.packages_hash) == 64 and host.packages_count > 10
    assert host.python_version == ".".join(map(str, sys.version_info[:3]))
    assert host.engine_commit == head and host.engine_dirty is False
    assert HostInfo.from_dict(json.loads(json.dumps(host.to_dict()))) == host

    (repo / "a.py").write_text("x = 2\n")
    dirty = collect_host(repo, nvml=no_nvml)
    assert dirty.engine_dirty is True and dirty.packages_hash == host.packages_hash


def test_collect_host_with_the_real_nvml_never_raises():
    host = collect_host()
    if not host.gpus:
        assert host.gpu_note
    assert host.engine_commit is None and host.engine_dirty is None


def test_collect_host_with_fake_gpus():
    host = collect_host(nvml=FakeNvml([fake_gpu()]))
    assert host.driver_version == "550.54.15" and host.cuda_version == "12.4"
    assert host.gpus[0].name == "NVIDIA H200"


def _real_nvml_or_skip():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA GPU here: {exc}")
    count = pynvml.nvmlDeviceGetCount()
    pynvml.nvmlShutdown()
    if count == 0:
        pytest.skip("NVML reports no GPU")
    return pynvml


@pytest.mark.gpu
def test_real_nvml_reads_every_gpu():
    pynvml = _real_nvml_or_skip()
    gpus, note = read_gpus(pynvml)
    assert gpus, note
    for g in gpus:
        assert g.name and g.uuid.startswith(("GPU-", "MIG-"))
        assert g.driver_version and g.cuda_version
        assert g.sm_clock_max_mhz and g.sm_clock_max_mhz >= (g.sm_clock_mhz or 0)
        assert g.temperature_c is not None and 0 < g.temperature_c < 120
        assert g.throttle_mask is not None
    with GpuSampler(0.05, nvml=pynvml) as sampler:
        time.sleep(0.2)
    s = sampler.summary()
    assert len(s.gpus) == len(gpus)
    assert all("sm_clock_mhz" in g.stats for g in s.gpus)


def test_disable_flag_is_checked_against_its_positive_twin():
    from bisect_harness.observe.provenance import flag_report

    ok = flag_report({"disable-cuda-graph": True}, {"cuda_graph": False})
    assert ok.ok and ok.checks[0].status == "matched"
    bad = flag_report({"disable-cuda-graph": True}, {"cuda_graph": True})
    assert not bad.ok and bad.checks[0].status == "mismatched"


def test_flag_report_follows_dotted_paths_and_compare_modes():
    info = {"vllm_config": {"parallel_config": {"tensor_parallel_size": 4},
                            "model_config": {"dtype": "torch.bfloat16"},
                            "speculative_config": {"method": "eagle3", "num_speculative_tokens": 2, "model": "d"}}}
    aliases = {"tp": "vllm_config.parallel_config.tensor_parallel_size", "dtype": "vllm_config.model_config.dtype",
               "speculative-config": "vllm_config.speculative_config",
               "max-model-len": "vllm_config.model_config.max_model_len"}
    compare = {"dtype": "dtype", "speculative-config": "subset"}
    rep = flag_report({"tp": 8, "dtype": "bfloat16", "speculative-config": {"method": "eagle3"},
                       "max-model-len": 4096}, info, aliases=aliases, compare=compare)
    assert [(c.flag, c.status) for c in rep.checks] == [
        ("tp", "mismatched"), ("dtype", "matched"), ("speculative-config", "matched"),
        ("max-model-len", "not_reported")]
    assert rep.check("tp").key == "vllm_config.parallel_config.tensor_parallel_size"
    # without the modes, the same values would be mismatches
    plain = flag_report({"dtype": "bfloat16", "speculative-config": {"method": "eagle3"}}, info, aliases=aliases)
    assert [c.status for c in plain.checks] == ["mismatched", "mismatched"]


def test_the_packages_fingerprint_is_read_again_when_an_install_changes_a_path(tmp_path, monkeypatch):
    from bisect_harness.observe.provenance.host import packages_fingerprint

    monkeypatch.syspath_prepend(str(tmp_path))
    before = packages_fingerprint()
    assert packages_fingerprint() == before  # unchanged paths: the same reading
    info = tmp_path / "bh_probe_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bh-probe-pkg\nVersion: 1.0\n")
    installed = packages_fingerprint()
    assert installed[1] == before[1] + 1 and installed[0] != before[0]
    info.rename(tmp_path / "bh_probe_pkg-2.0.dist-info")
    (tmp_path / "bh_probe_pkg-2.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: bh-probe-pkg\nVersion: 2.0\n")
    upgraded = packages_fingerprint()
    assert upgraded[1] == installed[1] and upgraded[0] != installed[0]


def test_the_packages_fingerprint_is_not_read_again_when_a_run_writes_beside_it(tmp_path, monkeypatch):
    # Under `python -m`, the working folder is on sys.path, and a run writes its ledger
    # there on every boot: that is no install, and must not cost a reading of every
    # distribution's metadata per boot.
    import importlib.metadata as md

    from bisect_harness.observe.provenance.host import packages_fingerprint

    monkeypatch.syspath_prepend(str(tmp_path))
    before = packages_fingerprint()
    readings = []
    real = md.distributions
    monkeypatch.setattr(md, "distributions", lambda *a, **k: readings.append(1) or real(*a, **k))
    (tmp_path / "results.db-wal").write_bytes(b"x")
    (tmp_path / "experiments").mkdir()
    assert packages_fingerprint() == before
    assert readings == []


def test_host_provenance_reads_torch_without_importing_it():
    import subprocess
    import sys

    code = ("import sys, importlib.metadata as md\n"
            "from bisect_harness.observe.provenance.host import _torch_info\n"
            "version, _, _ = _torch_info(False)\n"
            "print(version == md.version('torch'), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr
