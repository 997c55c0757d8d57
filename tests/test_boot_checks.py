"""Boot checks with consequences: env that does not reach the workers can exclude a boot
or stop the run, and the A/A power check refuses claims the run cannot resolve."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SPEC = textwrap.dedent("""\
    version: 1
    engine: {{preset: demo}}
    benchmark: {{prompt_tokens: 16, output_tokens: 24, requests_per_sample: 2, warmup_requests: 1}}
    defaults: {{samples_per_boot: 1, boots_per_arm: 2, max_boots_per_arm: 2, boot_retries: 0, env_check: {mode}}}
    hypotheses:
      - id: {hid}
        baseline: {{commit: HEAD}}
        treatment: {{commit: HEAD, env: {{{env}}}}}
        metric: tok_s
        expect: increase
        min_effect: {effect}
    """)


def harness(tmp_path, spec_text, *extra):
    spec = tmp_path / "hypotheses.yaml"
    spec.write_text(spec_text)
    proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "run", str(spec), "--json", "--no-calibration",
                           "--ledger", f"sqlite:///{tmp_path / 'r.db'}", "--journal-dir", str(tmp_path / "exp"),
                           *extra], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    return proc


def boots(tmp_path):
    db = sqlite3.connect(tmp_path / "r.db")
    try:
        return db.execute("select b.status, b.marks, c.env from boots b join configs c on c.id = b.config_id "
                          "order by b.id").fetchall()
    finally:
        db.close()


def test_env_check_fatal_stops_the_run_naming_the_variable(tmp_path):
    # At the demo's HEAD the workers start from a scrubbed env: DEMO_* never reaches them.
    proc = harness(tmp_path, SPEC.format(mode="fatal", hid="tuning", env='DEMO_COMM_TUNING: "1"', effect="10%"))
    assert proc.returncode == 2, proc.stderr
    assert "DEMO_COMM_TUNING" in proc.stderr and "env_check" in proc.stderr
    assert "Traceback" not in proc.stderr
    rows = boots(tmp_path)
    assert any(status == "fatal" and "env_missing" in marks for status, marks, _ in rows)
    db = sqlite3.connect(tmp_path / "r.db")
    assert db.execute("select status from runs").fetchone()[0] == "failed"


def test_env_check_exclude_keeps_the_boots_but_not_in_the_verdict(tmp_path):
    proc = harness(tmp_path, SPEC.format(mode="exclude", hid="tuning", env='DEMO_COMM_TUNING: "1"', effect="10%"))
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])["hypotheses"][0]
    assert verdict["verdict"] == "inconclusive"
    assert "excluded" in verdict["reason"]
    treated = [(s, m) for s, m, env in boots(tmp_path) if "DEMO_COMM_TUNING" in env]
    assert treated and all(s == "excluded" and "env_missing" in m for s, m in treated)


def test_aa_check_refuses_effects_below_the_noise_floor(tmp_path):
    # 0.001%: no two boots per side of a measured tok/s come within that; 0.5% did, once in CI
    # (two boots' spread is a chi-square with one degree of freedom, small by chance now and then).
    proc = harness(tmp_path, SPEC.format(mode="mark", hid="tiny", env='DEMO_UNUSED: "1"', effect="0.001%"),
                   "--aa-check")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])["hypotheses"][0]
    assert verdict["verdict"] == "inconclusive"
    assert "smallest effect this run can resolve" in verdict["reason"]
    assert "A/A check" in proc.stderr
    # the power check spent the baseline and its replica, and nothing on the refused treatment
    assert not [1 for _, _, env in boots(tmp_path) if "DEMO_UNUSED" in env]


def test_a_metric_that_cannot_be_compared_gives_a_recorded_verdict_not_a_crash(tmp_path):
    # demo_running_requests is 0 once a sample's requests are done: there is no ratio to test.
    spec = textwrap.dedent("""\
        version: 1
        engine:
          preset: demo
          metrics:
            - {name: running, from: prometheus, metric: demo_running_requests, kind: gauge, better: lower}
        benchmark: {prompt_tokens: 16, output_tokens: 16, requests_per_sample: 1, warmup_requests: 0}
        defaults: {samples_per_boot: 1, boots_per_arm: 2, max_boots_per_arm: 2}
        hypotheses:
          - id: running
            baseline: {commit: HEAD}
            treatment: {commit: HEAD, flags: {attention-mode: decode}}
            metric: running
            expect: decrease
            min_effect: 10%
        """)
    proc = harness(tmp_path, spec)
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])["hypotheses"][0]
    assert verdict["verdict"] == "inconclusive"
    assert "metric running cannot be compared" in verdict["reason"] and "positive" in verdict["reason"]
    assert verdict["boots"] == {"baseline": 2, "treatment": 2}
