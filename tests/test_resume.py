"""``harness run FILE --resume [RUN]``: a run killed half way continues, it does not start over.

The integration test starts a real ``harness run`` on the demo engine in a
session of its own, SIGKILLs it once the ledger holds finished boots and a boot
in the middle of its benchmark, lets the watchdog take the servers down, and
resumes it with a second real ``harness run --resume``. The ledger then says
whether the earlier boots were counted, whether any config went over its
budget, and the journal says which boots came from before the resume. The unit
tests check the refusals on a real SQLite ledger without booting anything.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import BootOutcome, SampleOutcome
from bisect_harness.demo import create_demo_repo
from bisect_harness.errors import UserError
from bisect_harness.spec import load_spec
from bisect_harness.record import liveness
from bisect_harness.run.executor import Executor, Observer
from bisect_harness.run.resume import check_plan, find_run, spec_hash
from bisect_harness.plan.build import make_plan
from bisect_harness.record.ledger import Config, HypothesisRow, Ledger, Run
from helpers import HARNESS, SMALL_BENCH, harness, last_json, processes_under, query, reapers_of, wait_for, write_spec

MAX_BOOTS = 3
DEFAULTS = {"samples_per_boot": 2, "boots_per_arm": 2, "max_boots_per_arm": MAX_BOOTS}
HYPOTHESES = [
    {"id": "head-regression", "baseline": {"commit": "HEAD~26"}, "treatment": {"commit": "HEAD"},
     "metric": "tok_s", "expect": "decrease", "min_effect": "10%"},
    {"id": "decode-attention", "baseline": {"commit": "HEAD"},
     "treatment": {"commit": "HEAD", "flags": {"attention-mode": "decode"}},
     "metric": "tok_s", "expect": "increase", "min_effect": "10%"},
]


def _count(db: Path, sql: str) -> int:
    try:
        return query(db, sql)[0][0]
    except sqlite3.Error:  # not created yet, or the schema is being written
        return 0


def _halfway(db: Path) -> bool:
    """Two boots finished and another in the middle of its benchmark."""
    return (_count(db, "SELECT COUNT(*) FROM boots WHERE status = 'ok'") >= 2
            and _count(db, "SELECT COUNT(*) FROM samples s JOIN boots b ON b.id = s.boot_id "
                           "WHERE b.status = 'running'") >= 1)


@pytest.mark.slow
def test_a_run_killed_halfway_resumes_counts_its_boots_and_keeps_the_budget(tmp_path, harness_cache):
    create_demo_repo(tmp_path / "engine")
    spec = write_spec(tmp_path / "hypotheses.yaml", engine={"preset": "demo", "repo": "engine"},
                      benchmark=SMALL_BENCH, defaults=DEFAULTS, hypotheses=HYPOTHESES)
    db = tmp_path / "r.db"
    common = ["--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir", str(tmp_path / "exp")]
    with open(tmp_path / "first.err", "wb") as err:
        proc = subprocess.Popen([*HARNESS, "run", str(spec), *common], cwd=tmp_path, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        wait_for(lambda: _halfway(db) or proc.poll() is not None, timeout=300, what="two boots and a third one")
        assert proc.poll() is None, f"the run ended before the kill:\n{(tmp_path / 'first.err').read_text()[-3000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    wait_for(lambda: not processes_under(harness_cache / "repos") and not reapers_of(proc.pid), timeout=20,
             what="the watchdog to stop the killed run's servers")
    ok_before = {i for (i,) in query(db, "SELECT id FROM boots WHERE status = 'ok'")}
    cut_short = {i for (i,) in query(db, "SELECT id FROM boots WHERE status = 'running'")}
    samples_before = _count(db, "SELECT COUNT(*) FROM samples")
    assert len(ok_before) >= 2 and cut_short

    # A run id that is not there, and a resume that names it, are refused before anything boots.
    missing = harness("run", spec, "--resume", "99", *common, cwd=tmp_path)
    assert missing.returncode == 2 and "no run 99" in missing.stderr

    done = harness("run", spec, "--resume", *common, "--json", cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = last_json(done.stdout)
    (run_id,) = {r for (r,) in query(db, "SELECT id FROM runs")}  # the same run, continued: one experiment
    assert summary["run_id"] == run_id and summary["status"] == "done"
    assert "resuming run" in done.stderr

    # Every hypothesis decided, by a final look.
    finals = query(db, "SELECT h.hid, v.outcome, v.baseline_boot_ids, v.treatment_boot_ids FROM hypotheses h "
                       "JOIN verdicts v ON v.hypothesis_id = h.id WHERE v.final = 1")
    assert sorted(h for h, *_ in finals) == sorted(h["id"] for h in HYPOTHESES)
    used = {i for _, _, b, t in finals for i in json.loads(b) + json.loads(t)}
    # The boots measured before the kill were counted: each feeds a verdict (each config is in one).
    assert ok_before <= used, f"boots from before the kill left out: {ok_before - used}"
    # A boot cut short keeps its samples in the ledger but feeds no verdict.
    assert query(db, f"SELECT DISTINCT status FROM boots WHERE id IN ({','.join(map(str, cut_short))})") \
        == [("interrupted",)]
    assert not cut_short & used
    assert _count(db, "SELECT COUNT(*) FROM samples") > samples_before
    # No config has more good boots than its budget; nothing from before was booted again.
    for config_id, good in query(db, "SELECT config_id, COUNT(*) FROM boots WHERE status = 'ok' GROUP BY config_id"):
        assert good <= MAX_BOOTS, f"config {config_id} has {good} good boots, more than {MAX_BOOTS}"
    for config_id, seqs in query(db, "SELECT config_id, GROUP_CONCAT(seq) FROM boots GROUP BY config_id"):
        seqs = [int(s) for s in seqs.split(",")]
        assert len(seqs) == len(set(seqs)), f"config {config_id} numbered two boots alike: {seqs}"
    (host,), = query(db, "SELECT host FROM runs")
    (record,) = json.loads(host)["resumed"]
    assert set(record["counted_ok_boot_ids"]) == ok_before
    assert set(record["cut_short_boot_ids"]) == cut_short and record["previous_status"] == "interrupted"

    # The journal says which boots came from before the resume, per hypothesis and per boot.
    (journal,) = (tmp_path / "exp").glob("*-run*.md")
    text = journal.read_text()
    assert f"- **resumed**: at {record['at'].replace('T', ' ')} UTC, after the run was interrupted" in text
    assert f"{len(ok_before)} ok boots from before counted" in text  # two or more
    n_before = sum(len(ok_before & set(json.loads(b) + json.loads(t))) for _, _, b, t in finals)
    sentences = [line for line in text.splitlines() if line.startswith("- resumed: ")]
    assert len(sentences) == len(HYPOTHESES)
    assert sum(int(s.split("- resumed: ", 1)[1].split(" of ", 1)[0]) for s in sentences) == n_before
    assert "from before the resume at" in sentences[0] and "cut short by the interruption" in text
    assert "ok, from before the resume" in text
    # Every boot of the run is in the journal, those of the resumed part too.
    for boot_id, status in query(db, "SELECT id, status FROM boots"):
        assert f"| {boot_id} | {status} |" in text, f"boot {boot_id} ({status}) missing from the journal"

    # Finished: a second resume has nothing to take up.
    again = harness("run", spec, "--resume", *common, cwd=tmp_path)
    assert again.returncode == 2 and "no interrupted or failed run" in again.stderr, again.stderr


# ------------------------------------------------------------------ refusals, on a real ledger


@pytest.fixture
def setup(tmp_path):
    spec_path = write_spec(tmp_path / "hypotheses.yaml", engine={"preset": "demo", "repo": "engine"},
                           benchmark=SMALL_BENCH, defaults=DEFAULTS, hypotheses=HYPOTHESES)
    spec = load_spec(spec_path)
    led = Ledger(f"sqlite:///{tmp_path / 'r.db'}")
    yield spec, led
    led.close()


def _run(led: Ledger, spec, *, status: str = "interrupted", text: str | None = None, kind: str = "run",
         owner: dict | None = None) -> Run:
    text = spec.text if text is None else text
    return led.add(Run(kind=kind, spec_path=str(spec.path), spec_text=text, spec_hash=spec_hash(text),
                       harness_version="t", status=status, host={liveness.OWNER_KEY: owner} if owner else {}))


def test_resume_refuses_a_ledger_without_an_interrupted_run_of_the_file(setup):
    spec, led = setup
    with pytest.raises(UserError, match="no interrupted or failed run of .*hypotheses.yaml"):
        find_run(led, spec, None)
    _run(led, spec, status="done")
    with pytest.raises(UserError, match="no interrupted or failed run"):
        find_run(led, spec, None)


def test_resume_refuses_a_run_that_finished_or_still_runs_or_is_not_a_run(setup):
    spec, led = setup
    finished = _run(led, spec, status="done")
    with pytest.raises(UserError, match=f"run {finished.id} finished \\(done\\); there is nothing to resume"):
        find_run(led, spec, finished.id)
    live = _run(led, spec, status="running", owner=liveness.owner_record())  # this test's own process
    with pytest.raises(UserError, match=f"run {live.id} is still running \\(harness pid {os.getpid()}"):
        find_run(led, spec, live.id)
    nightly = _run(led, spec, kind="nightly")
    with pytest.raises(UserError, match="is a `harness nightly` run"):
        find_run(led, spec, nightly.id)


def test_resume_refuses_a_file_that_changed_naming_both_hashes(setup):
    spec, led = setup
    old_text = spec.text.replace("10%", "12%")
    old = _run(led, spec, text=old_text)
    with pytest.raises(UserError) as exc:
        find_run(led, spec, None)  # the same file, newest interrupted run: found by its path
    message = str(exc.value)
    assert spec_hash(old_text)[:12] in message and spec_hash(spec.text)[:12] in message
    assert f"run {old.id} was started from" in message and "start a new run without --resume" in message
    with pytest.raises(UserError, match=spec_hash(old_text)[:12]):
        find_run(led, spec, old.id)


def test_resume_takes_the_newest_interrupted_or_failed_run_of_the_file(setup):
    spec, led = setup
    _run(led, spec)
    failed = _run(led, spec, status="failed")
    _run(led, spec, status="done")
    assert find_run(led, spec, None).id == failed.id


def test_resume_refuses_a_plan_whose_configs_or_hypotheses_differ(setup):
    spec, led = setup
    plan = make_plan(spec, resolve=False)
    run = _run(led, spec)
    rows = {pc.key: led.add(Config(run_id=run.id, key=pc.key, label=pc.label, commit=pc.arm.commit))
            for pc in plan.configs}
    for h in plan.hypotheses:
        led.add(HypothesisRow(run_id=run.id, hid=h.id, metric="tok_s", expect="decrease", min_effect=0.1,
                              baseline_config_id=rows[h.baseline.key].id, treatment_config_id=rows[h.treatment.key].id))
    led.session.refresh(run)
    check_plan(run, plan)  # the same plan: accepted
    run.host = {"run_options": {"aa_check": False, "hypotheses": sorted(h.id for h in plan.hypotheses)}}
    led.commit()
    with pytest.raises(UserError, match=f"run {run.id} was started without an A/A check.*drop --aa-check"):
        check_plan(run, plan, aa_check=True)
    with pytest.raises(UserError, match="this command selects head-regression. Pass the same --only"):
        check_plan(run, make_plan(spec.select(["head-regression"]), resolve=False))
    moved = rows[plan.configs[0].key]
    moved.key = "0" * 20  # a revision that names another commit now gives its config another key
    led.commit()
    led.session.refresh(run)
    with pytest.raises(UserError, match=f"config {moved.label} \\(key 0{{20}}\\) is not planned by the file now"):
        check_plan(run, plan)
    # A run with its hypotheses' rows that lacks a planned config.
    lacking = _run(led, spec)
    kept = [led.add(Config(run_id=lacking.id, key=pc.key, label=pc.label, commit=pc.arm.commit))
            for pc in plan.configs[1:]]
    for h in plan.hypotheses:
        led.add(HypothesisRow(run_id=lacking.id, hid=h.id, metric="tok_s", expect="decrease", min_effect=0.1,
                              baseline_config_id=kept[0].id, treatment_config_id=kept[-1].id))
    led.session.refresh(lacking)
    with pytest.raises(UserError, match=f"key {plan.configs[0].key}\\) is not one of run {lacking.id}'s configs"):
        check_plan(lacking, plan)


# ------------------------------------------------------------------ the loop, through the backend seam


class Seeded:
    """The mock backend's handler (``self.backend``): boots nothing, each request comes
    back ok with samples that depend only on its config and its place among that
    config's good boots (``made`` counts them across backends), so an
    interrupted-and-resumed run sees the values an uninterrupted one does.
    ``stop_after`` boots, the next request records one sample and raises
    KeyboardInterrupt, as a run stopped mid-boot."""

    def __init__(self, made: dict, effects: dict, stop_after: int | None = None):
        self.made, self.effects, self.stop_after = made, effects, stop_after
        self.booted: list[str] = []
        self.backend = MockBackend(self, name="seeded")

    def _samples(self, key: str, k: int) -> tuple:
        import hashlib
        import random

        rng = random.Random(hashlib.sha256(f"{key}:{k}".encode()).digest())
        level = 100.0 * self.effects.get(key, 1.0) * rng.lognormvariate(0.0, 0.08)
        return tuple(SampleOutcome(seq=i + 1, metrics={"tok_s": level * rng.lognormvariate(0.0, 0.01)},
                                   requests=1, output_tokens=10, duration_s=0.1) for i in range(2))

    def __call__(self, r):
        if self.stop_after is not None and len(self.booted) >= self.stop_after:
            return self._cut_short(r)
        k = self.made.get(r.config_key, 0)
        self.made[r.config_key] = k + 1
        self.booted.append(r.config_key)
        return BootOutcome(boot_id=r.boot_id, status="ok", samples=self._samples(r.config_key, k))

    def _cut_short(self, r):
        yield self._samples(r.config_key, -1)[0]
        raise KeyboardInterrupt


SEAM_ENGINE = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}


def _seam_spec(tmp_path, defaults, hypotheses):
    return load_spec(write_spec(tmp_path / "seam.yaml", engine=SEAM_ENGINE, defaults=defaults, hypotheses=hypotheses))


def _looks(db: Path) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for hid, outcome, final, b, t, ratio in query(
            db, "SELECT h.hid, v.outcome, v.final, v.baseline_boot_ids, v.treatment_boot_ids, v.ratio "
                "FROM verdicts v JOIN hypotheses h ON h.id = v.hypothesis_id ORDER BY v.id"):
        out.setdefault(hid, []).append((outcome, bool(final), len(json.loads(b)), len(json.loads(t)),
                                        None if ratio is None else round(ratio, 9)))
    return out


SEAM_HYPOTHESES = [
    {"id": "big", "baseline": {}, "treatment": {"flags": {"x": 1}}, "metric": "tok_s", "expect": "increase",
     "min_effect": "20%"},
    {"id": "none", "baseline": {}, "treatment": {"flags": {"x": 2}}, "metric": "tok_s", "expect": "increase",
     "min_effect": "5%"},
    {"id": "small", "baseline": {}, "treatment": {"flags": {"x": 3}}, "metric": "tok_s", "expect": "increase",
     "min_effect": "5%"},
]


class StopAtLook(Observer):
    """Stops the run (KeyboardInterrupt) right after the ``n``-th look is recorded: between
    the looks of one round, where a SIGKILL can land too."""

    def __init__(self, n: int):
        self.n = n

    def verdict(self, hypothesis, verdict) -> None:
        self.n -= 1
        if self.n == 0:
            raise KeyboardInterrupt


@pytest.mark.parametrize("stop", [("boots", 1), ("boots", 4), ("boots", 9), ("boots", 14), ("looks", 2),
                                  ("looks", 4)], ids=lambda s: f"after-{s[1]}-{s[0]}")
def test_resumed_looks_are_the_looks_an_uninterrupted_run_makes(tmp_path, stop):
    """Stopped after any number of boots, or between two looks of a round, and resumed,
    the run makes the same looks at the same boot counts with the same figures as one
    that was never stopped: none twice, none skipped, and no config past its budget."""
    spec = _seam_spec(tmp_path, {"boots_per_arm": 2, "max_boots_per_arm": 6, "samples_per_boot": 2,
                                 "host_preflight_s": 0}, SEAM_HYPOTHESES)
    plan = make_plan(spec)
    keys = {h.id: h.treatment.key for h in plan.hypotheses}
    effects = {keys["big"]: 1.6, keys["small"]: 1.06}

    ref_db = tmp_path / "ref.db"
    with Ledger(f"sqlite:///{ref_db}") as led:
        Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, order_seed=7,
                 backend=Seeded({}, effects).backend).execute()
    reference = _looks(ref_db)
    assert set(reference) == {"big", "none", "small"} and all(v[-1][1] for v in reference.values())
    assert max(len(v) for v in reference.values()) >= 3  # several looks: there is a "where it stopped"

    db, made = tmp_path / "r.db", {}
    kind, n = stop
    with Ledger(f"sqlite:///{db}") as led:
        with pytest.raises(KeyboardInterrupt):
            Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, order_seed=7,
                     observer=StopAtLook(n) if kind == "looks" else None,
                     backend=Seeded(made, effects, stop_after=n if kind == "boots" else None).backend).execute()
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]
    before = {i for (i,) in query(db, "SELECT id FROM boots WHERE status = 'ok'")}
    with Ledger(f"sqlite:///{db}") as led:  # a new process's view of the ledger
        run = find_run(led, spec, None)
        check_plan(run, plan)
        again = Seeded(made, effects)
        Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=again.backend, resume=run).execute()
    assert query(db, "SELECT COUNT(*), MIN(status) FROM runs") == [(1, "done")]
    assert _looks(db) == reference
    # The boots from before count: only the rest were booted again, and no config passed its budget.
    total = {k: n for k, n in query(db, "SELECT config_key, COUNT(*) FROM boots WHERE status = 'ok' GROUP BY 1")}
    assert len(before) + len(again.booted) == sum(total.values())
    assert max(total.values()) <= 6
    assert total == {k: n for k, n in query(ref_db, "SELECT config_key, COUNT(*) FROM boots WHERE status = 'ok' "
                                                    "GROUP BY 1")}
    (seed,) = {json.loads(s)["order_seed"] for (s,) in query(db, "SELECT stats FROM verdicts")}
    assert seed == 7  # the run's seed carries on; the resumed part's stream is derived from it


class StopAtSearch(Observer):
    """Stops the run (KeyboardInterrupt) as its ``n``-th follow-up search starts."""

    def __init__(self, n: int):
        self.n, self.started = n, []

    def search_started(self, name, budget, reference=None) -> None:
        self.started.append(name)
        if len(self.started) == self.n:
            raise KeyboardInterrupt


def test_a_follow_up_search_is_the_runs_an_interrupted_one_is_resumed_and_a_finished_one_kept(tmp_path):
    """``explain: true`` searches run inside the run: the run ends after them (its after
    calibration too), an interruption in one marks the run interrupted, and --resume
    makes the searches that had not finished, never one that had."""
    hyps = [{"id": hid, "baseline": {}, "treatment": {"flags": {"x": x}}, "metric": "tok_s", "expect": "increase",
             "min_effect": "20%", "explain": True} for hid, x in (("one", 1), ("two", 2))]
    spec = _seam_spec(tmp_path, {"boots_per_arm": 3, "max_boots_per_arm": 6, "samples_per_boot": 2,
                                 "host_preflight_s": 0}, hyps)
    plan = make_plan(spec)
    effects = {h.treatment.key: 1.6 for h in plan.hypotheses}
    db, made = tmp_path / "r.db", {}
    stop = StopAtSearch(2)  # the second explanation starts: the first has ended
    with Ledger(f"sqlite:///{db}") as led:
        with pytest.raises(KeyboardInterrupt):
            Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, observer=stop,
                     backend=Seeded(made, effects).backend).execute()
    assert stop.started == ["explanation", "explanation"]
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]
    (summary,), = query(db, "SELECT summary FROM runs")
    first = json.loads(summary)["explain"]
    assert len(first) == 1 and first[0]["stopped"] == "explained"
    with Ledger(f"sqlite:///{db}") as led:
        run = find_run(led, spec, None)
        check_plan(run, plan)
        again = StopAtSearch(0)
        Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, observer=again,
                 backend=Seeded(made, effects).backend, resume=run).execute()
    assert again.started == ["explanation"]  # only the one that had not finished
    assert query(db, "SELECT status FROM runs") == [("done",)]
    (summary,), = query(db, "SELECT summary FROM runs")
    records = json.loads(summary)["explain"]
    rows = dict(query(db, "SELECT id, hid FROM hypotheses"))
    assert sorted(rows[r["hypothesis_id"]] for r in records) == ["one", "two"]
    (finished,), = query(db, "SELECT finished_at FROM runs")
    assert finished >= max(f for (f,) in query(db, "SELECT finished_at FROM boots"))


def test_a_run_stopped_in_its_explanation_says_so_in_its_journal_and_resume_makes_it_again(tmp_path):
    """A real llama-server run on an H200 was stopped 115 boots into its explanation: its
    journal listed those boots as the verdict's "(unused)" ones and said nothing of the
    search or of --resume. Now the journal names the unfinished search with its boots, the
    verdict's table says whose those boots were, and the header says how to continue."""
    from bisect_harness.report import journal

    spec = _seam_spec(tmp_path, {"boots_per_arm": 3, "max_boots_per_arm": 6, "samples_per_boot": 2,
                                 "host_preflight_s": 0},
                      [{"id": "one", "baseline": {}, "treatment": {"flags": {"x": 1}, "env": {"Y": "1"}},
                        "metric": "tok_s", "expect": "increase", "min_effect": "20%", "explain": True}])
    plan = make_plan(spec)
    effects = {plan.hypotheses[0].treatment.key: 1.6}
    db, made = tmp_path / "r.db", {}
    with Ledger(f"sqlite:///{db}") as led:
        ex = Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False,
                      backend=Seeded(made, effects, stop_after=9).backend)
        with pytest.raises(KeyboardInterrupt):
            ex.execute()
        assert ex.verdicts[plan.hypotheses[0].id].outcome == "confirmed"  # at its first look, on boots 1-6
        text = journal.render(led, ex.run)
    assert "## Explanation: one.treatment (fast) vs one.baseline (slow): not finished" in text
    assert "the run stopped after 4 boots of its configurations (boots 7 to 10, 3 ok)" in text
    assert f"- **continue**: `harness run {spec.path} --resume 1` boots only what this run still lacks" in text
    rows = [line for line in text.splitlines() if line.startswith("| baseline | ") or line.startswith("| treatment | ")]
    later = [line for line in rows if "(booted by the run's explanation, after its rounds)" in line]
    assert later and all(int(line.split("|")[2]) > 6 for line in later)
    assert not any("(unused)" in line for line in rows)
    with Ledger(f"sqlite:///{db}") as led:
        run = find_run(led, spec, None)
        check_plan(run, plan)
        again = Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False,
                         backend=Seeded(made, effects).backend, resume=run)
        text = journal.render(led, again.execute())
    (summary,), = query(db, "SELECT summary FROM runs")
    assert "explaining" not in json.loads(summary) and len(json.loads(summary)["explain"]) == 1
    assert "not finished" not in text and "- **continue**" not in text
    assert "## Explanation: one.treatment (fast) vs one.baseline (slow)\n" in text


def test_the_journal_written_in_the_runs_own_session_holds_its_closing_calibration(tmp_path):
    """The looks read the run's calibrations before the closing one is recorded; the
    journal written at the end, in the same session, must not render that stale list."""
    from bisect_harness.report import journal

    spec = _seam_spec(tmp_path, {"boots_per_arm": 2, "max_boots_per_arm": 3, "samples_per_boot": 2,
                                 "host_preflight_s": 0}, SEAM_HYPOTHESES[:1])
    plan = make_plan(spec)
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = Executor(plan, led, log_dir=tmp_path / "logs", calibrate=True,
                       backend=Seeded({}, {plan.hypotheses[0].treatment.key: 1.6}).backend).execute()
        assert [c.phase for c in run.calibrations] == ["before"]  # read by the looks, before the closing one
        text = journal.render(led, run)
    assert [p for (p,) in query(tmp_path / "r.db", "SELECT phase FROM calibrations")] == ["before", "after"]
    assert "\n- before: " in text and "\n- after: " in text


def test_resume_keeps_the_aa_check_and_decided_verdicts_and_does_not_count_another_hosts_boots(tmp_path):
    spec = _seam_spec(tmp_path, {"boots_per_arm": 2, "max_boots_per_arm": 4, "samples_per_boot": 2,
                                 "host_preflight_s": 0},
                      [{"id": "tiny", "baseline": {}, "treatment": {"flags": {"x": 1}}, "metric": "tok_s",
                        "expect": "increase", "min_effect": "0.1%"},
                       {"id": "huge", "baseline": {}, "treatment": {"flags": {"x": 2}}, "metric": "tok_s",
                        "expect": "increase", "min_effect": "50%"}])
    plan = make_plan(spec)
    db, made = tmp_path / "r.db", {}
    # The A/A check (baseline and its replica, 2 boots each) and two more boots, then a stop.
    with Ledger(f"sqlite:///{db}") as led:
        with pytest.raises(KeyboardInterrupt):
            Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, aa_check=True,
                     backend=Seeded(made, {}, stop_after=5).backend).execute()
    (tiny,) = query(db, "SELECT v.outcome, v.final, v.test FROM verdicts v JOIN hypotheses h "
                        "ON h.id = v.hypothesis_id WHERE h.hid = 'tiny'")
    assert tiny == ("inconclusive", 1, "A/A power check")
    replica_boots = query(db, "SELECT c.key, COUNT(b.id) FROM configs c JOIN boots b ON b.config_id = c.id "
                              "WHERE c.label LIKE '%replica 2%' GROUP BY c.key")
    assert [n for _, n in replica_boots] == [2]
    # One of the treatment's boots ran on another host (as if the run had moved).
    (moved,) = query(db, "SELECT b.id FROM boots b JOIN configs c ON c.id = b.config_id WHERE c.key = ? "
                         "AND b.status = 'ok' ORDER BY b.id LIMIT 1", (plan.hypotheses[1].treatment.key,))
    con = sqlite3.connect(db)
    con.execute("UPDATE boots SET host_fingerprint = 'elsewhere' WHERE id = ?", moved)
    con.commit()
    con.close()

    with Ledger(f"sqlite:///{db}") as led:
        run = find_run(led, spec, None)
        check_plan(run, plan)
        again = Seeded(made, {})
        Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=again.backend, resume=run).execute()
        from bisect_harness.report import journal

        text = journal.render(led, led.run(run.id))
    looks = _looks(db)
    assert looks["tiny"] == [("inconclusive", True, 0, 0, None)]  # decided before: kept, not looked at again
    assert looks["huge"][-1][1]
    # The A/A check was not booted again (the option came from the run, not the command).
    assert replica_boots[0][0] not in again.booted
    assert query(db, "SELECT COUNT(*) FROM boots b JOIN configs c ON c.id = b.config_id WHERE c.key = ?",
                 (replica_boots[0][0],)) == [(2,)]
    # The boot of another host stays in the ledger and feeds no verdict.
    (b_ids, t_ids), = query(db, "SELECT v.baseline_boot_ids, v.treatment_boot_ids FROM verdicts v JOIN hypotheses h "
                                "ON h.id = v.hypothesis_id WHERE h.hid = 'huge' AND v.final = 1")
    assert moved[0] not in json.loads(t_ids)
    (host,), = query(db, "SELECT host FROM runs")
    (record,) = json.loads(host)["resumed"]
    assert record["other_host_ok_boot_ids"] == [moved[0]]
    assert f"1 ok boot from before ({moved[0]}) not counted: they ran on a host with another fingerprint" in text
    assert "1 ok boot not counted (they ran on another host" in text


# ------------------------------------------------------------------ one controller per run


def test_a_held_run_is_refused_naming_the_holder_and_a_killed_holder_leaves_it_free(setup, tmp_path):
    """The run lock names its holder to a refused harness; a SIGKILLed holder loses it
    (the kernel drops it), and its ``running`` row, owned by "another host" that no
    pid check can see, is marked interrupted on the next open: it left its lock free."""
    import socket
    import sys

    from bisect_harness.record import runlock

    spec, led = setup
    run = _run(led, spec, status="running", owner={"pid": 1, "hostname": "elsewhere", "create_time": 0.0})
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom bisect_harness.record import runlock\n"
         f"lock = runlock.hold({led.url!r}, {run.id})\nprint('held', flush=True)\ntime.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(runlock.RunHeld, match=rf"run {run.id} is still running \(harness pid {holder.pid} on "
                                                  rf"{socket.gethostname()}\)"):
            runlock.hold(led.url, run.id)
        with Ledger(led.url) as again:
            assert again.run(run.id).status == "running"  # held: left alone
    finally:
        holder.kill()
        holder.wait(timeout=10)
    with Ledger(led.url) as again:
        row = again.run(run.id)
        assert row.status == "interrupted" and "let go of it without recording its end" in row.error
    lock = runlock.hold(led.url, run.id)  # free again
    lock.release()
    assert runlock.lock_path(led.url, run.id).exists() is False


@pytest.mark.slow
def test_two_resumes_of_one_run_at_once_one_runs_it_the_other_is_refused_naming_it(tmp_path, harness_cache):
    """Two ``harness run --resume`` of one interrupted run started together: one takes
    it up and ends it, the other is refused (exit 2) naming the first one's pid and
    host; one final verdict per hypothesis, no config past its budget."""
    import socket

    create_demo_repo(tmp_path / "engine")
    hypotheses = [HYPOTHESES[1]]
    spec_path = write_spec(tmp_path / "hypotheses.yaml", engine={"preset": "demo", "repo": "engine"},
                           benchmark=SMALL_BENCH, hypotheses=hypotheses,
                           defaults={"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 2})
    db = tmp_path / "r.db"
    with Ledger(f"sqlite:///{db}") as led:  # a run interrupted before its first boot
        run_id = _run(led, load_spec(spec_path)).id
    common = ["--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir", str(tmp_path / "exp")]
    procs = [subprocess.Popen([*HARNESS, "run", str(spec_path), "--resume", *common], cwd=tmp_path,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [err[-2000:] for _out, err in outs]
    winner, loser = (0, 1) if procs[0].returncode == 0 else (1, 0)
    refusal = " ".join(outs[loser][1].split())
    assert f"run {run_id} is still running (harness pid {procs[winner].pid} on {socket.gethostname()})" in refusal
    assert "Traceback" not in refusal
    finals = query(db, "SELECT h.hid, COUNT(*) FROM verdicts v JOIN hypotheses h ON h.id = v.hypothesis_id "
                       "WHERE v.final = 1 GROUP BY h.hid")
    assert finals == [(hypotheses[0]["id"], 1)]
    assert query(db, "SELECT COUNT(*) FROM hypotheses") == [(1,)]
    for config_id, good in query(db, "SELECT config_id, COUNT(*) FROM boots WHERE status = 'ok' GROUP BY config_id"):
        assert good <= 2, f"config {config_id} has {good} good boots, more than 2"
    assert query(db, "SELECT status FROM runs") == [("done",)]
    (host,), = query(db, "SELECT host FROM runs")
    assert len(json.loads(host)["resumed"]) == 1  # taken up once
    assert not list(tmp_path.glob("r.db.run-*.lock"))  # ended: the lock is gone with it
