"""A generic OpenAI-compatible engine through the real ``harness run``.

Hugging Face ``transformers serve`` with the tiny local Llama of ``tinyllama`` is
described only by a hypotheses file (preset ``openai``, a launch argv with
``{host}``/``{port}`` placeholders, a health path, an env): no engine-specific
code in the harness. One A/A hypothesis (the same config on both sides) must
get independent boots for each side, real streamed samples and a verdict.
"""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import harness, last_json, query, write_spec
from tinyllama import build_tiny_llama

pytestmark = pytest.mark.slow

OUTPUT_TOKENS = 16


@pytest.mark.skipif(shutil.which("transformers") is None,
                    reason="the `transformers` command is not installed (pip install 'transformers[serving]')")
def test_transformers_serve_as_a_generic_openai_engine(tmp_path):
    model_dir = build_tiny_llama(tmp_path / "tinyllama")
    spec = write_spec(
        tmp_path / "hypotheses.yaml",
        engine={"preset": "openai",
                "launch": ["transformers", "serve", str(model_dir), "--host", "{host}", "--port", "{port}",
                           "--device", "cpu", "--log-level", "info"],
                "health": "/health", "ready_timeout_s": 120,
                "env": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}},
        # transformers serve names a local model by the folder it was loaded from, and
        # refuses request fields it does not know, such as vLLM's ignore_eos.
        benchmark={"model": str(model_dir), "prompt_tokens": 16, "output_tokens": OUTPUT_TOKENS,
                   "requests_per_sample": 2, "warmup_requests": 1, "ignore_eos": False},
        defaults={"samples_per_boot": 2, "boots_per_arm": 2, "max_boots_per_arm": 2},
        hypotheses=[{"id": "a-a", "statement": "The server against itself: no real difference.",
                     "baseline": {}, "treatment": {}, "metric": "tok_s", "expect": "increase",
                     "min_effect": "20%"}])
    db = tmp_path / "r.db"
    proc = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                   "--journal-dir", tmp_path / "exp", cwd=tmp_path, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr

    out = last_json(proc.stdout)
    (h,) = out["hypotheses"]
    assert h["id"] == "a-a" and h["metric"] == "tok_s"
    assert h["verdict"] in ("confirmed", "refuted", "inconclusive")
    assert h["boots"] == {"baseline": 2, "treatment": 2}
    assert h["effect"] is not None and h["effect"] > 0

    # Two configs: the treatment is an independent replica of the baseline, not a shared one.
    configs = query(db, "SELECT id, key, `commit`, argv FROM configs ORDER BY id")
    assert len(configs) == 2 and configs[0][1] != configs[1][1]
    assert all(c[2] is None for c in configs)  # an installed server: no commits
    argv = json.loads(configs[0][3])
    assert argv[:3] == ["transformers", "serve", str(model_dir)] and "{port}" in argv

    boots = query(db, "SELECT id, config_id, status, port, ready_s, argv FROM boots ORDER BY id")
    assert [b[2] for b in boots] == ["ok"] * 4, boots
    assert sorted(b[1] for b in boots) == sorted([configs[0][0]] * 2 + [configs[1][0]] * 2)
    for b in boots:
        boot_argv = json.loads(b[5])
        # Placeholders were filled per boot: the loopback host and the boot's own port.
        assert boot_argv[boot_argv.index("--host") + 1] == "127.0.0.1"
        assert boot_argv[boot_argv.index("--port") + 1] == str(b[3])
        assert b[4] > 0

    samples = query(db, "SELECT boot_id, metrics, requests, output_tokens, errors FROM samples ORDER BY id")
    assert len(samples) == 4 * 2
    assert {s[0] for s in samples} == {b[0] for b in boots}
    for _, metrics, requests, output_tokens, errors in samples:
        m = json.loads(metrics)
        assert m["tok_s"] > 0 and m["ttft_ms"] > 0, m
        # The tiny model's word-level vocabulary and suppressed specials: exactly max_tokens per request.
        assert (requests, output_tokens, errors) == (2, 2 * OUTPUT_TOKENS, 0)

    (status,), = query(db, "SELECT status FROM runs")
    assert status == "done"
    (row,) = query(db, "SELECT v.outcome, v.final FROM verdicts v ORDER BY v.id DESC LIMIT 1")
    assert row == (h["verdict"], 1)
