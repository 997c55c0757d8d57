"""Declared metric sources and boot checks against the live demo engine.

One real ``harness run --json --no-calibration`` over a demo repository made in a
temp folder: every boot is a real server tree on 127.0.0.1, measured by the real
client, scraped through ``/metrics``, ``/server_info`` and its own log. The
tests then read what the run left: the JSON summary, the ledger and the journal.

The demo's history (see ``bisect_harness.demo.history``): the regression raises
the context length 512 -> 4096 (slower decode); after the env scrub, workers
start from an allow-listed environment, so ``DEMO_*`` variables stop reaching
them; on CPU the engine reports ``cuda_graph: false`` whatever was asked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from bisect_harness.engines import presets
from bisect_harness.demo import create_demo_repo
from bisect_harness.record.ledger import Ledger

pytestmark = pytest.mark.slow

NEVER_PATTERN = "tokens recycled: (?P<value>[0-9.]+)"

SPEC = """\
version: 1
engine:
  preset: demo
  repo: {repo}
  metrics:
    - {{name: decode_ms, from: log, pattern: 'decode cycle: (?P<value>[0-9.]+) ms/cyc', unit: ms, better: lower}}
    - {{name: gen_rate, from: prometheus, metric: demo_generation_tokens_total, kind: rate, unit: tok/s,
       better: higher}}
    - {{name: context, from: server_info, field: context_length, better: higher}}
    - {{name: recycled, from: log, pattern: '{never}', better: lower}}
benchmark:
  prompt_tokens: 16
  output_tokens: 32
  requests_per_sample: 2
  warmup_requests: 1
defaults:
  samples_per_boot: 2
  boots_per_arm: 2
  max_boots_per_arm: 2
  env_check: mark
  flag_check: mark
hypotheses:
  - id: decode-slower
    statement: decode cycles at HEAD take at least 10% longer than at HEAD~26
    baseline: {{commit: HEAD~26}}
    treatment: {{commit: HEAD}}
    metric: decode_ms
    expect: increase
    min_effect: 10%
  - id: recycled
    statement: a metric whose log line the engine never prints
    baseline: {{commit: HEAD~26}}
    treatment: {{commit: HEAD}}
    metric: recycled
    expect: increase
    min_effect: 10%
  - id: cuda-graph
    statement: CUDA graphs make decode faster
    baseline: {{commit: HEAD}}
    treatment: {{commit: HEAD, flags: {{cuda-graph: true}}}}
    metric: tok_s
    expect: increase
    min_effect: 5%
  - id: tuning-head
    statement: DEMO_COMM_TUNING=1 speeds up HEAD
    baseline: {{commit: HEAD}}
    treatment: {{commit: HEAD, env: {{DEMO_COMM_TUNING: "1"}}}}
    metric: tok_s
    expect: increase
    min_effect: 10%
  - id: tuning-before-scrub
    statement: DEMO_COMM_TUNING=1 speeds up HEAD~26
    baseline: {{commit: HEAD~26}}
    treatment: {{commit: HEAD~26, env: {{DEMO_COMM_TUNING: "1"}}}}
    metric: tok_s
    expect: increase
    min_effect: 10%
"""


class LiveRun:
    def __init__(self, hist, summary, ledger_url, journal, seconds):
        self.hist, self.summary, self.ledger_url, self.journal, self.seconds = (
            hist, summary, ledger_url, journal, seconds)

    def hypothesis(self, hid: str) -> dict:
        return next(h for h in self.summary["hypotheses"] if h["id"] == hid)


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> LiveRun:
    root = tmp_path_factory.mktemp("sources-live")
    hist = create_demo_repo(root / "engine")
    assert hist.index(hist.events["env_scrub"]) > len(hist.shas) - 27, "HEAD~26 must predate the env scrub"
    assert hist.index(hist.events["regression"]) > len(hist.shas) - 27, "HEAD~26 must predate the regression"
    spec = root / "hypotheses.yaml"
    spec.write_text(SPEC.format(repo=hist.path, never=NEVER_PATTERN))
    ledger_url = f"sqlite:///{root / 'results.db'}"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "run", str(spec), "--json",
                           "--no-calibration", "--ledger", ledger_url, "--journal-dir", str(root / "journal")],
                          cwd=root, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    journals = list((root / "journal").glob("*-run*.md"))
    assert len(journals) == 1
    return LiveRun(hist, summary, ledger_url, journals[0].read_text(), seconds)


def configs_by_hypothesis(led: Ledger, hid: str):
    run = led.latest_run()
    h = next(r for r in run.hypotheses if r.hid == hid)
    by_id = {c.id: c for c in run.configs}
    return by_id[h.baseline_config_id], by_id[h.treatment_config_id]


def test_samples_carry_every_declared_source(live):
    hist = live.hist
    with Ledger(live.ledger_url) as led:
        base, treat = configs_by_hypothesis(led, "decode-slower")
        assert base.commit == hist.shas[-27] and treat.commit == hist.head
        for config, context in ((base, 512.0), (treat, 4096.0)):
            boots = [b for b in config.boots if b.status == "ok"]
            assert len(boots) == 2
            for b in boots:
                assert len(b.samples) == 2
                for s in b.samples:
                    m = s.metrics
                    assert "recycled" not in m, "a source that never matched gives no value, not zero"
                    # The engine's own decode timing, near the client's per-token interval.
                    assert 0 < m["decode_ms"] < 1000
                    assert m["tpot_ms"] / 3 < m["decode_ms"] < m["tpot_ms"] * 3, m
                    # Tokens per second from the server's counter, near the client's own count.
                    assert m["gen_rate"] > 0
                    assert 0.5 < m["gen_rate"] / m["tok_s"] < 2.0, m
                    # The effective context length of this commit's build.
                    assert m["context"] == context


def test_log_source_measures_the_regression(live):
    h = live.hypothesis("decode-slower")
    assert h["metric"] == "decode_ms"
    assert h["boots"] == {"baseline": 2, "treatment": 2}
    # The context grew 4x; decode cycles get clearly longer (measured ~1.3-1.4x).
    assert h["effect"] is not None and h["effect"] > 1.0, h


def test_a_source_that_never_matches_is_reported_not_zero(live):
    h = live.hypothesis("recycled")
    assert h["verdict"] == "inconclusive"
    assert h["effect"] is None and h["ci"] is None
    assert "recycled" in h["reason"] and "no values" in h["reason"], h["reason"]
    assert any("source_unmatched" in w for w in h["warnings"])
    with Ledger(live.ledger_url) as led:
        run = led.latest_run()
        boots = [b for c in run.configs for b in c.boots]
        assert len(boots) == 5 * 2
        for b in boots:
            assert b.status == "ok"
            assert "source_unmatched" in b.marks
            assert len(b.source_problems) == 1, b.source_problems
            problem = b.source_problems[0]
            assert problem.startswith("log source 'recycled'") and NEVER_PATTERN in problem
    assert "log source 'recycled': 2 problem(s) over 2 sample(s): no new line of" in live.journal
    assert live.journal.count("log source 'recycled'") == 10, "one line per boot"


def test_demo_preset_makes_the_cuda_graph_flag_checkable():
    demo = presets.get_preset("demo")
    assert presets.info_key("cuda-graph", demo) == "cuda_graph"
    assert presets.info_key("cuda_graph", demo) == "cuda_graph"


def test_requested_cuda_graph_on_cpu_is_a_flag_mismatch(live):
    with Ledger(live.ledger_url) as led:
        base, treat = configs_by_hypothesis(led, "cuda-graph")
        assert treat.flags == {"cuda-graph": True} and "--cuda-graph" in treat.argv
        for b in treat.boots:
            assert b.server_info["cuda_graph"] is False
            assert "flag_mismatch" in b.marks
            assert b.flag_report["ok"] is False
            (check,) = b.flag_report["checks"]
            assert (check["flag"], check["key"], check["requested"], check["effective"], check["status"]) == (
                "cuda-graph", "cuda_graph", True, False, "mismatched")
        for b in base.boots:
            assert "flag_mismatch" not in b.marks
    h = live.hypothesis("cuda-graph")
    assert any("treatment boot" in w and "flag_mismatch" in w for w in h["warnings"])
    assert "flag_mismatch" in live.journal


def test_env_check_sees_the_scrub(live):
    with Ledger(live.ledger_url) as led:
        _, at_head = configs_by_hypothesis(led, "tuning-head")
        _, before = configs_by_hypothesis(led, "tuning-before-scrub")
        assert at_head.commit == live.hist.head and before.commit == live.hist.shas[-27]
        for b in at_head.boots:
            assert "env_missing" in b.marks
            assert b.env_report["ok"] is False
            (var,) = b.env_report["vars"]
            assert var["name"] == "DEMO_COMM_TUNING" and var["absent"], "the workers lack it"
            assert var["matched"], "the server process itself has it"
        for b in before.boots:
            assert "env_missing" not in b.marks
            assert b.env_report["ok"] is True
            (var,) = b.env_report["vars"]
            assert not var["absent"] and len(var["matched"]) >= 2, "server and worker both have it"
    assert any("env_missing" in w for w in live.hypothesis("tuning-head")["warnings"])
    assert not any("env_missing" in w for w in live.hypothesis("tuning-before-scrub")["warnings"])
