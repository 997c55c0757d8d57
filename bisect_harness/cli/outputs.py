"""What each command's ``--json`` prints: one JSON object, its JSON Schema and its
version, all here.

Every ``--json`` output is one object on the last line of stdout whose first key is
``schema_version``: the version of that output's shape (one per output kind, in
:data:`VERSIONS`). A version goes up by one when a key is removed or changes
meaning; a key added leaves it as it is (the schemas allow keys they do not
name). An output without ``schema_version`` is from a harness before versions.

``harness schema --output KIND`` prints the JSON Schema of one output
(:func:`output_schema`); the kinds (:data:`KINDS`):

- ``run``: ``harness run --json`` and ``harness ledger show --json`` (the same object);
- ``plan``: ``harness run --dry-run --json``;
- ``explain``, ``bisect``, ``nightly``, ``compare``, ``doctor``;
- ``ledger-list``, ``cache-list``, ``cache-prune``.

``run`` 3 (from 2): a hypothesis swept over load points is one entry of
``hypotheses`` per point (``<id>@<label>``, with ``curve`` and ``point``), and
``curves`` (always there, ``[]`` without a sweep) groups them: per curve its
points' verdicts and its answer as the run stored it (``words``, ``shape``,
``crossing``, ``largest``; ``answer`` null and ``answer_note`` "curve answer not
recorded" where the run stored none). A reader that counted ``hypotheses`` as the
file's claims counts a curve's points since.

In a bisection's answer (``bisect``; ``nightly``'s ``bisection``), ``culprit`` is the
commit the search named, or null where it named none (its ``stopped`` says why);
``leader`` and ``leader_probability`` are the search's most probable commit (the
first of its most probable block, ``candidate_set``) and that block's posterior mass,
there whether or not it was named. A leader is no culprit until named: read
``culprit``, never ``leader_probability`` alone.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from bisect_harness.errors import UserError

__all__ = ["FORMAT_OPT", "FORMATS", "JUNIT_OPT", "KINDS", "REPORT_URL_OPT", "VERSIONS", "emit", "output_schema",
           "publish_markdown", "shown_format", "write_junit"]

#: The version of each output's shape. ``doctor``'s is its stored record's
#: (``observe.provenance``' ``SCHEMA_VERSION``), which the report already carries.
VERSIONS: dict[str, int] = {"run": 3, "plan": 1, "explain": 1, "bisect": 1, "nightly": 1, "compare": 1,
                            "doctor": 1, "ledger-list": 1, "cache-list": 1, "cache-prune": 1}
KINDS = tuple(VERSIONS)


def emit(kind: str, obj: dict, **dumps) -> None:
    """Print ``obj`` as the ``--json`` output of ``kind``: one line, ``schema_version`` first.
    ``dumps``: keywords for :func:`json.dumps` (``default=str``)."""
    version = VERSIONS[kind]
    if obj.get("schema_version", version) != version:  # a record that carries its own version: the same one
        raise AssertionError(f"the {kind} output carries schema_version {obj['schema_version']}, "
                             f"its schema says {version}")
    print(json.dumps({"schema_version": version, **obj}, **dumps))


def output_schema(kind: str) -> dict:
    """The JSON Schema (draft 2020-12) of the ``--json`` output ``kind``, or a UserError
    naming the kinds."""
    if kind not in _SCHEMAS:
        raise UserError(f"--output {kind!r}: no such output; known: {', '.join(KINDS)}")
    body = _SCHEMAS[kind]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": f"harness {kind} --json",
            **body, "required": ["schema_version", *body.get("required", [])],
            "properties": {"schema_version": {"const": VERSIONS[kind]}, **body.get("properties", {})},
            "$defs": _DEFS}


# -- the forms CI reads: --format github, --report-url, --junit ---------------------------

#: What ``--format`` takes: ``text`` (the terminal's tables and lines) or ``github``
#: (markdown for ``$GITHUB_STEP_SUMMARY`` and a pull-request comment, ``report.github``).
FORMATS = ("text", "github")
FORMAT_OPT = typer.Option("text", "--format", help="text (tables and lines) or github: markdown for a job's step "
                          "summary and a pull-request comment (answers first, a folded table of evidence, links "
                          "with --report-url); appended to $GITHUB_STEP_SUMMARY where it is set.")
REPORT_URL_OPT = typer.Option(None, "--report-url", metavar="URL", help="Where `harness report --out DIR` is "
                              "published: --format github and --junit link to its pages (none without it).")
JUNIT_OPT = typer.Option(None, "--junit", metavar="FILE", help="Also write the answers as JUnit XML: a test case "
                         "per hypothesis (per load point), a confirmed regression a failure, an undetermined one "
                         "skipped with its reason.")


def shown_format(value: str) -> str:
    """``--format``'s value, or a UserError naming the formats."""
    if value not in FORMATS:
        raise UserError(f"--format {value!r}: no such format; known: {', '.join(FORMATS)}")
    return value


def publish_markdown(text: str, *, json_mode: bool) -> None:
    """Print ``--format github``'s markdown (on stderr under ``--json``, whose object stays
    the last line of stdout) and append it to ``$GITHUB_STEP_SUMMARY`` where the job
    sets it, so the job's summary page shows it."""
    print(text, file=sys.stderr if json_mode else sys.stdout, flush=True)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")


def write_junit(path: Path, suites) -> Path:
    """Write ``--junit``'s file (``report.junit``), whole or not at all."""
    from bisect_harness.report import junit

    return junit.write(path, junit.to_xml(suites))


# -- the schemas, as data ------------------------------------------------------------------

def _obj(required: dict, optional: dict | None = None) -> dict:
    """An object with ``required`` keys and ``optional`` ones (other keys allowed)."""
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}


def _list(items: dict) -> dict:
    return {"type": "array", "items": items}


def _ref(name: str) -> dict:
    return {"$ref": f"#/$defs/{name}"}


STR, INT, NUM, BOOL, OBJ = ({"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
                            {"type": "object"})
STR_N, INT_N, NUM_N, OBJ_N = ({"type": ["string", "null"]}, {"type": ["integer", "null"]},
                              {"type": ["number", "null"]}, {"type": ["object", "null"]})
CI_N = {"type": ["array", "null"], "items": NUM_N, "minItems": 2, "maxItems": 2}
PROB = {"type": "number", "minimum": 0, "maximum": 1}

#: a paired test of a search (``bisect_runner._test_json``)
_PAIRED = _obj({"pairs": INT, "mean": NUM_N, "p_value": NUM_N, "alpha_per_look": NUM_N, "decision": STR,
                "upper": NUM_N, "below": NUM_N})

_DEFS = {
    "paired_test": _PAIRED,
    "bisection": {
        **_obj({"culprit": STR_N, "leader": STR_N, "leader_probability": PROB,
                "candidates": _list(_obj({"commit": STR, "probability": PROB})),
                "candidate_set": _list(STR), "boots": INT, "new_boots": INT, "skipped": _list(STR),
                "stopped": {"enum": ["running", "confident", "ambiguous-skips", "budget", "not-reproduced",
                                     "endpoint-unmeasurable", "unverified", "stalled", "undetermined"]},
                "bisection_id": INT, "no_step_probability": PROB,
                "endpoint_test": {"anyOf": [_ref("paired_test"), {"type": "null"}]},
                "verify_test": {"anyOf": [_ref("paired_test"), {"type": "null"}]},
                "tests": _list(_obj({"test": INT, "kind": {"enum": ["endpoints", "verify"]}, "good": STR, "bad": STR,
                                     "boot_ids": _list(INT)})),
                "reused_runs": _list(INT), "undetermined": OBJ_N, "warnings": _list(STR), "plan": OBJ_N,
                "verdict_rounds": _list(_list(INT))},
               {"revisions": {"const": "releases"}, "point": STR_N,
                "descent": {"anyOf": [_ref("bisection"), {"type": "null"}]}, "descent_note": STR_N}),
        # the leader's posterior has its own name: "probability" beside a null culprit read as an answer
        "not": {"required": ["probability"]},
    },
    "hypothesis": _obj({"id": STR, "verdict": STR, "metric": STR, "measured": BOOL, "effect": NUM_N, "ci": CI_N,
                        "p_value": NUM_N, "boots": _obj({"baseline": INT, "treatment": INT}), "reason": STR,
                        "checks": _obj({"word": STR, "counts": OBJ_N}), "warnings": _list(STR)},
                       {"bisection": {**_obj({"id": INT, "status": STR, "culprit": STR_N, "leader": STR_N,
                                              "leader_probability": {"anyOf": [PROB, {"type": "null"}]},
                                              "stopped": STR_N}),
                                      "not": {"required": ["probability"]}},
                        "explanation": OBJ, "profile": OBJ, "mechanisms": OBJ, "failed_requests": OBJ,
                        "cost": OBJ_N, "noise_prior": OBJ_N, "window_metrics": {"type": "array"},
                        "curve": STR_N, "point": STR_N}),
    # a load curve (``report.curve_view.curve_json``): its points' verdicts and its answer as stored
    "curve": _obj({"curve": STR, "metric": STR, "expect": {"enum": ["increase", "decrease"]}, "min_effect": NUM,
                   "points": _list(_obj({"label": STR, "hypothesis": STR, "verdict": STR, "effect": NUM_N,
                                         "ci": CI_N, "baseline_mean": NUM_N, "treatment_mean": NUM_N})),
                   "answer": {"anyOf": [_obj({"words": STR, "shape": STR,
                                              "crossing": {"type": ["array", "null"], "items": STR,
                                                           "minItems": 2, "maxItems": 2},
                                              "largest": STR_N}), {"type": "null"}]},
                   "answer_note": STR_N}),
    "cache_entry": _obj({"kind": STR, "repo": STR, "commit": STR, "path": STR, "size_bytes": INT,
                         "last_used": NUM, "age_s": NUM}),
}

_SCHEMAS: dict[str, dict] = {
    "run": _obj({"run_id": INT, "status": STR, "hypotheses": _list(_ref("hypothesis")),
                 "curves": _list(_ref("curve"))}),
    "plan": _obj({"spec": STR, "configs": _list(_obj({"key": STR, "commit": STR_N, "env": OBJ, "flags": OBJ,
                                                      "argv": _list(STR), "hypotheses": _list(STR)})),
                  "hypotheses": _list(_obj({"id": STR, "metric": STR, "expect": {"enum": ["increase", "decrease"]},
                                            "baseline": STR, "treatment": STR})),
                  "environment": OBJ, "preset": STR, "metric_sources": {"type": "array"}, "defaults": OBJ},
                 {"flag_check": {"type": "array"}, "flags_refused": BOOL}),
    "explain": _obj({"run_id": INT, "fast": STR, "slow": STR, "metric": STR, "min_effect": NUM_N,
                     "alpha_per_test": NUM, "differences": _list(_obj({"name": STR, "kind": STR})),
                     "slowdown": OBJ, "members": _list(STR), "interactions": _list(_list(STR)),
                     "undecided": _list(STR), "tests": {"type": "array"}, "boots": INT, "confident": BOOL,
                     "stopped": STR},
                    {"bisection": {**_obj({"id": INT, "culprit": STR_N, "leader": STR_N, "leader_probability": PROB}),
                                   "not": {"required": ["probability"]}}, "point": STR_N}),
    "bisect": _ref("bisection"),
    "nightly": _obj({"run_id": INT, "commit": STR, "metric": STR,
                     "status": {"enum": ["first-night", "ok", "regression", "broken"]}, "alert": BOOL,
                     "nights_compared": INT, "reference_commit": STR_N, "ratio": NUM_N, "ci": CI_N, "p_value": NUM_N,
                     "drift": _list(STR), "reason": STR,
                     "bisection": {"anyOf": [_ref("bisection"), {"type": "null"}]}, "warnings": _list(STR)},
                    {"changepoints": OBJ, "point": STR_N,
                     "points": _list(_obj({"point": STR_N, "series": STR, "status": {"enum": ["first-night", "ok",
                                                                                           "regression"]},
                                           "nights_compared": INT, "reference_commit": STR_N, "ratio": NUM_N,
                                           "ci": CI_N, "p_value": NUM_N, "reason": STR}))}),
    "compare": _obj({"run_a": INT, "run_b": INT,
                     "configs": _list(_obj({"label": STR, "key": STR, "metric": STR, "verdict": STR,
                                            "ratio": NUM_N, "ci": CI_N, "p_value": NUM_N, "warnings": _list(STR),
                                            "host_drift": _list(STR)}))}),
    "doctor": _obj({"ok": BOOL, "host": OBJ, "calibration": OBJ_N, "warnings": {"type": "array"}, "note": STR_N}),
    "ledger-list": _obj({"runs": _list(_obj({"run_id": INT, "kind": STR, "status": STR, "created_at": STR,
                                             "spec": STR, "hypotheses": INT}))}),
    "cache-list": _obj({"cache_dir": STR, "total_bytes": INT, "entries": _list(_ref("cache_entry"))}),
    "cache-prune": _obj({"cache_dir": STR, "dry_run": BOOL, "removed": _list(_ref("cache_entry")),
                         "freed_bytes": INT, "kept_bytes": INT, "kept_entries": INT}),
}
