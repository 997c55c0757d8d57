"""The words of a curve's answer follow from its points' verdicts (decide.curve)."""

from __future__ import annotations

import pytest

from bisect_harness.decide.curve import CurveAnswer, PointVerdict, answer
from bisect_harness.model import Expect, Outcome

C, R, I = Outcome.CONFIRMED, Outcome.REFUTED, Outcome.INCONCLUSIVE


def _pts(*states):
    """Points at concurrency 1, 4, 16, ...: (outcome, ci) each."""
    return [PointVerdict(f"concurrency={4 ** k}", f"h@concurrency={4 ** k}", o, sum(ci) / 2, ci)
            for k, (o, ci) in enumerate(states)]


@pytest.mark.parametrize("states, expect, words, shape, crossing", [
    ([(C, (0.7, 0.8)), (C, (0.6, 0.7))], Expect.DECREASE, "tok_s lower at every point", "every", None),
    ([(I, (0.9, 1.1)), (C, (0.6, 0.8))], Expect.DECREASE,
     "tok_s lower from concurrency=4 up (undecided at concurrency=1)", "from", None),
    ([(C, (0.6, 0.8)), (I, (0.9, 1.1))], Expect.DECREASE,
     "tok_s lower up to concurrency=1 (undecided at concurrency=4)", "up_to", None),
    ([(R, (1.1, 1.3)), (C, (0.6, 0.8))], Expect.DECREASE,
     "tok_s higher up to concurrency=1, lower from concurrency=4: it crosses between concurrency=1 and "
     "concurrency=4", "crosses", ("concurrency=1", "concurrency=4")),
    ([(R, (0.95, 1.05)), (C, (1.5, 2.1))], Expect.INCREASE,
     "tok_s not higher by the claimed size up to concurrency=1, higher from concurrency=4: it crosses between "
     "concurrency=1 and concurrency=4", "crosses", ("concurrency=1", "concurrency=4")),
    ([(I, (0.9, 1.1)), (I, (0.8, 1.2))], Expect.DECREASE, "no point decided", "none", None),
    ([(C, (0.6, 0.8)), (R, (1.1, 1.2)), (C, (0.6, 0.8))], Expect.DECREASE,
     "tok_s lower at concurrency=1, concurrency=16; higher at concurrency=4", "mixed", None),
])
def test_the_words_follow_from_the_points(states, expect, words, shape, crossing):
    a = answer("h", "tok_s", expect, _pts(*states))
    assert (a.words, a.shape, a.crossing) == (words, shape, crossing)
    assert CurveAnswer.from_json(a.to_json()) == a


def test_a_refuted_point_whose_interval_holds_no_change_shows_no_direction():
    (p,) = _pts((R, (0.97, 1.02)))
    assert p.shows(Expect.DECREASE) == 0 and p.shows(Expect.INCREASE) == 0


def test_the_largest_confirmed_effect_names_the_default_point():
    a = answer("h", "tok_s", Expect.DECREASE, _pts((C, (0.8, 0.9)), (C, (0.5, 0.6)), (I, (0.4, 1.2))))
    assert a.largest == "concurrency=4"
