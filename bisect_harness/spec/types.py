"""The spec's types: hypotheses.yaml frozen into dataclasses.

Defaults live here, in the dataclasses' fields, and nowhere else; the section
parsers (``spec.sections``) fill these, and every later stage reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from bisect_harness.observe.contention import Thresholds
from bisect_harness.errors import SpecError
from bisect_harness.model import CLIENT_METRICS, BenchmarkSpec, Expect, FlagValue, Metric
from bisect_harness.workload import LoadPoint

__all__ = ["ArmSpec", "BackendSpec", "Defaults", "EngineSpec", "HypothesisSpec", "MechanismSpec", "ReleasesSpec",
           "Spec", "ENV_CHECK_MODES", "HOST_CHECK_MODES", "SEARCH_SAMPLES"]

ENV_CHECK_MODES = ("mark", "exclude", "fatal")
HOST_CHECK_MODES = ("mark", "exclude", "retry", "fatal")
SEARCH_SAMPLES = ("quiet", "all")


@dataclass(frozen=True)
class ReleasesSpec:
    """``engine.releases``: the engine as released builds, each version a revision.
    ``index`` is an absolute folder (pip's ``--find-links``) or an index URL;
    ``versions`` the order (oldest first; empty: every version in the folder, by
    PEP 440); ``tag`` the source tag of a version (``v{version}``), for descending
    into the commits between two releases; ``launch`` the argv of an installed
    release (default: ``engine.launch``)."""

    package: str
    index: str
    versions: tuple[str, ...] = ()
    tag: str | None = None
    launch: tuple[str, ...] | None = None
    image: str | None = None          # a container image per version ("repo/engine:v{version}"): no install
    runtime: str | None = None        # docker | podman | apptainer | enroot (default: the first on PATH)
    runtime_args: tuple[str, ...] = ()  # after the runtime's run verb: GPUs, mounts

    def source(self):
        from bisect_harness.engines.releases import ReleaseSource

        return ReleaseSource(self.package, self.index, self.versions)


@dataclass(frozen=True)
class EngineSpec:
    """The server under test: where its code lives, how to build and launch it."""

    preset: str = "openai"
    repo: Path | None = None
    # the build's steps, each an argv run in order in the checkout (no shell); one argv is one step
    build: tuple[tuple[str, ...], ...] | None = None
    launch: tuple[str, ...] = ()
    launch_written: bool = False  # engine.launch is the file's own (else the preset's: its optional_flags apply)
    cwd: str | None = None
    health: str = "/health"
    ready_timeout_s: float = 600.0
    server_info: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, FlagValue] = field(default_factory=dict)
    metrics: tuple[Any, ...] = ()  # sources.MetricSource
    python: str | None = None  # the base interpreter; None: the harness's own
    environment: str | None = None  # "venv" | "shared"; None: venv when a build is declared
    base_url: str | None = None  # attach mode: a running server's URL (attach.AttachedSource); nothing launched
    api_key_env: str | None = None  # the environment variable holding an API key (sent as a bearer token)
    checkout: str = "worktree"  # worktree | tree | clone (engines/checkout CHECKOUT_MODES)
    build_env: tuple[str, ...] = ()  # variables that key a commit's build, beyond boot.checkout.BUILD_ENV
    releases: ReleasesSpec | None = None  # the engine as released builds (boot.releases)

    @property
    def sources(self) -> tuple[Any, ...]:
        """Every metric source a boot collects: the file's (``metrics``), then the preset's own
        (``Preset.sources``: vLLM's prefix-cache counters) whose names the file does not use."""
        from bisect_harness.engines import presets

        return presets.get_preset(self.preset).metric_sources(self.metrics)

    @property
    def environment_mode(self) -> str:
        """Where each commit's build installs: its own venv whenever there is a build."""
        if self.environment is not None:
            return self.environment
        return "venv" if self.build else "shared"


@dataclass(frozen=True)
class Defaults:
    """Run-wide knobs; hypotheses may not override them (one design per run)."""

    samples_per_boot: int = 3          # the first rounds' samples per boot, and the fewest a boot takes
    # the most samples a later round's boots take: decide.allocation spends node time on samples
    # where boots are dear and agree with each other (equal to samples_per_boot: a fixed count)
    max_samples_per_boot: int = 16
    boot_cost_s: float | None = None    # what one boot and one sample cost on the node; measured
    sample_cost_s: float | None = None  # from the run's own boots when left out (decide.allocation)
    boots_per_arm: int = 3
    max_boots_per_arm: int = 20         # a budget, not a quota: quiet hosts decide at 3-4 (bench/bench_stats.py)
    alpha: float = 0.05
    env_check: str = "mark"
    flag_check: str = "mark"
    aa_check: bool = False
    boot_retries: int = 2
    host_check: str = "mark"            # a boot whose window saw contention: mark | exclude | retry | fatal
    host_thresholds: Thresholds = field(default_factory=Thresholds)
    host_preflight_s: float = 2.0       # the host watched beside the first boot (before it with --wait-quiet; 0: off)
    host_wait_s: float = 60.0           # retry: longest wait for a quiet host before the re-boot
    # the samples a search (bisect, explain) counts per boot: quiet (those whose own window crossed no
    # host threshold; a boot with none is booted again) or all
    search_samples: str = "quiet"
    analysis: str = "robust"    # robust | paired (rounds as blocks) | unpaired (Welch); chosen by bench/bench_stats.py
    # pool the spread that earlier runs of the same two configs on this host showed into each verdict's
    # t-test (decide.prior; checked against the run's own rounds at every look); false: each run alone
    noise_prior: bool = True
    secret_names: tuple[str, ...] = ()  # env/flag names masked wherever stored or shown (secrets.py)

    @property
    def boots_per_config(self) -> int:
        """The most boots a config gets in a run's rounds, retries included: its budget,
        ``max_boots_per_arm``, plus ``boot_retries + 1`` for boots that failed or that a
        boot check left out (the scheduler's cap; progress counts against it)."""
        return self.max_boots_per_arm + self.boot_retries + 1


@dataclass(frozen=True)
class ArmSpec:
    """One side of a hypothesis as written: a revision (unresolved), env and flags."""

    commit: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, FlagValue] = field(default_factory=dict)
    base_url: str | None = None  # attach mode: this arm's server, instead of engine.base_url
    release: str | None = None  # a version of engine.releases, instead of a commit


@dataclass(frozen=True)
class HypothesisSpec:
    id: str
    statement: str
    baseline: ArmSpec
    treatment: ArmSpec
    metric: str
    expect: Expect
    min_effect: float
    bisect: bool = False
    line: int | None = None
    matrix_point: Mapping[str, FlagValue] = field(default_factory=dict)
    explain: bool = False  # after a confirmed verdict, find which differences between the arms cause it
    mechanism: tuple = ()  # MechanismSpec each: further metrics that must move for the claim to hold
    profile: bool = False  # one extra sample per arm under the engine's profiler (boot.profilers)
    # a point of a sweep (``sweep:``, the file's or the hypothesis'): the hypothesis is decided on
    # that point's samples, and ``curve`` is the id of the curve it belongs to (the id before "@")
    point: LoadPoint | None = None
    curve: str | None = None

    @property
    def point_label(self) -> str | None:
        """The label of the load point whose samples decide this hypothesis (None: the one point)."""
        return self.point.label if self.point is not None else None


@dataclass(frozen=True)
class MechanismSpec:
    """One metric a hypothesis' mechanism must move (``mechanism:``): treatment vs
    baseline, in direction ``expect``, by at least ``min_effect``."""

    metric: str
    expect: Expect
    min_effect: float


@dataclass(frozen=True)
class BackendSpec:
    """Where boots run (``backend:``): ``kind`` local or slurm, ``slots`` boots at once,
    and the chosen backend's own keys (``options``: partition, time limit, ... for
    Slurm), checked by that backend (``boot.choose``)."""

    kind: str = "local"
    slots: int = 1
    options: tuple[tuple[str, Any], ...] = ()

    def options_dict(self) -> dict[str, Any]:
        return dict(self.options)


@dataclass(frozen=True)
class Spec:
    path: Path
    text: str
    engine: EngineSpec
    benchmark: BenchmarkSpec
    defaults: Defaults
    hypotheses: tuple[HypothesisSpec, ...]
    family_size: int = 0  # hypotheses in the file (after matrix expansion), kept by select()
    backend: "BackendSpec" = field(default_factory=lambda: BackendSpec())
    kept_points: tuple[LoadPoint, ...] = ()  # the file's points, kept by select() (:attr:`points`)

    @property
    def spec_dir(self) -> Path:
        return self.path.parent

    @property
    def multiplicity(self) -> int:
        """The multiplicity family's size: every hypothesis of the file, whatever ``--only`` kept."""
        return max(self.family_size, len(self.hypotheses), 1)

    def metrics(self) -> dict[str, Metric]:
        """Every metric a hypothesis may name: the client's and the sources' (the file's and the
        preset's, ``EngineSpec.sources``)."""
        out = dict(CLIENT_METRICS)
        for source in self.engine.sources:
            out[source.metric.name] = source.metric
        return out

    @property
    def points(self) -> tuple[LoadPoint, ...]:
        """The load points every boot measures: those of every hypothesis of the file (the
        file's ``benchmark.sweep`` and each hypothesis' ``sweep``), in the order first
        written; () where no hypothesis names one (the benchmark's one point). Every
        config measures them all, so boots stay comparable across hypotheses, nights and
        searches."""
        if self.kept_points:
            return self.kept_points
        seen: dict[str, LoadPoint] = {}
        for h in self.hypotheses:
            if h.point is not None:
                seen.setdefault(h.point.label, h.point)
        return tuple(seen.values())

    def select(self, only: list[str] | tuple[str, ...]) -> "Spec":
        """Keep the hypotheses named in ``only``: by id (a sweep's point:
        ``spec-wins@concurrency=4``), by curve (every point of it: ``spec-wins``, or
        ``steps[n=2]`` for one matrix point's curve), or by the id as written (every
        matrix point and every sweep point: ``steps``)."""
        if not only:
            return self

        def names(h: HypothesisSpec) -> set[str]:
            written = (h.curve or h.id).split("[", 1)[0]
            return {h.id, written} | ({h.curve} if h.curve is not None else set())

        known = set().union(*(names(h) for h in self.hypotheses))
        unknown = [o for o in only if o not in known]
        if unknown:
            raise SpecError(
                f"--only {', '.join(unknown)}: no such hypothesis; known ids: "
                + ", ".join(sorted(h.id for h in self.hypotheses)), file=str(self.path))
        keep = tuple(h for h in self.hypotheses if names(h) & set(only))
        return replace(self, hypotheses=keep, kept_points=self.points)
