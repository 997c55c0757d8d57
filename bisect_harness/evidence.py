"""The evidence a boot and a verdict leave, as types: what is stored, and the one reader of it.

Everything the harness stores about a boot beyond its columns (``boots.provenance``),
what a verdict found about the boots it used (``verdicts.findings``) and the figures of
its statistics (``verdicts.stats``) pass through the types of this module on their way
in and out of the ledger, so no other module picks keys out of a stored mapping:

* :class:`BootStatus`: the states a boot row goes through;
* :class:`BootEvidence`: one typed, documented field per fact a boot recorded about its
  host, devices, engine and checks (:data:`BOOT_EVIDENCE_FIELDS` lists them);
* :class:`Finding`: one thing a verdict (or a search, or a night) found about its boots
  (a mark, a busy boot, host drift, ...): its :class:`FindingKind`, the side and boots it
  concerns, the figures it rests on, and the sentence made from them. Readers count and
  group findings by kind; nobody reads a sentence back;
* :class:`VerdictStats`: the figures of one look at a hypothesis beyond the verdict's
  columns: the statistical answer's parts, the checks the boots answered, the rounds,
  the noise prior, the layers of a mechanism hypothesis and the cost;
* :class:`RunHost`: what a run records beside its columns (``runs.host``): the host it
  started on, the harness process that holds it, its backend, its order seed, what it
  was started with (:class:`RunOptions`) and each resume (:class:`ResumeRecord`).

Each stored shape has ``to_json`` and ``from_json`` and carries a version
(:data:`EVIDENCE_VERSION`): a record written by an older harness (a field missing) reads
as ``None`` for that field, a field this harness does not know is kept as it was
(``extra``) and written back unchanged, and a record newer than this harness is refused
(:class:`NewerRecordError`) rather than misread. A record of version 0 is one written
before records carried a version (the ledger's schema 3 and older).

This module imports only the model: it sits at the bottom of the house, beside
``boot.py``, so every room may speak it.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from bisect_harness.model import jsonable

__all__ = ["EVIDENCE_VERSION", "VERSION_KEY", "NewerRecordError", "BootStatus", "BootEvidence",
           "BOOT_EVIDENCE_FIELDS", "FindingKind", "Finding", "findings_to_json", "findings_from_json",
           "VerdictStats", "STAT_FIELDS", "HarnessProcess", "RunOptions", "ResumeRecord", "RunHost", "RUN_HOST_KEYS",
           "evidence_of"]

#: The version of every shape this module writes; a record without one is version 0.
EVIDENCE_VERSION = 1
#: The key under which a stored record carries its version.
VERSION_KEY = "schema_version"


class NewerRecordError(ValueError):
    """A stored record was written by a newer harness than this one (its version is
    higher than :data:`EVIDENCE_VERSION`): upgrade bisect-harness to read it."""


def _version(data: Mapping[str, Any], what: str) -> int:
    v = data.get(VERSION_KEY, 0)
    try:
        v = int(v)
    except (TypeError, ValueError):
        raise NewerRecordError(f"{what} carries schema_version {v!r}, which this harness cannot read; "
                               "upgrade bisect-harness") from None
    if v > EVIDENCE_VERSION:
        raise NewerRecordError(f"{what} has schema_version {v}, newer than this harness understands "
                               f"({EVIDENCE_VERSION}); upgrade bisect-harness to read it")
    return v


class BootStatus(str, enum.Enum):
    """The states of a boot row. A boot starts ``running`` and ends in one of the others;
    only an ``ok`` boot is measured. It compares equal to its stored string."""

    RUNNING = "running"            # started, not ended (or its harness died: see INTERRUPTED)
    OK = "ok"                      # booted, measured, every check that excludes passed
    FAILED = "failed"              # did not boot, or broke before its samples were taken
    EXCLUDED = "excluded"          # booted and measured, left out by a check (host_busy, checkout_changed, ...)
    FATAL = "fatal"                # a check set to ``fatal`` failed: the run stops
    INTERRUPTED = "interrupted"    # its run was stopped (Ctrl-C, a kill) before the boot ended

    def __str__(self) -> str:
        return self.value

    @property
    def measured(self) -> bool:
        """Whether the boot's samples count in a verdict."""
        return self is BootStatus.OK

    @property
    def booted(self) -> bool:
        """Whether the server came up (a boot a check left out booted too)."""
        return self in (BootStatus.OK, BootStatus.EXCLUDED)


# --------------------------------------------------------------------------- a boot's evidence


@dataclass(frozen=True)
class BootEvidence:
    """What one boot recorded about its host, devices, engine and checks, one field per
    fact (``boots.provenance`` in the ledger). A field is ``None`` where the boot did not
    record it (not applicable, not measured, or an older harness). Nested records keep
    the shape their own module reads and writes (named beside each field).

    ``BootEvidence.from_json(BootEvidence(...).to_json())`` is the same value, and
    ``to_json`` of a record read from an older ledger writes back what was read."""

    # the host and its devices
    host: Mapping[str, Any] | None = None
    """The host's facts at the boot (``observe.provenance.HostInfo.to_dict``): hostname,
    boot id, kernel, driver, GPUs and their clocks."""
    gpu_sampling: Mapping[str, Any] | None = None
    """GPU clocks, temperature, power and throttle reasons sampled during the boot
    (``observe.provenance.SamplerSummary.to_dict``)."""
    devices: Mapping[str, Any] | None = None
    """The device set the backend gave the boot (``boot.DeviceSet.to_dict``)."""
    contention: Mapping[str, Any] | None = None
    """The contention window of the benchmark (``observe.contention.record``): figures,
    thresholds, what crossed them, and one window per sample."""
    listening: Mapping[str, Any] | None = None
    """Sockets the server's processes held beyond loopback
    (``observe.provenance.listening``)."""
    slurm: Mapping[str, Any] | None = None
    """The Slurm job that ran the boot: id, node, submit/start/end times, state
    (``backends.slurm``)."""
    # the code and how it was launched
    environment: Mapping[str, Any] | None = None
    """The commit's Python environment (``engines.envs``): its interpreter and packages."""
    checkout: Mapping[str, Any] | None = None
    """What the checkout did before the boot (``remade``: notes of worktrees made anew)."""
    checkout_changed: tuple[str, ...] | None = None
    """Files of the checkout that changed while the boot ran (it is then excluded)."""
    preset_flags: Mapping[str, Any] | None = None
    """The preset's optional flags the build's help did (not) name
    (``engines.preset_flags``)."""
    launch: Mapping[str, Any] | None = None
    """The launch's working folder and environment (``cwd``, ``env``): what
    ``report.reproduce`` prints to run the boot by hand."""
    ready_by: str | None = None
    """What told the harness the server was ready (the health path, a probe)."""
    settle_s: float | None = None
    """Seconds the boot waited after readiness before its first sample."""
    flag_not_accepted: Mapping[str, Any] | None = None
    """The engine's refusal of the argv at this commit (``commit``, ``engine_message``,
    ``notes``)."""
    engine_version: Mapping[str, Any] | None = None
    """The code the server reported (``observe.engine_identity.ReportedVersion``)."""
    release_mismatch: str | None = None
    """A released build that reported another version than the one asked for."""
    # the measurement
    sources_not_applicable: tuple[str, ...] | None = None
    """Metric sources that did not apply to this config (their ``when:`` did not hold)."""
    prompt: Mapping[str, Any] | None = None
    """How long the prompts were (``measure.prompt_size.PromptSize.to_dict``)."""
    bench_tool: Mapping[str, Any] | None = None
    """The engine's own benchmark tool that took the samples: name, log, runs."""
    mechanisms: tuple[Mapping[str, Any], ...] | None = None
    """Each mechanism's state over the measured window (``observe.mechanisms``)."""
    request_retries: Mapping[str, Any] | None = None
    """Requests that produced nothing and were sent again, or failed in the end: counts,
    examples and per-sample counts."""
    client_behind: Mapping[str, Any] | None = None
    """Open-loop samples whose client fell behind its schedule (the mark ``client_behind``):
    per sample, its p99 send lag, the limit, the sends, the asked and achieved rates."""
    capacity: Mapping[str, Any] | None = None
    """Each capacity search of the boot (``measure.capacity.CapacitySearch.to_json``, by
    the sample's number): its trials' rates, whether each held, their percentiles, why
    it ended."""
    usage_offset: Mapping[str, Any] | None = None
    """A server's steady off-by-one between its text chunks and its token count."""
    usage_mismatch: Mapping[str, Any] | None = None
    """Requests whose reported token count disagreed with the chunks (the mark
    ``usage_mismatch``)."""
    profile: Mapping[str, Any] | None = None
    """The profiled sample (``engines.profilers``): state, why, trace, summary."""
    # the end
    stop: Mapping[str, Any] | None = None
    """How the server's top process ended when it was stopped (exit code, clean)."""
    log: Mapping[str, Any] | None = None
    """The boot log's size: bytes written and dropped, and why it was not written."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys this harness does not know (written by a newer one), kept as they were."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> "BootEvidence":
        """The record stored as ``data`` (``boots.provenance``); ``None`` or ``{}`` is a
        boot that recorded nothing. Raises :class:`NewerRecordError` for a newer record."""
        data = dict(data or {})
        _version(data, "a boot's provenance")
        data.pop(VERSION_KEY, None)
        known = {name: data.pop(name) for name in BOOT_EVIDENCE_FIELDS if name in data}
        for name in ("checkout_changed", "sources_not_applicable", "mechanisms"):
            if known.get(name) is not None:
                known[name] = tuple(known[name])
        return cls(**known, extra=data)

    def to_json(self) -> dict:
        """The record as stored: the fields that are set, the unknown keys kept, and the
        version. Tuples are written as lists."""
        out: dict[str, Any] = {}
        for name in BOOT_EVIDENCE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = jsonable(value)
        out.update(self.extra)
        out[VERSION_KEY] = EVIDENCE_VERSION
        return out

    def with_(self, **changes: Any) -> "BootEvidence":
        """This record with ``changes`` (field names) set."""
        return dataclasses.replace(self, **changes)

    @property
    def profile_state(self) -> str | None:
        """What the boot's profiled sample gave (``engines.profilers.STATES``: taken,
        no_profiler, failed), or None where the boot took none."""
        state = (self.profile or {}).get("state")
        return str(state) if state is not None else None


#: The facts a boot records, in :class:`BootEvidence`'s order.
BOOT_EVIDENCE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(BootEvidence) if f.name != "extra")


# --------------------------------------------------------------------------- findings


class FindingKind(str, enum.Enum):
    """What a finding is about. The journal's tables, the verdict table's checks cell
    and the CLI's summary count and group findings by kind."""

    MARKED_BOOT = "marked_boot"                    # a boot carries marks (env_missing, host_busy, ...)
    ENGINE_VERSIONS = "engine_versions"            # one config's boots reported different code
    ATTACHED = "attached"                          # the boots are sessions of a server the harness did not start
    HOST_DRIFT = "host_drift"                      # the two sides' hosts differed
    DEVICES_CONFOUNDED = "devices_confounded"      # each side ran on its own device sets only
    BUSY_BOOT = "busy_boot"                        # a boot's contention window crossed a threshold
    CONTENTION_DIFFERED = "contention_differed"    # the sides' contention differed
    CALIBRATION_NOISY = "calibration_noisy"        # a calibration probe spread more than its limit
    PREFLIGHT_BUSY = "preflight_busy"              # the host was busy before the first boot
    NOTE = "note"                                  # anything else a caller knows, said as it was


@dataclass(frozen=True)
class Finding:
    """One thing found about the boots of a verdict, a search or a night.

    ``kind`` says what it is; ``side`` which side it concerns (``baseline``,
    ``treatment``, ``tonight``, ... or None for both); ``boots`` the boot ids it rests
    on; ``figures`` the values it was decided from (JSON-safe; what they are depends on
    the kind, and each producer documents its own); ``text`` the sentence made from
    them by the producer, printed as it is and never read back."""

    kind: FindingKind
    text: str
    side: str | None = None
    boots: tuple[int, ...] = ()
    figures: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {VERSION_KEY: EVIDENCE_VERSION, "kind": self.kind.value, "side": self.side,
                "boots": list(self.boots), "figures": jsonable(self.figures), "text": self.text}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Finding":
        _version(data, "a finding")
        try:
            kind = FindingKind(data["kind"])
        except ValueError:  # a kind of a newer harness: shown as it was said
            kind = FindingKind.NOTE
        return cls(kind=kind, text=str(data.get("text", "")), side=data.get("side"),
                   boots=tuple(int(b) for b in data.get("boots") or ()), figures=dict(data.get("figures") or {}))

    @classmethod
    def note(cls, text: str) -> "Finding":
        """A sentence a caller knows with no figures behind it (kept as it was said)."""
        return cls(FindingKind.NOTE, text)


def findings_to_json(findings: Sequence[Finding]) -> list[dict]:
    return [f.to_json() for f in findings]


def findings_from_json(data: Sequence[Mapping[str, Any]] | None) -> tuple[Finding, ...]:
    return tuple(Finding.from_json(d) for d in data or ())


# --------------------------------------------------------------------------- a verdict's statistics


@dataclass(frozen=True)
class VerdictStats:
    """The figures of one look at a hypothesis beyond the verdict's own columns
    (``verdicts.stats``). Every field is ``None`` where the look did not reach it (a
    side that never booted has only ``family_size`` and ``checks``)."""

    # the statistical answer (``decide.evaluate.StatVerdict``)
    ci_level: float | None = None
    """The confidence level of the interval (1 - 2 alpha)."""
    p_threshold: float | None = None
    """The nominal level of this look: confirmation needs ``p_value <= p_threshold``."""
    n_boots: tuple[int, int] | None = None
    """Boots per side (baseline, treatment)."""
    n_samples: tuple[int, int] | None = None
    """Samples per side."""
    between_cv: tuple[float | None, float | None] | None = None
    """Between-boot coefficient of variation per side."""
    within_cv: tuple[float | None, float | None] | None = None
    """Within-boot coefficient of variation per side."""
    min_effect: float | None = None
    """The hypothesis' minimum effect, as a fraction."""
    expect: str | None = None
    """The direction the hypothesis claims (increase, decrease)."""
    look: int | None = None
    """Boots per side the look's boundary was taken at."""
    analysis: str | None = None
    """robust, paired or unpaired."""
    n_pairs: int | None = None
    """Rounds holding a boot of each side."""
    prior_pooled: bool | None = None
    """With a noise prior: whether this look pooled it."""
    prior_contradicted: bool | None = None
    """With a noise prior: whether the rounds' own spread contradicted it."""
    round_log_ratios: tuple[float, ...] | None = None
    """Per round, the log ratio the paired analyses read (a later run's noise prior)."""
    round_samples: tuple[int, ...] | None = None
    """Per round, the most samples either of its boots held."""
    # what the verdict adds
    family_size: int | None = None
    """Hypotheses in the multiplicity family."""
    family_alpha: float | None = None
    """The family's alpha, before the correction."""
    checks: Mapping[str, Any] | None = None
    """How many good boots answered each check (``decide.verdict.checks_done``)."""
    rounds: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    """Per side, the round (0, 1, ...) of each of the verdict's boots, in boot order."""
    order_seed: int | None = None
    """The seed that drew the order of the sides within each round."""
    noise_prior: Mapping[str, Any] | None = None
    """The noise prior the look pooled (``decide.prior.NoisePrior``)."""
    noise_prior_dropped: Mapping[str, Any] | None = None
    """A prior offered and not used, and why (busy boots)."""
    device_blocks: Mapping[str, Any] | None = None
    """How each side's boots spread over device sets, when over more than one."""
    layers: Mapping[str, Any] | None = None
    """A mechanism hypothesis' three layers (flag accepted, mechanism engaged, outcome
    moved: ``decide.layers.layers``)."""
    cost: Mapping[str, Any] | None = None
    """What the verdict cost: boots, samples and node time per side."""
    step_down: Mapping[str, Any] | None = None
    """A load curve's step-down that confirmed this point above its first level: the
    curve, the level, and the closed test's answers (``decide.multiplicity.StepDown``)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys this harness does not know, kept as they were (and the fields of the
    statistical answer already stored in the verdict's columns: outcome, ratio, ci, ...)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> "VerdictStats":
        data = dict(data or {})
        _version(data, "a verdict's stats")
        data.pop(VERSION_KEY, None)
        known = {name: data.pop(name) for name in STAT_FIELDS if name in data}
        for name in ("n_boots", "n_samples", "between_cv", "within_cv", "round_log_ratios", "round_samples"):
            if known.get(name) is not None:
                known[name] = tuple(known[name])
        if known.get("rounds") is not None:
            known["rounds"] = tuple(tuple(int(r) for r in side) for side in known["rounds"])
        return cls(**known, extra=data)

    def to_json(self) -> dict:
        out: dict[str, Any] = dict(jsonable(self.extra))
        for name in STAT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = jsonable(value)
        out[VERSION_KEY] = EVIDENCE_VERSION
        return out

    def with_(self, **changes: Any) -> "VerdictStats":
        return dataclasses.replace(self, **changes)


#: The figures a verdict's stats hold, in :class:`VerdictStats`' order.
STAT_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(VerdictStats) if f.name != "extra")


# --------------------------------------------------------------------------- a run's host and options


def _known(cls, data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` split into the fields of ``cls`` (all but ``extra``) and the rest."""
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    rest = dict(data)
    return {name: rest.pop(name) for name in list(rest) if name in names}, rest


def _ids(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values or ())


@dataclass(frozen=True)
class HarnessProcess:
    """The harness process that holds a run (``record.liveness.owner_record``): its pid,
    its host's name and its start time (a reused pid is told apart by it)."""

    pid: int | None = None
    hostname: str | None = None
    create_time: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> "HarnessProcess":
        known, rest = _known(cls, data or {})
        return cls(**known, extra=rest)

    def to_json(self) -> dict:
        return {"pid": self.pid, "hostname": self.hostname, "create_time": self.create_time, **self.extra}


@dataclass(frozen=True)
class RunOptions:
    """What a ``harness run`` was started with beyond its file, for a later resume
    (``run.resume.record_options``): its A/A check, the hypotheses it kept (``--only``)
    and ``--profile``. A field is None where the run recorded none (an older run)."""

    aa_check: bool | None = None
    hypotheses: tuple[str, ...] | None = None
    profile: bool | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> "RunOptions":
        known, rest = _known(cls, data or {})
        if known.get("hypotheses") is not None:
            known["hypotheses"] = tuple(str(h) for h in known["hypotheses"])
        return cls(**known, extra=rest)

    def to_json(self) -> dict:
        out = {name: jsonable(getattr(self, name)) for name in ("aa_check", "hypotheses", "profile")
               if getattr(self, name) is not None}
        return {**out, **self.extra}


@dataclass(frozen=True)
class ResumeRecord:
    """One resume of a run (``run.resume.begin``), from which the journal's sentences
    about it are made: when (``at``, UTC, ISO seconds), what the run had been
    (``previous_status``, ``previous_error``), on which host it went on, which recorded
    boots counted (all, and the ok ones), which ended on another host (all, and the ok
    ones), which were cut short by the interruption, and the seed of its round order
    from then on (``order_stream``)."""

    at: str
    previous_status: str | None = None
    previous_error: str | None = None
    host_fingerprint: str | None = None
    hostname: str | None = None
    counted_boot_ids: tuple[int, ...] = ()
    counted_ok_boot_ids: tuple[int, ...] = ()
    other_host_boot_ids: tuple[int, ...] = ()
    other_host_ok_boot_ids: tuple[int, ...] = ()
    cut_short_boot_ids: tuple[int, ...] = ()
    order_stream: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ResumeRecord":
        known, rest = _known(cls, data)
        for name in ("counted_boot_ids", "counted_ok_boot_ids", "other_host_boot_ids", "other_host_ok_boot_ids",
                     "cut_short_boot_ids"):
            if name in known:
                known[name] = _ids(known[name])
        return cls(**{"at": "", **known}, extra=rest)

    def to_json(self) -> dict:
        out = {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "extra"}
        return {**out, **self.extra}


@dataclass(frozen=True)
class RunHost:
    """What a run records beside its columns (``runs.host``). Stored as one JSON object:
    the host's facts at its top level (``machine``), beside the run's own keys
    (:data:`RUN_HOST_KEYS`) and its version.

    ``machine``: the host the run started on (``observe.provenance.HostInfo.to_dict``:
    hostname, boot id, kernel, CPU, GPUs), and any key this harness does not know, kept
    as it was; ``owner`` (``harness_process``): the harness process that holds it now;
    ``backend``: which backend booted its boots and how many at once
    (``run.scheduler.Scheduler.backend_record``: name, slots, device sets, a backend's own
    record); ``order_seed``: the seed of the order of the sides within each round;
    ``options`` (``run_options``): what a ``harness run`` was started with beyond its
    file; ``resumed``: each resume, oldest first."""

    machine: Mapping[str, Any] = field(default_factory=dict)
    owner: HarnessProcess | None = None
    backend: Mapping[str, Any] | None = None
    order_seed: int | None = None
    options: RunOptions | None = None
    resumed: tuple[ResumeRecord, ...] = ()

    #: the stored key of each field beside ``machine``
    KEYS = {"owner": "harness_process", "backend": "backend", "order_seed": "order_seed",
            "options": "run_options", "resumed": "resumed"}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> "RunHost":
        """The record stored as ``data`` (``runs.host``); ``None`` or ``{}`` is a run that
        recorded nothing. Raises :class:`NewerRecordError` for a newer record."""
        data = dict(data or {})
        _version(data, "a run's host record")
        data.pop(VERSION_KEY, None)
        owner = data.pop("harness_process", None)
        options = data.pop("run_options", None)
        seed = data.pop("order_seed", None)
        return cls(owner=HarnessProcess.from_json(owner) if isinstance(owner, Mapping) else None,
                   backend=data.pop("backend", None), order_seed=int(seed) if seed is not None else None,
                   options=RunOptions.from_json(options) if isinstance(options, Mapping) else None,
                   resumed=tuple(ResumeRecord.from_json(r) for r in data.pop("resumed", None) or ()),
                   machine=data)

    def to_json(self) -> dict:
        """The record as stored: the host's facts, the run's keys that are set, the version."""
        out: dict[str, Any] = dict(jsonable(self.machine))
        if self.owner is not None:
            out["harness_process"] = self.owner.to_json()
        if self.backend is not None:
            out["backend"] = jsonable(self.backend)
        if self.order_seed is not None:
            out["order_seed"] = self.order_seed
        if self.options is not None:
            out["run_options"] = self.options.to_json()
        if self.resumed:
            out["resumed"] = [r.to_json() for r in self.resumed]
        out[VERSION_KEY] = EVIDENCE_VERSION
        return out

    def with_(self, **changes: Any) -> "RunHost":
        return dataclasses.replace(self, **changes)


#: The keys of ``runs.host`` that are the run's own (the others are the host's facts).
RUN_HOST_KEYS: tuple[str, ...] = tuple(RunHost.KEYS.values())


def evidence_of(boot: Any) -> BootEvidence:
    """The evidence of a boot as any room holds it: a ``boot.BootRecord`` (or anything
    with an ``evidence`` field) gives its own; a row of the ledger is read from its
    stored ``provenance`` here, not through the row's ``evidence`` property, which lives
    in the record layer: the rooms below it that are handed rows (the host's state, the
    engine's identity) must not call up into it."""
    if hasattr(boot, "_sa_instance_state"):  # a mapped row of the ledger (SQLAlchemy's instance state)
        return BootEvidence.from_json(boot.provenance)
    return boot.evidence
