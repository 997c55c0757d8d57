"""The parsers of hypotheses.yaml's sections: each takes its part of the document
and returns the frozen value (``spec.types``), or raises the error that names the
key and its line (``spec.reader``).

The allowed keys of each section are the tables below (the JSON Schema,
``spec.schema``, is built from them); the choices of a kind (presets, benchmark
APIs, metric sources, analyses, backends, checkout modes) are read from the
modules that register them, never copied here.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from bisect_harness.backends import BACKENDS
from bisect_harness.decide.design import ANALYSES
from bisect_harness.observe.contention import Thresholds
from bisect_harness.engines.envs import ENV_MODES
from bisect_harness.errors import SpecError, UserError
from bisect_harness.model import CLIENT_METRICS, BenchmarkSpec, Expect, Limits, Metric
from bisect_harness.spec.reader import (MAX_BOOTS, MAX_COUNT, MAX_HYPOTHESES, MAX_MATRIX_POINTS,
                                        MAX_SAMPLES_PER_BOOT, MAX_SECONDS, MAX_SEED, _ENV_NAME_RE, _check_flag_name,
                                        _env_str, _no_nul_inside, _Reader, _typename, parse_effect)
from bisect_harness.spec.types import (ENV_CHECK_MODES, HOST_CHECK_MODES, SEARCH_SAMPLES, ArmSpec, BackendSpec,
                                       Defaults, EngineSpec, HypothesisSpec, MechanismSpec, ReleasesSpec)
from bisect_harness.spec import workloads
from bisect_harness.workload import LoadPoint

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")

#: the keys each section allows (``spec.schema`` is built from these tables)
_TOP = ("version", "engine", "benchmark", "defaults", "backend", "limits", "hypotheses")
_ENGINE = ("preset", "repo", "build", "launch", "cwd", "health", "ready_timeout_s", "server_info",
           "env", "flags", "metrics", "python", "environment", "base_url", "api_key_env", "checkout", "build_env",
           "releases")
_RELEASES = ("package", "index", "versions", "tag", "launch", "image", "runtime", "runtime_args")
#: ``benchmark:`` keys read by the plain loop of ``_benchmark``; the workload's own keys
#: (``spec.workloads.KEYS``: open loop, lengths, the sample's seconds, the source of the
#: prompts, the SLO, the sweep) are read by their own readers, ``points`` is the plan's
_BENCH_PLAIN = ("api", "model", "prompt_tokens", "output_tokens", "concurrency", "requests_per_sample",
                "warmup_requests", "temperature", "ignore_eos", "request_timeout_s", "seed", "prompt_reuse",
                "tool", "tool_args")
_BENCH = _BENCH_PLAIN + workloads.KEYS
_DEFAULTS = tuple(Defaults.__dataclass_fields__)
_HYP = ("id", "statement", "baseline", "treatment", "metric", "expect", "min_effect", "matrix", "sweep", "bisect",
        "explain", "mechanism", "profile")
_MECH = ("metric", "expect", "min_effect")
_ARM = ("commit", "release", "env", "flags", "base_url")
#: engine keys that describe a launch: an attached server (engine.base_url) takes none of them
_LAUNCH_ONLY = ("repo", "build", "launch", "cwd", "python", "environment", "env", "flags", "checkout", "build_env",
                "releases")


def _backend(r: _Reader, value) -> BackendSpec:
    """``backend:``: kind and slots here; the kind's own keys are checked by that backend."""
    if value is None:
        return BackendSpec()
    if not isinstance(value, dict):
        raise r.doc.error("backend", "must be a mapping, e.g. {kind: slurm, partition: gpu, slots: 4}")
    kind = value.get("kind", BackendSpec.kind)
    if kind not in BACKENDS:
        raise r.doc.error("backend.kind", f"must be one of {', '.join(BACKENDS)}, got {kind!r}")
    slots = r.positive_int(value.get("slots", 1), "backend.slots", maximum=1024)
    options = {str(k): v for k, v in value.items() if k not in ("kind", "slots")}
    from bisect_harness.backends import check_options

    check_options(kind, options, where="backend")
    return BackendSpec(kind=kind, slots=slots, options=tuple(sorted(options.items())))


def _engine(r: _Reader, value, spec_dir: Path) -> EngineSpec:
    from bisect_harness.engines import presets
    from bisect_harness.measure import sources

    e = r.mapping(value, "engine", _ENGINE)
    base_url = _attach_keys(r, e)
    preset_name = e.get("preset", EngineSpec.preset)
    r.typed(preset_name, "engine.preset", (str,), "a preset name")
    try:
        preset = presets.get_preset(preset_name)
    except UserError as exc:  # names the known presets
        raise r.doc.error("engine.preset", str(exc)) from None
    repo = None
    if "repo" in e:
        r.typed(e["repo"], "engine.repo", (str,), "a path to a git repository")
        # Existence is checked when the plan resolves commits, so `--dry-run` can show
        # a plan written for another machine.
        repo = (spec_dir / Path(e["repo"]).expanduser()).resolve()
    launch = r.argv(e["launch"], "engine.launch") if "launch" in e else tuple(preset.launch)
    if base_url is not None:
        launch = ()  # attached: the preset's launch and build are not ours to run
    if not launch and base_url is None:
        raise r.doc.error("engine", f"preset '{preset_name}' has no launch command: add engine.launch, "
                          "e.g. [my-server, --port, '{port}']")
    build = r.steps(e["build"], "engine.build") if "build" in e else (
        (tuple(preset.build),) if preset.build and base_url is None else None)
    health = e.get("health", preset.health_path)
    r.typed(health, "engine.health", (str,), "a URL path like /health")
    if not health.startswith("/"):
        raise r.doc.error("engine.health", f"must start with '/', got {health!r}")
    timeout = r.number(e.get("ready_timeout_s", preset.ready_timeout_s), "engine.ready_timeout_s",
                       "a number of seconds", positive=True)
    if e.get("server_info") is not None:
        r.typed(e["server_info"], "engine.server_info", (str, list), "a path or a list of paths")
    try:  # the preset's paths, or the file's (one path or a list; [] turns server info off)
        info = presets.server_info_candidates(preset, e.get("server_info"))
    except UserError as exc:
        raise r.doc.error("engine.server_info", str(exc)) from None
    cwd = e.get("cwd")
    if cwd is not None:
        r.typed(cwd, "engine.cwd", (str,), "a folder (placeholders allowed)")
    metrics = []
    raw_metrics = e.get("metrics") or []
    r.typed(raw_metrics, "engine.metrics", (list,), "a list of metric sources")
    seen = set(CLIENT_METRICS)
    for i, m in enumerate(raw_metrics):
        key = f"engine.metrics[{i}]"
        try:
            source = sources.parse_source(m, key)
        except SpecError as exc:
            raise r.doc.error(exc.key or key, exc.message) from None
        if source.metric.name in seen:
            raise r.doc.error(f"{key}.name", f"metric '{source.metric.name}' is already defined")
        seen.add(source.metric.name)
        metrics.append(source)
    try:  # a derived metric names other declared ones, with no cycle; its definition takes theirs
        metrics = list(sources.resolve_derived(metrics, "engine.metrics"))
    except SpecError as exc:
        raise r.doc.error(exc.key or "engine.metrics", exc.message) from None
    python = e.get("python")
    if python is not None:
        r.typed(python, "engine.python", (str,), "the path (or PATH name) of the base environment's python")
        if os.sep in python:  # a path, relative to the hypotheses file; a bare name is looked up on PATH
            python = os.path.abspath(spec_dir / Path(python).expanduser())
    environment = e.get("environment")
    if environment is not None and environment not in ENV_MODES:
        raise r.doc.error("engine.environment", f"must be one of {', '.join(ENV_MODES)}, got {environment!r}: "
                          "'venv' gives each commit its own environment over engine.python, 'shared' builds "
                          "every commit into engine.python itself")
    if environment is not None and repo is None and not preset.has_default_repo:
        raise r.doc.error("engine.environment", "environments are per commit, and this engine has no "
                          "repository (engine.repo); remove engine.environment or add engine.repo")
    checkout, build_env = _checkout_keys(r, e)
    releases = _releases(r, e["releases"], spec_dir) if e.get("releases") is not None else None
    return EngineSpec(
        preset=preset_name, repo=repo, build=build, launch=launch, launch_written="launch" in e, cwd=cwd,
        health=health,
        ready_timeout_s=float(timeout), server_info=info,
        env=r.env(e.get("env"), "engine.env"), flags=r.flags(e.get("flags"), "engine.flags"),
        metrics=tuple(metrics), python=python, environment=environment, base_url=base_url,
        api_key_env=e.get("api_key_env"), checkout=checkout, build_env=build_env, releases=releases)


def _releases(r: _Reader, value, spec_dir: Path) -> ReleasesSpec:
    m = r.mapping(value, "engine.releases", _RELEASES, required=("package",))
    package = m["package"]
    r.typed(package, "engine.releases.package", (str,), "the distribution name, as pip installs it")
    if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$", package):
        raise r.doc.error("engine.releases.package", f"not a distribution name: {package!r}")
    image = m.get("image")
    if image is not None:
        r.typed(image, "engine.releases.image", (str,), "an image reference with {version}, e.g. repo/engine:v{version}")
        if "{version}" not in image:
            raise r.doc.error("engine.releases.image", f"must hold {{version}} (one image per release), got {image!r}")
    elif m.get("index") is None:
        raise r.doc.error("engine.releases", "give index (a folder of wheels and sdists, or a package index URL), "
                          "or image (a container image per version)")
    runtime = m.get("runtime")
    if runtime is not None:
        from bisect_harness.engines.releases import RUNTIMES

        if runtime not in RUNTIMES:
            raise r.doc.error("engine.releases.runtime", f"must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    runtime_args = tuple(r.argv(m["runtime_args"], "engine.releases.runtime_args")) if m.get("runtime_args") else ()
    index = m.get("index") or ""
    if index:
        r.typed(index, "engine.releases.index", (str,), "a folder of wheels and sdists, or a package index URL")
    if index and not re.match(r"^[a-z][a-z0-9+.-]*://", index):  # a folder, relative to this file
        index = os.path.abspath(spec_dir / Path(index).expanduser())
    versions = m.get("versions") or []
    if not isinstance(versions, list) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool)
                                                  for v in versions):
        raise r.doc.error("engine.releases.versions", "expected a list of versions, oldest first")
    versions = tuple(str(v) for v in versions)
    if len(set(versions)) != len(versions):
        raise r.doc.error("engine.releases.versions", "a version is listed twice")
    if image is not None and not index and not versions:
        raise r.doc.error("engine.releases.versions", "list the versions (oldest first): images have no folder to "
                          "read them from")
    tag = m.get("tag")
    if tag is not None:
        r.typed(tag, "engine.releases.tag", (str,), "a tag pattern such as 'v{version}'")
        if "{version}" not in tag:
            raise r.doc.error("engine.releases.tag", f"must hold {{version}}, e.g. 'v{{version}}', got {tag!r}")
    launch = r.argv(m["launch"], "engine.releases.launch") if m.get("launch") is not None else None
    return ReleasesSpec(package=package, index=index, versions=versions, tag=tag,
                        launch=tuple(launch) if launch is not None else None, image=image, runtime=runtime,
                        runtime_args=runtime_args)


def _checkout_keys(r: _Reader, e: dict) -> tuple[str, tuple[str, ...]]:
    """engine.checkout (how each commit is checked out) and engine.build_env (the
    variables whose values key a commit's build)."""
    from bisect_harness.engines.checkout import CHECKOUT_MODES

    mode = e.get("checkout", CHECKOUT_MODES.names()[0])
    if mode not in CHECKOUT_MODES:
        raise r.doc.error("engine.checkout", f"must be one of {', '.join(CHECKOUT_MODES)}, got {mode!r}: "
                          f"{CHECKOUT_MODES.in_words(lambda m: f'{m.name!r} ({m.summary})')}")
    names = e.get("build_env", [])
    r.typed(names, "engine.build_env", (list,), "a list of environment variable names")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            raise r.doc.error(f"engine.build_env[{i}]", f"expected an environment variable name like CMAKE_ARGS, "
                              f"got {name!r}")
    return mode, tuple(dict.fromkeys(names))


def _url(r: _Reader, value, path: str) -> str:
    from urllib.parse import urlsplit

    r.typed(value, path, (str,), "a URL like http://10.0.0.5:30000")
    try:
        parts = urlsplit(value)
    except ValueError as exc:  # an unclosed [IPv6 literal, ...
        raise r.doc.error(path, f"cannot read {value!r} as a URL ({exc}); write one like "
                          "http://10.0.0.5:30000") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise r.doc.error(path, f"expected an http:// or https:// URL with a host, got {value!r}")
    try:
        parts.port
    except ValueError:
        raise r.doc.error(path, f"the port of {value!r} is not a number") from None
    return value.rstrip("/")


def _attach_keys(r: _Reader, e: dict) -> str | None:
    """engine.base_url and engine.api_key_env; a launch key beside base_url is an error."""
    if "api_key_env" in e:
        name = e["api_key_env"]
        r.typed(name, "engine.api_key_env", (str,), "the NAME of an environment variable (not the key itself)")
        if not _ENV_NAME_RE.match(name):
            # The value is not repeated: someone may have pasted the key itself here.
            raise r.doc.error("engine.api_key_env", "this is not an environment variable name; write the "
                              "variable's name (e.g. MY_KEY), never the key itself")
    if "base_url" not in e:
        return None
    url = _url(r, e["base_url"], "engine.base_url")
    for key in _LAUNCH_ONLY:
        if key in e:
            raise r.doc.error(f"engine.{key}", f"an attached server (engine.base_url) is not built or launched "
                              f"by the harness, so engine.{key} cannot apply; remove engine.{key}, or remove "
                              "engine.base_url to have the harness launch the server")
    return url


def _tool_fits(r: _Reader, bench: BenchmarkSpec, engine: EngineSpec) -> None:
    """benchmark.tool: a known tool, an api it speaks, the workload keys it carries, no
    per-request sources (a sweep's points are checked as they are read)."""
    if bench.tool is None:
        if bench.tool_args:
            raise r.doc.error("benchmark.tool_args", "options for benchmark.tool, and there is no benchmark.tool; "
                              "add it (vllm-bench-serve or sglang-bench-serving) or remove tool_args")
        return
    from bisect_harness.engines import benchtools

    if bench.tool not in benchtools.TOOLS:
        raise r.doc.error("benchmark.tool", f"unknown tool {bench.tool!r}; known: "
                          f"{', '.join(sorted(benchtools.TOOLS))} (or leave it out for the harness's own client)")
    why = benchtools.get_tool(bench.tool).check_spec(bench)
    if why:
        raise r.doc.error("benchmark.tool", why)
    cannot = workloads.tool_cannot(bench.tool, bench)
    if cannot:
        raise r.doc.error(f"benchmark.{cannot}", f"benchmark.tool ({bench.tool}) cannot carry {cannot}: it measures "
                          "closed loop, with its own random prompts of fixed lengths, and hands back no request's "
                          f"timings; remove {cannot}, or measure with the harness's client (remove benchmark.tool)")
    for i, m in enumerate(engine.metrics):
        if m.reads_responses:
            raise r.doc.error(f"engine.metrics[{i}]", f"a 'from: {m.kind_name}' source reads each response, which "
                              f"benchmark.tool ({bench.tool}) does not hand back; use the harness's client "
                              "(remove benchmark.tool) or another kind of source")


def _benchmark(r: _Reader, value, spec_dir: Path) -> BenchmarkSpec:
    """``benchmark:``: the plain keys here, the workload's by ``spec.workloads`` (and
    checked against each other there); ``sweep`` is read by :func:`_sweep`."""
    b = r.mapping(value, "benchmark", _BENCH)
    kwargs: dict[str, Any] = {}
    for name, f in BenchmarkSpec.__dataclass_fields__.items():
        if name not in b or name not in _BENCH_PLAIN:
            continue
        v, path = b[name], f"benchmark.{name}"
        if name == "tool_args":  # an argv list, never run by a shell
            kwargs[name] = r.argv(v, path)
            continue
        default = f.default
        if isinstance(default, bool):
            r.typed(v, path, (bool,), "true or false")
        elif isinstance(default, int):
            v = r.positive_int(v, path, minimum=0 if name in ("warmup_requests", "seed") else 1,
                               maximum=MAX_SEED if name == "seed" else MAX_COUNT)
        elif isinstance(default, float):
            # a timeout of 0 would fail every request: refused here, not found by every boot
            v = r.number(v, path, maximum=MAX_SECONDS if name.endswith("_s") else MAX_COUNT,
                         positive=name.endswith("timeout_s"))
        else:
            r.typed(v, path, (str,), "a string")
        kwargs[name] = v
    from bisect_harness.measure.apis import APIS

    if kwargs.get("api", BenchmarkSpec.api) not in APIS:
        raise r.doc.error("benchmark.api", f"must be one of {', '.join(APIS)} (the server's streaming API: see "
                          f"docs/hypotheses-format.md), got {kwargs['api']!r}")
    kwargs.update(workloads.read_workload(r, b, spec_dir))
    bench = BenchmarkSpec(**kwargs)
    workloads.check_benchmark(r, bench, b)
    return bench


def _sweep(r: _Reader, value, bench: BenchmarkSpec) -> tuple[LoadPoint, ...]:
    """``benchmark.sweep``: the points of every hypothesis without a sweep of its own."""
    if not isinstance(value, dict) or value.get("sweep") is None:
        return ()
    return workloads.read_sweep(r, value["sweep"], "benchmark.sweep", bench)


#: ``limits:`` sizes: a whole number of bytes, or a number with a binary unit ("64 MiB").
_SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
_LIMIT_MIN, _LIMIT_MAX = 64 << 10, 64 << 30


def _limits(r: _Reader, value) -> Limits:
    m = r.mapping(value, "limits", tuple(Limits.__dataclass_fields__))
    kwargs = {}
    for name, v in m.items():
        path = f"limits.{name}"
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise r.doc.error(path, f"must be a size: a number of bytes or a string like '64 MiB', got {v!r}")
        size = v
        if isinstance(v, str):
            got = _SIZE_RE.match(v)
            unit = got and _SIZE_UNITS.get(got.group(2).lower())
            if not got or unit is None:
                raise r.doc.error(path, f"must be a size like '64 MiB' (units: B, KiB, MiB, GiB), got {v!r}")
            size = int(float(got.group(1)) * unit)
        if not _LIMIT_MIN <= size <= _LIMIT_MAX:
            raise r.doc.error(path, f"must be between 64 KiB and 64 GiB, got {size:,} bytes")
        kwargs[name] = size
    return Limits(**kwargs)


def _defaults(r: _Reader, value) -> Defaults:
    d = r.mapping(value, "defaults", _DEFAULTS)
    kwargs: dict[str, Any] = {}
    for name in ("samples_per_boot", "max_samples_per_boot", "boots_per_arm", "max_boots_per_arm"):
        if name in d:
            samples = name.endswith("samples_per_boot")
            kwargs[name] = r.positive_int(d[name], f"defaults.{name}", minimum=1 if samples else 2,
                                          maximum=MAX_SAMPLES_PER_BOOT if samples else MAX_BOOTS)
    if "samples_per_boot" in kwargs and "max_samples_per_boot" not in kwargs:  # more first samples than the most
        kwargs["max_samples_per_boot"] = max(kwargs["samples_per_boot"], Defaults.max_samples_per_boot)
    costs = [name for name in ("boot_cost_s", "sample_cost_s") if name in d]
    if len(costs) == 1:
        other = "sample_cost_s" if costs[0] == "boot_cost_s" else "boot_cost_s"
        raise r.doc.error(f"defaults.{costs[0]}", f"a node's cost needs both boot_cost_s and sample_cost_s; add "
                          f"defaults.{other} (seconds), or remove this key to measure both from the run's boots")
    for name in costs:
        kwargs[name] = r.number(d[name], f"defaults.{name}", "a number of seconds", positive=True)
    if "boot_retries" in d:
        kwargs["boot_retries"] = r.positive_int(d["boot_retries"], "defaults.boot_retries", minimum=0,
                                                maximum=MAX_BOOTS)
    if "alpha" in d:
        a = r.typed(d["alpha"], "defaults.alpha", (int, float), "a number")
        if not 0 < a < 0.5:
            raise r.doc.error("defaults.alpha", f"must lie in (0, 0.5), got {a}")
        kwargs["alpha"] = float(a)
    for name in ("env_check", "flag_check"):
        if name in d:
            if d[name] not in ENV_CHECK_MODES:
                raise r.doc.error(f"defaults.{name}", f"must be one of {', '.join(ENV_CHECK_MODES)}, got {d[name]!r}")
            kwargs[name] = d[name]
    if "aa_check" in d:
        kwargs["aa_check"] = r.typed(d["aa_check"], "defaults.aa_check", (bool,), "true or false")
    if "noise_prior" in d:
        kwargs["noise_prior"] = r.typed(d["noise_prior"], "defaults.noise_prior", (bool,), "true or false")
    if "host_check" in d:
        if d["host_check"] not in HOST_CHECK_MODES:
            raise r.doc.error("defaults.host_check",
                              f"must be one of {', '.join(HOST_CHECK_MODES)}, got {d['host_check']!r}")
        kwargs["host_check"] = d["host_check"]
    if "search_samples" in d:
        if d["search_samples"] not in SEARCH_SAMPLES:
            raise r.doc.error("defaults.search_samples",
                              f"must be one of {', '.join(SEARCH_SAMPLES)}, got {d['search_samples']!r}")
        kwargs["search_samples"] = d["search_samples"]
    for name in ("host_preflight_s", "host_wait_s"):
        if name in d:
            kwargs[name] = r.number(d[name], f"defaults.{name}", "a number of seconds")
    if "host_thresholds" in d:
        t = r.mapping(d["host_thresholds"], "defaults.host_thresholds", Thresholds.names())
        limits = {}
        for name, v in t.items():
            limits[name] = r.number(v, f"defaults.host_thresholds.{name}", maximum=MAX_COUNT)
        kwargs["host_thresholds"] = Thresholds(**limits)
    if "analysis" in d:
        if d["analysis"] not in ANALYSES:
            raise r.doc.error("defaults.analysis", f"must be one of {', '.join(ANALYSES)}, got {d['analysis']!r}")
        kwargs["analysis"] = d["analysis"]
    if "secret_names" in d:
        names = r.typed(d["secret_names"], "defaults.secret_names", (list,), "a list of env or flag names")
        for i, n in enumerate(names):
            r.typed(n, f"defaults.secret_names[{i}]", (str,), "an env or flag name")
        kwargs["secret_names"] = tuple(names)
    out = Defaults(**kwargs)
    if out.max_samples_per_boot < out.samples_per_boot:
        raise r.doc.error("defaults.max_samples_per_boot", f"the most samples per boot ({out.max_samples_per_boot}) "
                          f"is below samples_per_boot ({out.samples_per_boot}); raise it, or set it equal for a "
                          "fixed count")
    if out.max_boots_per_arm < out.boots_per_arm:
        raise r.doc.error("defaults.max_boots_per_arm",
                          f"the budget ({out.max_boots_per_arm}) is below boots_per_arm ({out.boots_per_arm})")
    return out


def _arm(r: _Reader, value, path: str, has_repo: bool, attached: bool = False,
         has_releases: bool = False) -> ArmSpec:
    a = r.mapping(value, path, _ARM)
    base_url = None
    if "base_url" in a:
        if not attached:
            raise r.doc.error(f"{path}.base_url", "an arm names its own server only in attach mode: add "
                              "engine.base_url (the default server), or remove this key")
        base_url = _url(r, a["base_url"], f"{path}.base_url")
    if attached:
        for key, what in (("commit", "commits"), ("env", "environment variables"), ("flags", "launch flags")):
            if a.get(key) is not None:
                raise r.doc.error(f"{path}.{key}", f"an attached server (engine.base_url) was started by someone "
                                  f"else, so the harness cannot set its {what}; compare two running servers "
                                  f"with baseline.base_url and treatment.base_url instead")
    release = a.get("release")
    if release is not None:
        if isinstance(release, bool) or not isinstance(release, (str, int, float)):
            raise r.doc.error(f"{path}.release", f"expected a version of engine.releases, got {_typename(release)}")
        if not has_releases:
            raise r.doc.error(f"{path}.release", "this engine has no releases: add engine.releases (package and "
                              "index), or name a commit instead")
        if a.get("commit") is not None:
            raise r.doc.error(f"{path}.release", "an arm is a release or a commit, not both: drop one")
        return ArmSpec(commit=None, release=str(release), env=r.env(a.get("env"), f"{path}.env"),
                       flags=r.flags(a.get("flags"), f"{path}.flags"))
    commit = a.get("commit")
    if commit is not None:
        if isinstance(commit, bool) or not isinstance(commit, (str, int)):
            raise r.doc.error(f"{path}.commit", f"expected a revision (sha, branch, tag, HEAD~3), got {_typename(commit)}")
        commit = str(commit)
        if not has_repo:
            raise r.doc.error(f"{path}.commit", "this engine has no repository (engine.repo); "
                              "add engine.repo or drop the commit")
    elif has_repo:
        commit = "HEAD"
    return ArmSpec(commit=commit, env=r.env(a.get("env"), f"{path}.env"), flags=r.flags(a.get("flags"), f"{path}.flags"),
                   base_url=base_url)



@dataclass(frozen=True)
class FileBench:
    """The file's ``benchmark:`` as the hypotheses read it: its values (``spec``), its
    ``sweep`` (the points of every hypothesis without a sweep of its own) and the keys
    it wrote (``written``)."""

    spec: BenchmarkSpec = BenchmarkSpec()
    sweep: tuple[LoadPoint, ...] = ()
    written: tuple[str, ...] = ()


def _hypotheses(r: _Reader, value, metrics: Mapping[str, Metric], has_repo: bool,
                attached: bool = False, has_releases: bool = False,
                file_bench: FileBench = FileBench()) -> tuple[HypothesisSpec, ...]:
    """The hypotheses, each matrix expanded and then each sweep (its own, else the file's
    ``benchmark.sweep``): ``id[k=v]@concurrency=4``, one per point, in the sweep's order;
    then what they ask of the file's benchmark is checked (``spec.workloads``)."""
    bench, sweep, bench_written = file_bench.spec, file_bench.sweep, file_bench.written
    r.typed(value, "hypotheses", (list,), "a list of hypotheses")
    if not value:
        raise r.doc.error("hypotheses", "no hypotheses: write at least one")
    out: list[HypothesisSpec] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(value):
        path = f"hypotheses[{i}]"
        h = r.mapping(raw, path, _HYP, required=("id", "baseline", "treatment", "metric", "expect", "min_effect"))
        hid = h["id"]
        if not isinstance(hid, str) or not _ID_RE.match(hid):
            raise r.doc.error(f"{path}.id", "an id is letters, digits, '.', '_' or '-', starting with a letter or digit")
        statement = h.get("statement", "")
        r.typed(statement, f"{path}.statement", (str,), "a sentence")
        metric = h["metric"]
        workloads.slo_named(r, metric, f"{path}.metric", bench)
        if not isinstance(metric, str) or metric not in metrics:
            raise r.doc.error(f"{path}.metric", f"unknown metric {metric!r}; known: {', '.join(sorted(metrics))} "
                              "(declare more under engine.metrics)")
        try:
            expect = Expect(h["expect"])
        except ValueError:
            raise r.doc.error(f"{path}.expect", f"must be 'increase' or 'decrease', got {h['expect']!r}") from None
        min_effect = parse_effect(h["min_effect"], f"{path}.min_effect", r.doc)
        bisect = h.get("bisect", False)
        r.typed(bisect, f"{path}.bisect", (bool,), "true or false")
        if bisect and not has_repo:
            raise r.doc.error(f"{path}.bisect", "bisection needs commits: add engine.repo")
        explain_ = h.get("explain", False)
        r.typed(explain_, f"{path}.explain", (bool,), "true or false")
        profile = h.get("profile", False)
        r.typed(profile, f"{path}.profile", (bool,), "true or false")
        mechanism = _mechanism(r, h.get("mechanism"), f"{path}.mechanism", metrics, min_effect, bench)
        base = _arm(r, h["baseline"], f"{path}.baseline", has_repo, attached, has_releases)
        treat = _arm(r, h["treatment"], f"{path}.treatment", has_repo, attached, has_releases)
        if attached and h.get("matrix") is not None:
            raise r.doc.error(f"{path}.matrix", "a matrix varies flags or env, which an attached server "
                              "(engine.base_url) does not take from the harness; remove the matrix")
        line = r.doc.line(path)
        points = _matrix(r, h.get("matrix"), f"{path}.matrix")
        loads: tuple[LoadPoint | None, ...] = (
            workloads.read_sweep(r, h["sweep"], f"{path}.sweep", bench) if h.get("sweep") is not None
            else sweep) or (None,)
        if len(out) + len(points) * len(loads) > MAX_HYPOTHESES:
            raise r.doc.error(next((f"{path}.{k}" for k in ("matrix", "sweep") if h.get(k) is not None), path),
                              f"the file expands to more than {MAX_HYPOTHESES} hypotheses (matrices and sweeps "
                              "included); split it into several files (see docs/hypotheses-format.md, Limits)")
        for point in points:
            b, t = base, treat
            for (arm_name, kind, name), v in point:
                _no_nul_inside(r.doc, v, f"{path}.matrix.{kind}.{name}")
                for which in (("baseline", "treatment") if arm_name == "both" else (arm_name,)):
                    arm = b if which == "baseline" else t
                    if kind == "env":
                        if isinstance(v, (dict, list)) or v is None:
                            raise r.doc.error(f"{path}.matrix", f"env values must be scalars, got {_typename(v)}")
                        arm = replace(arm, env={**arm.env, name: _env_str(v)})
                    else:
                        arm = replace(arm, flags={**arm.flags, name: v})
                    if which == "baseline":
                        b = arm
                    else:
                        t = arm
            suffix = ",".join(f"{name}={v}" for (_, _, name), v in point)
            curve = f"{hid}[{suffix}]" if point else hid
            for load in loads:
                full_id = f"{curve}@{load.label}" if load is not None else curve
                if full_id in seen:
                    raise r.doc.error(f"{path}.id", f"id {full_id!r} is used twice (also at {seen[full_id]})")
                seen[full_id] = path
                out.append(HypothesisSpec(
                    id=full_id, statement=statement, baseline=b, treatment=t, metric=metric, expect=expect,
                    min_effect=min_effect, bisect=bisect, line=line, explain=explain_, mechanism=mechanism,
                    profile=profile,
                    matrix_point={f"{a}.{k}.{n}": v for (a, k, n), v in point},
                    point=load, curve=curve if load is not None else None))
    workloads.check_points_and_sizes(r, bench, out, seen, bench_written)
    return tuple(out)


def _mechanism(r: _Reader, value, path: str, metrics: Mapping[str, Metric], min_effect: float,
               bench: BenchmarkSpec = BenchmarkSpec()) -> tuple:
    """``mechanism: [{metric: verify_ms, expect: decrease, min_effect: 5%}]`` (min_effect
    defaults to the hypothesis')."""
    if value is None:
        return ()
    r.typed(value, path, (list,), "a list of {metric: NAME, expect: increase|decrease} (min_effect optional)")
    if not value:
        raise r.doc.error(path, "an empty mechanism: name at least one metric, or remove the key")
    out = []
    for i, raw in enumerate(value):
        where = f"{path}[{i}]"
        m = r.mapping(raw, where, _MECH, required=("metric", "expect"))
        name = m["metric"]
        workloads.slo_named(r, name, f"{where}.metric", bench)
        if not isinstance(name, str) or name not in metrics:
            raise r.doc.error(f"{where}.metric", f"unknown metric {name!r}; known: {', '.join(sorted(metrics))} "
                              "(declare more under engine.metrics)")
        try:
            expect = Expect(m["expect"])
        except ValueError:
            raise r.doc.error(f"{where}.expect", f"must be 'increase' or 'decrease', got {m['expect']!r}") from None
        eff = parse_effect(m["min_effect"], f"{where}.min_effect", r.doc) if "min_effect" in m else min_effect
        out.append(MechanismSpec(metric=name, expect=expect, min_effect=eff))
    return tuple(out)


def _matrix(r: _Reader, value, path: str) -> list[list]:
    if value is None:
        return [[]]
    r.typed(value, path, (dict,), "a mapping of 'flags.NAME' or 'env.NAME' to a list of values")
    axes = []
    for key, values in value.items():
        parts = key.split(".", 2) if key.split(".", 1)[0] in ("baseline", "treatment", "both") else ["treatment"] + key.split(".", 1)
        if len(parts) != 3 or parts[1] not in ("flags", "env") or not parts[2]:
            raise r.doc.error(f"{path}.{key}", "matrix keys look like 'flags.NAME', 'env.NAME', "
                              "'baseline.flags.NAME' or 'both.env.NAME'")
        if parts[1] == "env" and not _ENV_NAME_RE.match(parts[2]):
            raise r.doc.error(f"{path}.{key}", f"{parts[2]!r} is not a valid environment variable name "
                              "(letters, digits and '_', not starting with a digit)")
        if parts[1] == "flags":
            _check_flag_name(r.doc, parts[2], f"{path}.{key}")
        if not isinstance(values, list) or not values:
            raise r.doc.error(f"{path}.{key}", "expected a non-empty list of values")
        for i, v in enumerate(values):
            if isinstance(v, (dict, list)) or v is None:
                raise r.doc.error(f"{path}.{key}[{i}]", f"a matrix value must be a string, number or "
                                  f"boolean, got {_typename(v)}")
        axes.append([((parts[0], parts[1], parts[2]), v) for v in values])
    # The size is computed before anything expands: a 4-axis matrix of 40 values is 2.56 million points.
    points = math.prod(len(axis) for axis in axes)
    if points > MAX_MATRIX_POINTS:
        raise r.doc.error(path, f"this matrix has {points} points ("
                          + " x ".join(str(len(a)) for a in axes)
                          + f"), above the cap of {MAX_MATRIX_POINTS} per hypothesis; split it into "
                          "several hypotheses or fewer values (see docs/hypotheses-format.md, Limits)")
    return [list(p) for p in itertools.product(*axes)]
