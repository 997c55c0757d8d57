"""``harness bisect`` and ``bisect: true`` against the demo engine's history.

The demo repository is made in a temp folder; ``events`` (known only to tests)
names the commit that slowed decoding and the one that breaks the build.

``bisect: true`` runs on live demo servers: every boot is a real server on
127.0.0.1, built from its commit. The range is small and the effect (the context
length 512 -> 4096: decode cycles about 1.9 times as long) is several times the
boot-to-boot noise even on a busy 2-core host, so a probe needs about one boot. The
metric is the engine's own decode time per cycle (a declared log source, median per
sample): on a shared machine it is steadier than the client's tok/s. That test is the
bisection's end to end on real servers (``test_releases`` descends to a commit on real
servers too, and ``test_cli_e2e`` records a real broken build).

The search over a longer range that steps over the broken build and resumes from
the ledger is search and bookkeeping: the real ``harness bisect`` command runs in this
process with its boots answered by the mock backend (``mock_boots.Planted``: the
history's regression, its broken build and a few percent of noise), so it takes 15 to
70 boots in a second, not minutes (the endpoint check and the culprit against its
parent are paired rounds of fresh boots, 3 pairs at least, and an anchor is measured
again every second probe round).
"""

from __future__ import annotations

import re

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bisect_harness.demo import create_demo_repo
from bisect_harness.record.ledger import Bisection, Boot, Ledger
from mock_boots import Planted, harness_here

SPEC = """\
version: 1
engine:
  preset: demo
  repo: {repo}
  metrics:
    # The engine's own decode timing, median per sample: steadier than the client's
    # tok/s when another process takes the CPU for a moment.
    - {{name: decode_ms, from: log, pattern: 'decode cycle: (?P<value>[0-9.]+) ms/cyc', reduce: median,
       unit: ms, better: lower}}
benchmark:
  prompt_tokens: 16
  output_tokens: 32
  requests_per_sample: 1
  warmup_requests: 1
defaults:
  samples_per_boot: 1
  boots_per_arm: 2
  max_boots_per_arm: {max_boots}
  alpha: {alpha}
hypotheses:
  - id: regression
    statement: decode cycles at {bad} are at least 10% longer than at {good}; bisect it
    baseline: {{commit: {good}}}
    treatment: {{commit: {bad}}}
    metric: decode_ms
    expect: increase
    min_effect: 10%
    bisect: {bisect}
"""


@pytest.fixture(scope="module")
def hist(tmp_path_factory):
    return create_demo_repo(tmp_path_factory.mktemp("bisect-cli") / "engine")


def write_spec(path: Path, hist, *, good="HEAD~1", bad="HEAD", bisect=False, max_boots=4, alpha=0.05) -> Path:
    path.write_text(SPEC.format(repo=hist.path, good=good, bad=bad, bisect=str(bisect).lower(),
                                max_boots=max_boots, alpha=alpha))
    return path


def harness(args: list[str], cwd: Path, timeout: float = 400) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    return proc, time.monotonic() - t0


def bisect(tmp_path: Path, spec: Path, good: str, bad: str, *extra: str, planted: Planted, code: int = 0,
           stderr: list | None = None):
    """``harness bisect`` in this process, its boots answered by ``planted``: it exits
    ``code`` (6 where it names no culprit); its stderr appended to ``stderr``."""
    proc = harness_here("bisect", spec, "--good", good, "--bad", bad, "--json",
                        "--ledger", f"sqlite:///{tmp_path / 'results.db'}", "--journal-dir", tmp_path / "journal",
                        "--metric", "decode_ms", *extra, handler=planted, cwd=tmp_path)
    assert proc.returncode == code, proc.stderr[-4000:]
    if stderr is not None:
        stderr.append(proc.stderr)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # piped: a plain line per boot and per search step on stderr, as they happen
    lines = proc.stderr.splitlines()
    assert sum(1 for x in lines if re.match(r"boot \d+ \(.*, #\d+\): \w+", x)) >= out["new_boots"], proc.stderr[-3000:]
    assert any(x.startswith("bisect step 1: endpoints ") for x in lines), proc.stderr[-3000:]
    return out


def test_finds_the_regression_skips_the_broken_build_and_resumes_from_the_ledger(hist, tmp_path):
    i_reg = hist.index(hist.events["regression"])
    planted = Planted(slow_from=hist.shas[i_reg:], broken=[hist.events["build_failure"]])
    i_broken = hist.index(hist.events["build_failure"])
    # good just before the regression; the broken build sits at the uniform
    # posterior's median (5 of 10 candidates), so it is the first interior probe.
    good, bad = hist.shas[i_reg - 1], hist.shas[i_reg + 9]
    assert hist.shas.index(good) < i_broken < hist.shas.index(bad)
    spec = write_spec(tmp_path / "spec.yaml", hist)
    # A first search out of budget after the endpoint check's first rounds: it says so before
    # its first boot, and names no culprit, so it exits 6...
    said: list[str] = []
    first = bisect(tmp_path, spec, good, bad, "--max-boots", "4", planted=planted, code=6, stderr=said)
    assert first["stopped"] == "budget" and first["culprit"] is None
    assert first["leader"] in hist.shas and 0.0 < first["leader_probability"] < 0.95  # a leader, not a culprit
    assert first["boots"] == first["new_boots"] == 4
    least = first["plan"]["least_boots"]
    assert first["plan"]["budget"] == 4 and first["plan"]["candidates"] == 10 and least > 4
    lines = said[0].splitlines()
    cannot = next(i for i, x in enumerate(lines) if x.startswith("bisection: the bisection cannot finish in 4 boots: "
                                                                  f"it needs at least {least}"))
    assert f"raise --max-boots to at least {least}" in lines[cannot]
    assert cannot < next(i for i, x in enumerate(lines) if x.startswith("bisect step 1: ")), "said before it starts"

    # ...and a second over the same range goes on from its boots.
    out = bisect(tmp_path, spec, good, bad, "--max-boots", "100", planted=planted)
    assert {"culprit", "leader", "leader_probability", "candidates", "boots", "skipped"} <= set(out)
    assert "probability" not in out  # the leader's posterior has its own name, apart from the culprit
    assert out["culprit"] == out["leader"] == hist.events["regression"], out
    assert out["leader_probability"] >= 0.95 and out["stopped"] == "confident"
    assert out["candidates"][0] == {"commit": hist.events["regression"], "probability": out["leader_probability"]}
    assert all(set(c) == {"commit", "probability"} for c in out["candidates"])
    assert sum(c["probability"] for c in out["candidates"]) <= 1.0 + 1e-9
    assert out["skipped"] == [hist.events["build_failure"]]
    # confident well inside the budget of 100 (31 boots of real servers on a quiet host, 68 on a busy CI host)
    assert 12 <= out["boots"] <= 80, out["boots"]
    assert out["endpoint_test"]["decision"] == "passed" and out["endpoint_test"]["pairs"] >= 3
    assert out["verify_test"]["decision"] == "passed" and out["verify_test"]["pairs"] >= 3
    assert out["no_step_probability"] < 0.05

    with Ledger(f"sqlite:///{tmp_path / 'results.db'}") as led:
        # Every usable boot of the first search is reused, none measured again. Usable is what
        # the search itself would count: status ok. Under host_check "mark" (this spec's) a boot
        # the host made busy stays ok and counts, in a search and when reused alike; under
        # "retry"/"exclude" it is "excluded" and never reused (test_ledger checks that rule).
        first_run = led.session.get(Bisection, first["bisection_id"]).run_id
        usable = [(c.commit, b) for c in led.run(first_run).configs for b in c.boots if b.status == "ok"]
        assert usable and 0 < out["new_boots"]
        bis = led.session.get(Bisection, out["bisection_id"])
        reused = [p for p in bis.probes if p.reused]
        assert {p.commit for p in reused} == {commit for commit, _ in usable} <= {good, bad}
        assert sum(p.reused for p in reused) == len(usable)
        assert sorted(i for p in reused for i in p.boot_ids) == sorted(b.id for _, b in usable)
        assert all(p.boots_requested == 0 for p in reused)
        # the reused boots are listed by run, and every paired test is recorded with its own boots
        assert all(f"from run {first_run}" in p.note and len(p.boot_ids) == p.reused for p in reused)
        assert any(not p.reused and p.values for p in bis.probes), "and it measured more"
        assert led.session.get(Bisection, first["bisection_id"]).result["stopped"] == "budget"
        run = led.latest_run()
        assert run.kind == "bisect" and run.status == "done"
        broken = [c for c in run.configs if c.commit == hist.events["build_failure"]]
        assert [c.status for c in broken] == ["build_failed"]
        assert "build" in (broken[0].failure or "")
    assert out["reused_runs"] == [first_run]
    tests = out["tests"]
    assert tests[0]["kind"] == "endpoints" and tests[0]["decision"] == "passed"
    assert (tests[-1]["kind"], tests[-1]["decision"]) == ("verify", "passed")
    assert tests[-1]["bad"] == hist.events["regression"]
    assert all(len(t["boot_ids"]) >= 2 * t["pairs"] for t in tests)
    assert not set(tests[0]["boot_ids"]) & {b.id for _, b in usable}, "reused boots feed no test"

    n = out["bisection_id"]
    heading = f"## Bisection {n}: {good[:12]}..{bad[:12]} on decode_ms"
    (text,) = [x for x in (j.read_text() for j in (tmp_path / "journal").glob("*-run*.md")) if heading in x]
    assert f"Culprit: `{hist.events['regression'][:12]}`" in text
    assert "skipped" in text
    (plot,) = re.findall(rf"!\[decode_ms against commit order\]\(([^)]*-bisection-{n}\.png)\)", text)
    png = tmp_path / "journal" / plot
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| endpoint check |" in text and "| head-to-head 1 |" in text

    # --fresh: boots of earlier runs are left out, the search starts from nothing
    third = bisect(tmp_path, spec, good, bad, "--max-boots", "2", "--fresh", planted=planted, code=6)
    assert third["reused_runs"] == [] and third["boots"] == third["new_boots"] == 2



@pytest.mark.slow
def test_bisect_true_bisects_a_confirmed_regression(hist, tmp_path):
    i_reg = hist.index(hist.events["regression"])
    good, bad = hist.shas[i_reg - 1], hist.shas[i_reg + 2]
    # The verdict only gates the bisection here: a looser alpha and a larger budget
    # keep a noisy shared machine from leaving the regression inconclusive.
    spec = write_spec(tmp_path / "spec.yaml", hist, good=good, bad=bad, bisect=True, max_boots=6, alpha=0.2)
    proc, seconds = harness(["run", str(spec), "--json", "--no-calibration",
                             "--ledger", f"sqlite:///{tmp_path / 'results.db'}",
                             "--journal-dir", str(tmp_path / "journal")], tmp_path)
    print(f"run with bisect: true took {seconds:.0f}s")
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    (h,) = summary["hypotheses"]
    assert h["verdict"] == "confirmed", h
    assert h["bisection"]["culprit"] == hist.events["regression"] and h["bisection"]["status"] == "done", h
    with Ledger(f"sqlite:///{tmp_path / 'results.db'}") as led:
        run = led.latest_run()
        (bis,) = led.session.query(Bisection).filter_by(run_id=run.id).all()
        assert bis.hypothesis_id == run.hypotheses[0].id
        assert bis.result["culprit"] == hist.events["regression"]
        assert any(p.reused for p in bis.probes), "the hypothesis' own boots feed the search"
        opening = [p for p in bis.probes if p.purpose == "endpoints" and p.reused]
        opened = bis.result["verdict_rounds"]
        assert opened and [p.boot_ids[0] for p in opening] == [i for r in opened for i in r]
        # the search is part of the run: it ends, done, after the search's last boot
        boots = led.session.query(Boot).filter_by(run_id=run.id).all()
        searched = {b for p in bis.probes if not p.reused for b in (p.boot_ids or [])}
        assert searched and searched <= {b.id for b in boots}
        assert run.status == "done" and run.finished_at >= max(b.finished_at for b in boots)
    journal = next((tmp_path / "journal").glob("*-run*.md")).read_text()
    assert f"## Bisection 1: {good[:12]}..{bad[:12]} on decode_ms" in journal
    assert f"Culprit: `{hist.events['regression'][:12]}`" in journal
    # the verdict's paired rounds open the endpoint check (not "earlier runs"); the search's
    # boots count against its own budget, not past the rounds' planned boots
    assert f"endpoint check: opened by the {len(opened)} paired rounds of the hypothesis' verdict" in journal
    assert (f"the verdict's {len(opened)} paired rounds of the two endpoints open its endpoint check"
            in " ".join(proc.stderr.split()))
    search_lines = [x for x in proc.stderr.splitlines() if x.startswith("boot ") and "boots of the bisection" in x]
    assert search_lines and search_lines[0].endswith("; 1/150 boots of the bisection"), proc.stderr[-3000:]


@pytest.mark.parametrize("case", ["flags", "env", "same", "reversed"])
def test_a_bisect_true_that_cannot_bisect_is_refused_before_any_boot(hist, tmp_path, case):
    """Arms that differ in more than their commit, or name no two commits, are refused
    when the plan is made (exit 2, naming the hypothesis, its line and what differs),
    not after every round was booted."""
    good, bad = {"same": ("HEAD~1", "HEAD~1"), "reversed": ("HEAD", "HEAD~1")}.get(case, ("HEAD~1", "HEAD"))
    text = write_spec(tmp_path / "spec.yaml", hist, good=good, bad=bad, bisect=True).read_text()
    if case == "flags":
        text = text.replace("treatment: {commit: HEAD}", "treatment: {commit: HEAD, flags: {attention-mode: decode}}")
    elif case == "env":
        text = text.replace("baseline: {commit: HEAD~1}", "baseline: {commit: HEAD~1, env: {DEMO_SLOW: '1'}}")
    (tmp_path / "spec.yaml").write_text(text)
    db = tmp_path / "results.db"
    for dry in ([], ["--dry-run"]):
        proc, _ = harness(["run", str(tmp_path / "spec.yaml"), "--no-calibration", *dry,
                           "--ledger", f"sqlite:///{db}", "--journal-dir", str(tmp_path / "journal")], tmp_path)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        err = " ".join(proc.stderr.split())
        assert "Traceback" not in err and "hypothesis regression (line " in err, err
        assert {"flags": "needs sides that differ only in their commit; these differ too: flag attention-mode",
                "env": "these differ too: env DEMO_SLOW. Split the hypothesis",
                "same": "both sides are commit",
                "reversed": f"bisect: true searches forward from the baseline's commit, and {hist.head[:12]} is not "
                            "an ancestor of the treatment's"}[case] in err, err
    assert not db.exists() and not (tmp_path / "journal").exists(), "nothing was booted or written"


def test_an_explain_true_between_one_config_is_refused_before_any_boot(hist, tmp_path):
    text = write_spec(tmp_path / "spec.yaml", hist, good="HEAD", bad="HEAD").read_text()
    (tmp_path / "spec.yaml").write_text(text.replace("bisect: false", "explain: true"))
    proc, _ = harness(["run", str(tmp_path / "spec.yaml"), "--dry-run"], tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert ("hypothesis regression (line 21): explain: true needs sides that differ (commit, env or flags)"
            in " ".join(proc.stderr.split())), proc.stderr


@pytest.mark.parametrize("case", ["same", "reversed", "unknown"])
def test_bad_ranges_exit_2_with_a_clear_message(hist, tmp_path, case):
    spec = write_spec(tmp_path / "spec.yaml", hist)
    i_reg = hist.index(hist.events["regression"])
    good, bad = {"same": (hist.head, "HEAD"), "reversed": (hist.head, hist.shas[i_reg]),
                 "unknown": ("no-such-tag", "HEAD")}[case]
    proc, _ = harness(["bisect", str(spec), "--good", good, "--bad", bad, "--json",
                       "--ledger", f"sqlite:///{tmp_path / 'results.db'}",
                       "--journal-dir", str(tmp_path / "journal")], tmp_path, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = " ".join(proc.stderr.split())
    assert err.startswith("Error: ") and "Traceback" not in err
    if case == "same":
        assert f"--good and --bad are the same commit ({hist.head[:12]}); nothing to bisect" in err
    elif case == "reversed":
        assert f"good commit {hist.head[:12]} is not an ancestor of bad commit {hist.shas[i_reg][:12]}" in err
    else:
        assert "no-such-tag" in err and "--good" in err
    assert not (tmp_path / "journal").exists(), "nothing was booted or written"


def test_a_run_whose_bisection_names_no_culprit_exits_6(hist, tmp_path):
    # The regression's own commit does not build: the bisection of the confirmed hypothesis can
    # only name the set of it and the commit after it (ambiguous-skips), not a culprit.
    i_reg = hist.index(hist.events["regression"])
    planted = Planted(slow_from=hist.shas[i_reg:], broken=[hist.events["regression"]])
    good, bad = hist.shas[i_reg - 1], hist.shas[i_reg + 1]
    spec = write_spec(tmp_path / "spec.yaml", hist, good=good, bad=bad, bisect=True, max_boots=6, alpha=0.2)
    proc = harness_here("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{tmp_path / 'r.db'}",
                        "--journal-dir", tmp_path / "journal", handler=planted, cwd=tmp_path)
    assert proc.returncode == 6, proc.stderr[-4000:]
    (h,) = json.loads(proc.stdout.strip().splitlines()[-1])["hypotheses"]
    assert h["verdict"] == "confirmed", h
    assert h["bisection"]["culprit"] is None and h["bisection"]["stopped"] == "ambiguous-skips", h
    assert h["bisection"]["candidate_set"] == [hist.events["regression"], bad]
    assert "regression: its bisection named no culprit (ambiguous-skips" in proc.stderr
    assert list((tmp_path / "journal").glob("*-run*.md")), "the journal is written before the exit"


def test_endpoints_that_differ_by_less_than_min_effect_end_the_search_early(hist, tmp_path):
    # Nothing between these two commits is slow: with --min-effect 20% the endpoint check shows the
    # change smaller than that within its first looks and the search ends not-reproduced; with
    # --min-effect any the same check runs on until the futility rule or its last look.
    i_reg = hist.index(hist.events["regression"])
    good, bad = hist.shas[i_reg + 1], hist.shas[i_reg + 9]
    planted = Planted(slow_from=[])
    spec = write_spec(tmp_path / "spec.yaml", hist)
    said: list[str] = []
    out = bisect(tmp_path, spec, good, bad, "--min-effect", "20%", planted=planted, code=6, stderr=said)
    assert out["stopped"] == "not-reproduced" and out["culprit"] is None
    et = out["endpoint_test"]
    assert et["decision"] == "below" and et["upper"] < et["below"], et
    assert et["below"] == pytest.approx(0.2 * 10.0, rel=0.1), "20% of the good endpoint's level, in ms"
    assert out["new_boots"] == 2 * et["pairs"] <= 10
    assert "the endpoints differ by less than --min-effect 20%" in said[0]
    (journal,) = (tmp_path / "journal").glob("*-run*.md")
    text = " ".join(journal.read_text().split())
    assert "endpoint check: the change between the endpoints is smaller than the least that counts" in text
    assert "`--min-effect` sets the least change" in text
    (tmp_path / "any").mkdir()
    anyway = bisect(tmp_path / "any", spec, good, bad, "--min-effect", "any", "--fresh", planted=planted, code=6)
    assert anyway["stopped"] == "not-reproduced" and anyway["endpoint_test"]["decision"] == "failed"
    assert anyway["endpoint_test"]["below"] is None and anyway["new_boots"] > out["new_boots"]


def test_a_min_effect_that_is_no_relative_change_exits_2_naming_the_option(hist, tmp_path):
    spec = write_spec(tmp_path / "spec.yaml", hist)
    proc, _ = harness(["bisect", str(spec), "--good", "HEAD~1", "--bad", "HEAD", "--min-effect", "150%",
                       "--ledger", f"sqlite:///{tmp_path / 'results.db'}",
                       "--journal-dir", str(tmp_path / "journal")], tmp_path, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = " ".join(proc.stderr.split())
    assert "--min-effect '150%'" in err and "between 0 and 1" in err and "'any'" in err and "Traceback" not in err
    assert not (tmp_path / "journal").exists(), "nothing was booted or written"


@pytest.mark.parametrize("flag, value, says", [("--confidence", "1.5", "confidence must lie strictly between 0 and 1"),
                                               ("--max-boots", "1", "max_boots must be an integer >= 2")])
def test_search_options_the_search_refuses_exit_2_naming_the_flags(hist, tmp_path, flag, value, says):
    spec = write_spec(tmp_path / "spec.yaml", hist)
    proc, _ = harness(["bisect", str(spec), "--good", "HEAD~1", "--bad", "HEAD", flag, value,
                       "--ledger", f"sqlite:///{tmp_path / 'results.db'}",
                       "--journal-dir", str(tmp_path / "journal")], tmp_path, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = " ".join(proc.stderr.split())
    assert says in err and "fix --confidence, --max-boots or --min-effect" in err and "Traceback" not in err
    assert not (tmp_path / "journal").exists(), "nothing was booted or written"


def test_a_confirmed_verdicts_rounds_open_the_bisections_endpoint_check(hist, tmp_path):
    # bisect: true after a confirmed verdict: its paired rounds of the two endpoints (baseline
    # commit, treatment commit; one boot of each per round, in a random order) are the endpoint
    # check's first rounds, so the check boots only what they leave undecided.
    i_reg = hist.index(hist.events["regression"])
    planted = Planted(slow_from=hist.shas[i_reg:])
    good, bad = hist.shas[i_reg - 3], hist.shas[i_reg + 3]
    spec = write_spec(tmp_path / "spec.yaml", hist, good=good, bad=bad, bisect=True, max_boots=6)
    proc = harness_here("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{tmp_path / 'r.db'}",
                        "--journal-dir", tmp_path / "journal", handler=planted, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (h,) = json.loads(proc.stdout.strip().splitlines()[-1])["hypotheses"]
    assert h["verdict"] == "confirmed" and h["bisection"]["culprit"] == hist.events["regression"], h
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = led.latest_run()
        verdict = next(v for v in run.hypotheses[0].verdicts if v.final)
        rounds = [list(r) for r in zip(verdict.baseline_boot_ids, verdict.treatment_boot_ids)]
        (bis,) = led.session.query(Bisection).filter_by(run_id=run.id).all()
        result = bis.result
        assert result["verdict_rounds"] == rounds, (result["verdict_rounds"], rounds)
        check = result["tests"][0]
        assert check["kind"] == "endpoints" and check["decision"] == "passed"
        # the verdict's boots first, then the rounds the check booted itself; none of them fed
        # the posterior a second time as reused boots of this run
        assert check["boot_ids"][:2 * len(rounds)] == sorted(i for r in rounds for i in r)
        booted = len(check["boot_ids"]) // 2 - len(rounds)
        print(f"verdict rounds {len(rounds)}, endpoint rounds booted {booted}, check {check}")
        assert check["pairs"] <= len(rounds) + booted and booted == max(0, 3 - len(rounds)), (check, rounds)
        assert not result["reused_runs"], "every boot of the verdict is in its rounds"
        notes = [p.note for p in bis.probes if p.purpose == "endpoints" and p.reused]
        assert len(notes) == 2 * len(rounds) and notes[0].endswith("| the verdict's round 1")
    journal = " ".join(next((tmp_path / "journal").glob("*-run*.md")).read_text().split())
    assert f"endpoint check: opened by the {len(rounds)} paired rounds of the hypothesis' verdict" in journal
