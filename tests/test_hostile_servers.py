"""Servers that misbehave, through the real ``harness run``: each misbehaviour ends as a
recorded boot (marked, or failed with its reason) or a clear exit code, never a crash
and never a number believed. The server is ``hostile_engine.py``, one mode per case."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import harness, last_json, query, run_inert_pair, write_spec

pytestmark = pytest.mark.slow

ENGINE = Path(__file__).parent / "hostile_engine.py"
BENCH = {"prompt_tokens": 4, "output_tokens": 8, "requests_per_sample": 2, "warmup_requests": 0,
         "ignore_eos": False}


def _run(tmp_path: Path, mode: str):
    return run_inert_pair(tmp_path, ENGINE, mode, benchmark=BENCH)


def test_a_count_below_the_chunks_marks_the_boot_and_the_counted_tokens_stand(tmp_path):
    proc, db = _run(tmp_path, "low-usage")
    assert proc.returncode == 0, proc.stderr[-3000:]
    boots = query(db, "SELECT status, marks, provenance FROM boots")
    assert boots and all(s == "ok" and "usage_mismatch" in json.loads(m) for s, m, _ in boots), boots
    prov = json.loads(boots[0][2])["usage_mismatch"]
    assert prov["requests"] >= 2 and "counted 1 output tokens for 8 chunks" in prov["example"]
    tokens = query(db, "SELECT output_tokens, requests FROM samples")
    assert tokens and all(t == 8 * r for t, r in tokens), tokens
    # killed by the harness's SIGTERM, as asked: a clean stop
    assert all(json.loads(p)["stop"] == {"exit_code": -15, "clean": True} for *_, p in boots), boots


def test_a_server_that_exits_non_zero_at_the_stop_is_said_and_its_samples_count(tmp_path):
    proc, db = _run(tmp_path, "exit-1-at-stop")
    assert proc.returncode == 0, proc.stderr[-3000:]
    boots = query(db, "SELECT status, marks, provenance FROM boots")
    assert len(boots) == 4 and all(s == "ok" and "stop_unclean" in json.loads(m) for s, m, _ in boots), boots
    stop = json.loads(boots[0][2])["stop"]
    assert stop["exit_code"] == 1 and not stop["clean"] and "exited 1 when the harness stopped it" in stop["note"]
    assert query(db, "SELECT count(*) FROM samples") == [(4,)]
    (h,) = last_json(proc.stdout)["hypotheses"]
    assert h["boots"] == {"baseline": 2, "treatment": 2}


@pytest.mark.parametrize("mode, reason", [
    ("wrong-shape", "choices is list [1], not a list of objects"),
    ("huge-usage", "more than the 8 tokens the request allowed"),
])
def test_a_stream_that_cannot_be_true_fails_its_boots_and_the_run_says_not_measured(tmp_path, mode, reason):
    proc, db = _run(tmp_path, mode)
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-3000:])
    boots = query(db, "SELECT status, failure FROM boots")
    assert boots and all(s == "failed" and reason in (f or "") for s, f in boots), boots
    assert query(db, "SELECT count(*) FROM samples") == [(0,)]
    (status,), = query(db, "SELECT status FROM runs")
    assert status != "running"
    out = last_json(proc.stdout) if proc.stdout.strip() else {}
    if out:
        assert all(h["verdict"] != "confirmed" for h in out["hypotheses"])


@pytest.mark.parametrize("flood_mb, limits", [(100, None), (8, {"log_head_bytes": "1 MiB", "log_tail_bytes": "2 MiB"})])
def test_a_server_that_floods_its_log_leaves_a_capped_log_and_says_how_much_was_dropped(tmp_path, flood_mb, limits):
    import yaml

    from bisect_harness.process.capped_log import LOG_HEAD_BYTES, LOG_TAIL_BYTES

    engine = {"preset": "openai", "ready_timeout_s": 60,
              "launch": [sys.executable, str(ENGINE), "--port", "{port}", "--mode", "log-flood",
                         "--flood-mb", str(flood_mb)]}
    hyp = [{"id": "h", "baseline": {}, "treatment": {"env": {"BH_INERT": "1"}},
            "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}]
    spec = write_spec(tmp_path / "h.yaml", engine=engine, benchmark=BENCH, hypotheses=hyp,
                      defaults={"boots_per_arm": 2, "max_boots_per_arm": 2, "samples_per_boot": 1,
                                "boot_retries": 0, "host_preflight_s": 0})
    if limits:  # the spec's own caps reach the supervisor that writes the log
        doc = yaml.safe_load(spec.read_text())
        spec.write_text(yaml.safe_dump({**doc, "limits": limits}, sort_keys=False))
        LOG_HEAD_BYTES, LOG_TAIL_BYTES = 1 << 20, 2 << 20
    db = tmp_path / "r.db"
    proc = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                   "--journal-dir", tmp_path / "exp", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    boots = query(db, "SELECT status, marks, provenance FROM boots")
    assert len(boots) == 4 and all(s == "ok" and "log_capped" in json.loads(m) for s, m, _ in boots), boots
    log = json.loads(boots[0][2])["log"]
    assert log["bytes_written"] >= flood_mb << 20
    assert log["bytes_dropped"] == log["bytes_written"] - LOG_HEAD_BYTES - LOG_TAIL_BYTES
    logs = list((tmp_path / "exp" / "logs").rglob("*.log"))
    assert logs and all(p.stat().st_size < LOG_HEAD_BYTES + LOG_TAIL_BYTES + (1 << 20) for p in logs)


def test_a_server_that_listens_beyond_loopback_is_marked_and_the_socket_named(tmp_path):
    proc, db = _run(tmp_path, "listen-wide")
    assert proc.returncode == 0, proc.stderr[-3000:]
    boots = query(db, "SELECT status, marks, provenance, port FROM boots")
    assert len(boots) == 4 and all(s == "ok" and "listens_beyond_loopback" in json.loads(m) for s, m, *_ in boots)
    listening = json.loads(boots[0][2])["listening"]
    sockets = {(s["address"], s["port"]) for s in listening["sockets"]}
    assert ("127.0.0.1", boots[0][3]) in sockets  # where the harness asked it to serve
    (wide,) = listening["beyond_loopback"]
    assert wide.startswith("0.0.0.0:") and "(python" in wide


def test_a_server_on_loopback_only_is_not_marked(tmp_path):
    proc, db = _run(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr[-3000:]
    boots = query(db, "SELECT marks, provenance, port FROM boots")
    assert boots and all("listens_beyond_loopback" not in json.loads(m) for m, *_ in boots)
    listening = json.loads(boots[0][1])["listening"]
    assert listening["beyond_loopback"] == []
    assert any((s["address"], s["port"]) == ("127.0.0.1", boots[0][2]) for s in listening["sockets"]), listening
