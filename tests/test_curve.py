"""A load curve's statistics: the closed test of its points (``decide.multiplicity.step_down``),
a point judged again at a recycled level (``decide.verdict.rejudge``), and the executor
judging a curve's points together and storing its answer (``runs.summary["curves"]``)."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest

from helpers import write_spec
from mock_boots import BootDraws

from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import BootRecord, SampleOutcome
from bisect_harness.decide import allocation
from bisect_harness.decide.analyses.robust import Robust, robust_split
from bisect_harness.decide.curve import CurveAnswer
from bisect_harness.decide.design import Design
from bisect_harness.decide.multiplicity import step_down
from bisect_harness.decide.signflip import _sf_spent
from bisect_harness.decide.verdict import Question, Rules, Side, judge, looks_used, rejudge
from bisect_harness.evidence import VerdictStats
from bisect_harness.model import Expect, Outcome
from bisect_harness.plan.build import make_plan
from bisect_harness.record.ledger import Ledger
from bisect_harness.run.executor import Executor
from bisect_harness.spec import load_spec
from bisect_harness.workload import LoadPoint

PTS = ("concurrency=1", "concurrency=4", "concurrency=16")


def answers(table: dict) -> "callable":
    """``confirms(point, level)`` from a table keyed by (point, level rounded to 6 places),
    recording each question; a question the table does not hold fails the test."""
    asked = []

    def confirms(p, level):
        asked.append((p, round(level, 6)))
        return table[(p, round(level, 6))]

    confirms.asked = asked
    return confirms


# ---------------------------------------------------------------- the closed test on constructed answers


def test_a_point_confirmed_at_its_share_lets_another_be_judged_at_the_next_level():
    first = 0.05 / 3  # three points of a file of three: each its share, the curve all of alpha
    c = answers({("concurrency=1", round(first, 6)): False, ("concurrency=4", round(first, 6)): True,
                 ("concurrency=16", round(first, 6)): False,
                 ("concurrency=1", 0.025): False, ("concurrency=4", 0.025): True, ("concurrency=16", 0.025): True,
                 ("concurrency=1", 0.05): False, ("concurrency=4", 0.05): True, ("concurrency=16", 0.05): True})
    sd = step_down(PTS, first, c)
    assert sd.confirmed == {"concurrency=4": first, "concurrency=16": pytest.approx(0.025)}
    assert sd.stepped == ("concurrency=16",)
    assert sd.alpha == pytest.approx(0.05)
    # concurrency=16 was judged at alpha/(k-1) only once concurrency=4 had been confirmed at alpha/k
    assert c.asked.index(("concurrency=16", 0.025)) > c.asked.index(("concurrency=4", round(first, 6)))


def test_no_point_confirmed_at_its_share_asks_nothing_more_and_confirms_nothing():
    first = 0.01
    c = answers({(p, first): False for p in PTS})
    sd = step_down(PTS, first, c)
    assert sd.confirmed == {} and sd.stepped == ()
    assert sorted(c.asked) == sorted((p, first) for p in PTS)


def test_the_step_down_stops_where_a_point_does_not_confirm_at_its_level():
    # Holm's chain: A/3 confirms concurrency=1; at A/2 neither other point confirms, so
    # concurrency=16, which would confirm at A, is never confirmed
    first = 0.01
    table = {("concurrency=1", 0.01): True, ("concurrency=4", 0.01): False, ("concurrency=16", 0.01): False,
             ("concurrency=1", 0.015): True, ("concurrency=4", 0.015): False, ("concurrency=16", 0.015): False,
             ("concurrency=1", 0.03): True, ("concurrency=4", 0.03): False, ("concurrency=16", 0.03): True}
    assert step_down(PTS, first, answers(table)).confirmed == {"concurrency=1": 0.01}
    # once concurrency=4 confirms at A/2 (and so at A), concurrency=16 is judged at A
    table[("concurrency=4", 0.015)] = table[("concurrency=4", 0.03)] = True
    sd = step_down(PTS, first, answers(table))
    assert sd.confirmed == {"concurrency=1": 0.01, "concurrency=4": pytest.approx(0.015),
                            "concurrency=16": pytest.approx(0.03)}


def _closed_by_enumeration(points, first, table) -> set[str]:
    """Closed testing written out: every intersection J, rejected when a member's test
    confirms at A/|J|; a point confirmed when every J holding it is rejected."""
    k = len(points)
    rejected = {J: any(table[(j, len(J))] for j in J)
                for r in range(1, k + 1) for J in itertools.combinations(points, r)}
    return {p for p in points if all(ok for J, ok in rejected.items() if p in J)}


@pytest.mark.parametrize("seed", range(40))
def test_the_step_down_is_the_closed_test_written_out(seed):
    # random answers, monotone in the level or not: the shortcut confirms exactly what
    # closed testing over every intersection confirms
    rng = random.Random(seed)
    k = rng.randint(1, 5)
    points = tuple(f"p{i}" for i in range(k))
    first = 0.05 / k
    table = {(p, s): rng.random() < 0.45 for p in points for s in range(1, k + 1)}
    sd = step_down(points, first, lambda p, level: table[(p, round(first * k / level))])
    assert set(sd.confirmed) == _closed_by_enumeration(points, first, table)
    for p, level in sd.confirmed.items():  # stored at the smallest level its own test confirmed at
        assert table[(p, round(first * k / level))]


def test_step_down_refuses_points_that_repeat():
    with pytest.raises(ValueError, match="distinct"):
        step_down(["c=1", "c=1"], 0.01, lambda p, a: True)


@pytest.mark.parametrize("k,m", [(2, 2), (3, 3), (5, 5), (5, 10), (8, 8)])
def test_the_shipped_designs_levels_grow_with_alpha_along_a_curves_ladder(k, m):
    # where each look's level grows with alpha, a point's test confirms at a larger level
    # whenever it did at a smaller one: the step-down is then Holm's, and a point
    # confirmed at its first level is one the closed test confirms too
    d = Design(alpha=0.05, min_boots=3, max_boots=20, analysis="robust")
    first = 0.05 / m
    ladder = [first * k / s for s in range(k, 0, -1)]
    t = [np.array(Robust().t_levels(d, a)[0]) for a in ladder]
    sf = [np.array(_sf_spent(d, robust_split(d, a)[2], robust_split(d, a)[3])) for a in ladder]
    for lower, upper in itertools.pairwise(t):
        assert np.all(upper >= lower)
    for lower, upper in itertools.pairwise(sf):
        assert np.all(upper >= lower)


# ---------------------------------------------------------------- a point judged again at a recycled level


def _boots(values, start, label="concurrency=4"):
    return [BootRecord(id=start + 2 * i, run_id=1, status="ok", samples=tuple(
        SampleOutcome(metrics={"tok_s": float(v)}, requests=1, output_tokens=1, duration_s=1.0, point=label)
        for v in vs)) for i, vs in enumerate(values)]


def _sides(effect: float, rounds: int, seed: int):
    rng = np.random.default_rng(seed)
    base, treat = [], []
    for _ in range(rounds):
        base.append(100.0 * (1 + 0.02 * rng.standard_normal()) + rng.standard_normal(3))
        treat.append(100.0 * (1 + effect) * (1 + 0.02 * rng.standard_normal()) + rng.standard_normal(3))
    return Side("baseline", tuple(_boots(base, 1))), Side("treatment", tuple(_boots(treat, 2)))


def _first_pass(rules, b, t, q, rounds):
    """The sequential verdict the executor's rounds give: looks from the first until final."""
    for n in range(2, rounds + 1):
        v = judge(rules, Side("baseline", b.boots[:n]), Side("treatment", t.boots[:n]), q,
                  force_final=n >= rules.design.max_boots)
        if v.final:
            return v
    raise AssertionError("not final at the budget")


def test_rejudge_confirms_at_a_recycled_level_what_the_first_level_left_undecided():
    rules = Rules(design=Design(alpha=0.05, min_boots=3, max_boots=8, analysis="robust"), family_size=3)
    q = Question("tok_s", Expect.INCREASE, 0.02, point="concurrency=4")
    b, t = _sides(0.04, 8, seed=0)
    v = _first_pass(rules, b, t, q, 8)
    assert v.outcome is Outcome.INCONCLUSIVE and v.alpha == pytest.approx(0.05 / 3)
    upto = (looks_used(b, v.baseline_boot_ids), looks_used(t, v.treatment_boot_ids))
    assert upto == (8, 8)
    again = rejudge(rules.at(0.025), b, t, q, upto=upto)
    assert again is not None and again.outcome is Outcome.CONFIRMED and again.final
    assert again.alpha == pytest.approx(0.025) and again.stats.family_size == 3
    assert again.stats.p_threshold > v.stats.p_threshold  # the boundary recomputed for the larger alpha
    assert again.ci is not None and again.ci[0] > 1.0
    assert again.stats.look == 8
    # at its own level it confirms nowhere, and no look past ``upto`` is read
    assert rejudge(rules.at(0.05 / 3), b, t, q, upto=upto) is None
    assert rejudge(rules.at(0.025), b, t, q, upto=(7, 7)) is None


def test_rules_at_a_level_spend_that_many_shares():
    rules = Rules(design=Design(alpha=0.05, min_boots=3, max_boots=8), family_size=5)
    assert rules.alpha_each == pytest.approx(0.01)
    assert rules.at(0.0125).alpha_each == pytest.approx(0.0125)
    assert rules.at(0.0125).shares == pytest.approx(1.25)


def test_a_sample_at_every_point_is_priced_as_that_many_samples():
    cost = allocation.CostModel(900.0, 20.0)
    assert allocation.for_points(cost, 1) is cost
    assert allocation.for_points(cost, 5).sample_s == pytest.approx(100.0)
    comps = allocation.Components(var_within=4e-4, df_within=10, var_between=1e-4, df_between=5)
    one = allocation.samples_per_boot(cost, comps, min_samples=1, max_samples=64)
    five = allocation.samples_per_boot(allocation.for_points(cost, 5), comps, min_samples=1, max_samples=64)
    assert (one, five) == (13, 6)  # sqrt(45 * 4) and sqrt(9 * 4): sqrt(5) times fewer at each point


# ---------------------------------------------------------------- the executor: a curve's points together


def _curve_run(tmp_path, effects: dict[str, float], salt: int = 0):
    """A 3-point curve of one hypothesis (claim: tok_s higher by 5%) run by the executor on
    the mock backend; each boot measures every point, the boot's level shared by its
    points; ``effects`` the treatment's true change at each point."""
    spec = load_spec(write_spec(
        tmp_path / "h.yaml", engine={"preset": "openai", "launch": ["srv", "--port", "{port}"]},
        defaults={"boots_per_arm": 3, "max_boots_per_arm": 8, "samples_per_boot": 2, "max_samples_per_boot": 2,
                  "host_preflight_s": 0},
        hypotheses=[{"id": "wins", "baseline": {}, "treatment": {"flags": {"spec": 1}}, "metric": "tok_s",
                     "expect": "increase", "min_effect": "5%"}]))
    h = spec.hypotheses[0]
    points = [LoadPoint.of(concurrency=c) for c in (1, 4, 16)]
    spec = dataclasses.replace(spec, family_size=3, hypotheses=tuple(
        dataclasses.replace(h, id=f"wins@{p.label}", point=p, curve="wins") for p in points))
    draws = BootDraws()

    def answer(r):
        rng = draws.rng(r, salt)
        level = 100.0 * rng.lognormvariate(0.0, 0.02)
        treated = bool(dict(r.flags).get("spec"))
        return [SampleOutcome(metrics={"tok_s": level * (1 + effects[p.label] * treated)
                                       * rng.lognormvariate(0, 0.01)},
                              requests=1, output_tokens=1, duration_s=0.1, point=p.label)
                for p in r.benchmark.points for _ in range(r.samples)]

    led = Ledger(f"sqlite:///{tmp_path / 'r.db'}")
    run = Executor(make_plan(spec, cache_dir=tmp_path / "cache"), led, log_dir=tmp_path / "logs", calibrate=False,
                   order_seed=1, backend=MockBackend(answer)).execute()
    return led, run


def test_the_executor_stores_a_curves_answer_from_its_points_verdicts(tmp_path):
    led, run = _curve_run(tmp_path, {"concurrency=1": 0.0, "concurrency=4": 0.25, "concurrency=16": 0.0})
    with led:
        (stored,) = run.summary["curves"]
        curve = CurveAnswer.from_json(stored)
        assert curve.to_json() == stored
        assert [(p.label, p.hypothesis) for p in curve.points] == [(p, f"wins@{p}") for p in PTS]
        outcomes = {p.label: p.outcome for p in curve.points}
        assert outcomes["concurrency=4"] is Outcome.CONFIRMED
        assert outcomes["concurrency=1"] is not Outcome.CONFIRMED and outcomes["concurrency=16"] is not Outcome.CONFIRMED
        assert curve.largest == "concurrency=4" and curve.metric == "tok_s" and curve.expect is Expect.INCREASE
        assert curve.better.value == "higher"
        # each point as its hypothesis' final verdict holds it, at its share of alpha
        for p in curve.points:
            (row,) = [r for r in run.hypotheses if r.hid == p.hypothesis]
            final = led.looks(row)[-1]
            assert (final.outcome, final.ratio, p.alpha) == (p.outcome.value, p.ratio, pytest.approx(0.05 / 3))
        assert "higher" in curve.words and "concurrency=4" in curve.words


def test_the_executor_stores_what_the_step_down_confirms_as_a_further_look(tmp_path):
    # concurrency=4 (+25%) confirms at its share; concurrency=16 (+6%) is left undecided at
    # the budget there, and confirmed once the share of concurrency=4 is recycled to it
    led, run = _curve_run(tmp_path, {"concurrency=1": 0.0, "concurrency=4": 0.2, "concurrency=16": 0.06})
    with led:
        (row,) = [r for r in run.hypotheses if r.hid == "wins@concurrency=16"]
        looks = led.looks(row)
        first = next(v for v in looks if v.final)
        last = looks[-1]
        assert (first.outcome, first.alpha) == ("inconclusive", pytest.approx(0.05 / 3))
        assert (last.outcome, last.final, last.alpha) == ("confirmed", True, pytest.approx(0.025))
        step = VerdictStats.from_json(last.stats).step_down
        assert step["curve"] == "wins" and step["level"] == pytest.approx(0.025)
        assert step["confirmed"] == {"concurrency=4": pytest.approx(0.05 / 3), "concurrency=16": pytest.approx(0.025)}
        # the further look reads the first verdict's boots, at a look no later than its
        assert set(last.baseline_boot_ids) <= set(first.baseline_boot_ids)
        curve = CurveAnswer.from_json(run.summary["curves"][0])
        assert [p.outcome for p in curve.points][1:] == [Outcome.CONFIRMED, Outcome.CONFIRMED]
        assert curve.points[2].alpha == pytest.approx(0.025)
        assert curve.words.endswith("higher from concurrency=4: it crosses between concurrency=1 and concurrency=4")


def test_a_run_without_a_curve_stores_no_curves(tmp_path):
    spec = load_spec(write_spec(
        tmp_path / "h.yaml", engine={"preset": "openai", "launch": ["srv", "--port", "{port}"]},
        defaults={"boots_per_arm": 3, "max_boots_per_arm": 3, "samples_per_boot": 2, "host_preflight_s": 0},
        hypotheses=[{"id": "h", "baseline": {}, "treatment": {"flags": {"x": 1}}, "metric": "tok_s",
                     "expect": "increase", "min_effect": "5%"}]))
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = Executor(make_plan(spec, cache_dir=tmp_path / "cache"), led, log_dir=tmp_path / "logs", calibrate=False,
                       backend=MockBackend(lambda r: [100.0, 101.0])).execute()
        assert "curves" not in (run.summary or {})


def test_a_curves_boots_take_their_samples_priced_at_every_point(tmp_path):
    # a boot of a 5-point curve takes its samples at every point: with a boot of 900 s and a
    # sample of 20 s stated, the equal-parts choice is sqrt(900 / (5 * 20)) = 3 at each point
    # (one point alone: sqrt(45) = 7), and never fewer than samples_per_boot spread over the points
    assert allocation.fewest_per_point(3, 5) == 1 and allocation.fewest_per_point(3, 1) == 3
    assert allocation.fewest_per_point(4, 3) == 2
    taken = {}
    for points in (1, 5):
        spec = load_spec(write_spec(
            tmp_path / f"h{points}.yaml", engine={"preset": "openai", "launch": ["srv", "--port", "{port}"]},
            defaults={"boots_per_arm": 2, "max_boots_per_arm": 2, "samples_per_boot": 3, "boot_cost_s": 900,
                      "sample_cost_s": 20, "host_preflight_s": 0},
            hypotheses=[{"id": "h", "baseline": {}, "treatment": {"flags": {"x": 1}}, "metric": "tok_s",
                         "expect": "increase", "min_effect": "5%"}]))
        at = [LoadPoint.of(concurrency=c) for c in (1, 2, 4, 8, 16)][:points] if points > 1 else [None]
        spec = dataclasses.replace(spec, family_size=points, hypotheses=tuple(
            dataclasses.replace(spec.hypotheses[0], id=f"h@{p.label}" if p else "h", point=p,
                                curve="h" if p else None) for p in at))
        backend = MockBackend(lambda r: [SampleOutcome(metrics={"tok_s": 100.0 + i}, requests=1, output_tokens=1,
                                                       duration_s=0.1, point=p.label if p else None)
                                         for p in (r.benchmark.points or (None,)) for i in range(r.samples)])
        with Ledger(f"sqlite:///{tmp_path / f'r{points}.db'}") as led:
            Executor(make_plan(spec, cache_dir=tmp_path / "cache"), led, log_dir=tmp_path / "logs", calibrate=False,
                     backend=backend).execute()
        taken[points] = {r.samples for r in backend.requests}
    assert taken == {1: {7}, 5: {3}}
