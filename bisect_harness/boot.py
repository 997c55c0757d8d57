"""A boot as a value: what to boot (:class:`BootRequest`), what came of it (:class:`BootOutcome`),
and how the ledger holds it (:class:`BootRecord`, in its run, :class:`RunRecord`).

The plan turns each config into requests (``plan.boot_request``); a backend turns
a request into an outcome (``backends.local.LocalBackend`` on this host,
``backends.slurm.SlurmBackend`` on a cluster node) and hands back what happened
as events (:class:`Started`, :class:`Sampled`, :class:`Finished`,
:class:`Message`); the scheduler writes them to the ledger. The values are frozen
and picklable: a request travels to a Slurm node and its outcome travels back,
and nodes never touch the ledger.

What depends on where the boot runs is left as a placeholder in the request and
filled there: ``{port}`` (a free port on that host), ``{worktree}`` and
``{python}`` (the commit's checkout and interpreter in that host's cache).

What the verdict and host drift read of the boots the ledger recorded comes to
them as frozen records too (``record.ledger.boot_records`` makes them from the
rows), so deciding never reads storage: a :class:`BootRecord` holds a boot's
status, checks, provenance and samples, its :class:`RunRecord` the run's
calibration probes, and :class:`BootValues` is one metric's values per boot.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Generator, Iterator, Mapping, Sequence, Union

from bisect_harness.evidence import BootEvidence, BootStatus
from bisect_harness.model import BenchmarkSpec

__all__ = ["Checks", "DeviceSet", "BootRequest", "SampleOutcome", "BootOutcome", "Started", "Sampled", "Finished",
           "Message", "Event", "Sink", "deliver", "handed_back", "freeze", "CalibrationRecord", "RunRecord",
           "BootRecord", "BootValues"]


def freeze(mapping: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """A mapping as a sorted tuple of pairs: hashable, comparable, picklable."""
    return tuple(sorted((str(k), v) for k, v in (mapping or {}).items()))


@dataclass(frozen=True)
class Checks:
    """What to do when a boot check fails (``defaults.env_check`` and friends)."""

    env_check: str = "mark"
    flag_check: str = "mark"
    host_check: str = "mark"
    thresholds: Any = None  # spec.HostThresholds (frozen)


@dataclass(frozen=True)
class DeviceSet:
    """The devices one boot may use: GPU indices (``CUDA_VISIBLE_DEVICES``) and CPU
    cores (the server's affinity). ``slot`` names the set within its backend;
    ``node`` the host it is on. Recorded with the boot and used as a block."""

    slot: int = 0
    gpus: tuple[int, ...] | None = None
    cpus: tuple[int, ...] | None = None
    node: str | None = None

    def label(self) -> str:
        parts = [f"slot {self.slot}"]
        if self.node:
            parts.insert(0, self.node)
        if self.gpus is not None:
            parts.append("gpus " + ",".join(map(str, self.gpus)))
        if self.cpus is not None:
            parts.append("cpus " + ",".join(map(str, self.cpus)))
        return " ".join(parts)

    def to_dict(self) -> dict:
        return {"slot": self.slot, "gpus": list(self.gpus) if self.gpus is not None else None,
                "cpus": list(self.cpus) if self.cpus is not None else None, "node": self.node,
                "label": self.label()}


@dataclass(frozen=True)
class BootRequest:
    """Everything one boot needs, fixed before it starts. ``boot_id`` is the ledger row
    the controller made for it; the rest is the config's recipe."""

    boot_id: int
    config_key: str
    label: str
    seq: int
    preset: str
    commit: str | None
    # where the code comes from: the engine repo (mirrored into the cache) and the cache
    repo: str | None
    cache_dir: str
    per_commit_env: bool
    base_python: str
    # the launch, with {port}, {worktree} and {python} still to fill where the boot runs
    argv: tuple[str, ...]
    build_steps: tuple[tuple[str, ...], ...] | None  # the build's argvs, run in order (placeholders open)
    cwd: str | None  # None: the worktree (or spec_dir without a commit)
    spec_dir: str
    env: tuple[tuple[str, str], ...]      # preset env, then the arm's: laid over that host's environment
    arm_env: tuple[tuple[str, str], ...]  # the arm's alone: what the env check looks for in every worker
    flags: tuple[tuple[str, Any], ...]    # the arm's flags, for `when:` on sources
    # (flag, value, server-info key, compare mode); every flag of the arm, the key None where the
    # preset knows none (the flag is then reported as not reported, never as a match)
    flag_checks: tuple[tuple[str, Any, str | None, str], ...]
    # readiness and server info
    health_path: str
    ready_timeout_s: float
    health_request_timeout_s: float | None
    settle_s: float
    server_info_paths: tuple[str, ...]
    metrics_path: str
    # attached servers: no launch, an endpoint (and the *name* of the key's variable)
    endpoint: str | None
    api_key_env: str | None
    # measurement
    metric_sources: tuple[Any, ...]       # sources.MetricSource, those that apply to this config
    sources_not_applicable: tuple[str, ...]
    benchmark: BenchmarkSpec
    samples: int
    checks: Checks
    log_path: str
    devices_needed: int = 1               # GPUs per boot (the config's tensor parallel degree)
    checkout: str = "worktree"            # how the commit is checked out (boot.checkout.CHECKOUT_MODES)
    ready_probe: Any = None               # apis.ReadyProbe: readiness where health_path answers 404
    release: Any = None                   # releases.ReleaseRequest: a released build, installed, not a commit
    build_env: tuple[str, ...] = ()       # variables that key the build, beyond boot.checkout.BUILD_ENV
    # the preset's own launch options a build may lack (Preset.optional_flags), and the help argv
    # (placeholders open) a boot reads first to drop those the build does not name
    preset_flags: tuple[str, ...] = ()
    help_argv: tuple[str, ...] = ()
    devices: DeviceSet | None = None      # assigned by the backend before the boot starts
    # one extra sample after the measured ones, under the engine's profiler (boot.profilers);
    # set by the scheduler on a boot of a config that still lacks its profile
    profile: bool = False

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def flags_dict(self) -> dict[str, Any]:
        return dict(self.flags)

    def for_boot(self, *, boot_id: int, seq: int, log_path) -> "BootRequest":
        """This recipe as the request of one boot: its ledger row, its number, its log."""
        return dataclasses.replace(self, boot_id=boot_id, seq=seq, log_path=str(log_path))

    def with_devices(self, devices: DeviceSet | None) -> "BootRequest":
        return dataclasses.replace(self, devices=devices)

    def profiled(self) -> "BootRequest":
        """This boot, taking the profiled sample after its measured ones."""
        return dataclasses.replace(self, profile=True)


@dataclass(frozen=True)
class SampleOutcome:
    """One benchmark measurement inside a boot: what the client (or the engine's own
    tool) measured, and ``seq``, its place in the boot (1, 2, ...; 0 until the boot
    numbers it), under which the ledger stores it."""

    metrics: Mapping[str, Any]
    requests: int
    output_tokens: int
    duration_s: float
    errors: int = 0
    seq: int = 0
    point: str | None = None  # the load point's label (workload.LoadPoint.label); None: the benchmark's one point


@dataclass(frozen=True)
class BootOutcome:
    """What one boot gave. ``status``: a :class:`~bisect_harness.evidence.BootStatus`
    (a string given is read as one). ``config_failure`` is set when the config itself
    cannot be measured at this commit (a failed build, a refused flag): it is not
    retried. ``evidence``: what the boot recorded of its host, devices, engine and
    checks (stored as ``boots.provenance``).

    ``samples`` holds the boot's samples only where the boot comes back whole, as one
    value (:func:`~bisect_harness.backends.procedure.run_boot`'s return, a Slurm job's
    result, a mock handler's answer). In a :class:`Finished` event it is empty: a boot's
    samples travel once, as :class:`Sampled` events before it (:func:`handed_back`)."""

    boot_id: int
    status: BootStatus
    failure: str | None = None
    config_failure: str | None = None
    config_status: str | None = None      # build_failed | boot_failed, with config_failure
    log_tail: str | None = None
    log_path: str | None = None
    port: int | None = None
    argv: tuple[str, ...] = ()
    ready_s: float | None = None
    host_fingerprint: str | None = None
    evidence: BootEvidence = field(default_factory=BootEvidence)
    env_report: Mapping[str, Any] | None = None
    flag_report: Mapping[str, Any] | None = None
    server_info: Mapping[str, Any] | None = None
    marks: tuple[str, ...] = ()
    source_problems: tuple[str, ...] = ()
    samples: tuple[SampleOutcome, ...] = ()
    started_at: Any = None
    finished_at: Any = None
    busy: bool = False                    # excluded as host_busy under host_check: retry
    fatal: str | None = None              # a check set to fatal failed: "user" or "infrastructure"

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", BootStatus(self.status))

    @property
    def ok(self) -> bool:
        return self.status is BootStatus.OK

    def without_samples(self) -> "BootOutcome":
        """This outcome as a :class:`Finished` event carries it: its samples went before."""
        return dataclasses.replace(self, samples=()) if self.samples else self


@dataclass(frozen=True)
class Started:
    """A boot's server was launched (or its endpoint attached): its port, argv and log."""

    request: BootRequest
    port: int | None
    argv: tuple[str, ...]
    log_path: str


@dataclass(frozen=True)
class Sampled:
    """One sample of a boot, the moment it was measured."""

    request: BootRequest
    sample: SampleOutcome


@dataclass(frozen=True)
class Finished:
    """A boot's outcome: the last event of its boot. Its ``outcome.samples`` is empty:
    the boot's samples came before it, each once, as :class:`Sampled` events."""

    request: BootRequest
    outcome: BootOutcome


@dataclass(frozen=True)
class Message:
    """A line for the person running the harness (a Slurm job's id, a node given up)."""

    text: str


#: What a backend hands back while it boots, in the order it happens.
Event = Union[Started, Sampled, Finished, Message]


class Sink:
    """The callback form of a boot's events (:func:`deliver`): the moment a boot's server
    is launched (port, argv, log), each sample once (as it is measured on this host, or
    as a remote boot's outcome comes back), the outcome, and messages. This one drops
    them all; a caller that wants them (the scheduler's recorder, a test, a benchmark)
    overrides what it needs."""

    def started(self, request: BootRequest, port: int | None, argv: tuple[str, ...], log_path: str) -> None: ...
    def sample(self, request: BootRequest, sample: SampleOutcome) -> None: ...
    def finished(self, request: BootRequest, outcome: BootOutcome) -> None: ...
    def message(self, text: str) -> None: ...


def handed_back(request: BootRequest, outcome: BootOutcome) -> Iterator[Event]:
    """The events of a boot that came back whole (a Slurm job's result, a mock handler's
    answer): a :class:`Sampled` per sample of ``outcome``, in order, then its
    :class:`Finished` without them, so its samples travel once, as a local boot's do."""
    for sample in outcome.samples:
        yield Sampled(request, sample)
    yield Finished(request, outcome.without_samples())


def _dispatch(event: Event, sink: Sink) -> None:
    if isinstance(event, Sampled):
        sink.sample(event.request, event.sample)
    elif isinstance(event, Finished):
        sink.finished(event.request, event.outcome)
    elif isinstance(event, Started):
        sink.started(event.request, event.port, event.argv, event.log_path)
    else:
        sink.message(event.text)


def deliver(events: Generator[Event, None, Any], sink: Sink | None = None) -> Any:
    """Hand each of ``events`` to ``sink`` the moment it comes, and return what the
    generator returns (:func:`~bisect_harness.backends.procedure.boot_events`: the
    outcome). The one loop that carries a boot's events: the scheduler records through
    it too (its recorder is a :class:`Sink`).

    An exception raised by the sink (an interrupt, a ledger that refuses a write) is
    thrown back into the generator where it handed that event over, so the boots stop
    as they would for an interrupt of their own (their servers stopped, their jobs
    cancelled), hand back what they hand back then, and the exception goes on to the
    caller: the generator's own, or the sink's where the generator ended without one."""
    sink = sink or Sink()
    failure: BaseException | None = None   # the sink's exception, on its way into the generator
    thrown: BaseException | None = None    # ... once thrown: it goes on to the caller in any case
    while True:
        try:
            event = next(events) if failure is None else events.throw(failure)
        except StopIteration as stop:
            if thrown is not None:
                raise thrown
            return stop.value
        failure = None
        try:
            _dispatch(event, sink)
        except BaseException as exc:  # noqa: BLE001 - it goes back into the boots, then on to the caller
            failure = thrown = exc


@dataclass(frozen=True)
class CalibrationRecord:
    """One calibration probe of a run, as recorded: its ``phase`` (preflight, before,
    after) and its ``result`` (the probe's figures, or ``{"error": ...}``)."""

    phase: str
    result: Mapping[str, Any] | None


@dataclass(frozen=True)
class RunRecord:
    """A recorded run, as far as a verdict on its boots reads it: its id and its
    calibration probes, in the order they were taken."""

    id: int
    calibrations: tuple[CalibrationRecord, ...] = ()

    def calibration(self, phase: str = "before") -> Mapping[str, Any] | None:
        """The probe result of ``phase``, when that probe ran and succeeded."""
        for cal in self.calibrations:
            if cal.phase == phase and cal.result and "error" not in cal.result:
                return cal.result
        return None


@dataclass(frozen=True)
class BootRecord:
    """One recorded boot, as the verdict, host drift, the searches and the report read it.
    ``status``: a :class:`~bisect_harness.evidence.BootStatus` (only ``ok`` boots are
    measured); ``argv`` and ``failure`` say how it launched and why it failed;
    ``env_report`` and ``flag_report`` hold its checks; ``evidence`` what was observed of
    its host, devices and engine (``record.ledger.boot_records`` reads it from the
    stored provenance); ``marks`` the checks it failed; ``samples`` its measurements in
    order; ``quiet`` per sample whether its own contention window crossed no threshold
    (None where the boot has no window per sample); ``run`` the run it belongs to (None
    when that is not known)."""

    id: int
    run_id: int
    status: str
    failure: str | None = None
    argv: tuple[str, ...] = ()
    evidence: BootEvidence = field(default_factory=BootEvidence)
    env_report: Mapping[str, Any] | None = None
    flag_report: Mapping[str, Any] | None = None
    marks: tuple[str, ...] = ()
    samples: tuple[SampleOutcome, ...] = ()
    quiet: tuple[bool, ...] | None = None
    run: RunRecord | None = None

    def values(self, metric: str, *, quiet: bool = False, point: str | None = None) -> tuple[float, ...]:
        """The values of ``metric`` in this boot's samples that have a finite one, in
        order: the one reduction of a boot's samples to its values, read by the verdict,
        the searches, the scheduler and the report. ``quiet``: only the samples whose own
        contention window crossed no threshold (every sample where the boot has no
        window per sample). ``point``: only the samples of that load point (its label);
        None: the samples of the benchmark's one point (those with no point)."""
        mask = self.quiet if quiet and self.quiet is not None and len(self.quiet) == len(self.samples) else None
        out = []
        for k, s in enumerate(self.samples):
            if s.point != point:
                continue
            v = s.metrics.get(metric) if isinstance(s.metrics, Mapping) else None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            if mask is None or mask[k]:
                out.append(float(v))
        return tuple(out)

    @property
    def measured(self) -> bool:
        """Whether this boot's samples count (its status is ``ok``)."""
        return self.status == BootStatus.OK


@dataclass(frozen=True)
class BootValues:
    """Boot-level view of a config's measurements for one metric."""

    boot_ids: tuple[int, ...]
    values: tuple[tuple[float, ...], ...]  # per boot, the sample values

    @classmethod
    def of(cls, boots: Sequence[BootRecord], metric: str, *, quiet: bool = False,
           point: str | None = None) -> "BootValues":
        """The sample values of ``metric`` (at load point ``point``) per usable (``ok``) boot
        (:meth:`BootRecord.values`); boots without any are left out."""
        kept = [(b.id, vals) for b in boots if b.measured
                for vals in (b.values(metric, quiet=quiet, point=point),) if vals]
        return cls(tuple(i for i, _ in kept), tuple(v for _, v in kept))

    def means(self) -> list[float]:
        """One value per boot, the mean of its samples: what a boot is worth as one
        replicate (the boot is the unit of replication)."""
        return [math.fsum(v) / len(v) for v in self.values]
