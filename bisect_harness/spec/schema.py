"""The JSON Schema of hypotheses.yaml, derived from the loader's own definition.

Nothing here lists a key by hand: the allowed keys are the loader's tables
(``spec.sections._TOP``, ``_ENGINE``, ``_BENCH``, ``_DEFAULTS``, ``_HYP``, ``_ARM``),
the types and defaults come from the frozen dataclasses the loader fills
(``EngineSpec``, ``BenchmarkSpec``, ``Defaults``, ``ArmSpec``, in ``spec.types``; the
workload's ``Dataset``, ``SharedPrefix``, ``MultiTurn``, ``Capacity``) and the choices
from the loader's constants and the registries it reads (``workload.SWEEP_AXES``,
``POINT_KEYS``, ``ARRIVALS``, the SLO's percentile metrics)
(``ENV_CHECK_MODES``, ``HOST_CHECK_MODES``, ``ANALYSES``, ``BACKENDS``, ``Expect``,
the preset, API and metric source registries, the checkout modes,
``Thresholds``). A key added to the loader shows
up here; a key the loader does not read cannot. Editors (the YAML language
server) use it for completion and as-you-type checks; the loader remains the
judge (ranges, commits, flags against the engine are checked there).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from bisect_harness.observe.contention import Thresholds
from bisect_harness.model import BenchmarkSpec, Expect, Limits
from bisect_harness import workload as _workload
from bisect_harness.spec import reader as _reader, sections as _sections, types as _types, workloads as _workloads
from bisect_harness.spec.load import SPEC_VERSION
from bisect_harness.engines.envs import ENV_MODES

__all__ = ["hypotheses_schema", "SCHEMA_ID"]

SCHEMA_ID = "https://bisect-harness.invalid/schema/hypotheses-v1.json"

_ARGV = {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1,
                                         "items": {"type": ["string", "number"]}}],
         "description": "an argv list, or one string split like a command line (never run by a shell)"}
_STEPS = {"anyOf": [_ARGV, {"type": "array", "minItems": 1, "items": _ARGV}],
          "description": "one argv, or a list of argvs run in order in the checkout (each step's exit checked; "
                         "never run by a shell)"}
_ENV = {"type": "object", "propertyNames": {"pattern": _reader._ENV_NAME_RE.pattern},
        "additionalProperties": {"type": ["string", "number", "boolean"]}}
_FLAGS = {"type": "object", "propertyNames": {"pattern": _reader._FLAG_NAME_RE.pattern}}
_EFFECT = {"oneOf": [{"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                     {"type": "string", "pattern": r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$"}],
           "description": "a fraction like 0.1 or a percentage like '10%'"}


def _from_annotation(annotation: str) -> dict:
    """A JSON type for a dataclass field's annotation (they are strings under
    ``from __future__ import annotations``)."""
    a = str(annotation).replace("typing.", "")
    optional = "None" in a
    base = re.sub(r"\s*\|\s*None|None\s*\|\s*", "", a).strip()
    table = {"int": {"type": "integer"}, "float": {"type": "number"}, "bool": {"type": "boolean"},
             "str": {"type": "string"}, "Path": {"type": "string"},
             "tuple[str, ...]": {"type": "array", "items": {"type": "string"}}}
    out = dict(table.get(base, {}))
    if optional and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _section(keys, cls, special: dict[str, dict]) -> dict:
    fields = _fields(cls) if cls is not None else {}
    props = {}
    for key in keys:
        if key in special:
            props[key] = special[key]
            continue
        f = fields.get(key)
        prop = _from_annotation(f.type) if f is not None else {}
        if f is not None and f.default is not dataclasses.MISSING and isinstance(f.default, (int, float, str, bool)):
            prop["default"] = f.default
        props[key] = prop
    return {"type": "object", "properties": props, "additionalProperties": False}


def _point_value(key: str) -> dict:
    """The JSON type of a sweep point's value for benchmark key ``key``."""
    if key == "arrival":
        return {"type": "string", "enum": list(_workload.ARRIVALS)}
    if key in ("request_rate", "burstiness"):
        return {"type": "number", "exclusiveMinimum": 0}
    return {"type": "integer", "minimum": 1}


def _sweep() -> dict:
    """``sweep:``: axes and their values (a product of several), or a list of points."""
    axes = {"type": "object", "minProperties": 1, "additionalProperties": False,
            "properties": {a: {"type": "array", "minItems": 1, "items": _point_value(a)}
                           for a in _workload.SWEEP_AXES},
            "description": "an axis and its values, ascending: {concurrency: [1, 4, 16]}; several axes: "
                           "their product"}
    listed = {"type": "array", "minItems": 1, "maxItems": _reader.MAX_SWEEP_POINTS,
              "items": {"type": "object", "minProperties": 1, "additionalProperties": False,
                        "properties": {k: _point_value(k) for k in _workload.POINT_KEYS}},
              "description": "points, in order: [{concurrency: 1}, {request_rate: 8, prompt_tokens: 512}]"}
    return {"oneOf": [axes, listed], "description": "load points: the hypothesis is asked at each (id@point)"}


def _workload_source() -> dict:
    sources = {}
    for name, cls in _workloads.WORKLOAD_SOURCES.items():
        section = _section(tuple(f.name for f in dataclasses.fields(cls)), cls, {
            "mode": {"type": "string", "enum": list(_workloads.DATASET_MODES), "default": "first_turn"},
            "path": {"type": "string", "description": "a ShareGPT-style JSON or JSONL file (relative to this file)"}})
        section["required"] = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        sources[name] = section
    return {"type": "object", "minProperties": 1, "maxProperties": 1, "additionalProperties": False,
            "properties": sources, "description": "the source of the prompts: one of "
                                                  + ", ".join(_workloads.WORKLOAD_SOURCES)}


def _slo() -> dict:
    from bisect_harness.model import CLIENT_METRICS

    terms = [name for name in CLIENT_METRICS if _workloads.is_slo_metric(name)]
    return {"type": "object", "minProperties": 1, "propertyNames": {"enum": terms},
            "additionalProperties": {"type": "number", "exclusiveMinimum": 0},
            "description": "limits on latency percentiles, in ms: {ttft_p99_ms: 500, tpot_p99_ms: 50}"}


def _capacity() -> dict:
    keys = tuple(f.name for f in dataclasses.fields(_workload.Capacity))
    return {"oneOf": [{"type": "boolean"}, _section(keys, _workload.Capacity, {})],
            "description": "the search for the highest rate whose SLO holds: true (defaults) or its keys"}


def _presets() -> list[str]:
    from bisect_harness.engines import presets

    return sorted(presets.PRESETS)


def hypotheses_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a hypotheses file."""
    from bisect_harness.measure.apis import APIS
    from bisect_harness.measure.sources import source_kinds
    from bisect_harness.engines.checkout import CHECKOUT_MODES

    engine = _section(_sections._ENGINE, _types.EngineSpec, {
        "preset": {"type": "string", "enum": _presets(), "default": _types.EngineSpec.preset},
        "repo": {"type": "string", "description": "the engine's git repository (relative to the file)"},
        "build": _STEPS, "launch": _ARGV,
        "server_info": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "env": _ENV, "flags": _FLAGS,
        "metrics": {"type": "array", "items": {"type": "object"},
                    "description": f"metric sources (from: {' | '.join(source_kinds())})"},
        "environment": {"type": "string", "enum": list(ENV_MODES)},
        "checkout": {"type": "string", "enum": list(CHECKOUT_MODES), "default": CHECKOUT_MODES.names()[0],
                     "description": "how each commit is checked out: a git worktree, its files alone (tree), "
                                    "or a full clone"},
        "build_env": {"type": "array", "items": {"type": "string"},
                      "description": "variables whose values key a commit's build (beyond the compiler's)"},
        "releases": {"type": "object", "additionalProperties": False, "required": ["package", "index"],
                     "description": "the engine as released builds: each version a revision (release: V)",
                     "properties": {
                         "package": {"type": "string", "description": "the distribution name"},
                         "index": {"type": "string",
                                   "description": "a folder of wheels and sdists (pip --find-links), or an index URL"},
                         "versions": {"type": "array", "items": {"type": ["string", "number"]},
                                      "description": "oldest first; omit for every version in the folder"},
                         "tag": {"type": "string", "pattern": "\\{version\\}",
                                 "description": "each release's source tag, e.g. v{version}"},
                         "launch": _ARGV}},
    })
    bench = _section(_sections._BENCH, BenchmarkSpec, {
        "api": {"type": "string", "enum": list(APIS), "default": BenchmarkSpec.api},
        "tool_args": _ARGV,
        "prompt_reuse": {"type": "boolean", "default": False,
                         "description": "true: every sample and boot sends the same prompts, so a prefix cache "
                                        "serves them (to measure the cache); false: each request's prompt is "
                                        "its own (a seeded tag first)"},
        "request_rate": {"type": "number", "exclusiveMinimum": 0,
                         "description": "requests a second, open loop (left out: closed loop at concurrency)"},
        "arrival": {"type": "string", "enum": list(_workload.ARRIVALS), "default": BenchmarkSpec.arrival},
        "burstiness": {"type": "number", "exclusiveMinimum": 0, "default": BenchmarkSpec.burstiness,
                       "description": "the gamma law's shape (arrival: gamma only); 1 is Poisson"},
        "prompt_tokens_max": {"type": "integer", "minimum": 1,
                              "description": "each request's prompt length drawn from [prompt_tokens, this]"},
        "output_tokens_max": {"type": "integer", "minimum": 1,
                              "description": "each request's output length drawn from [output_tokens, this]"},
        "sample_seconds": {"type": "number", "exclusiveMinimum": 0,
                           "description": "a sample lasts this long (instead of requests_per_sample)"},
        "workload": _workload_source(), "slo": _slo(), "capacity": _capacity(), "sweep": _sweep(),
    })
    defaults = _section(_sections._DEFAULTS, _types.Defaults, {
        "env_check": {"type": "string", "enum": list(_types.ENV_CHECK_MODES), "default": _types.Defaults.env_check},
        "flag_check": {"type": "string", "enum": list(_types.ENV_CHECK_MODES), "default": _types.Defaults.flag_check},
        "host_check": {"type": "string", "enum": list(_types.HOST_CHECK_MODES), "default": _types.Defaults.host_check},
        "search_samples": {"type": "string", "enum": list(_types.SEARCH_SAMPLES),
                           "default": _types.Defaults.search_samples},
        "analysis": {"type": "string", "enum": list(_sections.ANALYSES), "default": _types.Defaults.analysis},
        "alpha": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.5, "default": 0.05},
        "host_thresholds": {"type": "object", "additionalProperties": False,
                            "properties": {n: {"type": "number"} for n in Thresholds.names()}},
        "secret_names": {"type": "array", "items": {"type": "string"}},
    })
    arm = _section(_sections._ARM, _types.ArmSpec, {
        "commit": {"type": ["string", "integer"], "description": "a sha, branch, tag or HEAD~N"},
        "release": {"type": ["string", "number"], "description": "a version of engine.releases, instead of a commit"},
        "env": _ENV, "flags": _FLAGS})
    hyp = _section(_sections._HYP, _types.HypothesisSpec, {
        "id": {"type": "string", "pattern": _sections._ID_RE.pattern},
        "baseline": {"$ref": "#/$defs/arm"}, "treatment": {"$ref": "#/$defs/arm"},
        "expect": {"type": "string", "enum": [e.value for e in Expect]},
        "min_effect": _EFFECT,
        "matrix": {"type": "object", "additionalProperties": {"type": "array", "minItems": 1,
                                                             "items": {"type": ["string", "number", "boolean"]}}},
        "sweep": _sweep(),
        "profile": {"type": "boolean", "default": False,
                    "description": "one extra sample per arm under the engine's profiler, after the measured ones "
                                   "(never a sample of the verdict)"},
    })
    hyp["required"] = ["id", "baseline", "treatment", "metric", "expect", "min_effect"]
    backend = {"type": "object", "properties": {
        "kind": {"type": "string", "enum": list(_sections.BACKENDS), "default": _types.BackendSpec.kind},
        "slots": {"type": "integer", "minimum": 1, "maximum": 1024, "default": 1}},
        "additionalProperties": True,
        "description": "the backend's own keys (partition, time limit, ... for Slurm) are checked by that backend"}
    size = {"type": ["integer", "string"], "pattern": _sections._SIZE_RE.pattern,
            "description": "bytes, or a size with a unit: '64 MiB' (B, KiB, MiB, GiB); 64 KiB to 64 GiB"}
    limits = {"type": "object", "additionalProperties": False,
              "description": "how much is read from a server and kept of its output",
              "properties": {name: {**size, "default": f.default}
                             for name, f in Limits.__dataclass_fields__.items()}}
    top = {
        "version": {"const": SPEC_VERSION},
        "engine": engine, "benchmark": bench, "defaults": defaults, "backend": backend, "limits": limits,
        "hypotheses": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/hypothesis"}},
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "bisect-harness hypotheses file",
        "type": "object",
        "properties": {k: top[k] for k in _sections._TOP},
        "required": ["engine", "hypotheses"],
        "additionalProperties": False,
        "$defs": {"arm": arm, "hypothesis": hyp},
    }
