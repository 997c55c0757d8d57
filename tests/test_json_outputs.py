"""Every command's ``--json`` output, made for real, against its JSON Schema (``cli.outputs``).

The commands that boot (``run``, ``bisect``, ``explain``, ``nightly``) run in this
process with their boots answered by the mock backend (``mock_boots.Planted``: the
demo history's 1.9x regression, 3% noise); those that read (``ledger``, ``compare``,
``cache``) read what they left; ``doctor`` probes this host. Each output is checked
with ``jsonschema`` against the schema ``harness schema --output KIND`` prints, and
every kind of output has at least one real output here.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator, ValidationError

from bisect_harness.cli.outputs import KINDS, VERSIONS, output_schema
from bisect_harness.demo import create_demo_repo
from helpers import last_json, query, write_spec
from mock_boots import Planted, harness_here

DECODE_MS = {"name": "decode_ms", "from": "log", "pattern": r"decode cycle: (?P<value>[0-9.]+) ms/cyc",
             "reduce": "median", "unit": "ms", "better": "lower"}


def here(*args) -> subprocess.CompletedProcess:
    """The real ``harness ARGS`` in this process (a command that boots nothing)."""
    from bisect_harness import cli

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit) as stop:
        mp.setenv("COLUMNS", "1000")
        mp.setattr("bisect_harness.engines.server.install_signal_handlers", lambda: None)
        mp.setattr("sys.stdout", out)
        mp.setattr("sys.stderr", err)
        cli.main([*map(str, args)])
    return subprocess.CompletedProcess(["harness", *map(str, args)], stop.value.code or 0, out.getvalue(),
                                       err.getvalue())


def _json(proc: subprocess.CompletedProcess, *codes: int) -> dict:
    assert proc.returncode in (codes or (0,)), proc.stderr[-4000:]
    return last_json(proc.stdout)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """kind -> the outputs of that kind the commands printed; and where they left their ledgers."""
    root = tmp_path_factory.mktemp("json-outputs")
    hist = create_demo_repo(root / "engine")
    i_reg = hist.index(hist.events["regression"])
    fast, slow = hist.shas[i_reg - 1], hist.shas[i_reg + 1]
    spec = write_spec(
        root / "hypotheses.yaml", engine={"preset": "demo", "repo": str(hist.path), "metrics": [DECODE_MS]},
        benchmark={"prompt_tokens": 16, "output_tokens": 32, "requests_per_sample": 1, "warmup_requests": 1},
        defaults={"samples_per_boot": 1, "boots_per_arm": 3, "max_boots_per_arm": 12},
        hypotheses=[{"id": "tuned", "baseline": {"commit": fast}, "treatment": {"commit": slow},
                     "metric": "decode_ms", "expect": "increase", "min_effect": "10%", "bisect": True}])
    planted = Planted(slow_from=hist.shas[i_reg:])
    db, cache = root / "r.db", root / "cache"
    ledger = ["--ledger", f"sqlite:///{db}", "--journal-dir", root / "exp"]
    out: dict[str, list[dict]] = {kind: [] for kind in KINDS}

    def booted(kind: str, *args, codes=(0,), ledger_args=ledger):
        out[kind].append(_json(harness_here(*args, *ledger_args, "--json", handler=planted, cwd=root), *codes))
        return out[kind][-1]

    first = booted("run", "run", spec, "--no-calibration", "--cache-dir", cache)
    second = booted("run", "run", spec, "--no-calibration", "--cache-dir", cache)
    booted("plan", "run", spec, "--dry-run")
    booted("bisect", "bisect", spec, "--good", hist.shas[i_reg - 3], "--bad", hist.shas[i_reg + 3], "--metric",
           "decode_ms", "--max-boots", "100", "--cache-dir", cache)
    booted("bisect", "bisect", spec, "--good", hist.shas[i_reg - 3], "--bad", hist.shas[i_reg + 3], "--metric",
           "decode_ms", "--max-boots", "4", "--fresh", "--cache-dir", cache, codes=(6,))  # no culprit named
    booted("explain", "explain", spec, "--fast", "tuned.baseline", "--slow", "tuned.treatment", "--cache-dir", cache)
    nights = ["--ledger", f"sqlite:///{root / 'nights.db'}", "--journal-dir", root / "nights", "--no-calibration",
              "--metric", "decode_ms", "--min-effect", "0.25", "--cache-dir", cache]
    for rev, codes in ((hist.shas[i_reg - 3], (0,)), (hist.shas[i_reg - 2], (0,)), (hist.shas[i_reg - 1], (0,)),
                       (hist.shas[i_reg + 2], (4,))):
        booted("nightly", "nightly", spec, "--rev", rev, codes=codes, ledger_args=nights)
    url = f"sqlite:///{db}"
    out["ledger-list"].append(_json(here("ledger", "list", "--ledger", url, "--json")))
    out["run"].append(_json(here("ledger", "show", first["run_id"], "--ledger", url, "--json")))
    out["compare"].append(_json(here("compare", first["run_id"], second["run_id"], "--metric", "decode_ms",
                                     "--ledger", url, "--json")))
    out["cache-list"].append(_json(here("cache", "list", "--cache-dir", cache, "--json")))
    out["cache-prune"].append(_json(here("cache", "prune", "--older-than", "7d", "--dry-run", "--cache-dir", cache,
                                         "--json")))
    out["doctor"].append(_json(here("doctor", "--json", "--seconds", "0.5")))
    return {"outputs": out, "db": db, "nights_db": root / "nights.db", "hist": hist}


def test_every_kind_of_output_was_made_for_real(made):
    assert {kind for kind, got in made["outputs"].items() if got} == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_each_output_matches_its_schema_and_says_its_version(made, kind):
    validator = Draft202012Validator(output_schema(kind))
    for obj in made["outputs"][kind]:
        validator.validate(obj)
        assert next(iter(obj)) == "schema_version" and obj["schema_version"] == VERSIONS[kind]


def test_the_bisection_answer_names_its_leader_apart_from_its_culprit(made):
    named, spent = made["outputs"]["bisect"]
    regression = made["hist"].events["regression"]
    assert named["culprit"] == named["leader"] == regression and named["leader_probability"] >= 0.95
    # out of budget: no culprit, yet a leader with its posterior; no bare "probability" to misread
    assert spent["stopped"] == "budget" and spent["culprit"] is None
    assert spent["leader"] is not None and 0.0 < spent["leader_probability"] < 1.0
    assert "probability" not in named and "probability" not in spent
    tonight = made["outputs"]["nightly"][-1]
    assert tonight["status"] == "regression" and tonight["bisection"]["culprit"] == regression
    explained = made["outputs"]["explain"][0]["bisection"]
    assert explained["culprit"] == explained["leader"] == regression


def test_a_stored_result_keeps_the_key_older_rows_have(made):
    """The journal reads a stored bisection's ``probability`` (every row ever written has it):
    a new row has it beside ``leader_probability``, the same number."""
    rows = [json.loads(r) for (r,) in query(made["db"], "SELECT result FROM bisections")]
    assert rows and all(r["probability"] == r["leader_probability"] for r in rows)


def test_a_bare_probability_beside_the_answer_fails_the_schema(made):
    validator = Draft202012Validator(output_schema("bisect"))
    obj = dict(made["outputs"]["bisect"][1])
    validator.validate(obj)
    with pytest.raises(ValidationError):
        validator.validate({**obj, "probability": obj["leader_probability"]})
    with pytest.raises(ValidationError):
        validator.validate({k: v for k, v in obj.items() if k != "leader_probability"})
    with pytest.raises(ValidationError):
        validator.validate({**obj, "schema_version": VERSIONS["bisect"] + 1})


def test_harness_schema_prints_each_output_schema(tmp_path):
    for kind in KINDS:
        proc = here("schema", "--output", kind)
        assert proc.returncode == 0, proc.stderr
        printed = json.loads(proc.stdout)
        Draft202012Validator.check_schema(printed)
        assert printed == output_schema(kind)
    hypotheses = here("schema")
    assert hypotheses.returncode == 0 and "hypotheses" in json.loads(hypotheses.stdout)["properties"]
    unknown = here("schema", "--output", "nope")
    assert unknown.returncode == 2 and "--output 'nope'" in unknown.stderr and "bisect" in unknown.stderr


def test_a_curve_run_prints_each_point_grouped_under_its_curve(tmp_path):
    """``harness run --json`` (and ``ledger show --json``) of a hypothesis swept over four
    concurrencies whose treatment wins at low load and loses at high (the mock backend's
    ``curve_boots.Curved``): one entry per point with its curve and
    point, and the curve's points' verdicts under ``curves``, with the answer the run
    stored (null where it stored none, with the note that says so)."""
    from curve_boots import drafting_boots, write_drafting_curve

    path = write_drafting_curve(tmp_path / "curve.yaml")
    drafting = drafting_boots()
    url = f"sqlite:///{tmp_path / 'r.db'}"
    ran = _json(harness_here("run", path, "--no-calibration", "--json", "--ledger", url, "--journal-dir",
                             tmp_path / "exp", handler=drafting, cwd=tmp_path))
    shown = _json(here("ledger", "show", ran["run_id"], "--ledger", url, "--json"))
    validator = Draft202012Validator(output_schema("run"))
    for out in (ran, shown):
        validator.validate(out)
        assert out["schema_version"] == VERSIONS["run"] == 3
        labels = [f"concurrency={c}" for c in (1, 4, 16, 32)]
        assert [(h["id"], h["curve"], h["point"]) for h in out["hypotheses"]] == [
            (f"spec-wins@{x}", "spec-wins", x) for x in labels]
        (curve,) = out["curves"]
        assert curve["curve"] == "spec-wins" and [p["label"] for p in curve["points"]] == labels
        assert [p["verdict"] for p in curve["points"]] == [h["verdict"] for h in out["hypotheses"]]
        assert [p["verdict"] for p in curve["points"]][:2] == ["confirmed", "confirmed"]
        assert [p["effect"] for p in curve["points"]] == [h["effect"] for h in out["hypotheses"]]
        if curve["answer"] is None:  # the run stored no answer: said, never made up
            assert curve["answer_note"] == "curve answer not recorded"
        else:  # the answer the executor stored from the points' verdicts
            assert curve["answer_note"] is None and curve["answer"]["largest"] == "concurrency=1"
    with pytest.raises(ValidationError):  # a run's output without curves is an older version's
        validator.validate({k: v for k, v in ran.items() if k != "curves"})
