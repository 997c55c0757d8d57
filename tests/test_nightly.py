"""Nightly: compare tonight with earlier nights, alert on a regression and bisect it."""

from __future__ import annotations

import numpy as np
import pytest

from bisect_harness.demo import create_demo_repo
from bisect_harness.model import Expect
from bisect_harness.stats import detect_shift

from helpers import harness, last_json, query, write_spec


def _nights(rng, level, nights, boots=3, samples=2, between=0.02, within=0.02):
    return [[list(level * (1 + between * rng.standard_normal()) * (1 + within * rng.standard_normal(samples)))
             for _ in range(boots)] for _ in range(nights)]


def test_detect_shift_flags_a_drop_and_not_noise():
    rng = np.random.default_rng(1)
    history = _nights(rng, 100.0, 5)
    drop = detect_shift(history, _nights(rng, 85.0, 1)[0], worse=Expect.DECREASE, min_effect=0.05)
    assert drop.regressed and drop.ratio == pytest.approx(0.85, abs=0.03)
    assert drop.ci[0] < drop.ratio < drop.ci[1]
    same = detect_shift(history, _nights(rng, 100.0, 1)[0], worse=Expect.DECREASE, min_effect=0.05)
    assert not same.regressed
    faster = detect_shift(history, _nights(rng, 120.0, 1)[0], worse=Expect.DECREASE, min_effect=0.05)
    assert not faster.regressed  # an improvement is no alert
    latency = detect_shift(history, _nights(rng, 115.0, 1)[0], worse=Expect.INCREASE, min_effect=0.05)
    assert latency.regressed


def test_detect_shift_false_alarm_rate_holds():
    rng = np.random.default_rng(7)
    alarms = sum(detect_shift(_nights(rng, 100.0, 5), _nights(rng, 100.0, 1)[0], worse=Expect.DECREASE,
                              min_effect=0.0, alpha=0.05).regressed for _ in range(400))
    assert alarms / 400 <= 0.05 + 0.03


def test_detect_shift_bad_input():
    with pytest.raises(ValueError, match="at least 2 boots"):
        detect_shift([], [[1.0], [1.0]], worse=Expect.DECREASE)
    with pytest.raises(ValueError, match="alpha"):
        detect_shift([[[1.0], [2.0]]], [[1.0], [2.0]], worse=Expect.DECREASE, alpha=0.7)


@pytest.mark.slow
def test_nightly_alerts_on_the_regression_and_names_the_culprit(tmp_path):
    history = create_demo_repo(tmp_path / "engine")
    regression = history.events["regression"]
    i = history.index(regression)
    spec = write_spec(
        tmp_path / "nightly.yaml",
        engine={"preset": "demo", "repo": "engine",
                "metrics": [{"name": "decode_ms", "from": "log", "pattern": r"decode cycle: (?P<value>[0-9.]+) ms/cyc",
                             "reduce": "median", "unit": "ms", "better": "lower"}]},
        benchmark={"prompt_tokens": 16, "output_tokens": 32, "requests_per_sample": 2, "warmup_requests": 1},
        defaults={"samples_per_boot": 2, "boots_per_arm": 3, "max_boots_per_arm": 6},
        hypotheses=[{"id": "unused", "baseline": {}, "treatment": {}, "metric": "tok_s", "expect": "decrease",
                     "min_effect": "10%"}])
    common = ["--ledger", f"sqlite:///{tmp_path / 'r.db'}", "--journal-dir", tmp_path / "exp", "--json",
              "--no-calibration", "--metric", "decode_ms", "--min-effect", "0.05"]
    first = harness("nightly", spec, "--rev", history.shas[i - 2], *common)
    assert first.returncode == 0, first.stderr
    assert last_json(first.stdout)["status"] == "first-night"
    second = harness("nightly", spec, "--rev", history.shas[i - 1], *common)
    assert second.returncode == 0, second.stderr
    assert last_json(second.stdout)["status"] == "ok"
    third = harness("nightly", spec, "--rev", history.shas[i + 2], *common, timeout=600)
    assert third.returncode == 4, third.stderr
    out = last_json(third.stdout)
    assert out["status"] == "regression" and out["alert"]
    assert out["reference_commit"] == history.shas[i - 1]
    assert out["ratio"] > 1.05
    assert out["bisection"]["culprit"] == regression
    assert out["bisection"]["boots"] > out["bisection"]["new_boots"]  # the two nights' boots were reused
    statuses = [s for (s,) in query(tmp_path / "r.db", "select status from runs where kind = 'nightly' order by id")]
    assert statuses == ["done", "done", "alert"]
    journal = sorted((tmp_path / "exp").glob("*-run3.md"))[0].read_text()
    assert "## Nightly check: regression" in journal and "## Bisection" in journal
