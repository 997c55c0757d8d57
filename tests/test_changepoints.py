"""The change-point pass over a whole nightly series (decide/changepoints.py, report/series.py).

The search is checked on seeded series with known shifts (where, how many) and on
series with none (how often it is wrong), then over a real SQLite ledger of nightly
runs: the night a shift starts, and whether a nightly alert flagged it.
"""

from __future__ import annotations

import random

import pytest

from bisect_harness.decide.changepoints import find_change_points


def _series(levels: list[tuple[int, float]], cv: float, seed: int) -> list[float]:
    r = random.Random(seed)
    return [level * r.lognormvariate(0, cv) for n, level in levels for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_finds_each_shift_where_it_starts(seed):
    values = _series([(15, 100.0), (10, 90.0), (8, 100.0)], cv=0.02, seed=seed)
    points = find_change_points(values, alpha=0.01, min_effect=0.05)
    assert [p.index for p in points] == [15, 25]
    assert points[0].ratio == pytest.approx(0.9, rel=0.03) and points[1].ratio == pytest.approx(1 / 0.9, rel=0.03)
    assert all(p.p_value < 0.01 for p in points)
    assert (points[0].before_n, points[0].after_n, points[1].after_n) == (15, 10, 8)


def test_a_series_without_a_shift_rarely_has_one():
    wrong = sum(bool(find_change_points(_series([(30, 100.0)], cv=0.03, seed=s), alpha=0.01, min_effect=0.05))
                for s in range(200))
    assert wrong <= 4, wrong  # 2% at most; the min_effect filter keeps it near zero


def test_a_shift_below_min_effect_is_not_reported_and_bad_values_are_refused():
    values = _series([(12, 100.0), (12, 98.0)], cv=0.002, seed=3)  # significant, but 2%
    assert find_change_points(values, alpha=0.01, min_effect=0.05) == []
    assert [p.index for p in find_change_points(values, alpha=0.01, min_effect=0.01)] == [12]
    with pytest.raises(ValueError, match="positive"):
        find_change_points([1.0, 0.0, 2.0])


def _nightly_ledger(tmp_path, values: list[float], alerts: set[int]):
    from bisect_harness.record.ledger import Boot, Config, Ledger, Run, SampleRow

    led = Ledger(f"sqlite:///{tmp_path / 'n.db'}")
    for i, v in enumerate(values, start=1):
        run = led.add(Run(kind="nightly", spec_path="nightly.yaml", spec_text="", spec_hash="0" * 64,
                          harness_version="test", status="alert" if i in alerts else "done"))
        cfg = led.add(Config(run_id=run.id, key=f"k{i}", series="series-1", label="HEAD", commit=f"{i:040x}"))
        for seq, f in enumerate((0.99, 1.01), start=1):
            boot = led.add(Boot(run_id=run.id, config_id=cfg.id, config_key=cfg.key, seq=seq, status="ok"))
            led.add(SampleRow(boot_id=boot.id, seq=1, metrics={"tok_s": v * f}, requests=1, output_tokens=1,
                              duration_s=1.0))
    return led


@pytest.mark.parametrize("alerted", [False, True])
def test_report_over_a_ledger_names_the_night_and_whether_it_was_flagged(tmp_path, alerted):
    from bisect_harness.report.series import change_point_report, report_lines

    values = _series([(8, 100.0), (8, 88.0)], cv=0.01, seed=7)
    led = _nightly_ledger(tmp_path, values, alerts={10} if alerted else set())  # an alert two nights late
    try:
        last = led.latest_run()
        report = change_point_report(led, last, "tok_s", alpha=0.01, min_effect=0.05, window=7)
    finally:
        led.close()
    assert report["nights"] == 16
    (point,) = report["points"]
    assert point["run_id"] == 9 and point["commit"] == f"{9:040x}" and point["previous_commit"] == f"{8:040x}"
    assert point["ratio"] == pytest.approx(0.88, rel=0.02) and point["flagged"] is alerted
    lines = report_lines(report)
    assert lines[0] == "change points over 16 night(s) of tok_s: 1 found"
    assert ("flagged by a nightly alert" in lines[1]) is alerted
    assert ("not flagged by any night" in lines[1]) is not alerted


def test_report_says_when_the_series_is_too_short(tmp_path):
    from bisect_harness.report.series import change_point_report

    led = _nightly_ledger(tmp_path, [100.0, 101.0, 99.0], alerts=set())
    try:
        report = change_point_report(led, led.latest_run(), "tok_s", alpha=0.01, min_effect=0.05, window=7)
    finally:
        led.close()
    assert report["points"] == [] and "needs 6" in report["note"]
