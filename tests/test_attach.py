"""Attach mode: ``engine.base_url`` (a server someone else runs) and an API key from
``engine.api_key_env``, against real servers on loopback that refuse requests without
the bearer token (``auth_engine.py``), through the real ``harness run``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from bisect_harness.errors import SpecError
from bisect_harness.engines.server import free_port
from bisect_harness.spec import parse_spec
from helpers import harness, last_json, query, wait_for, write_spec

HERE = Path(__file__).resolve().parent
KEY = "sk-attach-test-7f3c9d1e5b"  # a value that must appear nowhere the harness writes
BENCH = {"model": "auth-model", "prompt_tokens": 8, "output_tokens": 12, "requests_per_sample": 2,
         "warmup_requests": 1, "ignore_eos": False}
DEFAULTS = {"samples_per_boot": 2, "boots_per_arm": 2, "max_boots_per_arm": 2, "host_preflight_s": 0}


# --------------------------------------------------------------------------- the file


def parse(text, tmp_path):
    return parse_spec(textwrap.dedent(text), tmp_path / "hypotheses.yaml")


ATTACHED = """\
    version: 1
    engine:
      base_url: http://10.0.0.5:30000
      api_key_env: MY_KEY
      {extra}
    hypotheses:
      - id: h
        baseline: {baseline}
        treatment: {treatment}
        metric: tok_s
        expect: increase
        min_effect: 10%
    """


def attached(tmp_path, extra="", baseline="{}", treatment="{base_url: 'http://10.0.0.6:30000'}"):
    return parse(ATTACHED.format(extra=extra, baseline=baseline, treatment=treatment), tmp_path)


def test_attached_spec_has_no_launch_and_arms_name_their_servers(tmp_path):
    spec = attached(tmp_path, extra="preset: demo")
    assert spec.engine.base_url == "http://10.0.0.5:30000" and spec.engine.api_key_env == "MY_KEY"
    assert spec.engine.launch == () and spec.engine.build is None and spec.engine.repo is None
    h = spec.hypotheses[0]
    assert h.baseline.commit is None and h.baseline.base_url is None
    assert h.treatment.base_url == "http://10.0.0.6:30000"

    from bisect_harness.plan.build import make_plan

    plan = make_plan(spec, cache_dir=tmp_path / "cache")
    assert plan.repo is None and plan.source.attached
    assert [c.arm.endpoint for c in plan.configs] == ["http://10.0.0.5:30000", "http://10.0.0.6:30000"]
    assert plan.argv(plan.configs[0], port=30000, worktree=None) == []


@pytest.mark.parametrize("extra,key", [
    ("launch: [srv, --port, '{port}']", "engine.launch"),
    ("repo: ../engine", "engine.repo"),
    ("build: [make]", "engine.build"),
    ("flags: {tp: 2}", "engine.flags"),
    ("env: {A: '1'}", "engine.env"),
    ("environment: venv", "engine.environment"),
])
def test_launch_keys_beside_base_url_are_refused_by_name(tmp_path, extra, key):
    with pytest.raises(SpecError) as e:
        attached(tmp_path, extra=extra)
    assert e.value.key == key and "engine.base_url" in str(e.value)


@pytest.mark.parametrize("baseline,key,words", [
    ("{commit: HEAD}", "hypotheses[0].baseline.commit", "commits"),
    ("{flags: {tp: 2}}", "hypotheses[0].baseline.flags", "base_url"),
    ("{env: {A: '1'}}", "hypotheses[0].baseline.env", "base_url"),
    ("{base_url: 'ftp://x'}", "hypotheses[0].baseline.base_url", "http"),
])
def test_arms_of_an_attached_engine(tmp_path, baseline, key, words):
    with pytest.raises(SpecError) as e:
        attached(tmp_path, baseline=baseline)
    assert e.value.key == key and words in str(e.value)


def test_other_bad_combinations(tmp_path):
    with pytest.raises(SpecError) as e:
        parse("""\
            engine: {launch: [srv]}
            hypotheses:
              - {id: h, baseline: {base_url: 'http://x:1'}, treatment: {}, metric: tok_s, expect: increase,
                 min_effect: 10%}
            """, tmp_path)
    assert e.value.key == "hypotheses[0].baseline.base_url" and "engine.base_url" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse("""\
            engine: {launch: [srv], api_key_env: sk-live-123}
            hypotheses: [{id: h, baseline: {}, treatment: {}, metric: tok_s, expect: increase, min_effect: 10%}]
            """, tmp_path)
    assert e.value.key == "engine.api_key_env" and "never the key itself" in str(e.value)
    assert "sk-live-123" not in str(e.value)
    with pytest.raises(SpecError) as e:
        parse("""\
            engine: {base_url: 'http://x:1'}
            hypotheses:
              - {id: h, baseline: {}, treatment: {}, metric: tok_s, expect: increase, min_effect: 10%,
                 matrix: {flags.tp: [1, 2]}}
            """, tmp_path)
    assert e.value.key == "hypotheses[0].matrix"
    with pytest.raises(SpecError) as e:
        parse("""\
            engine: {base_url: 'http://x:1'}
            hypotheses:
              - {id: h, baseline: {}, treatment: {}, metric: tok_s, expect: increase, min_effect: 10%, bisect: true}
            """, tmp_path)
    assert e.value.key == "hypotheses[0].bisect"


# --------------------------------------------------------------------------- live


class AuthServer:
    """``auth_engine.py`` in a process group of its own, stopped at the end."""

    def __init__(self, tmp_path: Path, delay_ms: float, name: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"{name}.log"
        env = {**os.environ, "AUTH_ENGINE_KEY": KEY}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "auth_engine.py"), "--port", str(self.port), "--key-env",
                 "AUTH_ENGINE_KEY", "--token-delay-ms", str(delay_ms), "--version", name],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._up, timeout=30, what=f"{name} to listen")

    def _up(self):
        try:
            return httpx.get(self.url + "/health", headers={"Authorization": f"Bearer {KEY}"}, trust_env=False,
                             timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def counts(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, trust_env=False).text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.strip()}

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


@pytest.fixture
def servers(tmp_path):
    fast, slow = AuthServer(tmp_path, 4.0, "fast"), AuthServer(tmp_path, 12.0, "slow")
    yield fast, slow
    fast.stop()
    slow.stop()


def _files_bytes(root: Path) -> list[tuple[Path, bytes]]:
    return [(p, p.read_bytes()) for p in root.rglob("*") if p.is_file()]


@pytest.mark.slow
def test_two_attached_servers_with_a_key_that_is_never_written(tmp_path, servers):
    fast, slow = servers
    spec = write_spec(
        tmp_path / "hypotheses.yaml",
        engine={"preset": "openai", "base_url": fast.url, "api_key_env": "MY_SERVING_KEY",
                "server_info": ["/server_info"], "ready_timeout_s": 20,
                "metrics": [{"name": "served_tokens", "from": "prometheus", "metric": "auth_engine_tokens_total",
                             "kind": "delta", "better": "higher"}]},
        benchmark=BENCH, defaults=DEFAULTS,
        hypotheses=[{"id": "slow-server", "statement": "The server that sleeps 12 ms a token is slower.",
                     "baseline": {}, "treatment": {"base_url": slow.url}, "metric": "tok_s",
                     "expect": "decrease", "min_effect": "20%"}])
    db = tmp_path / "r.db"
    journal = tmp_path / "exp"
    env = {**os.environ, "MY_SERVING_KEY": KEY}
    proc = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                   "--journal-dir", journal, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json(proc.stdout)
    (h,) = out["hypotheses"]
    assert h["verdict"] == "confirmed", h
    assert h["boots"] == {"baseline": 2, "treatment": 2}

    # Each config is a server at its own URL: no commit, no argv, nothing launched.
    configs = query(db, "SELECT `commit`, argv FROM configs ORDER BY id")
    assert configs == [(None, "[]"), (None, "[]")]
    boots = query(db, "SELECT status, port, server_info, marks FROM boots ORDER BY id")
    assert [b[0] for b in boots] == ["ok"] * 4
    assert {b[1] for b in boots} == {fast.port, slow.port}
    assert all('"version"' in b[2] for b in boots)  # server info was read with the key
    samples = query(db, "SELECT metrics FROM samples")
    assert len(samples) == 8 and all('"served_tokens": 24.0' in s[0] for s in samples)  # /metrics with the key

    # The verdict says what a boot was here.
    warnings, findings = query(db, "SELECT warnings, findings FROM verdicts")[-1]
    assert "attached server" in warnings and "not independent restarts" in warnings
    assert fast.url in warnings and slow.url in warnings
    (attached,) = [f for f in json.loads(findings) if f["kind"] == "attached"]
    assert attached["figures"] == {"endpoints": sorted([fast.url, slow.url])} and attached["text"] in json.loads(warnings)
    md = "\n".join(p.read_text() for p in journal.rglob("*.md"))
    assert "not independent restarts" in md

    # Every request carried the key: none refused.
    assert fast.counts()["auth_engine_refused_total"] == 0 and slow.counts()["auth_engine_refused_total"] == 0
    assert fast.counts()["auth_engine_requests_total"] > 8
    assert httpx.get(fast.url + "/health", trust_env=False).status_code == 401  # and it does check

    # The key's value is nowhere: ledger bytes, journal, logs, stdout, stderr.
    needle = KEY.encode()
    assert needle not in db.read_bytes()
    for path, data in _files_bytes(tmp_path):  # the journal, the boots' logs, everything the run wrote
        assert needle not in data, path
    assert KEY not in proc.stdout and KEY not in proc.stderr
    assert "MY_SERVING_KEY" in (spec.read_text())  # only the variable's name is in the file


@pytest.mark.slow
def test_wrong_or_missing_key(tmp_path, servers):
    fast, _ = servers
    spec = write_spec(
        tmp_path / "hypotheses.yaml",
        engine={"preset": "openai", "base_url": fast.url, "api_key_env": "MY_SERVING_KEY", "ready_timeout_s": 10},
        benchmark=BENCH, defaults={**DEFAULTS, "boot_retries": 0},
        hypotheses=[{"id": "a-a", "baseline": {}, "treatment": {}, "metric": "tok_s", "expect": "increase",
                     "min_effect": "20%"}])
    env = {k: v for k, v in os.environ.items() if k != "MY_SERVING_KEY"}
    proc = harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{tmp_path / 'a.db'}",
                   "--journal-dir", tmp_path / "exp", cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "engine.api_key_env" in proc.stderr and "MY_SERVING_KEY is not set" in proc.stderr

    wrong = "sk-wrong-0000111122223333"
    db = tmp_path / "b.db"
    proc = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                   "--journal-dir", tmp_path / "exp", cwd=tmp_path, env={**env, "MY_SERVING_KEY": wrong}, timeout=120)
    # every boot refused: not measured, exit 3, the first failure named
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "not measured" in proc.stderr and "401" in proc.stderr
    (h,) = last_json(proc.stdout)["hypotheses"]
    assert h["verdict"] == "not measured" and h["measured"] is False
    failures = [f for (f,) in query(db, "SELECT failure FROM boots")]
    assert failures and all("401" in f and "MY_SERVING_KEY" in f and "engine.api_key_env" in f for f in failures)
    assert wrong.encode() not in db.read_bytes() and wrong not in proc.stdout + proc.stderr
    assert fast.counts()["auth_engine_refused_total"] >= 1


def test_an_attached_server_without_a_health_route_is_ready_by_its_apis_probe(tmp_path):
    from bisect_harness.measure.apis import get_api
    from bisect_harness.engines.attach import AttachedServer
    from test_server import NO_HEALTH_SERVER

    script = tmp_path / "old_server.py"
    script.write_text(NO_HEALTH_SERVER)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), str(port), "0.5"])
    try:
        server = AttachedServer(f"http://127.0.0.1:{port}", log_path=tmp_path / "attach.log", health_path="/health",
                                ready_timeout_s=30, api_key_env=None, poll_interval_s=0.05,
                                ready_probe=get_api("llamacpp").ready_probe)
        with server:
            assert server.ready_by == "POST /completion (one token), GET /health answering 404"
    finally:
        proc.terminate()
        proc.wait(10)
    log = (tmp_path / "attach.log").read_text()
    assert "GET /health: 404 (no such route); readiness by POST /completion (one token)" in log
