"""The real ``harness`` command, end to end, on the built-in demo engine.

One module-scoped run boots the demo engine at two commits and with one flag
(about ten boots) and every test below reads what that run printed and recorded:
the ``--json`` line, the SQLite ledger, the journal, and the ``ledger``/``journal``
commands over the same database. Bad input is checked through the command too:
exit code 2, a message that names the key and line (or the commit, or the id),
and never a traceback. A build that fails at one commit is recorded with its log
and the run goes on.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from bisect_harness.cli.outputs import output_schema
from bisect_harness.demo import create_demo_repo
from helpers import SMALL_BENCH, harness, last_json, query, write_spec

DEFAULTS = {"samples_per_boot": 1, "boots_per_arm": 3, "max_boots_per_arm": 10}  # 10: a noisy CI host still decides

HYPOTHESES = [
    {"id": "head-regression",
     "statement": "Decode at HEAD is at least 10% slower than at HEAD~26.",
     "baseline": {"commit": "HEAD~26"}, "treatment": {"commit": "HEAD"},
     "metric": "tok_s", "expect": "decrease", "min_effect": "10%"},
    {"id": "attention-mode-decode",
     "statement": "--attention-mode decode makes decode at least 5% faster.",
     "baseline": {"commit": "HEAD"}, "treatment": {"commit": "HEAD", "flags": {"attention-mode": "decode"}},
     "metric": "tok_s", "expect": "increase", "min_effect": "5%"},
]

JSON_KEYS = {"run_id", "hypotheses"}
HYP_KEYS = {"id", "verdict", "metric", "effect", "ci", "p_value", "boots"}


def squash(text: str) -> str:
    """``text`` without any whitespace: the console wraps long messages at its width."""
    return "".join(text.split())


def assert_clean_user_error(proc, *needles: str) -> None:
    """Exit 2, every needle in the message, and no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    flat = squash(proc.stderr)
    assert flat.startswith("Error:"), proc.stderr
    for needle in needles:
        assert squash(needle) in flat, f"{needle!r} not in:\n{proc.stderr}"


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One ``harness run --json`` on a small demo spec; everything it produced."""
    root = tmp_path_factory.mktemp("e2e")
    spec = write_spec(root / "hypotheses.yaml", engine={"preset": "demo"}, benchmark=SMALL_BENCH,
                      defaults=DEFAULTS, hypotheses=HYPOTHESES)
    db, journal_dir = root / "r.db", root / "exp"
    proc = harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir", journal_dir,
                   "--json", cwd=root, timeout=600)
    return {"root": root, "spec": spec, "db": db, "url": f"sqlite:///{db}", "journal_dir": journal_dir,
            "proc": proc}


@pytest.mark.slow
def test_run_exits_zero_and_prints_the_documented_json(demo_run):
    proc = demo_run["proc"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    out = last_json(proc.stdout)
    assert JSON_KEYS <= set(out)
    Draft202012Validator(output_schema("run")).validate(out)  # `harness schema --output run`, on real servers
    assert isinstance(out["run_id"], int)
    assert [h["id"] for h in out["hypotheses"]] == ["head-regression", "attention-mode-decode"]
    for h in out["hypotheses"]:
        assert HYP_KEYS <= set(h), h
        assert h["metric"] == "tok_s"
        assert h["verdict"] in ("confirmed", "refuted", "inconclusive")
        assert set(h["boots"]) == {"baseline", "treatment"}
        top = DEFAULTS["max_boots_per_arm"]
        assert 3 <= h["boots"]["baseline"] <= top and 3 <= h["boots"]["treatment"] <= top, h
        low, high = h["ci"]
        assert low <= h["effect"] <= high
        assert 0.0 <= h["p_value"] <= 1.0
    regression, attention = out["hypotheses"]
    # HEAD~26 predates the demo's regression (a longer decode context): HEAD is clearly slower.
    assert regression["verdict"] == "confirmed", regression
    assert regression["effect"] < 0.9 and regression["ci"][1] < 1.0
    # --attention-mode never changes the demo's speed: it must not be called a 5% speed-up.
    assert attention["verdict"] != "confirmed", attention
    # With --json the tables and progress go to stderr: stdout is the JSON line alone.
    assert len([ln for ln in proc.stdout.splitlines() if ln.strip()]) == 1


@pytest.mark.slow
def test_off_a_terminal_the_verdict_table_keeps_every_word_and_interval_whole(demo_run):
    """The run's output went to a pipe (no terminal, no COLUMNS): rich must not lay the
    table out in 80 columns and cut its words with an ellipsis."""
    proc = demo_run["proc"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "…" not in proc.stderr, proc.stderr[-4000:]
    rows = [ln for ln in proc.stderr.splitlines() if ln.startswith("│")]
    for h in last_json(proc.stdout)["hypotheses"]:
        (row,) = [r for r in rows if f"│ {h['id']} " in r]
        assert f" {h['verdict']} " in row and f"[{h['ci'][0]:.4f}, {h['ci'][1]:.4f}]" in row, row
        assert f" {h['checks']['word']} " in row, row


@pytest.mark.slow
def test_ledger_holds_runs_configs_boots_and_samples(demo_run):
    assert demo_run["proc"].returncode == 0, demo_run["proc"].stderr[-4000:]
    db = demo_run["db"]
    run_id = last_json(demo_run["proc"].stdout)["run_id"]
    (status, spec_text, finished), = query(db, "SELECT status, spec_text, finished_at FROM runs WHERE id = ?",
                                          (run_id,))
    assert status == "done" and finished is not None
    assert spec_text == demo_run["spec"].read_text()
    configs = query(db, "SELECT id, `commit`, flags, status FROM configs WHERE run_id = ? ORDER BY id", (run_id,))
    # HEAD~26, HEAD, HEAD + --attention-mode decode: the HEAD baseline of the second
    # hypothesis is the first one's treatment and shares its boots.
    assert len(configs) == 3
    assert len({c[1] for c in configs}) == 2
    assert sorted((json.loads(c[2]) for c in configs), key=len) == [{}, {}, {"attention-mode": "decode"}]
    boots = query(db, "SELECT id, config_id, status, ready_s FROM boots WHERE run_id = ?", (run_id,))
    assert all(b[2] == "ok" for b in boots), boots
    per_config = {c[0]: sum(b[1] == c[0] for b in boots) for c in configs}
    assert all(3 <= n <= DEFAULTS["max_boots_per_arm"] for n in per_config.values()), per_config
    assert all(b[3] is not None and b[3] > 0 for b in boots)
    samples = query(db, "SELECT s.boot_id, s.metrics, s.requests, s.output_tokens FROM samples s "
                        "JOIN boots b ON b.id = s.boot_id WHERE b.run_id = ?", (run_id,))
    # the first rounds take samples_per_boot; a later round as many as node time is best spent
    # on (decide.allocation), up to max_samples_per_boot: every boot in that range
    per_boot = {b[0]: sum(s[0] == b[0] for s in samples) for b in boots}
    first = {b[0] for c in configs for b in sorted((b for b in boots if b[1] == c[0]))[:3]}
    assert all(per_boot[i] == DEFAULTS["samples_per_boot"] for i in first), per_boot
    assert all(DEFAULTS["samples_per_boot"] <= n <= 16 for n in per_boot.values()), per_boot
    for boot_id, metrics, requests, output_tokens in samples:
        m = json.loads(metrics)
        assert m["tok_s"] > 0 and m["ttft_ms"] > 0
        assert m["decode_tok_s"] > m["tok_s"]  # decode alone, without the TTFT that tok_s holds
        assert requests == 2 and output_tokens == 2 * 32
    hyps = query(db, "SELECT hid, metric, expect, min_effect FROM hypotheses WHERE run_id = ? ORDER BY id",
                 (run_id,))
    assert hyps == [("head-regression", "tok_s", "decrease", 0.10), ("attention-mode-decode", "tok_s", "increase", 0.05)]
    # Every look is a verdict row; the last one of each hypothesis is final and matches --json.
    out = {h["id"]: h for h in last_json(demo_run["proc"].stdout)["hypotheses"]}
    for hid, _, _, _ in hyps:
        rows = query(db, "SELECT v.outcome, v.final, v.ratio FROM verdicts v JOIN hypotheses h "
                         "ON h.id = v.hypothesis_id WHERE h.run_id = ? AND h.hid = ? ORDER BY v.id", (run_id, hid))
        assert rows and rows[-1][1] == 1 and all(r[1] == 0 for r in rows[:-1])
        assert rows[-1][0] == out[hid]["verdict"] and rows[-1][2] == pytest.approx(out[hid]["effect"])


@pytest.mark.slow
def test_verdicts_record_analysis_family_and_round_order(demo_run):
    assert demo_run["proc"].returncode == 0, demo_run["proc"].stderr[-4000:]
    run_id = last_json(demo_run["proc"].stdout)["run_id"]
    rows = query(demo_run["db"], "SELECT v.test, v.alpha, v.stats FROM verdicts v JOIN hypotheses h "
                                 "ON h.id = v.hypothesis_id WHERE h.run_id = ?", (run_id,))
    seeds = set()
    for test, alpha, raw in rows:
        st = json.loads(raw)
        assert st["analysis"] == "robust" and "robust paired" in test  # the shipped default, named in the test
        assert st["family_size"] == 2 and alpha == pytest.approx(0.05 / 2) and st["family_alpha"] == 0.05
        baseline_rounds, treatment_rounds = st["rounds"]
        assert baseline_rounds == list(range(len(baseline_rounds)))
        seeds.add(st["order_seed"])
    assert len(seeds) == 1  # one order seed per run


@pytest.mark.slow
def test_journal_has_verdicts_configs_and_the_hypotheses_as_written(demo_run):
    assert demo_run["proc"].returncode == 0, demo_run["proc"].stderr[-4000:]
    run_id = last_json(demo_run["proc"].stdout)["run_id"]
    journals = list(demo_run["journal_dir"].glob(f"*-run{run_id}.md"))
    assert len(journals) == 1, list(demo_run["journal_dir"].iterdir())
    text = journals[0].read_text()
    out = {h["id"]: h for h in last_json(demo_run["proc"].stdout)["hypotheses"]}
    verdicts = text.split("## Summary", 1)[1].split("\n### ", 1)[0]  # one line per hypothesis, first
    for hid, h in out.items():
        assert re.search(rf"^- `{re.escape(hid)}` \(tok_s, [^)]+\): \*\*{h['verdict']}\*\*, ", verdicts, re.M), \
            verdicts
    configs = text.split("## Configs and boots", 1)[1].split("## Host and calibration", 1)[0]
    assert len(re.findall(r"^### config \d+: ", configs, re.M)) == 3
    assert "--attention-mode" in configs
    # Each hypothesis says what its number is, from the definition stored with it.
    defs = re.findall(r"^- metric: `tok_s` \(tok/s, higher is better\): end-to-end output tokens per second",
                      text, re.M)
    assert len(defs) == len(out)
    stored = query(demo_run["db"], "SELECT spec FROM hypotheses WHERE run_id = ?", (run_id,))
    assert all(json.loads(raw)["metric_def"]["description"].startswith("end-to-end") for (raw,) in stored)
    written = text.split("## Hypotheses as written", 1)[1]
    assert "```yaml\n" + demo_run["spec"].read_text().rstrip() + "\n```" in written


@pytest.mark.slow
def test_ledger_and_journal_commands_read_the_run(demo_run, tmp_path):
    assert demo_run["proc"].returncode == 0, demo_run["proc"].stderr[-4000:]
    url = demo_run["url"]
    summary = last_json(demo_run["proc"].stdout)
    run_id = summary["run_id"]

    listed = harness("ledger", "list", "--ledger", url, "--json")
    assert listed.returncode == 0, listed.stderr
    runs = last_json(listed.stdout)["runs"]
    assert [(r["run_id"], r["status"], r["hypotheses"]) for r in runs] == [(run_id, "done", 2)]
    table = harness("ledger", "list", "--ledger", url, env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0 and "done" in table.stdout and "confirmed" in table.stdout, table.stdout

    shown = harness("ledger", "show", run_id, "--ledger", url, "--json")
    assert shown.returncode == 0, shown.stderr
    assert last_json(shown.stdout) == summary  # the ledger alone gives back what the run printed

    rendered = harness("journal", run_id, "--ledger", url, "--journal-dir", tmp_path / "again")
    assert rendered.returncode == 0, rendered.stderr
    again = list((tmp_path / "again").glob(f"*-run{run_id}.md"))
    original = list(demo_run["journal_dir"].glob(f"*-run{run_id}.md"))
    assert len(again) == 1 and again[0].read_text() == original[0].read_text()

    missing = harness("ledger", "show", run_id + 100, "--ledger", url, "--json")
    assert_clean_user_error(missing, f"no run {run_id + 100}")


# --------------------------------------------------------------------------- bad input


GOOD_SPEC = """\
version: 1
engine:
  preset: demo
benchmark:
  prompt_tokens: 16
  output_tokens: 32
defaults:
  boots_per_arm: 2
hypotheses:
  - id: only-one
    baseline: {commit: HEAD~1}
    treatment: {commit: HEAD}
    metric: tok_s
    expect: decrease
    min_effect: 10%
"""


def _bad(tmp_path: Path, old: str, new: str) -> Path:
    assert old in GOOD_SPEC
    path = tmp_path / "hypotheses.yaml"
    path.write_text(GOOD_SPEC.replace(old, new, 1))
    return path


def _run(tmp_path: Path, spec: Path, *extra: str):
    return harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{tmp_path / 'r.db'}",
                   "--journal-dir", tmp_path / "exp", "--json", *extra, cwd=tmp_path, timeout=120)


def test_unknown_key_names_key_and_line(tmp_path):
    spec = _bad(tmp_path, "  output_tokens: 32", "  output_tokns: 32")
    proc = _run(tmp_path, spec)
    assert_clean_user_error(proc, "hypotheses.yaml:6", "key 'benchmark.output_tokns'", "unknown key",
                            "did you mean 'output_tokens'")
    assert not (tmp_path / "r.db").exists()  # rejected before anything was opened or booted


def test_wrong_type_names_key_and_line(tmp_path):
    spec = _bad(tmp_path, "boots_per_arm: 2", "boots_per_arm: two")
    proc = _run(tmp_path, spec)
    assert_clean_user_error(proc, "hypotheses.yaml:8", "key 'defaults.boots_per_arm'", "expected an integer")


def test_missing_file(tmp_path):
    proc = _run(tmp_path, tmp_path / "nope.yaml")
    assert_clean_user_error(proc, "no such file", "nope.yaml")


def test_commit_that_does_not_exist_is_named(tmp_path):
    spec = _bad(tmp_path, "{commit: HEAD~1}", "{commit: deadbeef}")
    proc = _run(tmp_path, spec)
    assert_clean_user_error(proc, "commit 'deadbeef'", "hypothesis only-one, baseline.commit", "does not exist")
    assert not (tmp_path / "r.db").exists()


def test_only_with_an_unknown_id(tmp_path):
    spec = tmp_path / "hypotheses.yaml"
    spec.write_text(GOOD_SPEC)
    proc = _run(tmp_path, spec, "--only", "no-such-id")
    assert_clean_user_error(proc, "--only no-such-id", "no such hypothesis", "known ids: only-one")


# --------------------------------------------------------------------------- a build that fails


@pytest.mark.slow
def test_build_failure_is_recorded_and_the_run_goes_on(tmp_path):
    engine_dir = tmp_path / "engine"
    history = create_demo_repo(engine_dir)
    broken = history.events["build_failure"]
    spec = write_spec(
        tmp_path / "hypotheses.yaml", engine={"preset": "demo", "repo": "engine"}, benchmark=SMALL_BENCH,
        defaults={"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 2},
        hypotheses=[{"id": "broken-build", "baseline": {"commit": broken}, "treatment": {"commit": "HEAD"},
                     "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}])
    db = tmp_path / "r.db"
    proc = _run(tmp_path, spec)
    # the baseline never built, so it never booted: not measured, exit 3, the build named
    assert proc.returncode == 3, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and "not measured" in proc.stderr
    (h,) = last_json(proc.stdout)["hypotheses"]
    assert h["verdict"] == "not measured" and h["measured"] is False
    assert h["boots"] == {"baseline": 0, "treatment": 0}  # no verdict statistic without both sides
    assert "baseline never booted" in h["reason"]
    assert "build failed" in h["reason"] and broken[:12] in h["reason"]

    (status,), = query(db, "SELECT status FROM runs")
    assert status == "done"
    rows = {commit: (cstatus, failure, log_tail) for commit, cstatus, failure, log_tail in
            query(db, "SELECT `commit`, status, failure, log_tail FROM configs")}
    cstatus, failure, log_tail = rows[broken]
    assert cstatus == "build_failed" and "build failed" in failure
    assert "KeyError" in log_tail  # the demo's broken build.py: the tile table lacks this head size
    # The failed build is one failed boot row with the same tail, and the run went on
    # to boot and measure the other side.
    failed = query(db, "SELECT b.status, b.log_tail FROM boots b JOIN configs c ON c.id = b.config_id "
                       "WHERE c.`commit` = ?", (broken,))
    assert [b[0] for b in failed] == ["failed"] and "KeyError" in failed[0][1]
    measured = query(db, "SELECT b.status, COUNT(s.id) FROM boots b JOIN configs c ON c.id = b.config_id "
                         "LEFT JOIN samples s ON s.boot_id = b.id WHERE c.`commit` = ? GROUP BY b.id",
                     (history.head,))
    assert measured == [("ok", 1), ("ok", 1)]

    (journal,) = (tmp_path / "exp").glob("*-run*.md")
    text = journal.read_text()
    assert "**not measured**" in text
    section = text.split(f"- commit: {broken}", 1)[1].split("### config", 1)[0]
    assert "- status: build_failed" in section and "```text" in section and "KeyError" in section
