"""``profile: true`` and ``harness run --profile``: which boots take the profiled sample,
and what a profiled boot of the real demo engine records.

The choice is the scheduler's (``ConfigState.wants_profile``), checked through the
backend seam: the mock backend, answering each request with the profile state the
test scripts, as ``run_boot`` would record it. The last test runs the real
``harness run`` on the demo engine: a profiled boot keeps its measured samples, and
its extra sample is a trace beside its log and a summary in the ledger.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bisect_harness.backends.mock import MockBackend, failed
from bisect_harness.boot import BootOutcome, SampleOutcome
from bisect_harness.evidence import BootEvidence
from bisect_harness.errors import SpecError
from bisect_harness.spec import load_spec
from bisect_harness.run.executor import Executor
from bisect_harness.run.resume import find_run
from bisect_harness.run.scheduler import PROFILE_ATTEMPTS
from bisect_harness.plan.build import make_plan
from bisect_harness.record.ledger import Ledger
from helpers import SMALL_BENCH, harness, last_json, query, write_spec

SEAM_ENGINE = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}
DEFAULTS = {"boots_per_arm": 2, "max_boots_per_arm": 3, "samples_per_boot": 2, "host_preflight_s": 0,
            "boot_retries": 2}


def _hyps(profiled: bool = True) -> list[dict]:
    return [{"id": "slow", "baseline": {}, "treatment": {"flags": {"x": 1}}, "metric": "tok_s",
             "expect": "decrease", "min_effect": "10%", **({"profile": True} if profiled else {})},
            {"id": "other", "baseline": {}, "treatment": {"flags": {"x": 2}}, "metric": "tok_s",
             "expect": "decrease", "min_effect": "10%"}]


class Script:
    """The mock backend's handler: boots nothing. A request's outcome is ok with two
    samples, except where ``script`` (config key -> list of answers for its profiled
    boots, in order) says otherwise: ``"boot_failed"`` (the boot failed before its
    profile), or a profile state that the boot records (``taken``, ``failed``,
    ``no_profiler``). ``stop_after`` boots, it stops the run as an interrupt would."""

    def __init__(self, script: dict, stop_after: int | None = None):
        self.script = {k: list(v) for k, v in script.items()}
        self.stop_after = stop_after
        self.booted = []
        self.backend = MockBackend(self, name="scripted")

    def __call__(self, r):
        if self.stop_after is not None and len(self.booted) >= self.stop_after:
            raise KeyboardInterrupt
        self.booted.append(r)
        samples = tuple(SampleOutcome(seq=i + 1, metrics={"tok_s": 100.0 + i}, requests=1, output_tokens=8,
                                      duration_s=0.1) for i in range(2))
        answer = (self.script.get(r.config_key) or ["taken"]).pop(0) if r.profile else None
        if answer == "boot_failed":
            return failed("the server exited 1")
        profile = {"state": answer, "why": "" if answer == "taken" else "scripted"} if answer else None
        return BootOutcome(boot_id=r.boot_id, status="ok", samples=samples, evidence=BootEvidence(profile=profile))

    def profiled(self, key: str) -> list[bool]:
        """Which boots of the config ``key`` asked for the profile, in order."""
        return [r.profile for r in self.booted if r.config_key == key]


def _plan(tmp_path, hyps, defaults=DEFAULTS):
    return make_plan(load_spec(write_spec(tmp_path / "h.yaml", engine=SEAM_ENGINE, defaults=defaults,
                                          hypotheses=hyps)))


def test_each_arm_of_a_profiled_hypothesis_takes_one_profiled_boot_and_no_other_config_does(tmp_path):
    plan = _plan(tmp_path, _hyps())
    slow, other = plan.hypotheses
    base, treat, treat2 = slow.baseline.key, slow.treatment.key, other.treatment.key
    assert other.baseline.key == base  # shared: profiled as an arm of "slow"
    assert [plan.profiles(c) for c in plan.configs] == [True, True, False]
    # the treatment's first profiled boot fails before its profile: the next boot takes it
    script = Script({treat: ["boot_failed", "taken"]})
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=script.backend).execute()
    assert script.profiled(base) == [True, False]
    assert script.profiled(treat) == [True, True, False]
    assert script.profiled(treat2) == [False, False]
    # the profile is no sample: every ok boot has the samples the backend measured
    counts = query(tmp_path / "r.db", "SELECT b.status, COUNT(s.id) FROM boots b LEFT JOIN samples s "
                                      "ON s.boot_id = b.id GROUP BY b.id")
    assert {n for status, n in counts if status == "ok"} == {2}


def test_a_profile_that_keeps_failing_is_tried_twice_and_no_profiler_once(tmp_path):
    plan = _plan(tmp_path, _hyps()[:1], {**DEFAULTS, "boots_per_arm": 3})
    (h,) = plan.hypotheses
    script = Script({h.baseline.key: ["failed"] * 5, h.treatment.key: ["no_profiler"] * 5})
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=script.backend).execute()
    assert script.profiled(h.baseline.key) == [True] * PROFILE_ATTEMPTS + [False] * (3 - PROFILE_ATTEMPTS)
    assert script.profiled(h.treatment.key) == [True, False, False]
    states = query(tmp_path / "r.db", "SELECT json_extract(provenance, '$.profile.state') FROM boots ORDER BY id")
    assert sorted(s for (s,) in states if s) == ["failed", "failed", "no_profiler"]


def test_run_profile_is_kept_by_a_resume_that_does_not_pass_it_again(tmp_path):
    plan = _plan(tmp_path, _hyps(profiled=False))
    assert not any(plan.profiles(c) for c in plan.configs)
    db = tmp_path / "r.db"
    first = Script({}, stop_after=2)  # the run is stopped after two boots
    with Ledger(f"sqlite:///{db}") as led:
        with pytest.raises(KeyboardInterrupt):
            Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=first.backend,
                     profile=True).execute()
    (host,), = query(db, "SELECT host FROM runs")
    assert json.loads(host)["run_options"]["profile"] is True
    booted = {r.config_key for r in first.booted}
    assert all(r.profile for r in first.booted), "--profile: each config's first boot is profiled"
    again = Script({})
    with Ledger(f"sqlite:///{db}") as led:
        run = find_run(led, plan.spec, None)
        Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=again.backend, resume=run).execute()
    for c in plan.configs:
        # a config profiled before the stop is not profiled again; the others get theirs now
        assert again.profiled(c.key)[:1] == ([False] if c.key in booted else [True]), c.label
        assert sum(again.profiled(c.key)) == (0 if c.key in booted else 1)


def test_profile_must_be_a_boolean_and_the_dry_run_says_which_configs_are_profiled(tmp_path):
    hyps = _hyps()
    hyps[0]["profile"] = "yes"
    path = write_spec(tmp_path / "bad.yaml", engine=SEAM_ENGINE, hypotheses=hyps)
    with pytest.raises(SpecError, match=r"hypotheses\[0\]\.profile.*true or false"):
        load_spec(path)

    spec = write_spec(tmp_path / "h.yaml", engine=SEAM_ENGINE, hypotheses=_hyps(profiled=False))
    r = harness("run", spec, "--dry-run", "--json", "--profile", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = last_json(r.stdout)
    assert [c["profile"] for c in plan["configs"]] == ["none"] * 3  # openai: "no profiler endpoint"
    assert all(h["profile"] for h in plan["hypotheses"])
    r = harness("run", spec, "--dry-run", "--profile", cwd=tmp_path)
    assert r.stdout.count("profile: one extra sample after the measured ones of a boot, profiler none "
                          "(no profiler endpoint: the sample is not taken)") == 3
    r = harness("run", spec, "--dry-run", "--json", cwd=tmp_path)
    assert [c["profile"] for c in last_json(r.stdout)["configs"]] == [None] * 3


@pytest.mark.slow
def test_a_profiled_demo_boot_keeps_its_samples_and_records_a_trace_and_its_summary(tmp_path):
    """The real demo engine on CPU: the first boot of each arm takes a profiled sample
    through POST /start_profile and /stop_profile; its measured samples are as many as any
    boot's, the trace lies beside its log and the ledger holds the summary per token."""
    hyps = [{"id": "spec", "baseline": {"commit": "HEAD"},
             "treatment": {"commit": "HEAD", "flags": {"speculative-num-steps": 2}},
             "metric": "tok_s", "expect": "decrease", "min_effect": "10%", "profile": True}]
    spec = write_spec(tmp_path / "h.yaml", engine={"preset": "demo", "flags": {"device": "cpu", "threads": 1}},
                      benchmark=SMALL_BENCH, hypotheses=hyps,
                      defaults={"samples_per_boot": 2, "boots_per_arm": 2, "max_boots_per_arm": 2,
                                "boot_retries": 0, "host_preflight_s": 0})
    db = tmp_path / "r.db"
    r = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                "--journal-dir", tmp_path / "exp", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    boots = query(db, "SELECT b.id, b.seq, b.status, b.provenance, c.flags, "
                      "(SELECT COUNT(*) FROM samples s WHERE s.boot_id = b.id) FROM boots b "
                      "JOIN configs c ON c.id = b.config_id ORDER BY b.id")
    assert len(boots) == 4 and all(status == "ok" for _, _, status, *_ in boots), boots
    assert all(n == 2 for *_, n in boots), "a profiled boot measures as many samples as any other"
    by_arm = {}
    for boot_id, seq, _, prov, flags, _ in boots:
        prof = json.loads(prov).get("profile")
        assert (prof is not None) == (seq == 1), (boot_id, seq, prof)  # the first boot of each arm alone
        if prof:
            by_arm[json.loads(flags).get("speculative-num-steps", 0)] = (boot_id, prof)
    assert set(by_arm) == {0, 2}
    tokens = SMALL_BENCH["requests_per_sample"] * SMALL_BENCH["output_tokens"]
    for steps_per_cycle, (boot_id, prof) in by_arm.items():
        assert prof["state"] == "taken" and prof["why"] == "" and prof["profiler"] == "demo", prof
        assert prof["tokens"] == tokens and prof["requests"] == SMALL_BENCH["requests_per_sample"]
        trace = Path(prof["trace"])
        assert prof["kept"] and trace == tmp_path / "exp" / "logs" / "run-1" / f"boot-{boot_id}.trace.json.gz"
        assert trace.stat().st_size == prof["trace_bytes"] > 0
        assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
        summary = prof["summary"]
        assert summary["tokens"] == tokens and summary["ops"] and summary["op_ms"] > 0
        # every request's tokens after its first come from a decode step, or several from a verify
        per_request = SMALL_BENCH["output_tokens"] - 1
        if steps_per_cycle == 0:
            assert prof["steps"] == summary["steps"] == SMALL_BENCH["requests_per_sample"] * per_request
        else:
            assert SMALL_BENCH["requests_per_sample"] <= prof["steps"] < SMALL_BENCH["requests_per_sample"] * per_request
    assert not list((tmp_path / "exp" / "logs" / "run-1").glob("*.profile")), "the engine's folders are gone"
    # the journal and --json set the two arms side by side (report/profile_view.py)
    (h,) = last_json(r.stdout)["hypotheses"]
    assert [h["profile"][side]["boot"] for side in ("baseline", "treatment")] == [by_arm[0][0], by_arm[2][0]]
    assert h["profile"]["difference"]
    (path,) = (tmp_path / "exp").glob("*-run1.md")
    text = path.read_text()
    assert f"- baseline (boot {by_arm[0][0]}, demo): {tokens} tokens from 2 request(s) in " in text
    assert f"[trace](logs/run-1/boot-{by_arm[2][0]}.trace.json.gz)" in text
    assert "| kind | name | baseline ms/token | treatment ms/token | difference |" in text
