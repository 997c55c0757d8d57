"""From a frozen spec to a plan: resolved commits, distinct configs, argv and env.

Arms that are equal (same commit, env and flags) become one config and share
their boots, so a HEAD baseline used by three hypotheses is booted once per round.
A hypothesis that compares a config with itself (an A/A check) gets a second,
independent replica of it, so its two sides never share a boot.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from bisect_harness.engines import presets
from bisect_harness.engines.preset_flags import without
from bisect_harness.measure import sources
from bisect_harness.measure.apis import get_api
from bisect_harness.boot import BootRequest, Checks, freeze
from bisect_harness.decide.design import Design
from bisect_harness.decide.verdict import Rules
from bisect_harness.engines.checkout import Workspace, default_cache_dir
from bisect_harness.engines.envs import resolve_python
from bisect_harness.errors import CommitError, UserError
from bisect_harness.model import Arm, BenchmarkSpec, Metric
from bisect_harness.spec import HypothesisSpec, Spec

TP_FLAGS = presets.TP_FLAGS  # canonical spellings of the tensor parallel degree


@dataclass(frozen=True)
class PlannedConfig:
    """One distinct boot recipe. ``key`` identifies it across runs (ledger reuse)."""

    key: str
    arm: Arm
    replica: int = 0

    @property
    def label(self) -> str:
        return self.arm.describe() + (f" (replica {self.replica})" if self.replica else "")


@dataclass(frozen=True)
class ConfigRecipe:
    """All the scheduler needs of one config, handed over once (``Plan.recipe``):
    its series, its launch as the config row shows it (``{port}`` left open) and
    the request every boot of it goes out as, less the boot's id, number and log
    (``BootRequest.for_boot``). ``profile``: the config is an arm to profile (one
    extra sample under the engine's profiler, on one of its boots: the scheduler's)."""

    series: str
    argv: tuple[str, ...]
    request: BootRequest
    profile: bool = False


@dataclass(frozen=True)
class PlannedHypothesis:
    spec: HypothesisSpec
    baseline: PlannedConfig
    treatment: PlannedConfig
    metric: Metric

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def is_aa(self) -> bool:
        return self.baseline.arm.key() == self.treatment.arm.key()


@dataclass(frozen=True)
class Plan:
    spec: Spec
    repo: Path | None
    configs: tuple[PlannedConfig, ...]
    hypotheses: tuple[PlannedHypothesis, ...]
    cache_dir: Path
    base_interpreter: str | None = None  # resolved engine.python; None: resolved on first use
    #: the engine repository's mirror and worktrees in the cache (None: no repository, or not resolved)
    ws: Workspace | None = field(default=None, compare=False)
    #: ``harness run --profile``: every hypothesis' arms are profiled, as with ``profile: true``
    profile_all: bool = False

    @property
    def preset(self) -> presets.Preset:
        return presets.get_preset(self.spec.engine.preset)

    @property
    def source(self):
        """Where boots' servers come from: launched, or attached (``attach.source_for``)."""
        from bisect_harness.engines.attach import source_for

        return source_for(self.spec)

    @property
    def base_python(self) -> str:
        """The base environment's interpreter (``engine.python``, else the harness's own)."""
        return self.base_interpreter or resolve_python(self.spec.engine.python)

    def argv(self, config: PlannedConfig, *, port: int | str, worktree: Path | None,
             python: str | None = None) -> list[str]:
        """The launch argv for one boot: template plus flags, placeholders filled, no shell.
        ``python`` is the commit's interpreter (``CommitEnv.python``); by default the base's,
        or the literal ``{python}`` for a config whose commits each get their own."""
        python = python or self.python_for(config)
        template = list(self.recipe(config).request.argv)  # the one launch template: a release's own, its image's
        return presets.render_argv(template, **presets.placeholder_values(port=port, worktree=worktree, python=python,
                                                                          spec_dir=self.spec.spec_dir))

    def build_argv(self, config: PlannedConfig, step) -> list[str]:
        """One step of ``config``'s build as the boot runs it, ``{worktree}`` and a
        commit's own ``{python}`` left as placeholders."""
        return presets.render_argv(list(step), **presets.placeholder_values(
            port="", worktree=Path("{worktree}"), python=self.python_for(config), spec_dir=self.spec.spec_dir))

    def placeholders(self, *, port, worktree: Path | None, python: str | None = None) -> dict[str, str]:
        return presets.placeholder_values(port=port, worktree=worktree, python=python or self.base_python,
                                          spec_dir=self.spec.spec_dir)

    @classmethod
    def for_engine(cls, spec: Spec, cache_dir: Path | None = None) -> "Plan":
        """A plan of the engine alone: configs are made as they are needed (a bisection's
        commits, a nightly's newest commit), with no hypotheses. Its repository is the
        one ``make_plan`` would use (None for an attached or installed server)."""
        cache_dir = cache_dir or default_cache_dir()
        repo = engine_repo(spec, cache_dir)
        return cls(spec=spec, repo=repo, configs=(), hypotheses=(), cache_dir=cache_dir,
                   ws=Workspace(repo, cache_dir) if repo is not None else None)

    @property
    def per_commit_env(self) -> bool:
        """Does each commit get its own environment (``engine.environment: venv``)?"""
        return self.repo is not None and self.spec.engine.environment_mode == "venv"

    def python_for(self, config: PlannedConfig) -> str:
        """``{python}`` as known before a boot: the base interpreter, or the literal
        ``{python}`` where each commit's (or release's) own environment supplies it at boot time."""
        if config.arm.release is not None:
            return "{python}"
        return "{python}" if (self.per_commit_env and config.arm.commit is not None) else self.base_python

    def profiles(self, config: PlannedConfig) -> bool:
        """Whether ``config`` takes a profiled sample: it is an arm of a hypothesis with
        ``profile: true``, or of any hypothesis under ``harness run --profile``. The
        configs a bisection or an explanation adds are not arms: never profiled."""
        return any(config.key in (h.baseline.key, h.treatment.key)
                   for h in self.hypotheses if h.spec.profile or self.profile_all)

    def devices_needed(self, config: PlannedConfig) -> int:
        """GPUs one boot of ``config`` takes: its tensor parallel degree (``tp`` in any of
        the preset's spellings), else 1."""
        return presets.devices_needed(config.arm.flags, self.preset)

    def recipe(self, config: PlannedConfig) -> ConfigRecipe:
        """Everything the scheduler needs of ``config``, as frozen values, made once per config:
        what the plan knows itself first (series, interpreters), then what the preset says of
        the launch and the flags, then the frozen request. What depends on the host that runs
        a boot (port, worktree, interpreter) stays a placeholder (``boot.request``)."""
        spec, engine, d, arm = self.spec, self.spec.engine, self.spec.defaults, config.arm
        series = series_key(spec, arm)
        per_commit_env, python, base_python = self.per_commit_env, self.python_for(config), self.base_python
        flags = dict(arm.flags)
        preset = presets.get_preset(engine.preset)
        # the file's sources and the preset's own; only the file's are part of the config's key
        wanted, skipped = sources.applicable(engine.sources, flags, lambda f: presets.canonical_flag(f, preset))
        keys = {f: presets.info_key(f, preset) for f in flags}
        # every flag is planned for the check: one the preset has no server-info key for (key
        # None) is listed as not reported, never dropped, so no verdict reads it as compared
        checks = tuple((f, v, keys[f], presets.compare_mode(f, preset)) for f, v in flags.items())
        release = None
        launch, build = engine.launch, engine.build
        if arm.release is not None:  # an installed build: no checkout, no build, its own launch
            from bisect_harness.engines.releases import ReleaseRequest

            rel = engine.releases
            image = rel.image.format(version=arm.release) if rel.image else None
            release = ReleaseRequest(rel.package, arm.release, rel.index, image=image, runtime=rel.runtime,
                                     runtime_args=rel.runtime_args)
            launch, build, per_commit_env = (rel.launch or engine.launch), None, False
        template = presets.launch_argv(launch, flags, preset)
        # the preset's own options a build may lack: only where the launch is the preset's, and
        # not where the arm asks for the option itself
        # (a release's image runs its help inside the image: not read, the options stay)
        optional = tuple(f for f in preset.optional_flags if not engine.launch_written and launch == engine.launch
                         and f not in presets.flags_to_argv(flags, preset)
                         and (release is None or release.image is None))
        help_template = tuple(without(launch, optional)) + tuple(preset.help_args) if optional else ()
        if release is not None and release.image is not None:  # the launch runs inside the image
            from bisect_harness.engines.releases import container_argv, find_runtime

            runtime = rel.runtime or os.path.basename(find_runtime() or "docker")
            template = container_argv(runtime, release.image, template, {**preset.env, **arm.env},
                                      name="bisect-harness-{port}", runtime_args=rel.runtime_args)
        # {worktree} stays a placeholder where a commit is checked out (each boot's own folder:
        # the journal's "ran as"); without one it is the spec's folder, as at boot time
        checked_out = "{worktree}" if arm.commit is not None and self.repo is not None else None
        shown = presets.render_argv(template, **presets.placeholder_values(
            port="{port}", worktree=checked_out, python=python, spec_dir=spec.spec_dir))
        devices = presets.devices_needed(flags, preset)
        env = {**preset.env, **arm.env}  # what the engine needs to be observable, then the arm
        request = BootRequest(
            boot_id=0, config_key=config.key, label=config.label, seq=0, preset=preset.name,
            commit=arm.commit, repo=str(self.repo) if (self.repo is not None and release is None) else None,
            cache_dir=str(self.cache_dir), per_commit_env=per_commit_env, base_python=base_python,
            argv=tuple(str(x) for x in template),
            build_steps=tuple(tuple(str(x) for x in step) for step in build) if build else None,
            cwd=engine.cwd, spec_dir=str(spec.spec_dir),
            env=freeze(env), arm_env=freeze(arm.env), flags=freeze(flags), flag_checks=checks,
            health_path=engine.health, ready_timeout_s=engine.ready_timeout_s,
            ready_probe=get_api(spec.benchmark.api).ready_probe,
            health_request_timeout_s=preset.health_request_timeout_s,
            # the preset's pause is for a server that just started; an attached one is already warm
            settle_s=preset.settle_s if arm.endpoint is None else 0.0,
            server_info_paths=tuple(engine.server_info), metrics_path=preset.metrics_path,
            endpoint=arm.endpoint, api_key_env=engine.api_key_env,
            metric_sources=tuple(wanted), sources_not_applicable=tuple(s.name for s in skipped),
            benchmark=replace(spec.benchmark, points=spec.points), samples=d.samples_per_boot,
            checks=Checks(env_check=d.env_check, flag_check=d.flag_check, host_check=d.host_check,
                          thresholds=d.host_thresholds),
            log_path=str(Path(os.devnull)), devices_needed=devices, checkout=engine.checkout,
            build_env=engine.build_env, release=release, preset_flags=optional, help_argv=help_template)
        return ConfigRecipe(series=series, argv=tuple(shown), request=request, profile=self.profiles(config))

    def boot_request(self, config: PlannedConfig, *, boot_id: int, seq: int, log_path: Path) -> BootRequest:
        """The frozen recipe of one boot of ``config`` (:meth:`recipe`'s request, as that boot)."""
        return self.recipe(config).request.for_boot(boot_id=boot_id, seq=seq, log_path=log_path)


#: The benchmark's workload keys (``workload``): part of the key only where set, so files
#: written before them keep the config keys their ledgers hold.
_WORKLOAD_KEYS = ("request_rate", "arrival", "burstiness", "prompt_tokens_max", "output_tokens_max", "sample_seconds",
                  "workload", "slo", "capacity", "max_lag_ms", "points")


def engine_fingerprint(spec: Spec) -> str:
    """What besides the arm changes a measurement: launch, build, benchmark, samples per boot."""
    e = spec.engine
    # Keys added later count only when set, so older files keep the config keys their ledgers hold.
    # limits decide what is refused, not what is measured: never part of the key
    bench = {k: v for k, v in spec.benchmark.__dict__.items()
             if k not in ("limits", "prompt_reuse") and not (k in ("tool", "tool_args") and not v)
             and not (k in _WORKLOAD_KEYS and v == BenchmarkSpec.__dataclass_fields__[k].default)}
    # Unique prompts per sample (the default since they were made so) measure another thing than
    # the prompts every sample used to repeat: their configs get keys of their own, and a file
    # with prompt_reuse: true, which measures as the older files did, keeps the keys they hold.
    if not spec.benchmark.prompt_reuse:
        bench["prompts"] = "unique"
    # one build step keys as the one argv it always was; several as a list of argvs
    build = [list(step) for step in e.build or ()]
    fields = {"preset": e.preset, "launch": list(e.launch), "build": build[0] if len(build) == 1 else build,
              "cwd": e.cwd, "bench": bench,
              "samples_per_boot": spec.defaults.samples_per_boot,
              "metrics": [repr(m) for m in e.metrics]}
    # Only when written: files that leave them out keep the keys their ledgers already hold.
    fields.update({k: v for k, v in (("python", e.python), ("environment", e.environment)) if v is not None})
    if e.checkout != "worktree":  # a build script may make another engine from a tree or a clone (its version)
        fields["checkout"] = e.checkout
    if e.base_url is not None:  # attached: which server (the key's variable name, never the key)
        fields.update(base_url=e.base_url, api_key_env=e.api_key_env)
    if e.releases is not None:  # which package, from where, launched how
        fields["releases"] = {"package": e.releases.package, "index": e.releases.index,
                              "launch": list(e.releases.launch or ())}
        if e.releases.image is not None:
            fields["releases"].update(image=e.releases.image, runtime=e.releases.runtime,
                                      runtime_args=list(e.releases.runtime_args))
    payload = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def engine_repo(spec: Spec, cache_dir: Path) -> Path | None:
    if spec.engine.base_url is not None:  # attached: a running server has no commits
        return None
    if spec.engine.repo is not None:
        return spec.engine.repo
    return presets.get_preset(spec.engine.preset).default_repo(cache_dir)  # the demo's history, or None


def series_key(spec: Spec, arm: Arm) -> str:
    """A config's identity without its commit: the same env, flags and engine over time."""
    fields = {"env": dict(arm.env), "flags": dict(arm.flags)}
    if arm.endpoint is not None:  # attached: each server is its own series
        fields["endpoint"] = arm.endpoint
    payload = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(f"{payload}:{engine_fingerprint(spec)}".encode()).hexdigest()[:20]


def make_config(spec: Spec, arm: Arm, replica: int = 0) -> PlannedConfig:
    key = hashlib.sha256(f"{arm.key()}:{engine_fingerprint(spec)}:{replica}".encode()).hexdigest()[:20]
    return PlannedConfig(key=key, arm=arm, replica=replica)


def verdict_rules(spec: Spec) -> Rules:
    """What the verdict rule takes from the file: the sequential design, the size of the
    multiplicity family (every hypothesis of the file, whatever ``--only`` kept), the
    host thresholds."""
    d = spec.defaults
    return Rules(design=Design(alpha=d.alpha, min_boots=d.boots_per_arm, max_boots=d.max_boots_per_arm,
                               analysis=d.analysis),
                 family_size=spec.multiplicity, thresholds=d.host_thresholds)


def arm_of(spec: Spec, sha: str | None, env, flags, base_url: str | None = None, release: str | None = None) -> Arm:
    """One side as it boots: its revision (a resolved commit, or a release), the engine's
    env and flags under its own."""
    endpoint = (base_url or spec.engine.base_url) if spec.engine.base_url is not None else None
    return Arm(commit=None if release is not None else sha, env={**spec.engine.env, **env},
               flags={**spec.engine.flags, **flags}, endpoint=endpoint, release=release)


def _named(h: HypothesisSpec) -> str:
    """A hypothesis as an error names it: its id and, where known, its line in the file."""
    return f"hypothesis {h.id}" + (f" (line {h.line})" if h.line else "")


def check_bisectable(h: HypothesisSpec, base: Arm, treat: Arm, ws: Workspace | None = None) -> None:
    """``bisect: true`` searches forward from the baseline's commit to the treatment's:
    refused before any boot when there is nothing to search (a release, a missing or
    one commit, with ``ws`` a baseline that is not an ancestor of the treatment), or
    when the sides differ in more than their commit (the search holds the rest fixed)."""
    where = f"{_named(h)}: bisect: true"
    if base.release is not None or treat.release is not None:
        raise UserError(f"{where} bisects commits, and a side is a release; bisect released versions with "
                        "`harness bisect FILE --good V1 --bad V2`, or drop bisect: true")
    if base.commit is None or treat.commit is None:
        raise UserError(f"{where} needs a commit on each side: set baseline.commit and treatment.commit")
    if base.commit == treat.commit:
        raise UserError(f"{where}: both sides are commit {base.commit[:12]}, so there is nothing between them to "
                        "bisect; point the sides at different commits, or drop bisect: true")
    differ = [f"{kind} {key}" for kind, key in base.setting_differences(treat)]
    if differ:
        raise UserError(f"{where} needs sides that differ only in their commit; these differ too: "
                        f"{', '.join(differ)}. Split the hypothesis (one for the commit, one for the settings), "
                        "or use explain: true to find which difference matters")
    if ws is not None and not ws.is_ancestor(base.commit, treat.commit):
        raise CommitError(f"{where} searches forward from the baseline's commit, and {base.commit[:12]} is not an "
                          f"ancestor of the treatment's {treat.commit[:12]}; swap the sides (and expect), or pick "
                          "commits on one line of history")


def make_plan(spec: Spec, *, cache_dir: Path | None = None, resolve: bool = True,
              resolve_if_present: bool = False) -> Plan:
    """Resolve every revision and dedupe configs. Raises CommitError naming the hypothesis key.

    With ``resolve=False`` revisions stay as written (a dry run for another machine);
    with ``resolve_if_present`` they are resolved only where the engine's repository
    is on this machine (``harness run --dry-run``)."""
    cache_dir = cache_dir or default_cache_dir()
    repo = engine_repo(spec, cache_dir)
    if resolve_if_present:
        resolve = repo is not None and Path(repo).exists()
    if repo is not None and resolve and not repo.exists():
        raise CommitError(f"engine.repo: no such folder {repo}; point it at the engine's git checkout "
                          "(relative to the hypotheses file), or remove it to test an installed server")
    ws = Workspace(repo, cache_dir) if (repo is not None and resolve) else None
    metrics = spec.metrics()
    # Every revision resolved first, in the file's order (the first that fails names its hypothesis).
    sides = [(arm, f"hypothesis {h.id}, {name}.commit") for h in spec.hypotheses
             for name, arm in (("baseline", h.baseline), ("treatment", h.treatment))]
    shas = [ws.resolve(arm.commit, where=where) if (ws is not None and arm.commit is not None) else arm.commit
            for arm, where in sides]
    released = [(arm.release, where.replace(".commit", ".release")) for arm, where in sides if arm.release]
    if released and resolve:  # every release named is one the source holds
        known = spec.engine.releases.source().versions()
        for version, where in released:
            if version not in known:
                raise CommitError(f"{where}: no release {version} of {spec.engine.releases.package} (known: "
                                  f"{', '.join(known[:12])}{', ...' if len(known) > 12 else ''})")
    configs: dict[str, PlannedConfig] = {}
    hyps: list[PlannedHypothesis] = []
    for i, h in enumerate(spec.hypotheses):
        bsha, tsha = shas[2 * i], shas[2 * i + 1]
        base = arm_of(spec, bsha, h.baseline.env, h.baseline.flags, base_url=h.baseline.base_url,
                      release=h.baseline.release)
        treat = arm_of(spec, tsha, h.treatment.env, h.treatment.flags, base_url=h.treatment.base_url,
                       release=h.treatment.release)
        if h.bisect:
            check_bisectable(h, base, treat, ws)
        if h.explain and base.key() == treat.key():
            raise UserError(f"{_named(h)}: explain: true "
                            "needs sides that differ (commit, env or flags); these are one config. Drop explain: "
                            "true, or change a side")
        b = make_config(spec, base)
        t = make_config(spec, treat, replica=1 if base.key() == treat.key() else 0)
        b = configs.setdefault(b.key, b)
        t = configs.setdefault(t.key, t)
        hyps.append(PlannedHypothesis(spec=h, baseline=b, treatment=t, metric=metrics[h.metric]))
    base_python = resolve_python(spec.engine.python) if resolve else (spec.engine.python or sys.executable)
    return Plan(spec=spec, repo=repo, configs=tuple(configs.values()), hypotheses=tuple(hyps),
                cache_dir=cache_dir, base_interpreter=base_python, ws=ws)
