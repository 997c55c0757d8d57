"""Nightly: compare tonight with earlier nights, alert on a regression and bisect it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as st

from bisect_harness.demo import create_demo_repo
from bisect_harness.model import Expect
from bisect_harness.decide.verdict import judge_night
from bisect_harness.decide.shift import detect_shift
from bisect_harness.record.ledger import Ledger

from helpers import last_json, query, write_spec
from mock_boots import Planted, harness_here


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


def test_detect_shift_is_the_prediction_t_test_on_night_values():
    rng = np.random.default_rng(3)
    history, newest = _nights(rng, 100.0, 6), _nights(rng, 96.0, 1)[0]
    s = detect_shift(history, newest, worse=Expect.DECREASE, min_effect=0.0, alpha=0.05)
    y = np.array([np.median(np.log([np.mean(b) for b in night])) for night in history])
    y_new = np.median(np.log([np.mean(b) for b in newest]))
    se = y.std(ddof=1) * np.sqrt(1 + 1 / y.size)
    assert s.p_value == pytest.approx(st.t.cdf((y_new - y.mean()) / se, y.size - 1), rel=1e-10)
    assert s.ratio == pytest.approx(np.exp(y_new - y.mean()), rel=1e-12)
    assert s.df == 5 and s.n_reference_nights == 6 and s.n_reference_boots == 18 and s.n_new_boots == 3
    window = detect_shift(history, newest, worse=Expect.DECREASE, window=3)
    assert window.n_reference_nights == 3


@pytest.mark.parametrize("min_effect", [0.0, 0.05])
def test_detect_shift_false_alarm_rate_holds_with_nights_that_differ(min_effect):
    # Night-to-night CV 2% on top of the boots' noise: the former test, which pooled
    # boots across nights as independent, alerted 8.7-11.2% of the time at alpha 0.01.
    rng = np.random.default_rng(7)
    n = 3000
    alarms, pooled = 0, 0
    for _ in range(n):
        history = [_nights(rng, 100.0 * (1 + 0.02 * rng.standard_normal()), 1, between=0.01)[0] for _ in range(7)]
        newest = _nights(rng, 100.0 * (1 + 0.02 * rng.standard_normal()), 1, between=0.01)[0]
        alarms += detect_shift(history, newest, worse=Expect.DECREASE, min_effect=min_effect, alpha=0.01).regressed
        la = np.log([np.mean(b) for night in history for b in night])
        lb = np.log([np.mean(b) for b in newest])
        pooled += st.ttest_ind(lb, la, equal_var=False, alternative="less").pvalue <= 0.01
    assert alarms / n <= 0.01 + 0.006  # 3.3 standard errors
    assert pooled / n > 0.05  # the contrast: pooling boots across nights alerts falsely


def test_an_alert_must_survive_fresh_boots():
    rng = np.random.default_rng(11)
    history = _nights(rng, 100.0, 7, between=0.005, within=0.005)
    stalled = [list(b) for b in _nights(rng, 100.0, 1, between=0.005, within=0.005)[0]]
    stalled[0] = [x * 0.7 for x in stalled[0]]
    stalled[1] = [x * 0.7 for x in stalled[1]]  # two of three boots stalled together
    fresh = stalled + _nights(rng, 100.0, 1, between=0.005, within=0.005)[0]
    kw = dict(worse=Expect.DECREASE, min_effect=0.05, alpha=0.01, window=7)
    assert detect_shift(history, stalled, **kw).regressed  # the first look alone would alert
    calls = []
    s = judge_night(history, stalled, lambda: calls.append(1) or fresh, **kw)
    assert calls == [1] and not s.regressed and "did not survive 3 fresh boots" in s.reason
    assert s.n_new_boots == 6
    drop = _nights(rng, 80.0, 2, between=0.005, within=0.005)
    s = judge_night(history, drop[0], lambda: drop[0] + drop[1], **kw)
    assert s.regressed and s.n_new_boots == 6 and s.ratio == pytest.approx(0.8, abs=0.02)
    s = judge_night(history, stalled, lambda: stalled, **kw)  # no fresh boots to be had (budget spent)
    assert s.regressed and s.n_new_boots == 3
    quiet = judge_night(history, fresh[3:], lambda: pytest.fail("no alert, no more boots"), **kw)
    assert not quiet.regressed


def test_detect_shift_bad_input():
    with pytest.raises(ValueError, match="at least 2 earlier nights"):
        detect_shift([[[1.0], [1.1]]], [[1.0], [1.0]], worse=Expect.DECREASE)
    with pytest.raises(ValueError, match="alpha"):
        detect_shift([[[1.0], [2.0]], [[1.0], [2.0]]], [[1.0], [2.0]], worse=Expect.DECREASE, alpha=0.7)
    with pytest.raises(ValueError, match="window"):
        detect_shift([[[1.0], [2.0]], [[1.0], [2.0]]], [[1.0], [2.0]], worse=Expect.DECREASE, window=1)
    with pytest.raises(ValueError, match="same value"):
        detect_shift([[[1.0], [2.0]], [[1.0], [2.0]]], [[1.0], [2.0]], worse=Expect.DECREASE)


def test_nightly_alerts_on_the_regression_and_names_the_culprit(tmp_path):
    """Five quiet nights, then a night past the regression: an alert, then a bisection that
    reuses the nights' boots and names the culprit. Nightly's rule and its hand-off to the
    search are the point, so the real ``harness nightly`` runs in this process with its boots
    answered by the mock backend (the demo history's regression, 1.9x, and 3% boot-to-boot
    noise); nightly on real demo servers, night after night with its ledger kept, is
    ``test_nightly_workflow``'s, and a bisection on real servers ``test_bisect_cli``'s."""
    history = create_demo_repo(tmp_path / "engine")
    regression = history.events["regression"]
    i = history.index(regression)
    planted = Planted(slow_from=history.shas[i:])
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
              "--no-calibration", "--metric", "decode_ms", "--min-effect", "0.25"]
    # Each night is one value and the spread between nights is the noise: the test
    # needs two earlier nights, so five first. A 25% floor: the regression is 1.9x.
    for back, status in ((5, "first-night"), (4, "first-night"), (3, "ok"), (2, "ok"), (1, "ok")):
        night = harness_here("nightly", spec, "--rev", history.shas[i - back], *common, handler=planted,
                             cwd=tmp_path)
        assert night.returncode == 0, night.stderr[-3000:]
        assert last_json(night.stdout)["status"] == status, night.stdout[-2000:]
    tonight = harness_here("nightly", spec, "--rev", history.shas[i + 2], *common, handler=planted, cwd=tmp_path)
    assert tonight.returncode == 4, tonight.stdout[-3000:] + tonight.stderr[-3000:]
    out = last_json(tonight.stdout)
    low, high = out["ci"]
    assert out["status"] == "regression" and out["alert"]
    assert out["reference_commit"] == history.shas[i - 1]
    assert out["ratio"] > 1.05 and low < out["ratio"] < high
    assert out["bisection"]["boots"] > out["bisection"]["new_boots"]  # the earlier nights' boots were reused
    statuses = [s for (s,) in query(tmp_path / "r.db", "select status from runs where kind = 'nightly' order by id")]
    assert statuses == ["done"] * 5 + ["alert"]
    assert out["df"] == 4 and out["test"].startswith("one-sided prediction t-test")
    journal = sorted((tmp_path / "exp").glob("*-run6.md"))[0].read_text()
    assert "## Nightly check: regression" in journal and "## Bisection" in journal
    assert out["bisection"]["culprit"] == regression
    # the bisection's configs carry the night's series, but the series holds one entry a night:
    # tonight's commit, never a step of its search
    ((series,),) = query(tmp_path / "r.db", "select series from configs where run_id = 6 order by id limit 1")
    assert query(tmp_path / "r.db", "select count(*) from configs where run_id = 6 and series = ?", (series,))[0][0] > 1
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        nights = led.nightly_history(series, before_run=7)
        assert [(r.id, c) for r, c, _ in nights][-2:] == [(5, history.shas[i - 1]), (6, history.shas[i + 2])]
        assert [r.id for r, _, _ in nights] == [1, 2, 3, 4, 5, 6]
    # the stored night and its bisection carry their findings beside the sentences
    ((summary,),) = query(tmp_path / "r.db", "select summary from runs where kind = 'nightly' order by id desc limit 1")
    stored = json.loads(summary)
    for result in (stored, stored["bisection"]):
        assert [f["text"] for f in result["findings"]] == result["warnings"]
