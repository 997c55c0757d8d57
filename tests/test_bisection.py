"""The noisy bisection, driven by a fake measure with seeded noise."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bisect_harness.decide.bisect.result import BisectResult, Candidate, Probe, StopReason
from bisect_harness.decide.bisect.search import BisectionSearch, run_search
from bisect_harness.decide.paired_sequential import look_schedule, paired_sequential_test
from bisect_harness.model import Expect


def shas(n: int) -> list[str]:
    return [f"c{i:03d}" for i in range(n)]


class FakeEngine:
    """A commit range with one step change at ``culprit``.

    A boot's value is the mean of ``samples`` samples around the boot's level; the
    level varies between boots by ``between_cv``, samples within a boot by
    ``within_cv``. The n-th boot of a commit is the same number whatever order the
    search asks in, so two searches over the same engine see the same data.
    """

    def __init__(self, n, culprit, *, change=-0.05, within_cv=0.02, between_cv=0.01,
                 samples=3, base=100.0, seed=0, unbuildable=()):
        self.commits = shas(n)
        self.culprit, self.change, self.base = culprit, change, base
        self.within_cv, self.between_cv, self.samples, self.seed = within_cv, between_cv, samples, seed
        self.unbuildable = {self.commits[i] for i in unbuildable}
        self.boots_done: dict[str, int] = {}
        self.calls: list[tuple[str, int]] = []

    def mean(self, i: int) -> float:
        return self.base * (1 + self.change) if i >= self.culprit else self.base

    def boot(self, sha: str, nth: int) -> float:
        i = self.commits.index(sha)
        rng = np.random.default_rng([self.seed, i, nth])
        mu = self.mean(i)
        level = mu * (1 + self.between_cv * rng.standard_normal())
        return float(np.mean(level + mu * self.within_cv * rng.standard_normal(self.samples)))

    def __call__(self, sha: str, boots: int):
        self.calls.append((sha, boots))
        if sha in self.unbuildable:
            return None
        start = self.boots_done.get(sha, 0)
        self.boots_done[sha] = start + boots
        return [self.boot(sha, start + b) for b in range(boots)]


def search_for(engine: FakeEngine, expect=Expect.DECREASE, **kw) -> BisectionSearch:
    return BisectionSearch(engine.commits, expect=expect, **kw)


# -- finding the culprit ---------------------------------------------------------------

def test_clean_data_finds_culprit_with_one_boot_per_probe():
    engine = FakeEngine(64, 37, within_cv=0.0, between_cv=0.0)
    result = run_search(search_for(engine), engine)
    assert result.stopped is StopReason.CONFIDENT
    assert result.culprit == "c037"
    assert result.candidate_set == ("c037",) and result.leader == "c037"
    assert result.leader_probability >= 0.95
    # 3 paired rounds of the endpoints (6 boots), one boot per bisection step
    # (log2 64 = 6), an anchor every second step (3), then 3 paired rounds of the
    # culprit against its parent (6).
    assert all(boots == 1 for sha, boots in engine.calls)
    assert result.boots_used == 6 + 6 + 3 + 6
    assert result.endpoint_test.decision == "passed" and result.endpoint_test.pairs == 3
    assert result.verify_test.decision == "passed" and result.verify_test.pairs == 3
    assert result.good_mean == pytest.approx(100.0)
    assert result.bad_mean == pytest.approx(95.0)


@pytest.mark.parametrize("seed", range(12))
def test_noisy_data_finds_culprit(seed):
    rng = np.random.default_rng(seed)
    culprit = int(rng.integers(1, 128))
    engine = FakeEngine(128, culprit, seed=seed)
    result = run_search(search_for(engine), engine)
    assert result.stopped is StopReason.CONFIDENT
    assert result.culprit == engine.commits[culprit]
    # The head-to-head test at 1% for the whole search costs a few pairs more than 5%
    # per test did (45 boots on average over these seeds, against 40; at most 62).
    assert result.boots_used < 66
    assert result.candidates[0] == Candidate(result.culprit, result.leader_probability)


@pytest.mark.parametrize("culprit", [1, 63])
def test_culprit_at_first_or_last_position(culprit):
    engine = FakeEngine(64, culprit, seed=culprit)
    result = run_search(search_for(engine), engine)
    assert result.culprit == engine.commits[culprit]


def test_two_commits_blames_the_bad_one_after_checking_the_change():
    engine = FakeEngine(2, 1, seed=3)
    result = run_search(search_for(engine), engine)
    # The endpoints' paired rounds are also the culprit-against-parent test.
    assert result.culprit == "c001" and result.leader_probability >= 0.999
    assert result.boots_used == 2 * max(result.endpoint_test.pairs, result.verify_test.pairs)


@pytest.mark.parametrize("expect,change", [(Expect.INCREASE, 0.05), (Expect.DECREASE, -0.05)])
def test_direction(expect, change):
    engine = FakeEngine(100, 58, change=change, seed=11)
    result = run_search(search_for(engine, expect=expect), engine)
    assert result.culprit == "c058"
    assert np.sign(result.bad_mean - result.good_mean) == expect.sign


def test_change_against_the_expected_direction_is_not_reproduced():
    engine = FakeEngine(100, 58, change=+0.05, seed=11)
    result = run_search(search_for(engine, expect=Expect.DECREASE), engine)
    assert result.stopped is StopReason.NOT_REPRODUCED
    assert result.culprit is None
    assert {sha for sha, _ in engine.calls} == {"c000", "c099"}
    # Paired rounds, stopped for futility once 8 pairs point the wrong way.
    assert result.endpoint_test.decision == "failed" and result.endpoint_test.mean < 0
    assert result.boots_used == 16


def test_no_change_is_not_reproduced():
    engine = FakeEngine(50, 20, change=0.0, seed=5)
    result = run_search(search_for(engine, max_endpoint_boots=6), engine)
    assert result.stopped is StopReason.NOT_REPRODUCED
    assert result.boots_used == 12


def test_small_effect_asks_for_more_boots_per_probe():
    # effect of 1.5 boot-to-boot standard deviations: one boot cannot call a side
    engine = FakeEngine(64, 40, change=-0.0225, within_cv=0.0, between_cv=0.015, seed=2)
    search = search_for(engine, max_boots=400)
    result = run_search(search, engine)
    interior = [boots for sha, boots in engine.calls if sha not in ("c000", "c063")]
    assert max(interior) >= 2
    assert result.culprit == "c040"


def pass_endpoints(search: BisectionSearch, good: list[float], bad: list[float]) -> None:
    """Feed the endpoint check's paired rounds from two lists of boot values."""
    g, b = iter(good), iter(bad)
    while (rnd := search.next_round()) and rnd[0].purpose == "endpoints":
        search.observe_round(rnd, [[next(g)] if p.commit == search.commits[0] else [next(b)] for p in rnd])


def test_ambiguous_probe_gets_more_boots_at_the_same_commit():
    search = BisectionSearch(shas(9), expect=Expect.DECREASE, anchor_every=0, likelihood="gaussian")
    pass_endpoints(search, [100.0, 101.0, 99.0], [95.0, 96.0, 94.0])
    probe = search.next_probe()
    assert probe == Probe("c004", 1)
    search.observe("c004", [97.5])  # exactly midway: says nothing about its side
    assert search.next_probe().commit == "c004"


# -- budget, skips -----------------------------------------------------------------------

def test_budget_stops_the_search():
    engine = FakeEngine(256, 100, seed=1)
    result = run_search(search_for(engine, max_boots=10), engine)
    assert result.stopped is StopReason.BUDGET
    assert result.boots_used == 10
    assert result.culprit is None
    assert result.candidates and result.candidates[0].probability < 0.95
    # out of budget: a leader and its posterior, never a culprit
    assert result.leader == result.candidate_set[0] and result.leader_probability < 0.95


def test_skipped_commits_are_never_probed_again():
    unbuildable = range(20, 40)
    engine = FakeEngine(64, 45, seed=4, unbuildable=unbuildable)
    result = run_search(search_for(engine), engine)
    assert result.culprit == "c045"
    asked = [sha for sha, _ in engine.calls]
    for sha in {engine.commits[i] for i in unbuildable}:
        assert asked.count(sha) <= 1
    assert {sha for sha, _ in result.skipped} <= {engine.commits[i] for i in unbuildable}
    assert len(result.skipped) == len({s for s in asked if s in engine.unbuildable})


def test_culprit_after_an_unbuildable_commit_yields_the_candidate_set():
    engine = FakeEngine(64, 30, seed=7, unbuildable=[29])
    result = run_search(search_for(engine), engine)
    assert result.stopped is StopReason.AMBIGUOUS_SKIPS
    assert result.culprit is None
    assert result.candidate_set == ("c029", "c030")
    assert result.leader_probability >= 0.95
    assert ("c029", "measure returned None") in result.skipped


def test_culprit_before_an_unbuildable_commit_is_still_exact():
    engine = FakeEngine(64, 30, seed=7, unbuildable=[31])
    result = run_search(search_for(engine), engine)
    assert result.culprit == "c030"


def test_run_of_unbuildable_commits_before_the_culprit():
    engine = FakeEngine(64, 30, seed=8, unbuildable=[27, 28, 29])
    search = search_for(engine)
    for i in (27, 28, 29):
        search.skip(engine.commits[i], "build failed")
    result = run_search(search, engine)
    assert result.candidate_set == ("c027", "c028", "c029", "c030")
    assert all(sha not in {"c027", "c028", "c029"} for sha, _ in engine.calls)


def test_unmeasurable_good_endpoint_stops():
    engine = FakeEngine(16, 8, unbuildable=[0])
    result = run_search(search_for(engine), engine)
    assert result.stopped is StopReason.ENDPOINT_UNMEASURABLE
    assert ("c000", 1) in engine.calls and len(engine.calls) <= 2  # one paired round


# -- resuming from a ledger -------------------------------------------------------------

def replay(engine_commits, log, **kw) -> BisectionSearch:
    search = BisectionSearch(engine_commits, expect=Expect.DECREASE, **kw)
    for sha, values in log:
        if values is None:
            search.skip(sha, "build failed")
        else:
            search.observe(sha, values)
    return search


def replay_rounds(engine_commits, rounds, **kw) -> BisectionSearch:
    search = BisectionSearch(engine_commits, expect=Expect.DECREASE, **kw)
    for rnd, results in rounds:
        search.observe_round(rnd, results)
    return search


def test_resumed_search_continues_identically_and_reuses_boots():
    engine_a = FakeEngine(128, 77, seed=21, unbuildable=[50])
    a = search_for(engine_a)
    rounds = []
    for _ in range(9):  # interrupted after 9 rounds
        rnd = a.next_round()
        results = [engine_a(p.commit, p.boots) for p in rnd]
        rounds.append((rnd, results))
        a.observe_round(rnd, results)
    b = replay_rounds(engine_a.commits, rounds)
    assert b.boots_used == a.boots_used
    assert b.next_round() == a.next_round()
    assert b.result() == a.result()
    # Both continue against the same engine state: identical probes and answers.
    engine_b = FakeEngine(128, 77, seed=21, unbuildable=[50])
    engine_b.boots_done = dict(engine_a.boots_done)
    calls_before = len(engine_a.calls)
    ra, rb = run_search(a, engine_a), run_search(b, engine_b)
    assert ra == rb
    assert engine_a.calls[calls_before:] == engine_b.calls


def test_endpoint_check_uses_fresh_boots_only():
    """Boots that selected the regression (fed with observe) never open the search."""
    engine = FakeEngine(32, 10, seed=3)
    search = search_for(engine)
    search.observe("c000", [engine.boot("c000", b) for b in range(6)])
    search.observe("c031", [engine.boot("c031", b) for b in range(6)])
    rnd = search.next_round()
    assert {p.commit for p in rnd} == {"c000", "c031"}
    assert all(p.purpose == "endpoints" and p.boots == 1 for p in rnd)
    assert search.result().endpoint_test.pairs == 0


def test_endpoint_rounds_are_randomly_ordered_and_reproducible():
    engine = FakeEngine(32, 10, seed=3)
    search = search_for(engine, seed=5)
    firsts = []
    for _ in range(3):
        rnd = search.next_round()
        firsts.append(rnd[0].commit)
        search.observe_round(rnd, [engine(p.commit, p.boots) for p in rnd])
    again = search_for(FakeEngine(32, 10, seed=3), seed=5)
    assert again.next_round()[0].commit == firsts[0]
    many = BisectionSearch(shas(4), expect=Expect.DECREASE, max_endpoint_boots=40, seed=1)
    order = []
    for _ in range(30):
        rnd = many.next_round()
        order.append(rnd[0].commit)
        many.observe_round(rnd, [[100.0 + len(order) % 3], [100.0 - len(order) % 2]])
        if many.next_round() is None:
            break
    assert {"c000", "c003"} <= set(order), "both orders occur"


def test_finished_search_replayed_asks_for_nothing():
    engine = FakeEngine(64, 12, seed=9)
    search = search_for(engine)
    rounds = []
    while (rnd := search.next_round()) is not None:
        results = [engine(p.commit, p.boots) for p in rnd]
        rounds.append((rnd, results))
        search.observe_round(rnd, results)
    result = search.result()
    again = replay_rounds(engine.commits, rounds)
    assert again.next_round() is None
    assert again.result() == result


def test_observations_in_any_order_give_the_same_posterior_without_drift():
    # With the drift term the order is host time and matters; without it, it does not.
    engine = FakeEngine(32, 10, seed=3)
    log = [(sha, [engine.boot(sha, b) for b in range(2)]) for sha in ("c000", "c031", "c016", "c008", "c012")]
    for lk in ("gaussian", "slow-mode"):
        forward = replay(engine.commits, log, likelihood=lk, drift=False).result()
        backward = replay(engine.commits, list(reversed(log)), likelihood=lk, drift=False).result()
        assert [c.commit for c in forward.candidates] == [c.commit for c in backward.candidates]
        np.testing.assert_allclose([c.probability for c in forward.candidates],
                                   [c.probability for c in backward.candidates], rtol=1e-6)


# -- the posterior against a direct computation -------------------------------------------

def test_posterior_matches_numerical_integration():
    """p(data | k) integrated on a grid over mu_g, mu_b (with mu_b < mu_g) and log s."""
    data = {0: [10.0, 10.4, 9.8], 1: [10.1], 2: [9.7], 3: [9.3], 4: [9.1, 9.5]}
    search = BisectionSearch(shas(5), expect=Expect.DECREASE, likelihood="gaussian")
    for i, v in data.items():
        search.observe(f"c{i:03d}", v)
    got = {c.commit: c.probability for c in search.result().candidates}

    mu = np.linspace(7.0, 12.5, 141)
    log_s = np.linspace(np.log(0.02), np.log(4.0), 101)
    mg, mb, ls = np.meshgrid(mu, mu, log_s, indexing="ij", sparse=True)

    def marginal(k):  # prior: flat on the means, 1/s^2 on s^2 (= flat on log s)
        ll = np.zeros(np.broadcast_shapes(mg.shape, mb.shape, ls.shape))
        for i, values in data.items():
            mean = mg if i < k else mb
            for x in values:
                ll -= 0.5 * ((x - mean) / np.exp(ls)) ** 2 + ls
        dens = np.exp(ll) * (mb < mg)
        return dens.sum()

    m = np.array([marginal(k) for k in range(1, 5)])
    want = m / m.sum()
    assert len(set(np.round(want, 3))) == 4  # four different splits, four answers
    for k in range(1, 5):
        assert got[f"c{k:03d}"] == pytest.approx(want[k - 1], rel=1e-2)


# -- input checks ------------------------------------------------------------------------

def test_fewer_than_two_commits():
    with pytest.raises(ValueError, match="at least 2 commits"):
        BisectionSearch(["a"], expect=Expect.DECREASE)


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, 1.5])
def test_confidence_outside_unit_interval(confidence):
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        BisectionSearch(shas(4), expect=Expect.DECREASE, confidence=confidence)


def test_unknown_commit_in_observe_and_skip():
    search = BisectionSearch(shas(4), expect=Expect.DECREASE)
    with pytest.raises(ValueError, match="unknown commit 'deadbeef'.*c000..c003"):
        search.observe("deadbeef", [1.0])
    with pytest.raises(ValueError, match="unknown commit"):
        search.skip("deadbeef")


def test_bad_values_and_arguments():
    search = BisectionSearch(shas(4), expect=Expect.DECREASE)
    with pytest.raises(ValueError, match="use skip"):
        search.observe("c001", [])
    with pytest.raises(ValueError, match="finite"):
        search.observe("c001", [1.0, float("nan")])
    with pytest.raises(ValueError, match="appears twice"):
        BisectionSearch(["a", "b", "a"], expect=Expect.DECREASE)
    with pytest.raises(ValueError, match="expect must be"):
        BisectionSearch(shas(4), expect="decrease")
    with pytest.raises(ValueError, match="max_boots"):
        BisectionSearch(shas(4), expect=Expect.DECREASE, max_boots=0)


def test_value_types_are_frozen():
    result = BisectionSearch(shas(4), expect=Expect.INCREASE).result()
    assert isinstance(result, BisectResult)
    assert result.stopped is StopReason.RUNNING
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.culprit = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        Probe("a", 1).boots = 2


# -- honest under noise off the textbook ---------------------------------------------------

OUTLIER_DATA = {0: [100, 100.5, 99.5, 100.2, 99.8], 15: [95, 95.3, 94.7, 95.1, 94.9], 5: [100.1, 99.9],
                9: [100.1, 99.9, 80.0], 10: [95.2, 94.8], 12: [95.0]}


@pytest.mark.parametrize("likelihood", ["slow-mode", "student-t"])
def test_a_stalled_boot_does_not_flip_the_answer(likelihood):
    """c009 is good but one of its boots stalled 20% slow; the Gaussian posterior is
    pulled off c010 by it, the heavy-tailed ones are not."""
    def top(lk):
        search = BisectionSearch(shas(16), expect=Expect.DECREASE, likelihood=lk)
        for i, values in OUTLIER_DATA.items():
            search.observe(f"c{i:03d}", values)
        return search.result().candidates[0]

    assert top("gaussian").commit != "c010"
    best = top(likelihood)
    assert best.commit == "c010" and best.probability >= 0.95


def test_no_step_component_does_not_blame_a_commit_on_a_flat_range():
    rng = np.random.default_rng(0)
    search = BisectionSearch(shas(16), expect=Expect.DECREASE)
    for i in (0, 15, 4, 8, 12, 10, 6):
        search.observe(f"c{i:03d}", list(100 + 1.5 * rng.standard_normal(3)))
    result = search.result()
    assert result.no_step_probability > 0.15
    assert result.candidates[0].probability < 0.5
    without = BisectionSearch(shas(16), expect=Expect.DECREASE, no_step_prior=0.0)
    for i in (0, 15, 4, 8, 12, 10, 6):
        without.observe(f"c{i:03d}", list(100 + 1.5 * np.random.default_rng(i).standard_normal(3)))
    assert without.result().no_step_probability == 0.0


def test_a_real_step_leaves_no_mass_on_no_step():
    engine = FakeEngine(64, 30, seed=2)
    result = run_search(search_for(engine), engine)
    assert result.culprit == "c030" and result.no_step_probability < 1e-3


def test_anchors_are_re_measured_in_the_same_round_as_probes():
    engine = FakeEngine(128, 70, seed=6)
    search = search_for(engine, anchor_every=1)
    probe_rounds = []
    while (rnd := search.next_round()) is not None:
        measured_before = {i for i, v in enumerate(search._values) if v}
        if rnd[0].purpose in ("probe", "anchor"):
            probe_rounds.append((rnd, measured_before))
        search.observe_round(rnd, [engine(p.commit, p.boots) for p in rnd])
    assert search.result().culprit == "c070"
    with_anchor = [r for r, _ in probe_rounds if any(p.purpose == "anchor" for p in r)]
    assert len(with_anchor) >= len(probe_rounds) - 1
    for rnd, measured in probe_rounds:
        for p in rnd:
            if p.purpose == "anchor":
                assert engine.commits.index(p.commit) in measured, "an anchor is a commit measured before"
                assert p.boots == 1
    assert {r[0].purpose for r in with_anchor} == {"probe", "anchor"}, "anchor first in some rounds"


def test_drift_is_learnt_from_anchors():
    """The host speeds up 0.4% per boot: the measured step would drift into the good side."""
    n, culprit = 64, 21
    clock = {"t": 0}

    def drifting(sha, boots):
        out = []
        for _ in range(boots):
            i = int(sha[1:])
            rng = np.random.default_rng([4, clock["t"]])
            mu = 95.0 if i >= culprit else 100.0
            out.append(mu * (1 + 0.004 * clock["t"]) + 0.8 * rng.standard_normal())
            clock["t"] += 1
        return out

    result = run_search(BisectionSearch(shas(n), expect=Expect.DECREASE), drifting)
    assert result.culprit == f"c{culprit:03d}" and result.stopped is StopReason.CONFIDENT


def test_wrong_candidate_is_not_reported_when_its_parent_is_the_same():
    """Feed a posterior that names c005 although nothing changes between c004 and c005:
    the head-to-head test refuses it."""
    search = BisectionSearch(shas(8), expect=Expect.DECREASE, max_boots=400)
    pass_endpoints(search, [100.0, 100.4, 99.6], [95.0, 95.4, 94.6])
    for i, v in {1: 100.1, 2: 99.9, 3: 100.2, 4: 99.9, 5: 95.1, 6: 94.9}.items():
        search.observe(f"c{i:03d}", [v, v + 0.2])
    rng = np.random.default_rng(3)
    tested = []
    while (rnd := search.next_round()) is not None and rnd[0].purpose == "verify":
        tested.append(tuple(sorted(p.commit for p in rnd)))
        search.observe_round(rnd, [[100.0 + 1.0 * rng.standard_normal()] for _ in rnd])
    assert tested[0] == ("c004", "c005")
    result = search.result()
    assert result.culprit is None and result.stopped is not StopReason.CONFIDENT
    assert result.verify_test.decision == "failed"
    # every test is in the result, the failed one too, with the commits it compared
    assert [(t.number, t.kind, t.good, t.bad, t.test.decision) for t in result.tests][:2] == [
        (0, "endpoints", "c000", "c007", "passed"), (1, "verify", "c004", "c005", "failed")]
    assert result.tests[1].test.pairs == len(tested) or len(result.tests) > 2


def test_each_round_of_a_paired_test_says_which_test_it_is_a_side_of():
    engine = FakeEngine(12, 6, change=-0.2, within_cv=0.01, between_cv=0.005)
    search = search_for(engine, max_boots=200)
    seen = []
    while (rnd := search.next_round()) is not None:
        seen.append([(p.purpose, p.test) for p in rnd])
        search.observe_round(rnd, [engine(p.commit, p.boots) for p in rnd])
    result = search.result()
    assert result.culprit == engine.commits[6]
    for rnd in seen:
        for purpose, test in rnd:
            assert test == {"endpoints": 0, "verify": 1}.get(purpose), rnd  # probes and anchors: None
    kinds = [(t.number, t.kind, t.test.decision) for t in result.tests]
    assert kinds == [(0, "endpoints", "passed"), (1, "verify", "passed")]
    assert result.tests[1].good == engine.commits[5] and result.tests[1].bad == engine.commits[6]
    assert result.tests[0].test.pairs == sum(1 for r in seen if r[0][0] == "endpoints")


def test_paired_sequential_test_keeps_alpha_under_heavy_tailed_null():
    rng = np.random.default_rng(11)
    passes = 0
    trials = 3000
    for _ in range(trials):
        d = rng.standard_t(2, size=16) * rng.choice([-1.0, 1.0], size=16)
        passes += paired_sequential_test(d, alpha=0.05, min_pairs=3, max_pairs=16).decision == "passed"
    assert passes / trials <= 0.05
    assert look_schedule(3, 16) == (3, 5, 8, 12, 16)
    shown = paired_sequential_test([5.0, 4.0, 6.0, 5.5, 4.5], alpha=0.05, min_pairs=3, max_pairs=16)
    assert shown.decision == "passed" and shown.pairs == 3


# ------------------------------------------------------------------ unmeasurable commits (the failure policy)


def test_an_empty_result_is_asked_again_not_skipped():
    eng = FakeEngine(16, 9, change=-0.2)
    search = search_for(eng, max_boots=200)
    rnd = search.next_round()
    search.observe_round(rnd, [[] for _ in rnd])  # every boot of the round failed, none for good
    assert search.result().skipped == ()
    assert search.next_round() == rnd  # the same round, again


def test_a_set_with_an_unbuildable_parent_is_verified_head_to_head():
    culprit = 9
    eng = FakeEngine(16, culprit, change=-0.2, unbuildable=(culprit - 1,))
    res = run_search(search_for(eng, max_boots=300), eng)
    assert res.stopped is StopReason.AMBIGUOUS_SKIPS, res
    assert res.candidate_set == (eng.commits[culprit - 1], eng.commits[culprit])
    assert res.culprit is None
    assert res.verify_test is not None and res.verify_test.decision == "passed"
    verified = {sha for sha, _ in eng.calls[-2:]}  # the last paired round: the set's ends
    assert verified == {eng.commits[culprit - 2], eng.commits[culprit]}


def test_a_head_to_head_test_whose_commit_fails_is_abandoned_and_the_search_ends():
    culprit = 9
    eng = FakeEngine(16, culprit, change=-0.2)
    search = search_for(eng, max_boots=400)
    abandoned = []
    rounds = 0
    while (rnd := search.next_round()) is not None:
        rounds += 1
        assert rounds < 400, "the search asks for rounds for ever"
        results = []
        for p in rnd:
            if p.purpose == "verify" and p.commit == eng.commits[culprit - 1]:
                results.append(None)  # the parent stops booting in the middle of its test
                abandoned.append(p.commit)
            else:
                results.append(eng(p.commit, p.boots))
        search.observe_round(rnd, results)
    res = search.result()
    assert abandoned, "the head-to-head test never started"
    assert res.stopped in (StopReason.AMBIGUOUS_SKIPS, StopReason.UNVERIFIED), res
    if res.stopped is StopReason.AMBIGUOUS_SKIPS:  # verified with the parent stepped over
        assert eng.commits[culprit] in res.candidate_set and eng.commits[culprit - 1] in res.candidate_set


# -- the least change that counts (min_effect) ------------------------------------------


def test_a_paired_test_ends_below_once_the_changes_upper_bound_is_under_the_least_change():
    diffs = [0.3, -0.2, 0.1, 0.0, -0.1, 0.2, -0.3, 0.1]
    t = paired_sequential_test(diffs, alpha=0.05, min_pairs=3, max_pairs=24, below=5.0)
    assert t.decision == "below" and t.upper < 5.0 and t.below == 5.0
    assert t.pairs in look_schedule(3, 24) and t.pairs < len(diffs) + 1
    # the same rounds without a least change: not decided, as before
    open_ = paired_sequential_test(diffs[:5], alpha=0.05, min_pairs=3, max_pairs=24)
    assert open_.decision == "open" and open_.below is None
    # a least change the bound does not clear: still open
    assert paired_sequential_test(diffs[:5], alpha=0.05, min_pairs=3, max_pairs=24, below=0.05).decision == "open"
    with pytest.raises(ValueError, match="below must be a positive finite change"):
        paired_sequential_test(diffs, alpha=0.05, min_pairs=3, max_pairs=24, below=0.0)


def test_a_change_as_large_as_the_least_one_ends_below_at_most_alpha_of_the_time():
    # Gaussian paired differences whose true mean is the least change: "below" is a wrong answer
    # there, and the looks together may give it at most alpha.
    rng = np.random.default_rng(3)
    alpha, least, sd, runs = 0.05, 5.0, 2.2, 3000
    below = sum(paired_sequential_test(least + sd * rng.standard_normal(24), alpha=alpha, min_pairs=3,
                                       max_pairs=24, below=least).decision == "below" for _ in range(runs))
    assert below / runs <= alpha, below / runs
    # and where nothing changed it says so well before the last look
    ends = [paired_sequential_test(sd * rng.standard_normal(24), alpha=alpha, min_pairs=3, max_pairs=24,
                                   below=least) for _ in range(500)]
    assert sum(t.decision == "below" for t in ends) / 500 >= 0.9
    assert np.mean([t.pairs for t in ends if t.decision == "below"]) <= 8


def test_no_change_is_not_reproduced_in_fewer_rounds_with_a_least_change():
    engine = FakeEngine(64, 20, change=0.0, seed=7)
    plain = run_search(search_for(engine, seed=1), engine)
    engine = FakeEngine(64, 20, change=0.0, seed=7)
    least = run_search(search_for(engine, seed=1, min_effect=0.05), engine)
    assert least.stopped is StopReason.NOT_REPRODUCED and least.endpoint_test.decision == "below"
    assert least.endpoint_test.upper < least.endpoint_test.below == pytest.approx(5.0, rel=0.05)
    assert plain.endpoint_test.decision != "below"
    assert least.boots_used < plain.boots_used, (least.boots_used, plain.boots_used)


def test_a_change_above_the_least_one_is_still_found():
    engine = FakeEngine(64, 37, change=-0.10, seed=2)
    result = run_search(search_for(engine, min_effect=0.05), engine)
    assert result.stopped is StopReason.CONFIDENT and result.culprit == engine.commits[37]
    assert result.endpoint_test.decision == "passed"


@pytest.mark.parametrize("bad", [0.0, 1.0, 5, True, "5%"])
def test_min_effect_outside_0_1_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="min_effect must be a relative change strictly between 0 and 1"):
        BisectionSearch(shas(8), expect=Expect.DECREASE, min_effect=bad)


def test_a_verdicts_rounds_open_the_endpoint_check():
    engine = FakeEngine(32, 11, change=-0.10, seed=4)
    search = search_for(engine)
    for k in range(5):  # five paired rounds of the two endpoints, booted before the search
        search.observe_endpoint_round(engine.boot(engine.commits[0], 100 + k), engine.boot(engine.commits[-1], 100 + k))
    first = search.next_round()
    assert all(p.purpose != "endpoints" for p in first), "they decided the check: the search probes at once"
    assert search.result().endpoint_test.decision == "passed" and search.boots_used == 10
    result = run_search(search, engine)
    assert result.culprit == engine.commits[11] and result.tests[0].test.pairs in (3, 5)

    # rounds that do not decide it: the check boots on from them (its first look at 3 pairs)
    engine = FakeEngine(32, 11, change=0.0, seed=4)
    search = search_for(engine)
    search.observe_endpoint_round(engine.boot(engine.commits[0], 100), engine.boot(engine.commits[-1], 100))
    rnd = search.next_round()
    assert [p.purpose for p in rnd] == ["endpoints", "endpoints"]
    with pytest.raises(ValueError, match="must be finite"):
        search.observe_endpoint_round(float("nan"), 1.0)
