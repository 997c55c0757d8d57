"""The record a performance engineer reads: the journal (plots, means, commands, commits,
calibration figures), the journal folder's index, ``harness compare``, ``harness ledger
export``, ``harness schema`` and ``--version``.

One module-scoped pair of real runs on the demo engine (two commits, two boots a side)
feeds every test that needs a ledger: the first with the calibration probe, the second
without.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import SMALL_BENCH, harness, last_json, query, write_spec

ROOT = Path(__file__).resolve().parents[1]

HYP = {"id": "head-regression", "statement": "HEAD decodes at least 10% slower than HEAD~26.",
       "baseline": {"commit": "HEAD~26"}, "treatment": {"commit": "HEAD"},
       "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}
DEFAULTS = {"samples_per_boot": 2, "boots_per_arm": 2, "max_boots_per_arm": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("record")
    (root / "demo-small").mkdir()
    spec = write_spec(root / "demo-small" / "hypotheses.yaml", engine={"preset": "demo"}, benchmark=SMALL_BENCH,
                      defaults=DEFAULTS, hypotheses=[HYP])
    db, jdir = root / "r.db", root / "exp"
    first = harness("run", spec, "--ledger", f"sqlite:///{db}", "--journal-dir", jdir, "--json", cwd=root,
                    timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    second = harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir", jdir, "--json",
                     cwd=root, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    return {"root": root, "spec": spec, "db": db, "url": f"sqlite:///{db}", "jdir": jdir, "procs": [first, second],
            "ids": [last_json(first.stdout)["run_id"], last_json(second.stdout)["run_id"]]}


def _journal(runs, run_id: int) -> tuple[Path, str]:
    (path,) = runs["jdir"].glob(f"*-run{run_id}.md")
    return path, path.read_text()


@pytest.mark.slow
def test_journal_is_named_after_the_experiment_and_indexed(runs):
    a, b = runs["ids"]
    path, _ = _journal(runs, a)
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d-demo-small-run{a}\.md", path.name), path.name
    index = (runs["jdir"] / "index.md").read_text()
    rows = [ln for ln in index.splitlines() if ln.startswith(f"| {a} |") or ln.startswith(f"| {b} |")]
    assert len(rows) == 2, index
    for run_id, row in zip((b, a), rows):  # newest first
        (outcome,) = query(runs["db"], "SELECT v.outcome FROM verdicts v JOIN hypotheses h ON h.id = v.hypothesis_id "
                                       "WHERE h.run_id = ? ORDER BY v.id DESC LIMIT 1", (run_id,))[0:1]
        assert f"`head-regression` {outcome[0]}" in row
        assert f"-demo-small-run{run_id}.md](" in row
        assert "demo-small" in row and "| run |" in row


@pytest.mark.slow
def test_journal_plot_means_commands_commits_and_calibration(runs):
    run_id = runs["ids"][0]
    path, text = _journal(runs, run_id)
    (plot,) = re.findall(r"!\[head-regression: [^\]]*\]\(([^)]+\.png)\)", text)
    assert plot.startswith(path.stem) and (runs["jdir"] / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the absolute means are the mean of the used boots' means, from the ledger's samples
    (hid,) = query(runs["db"], "SELECT id FROM hypotheses WHERE run_id = ?", (run_id,))[0]
    (b_ids, t_ids), = query(runs["db"], "SELECT baseline_boot_ids, treatment_boot_ids FROM verdicts "
                                        "WHERE hypothesis_id = ? ORDER BY id DESC LIMIT 1", (hid,))
    for side, ids in (("baseline", json.loads(b_ids)), ("treatment", json.loads(t_ids))):
        means = []
        for bid in ids:
            vals = [json.loads(m)["tok_s"] for (m,) in query(runs["db"], "SELECT metrics FROM samples WHERE boot_id = ?",
                                                             (bid,))]
            means.append(sum(vals) / len(vals))
        expected = f"{side} mean: {sum(means) / len(means):.2f} tok/s (mean of {len(ids)} boot means)"
        assert expected in text, (expected, text[:3000])

    # each boot's command is its argv as it ran (the real port, the commit's interpreter), in its worktree
    for argv, prov in query(runs["db"], "SELECT argv, provenance FROM boots WHERE run_id = ?", (run_id,)):
        argv, launch = json.loads(argv), json.loads(prov)["launch"]
        assert f"`cd {launch['cwd']} && {' '.join(argv)}`" in text
        assert "{port}" not in " ".join(argv) and Path(launch["cwd"]).is_dir()
    assert f"- **run again**: `harness run {runs['spec']}`" in text

    # git log --oneline of the range, read from the demo repository
    shas = [c for (c,) in query(runs["db"], "SELECT \"commit\" FROM configs WHERE run_id = ? ORDER BY id", (run_id,))]
    m = re.search(r"Commits between the sides: (\d+) commit\(s\) in (\w+)\.\.(\w+), newest first\.", text)
    assert m, text
    assert int(m.group(1)) == 26 and {m.group(2), m.group(3)} <= {s[:12] for s in shas}
    block = text.split(m.group(0), 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    assert len(block.splitlines()) == 26 and block.splitlines()[0].split()[0] in {s[:7] for s in shas}

    # calibration figures (the probe's medians), not only its settings
    (result,) = query(runs["db"], "SELECT result FROM calibrations WHERE run_id = ? AND phase = 'before'", (run_id,))[0]
    for meas in json.loads(result)["measurements"]:
        assert f"| before | {meas['name']} | {meas['device']} | {meas['median']:.2f} {meas['unit']} |" in text


def test_journals_and_plots_are_committable_and_logs_are_not():
    for rel, ignored in (("experiments/2026-11-30-demo-run7.md", False), ("experiments/index.md", False),
                         ("experiments/2026-11-30-demo-run7-h1.png", False), ("experiments/logs/run-7/boot-1.log", True)):
        proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", rel], cwd=ROOT)
        assert proc.returncode == (0 if ignored else 1), rel


# --------------------------------------------------------------------------- the CLI


@pytest.mark.slow
def test_progress_in_a_pipe_is_a_line_per_boot_counted_against_the_budget(runs):
    # the fixture's runs wrote to a pipe (not a terminal): no bars, one plain line per
    # boot, in the order the ledger holds them, each counting boots done / the budget
    # (2 configs, each up to max_boots_per_arm 2 + boot_retries 2 + 1 boots)
    proc, run_id = runs["procs"][1], runs["ids"][1]
    lines = [ln for ln in proc.stderr.splitlines() if re.match(r"boot \d+ \(", ln)]
    boots = query(runs["db"], "SELECT id, status FROM boots WHERE run_id = ? ORDER BY id", (run_id,))
    assert len(lines) == len(boots), proc.stderr[-3000:]
    for k, (line, (boot_id, status)) in enumerate(zip(lines, boots), start=1):
        assert re.match(rf"boot {boot_id} \(.*#\d+\): {status}\b.* in \d+ s; {k}/10 boots$", line), line
    assert "\x1b[" not in proc.stderr and "boots done / budget" not in proc.stderr


@pytest.mark.slow
def test_compare_judges_shared_configs_by_the_verdict_rule(runs):
    from bisect_harness.decide.verdict import Question, Side, judge
    from bisect_harness.plan.build import verdict_rules
    from bisect_harness.spec import load_spec
    from bisect_harness.model import Expect
    from bisect_harness.record.ledger import Ledger, boot_records
    import dataclasses

    a, b = runs["ids"]
    proc = harness("compare", a, b, "--ledger", runs["url"], "--json")
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    assert (out["run_a"], out["run_b"]) == (a, b) and len(out["configs"]) == 2
    with Ledger(runs["url"]) as led:
        ra, rb = led.run(a), led.run(b)
        rules = verdict_rules(dataclasses.replace(load_spec(runs["spec"]), family_size=2))
        for row in out["configs"]:
            assert row["matched_by"] == "key"
            ca = next(c for c in ra.configs if c.key == row["key"])
            cb = next(c for c in rb.configs if c.key == row["key"])
            want = judge(rules, Side("run A", boot_records(ca.boots)), Side("run B", boot_records(cb.boots)),
                         Question("tok_s", Expect.DECREASE, 0.05), force_final=True)
            assert row["verdict"] == want.outcome.value and row["ratio"] == pytest.approx(want.ratio)
            assert row["p_value"] == pytest.approx(want.p_value)
            assert row["boots"] == {"a": len(want.baseline_boot_ids), "b": len(want.treatment_boot_ids)}
            assert row["warnings"] == list(want.warnings)
    text = harness("compare", a, b, "--ledger", runs["url"])
    assert text.returncode == 0 and f"run {b} against run {a}" in text.stdout, text.stderr
    bad = harness("compare", a, b, "--ledger", runs["url"], "--metric", "nope")
    assert bad.returncode == 2 and "--metric 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    missing = harness("compare", a, 999, "--ledger", runs["url"])
    assert missing.returncode == 2 and "no run 999" in missing.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_ledger_export_holds_every_boot_and_sample(runs, tmp_path, fmt):
    proc = harness("ledger", "export", "--format", fmt, "--out", tmp_path, "--ledger", runs["url"])
    assert proc.returncode == 0, proc.stderr
    if fmt == "csv":
        with (tmp_path / "boots.csv").open() as fh:
            boots = list(csv.DictReader(fh))
        with (tmp_path / "samples.csv").open() as fh:
            samples = list(csv.DictReader(fh))
    else:
        import pyarrow.parquet as pq

        boots = pq.read_table(tmp_path / "boots.parquet").to_pylist()
        samples = pq.read_table(tmp_path / "samples.parquet").to_pylist()
    db_boots = query(runs["db"], "SELECT id, status, argv FROM boots ORDER BY id")
    assert [(int(r["boot_id"]), r["status"]) for r in boots] == [(i, s) for i, s, _ in db_boots]
    assert [json.loads(r["argv"]) for r in boots] == [json.loads(a) for _, _, a in db_boots]
    db_samples = query(runs["db"], "SELECT id, boot_id, metrics FROM samples ORDER BY id")
    assert len(samples) == len(db_samples)
    for row, (sid, bid, metrics) in zip(samples, db_samples):
        assert (int(row["sample_id"]), int(row["boot_id"])) == (sid, bid)
        assert float(row["metric.tok_s"]) == pytest.approx(json.loads(metrics)["tok_s"], rel=1e-12)
    wrong = harness("ledger", "export", "--format", "xlsx", "--out", tmp_path, "--ledger", runs["url"])
    assert wrong.returncode == 2 and "--format 'xlsx'" in wrong.stderr


def _examples() -> list[tuple[str, dict]]:
    import yaml

    out = [(str(p.relative_to(ROOT)), yaml.safe_load(p.read_text()))
           for p in [ROOT / "hypotheses.yaml", *sorted((ROOT / "experiments").rglob("*.yaml"))]]
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for i, block in enumerate(re.findall(r"```ya?ml\n(.*?)```", doc.read_text(), re.S)):
            data = yaml.safe_load(block)
            if isinstance(data, dict) and "engine" in data and "hypotheses" in data:  # whole files, not fragments
                out.append((f"{doc.name} block {i}", data))
    return out


def test_schema_is_the_loaders_keys_and_accepts_every_example():
    import jsonschema

    from bisect_harness.spec import sections as loader

    proc = harness("schema")
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    props = schema["properties"]
    assert list(props) == list(loader._TOP)
    assert set(props["engine"]["properties"]) == set(loader._ENGINE)
    assert set(props["benchmark"]["properties"]) == set(loader._BENCH)
    assert set(props["defaults"]["properties"]) == set(loader._DEFAULTS)
    assert set(schema["$defs"]["hypothesis"]["properties"]) == set(loader._HYP)
    assert set(schema["$defs"]["arm"]["properties"]) == set(loader._ARM)
    validator = jsonschema.Draft202012Validator(schema)
    examples = _examples()
    assert len(examples) >= 4, [n for n, _ in examples]
    for name, data in examples:
        errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(data)]
        assert not errors, (name, errors)
    # and it refuses what the loader refuses
    good = examples[0][1]
    for broken in ({**good, "hypotheses": [{**good["hypotheses"][0], "expect": "sideways"}]},
                   {**good, "defaults": {**good.get("defaults", {}), "samples_per_bot": 2}},
                   {**good, "engine": {**good["engine"], "preset": "no-such-preset"}},
                   {**good, "hypotheses": [{**good["hypotheses"][0], "min_effect": "ten percent"}]}):
        assert list(validator.iter_errors(broken)), broken


def test_version_and_shell_completion():
    from bisect_harness import __version__

    proc = harness("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"bisect-harness {__version__}"
    # typer detects the shell from the parent processes; a test has none, so it names it (typer's own switch)
    script = harness("--show-completion", "bash",
                     env={**__import__("os").environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert script.returncode == 0 and "_HARNESS_COMPLETE" in script.stdout, script.stdout + script.stderr
    import os
    import sys

    env = {**os.environ, "_HARNESS_COMPLETE": "complete_bash", "COMP_WORDS": "harness led", "COMP_CWORD": "1"}
    done = subprocess.run([sys.executable, "-m", "bisect_harness.cli"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["ledger"], done


def test_experiment_names_and_the_run_command_from_ledger_rows():
    from types import SimpleNamespace as NS

    from bisect_harness.record.ledger import VerdictRow
    from bisect_harness.report.reproduce import experiment_name, run_command

    assert experiment_name("experiments/sglang-eagle3/hypotheses.yaml") == "sglang-eagle3"
    assert experiment_name("/x/y/spec-decode tuning.yml") == "spec-decode-tuning"
    assert experiment_name("hypotheses.yaml") == "hypotheses"

    def hyp(hid, family):
        return NS(hid=hid, verdicts=[VerdictRow(stats={"family_size": family})])

    whole = NS(kind="run", spec_path="exp/hypotheses.yaml", summary=None, hypotheses=[hyp("a", 2), hyp("b", 2)])
    assert run_command(whole) == "harness run exp/hypotheses.yaml"
    some = NS(kind="run", spec_path="exp/hypotheses.yaml", summary=None, hypotheses=[hyp("b[tp=2]", 5)])
    assert run_command(some) == "harness run exp/hypotheses.yaml --only b"
    night = NS(kind="nightly", spec_path="n.yaml", summary={"commit": "abc123", "metric": "tok_s"}, hypotheses=[])
    assert run_command(night) == "harness nightly n.yaml --rev abc123 --metric tok_s"
    bis = NS(kind="bisect", spec_path="n.yaml", summary=None, hypotheses=[])
    assert run_command(bis, [NS(good="g" * 40, bad="b" * 40, metric="decode_ms")]) == \
        f"harness bisect n.yaml --good {'g' * 40} --bad {'b' * 40} --metric decode_ms"


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=400))
def test_a_hypothesis_id_never_climbs_out_of_the_journal_folder(hid):
    """Matrix values become part of hypothesis ids (``h[mode=VALUE]``), and ids become
    plot file names: whatever the value, the plot stays one short file in the folder."""
    from bisect_harness.report.reproduce import file_part

    name = f"2026-12-02-exp-run1-{file_part(hid)}.png"
    assert "/" not in name and "\\" not in name and ".." not in name and "\0" not in name
    assert len(name.encode()) < 255
    folder = Path("/journal")
    assert (folder / name).resolve().parent == folder.resolve()
    other = hid + "x"
    assert file_part(other) != file_part(hid)
