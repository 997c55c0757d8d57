"""A live run on the demo engine with a CPU burner of the test's own during one boot:
that boot is marked host_busy with the figures that crossed, the others are not,
and the verdict's warnings, the journal and --json say so.

The burner is started when the ledger shows the chosen boot row (written before the
server starts, so the burner runs through that boot's whole benchmark window) and
stopped when the ledger shows that boot finished (before the next boot's server is
even started). On a host where other jobs run beside the test suite, the "quiet"
boots may be busy for real: the assertion messages print the recorded figures so a
failure says whose CPU it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from helpers import HARNESS, last_json, query, wait_for

pytestmark = pytest.mark.slow

SPEC = textwrap.dedent("""\
    version: 1
    engine: {preset: demo}
    benchmark: {prompt_tokens: 16, output_tokens: 32, requests_per_sample: 3, warmup_requests: 1}
    defaults: {samples_per_boot: 2, boots_per_arm: 2, max_boots_per_arm: 2, boot_retries: 0,
               host_check: mark, host_preflight_s: 0,
               host_thresholds: {steal: 1.0, cpu_pressure: 1.0, io_pressure: 1.0, memory_pressure: 1.0}}
    hypotheses:
      - id: decode-mode
        baseline: {commit: HEAD}
        treatment: {commit: HEAD, flags: {attention-mode: decode}}
        metric: tok_s
        expect: increase
        min_effect: 5%
    """)

# The host-wide figures (the hypervisor's steal, PSI pressure) are switched off above:
# on a shared CI machine they cross on their own (10% steal was seen), and what these
# tests make is a foreign process, which the per-process figures attribute.

#: Two busy loops (one per core of a 2-core CI runner), each with its own deadline.
BURN = "import time\nend = time.time() + 120\nwhile time.time() < end: pass"
BUSY_BOOT = 2  # the second boot of the run: either side's, as the order inside a round is random


def burner(n: int = 2) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True, stdin=subprocess.DEVNULL)
            for _ in range(max(2, n))]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


def run_with_burner(tmp_path, spec_text: str, busy_boot: int = BUSY_BOOT):
    """``harness run --json`` with the test's burner running through boot ``busy_boot``
    only; returns the finished process's (returncode, stdout, stderr) and the ledger path."""
    spec = tmp_path / "hypotheses.yaml"
    spec.write_text(spec_text)
    db = tmp_path / "r.db"
    out, err = open(tmp_path / "out.txt", "w+"), open(tmp_path / "err.txt", "w+")
    proc = subprocess.Popen([*HARNESS, "run", str(spec), "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                             "--journal-dir", str(tmp_path / "exp")], stdout=out, stderr=err,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    burn: list[subprocess.Popen] = []
    try:
        def boot_status(bid):
            if not db.exists():
                return None
            try:
                rows = query(db, "select status from boots where id = ?", (bid,))
            except Exception:  # the ledger is being created
                return None
            return rows[0][0] if rows else None

        wait_for(lambda: boot_status(busy_boot) or proc.poll() is not None, timeout=300, interval=0.05,
                 what=f"boot {busy_boot} to start")
        burn = burner(len(os.sched_getaffinity(0)))
        wait_for(lambda: boot_status(busy_boot) not in (None, "running") or proc.poll() is not None, timeout=300,
                 interval=0.05, what=f"boot {busy_boot} to finish")
        stop(burn)
        proc.wait(timeout=300)
    finally:
        stop(burn)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    out.seek(0)
    err.seek(0)
    return proc.returncode, out.read(), err.read(), db


def recorded(db):
    """Per boot: (id, status, marks, contention record), and a readable dump of the figures."""
    rows = [(bid, status, json.loads(marks), json.loads(prov).get("contention"))
            for bid, status, marks, prov in query(db, "select id, status, marks, provenance from boots order by id")]
    seen = "\n".join(f"boot {bid} {status}: crossed {rec and rec['crossed']} figures {rec and rec['window']['figures']}"
                     for bid, status, _, rec in rows)
    return rows, seen


def side_of(db, boot_id: int) -> tuple[str, str]:
    """(this side, the other side) of a boot: the treatment is the config with the flag."""
    (flags,), = query(db, "select c.flags from boots b join configs c on c.id = b.config_id where b.id = ?",
                      (boot_id,))
    return ("treatment", "baseline") if "attention-mode" in flags else ("baseline", "treatment")


def test_boots_run_beside_a_burner_are_marked_host_busy_and_said_so(tmp_path):
    returncode, stdout, stderr, db = run_with_burner(tmp_path, SPEC)
    assert returncode == 0, stderr
    rows, seen = recorded(db)
    side, other = side_of(db, BUSY_BOOT)
    figures = {bid: rec for bid, _, _, rec in rows}
    busy = [bid for bid, _, marks, _ in rows if "host_busy" in marks]
    assert busy == [BUSY_BOOT], seen
    crossed = {c["figure"] for c in figures[BUSY_BOOT]["crossed"]}
    assert "foreign_cpu_share" in crossed, seen
    assert figures[BUSY_BOOT]["window"]["figures"]["foreign_cpu"] > 0.5, seen  # our burner's CPU, in cores
    assert len(figures[BUSY_BOOT]["samples"]) == 2  # one window per benchmark sample as well
    assert all(status == "ok" for _, status, _, _ in rows)  # mark: kept, and used

    verdict = last_json(stdout)["hypotheses"][0]
    warnings = verdict["warnings"]
    assert f"{side} boot {BUSY_BOOT}: host_busy" in warnings
    busy_line = next(w for w in warnings if w.startswith(f"host busy during {side} boot {BUSY_BOOT}: "))
    assert "CPU used by other processes" in busy_line and "python" in busy_line
    assert any(w.startswith("contention differed between the sides: ") and f"{side} 1 of 2 boots busy" in w
               and f"{other} 0 of 2 boots busy" in w for w in warnings), warnings
    assert not any(f"boot {b}" in w for w in warnings for b in (1, 3, 4)), warnings

    journal = next((tmp_path / "exp").glob("*-run*.md")).read_text()
    assert "The two sides ran on the same host state" not in journal
    assert f"but not in the same host state: 1 of 2 {side} boots ran on a busy host" in journal
    assert "host_busy x1" in journal and "contention differs" in journal
    assert journal.count("**above thresholds**") == 1
    assert "host_busy" in stderr  # the CLI's verdict table and progress say it too


def test_retry_leaves_the_busy_boot_out_and_boots_the_config_again(tmp_path):
    spec = SPEC.replace("host_check: mark", "host_check: retry, host_wait_s: 30")
    returncode, stdout, stderr, db = run_with_burner(tmp_path, spec)
    assert returncode == 0, stderr
    rows, seen = recorded(db)
    status = {bid: (st, "host_busy" in marks) for bid, st, marks, _ in rows}
    side, _ = side_of(db, BUSY_BOOT)
    assert status[BUSY_BOOT] == ("excluded", True), seen
    assert [bid for bid, (st, busy) in status.items() if busy] == [BUSY_BOOT], seen
    assert len(rows) == 5 and all(st == "ok" for bid, (st, _) in status.items() if bid != BUSY_BOOT), seen
    verdict = last_json(stdout)["hypotheses"][0]
    assert verdict["boots"] == {"baseline": 2, "treatment": 2}  # the re-boot took the busy boot's place
    assert any(w.startswith(f"host busy during {side} boot {BUSY_BOOT}: ") for w in verdict["warnings"])


FAILING_ENGINE = textwrap.dedent("""\
    version: 1
    engine: {preset: openai, launch: ["{python}", "-c", "raise SystemExit(3)"], ready_timeout_s: 30}
    defaults: {samples_per_boot: 1, boots_per_arm: 2, max_boots_per_arm: 2, boot_retries: 0, host_preflight_s: 1}
    hypotheses:
      - {id: h, baseline: {}, treatment: {env: {X: "1"}}, metric: tok_s, expect: increase, min_effect: 5%}
    """)


def test_preflight_names_the_busy_processes_before_any_boot_and_wait_quiet_waits(tmp_path):
    spec = tmp_path / "hypotheses.yaml"
    spec.write_text(FAILING_ENGINE)  # its boots fail at once: the test is about what comes before them
    db = tmp_path / "r.db"
    burn = burner(len(os.sched_getaffinity(0)))
    try:
        proc = subprocess.run([*HARNESS, "run", str(spec), "--no-calibration", "--ledger", f"sqlite:///{db}",
                               "--journal-dir", str(tmp_path / "exp"), "--wait-quiet", "4"],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    finally:
        stop(burn)
    err = " ".join((proc.stdout + proc.stderr).split())  # no --json: the console is stdout; rich wraps lines
    assert proc.returncode == 3, proc.stderr  # no config ever booted: not measured (exit 3), said so
    assert "never booted" in err
    busy_at = err.find("host busy at the start of the run (before the first boot: ")
    assert busy_at >= 0, err
    assert "-c import time end = time.time()" in err[busy_at:] and "(pid " in err[busy_at:]  # our burner
    assert "--wait-quiet" in err[busy_at:]
    assert "host busy, waiting:" in err and err.find("host busy, waiting:") < busy_at
    (result, created), = query(db, "select result, created_at from calibrations where phase = 'preflight'")
    pre = json.loads(result)
    assert 2 <= pre["waited_s"] <= 4 + 2 and "foreign_cpu_share" in {c["figure"] for c in pre["crossed"]}
    first_boot = query(db, "select min(started_at) from boots")[0][0]
    assert created <= first_boot  # judged and recorded before any boot was spent


def test_doctor_prints_real_warnings_on_a_busy_host(tmp_path):
    burn = burner(len(os.sched_getaffinity(0)))
    try:
        proc = subprocess.run([*HARNESS, "doctor", "--json", "--seconds", "0.5"], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=300)
    finally:
        stop(burn)
    assert proc.returncode == 0, proc.stderr
    report = last_json(proc.stdout)
    assert report["ok"] is False
    fields = {w["field"] for w in report["warnings"]}
    assert "contention.foreign_cpu_share" in fields, report["warnings"]
    assert report["contention"]["details"]["top_foreign"][0]["name"].startswith("python")


def test_a_preflight_without_wait_quiet_runs_beside_the_first_boot_and_names_the_busy_processes(tmp_path):
    spec = tmp_path / "hypotheses.yaml"
    spec.write_text(FAILING_ENGINE.replace("host_preflight_s: 1", "host_preflight_s: 1.5"))
    db = tmp_path / "r.db"
    burn = burner(len(os.sched_getaffinity(0)))
    try:
        proc = subprocess.run([*HARNESS, "run", str(spec), "--no-calibration", "--ledger", f"sqlite:///{db}",
                               "--journal-dir", str(tmp_path / "exp")],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    finally:
        stop(burn)
    err = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 3, proc.stderr
    busy_at = err.find("host busy at the start of the run (beside the first boot: ")
    assert busy_at >= 0, err
    assert "-c import time end = time.time()" in err[busy_at:] and "host busy, waiting:" not in err
    (result, created), = query(db, "select result, created_at from calibrations where phase = 'preflight'")
    pre = json.loads(result)
    assert pre["watched"] == "beside the first boot" and pre["waited_s"] == 0
    # the whole window was watched although the first boot failed at once, and the boot did not wait for it
    assert pre["contention"]["seconds"] >= 1.0, pre["contention"]
    assert "foreign_cpu_share" in {c["figure"] for c in pre["crossed"]}
    first_boot = query(db, "select min(started_at) from boots")[0][0]
    assert first_boot < created
