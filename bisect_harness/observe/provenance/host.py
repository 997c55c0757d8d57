"""What host is this? :func:`collect_host` snapshots hostname, kernel, boot id, CPU
governor, packages, the engine commit, and per GPU the clocks, thermals, power
and throttle reasons (through NVML).

The NVML readers take an ``nvml`` argument: any object with the handful of
``pynvml`` functions used here (the real ``pynvml`` module in production, a
small fake in tests).
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import psutil

from bisect_harness.observe.provenance._schema import SCHEMA_VERSION, _check_schema

#: NVML clock-event ("throttle") reason bits, from nvml.h.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)

#: Reasons that say nothing is wrong (an idle GPU lowers its clocks by design).
BENIGN_THROTTLE_REASONS = frozenset({"gpu_idle"})

_NVML_CLOCK_SM, _NVML_CLOCK_MEM, _NVML_TEMPERATURE_GPU = 1, 2, 0


def decode_throttle_reasons(mask: int) -> tuple[str, ...]:
    """Names of the bits set in an NVML clocks-event-reasons mask; an unknown bit
    is named ``unknown_0x...`` rather than dropped."""
    names, known = [], 0
    for bit, name in THROTTLE_REASONS:
        known |= bit
        if mask & bit:
            names.append(name)
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _cuda_version_str(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML saw it at one moment. A field NVML could not read is None,
    and ``errors`` names it."""

    index: int
    name: str | None = None
    uuid: str | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_mask: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    ecc_mode: bool | None = None
    mig_mode: bool | None = None
    persistence_mode: bool | None = None
    errors: tuple[str, ...] = ()

    @property
    def active_throttle_reasons(self) -> tuple[str, ...]:
        """Throttle reasons other than the benign ones (an idle GPU)."""
        return tuple(r for r in self.throttle_reasons if r not in BENIGN_THROTTLE_REASONS)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["throttle_reasons"] = list(self.throttle_reasons)
        d["errors"] = list(self.errors)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GpuInfo":
        d = dict(d)
        d["throttle_reasons"] = tuple(d.get("throttle_reasons", ()))
        d["errors"] = tuple(d.get("errors", ()))
        return cls(**d)


def _throttle_mask(nvml: Any, handle: Any) -> int:
    fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons")
    return int(fn(handle))


def read_gpu(nvml: Any, index: int, *, driver_version: str | None = None,
             cuda_version: str | None = None) -> GpuInfo:
    """Read one GPU through ``nvml`` (initialised by the caller). Each field is read
    on its own: a field the device does not support becomes None and is named in
    ``errors``; nothing raises past this function except a failure to get the handle."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    errors: list[str] = []
    clock_sm = getattr(nvml, "NVML_CLOCK_SM", _NVML_CLOCK_SM)
    clock_mem = getattr(nvml, "NVML_CLOCK_MEM", _NVML_CLOCK_MEM)
    temp_gpu = getattr(nvml, "NVML_TEMPERATURE_GPU", _NVML_TEMPERATURE_GPU)

    def get(label: str, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # NVMLError_NotSupported and friends, per field
            errors.append(f"{label}: {exc}")
            return None

    name = get("name", lambda: _s(nvml.nvmlDeviceGetName(handle)))
    uuid = get("uuid", lambda: _s(nvml.nvmlDeviceGetUUID(handle)))
    sm = get("sm_clock", nvml.nvmlDeviceGetClockInfo, handle, clock_sm)
    sm_max = get("sm_clock_max", nvml.nvmlDeviceGetMaxClockInfo, handle, clock_sm)
    mem = get("mem_clock", nvml.nvmlDeviceGetClockInfo, handle, clock_mem)
    mem_max = get("mem_clock_max", nvml.nvmlDeviceGetMaxClockInfo, handle, clock_mem)
    temp = get("temperature", nvml.nvmlDeviceGetTemperature, handle, temp_gpu)
    power_mw = get("power", nvml.nvmlDeviceGetPowerUsage, handle)
    limit_mw = get("power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
    mask = get("throttle_reasons", _throttle_mask, nvml, handle)
    ecc = get("ecc_mode", lambda: nvml.nvmlDeviceGetEccMode(handle)[0])
    mig = get("mig_mode", lambda: nvml.nvmlDeviceGetMigMode(handle)[0])
    persistence = get("persistence_mode", nvml.nvmlDeviceGetPersistenceMode, handle)
    return GpuInfo(
        index=index, name=name, uuid=uuid, driver_version=driver_version,
        cuda_version=cuda_version,
        sm_clock_mhz=None if sm is None else int(sm),
        sm_clock_max_mhz=None if sm_max is None else int(sm_max),
        mem_clock_mhz=None if mem is None else int(mem),
        mem_clock_max_mhz=None if mem_max is None else int(mem_max),
        temperature_c=None if temp is None else int(temp),
        power_w=None if power_mw is None else power_mw / 1000.0,
        power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
        throttle_mask=mask,
        throttle_reasons=decode_throttle_reasons(mask) if mask is not None else (),
        ecc_mode=None if ecc is None else bool(ecc),
        mig_mode=None if mig is None else bool(mig),
        persistence_mode=None if persistence is None else bool(persistence),
        errors=tuple(errors))


def read_gpus(nvml: Any) -> tuple[list[GpuInfo], str]:
    """All GPUs through ``nvml``: ``(gpus, note)``. Never raises: when NVML cannot be
    initialised (no driver, no GPU) the list is empty and the note says why."""
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return [], f"NVML unavailable ({type(exc).__name__}: {exc}); no GPU information"
    try:
        try:
            driver = _s(nvml.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        try:
            cuda = _cuda_version_str(int(nvml.nvmlSystemGetCudaDriverVersion()))
        except Exception:
            cuda = None
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            return [], f"NVML could not count GPUs ({type(exc).__name__}: {exc})"
        gpus, notes = [], []
        for i in range(count):
            try:
                gpus.append(read_gpu(nvml, i, driver_version=driver, cuda_version=cuda))
            except Exception as exc:
                notes.append(f"GPU {i} unreadable ({type(exc).__name__}: {exc})")
        if count == 0:
            notes.append("NVML reports no GPU")
        return gpus, "; ".join(notes)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _default_nvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


@dataclass(frozen=True)
class HostInfo:
    """What the host was at one moment: identity, OS, CPU, packages, engine commit,
    and each GPU. ``gpus`` is empty and ``gpu_note`` says why when there is no GPU."""

    hostname: str
    kernel: str
    os: str
    boot_id: str | None
    boot_time: float | None
    cpu_model: str
    cpu_count_logical: int | None
    cpu_count_physical: int | None
    cpu_governor: str | None
    load_avg: tuple[float, float, float]
    mem_total_bytes: int
    mem_available_bytes: int
    python_version: str
    torch_version: str | None
    torch_cuda_available: bool
    torch_cuda_version: str | None
    packages_hash: str
    packages_count: int
    engine_commit: str | None
    engine_dirty: bool | None
    engine_note: str
    gpus: tuple[GpuInfo, ...]
    gpu_note: str
    collected_at: float

    @property
    def driver_version(self) -> str | None:
        return self.gpus[0].driver_version if self.gpus else None

    @property
    def cuda_version(self) -> str | None:
        return self.gpus[0].cuda_version if self.gpus else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["load_avg"] = list(self.load_avg)
        d["gpus"] = [g.to_dict() for g in self.gpus]
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "HostInfo":
        _check_schema(d, "HostInfo")
        d = {k: v for k, v in d.items() if k != "schema_version"}
        d["load_avg"] = tuple(d["load_avg"])
        d["gpus"] = tuple(GpuInfo.from_dict(g) for g in d["gpus"])
        return cls(**d)


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _cpu_model() -> str:
    text = _read_text("/proc/cpuinfo") or ""
    for line in text.splitlines():
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_governor() -> str | None:
    """The CPU frequency governor: one name when all CPUs agree, ``mixed: a,b`` when
    they differ, None where the kernel exposes no cpufreq (VMs, containers)."""
    govs = set()
    base = Path("/sys/devices/system/cpu")
    for p in sorted(base.glob("cpu[0-9]*/cpufreq/scaling_governor")):
        g = _read_text(str(p))
        if g:
            govs.add(g)
    if not govs:
        return None
    return govs.pop() if len(govs) == 1 else "mixed: " + ",".join(sorted(govs))


_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")


def _path_stamp() -> tuple:
    """The distributions' metadata on ``sys.path``: each folder with the names of its
    ``*.dist-info`` / ``*.egg-info`` entries. An install, upgrade or removal adds,
    renames (the name holds the version) or removes one, so a fingerprint taken under
    the same stamp still holds. Not the folders' modification times: the working folder
    is on ``sys.path`` under ``python -m``, and a run writes its ledger there on every boot."""
    stamp = []
    for entry in sys.path:
        try:
            names = sorted(n for n in os.listdir(entry or ".") if n.endswith(_METADATA_SUFFIXES))
        except OSError:
            names = None
        stamp.append((entry, tuple(names) if names is not None else None))
    return tuple(stamp)


_packages_seen: tuple[tuple, tuple[str, int]] | None = None  # (stamp, fingerprint) of the last reading


def packages_fingerprint() -> tuple[str, int]:
    """sha256 over the sorted ``name==version`` of installed distributions, and their count.

    Reading every distribution's metadata costs a second or more; it is read again
    only when the distributions on ``sys.path`` changed since the last reading (every
    boot takes this fingerprint)."""
    import importlib.metadata as md

    global _packages_seen
    stamp = _path_stamp()
    if _packages_seen is None or _packages_seen[0] != stamp:
        items = sorted({f"{(d.metadata['Name'] or '').lower()}=={d.version}" for d in md.distributions()
                        if d.metadata["Name"]})
        _packages_seen = stamp, (hashlib.sha256("\n".join(items).encode()).hexdigest(), len(items))
    return _packages_seen[1]


def _torch_info(gpus_seen: bool) -> tuple[str | None, bool, str | None]:
    """The harness's own torch: version, whether CUDA is usable, the CUDA it was built for.

    Importing torch costs seconds, so a harness that has not imported it reads the
    version from the distribution's metadata and the CUDA build from its
    ``torch/version.py``; CUDA then counts as usable when torch is a CUDA build and
    NVML saw a GPU (``gpus_seen``, from the caller's own reading)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            available = bool(torch.cuda.is_available())
        except Exception:
            available = False
        return torch.__version__, available, getattr(torch.version, "cuda", None)
    import importlib.metadata as md

    try:
        dist = md.distribution("torch")
    except md.PackageNotFoundError:
        return None, False, None
    cuda = None
    try:
        text = Path(dist.locate_file("torch/version.py")).read_text(errors="replace")
        m = re.search(r"^cuda(?::\s*[^=]+)?\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
        cuda = m.group(1) if m else None
    except OSError:
        pass
    return dist.version, cuda is not None and gpus_seen, cuda


def engine_state(engine_repo: Path, commit: str | None = None) -> tuple[str | None, bool | None, str]:
    """``(commit, dirty, note)`` for an engine's git worktree. ``commit`` given is
    recorded as-is (the caller resolved it); otherwise HEAD is read."""
    note = ""
    sha = commit
    try:
        if sha is None:
            r = subprocess.run(["git", "-C", str(engine_repo), "rev-parse", "HEAD"],
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                sha = r.stdout.strip()
            else:
                note = f"git rev-parse failed: {r.stderr.strip()[:200]}"
        r = subprocess.run(["git", "-C", str(engine_repo), "status", "--porcelain",
                            "--untracked-files=no"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            return sha, None, (note + "; " if note else "") + \
                f"git status failed: {r.stderr.strip()[:200]}"
        return sha, bool(r.stdout.strip()), note
    except (OSError, subprocess.TimeoutExpired) as exc:
        return sha, None, f"git unavailable: {type(exc).__name__}: {exc}"


def collect_host(engine_repo: Path | None = None, commit: str | None = None, *,
                 nvml: Any | None = None) -> HostInfo:
    """Snapshot this host. Never raises for a missing GPU, NVML, cpufreq or git:
    those fields become None (or ``gpus=[]``) with a note. ``nvml`` defaults to the
    ``pynvml`` module."""
    u = platform.uname()
    vm = psutil.virtual_memory()
    try:
        load = tuple(float(x) for x in os.getloadavg())
    except OSError:
        load = (0.0, 0.0, 0.0)
    try:
        boot_time: float | None = psutil.boot_time()
    except Exception:
        boot_time = None
    pkg_hash, pkg_count = packages_fingerprint()
    if engine_repo is not None:
        eng_commit, eng_dirty, eng_note = engine_state(Path(engine_repo), commit)
    else:
        eng_commit, eng_dirty, eng_note = commit, None, "no engine repository given"
    mod = nvml if nvml is not None else _default_nvml()
    if mod is None:
        gpus, gpu_note = [], "pynvml is not installed; no GPU information"
    else:
        gpus, gpu_note = read_gpus(mod)
    torch_version, cuda_ok, torch_cuda = _torch_info(bool(gpus))
    try:
        os_name = platform.freedesktop_os_release().get("PRETTY_NAME", u.system)
    except (OSError, AttributeError):
        os_name = f"{u.system} {u.release}"
    return HostInfo(
        hostname=socket.gethostname(), kernel=u.release, os=os_name,
        boot_id=_read_text("/proc/sys/kernel/random/boot_id"), boot_time=boot_time,
        cpu_model=_cpu_model(), cpu_count_logical=psutil.cpu_count(logical=True),
        cpu_count_physical=psutil.cpu_count(logical=False), cpu_governor=cpu_governor(),
        load_avg=load, mem_total_bytes=int(vm.total), mem_available_bytes=int(vm.available),
        python_version=platform.python_version(), torch_version=torch_version,
        torch_cuda_available=cuda_ok, torch_cuda_version=torch_cuda,
        packages_hash=pkg_hash, packages_count=pkg_count,
        engine_commit=eng_commit, engine_dirty=eng_dirty, engine_note=eng_note,
        gpus=tuple(gpus), gpu_note=gpu_note, collected_at=time.time())


__all__ = ["BENIGN_THROTTLE_REASONS", "GpuInfo", "HostInfo", "THROTTLE_REASONS", "collect_host",
           "cpu_governor", "decode_throttle_reasons", "engine_state", "packages_fingerprint",
           "read_gpu", "read_gpus"]
