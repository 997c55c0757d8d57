"""The explain search over a fake measure (the seam): seeded Gaussian boots of known levels."""

import numpy as np
import pytest

from bisect_harness.decide.explain import Unmeasured, explain
from bisect_harness.model import Expect


def fake(levels, seed=0, cv=0.01):
    """measure(subset) -> one boot's samples of a config whose level is levels(subset)."""
    rng = np.random.default_rng(seed)
    calls = []

    def measure(subset):
        calls.append(frozenset(subset))
        mu = levels(frozenset(subset))
        return list(mu * (1 + cv * rng.standard_normal()) + mu * 0.01 * rng.standard_normal(3))
    return measure, calls


NAMES = [f"env:V{i}" for i in range(6)] + ["flag:--mode", "commit"]


def test_single_cause_found_with_confidence():
    measure, calls = fake(lambda s: 100 * (0.8 if "flag:--mode" in s else 1.0))
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.members == ("flag:--mode",)
    assert res.confident and not res.interactions and not res.opposite
    assert res.confidence["flag:--mode"].outcome == "confirmed"
    assert res.effect.outcome == "confirmed" and res.effect.ratio == pytest.approx(0.8, abs=0.03)
    assert res.boots == len(calls)
    used = set()
    for t in res.tests:  # each test names the boots of each side; a shared boot serves several tests
        assert [calls[i] for i in t.baseline_calls] == [t.baseline] * t.boots[0]
        assert [calls[i] for i in t.treatment_calls] == [t.treatment] * t.boots[1]
        used |= set(t.baseline_calls) | set(t.treatment_calls)
    assert used == set(range(len(calls)))


def test_interaction_reported():
    pair = {"env:V1", "flag:--mode"}
    measure, _ = fake(lambda s: 100 * (0.85 if pair <= s else 1.0), seed=1)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert set(res.members) == pair
    assert [set(p) for p in res.interactions] == [pair]
    alone = [t for t in res.tests if t.purpose == "alone vs fast"]
    assert {t.outcome for t in alone} == {"refuted"}


def test_opposite_sign_difference():
    def levels(s):
        mu = 100 * (0.8 if "commit" in s else 1.0)
        return mu * (1.1 if "env:V3" in s else 1.0)  # V3 makes the slow config faster
    measure, _ = fake(levels, seed=2)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.members == ("commit",)
    assert res.opposite == ("env:V3",)
    # The block's "slower" tail is not trusted alone: fresh paired boots confirm it.
    check = [t for t in res.tests if t.purpose == "opposite sign"]
    assert [(sorted(res.tests[0].treatment - t.treatment), t.outcome) for t in check] == [(["env:V3"], "confirmed")]


def test_no_slowdown_nothing_claimed():
    measure, _ = fake(lambda s: 100.0, seed=3)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.slowdown.outcome == "refuted"
    assert res.members == () and not res.explained and len(res.tests) == 1


def test_latency_metric_worse_is_increase():
    measure, _ = fake(lambda s: 10 * (1.3 if "env:V0" in s else 1.0), seed=4)
    res = explain(NAMES, measure, worse=Expect.INCREASE, min_effect=0.05)
    assert res.members == ("env:V0",)


def test_bad_input_named():
    with pytest.raises(ValueError, match="distinct"):
        explain(["a", "a"], lambda s: [1.0], worse=Expect.DECREASE, min_effect=0.05)
    with pytest.raises(ValueError, match="min_effect"):
        explain(["a"], lambda s: [1.0], worse=Expect.DECREASE, min_effect=0)


def test_one_difference_is_its_own_slowdown():
    measure, _ = fake(lambda s: 100 * (0.8 if "commit" in s else 1.0), seed=5)
    res = explain(["commit"], measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.members == ("commit",) and res.confidence["commit"] is res.slowdown
    assert res.to_json()["confidence"]["commit"]["outcome"] == "confirmed"


def test_groups_that_cannot_be_cleared_stop_early_and_split():
    # 32 differences start as 8 groups of 4. At a 6% boot-to-boot CV no group can be
    # shown inert (within 5%) in 16 rounds, so waiting buys nothing: a group stops at
    # its first look, open, and is split. The cause is still found; the inert singletons
    # that cannot be cleared either are left undecided, never claimed.
    names = [f"env:V{i:02d}" for i in range(32)]
    measure, calls = fake(lambda s: 100 * (0.75 if "env:V05" in s else 1.0), seed=6, cv=0.06)
    res = explain(names, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.members == ("env:V05",)
    groups = [t for t in res.tests if t.purpose == "leave out" and len(set(names) - t.treatment) > 1]
    assert groups and all(t.boots[1] < 16 for t in groups)
    stopped = [t for t in groups if t.reason.startswith("Stopped undecided")]
    assert stopped and all(t.outcome == "inconclusive" for t in stopped)
    singles = [t for t in res.tests if t.purpose == "leave out" and len(set(names) - t.treatment) == 1]
    assert len(singles) == 32  # every group was split down to its singletons
    # The inert singletons are never claimed: undecided, or shown to hold no cause.
    assert set(res.undecided) | set(res.sign_open) == set(names) - {"env:V05"}


def test_no_cause_with_its_sign_open_is_neither_undecided_nor_split():
    # V3 makes the slow config 4.5% faster: left out, the slow config is shown not to get
    # 5% better (no cause), but neither shown 5% worse (opposite) nor within 5% (cleared)
    # in any budget. The set is settled for it: it is reported with its sign open, not as
    # an undecided member, and the set is claimed.
    def levels(s):
        mu = 100 * (0.8 if "commit" in s else 1.0)
        return mu * (1.045 if "env:V3" in s else 1.0)
    measure, _ = fake(levels, seed=3)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.members == ("commit",) and res.sign_open == ("env:V3",)
    assert res.confident and not res.undecided and not res.opposite
    v3 = next(t for t in res.tests if t.purpose == "leave out" and t.treatment == frozenset(NAMES) - {"env:V3"})
    assert v3.outcome == "refuted" and v3.opposite == "inconclusive" and v3.reason.startswith("Budget spent")
    assert res.to_json()["sign_open"] == ["env:V3"]
    # On a noisier host no budget could clear V3 or show it opposite: once shown to hold
    # no cause it stops at once, its sign open.
    measure, _ = fake(levels, seed=5, cv=0.02)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.members == ("commit",) and res.sign_open == ("env:V3",)
    v3 = next(t for t in res.tests if t.purpose == "leave out" and t.treatment == frozenset(NAMES) - {"env:V3"})
    assert v3.outcome == "refuted" and v3.boots[1] < 16 and "no cause shown, its sign open" in v3.reason
    # A group whose test ends this way is not split: 32 differences start in groups of
    # four; the one holding V03 (4.5% the other way) stops with the set settled for it.
    names = [f"env:V{i:02d}" for i in range(32)]

    def levels32(s):
        return 100 * (0.8 if "env:V20" in s else 1.0) * (1.045 if "env:V03" in s else 1.0)
    measure, _ = fake(levels32, seed=4)
    res = explain(names, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.members == ("env:V20",) and res.sign_open == tuple(names[0:4])
    # Every test that ended with no cause shown says so, and only those.
    for t in res.tests:
        if t.purpose == "leave out":
            assert ("no cause shown" in t.reason) == (t.outcome == "refuted" and not t.reason.startswith("Decided"))
    assert not any(t.purpose == "leave out" and len(set(names) - t.treatment) < 4
                   and set(names) - t.treatment <= set(names[0:4]) for t in res.tests)


def unmeasurable_where(measure, lost):
    """measure, except that configs for which ``lost(subset, n)`` holds (n: the calls for
    that config so far) come back as Unmeasured; every call is counted per config."""
    asked: dict = {}

    def m(subset):
        s = frozenset(subset)
        asked[s] = asked.get(s, 0) + 1
        if lost(s, asked[s]):
            return Unmeasured(f"3 boots in a row failed ({sorted(s)})")
        return measure(s)
    return m, asked


def test_a_leave_out_config_that_cannot_be_measured_is_stepped_over():
    # The slow config without the commit cannot boot (a flag the old commit refuses): the
    # search says why, leaves the commit undecided, and still decides every other difference.
    everything = frozenset(NAMES)
    base, _ = fake(lambda s: 100 * (0.8 if "commit" in s else 1.0), seed=7)
    measure, asked = unmeasurable_where(base, lambda s, n: s == everything - {"commit"})
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert asked[everything - {"commit"}] == 1  # asked once, never again
    assert res.stopped == "config-unmeasurable" and res.undecided == ("commit",)
    assert res.members == () and not res.confident and not res.opposite
    t = next(t for t in res.tests if t.treatment == everything - {"commit"})
    assert t.outcome == "inconclusive" and t.reason.startswith("Not measurable") and "without commit" in t.reason
    assert res.unmeasurable == ((tuple(sorted(everything - {"commit"})), "3 boots in a row failed (" +
                                 str(sorted(everything - {"commit"})) + ")"),)
    assert res.to_json()["stopped"] == "config-unmeasurable" and res.to_json()["unmeasurable"][0]["config"]


def test_a_member_whose_config_alone_cannot_be_measured_is_still_claimed():
    # The minimal set alone (the fast config with the flag) cannot boot: its effect is
    # not measured, and the member stands on its leave-out test.
    base, _ = fake(lambda s: 100 * (0.8 if "flag:--mode" in s else 1.0), seed=8)
    measure, asked = unmeasurable_where(base, lambda s, n: s == frozenset({"flag:--mode"}))
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.members == ("flag:--mode",) and res.confident and res.stopped == "explained"
    assert res.effect.outcome == "inconclusive" and res.effect.reason.startswith("Not measurable")
    assert res.residual.outcome == "inconclusive" and asked[frozenset({"flag:--mode"})] == 1


@pytest.mark.parametrize("arm", ["fast", "slow"])
def test_an_arm_that_cannot_be_measured_ends_the_search_without_a_claim(arm):
    config = frozenset() if arm == "fast" else frozenset(NAMES)
    base, _ = fake(lambda s: 100 * (0.8 if "commit" in s else 1.0), seed=9)
    measure, asked = unmeasurable_where(base, lambda s, n: s == config)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.stopped == "arm-unmeasurable" and not res.explained and res.members == ()
    assert len(res.tests) == 1 and res.slowdown.outcome == "inconclusive" and asked[config] == 1


def test_the_slow_config_lost_mid_search_ends_every_open_test_and_claims_nothing_undecided():
    # The slow config boots for the slowdown test, then stops booting for good (its
    # 20th call on): every leave-out test still open ends, saying why; nothing loops.
    everything = frozenset(NAMES)
    base, calls = fake(lambda s: 100 * (0.8 if "commit" in s else 1.0), seed=10)
    measure, asked = unmeasurable_where(base, lambda s, n: s == everything and n > 6)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05)
    assert res.stopped == "arm-unmeasurable" and not res.confident
    assert asked[everything] == 7 and sum(asked.values()) < 200
    assert set(res.members) | set(res.undecided) | set(res.sign_open) <= set(NAMES)
    assert not (set(res.members) - {"commit"}) and not res.opposite
    lost = [t for t in res.tests if t.reason.startswith("Not measurable: the slow config could not")]
    assert lost and all(t.outcome == "inconclusive" for t in lost)


def _rounds(levels, n, seed, cv=0.01):
    """n paired rounds (fast samples, slow samples) measured before a search."""
    measure, _ = fake(levels, seed=seed, cv=cv)
    return [(measure(frozenset()), measure(frozenset(NAMES))) for _ in range(n)]


def test_the_runs_rounds_open_the_slowdown_test_and_are_not_booted_again():
    """A run that has just confirmed the slowdown hands its rounds over: the search's rule
    judges them first, at its own alpha, and boots no slowdown round where they decide."""
    levels = lambda s: 100 * (0.8 if "flag:--mode" in s else 1.0)  # noqa: E731
    measure, calls = fake(levels)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05, rounds=_rounds(levels, 3, seed=9))
    first = res.tests[0]
    assert first.purpose == "slowdown" and first.outcome == "confirmed" and first.boots == (3, 3)
    assert first.baseline_calls == (0, 2, 4) and first.treatment_calls == (1, 3, 5)
    assert res.members == ("flag:--mode",) and res.confident
    assert res.boots == len(calls)  # the given rounds are not the search's boots
    for t in res.tests[1:]:  # the search's own boots are calls 6 on, in measure()'s order
        assert [calls[i - 6] for i in t.treatment_calls] == [t.treatment] * t.boots[1]


def test_rounds_that_do_not_decide_are_booted_on_and_ones_against_the_claim_refute_it():
    """Too few rounds to decide: the test boots on from them. Rounds that show no
    slowdown refute it on their own evidence: the search stops there, booting nothing."""
    levels = lambda s: 100 * (0.8 if "flag:--mode" in s else 1.0)  # noqa: E731
    measure, calls = fake(levels, seed=3)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05, rounds=_rounds(levels, 2, seed=4))
    first = res.tests[0]
    assert first.outcome == "confirmed" and first.boots[0] >= 3
    assert first.baseline_calls[:2] == (0, 2) and calls[0] in (frozenset(), frozenset(NAMES))
    flat = lambda s: 100.0  # noqa: E731
    measure, calls = fake(flat, seed=5)
    res = explain(NAMES, measure, worse=Expect.DECREASE, min_effect=0.05,
                  rounds=_rounds(flat, 8, seed=6))
    assert res.tests[0].outcome == "refuted" and res.stopped == "no-slowdown" and calls == []
