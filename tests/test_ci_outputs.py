"""The forms CI reads (``--format github``, ``--junit``, ``--report-url``), made for real.

The commands run in this process with their boots answered by the mock backend (the
demo history's 1.9x ``decode_ms`` regression, 3% noise, a commit whose build fails:
``mock_boots.Planted``; a load curve: ``curve_boots.Curved``), as ``test_json_outputs``
makes its outputs; the forms are then checked against what the ledger holds: each
test case and each answer line against its verdict row, each night against the
summary it stored, the JUnit file against ``tests/data/junit.xsd``. The same forms
made by the nightly workflow on the real demo engine are checked in
``test_nightly_workflow``.
"""

from __future__ import annotations

import json
import re
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import typer
import xmlschema
import yaml

from bisect_harness.demo import create_demo_repo
from bisect_harness.report import junit
from bisect_harness.report.cells import effect
from bisect_harness.report.reproduce import experiment_name
from helpers import last_json, query, write_spec
from mock_boots import Planted, harness_here
from test_json_outputs import here

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = xmlschema.XMLSchema(str(Path(__file__).parent / "data" / "junit.xsd"))
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
SITE = "https://perf.example.org/harness"
DECODE_MS = {"name": "decode_ms", "from": "log", "pattern": r"decode cycle: (?P<value>[0-9.]+) ms/cyc",
             "reduce": "median", "unit": "ms", "better": "lower"}


def _cases(path: Path) -> dict[str, ET.Element]:
    SCHEMA.validate(str(path))
    return {c.get("name"): c for c in ET.parse(path).getroot().iter("testcase")}


def _properties(path: Path) -> list[tuple[str, str]]:
    return [(p.get("name"), p.get("value")) for p in ET.parse(path).getroot().iter("property")]


def _ended(case: ET.Element) -> str:
    return next((child.tag for child in case if child.tag in ("failure", "skipped", "error")), "passed")


def _expected_end(outcome: str, test: str, expect: str, better: str) -> str:
    """What the ledger's verdict row means for a test case: a confirmed claim in the
    metric's worse direction fails, an undetermined one is skipped, the rest pass."""
    worse = "decrease" if better == "higher" else "increase"
    if outcome == "confirmed":
        return "failure" if expect == worse else "passed"
    return "passed" if outcome == "refuted" and test != "not measured" else "skipped"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """A run of four hypotheses (a slowdown, a speedup, no change, a build that fails),
    a second run of the same file, four nights ending in a regression, and what each
    command printed and wrote."""
    root = tmp_path_factory.mktemp("ci-outputs")
    hist = create_demo_repo(root / "engine")
    i_reg = hist.index(hist.events["regression"])
    before, fast, slow = hist.shas[i_reg - 2], hist.shas[i_reg - 1], hist.shas[i_reg + 1]
    broken = hist.shas[i_reg - 4]
    spec = write_spec(
        root / "hypotheses.yaml", engine={"preset": "demo", "repo": str(hist.path), "metrics": [DECODE_MS]},
        benchmark={"prompt_tokens": 16, "output_tokens": 32, "requests_per_sample": 1, "warmup_requests": 1},
        defaults={"samples_per_boot": 1, "boots_per_arm": 3, "max_boots_per_arm": 8},
        hypotheses=[
            {"id": "slowdown", "baseline": {"commit": fast}, "treatment": {"commit": slow}, "metric": "decode_ms",
             "expect": "increase", "min_effect": "10%"},
            {"id": "speedup", "baseline": {"commit": slow}, "treatment": {"commit": fast}, "metric": "tok_s",
             "expect": "increase", "min_effect": "10%"},
            {"id": "no-change", "baseline": {"commit": before}, "treatment": {"commit": fast}, "metric": "tok_s",
             "expect": "decrease", "min_effect": "20%"},
            {"id": "never-built", "baseline": {"commit": fast}, "treatment": {"commit": broken},
             "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}])
    planted = Planted(slow_from=hist.shas[i_reg:], broken=[broken])
    db, summary = root / "r.db", root / "step-summary.md"
    url = f"sqlite:///{db}"
    common = ["--ledger", url, "--journal-dir", root / "exp", "--no-calibration", "--cache-dir", root / "cache"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GITHUB_STEP_SUMMARY", str(summary))
        first = harness_here("run", spec, *common, "--format", "github", "--junit", root / "run.xml", "--json",
                             handler=planted, cwd=root)
        second = harness_here("run", spec, *common, "--format", "github", "--report-url", SITE + "/", "--junit",
                              root / "out" / "run2.xml", handler=planted, cwd=root)
    nights_db = root / "nights.db"
    nights = []
    for i, rev in enumerate((hist.shas[i_reg - 3], before, fast, hist.shas[i_reg + 2])):
        nights.append(harness_here(
            "nightly", spec, "--rev", rev, "--ledger", f"sqlite:///{nights_db}", "--journal-dir", root / "nights",
            "--no-calibration", "--metric", "decode_ms", "--min-effect", "0.25", "--cache-dir", root / "cache",
            "--format", "github", "--report-url", SITE, "--junit", root / f"night{i + 1}.xml", "--json",
            "--changepoints", handler=planted, cwd=root))
    return {"root": root, "db": db, "url": url, "first": first, "second": second, "summary": summary,
            "nights": nights, "nights_db": nights_db, "hist": hist, "spec": spec, "name": experiment_name(str(spec))}


def _run_id(made, key: str) -> int:
    if key == "first":
        return last_json(made["first"].stdout)["run_id"]
    (rid,) = [r for (r,) in query(made["db"], "SELECT MAX(id) FROM runs")]
    return rid


def test_each_hypothesis_is_a_test_case_that_ends_as_its_verdict_row_reads(made):
    """A confirmed regression fails, a build that never ran is skipped with its reason, a
    confirmed improvement and a refuted claim pass: each against the ledger's own row."""
    # the run exits 3 (a side never booted), after writing its answers
    assert made["first"].returncode == 3, made["first"].stderr[-3000:]
    rid = _run_id(made, "first")
    cases = _cases(made["root"] / "run.xml")
    rows = query(made["db"], "SELECT h.hid, h.expect, h.min_effect, h.spec, v.outcome, v.test, v.ratio, v.ci_low, "
                 "v.ci_high, v.reason FROM hypotheses h JOIN verdicts v ON v.hypothesis_id = h.id WHERE h.run_id = ? "
                 "AND v.id = (SELECT MAX(id) FROM verdicts WHERE hypothesis_id = h.id) ORDER BY h.id", (rid,))
    assert [r[0] for r in rows] == list(cases) == ["slowdown", "speedup", "no-change", "never-built"]
    ends = {}
    for hid, expect, min_effect, hspec, outcome, test, ratio, low, high, reason in rows:
        case = cases[hid]
        assert case.get("classname") == made["name"]
        better = json.loads(hspec)["metric_def"]["better"]
        ends[hid] = _ended(case)
        assert ends[hid] == _expected_end(outcome, test, expect, better)
        if ends[hid] == "failure":
            failure = case.find("failure")
            assert failure.get("type") == "regression"
            assert effect(ratio, low, high) in failure.get("message") and reason in failure.text
        if ends[hid] == "skipped":
            assert reason.removeprefix("not measured: ") in case.find("skipped").get("message")
    # the file holds each way a case can end
    assert ends == {"slowdown": "failure", "speedup": "passed", "no-change": "passed", "never-built": "skipped"}
    suite = ET.parse(made["root"] / "run.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")


def test_the_suite_says_the_run_its_commits_and_its_page(made):
    first, second = _run_id(made, "first"), _run_id(made, "second")
    commits = [c for (c,) in query(made["db"], "SELECT DISTINCT commit_ FROM (SELECT \"commit\" AS commit_, MIN(id) "
                                   "AS first FROM configs WHERE run_id = ? GROUP BY \"commit\") ORDER BY first",
                                   (first,))]
    props = _properties(made["root"] / "run.xml")
    assert ("run_id", str(first)) in props and [v for k, v in props if k == "commit"] == commits
    assert ("ledger", made["url"]) in props and not any(k == "report" for k, _ in props)
    # with --report-url: the run's page of the published site (the trailing slash dropped)
    later = _properties(made["root"] / "out" / "run2.xml")
    assert ("report", f"{SITE}/runs/{second}.html") in later


def test_the_step_summary_says_the_answers_first_then_the_evidence_then_the_links(made):
    """``--format github``: on stdout (stderr under ``--json``), and appended to
    ``$GITHUB_STEP_SUMMARY``: one block per command, each answer line the verdict row's
    words and figures, the table folded, the links only where the site is given."""
    first, second = _run_id(made, "first"), _run_id(made, "second")
    text = made["summary"].read_text()
    blocks = text.split("\n## ")
    assert len(blocks) == 2 and blocks[0].startswith(f"## {made['name']}: run {first} (")
    plain = made["second"].stdout
    assert blocks[1] in plain  # printed on stdout as well
    head = f"## {made['name']}: run"
    assert head in made["first"].stderr and head not in made["first"].stdout
    assert last_json(made["first"].stdout)["run_id"] == first  # --json's object stays the last line
    for block, rid, linked in ((blocks[0], first, False), (blocks[1], second, True)):
        answers, _, rest = block.partition("<details>")
        assert "<summary>Evidence: 4 verdict(s)" in rest and rest.index("</details>") < len(rest)
        rows = query(made["db"], "SELECT h.hid, v.outcome, v.ratio, v.ci_low, v.ci_high FROM hypotheses h JOIN "
                     "verdicts v ON v.hypothesis_id = h.id WHERE h.run_id = ? AND v.id = (SELECT MAX(id) FROM "
                     "verdicts WHERE hypothesis_id = h.id) ORDER BY h.id", (rid,))
        for hid, outcome, ratio, low, high in rows:
            (line,) = [ln for ln in answers.splitlines() if f"`{hid}`" in ln]
            if ratio is not None:
                assert effect(ratio, low, high) in line
            assert f"| {hid} |" in rest
        assert re.search(r"- \*\*regression\*\*: `slowdown` \(decode_ms increase >= 10%\): Confirmed: ", answers)
        assert "- **improvement**: `speedup`" in answers and "- **undetermined**: `never-built`" in answers
        links = re.findall(r"\]\((https?://[^)]+)\)", rest)
        assert links == ([f"{SITE}/runs/{rid}.html", f"{SITE}/index.html"] if linked else [])


def test_each_night_is_a_test_case_the_first_skipped_the_regression_failed_with_its_culprit(made):
    ends, statuses = [], []
    for i, proc in enumerate(made["nights"], start=1):
        out = last_json(proc.stdout)
        assert proc.returncode == (4 if out["alert"] else 0), proc.stderr[-3000:]
        (case,) = _cases(made["root"] / f"night{i}.xml").values()
        assert case.get("name") == "decode_ms" and case.get("classname") == made["name"]
        ends.append(_ended(case))
        statuses.append(out["status"])
        (stored,) = [json.loads(s) for (s,) in query(made["nights_db"], "SELECT summary FROM runs WHERE id = ?",
                                                      (out["run_id"],))]
        assert stored["status"] == out["status"]
        props = _properties(made["root"] / f"night{i}.xml")
        assert ("run_id", str(out["run_id"])) in props and ("commit", out["commit"]) in props
        assert ("report", f"{SITE}/runs/{out['run_id']}.html") in props
        # the step summary (on stderr under --json): the night's status and sentence first, then the table
        md = proc.stderr[proc.stderr.index(f"## {made['name']}: nightly check"):]
        assert md.startswith(f"## {made['name']}: nightly check {out['status']}")
        assert stored["reason"] in md.split("<details>")[0]
        assert f"{SITE}/series/" in md and f"{SITE}/runs/{out['run_id']}.html" in md
    assert statuses == ["first-night", "first-night", "ok", "regression"]
    assert ends == ["skipped", "skipped", "passed", "failure"]
    tonight = last_json(made["nights"][-1].stdout)
    failure = ET.parse(made["root"] / "night4.xml").getroot().find(".//failure")
    assert failure.get("type") == "regression" and f"culprit {tonight['bisection']['culprit']}" in failure.text
    assert made["hist"].events["regression"] == tonight["bisection"]["culprit"]
    md = made["nights"][-1].stderr
    assert f"- bisection: culprit `{tonight['bisection']['culprit'][:12]}`" in md
    (stored,) = [json.loads(s) for (s,) in query(made["nights_db"], "SELECT summary FROM runs WHERE id = ?",
                                                  (tonight["run_id"],))]
    assert f"- change points over {stored['changepoints']['nights']} night(s) of decode_ms: " in md


def test_compare_in_github_form_says_each_config_and_links_its_page(made):
    first, second = _run_id(made, "first"), _run_id(made, "second")
    proc = here("compare", first, second, "--metric", "tok_s", "--ledger", made["url"], "--format", "github",
                "--report-url", SITE, "--json")
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc.stdout)
    md = proc.stderr
    assert md.startswith(f"## run {second} against run {first}: {len(out['configs'])} config(s)")
    answers = md.split("<details>")[0]
    for c in out["configs"]:
        (line,) = [ln for ln in answers.splitlines() if f"`{c['label']}`" in ln]
        assert line.startswith(f"- **{c['verdict']}**") and effect(c["ratio"], *(c["ci"] or (None, None))) in line
    assert f"]({SITE}/compare/{first}-{second}.html)" in md


def test_a_curve_is_a_test_case_per_point_and_its_stored_answer_in_words(tmp_path):
    from curve_boots import drafting_boots, write_drafting_curve

    path = write_drafting_curve(tmp_path / "curve.yaml")
    drafting = drafting_boots()
    proc = harness_here("run", path, "--no-calibration", "--json", "--format", "github", "--junit",
                        tmp_path / "curve.xml", "--ledger", f"sqlite:///{tmp_path / 'r.db'}", "--journal-dir",
                        tmp_path / "exp", handler=drafting, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = last_json(proc.stdout)
    cases = _cases(tmp_path / "curve.xml")
    assert list(cases) == [h["id"] for h in out["hypotheses"]] == [
        f"spec-wins@concurrency={c}" for c in (1, 4, 16, 32)]
    # tok_s is better higher: the claim "increase" confirmed is an improvement, it passes
    for h in out["hypotheses"]:
        assert _ended(cases[h["id"]]) == {"confirmed": "passed", "refuted": "passed"}.get(h["verdict"], "skipped")
    (curve,) = out["curves"]
    words = curve["answer"]["words"] if curve["answer"] else curve["answer_note"]
    assert f"- curve `spec-wins` (tok_s increase >= 10%, 4 points): {words}" in proc.stderr


def test_a_bad_format_or_a_form_of_nothing_is_refused_before_anything_runs(made, tmp_path):
    proc = here("compare", 1, 2, "--ledger", made["url"], "--format", "html")
    assert proc.returncode == 2 and "--format 'html'" in proc.stderr and "github" in proc.stderr
    dry = here("run", made["spec"], "--dry-run", "--junit", tmp_path / "x.xml")
    assert dry.returncode == 2 and "--dry-run" in dry.stderr and not (tmp_path / "x.xml").exists()


def test_the_junit_file_is_written_whole_or_not_at_all(tmp_path):
    doc = junit.to_xml([])
    target = tmp_path / "results.xml"
    target.write_bytes(b"<old/>")
    assert junit.write(target, doc) == target and target.read_bytes() == doc
    SCHEMA.validate(str(target))
    (tmp_path / "taken.xml").mkdir()  # a folder where the file should go: refused, nothing left behind
    with pytest.raises(OSError):
        junit.write(tmp_path / "taken.xml", doc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.xml", "taken.xml"]


def test_text_xml_cannot_hold_is_replaced_and_the_file_stays_valid(tmp_path):
    import datetime as dt

    case = junit.Case("h\x00id", "exp", "failure", "regression: \x1b[31m slower", "regression", "log \x07 line")
    suite = junit.Suite("exp", dt.datetime(2026, 1, 2, 3, 4, 5), 1.5, (("commit", "abc\x01"),), (case,))
    path = junit.write(tmp_path / "r.xml", junit.to_xml([suite]))
    SCHEMA.validate(str(path))
    (got,) = _cases(path).values()
    assert got.get("name") == "h?id" and got.find("failure").text == "log ? line"


# -- the workflow: every command it runs is a real command with real options ----------------

def _harness_commands(run: str) -> list[list[str]]:
    """The ``harness ...`` command lines of a ``run:`` script, line continuations joined,
    up to the first pipe, redirection or ``;``/``&&``."""
    script = run.replace("\\\n", " ")
    out = []
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "harness":
            cut = next((i for i, w in enumerate(words) if w in ("|", ">", ">>", "&&", "||", ";")), len(words))
            out.append(words[1:cut])
    return out


def _check_command(words: list[str]) -> None:
    from bisect_harness.cli import app

    cmd, rest = typer.main.get_command(app), list(words)
    while hasattr(cmd, "commands") and rest and not rest[0].startswith("-"):  # a group: the next word names one
        name = rest.pop(0)
        assert name in cmd.commands, f"`harness {' '.join(words)}`: no command {name!r}"
        cmd = cmd.commands[name]
    options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    for w in rest:
        if w.startswith("--"):
            assert w.split("=", 1)[0] in options, f"`harness {' '.join(words)}`: {cmd.name} has no option {w}"


def test_the_nightly_workflow_runs_real_commands_and_publishes_the_answers():
    doc = yaml.safe_load(WORKFLOW.read_text())
    on = doc[True]  # `on:` reads as True
    assert on["schedule"][0]["cron"] and "workflow_dispatch" in on
    steps = doc["jobs"]["nightly"]["steps"]
    commands = [c for s in steps if "run" in s for c in _harness_commands(s["run"])]
    for words in commands:
        _check_command(words)
    by_name = {c[0]: c for c in commands}
    nightly = by_name["nightly"]
    assert "--format" in nightly and nightly[nightly.index("--format") + 1] == "github"
    assert "--junit" in nightly and "report" in by_name and "--out" in by_name["report"]
    step_text = "\n".join(s.get("run", "") for s in steps)
    assert "GITHUB_STEP_SUMMARY" not in step_text or "--format github" in step_text
    uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    assert "actions/upload-artifact" in uses and ("actions/cache/restore" in uses or "actions/cache" in uses)
    published = [s for s in steps if "uses" in s and "junit" in s["uses"].lower() + json.dumps(s.get("with", {}))]
    assert published and all(str(s.get("if", "")).strip() == "always()" for s in published)


def test_the_command_check_catches_an_option_that_does_not_exist():
    with pytest.raises(AssertionError, match="no option --formt"):
        _check_command(["nightly", "x.yaml", "--formt", "github"])
    with pytest.raises(AssertionError, match="no command 'nigthly'"):
        _check_command(["nigthly", "x.yaml"])
