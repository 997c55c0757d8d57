"""The boot procedure: the whole life of one boot on the host it runs on.

:func:`boot_events` checks out and builds the commit (once, in its own
environment), launches the server (or attaches to a running one), verifies that
the env reached every worker and that the flags took effect, warms up, measures
the samples while watching the host, and tears down. It takes a frozen
:class:`~bisect_harness.boot.BootRequest` and hands back what happens as events
(the launch, each sample the moment it is measured, the frozen
:class:`~bisect_harness.boot.BootOutcome` last), returning the outcome; it never
touches the ledger. :func:`run_boot` is the same boot as a plain call, its events
handed to a :class:`~bisect_harness.boot.Sink`, returning the boot whole (its
outcome with its samples). Every backend boots through it: the local backend on
this host, the Slurm backend on a cluster node. The checks a boot runs on itself
(what they mark and record) are :mod:`~bisect_harness.backends.checks`; the boot's
facts go into its :class:`~bisect_harness.evidence.BootEvidence` field by field.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generator, Mapping

import httpx

from bisect_harness.engines import attach, benchtools, integrity, preset_flags, presets, profilers
from bisect_harness.observe import contention, engine_identity, provenance
from bisect_harness.engines.checkout import read_tail
from bisect_harness.engines.recipe import checkout, placeholders, process_env, working_dir
from bisect_harness.engines.rejection import FLAG_NOT_ACCEPTED
from bisect_harness.errors import BootFailed, BuildFailed, ConfigFailure, FlagNotAccepted
from bisect_harness.model import jsonable, utcnow
from bisect_harness.measure.sources import SourceCollector
from bisect_harness.workload import boot_order
from bisect_harness.boot import (BootOutcome, BootRequest, Event, Finished, Message, SampleOutcome, Sampled, Sink,
                                 Started)
from bisect_harness.boot import deliver
from bisect_harness.backends import checks
from bisect_harness.backends.checks import fetch_server_info
from bisect_harness.evidence import BootEvidence, BootStatus

__all__ = ["boot_events", "run_boot", "host_fingerprint", "this_host", "fetch_server_info"]


# --------------------------------------------------------------------------- helpers


def host_fingerprint(host: provenance.HostInfo) -> str:
    """What makes two boots comparable hosts: machine, boot, GPUs, driver."""
    import hashlib
    import json

    keys = {"hostname": host.hostname, "boot_id": host.boot_id, "kernel": host.kernel, "cpu_model": host.cpu_model,
            "gpus": [(g.uuid, g.driver_version) for g in host.gpus]}
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def this_host() -> tuple[dict, str]:
    """This host's description and fingerprint (machine, boot id, GPUs: fixed for a process)."""
    host = provenance.collect_host()
    return host.to_dict(), host_fingerprint(host)




def _source(req: BootRequest):
    return (attach.AttachedSource if req.endpoint is not None else attach.LaunchedSource)(req.api_key_env)


class _Config:
    """What ``attach`` sources look at: the arm's endpoint."""

    def __init__(self, endpoint: str | None):
        self.arm = type("ArmView", (), {"endpoint": endpoint})()


def _with_devices(req: BootRequest, argv: list[str], env: dict[str, str]) -> list[str]:
    """Pin the boot to its device set: GPUs through ``CUDA_VISIBLE_DEVICES``, CPU cores
    through ``taskset`` (inherited by every process the server starts)."""
    d = req.devices
    if d is None:
        return argv
    if d.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, d.gpus))
    if d.cpus is not None and req.endpoint is None and shutil.which("taskset"):
        return ["taskset", "-c", ",".join(map(str, d.cpus)), *argv]
    return argv


# --------------------------------------------------------------------------- one boot


class _Boot:
    """The mutable record of one boot in progress, frozen into an outcome at the end.
    Its evidence is built with :meth:`note`, field by field (``evidence.BootEvidence``)."""

    def __init__(self, req: BootRequest):
        self.req = req
        self.status = BootStatus.RUNNING
        self.failure: str | None = None
        self.config_failure: str | None = None
        self.config_status: str | None = None
        self.fatal: str | None = None
        self.log_tail: str | None = None
        self.log_path = req.log_path
        self.port: int | None = None
        self.argv: tuple[str, ...] = ()
        self.ready_s: float | None = None
        self.evidence = BootEvidence()
        self.host: provenance.HostInfo | None = None  # the host as the boot's end saw it
        self.env_report = self.flag_report = self.server_info = None
        self.marks: list[str] = []
        self.source_problems: list[str] = []
        self.started_at = utcnow()
        self.busy = False
        self.retries = checks.Retries()
        self.usage_diffs: dict[int, int] = {}  # chunks of text - the server's token count: requests
        self.usage_examples: dict[int, str] = {}

    def note(self, **facts: Any) -> None:
        """Set fields of the boot's evidence (``None`` takes one back); a name that is no
        field of ``BootEvidence`` is an error."""
        self.evidence = self.evidence.with_(**facts)

    def outcome(self) -> BootOutcome:
        """The boot as it stands, frozen; its samples went before it, as events."""
        checks.usage_verdict(self)  # over every request so far (idempotent)
        fp = host_fingerprint(self.host) if self.host is not None else this_host()[1]
        return BootOutcome(
            boot_id=self.req.boot_id, status=self.status, failure=self.failure, config_failure=self.config_failure,
            config_status=self.config_status, fatal=self.fatal, log_tail=self.log_tail, log_path=self.log_path,
            port=self.port, argv=tuple(self.argv), ready_s=self.ready_s, host_fingerprint=fp,
            evidence=self.evidence, env_report=self.env_report, flag_report=self.flag_report,
            server_info=self.server_info, marks=tuple(self.marks), source_problems=tuple(self.source_problems),
            started_at=self.started_at, finished_at=utcnow(), busy=self.busy)


def _rendered(value: Any, places: Mapping[str, str]) -> Any:
    """A flag's value as the server got it: placeholders (``{spec_dir}/m.gguf``) substituted."""
    if isinstance(value, str):
        return presets.render_argv([value], **places)[0]
    if isinstance(value, (list, tuple)):
        return [_rendered(v, places) for v in value]
    return value


def _verify(b: _Boot, req: BootRequest, server, base_url: str, headers: Mapping[str, str],
            places: Mapping[str, str]) -> dict | None:
    """Did the env reach every worker, did the flags take effect? Mark, exclude or stop.
    A flag's requested value is compared as rendered into the argv."""
    rules = req.checks
    info = fetch_server_info(base_url, req.server_info_paths, headers=headers, limit=req.benchmark.limits.body_bytes)
    b.server_info = info
    reported = engine_identity.read_reported_version(base_url, info, headers=headers)  # which code ran
    b.note(engine_version=reported.to_dict())
    if req.release is not None:  # a released build says which version it is: the one asked for?
        other = sorted({v for v in reported.values.values() if v != req.release.version})
        if other and req.release.version not in reported.values.values():
            b.marks.append("release_mismatch")
            b.note(release_mismatch=f"asked for {req.release.describe()}, the server reports {', '.join(other)}")
    # An attached server has no process of ours (pid None) and no env of ours to check.
    env_rep = provenance.env_report(server.pid, dict(req.arm_env)) if server.pid is not None else None
    checkable = {f: _rendered(v, places) for f, v, _k, _m in req.flag_checks}
    flag_rep = provenance.flag_report(checkable, info, aliases={f: k for f, _v, k, _m in req.flag_checks},
                                      compare={f: m for f, _v, _k, m in req.flag_checks})
    b.env_report, b.flag_report = (env_rep.to_dict() if env_rep else None), flag_rep.to_dict()
    if env_rep is not None and env_rep.state == "missing":
        b.marks.append("env_missing")
    elif env_rep is not None and env_rep.state == "unverified" and env_rep.vars:
        # not shown missing, not shown present: a mark of its own, never excluded or fatal
        b.marks.append("env_unverified")
    if not flag_rep.ok:
        b.marks.append("flag_mismatch")
    sup = getattr(server, "supervisor_pid", None)
    if sup is not None:  # launched on 127.0.0.1 by the harness: is it reachable from elsewhere?
        listening = provenance.listening_report(sup, server_ports=(b.port,) if b.port else ())
        b.note(listening=listening.to_dict())
        if listening.beyond_loopback:
            b.marks.append("listens_beyond_loopback")
    for mark, mode, what in (("env_missing", rules.env_check, env_rep), ("flag_mismatch", rules.flag_check, flag_rep)):
        if mark not in b.marks:
            continue
        if mode == "exclude":
            b.status = BootStatus.EXCLUDED
        elif mode == "fatal":
            b.status, b.fatal = BootStatus.FATAL, "user"
            key = f"defaults.{mark.split('_')[0]}_check"
            b.failure = (f"{mark}: {what.describe()} ({key} is fatal: make the engine pass it on, "
                         f"or set {key}: mark to measure and flag such boots)")
    return info


def _flag_not_accepted(b: _Boot, req: BootRequest, exc: FlagNotAccepted) -> None:
    """A refused flag fails the config at this commit: marked, with the preset's notes on it."""
    b.marks.append(FLAG_NOT_ACCEPTED)
    notes = presets.notes_for(exc.engine_message, presets.get_preset(req.preset))
    own = preset_flags.refused_preset_flag(exc.engine_message, req.preset_flags)
    if own is not None:  # not the file's flag: the preset's launch adds it, and this build lacks it
        notes.insert(0, f"this build refused its preset's flag {own}: the {req.preset} preset's launch adds it; "
                        "write engine.launch without it for builds this old")
    b.note(flag_not_accepted={"commit": req.commit, "engine_message": exc.engine_message, "notes": notes})
    where = f"at commit {req.commit[:12]}" if req.commit else "by the installed server"
    b.config_failure = f"flag not accepted {where}: {exc.engine_message}" + "".join(f" ({n})" for n in notes)
    b.config_status = "boot_failed"


#: Each build's answer to a help argv, once per process: (help argv, folder, commit) -> Adapted
_ADAPTED: dict[tuple, preset_flags.Adapted] = {}


def _adapt_preset_flags(req: BootRequest, argv: list[str], env: Mapping[str, str], cwd: Path,
                        places: Mapping[str, str]) -> preset_flags.Adapted:
    """``argv`` without the preset's own options this build's help does not name
    (``engines/preset_flags``); the help is read once per build and folder."""
    help_argv = presets.render_argv(list(req.help_argv), **places)
    key = (tuple(help_argv), str(cwd), req.commit, env.get("PATH"))
    seen = _ADAPTED.get(key)
    if seen is None or not seen.checked:
        seen = preset_flags.adapt_launch(argv, req.preset_flags, help_argv, env=env, cwd=cwd)
        _ADAPTED[key] = seen
    return preset_flags.Adapted(tuple(preset_flags.without(argv, seen.dropped)), dropped=seen.dropped,
                                kept=seen.kept, checked=seen.checked, why=seen.why)


class _Whole(Sink):
    """A boot's samples gathered on their way to ``sink``: :func:`run_boot` returns them
    with the outcome, the boot as one value."""

    def __init__(self, sink: Sink | None):
        self.sink = sink or Sink()
        self.samples: list[SampleOutcome] = []

    def started(self, request, port, argv, log_path) -> None:
        self.sink.started(request, port, argv, log_path)

    def sample(self, request, sample) -> None:
        self.samples.append(sample)
        self.sink.sample(request, sample)

    def finished(self, request, outcome) -> None:
        self.sink.finished(request, outcome)

    def message(self, text) -> None:
        self.sink.message(text)


def run_boot(req: BootRequest, sink: Sink | None = None, *, cancel: threading.Event | None = None) -> BootOutcome:
    """One boot as a plain call: :func:`boot_events` handed to ``sink`` as they come
    (``boot.deliver``), returning the boot as one value: its outcome with its samples
    (what a Slurm job sends back, ``backends.slurm.node_boot``)."""
    whole = _Whole(sink)
    out = deliver(boot_events(req, cancel=cancel), whole)
    return dataclasses.replace(out, samples=tuple(whole.samples))


def boot_events(req: BootRequest, *, cancel: threading.Event | None = None) -> Generator[Event, None, BootOutcome]:
    """Build (once), boot, verify, warm up, sample, tear down, handing back a
    :class:`~bisect_harness.boot.Started` at the launch, a
    :class:`~bisect_harness.boot.Sampled` per sample the moment it is measured and a
    :class:`~bisect_harness.boot.Finished` last (without the samples: they went
    before); returns the outcome. Never raises for a boot that fails (the outcome says
    how). An interrupt, here or thrown in where an event was handed over, stops the
    server, hands back an ``interrupted`` outcome (its finished samples were handed
    back already) and propagates; ``cancel`` set interrupts the boot before its next
    sample."""
    b = _Boot(req)
    if req.devices is not None:
        b.note(devices=req.devices.to_dict())
    log_path = Path(req.log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    launch = yield from _prepare(b, req, log_path)
    if launch is None:  # the build failed: the config's own failure at this commit
        return (yield from _finish(b))
    yield Started(req, launch.port, tuple(launch.argv), str(log_path))
    try:
        yield from _serve(b, req, launch, log_path, cancel)
    except (_Stop, BootFailed, ConfigFailure, httpx.HTTPError, RuntimeError) as exc:
        _failed_by(b, req, launch, log_path, exc)
    except (KeyboardInterrupt, SystemExit):
        if b.status is BootStatus.RUNNING:  # its finished samples stay; the boot is not used by a verdict
            b.status, b.failure = BootStatus.INTERRUPTED, "the harness was interrupted during this boot"
        b.log_tail = read_tail(log_path)
        yield Finished(req, b.outcome())
        raise
    _after_stop(b, launch, cancel)
    return (yield from _finish(b))


def _finish(b: _Boot) -> Generator[Event, None, BootOutcome]:
    out = b.outcome()
    yield Finished(b.req, out)
    return out


@dataclass
class _Launch:
    """How the boot launches, once its commit is checked out and built (:func:`_prepare`);
    ``server`` is the server once it is up (its log is read again after it stopped)."""

    worktree: Path
    cenv: Any                  # engines.envs: the commit's environment
    held: integrity.Held       # the checkout as verified, compared again at the end
    source: Any                # engines.attach: launched or attached
    cfg: _Config
    port: int | None
    env: dict[str, str]
    places: Mapping[str, str]
    argv: list[str]
    cwd: Path
    profiler: Any
    launched_with: tuple[str, ...] = ()
    server: Any = None


def _prepare(b: _Boot, req: BootRequest, log_path: Path) -> Generator[Event, None, _Launch | None]:
    """Check out and build the commit (once), then make the launch: its port, env,
    argv (the preset's options this build's ``--help`` does not name left out, the
    profiler's launch setting, the device set) and folder. None when the build failed
    (the boot is then a failed one, of its config's own failure)."""
    remade: list[str] = []
    try:
        worktree, cenv = checkout(req, remade)
        b.note(environment=cenv.to_dict())
    except BuildFailed as exc:
        b.status, b.failure, b.log_tail, b.log_path = BootStatus.FAILED, str(exc), exc.log_tail, exc.log_path
        b.config_failure, b.config_status = str(exc), "build_failed"
        return None
    for note in remade:  # a checkout or environment that was not what it was made from: made again
        yield Message(f"boot {req.boot_id} ({req.label}): {note}")
    if remade:
        b.note(checkout={"remade": remade})
    held = integrity.held([worktree, cenv.venv])  # as verified: compared again when the boot ends
    source, cfg = _source(req), _Config(req.endpoint)
    port = source.port(cfg)
    env = process_env(req, cenv)
    places = placeholders(req, port=port, worktree=worktree, python=cenv.python)
    argv = presets.render_argv(list(req.argv), **places)
    cwd = working_dir(req, worktree, cenv.python)
    if req.preset_flags and req.endpoint is None:  # the preset's options this build's --help does not name: left out
        adapted = _adapt_preset_flags(req, argv, env, cwd, places)
        argv = list(adapted.argv)
        b.note(preset_flags=adapted.to_dict())
        if adapted.dropped or not adapted.checked:
            yield Message(f"boot {req.boot_id} ({req.label}): {adapted.note()}")
    profiler = profilers.get_profiler(presets.get_preset(req.preset).profiler)
    launched_with: tuple[str, ...] = ()
    if req.profile and req.endpoint is None:  # an engine whose profiler is a launch setting (vLLM)
        launched_with = profiler.launch_args(profilers.profile_dir(log_path))
        argv += list(launched_with)
    argv = _with_devices(req, argv, env)
    b.port, b.argv = port, tuple(argv)
    # what a person needs to run this boot again by hand (the journal's reproduction lines)
    b.note(launch={"cwd": str(cwd), "env": dict(req.env)})
    return _Launch(worktree=worktree, cenv=cenv, held=held, source=source,
                   cfg=cfg, port=port, env=env, places=places, argv=argv, cwd=cwd, profiler=profiler,
                   launched_with=launched_with)


def _serve(b: _Boot, req: BootRequest, launch: _Launch, log_path: Path,
           cancel: threading.Event | None) -> Generator[Event, None, None]:
    """The server's life: up, verified, warmed up, measured while the host is watched,
    judged, stopped; then the checks that read it stopped."""
    endpoint = launch.source.endpoint(launch.cfg, launch.port)  # base_url and auth headers (never stored)
    bench = benchtools.sample_runner(req.benchmark, endpoint, python=launch.cenv.python, env=launch.env,
                                     cwd=launch.cwd, log_path=log_path, boot=req.boot_id, boot_seq=req.seq)
    t0 = time.monotonic()
    limits = req.benchmark.limits
    with launch.source.open(launch.argv, env=launch.env, cwd=launch.cwd, log_path=log_path,
                            base_url=endpoint.base_url, health_path=req.health_path,
                            ready_timeout_s=req.ready_timeout_s,
                            health_request_timeout_s=req.health_request_timeout_s, ready_probe=req.ready_probe,
                            log_cap=(limits.log_head_bytes, limits.log_tail_bytes)) as server:
        launch.server = server
        info = _ready(b, req, server, endpoint, launch.places, t0)
        if b.status is BootStatus.FATAL:
            raise _Stop()
        order = boot_order(req.benchmark.points, req.boot_id, req.benchmark.seed)
        bench.warmup(order[0])
        if req.sources_not_applicable:
            b.note(sources_not_applicable=tuple(req.sources_not_applicable))
        collector = SourceCollector(req.metric_sources, endpoint.base_url, log_path, server_info=info,
                                    server_info_paths=req.server_info_paths, metrics_path=req.metrics_path,
                                    headers=endpoint.headers, body_limit=limits.body_bytes,
                                    notes=presets.get_preset(req.preset).source_notes)
        with provenance.GpuSampler(interval_s=1.0) as sampler, \
                contention.Monitor(server_pid=server.pid, interval_s=0.5) as monitor, \
                bench.session():  # one HTTP client per boot, opened outside every sample window
            window = checks.MechanismWindow(req, endpoint.base_url, endpoint.headers, log_path).open()  # after warm-up
            yield from _samples(b, req, bench, order, collector, monitor, cancel)
            window.close()  # the measured samples' window ends here
        b.note(**bench.provenance())
        checks.mechanism_check(b, window)
        _sources_check(b, collector)
        b.host = provenance.collect_host(launch.worktree, req.commit)
        b.note(gpu_sampling=sampler.summary().to_dict(), host=b.host.to_dict())
        checks.host_check(b, req, monitor)
        if req.profile and b.status is BootStatus.RUNNING:  # one more sample, never one of the verdict's
            b.note(profile=profilers.capture(req, launch.profiler, bench, endpoint, log_path,
                                             launched_with=launch.launched_with))
        if b.status is BootStatus.RUNNING:
            b.status = BootStatus.OK
        b.log_tail = server.log_tail(40)
    checks.stop_check(b, server)
    checks.log_check(b, server)
    checks.checkout_check(b, launch.held)


def _ready(b: _Boot, req: BootRequest, server, endpoint, places: Mapping[str, str], t0: float) -> dict | None:
    """The server is up: how long it took and what said so, the engine's own warm-up
    after its health check (``settle_s``), then the checks of what it runs
    (:func:`_verify`); returns its server info."""
    b.ready_s = server.ready_after_s if server.ready_after_s is not None else time.monotonic() - t0
    if getattr(server, "ready_by", None):
        b.note(ready_by=server.ready_by)
    if req.settle_s:  # 0 when attached
        t_settle = time.monotonic()
        time.sleep(req.settle_s)
        b.note(settle_s=round(time.monotonic() - t_settle, 3))
    return _verify(b, req, server, endpoint.base_url, endpoint.headers, places)


def _samples(b: _Boot, req: BootRequest, bench, order: tuple, collector: SourceCollector,
             monitor: contention.Monitor, cancel: threading.Event | None) -> Generator[Event, None, None]:
    """The measured samples, each handed back the moment it is taken (numbered from 1
    across the boot), each in its own contention window; ``req.samples`` at each load
    point of ``order`` (``workload.boot_order``), a warm-up at each point after the
    first (whose warm-up ran before the window opened); ``cancel`` set stops before the
    next one."""
    seq = 0
    for nth, point in enumerate(order):
        if nth:
            bench.warmup(point, nth)
        for _ in range(req.samples):
            if cancel is not None and cancel.is_set():
                raise KeyboardInterrupt
            if seq:
                monitor.split()  # one contention window per sample, and one for the boot
            collector.begin_sample()
            detail = bench.sample(seq, point)
            seq += 1
            result = detail.result
            extra = collector.end_sample(detail.responses, result.duration_s, detail.last_chunks)
            s = dataclasses.replace(result, seq=seq, metrics=jsonable({**dict(result.metrics), **extra}),
                                    point=point.label if point is not None else None)
            checks.usage_check(b, detail.requests)
            checks.retry_check(b, detail.requests, seq)
            checks.lag_check(b, detail.behind, seq)
            yield Sampled(req, s)


def _sources_check(b: _Boot, collector: SourceCollector) -> None:
    """Metric sources that never matched mark the boot ``source_unmatched``."""
    b.source_problems = list(collector.problems())
    if b.source_problems:
        b.marks.append("source_unmatched")


def _failed_by(b: _Boot, req: BootRequest, launch: _Launch, log_path: Path, exc: Exception) -> None:
    """The boot failed on the way (or a fatal check stopped it, :class:`_Stop`): why, and
    its log's tail. A refused flag fails the config at this commit (not retried), unless
    it was the profiler's launch setting."""
    if isinstance(exc, _Stop):
        b.log_tail = read_tail(log_path)
        return
    if not isinstance(exc, ConfigFailure):  # httpx.HTTPError, RuntimeError
        b.status, b.failure = BootStatus.FAILED, f"benchmark failed: {type(exc).__name__}: {exc}"
        b.log_tail = read_tail(log_path)
        return
    b.status, b.failure = BootStatus.FAILED, str(exc)
    b.log_tail = exc.log_tail or read_tail(log_path)
    checks.log_unwritten(b, exc.log_unwritten)
    if not isinstance(exc, FlagNotAccepted):
        return
    if launch.launched_with and launch.launched_with[0] in exc.engine_message:  # the profiler's, not the config's
        b.note(profile=profilers.refused_at_launch(launch.profiler, launch.launched_with, exc.engine_message))
    else:  # the same argv fails the same way at this commit: not retried
        _flag_not_accepted(b, req, exc)


def _after_stop(b: _Boot, launch: _Launch, cancel: threading.Event | None) -> None:
    """Once the server is stopped: a log it could not write (known only now), and a boot
    whose server was stopped under it because the run was interrupted, which is no
    failure of its config."""
    unwritten = getattr(launch.server, "log_unwritten", None)
    if unwritten:
        b.log_tail = launch.server.log_tail(40)  # the newest output, from the supervisor's memory
        checks.log_unwritten(b, unwritten)
    if cancel is not None and cancel.is_set() and b.status in (BootStatus.RUNNING, BootStatus.FAILED):
        b.status, b.failure = BootStatus.INTERRUPTED, "the harness was interrupted during this boot"


class _Stop(Exception):
    """A boot check with ``fatal``: stop this boot (the scheduler stops the run)."""
