"""Know what really ran: the env each server process saw, the flags the server
applied, and the host and GPUs it ran on.

Three questions are answered from data at every boot:

* :func:`env_report` -- did the requested env vars reach the root server process
  *and every process it spawned*? (The classic failure: tensor-parallel workers
  started with a scrubbed env, so ``NCCL_*`` tuning never reached them.)
* :func:`flag_report` -- do the server's effective arguments (its server-info
  endpoint) agree with the flags we asked for?
* :func:`collect_host` -- hostname, kernel, boot id, CPU governor, packages, the
  engine commit, and per GPU the clocks, thermals, power and throttle reasons
  (through NVML). :class:`GpuSampler` records the same over a benchmark window.

Every result is a frozen dataclass with ``to_dict()`` (JSON-ready) and
``from_dict()``, so the ledger stores it as JSON.

Example::

    report = env_report(server.pid, {"NCCL_NVLS_ENABLE": "0"})
    if not report.ok:
        print(report.describe())

The NVML readers take an ``nvml`` argument: any object with the handful of
``pynvml`` functions used here (the real ``pynvml`` module in production, a
small fake in tests).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import socket
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil

from ..errors import UserError

#: Version of the dicts written by ``to_dict`` on the top-level results.
SCHEMA_VERSION = 1

_CMDLINE_MAX = 300


def _check_schema(d: Mapping[str, Any], kind: str) -> None:
    v = d.get("schema_version", SCHEMA_VERSION)
    if not isinstance(v, int) or v > SCHEMA_VERSION:
        raise UserError(
            f"{kind} record has schema_version {v!r}, newer than this harness understands "
            f"({SCHEMA_VERSION}); upgrade bisect-harness to read it.")


# --------------------------------------------------------------------------- env


@dataclass(frozen=True)
class ProcessEnv:
    """One process of the server's tree. ``readable`` is False when its environment
    could not be read (``error`` says why); such a process is not counted for or
    against propagation."""

    pid: int
    ppid: int | None
    name: str
    cmdline: str
    depth: int          # 0 for the root, 1 for its children, ...
    readable: bool
    error: str = ""

    @property
    def is_worker(self) -> bool:
        return self.depth > 0


@dataclass(frozen=True)
class VarReport:
    """Where one requested env var arrived. ``mismatched`` maps pid -> the value seen."""

    name: str
    requested: str
    matched: tuple[int, ...]
    mismatched: Mapping[int, str]
    absent: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return not self.mismatched and not self.absent

    def to_dict(self) -> dict:
        return {"name": self.name, "requested": self.requested, "matched": list(self.matched),
                "mismatched": {str(k): v for k, v in self.mismatched.items()},
                "absent": list(self.absent)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "VarReport":
        return cls(name=d["name"], requested=d["requested"], matched=tuple(d["matched"]),
                   mismatched={int(k): v for k, v in d["mismatched"].items()},
                   absent=tuple(d["absent"]))


@dataclass(frozen=True)
class EnvReport:
    """The env each process of a server's tree started with, for the requested vars.

    ``ok`` is True only when at least one process could be read and every requested
    var is present, with the requested value, in every readable process (root and
    all descendants). Linux exposes the environment a process was *started* with;
    a later ``os.environ`` edit inside the process is not visible here.
    """

    root_pid: int
    processes: tuple[ProcessEnv, ...]
    vars: tuple[VarReport, ...]
    note: str = ""

    @property
    def readable_pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.processes if p.readable)

    @property
    def unreadable(self) -> tuple[ProcessEnv, ...]:
        return tuple(p for p in self.processes if not p.readable)

    @property
    def workers(self) -> tuple[ProcessEnv, ...]:
        return tuple(p for p in self.processes if p.is_worker)

    @property
    def ok(self) -> bool:
        return bool(self.readable_pids) and all(v.ok for v in self.vars)

    def process(self, pid: int) -> ProcessEnv:
        for p in self.processes:
            if p.pid == pid:
                return p
        raise KeyError(pid)

    def describe(self) -> str:
        """A few lines naming each var that did not reach a process, and where."""
        lines = [f"env of process tree {self.root_pid}: {len(self.processes)} processes, "
                 f"{len(self.unreadable)} unreadable -> {'ok' if self.ok else 'NOT OK'}"]
        if self.note:
            lines.append(f"  note: {self.note}")
        for v in self.vars:
            if v.ok:
                continue
            for pid in v.absent:
                p = self.process(pid)
                lines.append(f"  {v.name} missing in pid {pid} ({p.name}): {p.cmdline[:80]}")
            for pid, val in v.mismatched.items():
                p = self.process(pid)
                lines.append(f"  {v.name}={val!r} (want {v.requested!r}) in pid {pid} ({p.name})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "root_pid": self.root_pid, "ok": self.ok,
                "note": self.note, "processes": [asdict(p) for p in self.processes],
                "vars": [v.to_dict() for v in self.vars]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EnvReport":
        _check_schema(d, "EnvReport")
        return cls(root_pid=d["root_pid"], note=d.get("note", ""),
                   processes=tuple(ProcessEnv(**p) for p in d["processes"]),
                   vars=tuple(VarReport.from_dict(v) for v in d["vars"]))


def _truncate(s: str, n: int = _CMDLINE_MAX) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def _tree(root: psutil.Process) -> list[tuple[psutil.Process, int]]:
    """Root and all descendants with their depth, breadth first."""
    out: list[tuple[psutil.Process, int]] = []
    frontier = [(root, 0)]
    seen: set[int] = set()
    while frontier:
        proc, depth = frontier.pop(0)
        if proc.pid in seen:
            continue
        seen.add(proc.pid)
        out.append((proc, depth))
        try:
            children = proc.children(recursive=False)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            children = []
        frontier.extend((c, depth + 1) for c in children)
    return out


def env_report(root_pid: int, requested: Mapping[str, str]) -> EnvReport:
    """Check that every ``requested`` var reached the process tree rooted at ``root_pid``.

    Walks the root and all its descendants (recursively), reads each one's
    environment and reports, per var, the pids where it has the requested value,
    another value, or is absent. A process whose environment cannot be read
    (permissions, it exited meanwhile, a zombie) is recorded as unreadable and
    counted neither way. Never raises for a process that vanished, including the
    root: that yields an empty, not-ok report with a note.
    """
    requested = {str(k): str(v) for k, v in requested.items()}
    note = ""
    try:
        root = psutil.Process(root_pid)
        members = _tree(root)
    except psutil.NoSuchProcess:
        members = []
        note = f"process {root_pid} does not exist (the server exited?)"

    processes: list[ProcessEnv] = []
    envs: dict[int, Mapping[str, str]] = {}
    for proc, depth in members:
        try:
            name = proc.name()
        except (psutil.Error, OSError):
            name = "?"
        try:
            cmdline = _truncate(" ".join(proc.cmdline()))
        except (psutil.Error, OSError):
            cmdline = ""
        try:
            ppid: int | None = proc.ppid()
        except (psutil.Error, OSError):
            ppid = None
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                raise psutil.ZombieProcess(proc.pid)
            envs[proc.pid] = proc.environ()
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, True))
        except psutil.ZombieProcess:
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, False,
                                        "zombie: exited, environment gone"))
        except psutil.NoSuchProcess:
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, False,
                                        "exited while being read"))
        except psutil.AccessDenied:
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, False,
                                        "access denied (another user's process?)"))
        except OSError as exc:
            processes.append(ProcessEnv(proc.pid, ppid, name, cmdline, depth, False,
                                        f"{type(exc).__name__}: {exc}"))
    if members and not envs:
        note = note or "no process of the tree could be read; propagation is unverified"

    vars_: list[VarReport] = []
    for var, want in requested.items():
        matched, absent, mismatched = [], [], {}
        for pid, env in envs.items():
            if var not in env:
                absent.append(pid)
            elif env[var] == want:
                matched.append(pid)
            else:
                mismatched[pid] = env[var]
        vars_.append(VarReport(var, want, tuple(matched), mismatched, tuple(absent)))
    return EnvReport(root_pid=root_pid, processes=tuple(processes), vars=tuple(vars_), note=note)


# ------------------------------------------------------------------------- flags

#: Where a server commonly reports a flag under another name (normalised keys).
DEFAULT_FLAG_ALIASES: Mapping[str, tuple[str, ...]] = {
    "tp": ("tp_size", "tensor_parallel_size"),
    "tp_size": ("tp", "tensor_parallel_size"),
    "tensor_parallel_size": ("tp_size", "tp"),
    "dp": ("dp_size", "data_parallel_size"),
    "dp_size": ("dp", "data_parallel_size"),
    "pp": ("pp_size", "pipeline_parallel_size"),
    "pp_size": ("pp", "pipeline_parallel_size"),
    "model": ("model_path",),
    "model_path": ("model",),
}

MATCHED, MISMATCHED, NOT_REPORTED = "matched", "mismatched", "not_reported"

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def normalise_flag(key: str) -> str:
    """``--tp-size`` -> ``tp_size``."""
    return str(key).strip().lstrip("-").replace("-", "_")


def _as_bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str):
        s = v.strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
    return None


def _as_number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def _as_sequence(v: Any) -> list | None:
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, str):
        s = v.strip()
        if s.startswith("["):
            try:
                parsed = json.loads(s)
            except ValueError:
                return None
            return parsed if isinstance(parsed, list) else None
        parts = [p for p in s.replace(",", " ").split() if p]
        return parts if len(parts) > 1 else None
    return None


def _as_mapping(v: Any) -> dict | None:
    if isinstance(v, Mapping):
        return dict(v)
    if isinstance(v, str) and v.strip().startswith("{"):
        try:
            parsed = json.loads(v)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def values_equal(requested: Any, effective: Any) -> bool:
    """Type-tolerant equality of a requested flag value and a server-reported one:
    ``2 == "2" == 2.0``, ``True == "true"``, ``[1, 2] == "1,2"``, dicts by their
    items (or a JSON string), and a requested ``False`` (flag omitted) matches an
    effective ``None``."""
    if requested is None or effective is None:
        if requested is None and effective is None:
            return True
        other = effective if requested is None else requested
        return requested is False or other == "" or (
            isinstance(other, str) and other.strip().lower() in ("none", "null"))
    rm, em = _as_mapping(requested), _as_mapping(effective)
    if rm is not None or em is not None:
        if rm is None or em is None or set(map(str, rm)) != set(map(str, em)):
            return False
        em_s = {str(k): v for k, v in em.items()}
        return all(values_equal(v, em_s[str(k)]) for k, v in rm.items())
    if isinstance(requested, (list, tuple)) or isinstance(effective, (list, tuple)):
        rs, es = _as_sequence(requested), _as_sequence(effective)
        if rs is None:
            rs = [requested]
        if es is None:
            es = [effective]
        return len(rs) == len(es) and all(values_equal(a, b) for a, b in zip(rs, es))
    if isinstance(requested, bool) or isinstance(effective, bool):
        rb, eb = _as_bool(requested), _as_bool(effective)
        return rb is not None and rb == eb
    if str(requested).strip() == str(effective).strip():
        return True
    rn, en = _as_number(requested), _as_number(effective)
    if rn is not None and en is not None:
        return math.isclose(rn, en, rel_tol=1e-9, abs_tol=1e-12)
    rb, eb = _as_bool(requested), _as_bool(effective)
    return rb is not None and eb is not None and (rn is None or en is None) and rb == eb


@dataclass(frozen=True)
class FlagCheck:
    """One requested flag against the server's effective arguments. ``key`` is the
    server-info key it was found under (or the first one tried, when not reported)."""

    flag: str
    key: str
    requested: Any
    effective: Any
    status: str  # matched | mismatched | not_reported

    def to_dict(self) -> dict:
        return {"flag": self.flag, "key": self.key, "requested": _jsonable(self.requested),
                "effective": _jsonable(self.effective), "status": self.status}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FlagCheck":
        return cls(d["flag"], d["key"], d["requested"], d["effective"], d["status"])


@dataclass(frozen=True)
class FlagReport:
    """Requested flags against the server's effective arguments. ``ok`` is False on
    any mismatch; a flag the server does not report is not a mismatch (it is listed
    under ``not_reported`` so a reader sees what could not be checked)."""

    checks: tuple[FlagCheck, ...]
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.mismatched

    @property
    def matched(self) -> tuple[FlagCheck, ...]:
        return tuple(c for c in self.checks if c.status == MATCHED)

    @property
    def mismatched(self) -> tuple[FlagCheck, ...]:
        return tuple(c for c in self.checks if c.status == MISMATCHED)

    @property
    def not_reported(self) -> tuple[FlagCheck, ...]:
        return tuple(c for c in self.checks if c.status == NOT_REPORTED)

    def check(self, flag: str) -> FlagCheck:
        for c in self.checks:
            if c.flag == flag or normalise_flag(c.flag) == normalise_flag(flag):
                return c
        raise KeyError(flag)

    def describe(self) -> str:
        lines = [f"flags: {len(self.matched)} matched, {len(self.mismatched)} mismatched, "
                 f"{len(self.not_reported)} not reported"]
        if self.note:
            lines.append(f"  note: {self.note}")
        for c in self.mismatched:
            lines.append(f"  --{c.flag}: requested {c.requested!r}, server has {c.key}={c.effective!r}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "ok": self.ok, "note": self.note,
                "checks": [c.to_dict() for c in self.checks]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FlagReport":
        _check_schema(d, "FlagReport")
        return cls(tuple(FlagCheck.from_dict(c) for c in d["checks"]), d.get("note", ""))


def _jsonable(v: Any) -> Any:
    try:
        json.dumps(v)
        return v
    except (TypeError, ValueError):
        return json.loads(json.dumps(v, default=str))


_DTYPE_SPELLINGS = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32",
                   "fp32": "float32", "double": "float64", "fp8": "float8_e4m3fn"}


def _dtype_name(v: Any) -> str | None:
    """``torch.bfloat16``, ``bfloat16`` and ``bf16`` -> ``bfloat16``; None for a non-string."""
    if not isinstance(v, str):
        return None
    s = v.strip().lower()
    s = s[len("torch."):] if s.startswith("torch.") else s
    return _DTYPE_SPELLINGS.get(s, s)


def _subset(requested: Any, effective: Any) -> bool:
    rm, em = _as_mapping(requested), _as_mapping(effective)
    if rm is None or em is None:
        return values_equal(requested, effective)
    em_s = {str(k): v for k, v in em.items()}
    return all(str(k) in em_s and _subset(v, em_s[str(k)]) for k, v in rm.items())


def values_match(requested: Any, effective: Any, mode: str = "equal") -> bool:
    """Compare a requested flag value with a reported one by ``mode``: ``equal``
    (:func:`values_equal`), ``dtype`` (torch spellings: ``torch.bfloat16`` ==
    ``bfloat16`` == ``bf16``) or ``subset`` (every requested key of a mapping is
    reported with an equal value, recursively; the server may report more)."""
    if mode == "dtype":
        a, b = _dtype_name(requested), _dtype_name(effective)
        return values_equal(requested, effective) if a is None or b is None else a == b
    if mode == "subset":
        return _subset(requested, effective)
    if mode != "equal":
        raise ValueError(f"unknown compare mode {mode!r}")
    return values_equal(requested, effective)


def _reported(server_info: Mapping[str, Any], flat: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of ``key`` in server info: a top-level key (normalised), else a dotted path."""
    if key in flat:
        return True, flat[key]
    if "." in key:
        from ..sources import lookup

        try:
            return True, lookup(server_info, key)
        except KeyError:
            return False, None
    return False, None


def flag_report(requested: Mapping[str, Any], server_info: Mapping[str, Any] | None, *,
                aliases: Mapping[str, str] | None = None,
                compare: Mapping[str, str] | None = None) -> FlagReport:
    """Compare requested flags (YAML keys such as ``speculative-num-steps``) with a
    server's effective arguments (SGLang's flat ``/server_info``, or vLLM's nested
    ``{"vllm_config": {...}}``).

    A flag is looked up under, in order: its entry in ``aliases`` (keyed by the
    flag as written or normalised; a dotted path such as
    ``vllm_config.parallel_config.tensor_parallel_size`` is followed into nested
    objects), its normalised name (``-`` -> ``_``), then
    :data:`DEFAULT_FLAG_ALIASES`. Values compare with :func:`values_match` by the
    flag's mode in ``compare`` (default ``equal``). ``server_info`` None (the server
    has no info endpoint) reports every flag as not reported, with a note.
    """
    aliases = dict(aliases or {})
    compare = dict(compare or {})
    checks: list[FlagCheck] = []
    info = {normalise_flag(k): v for k, v in server_info.items()} if server_info is not None else None
    for flag, want in requested.items():
        norm = normalise_flag(flag)
        mode = compare.get(flag) or compare.get(norm) or "equal"
        candidates: list[str] = []
        for a in (aliases.get(flag), aliases.get(norm), aliases.get("--" + str(flag))):
            if a:
                candidates.append(a if "." in a else normalise_flag(a))
        candidates.append(norm)
        candidates.extend(DEFAULT_FLAG_ALIASES.get(norm, ()))
        if info is None:
            checks.append(FlagCheck(flag, candidates[0], want, None, NOT_REPORTED))
            continue
        key, got = None, None
        for c in candidates:
            found, value = _reported(server_info, info, c)
            if found:
                key, got = c, value
                break
        if key is None and norm.startswith(("disable_", "no_")) and _as_bool(want) is not None:
            # `--disable-cuda-graph` is reported by its positive twin: cuda_graph = not want
            positive = norm.split("_", 1)[1]
            if positive in info:
                got = info[positive]
                status = MATCHED if values_equal(not _as_bool(want), got) else MISMATCHED
                checks.append(FlagCheck(flag, f"!{positive}", want, got, status))
                continue
        if key is None:
            checks.append(FlagCheck(flag, candidates[0], want, None, NOT_REPORTED))
            continue
        status = MATCHED if values_match(want, got, mode) else MISMATCHED
        checks.append(FlagCheck(flag, key, want, got, status))
    note = "" if server_info is not None else \
        "the server reported no effective arguments (no server-info endpoint answered)"
    return FlagReport(tuple(checks), note)


# --------------------------------------------------------------------- NVML reads

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


# --------------------------------------------------------------------------- host


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


def packages_fingerprint() -> tuple[str, int]:
    """sha256 over the sorted ``name==version`` of installed distributions, and their count."""
    import importlib.metadata as md

    items = sorted({f"{(d.metadata['Name'] or '').lower()}=={d.version}" for d in md.distributions()
                    if d.metadata["Name"]})
    return hashlib.sha256("\n".join(items).encode()).hexdigest(), len(items)


def _torch_info() -> tuple[str | None, bool, str | None]:
    try:
        import torch
    except ImportError:
        return None, False, None
    try:
        available = bool(torch.cuda.is_available())
    except Exception:
        available = False
    return torch.__version__, available, getattr(torch.version, "cuda", None)


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
    torch_version, cuda_ok, torch_cuda = _torch_info()
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


# ------------------------------------------------------------------------ sampler


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


__all__ = [
    "BENIGN_THROTTLE_REASONS", "DEFAULT_FLAG_ALIASES", "EnvReport", "FlagCheck", "FlagReport",
    "GpuInfo", "GpuSampler", "GpuSummary", "HostInfo", "ProcessEnv", "SamplerSummary", "Stat",
    "THROTTLE_REASONS", "VarReport", "collect_host", "cpu_governor", "decode_throttle_reasons",
    "engine_state", "env_report", "flag_report", "normalise_flag", "packages_fingerprint",
    "read_gpu", "read_gpus", "sample_gpu", "values_equal", "values_match",
]
