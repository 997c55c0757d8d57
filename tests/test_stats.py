"""Statistics: checked against scipy, a textbook example and seeded simulations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from bisect_harness.decide import (
    boundaries, components, design, evaluate as evaluate_module, kernel, multiplicity, power, shift, signflip,
    simulate as simulate_module, ttest,
)
from bisect_harness.decide.analyses import base, paired, robust, unpaired
from bisect_harness.decide.analyses.robust import robust_split
from bisect_harness.decide.boundaries import _null_p_paths, nominal_levels, spent_alpha
from bisect_harness.decide.components import variance_components
from bisect_harness.decide.design import ANALYSES, SPENDING_FUNCTIONS, Design
from bisect_harness.decide.evaluate import OUTCOME_FOOTNOTE, evaluate
from bisect_harness.decide.multiplicity import adjust_alpha
from bisect_harness.decide.power import noise_floor, smallest_detectable_effect
from bisect_harness.decide.signflip import _sf_spent, _sign_flip
from bisect_harness.decide.simulate import _draw, _run_paths, simulate
from bisect_harness.decide.ttest import naive_pooled_t, welch_t
from bisect_harness.model import Expect, Outcome

INC, DEC = Expect.INCREASE, Expect.DECREASE
#: The analyses whose boundaries are calibrated t-tests (the simulations of many
#: thousand paths below); the robust analysis has tests of its own (it runs its
#: t part through the same code, and its sign-flip part is checked exactly).
T_ANALYSES = ("paired", "unpaired")


def boots_from(rng, mean, n_boots, *, between=0.01, within=0.02, samples=3):
    level = mean * (1 + between * rng.standard_normal(n_boots))
    return [list(lv * (1 + within * rng.standard_normal(samples))) for lv in level]


# ------------------------------------------------------------ against scipy


def test_welch_matches_scipy():
    rng = np.random.default_rng(1)
    a, b = rng.normal(10, 1, 7), rng.normal(10.8, 2.5, 5)
    ours = welch_t(a, b)
    ref = st.ttest_ind(b, a, equal_var=False)
    assert ours.statistic == pytest.approx(ref.statistic, rel=1e-12)
    assert ours.p_two_sided == pytest.approx(ref.pvalue, rel=1e-10)
    assert ours.p_greater == pytest.approx(
        st.ttest_ind(b, a, equal_var=False, alternative="greater").pvalue, rel=1e-10)
    assert ours.p_less == pytest.approx(
        st.ttest_ind(b, a, equal_var=False, alternative="less").pvalue, rel=1e-10)
    assert ours.df == pytest.approx(ref.df, rel=1e-12)


def test_naive_pooled_t_is_welch_on_all_samples():
    rng = np.random.default_rng(2)
    base, treat = boots_from(rng, 100, 4), boots_from(rng, 101, 5)
    ours = naive_pooled_t(base, treat)
    ref = st.ttest_ind(np.concatenate(treat), np.concatenate(base), equal_var=False)
    assert ours.statistic == pytest.approx(ref.statistic, rel=1e-12)
    assert ours.p_two_sided == pytest.approx(ref.pvalue, rel=1e-10)


def test_evaluate_p_value_is_one_sided_welch_on_log_boot_means():
    rng = np.random.default_rng(3)
    base, treat = boots_from(rng, 100, 5), boots_from(rng, 103, 5)
    v = evaluate(base, treat, expect=INC, min_effect=0.01)
    lb = np.log([np.mean(b) for b in base])
    lt = np.log([np.mean(b) for b in treat])
    ref = st.ttest_ind(lt, lb, equal_var=False, alternative="greater")
    assert v.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    assert v.ratio == pytest.approx(math.exp(lt.mean() - lb.mean()), rel=1e-12)
    assert v.n_boots == (5, 5) and v.n_samples == (15, 15)
    down = evaluate(base, treat, expect=DEC, min_effect=0.01)
    assert down.p_value == pytest.approx(1 - ref.pvalue, rel=1e-10)


def test_paired_p_value_is_scipy_ttest_rel_on_per_round_log_ratios():
    rng = np.random.default_rng(40)
    base, treat = boots_from(rng, 100, 5), boots_from(rng, 103, 5)
    d = Design(analysis="paired")
    v = evaluate(base, treat, expect=INC, min_effect=0.01, design=d)
    lb = np.log([np.mean(b) for b in base])
    lt = np.log([np.mean(b) for b in treat])
    ref = st.ttest_rel(lt, lb, alternative="greater")
    assert v.p_value == pytest.approx(ref.pvalue, rel=1e-10)
    assert v.ratio == pytest.approx(math.exp(np.mean(lt - lb)), rel=1e-12)
    assert v.analysis == "paired" and v.n_pairs == 5 and "paired" in v.test and "Welch" not in v.test
    half = v.ci[1] / v.ratio
    crit = st.t.isf(v.p_threshold, 4) * np.std(lt - lb, ddof=1) / math.sqrt(5)
    assert math.log(half) == pytest.approx(crit, rel=1e-10)
    assert evaluate(base, treat, expect=INC, min_effect=0.01).analysis == "unpaired"  # the default


def test_paired_rounds_match_boots_by_label_and_drop_unmatched_rounds():
    rng = np.random.default_rng(41)
    base, treat = boots_from(rng, 100, 5), boots_from(rng, 102, 4)
    d = Design(analysis="paired", min_boots=3, max_boots=6)
    # Treatment's round 2 failed: its four boots are rounds 0, 1, 3, 4.
    v = evaluate(base, treat, expect=INC, min_effect=0.01, design=d, rounds=([0, 1, 2, 3, 4], [0, 1, 3, 4]))
    lb = np.log([np.mean(b) for b in base])[[0, 1, 3, 4]]
    lt = np.log([np.mean(b) for b in treat])
    assert v.n_pairs == 4 and v.n_boots == (5, 4)
    assert v.p_value == pytest.approx(st.ttest_rel(lt, lb, alternative="greater").pvalue, rel=1e-10)
    assert not v.final and "Round incomplete" in v.reason
    with pytest.raises(ValueError, match="round holds two boots"):
        evaluate(base, treat, expect=INC, min_effect=0.01, design=d, rounds=([0, 0, 1, 2, 3], [0, 1, 2, 3]))
    with pytest.raises(ValueError, match="one label per boot"):
        evaluate(base, treat, expect=INC, min_effect=0.01, design=d, rounds=([0, 1, 2], [0, 1, 2, 3]))
    few = evaluate(base[:1], treat[:1], expect=INC, min_effect=0.01, design=d)
    assert few.outcome is Outcome.INCONCLUSIVE and few.ci is None and "round(s) with both arms" in few.reason


def test_paired_analysis_cancels_what_moves_whole_rounds():
    # Each round's host level moves by +-10% (a neighbour comes and goes), the
    # treatment is 3% faster within every round: blocks see it, Welch cannot.
    rng = np.random.default_rng(42)
    base, treat = [], []
    for _ in range(6):
        host = 1 + 0.10 * rng.standard_normal()
        base.append(list(100 * host * (1 + 0.005 * rng.standard_normal(3))))
        treat.append(list(103 * host * (1 + 0.005 * rng.standard_normal(3))))
    kw = dict(expect=INC, min_effect=0.015)
    paired = evaluate(base, treat, design=Design(analysis="paired"), **kw)
    unpaired = evaluate(base, treat, design=Design(analysis="unpaired"), **kw)
    assert paired.outcome is Outcome.CONFIRMED and paired.ratio == pytest.approx(1.03, abs=0.01)
    assert unpaired.outcome is not Outcome.CONFIRMED


# ------------------------------------------------------- variance components


def test_variance_components_montgomery_loom_example():
    # Montgomery, Design and Analysis of Experiments (5th ed., Example 13-1; 8th ed.,
    # Example 3.11): four looms, four strength determinations each. The book's ANOVA
    # gives MS_treatments = 29.73, MS_E = 1.90, so sigma_tau^2 = (29.73 - 1.90)/4 = 6.96.
    looms = [[98, 97, 99, 96], [91, 90, 93, 92], [96, 95, 97, 95], [95, 96, 99, 98]]
    vc = variance_components(looms)
    assert vc.ms_between == pytest.approx(29.73, abs=0.005)
    assert vc.ms_within == pytest.approx(1.90, abs=0.005)
    assert vc.var_between == pytest.approx(6.96, abs=0.005)
    assert vc.var_within == pytest.approx(1.90, abs=0.005)
    assert (vc.df_between, vc.df_within, vc.n0) == (3, 12, 4.0)
    assert vc.grand_mean == pytest.approx(95.4375)
    assert vc.between_cv == pytest.approx(math.sqrt(vc.var_between) / 95.4375)


def test_variance_components_unbalanced_matches_f_oneway():
    rng = np.random.default_rng(4)
    groups = [rng.normal(50 + rng.normal(0, 2), 1, n) for n in (2, 5, 3, 4, 6)]
    vc = variance_components(groups)
    f = st.f_oneway(*groups).statistic
    assert vc.ms_between / vc.ms_within == pytest.approx(f, rel=1e-10)
    n = np.array([2, 5, 3, 4, 6])
    assert vc.n0 == pytest.approx((n.sum() - (n ** 2).sum() / n.sum()) / 4)
    assert vc.var_between == pytest.approx((vc.ms_between - vc.ms_within) / vc.n0)


def test_variance_components_recover_simulated_cvs():
    rng = np.random.default_rng(5)
    vc = variance_components(boots_from(rng, 100, 400, between=0.03, within=0.05, samples=4))
    assert vc.between_cv == pytest.approx(0.03, rel=0.15)
    assert vc.within_cv == pytest.approx(0.05, rel=0.05)


def test_between_variance_clips_at_zero():
    vc = variance_components([[1.0, 3.0], [3.0, 1.0]])
    assert vc.var_between == 0.0 and vc.between_cv == 0.0


# ----------------------------------------------------------- the three outcomes


def test_clear_increase_is_confirmed_at_first_look():
    rng = np.random.default_rng(6)
    v = evaluate(boots_from(rng, 100, 3), boots_from(rng, 120, 3), expect=INC, min_effect=0.10)
    assert v.outcome is Outcome.CONFIRMED and v.final and v.look == 3
    assert v.ci[0] > 1.0 and v.ratio >= 1.10
    assert v.p_value <= v.p_threshold
    assert "Confirmed" in v.reason


def test_clear_decrease_is_confirmed():
    rng = np.random.default_rng(7)
    v = evaluate(boots_from(rng, 82, 3), boots_from(rng, 60, 3), expect=DEC, min_effect=0.10)
    assert v.outcome is Outcome.CONFIRMED and v.ci[1] < 1.0


def test_no_change_refutes_a_large_hypothesis_and_opposite_direction_refutes():
    rng = np.random.default_rng(8)
    same = evaluate(boots_from(rng, 100, 3), boots_from(rng, 100, 3), expect=INC, min_effect=0.10)
    assert same.outcome is Outcome.REFUTED and same.final
    assert same.ci[1] < 1.10
    wrong_way = evaluate(boots_from(rng, 100, 3), boots_from(rng, 80, 3), expect=INC, min_effect=0.0)
    assert wrong_way.outcome is Outcome.REFUTED


def test_noisy_small_effect_is_inconclusive_then_final_at_budget():
    rng = np.random.default_rng(9)
    base = boots_from(rng, 100, 8, between=0.05, within=0.05)
    treat = boots_from(rng, 102, 8, between=0.05, within=0.05)
    early = evaluate(base[:3], treat[:3], expect=INC, min_effect=0.02)
    assert early.outcome is Outcome.INCONCLUSIVE and not early.final
    late = evaluate(base, treat, expect=INC, min_effect=0.02)
    assert late.outcome is Outcome.INCONCLUSIVE and late.final
    assert "Budget" in late.reason


def test_real_but_smaller_than_hypothesised_is_not_confirmed():
    rng = np.random.default_rng(10)
    v = evaluate(boots_from(rng, 100, 8, between=0.002, within=0.002),
                 boots_from(rng, 103, 8, between=0.002, within=0.002), expect=INC, min_effect=0.10)
    assert v.p_value < 1e-6
    assert v.outcome is Outcome.REFUTED


def test_before_first_look_and_incomplete_round_are_not_final():
    rng = np.random.default_rng(11)
    base, treat = boots_from(rng, 100, 4), boots_from(rng, 150, 4)
    one = evaluate(base[:1], treat[:1], expect=INC, min_effect=0.1)
    assert one.outcome is Outcome.INCONCLUSIVE and not one.final and one.ci is None
    assert one.ratio == pytest.approx(np.mean(treat[0]) / np.mean(base[0]))
    two = evaluate(base[:2], treat[:2], expect=INC, min_effect=0.1)
    assert not two.final and two.p_value is not None and two.look is None
    uneven = evaluate(base[:4], treat[:3], expect=INC, min_effect=0.1)
    assert uneven.outcome is Outcome.INCONCLUSIVE and not uneven.final
    assert "Round incomplete" in uneven.reason


def test_verdict_reports_components_and_footnote_names_outcomes():
    rng = np.random.default_rng(12)
    v = evaluate(boots_from(rng, 100, 3), boots_from(rng, 100, 3), expect=INC, min_effect=0.05)
    assert all(c is not None and c >= 0 for c in v.between_cv + v.within_cv)
    assert v.ci_level == pytest.approx(0.90) and v.alpha == 0.05 and v.expect is INC
    assert "Welch" in v.test and "log boot means" in v.test
    for word in ("Confirmed", "Refuted", "Inconclusive"):
        assert word in OUTCOME_FOOTNOTE


def test_public_names():
    for module in (boundaries, components, design, evaluate_module, kernel, multiplicity, power, shift, signflip,
                   simulate_module, ttest, base, paired, robust, unpaired):
        for name in module.__all__:
            assert hasattr(module, name), name


# ------------------------------------------------------ sequential boundaries


@pytest.mark.parametrize("spending", SPENDING_FUNCTIONS)
def test_boundaries_are_monotone_and_spend_at_most_alpha(spending):
    d = Design(spending=spending)
    spent = spent_alpha(d)
    assert np.all(np.diff(spent) > 0) and spent[-1] == pytest.approx(0.05)
    levels = np.array(nominal_levels(d))
    # Welch p-values on few boots are conservative, so a level may exceed its spent
    # alpha; whether the levels really spend alpha is checked by simulation below.
    assert np.all(levels > 0) and np.all(levels < 0.05)
    if spending == "obrien-fleming":
        # Strict early, lenient late: levels rise and the critical t falls at each look.
        assert np.all(np.diff(levels) > 0)
        crit = [st.t.isf(p, 2 * k - 2) for p, k in zip(levels, d.looks)]
        assert np.all(np.diff(crit) < 0)
    else:
        # Pocock-type: nearly flat levels after the first look, the first the largest
        # (Welch's df on 3 boots per arm is the most conservative there).
        assert levels[0] == levels.max() and levels[1:].max() / levels[1:].min() < 1.3


def test_single_look_design_is_the_plain_test():
    assert nominal_levels(Design(min_boots=5, max_boots=5), 0.025) == (0.025,)


def test_crossing_probability_by_look_follows_spending():
    # The paired test's null law is exact, so its crossings follow the spending
    # function; the unpaired test's boundaries hold at the least favourable
    # variance ratio and cross less often at equal variances (tested below).
    d = Design(analysis="paired")
    r = simulate(0.0, between_cv=0.01, within_cv=0.02, min_effect=0.0, design=d, n_sim=20000, seed=13)
    confirmed_by = [np.mean((r.outcomes == 1) & (r.boots <= k)) for k in d.looks]
    np.testing.assert_allclose(confirmed_by, spent_alpha(d), atol=0.006)


# ----------------------------------------------------- error rates and coverage


@pytest.mark.parametrize("spending,between,within", [
    ("pocock", 0.01, 0.02), ("pocock", 0.03, 0.05), ("pocock", 0.0, 0.02),
    ("obrien-fleming", 0.01, 0.02)])
@pytest.mark.parametrize("analysis", T_ANALYSES)
def test_aa_false_confirmed_rate_at_most_alpha(spending, between, within, analysis):
    r = simulate(0.0, between_cv=between, within_cv=within, min_effect=0.0,
                 design=Design(spending=spending, analysis=analysis), n_sim=12000, seed=14)
    assert r.confirmed <= 0.05 + 0.007  # 3.5 standard errors
    # Not needlessly conservative: the paired test is exact; the unpaired one pays
    # for holding alpha at every variance ratio with about a third of alpha at equal
    # variances (measured 0.033-0.036).
    assert r.confirmed >= (0.05 - 0.012 if analysis == "paired" else 0.025)


@pytest.mark.parametrize("between_b", [0.04, 0.06, 0.08, 0.20])
@pytest.mark.parametrize("analysis", T_ANALYSES)
def test_aa_false_confirmed_rate_holds_with_unequal_variances(between_b, analysis):
    # The measurement: 1% vs 4-8% between-boot CV took the A/A rate to
    # 0.0625-0.066 with boundaries calibrated at equal variances only.
    d = Design(min_boots=3, max_boots=6, analysis=analysis)
    r = simulate(0.0, between_cv=0.01, within_cv=0.02, min_effect=0.0, design=d, n_sim=20000,
                 seed=30, between_cv_b=between_b)
    assert r.confirmed <= 0.05 + 0.0055  # 3.5 standard errors


def test_unpaired_levels_hold_at_the_least_favourable_variance_ratio():
    d = Design(min_boots=3, max_boots=6, analysis="unpaired")
    levels = np.array(nominal_levels(d))
    rng = np.random.default_rng(31)
    rates = {}
    for ratio in (1.0, 4.0, 16.0, 1e6):  # fresh paths, not the calibration's
        p = _null_p_paths(rng, 200_000, d.looks, 0.2, "unpaired", ratio)
        rates[ratio] = (p <= levels).any(axis=1).mean()
    assert max(rates.values()) <= 0.05 + 0.0015, rates
    # the bound binds at an unequal ratio, and equal variances pay for it
    assert max(rates[16.0], rates[1e6]) >= 0.043 and rates[1.0] < 0.04, rates


def test_false_refuted_rate_at_most_alpha_when_effect_equals_hypothesis():
    r = simulate(0.03, between_cv=0.01, within_cv=0.02, min_effect=0.03, n_sim=20000, seed=15)
    assert r.refuted <= 0.05 + 0.006


@pytest.mark.parametrize("analysis", T_ANALYSES)
def test_effect_equal_to_min_effect_is_confirmed_well_short_of_one_minus_alpha(analysis):
    # What CONFIRMED promises: no error against zero, and an estimate of at least E;
    # not that the effect is at least E. At effect = E it is little better than a coin.
    d = Design(min_boots=3, max_boots=6, analysis=analysis)
    r = simulate(0.03, between_cv=0.01, within_cv=0.02, min_effect=0.03, design=d, n_sim=20000, seed=33)
    assert 0.5 <= r.confirmed <= 0.66 and r.refuted <= 0.05 + 0.005
    below = simulate(0.025, between_cv=0.01, within_cv=0.02, min_effect=0.03, design=d, n_sim=20000, seed=34)
    assert below.confirmed >= 0.3  # a true effect under E is confirmed often


def test_naive_pooled_test_overstates_confidence():
    r = simulate(0.0, between_cv=0.03, within_cv=0.05, min_effect=0.0, n_sim=20000, seed=16)
    assert r.naive_confirmed > 0.07 and r.naive_peeking_confirmed > 0.12


def test_family_of_twelve_aa_checks_with_bonferroni():
    m = 12
    a = adjust_alpha(0.05, m)
    r = simulate(0.0, between_cv=0.01, within_cv=0.02, min_effect=0.0, alpha=a,
                 n_sim=m * 2000, seed=17)
    any_false = (r.outcomes.reshape(2000, m) == 1).any(axis=1).mean()
    assert any_false <= 0.05 + 0.012


@pytest.mark.parametrize("analysis", ANALYSES)
def test_simulate_decides_exactly_like_evaluate(analysis):
    d = Design(analysis=analysis)
    rng = np.random.default_rng(18)
    samples = _draw(rng, 60, 0.02, 0.01, 0.02, d.max_boots, d.samples_per_boot)
    outcomes, boots, _ = _run_paths(samples, INC, 0.01, d, 0.05)
    code = {Outcome.CONFIRMED: 1, Outcome.REFUTED: -1, Outcome.INCONCLUSIVE: 0}
    for i in range(samples.shape[1]):
        for k in d.looks:
            v = evaluate(samples[0, i, :k], samples[1, i, :k], expect=INC, min_effect=0.01, design=d)
            if v.final:
                break
        assert (code[v.outcome], k) == (outcomes[i], boots[i])


def test_ci_coverage_fixed_design():
    rng = np.random.default_rng(19)
    d = Design(min_boots=4, max_boots=4)
    hits = 0
    n = 400
    for _ in range(n):
        v = evaluate(boots_from(rng, 100, 4), boots_from(rng, 104, 4), expect=INC, min_effect=0.0, design=d)
        hits += v.ci[0] <= 1.04 <= v.ci[1]
    assert abs(hits / n - 0.90) <= 0.045


def test_repeated_ci_coverage_at_sequential_stop():
    d = Design()
    rng = np.random.default_rng(20)
    samples = _draw(rng, 250, 0.03, 0.01, 0.02, d.max_boots, d.samples_per_boot)
    outcomes, boots, _ = _run_paths(samples, INC, 0.015, d, 0.05)
    hits = 0
    for i in range(samples.shape[1]):
        k = boots[i]
        v = evaluate(samples[0, i, :k], samples[1, i, :k], expect=INC, min_effect=0.015, design=d)
        hits += v.ci[0] <= 1.03 <= v.ci[1]
    assert hits / samples.shape[1] >= 0.90 - 0.04


# ------------------------------------------------------------ noise floor


def test_smallest_detectable_effect_has_the_promised_power():
    rng = np.random.default_rng(21)
    aa = boots_from(rng, 100, 300), boots_from(rng, 100, 300)
    est = noise_floor(*aa, design=Design())
    assert est.boot_mean_cv == pytest.approx(math.sqrt(0.01 ** 2 + 0.02 ** 2 / 3), rel=0.1)
    sde = est.smallest_detectable_effect
    assert sde == smallest_detectable_effect(*aa)
    r = simulate(sde, between_cv=0.01, within_cv=0.02, min_effect=0.0, n_sim=10000, seed=22)
    assert r.confirmed >= 0.8 - 0.02
    smaller = simulate(sde / 2, between_cv=0.01, within_cv=0.02, min_effect=0.0, n_sim=10000, seed=22)
    assert smaller.confirmed < 0.6
    bigger_budget = smallest_detectable_effect(*aa, design=Design(max_boots=4, min_boots=4))
    assert bigger_budget > sde
    # Paired: n - 1 degrees of freedom instead of 2n - 2, so a larger floor, and the
    # promised power holds for the paired test too.
    dp = Design(analysis="paired")
    sde_p = smallest_detectable_effect(*aa, design=dp)
    assert sde_p > sde
    rp = simulate(sde_p, between_cv=0.01, within_cv=0.02, min_effect=0.0, design=dp, n_sim=10000, seed=22)
    assert rp.confirmed >= 0.8 - 0.02


# ------------------------------------------------------------ bad inputs


@pytest.mark.parametrize("boots,msg", [
    ([], "no boots"),
    ([[100.0, 101.0], []], "has no samples"),
    ([[100.0, float("nan")], [100.0]], "NaN"),
    ([[100.0, 0.0], [100.0]], "non-positive"),
    ([[100.0, -3.0], [100.0]], "non-positive"),
    ([100.0, 101.0], "single number"),
])
def test_evaluate_rejects_bad_boots(boots, msg):
    with pytest.raises(ValueError, match=msg):
        evaluate(boots, [[100.0]] * 3, expect=INC, min_effect=0.1)
    with pytest.raises(ValueError, match=msg):
        evaluate([[100.0]] * 3, boots, expect=INC, min_effect=0.1)


def test_single_boot_cannot_give_variance_components_or_noise():
    with pytest.raises(ValueError, match="single boot"):
        variance_components([[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="single boot"):
        noise_floor([[1.0, 2.0, 3.0]])


@pytest.mark.parametrize("kwargs,msg", [
    (dict(min_effect=-0.1), "min_effect"),
    (dict(min_effect=float("nan")), "min_effect"),
    (dict(min_effect=1.0, expect=DEC), "below 1"),
    (dict(alpha=0.7), "alpha"),
    (dict(expect="increase"), "Expect"),
])
def test_evaluate_rejects_bad_parameters(kwargs, msg):
    args = dict(expect=INC, min_effect=0.1) | kwargs
    with pytest.raises(ValueError, match=msg):
        evaluate([[1.0, 1.1]] * 3, [[1.0, 1.2]] * 3, **args)


def test_constant_data_is_an_error_not_a_verdict():
    with pytest.raises(ValueError, match="no variation"):
        evaluate([[5.0]] * 3, [[5.0]] * 3, expect=INC, min_effect=0.1)


@pytest.mark.parametrize("kwargs", [dict(alpha=0), dict(min_boots=1), dict(max_boots=2),
                                    dict(spending="linear"), dict(samples_per_boot=0)])
def test_design_validates(kwargs):
    with pytest.raises(ValueError, match="Design"):
        Design(**kwargs)


def test_adjust_alpha():
    assert adjust_alpha(0.05, 12) == pytest.approx(0.05 / 12)
    with pytest.raises(ValueError, match="holm"):
        adjust_alpha(0.05, 12, method="holm")
    with pytest.raises(ValueError, match="m "):
        adjust_alpha(0.05, 0)


@pytest.mark.parametrize("analysis", ["unpaired", "paired"])
@pytest.mark.parametrize("dd, spread, log_e", [(0.0, 0.07, 0.05), (0.03, 0.04, 0.05), (0.12, 0.3, 0.05)])
def test_boots_to_decide_is_the_fewest_that_decide_at_the_spread_seen(analysis, dd, spread, log_e):
    import re

    from scipy import stats as st

    from bisect_harness.decide.evaluate import boots_to_decide

    level = 0.05
    text = boots_to_decide(dd, spread, log_e, level, "-5.0%", analysis)
    n = int(re.search(r"about ([\d,]+) ", text).group(1).replace(",", ""))
    refute = dd < log_e
    assert ("refuting -5.0%" in text) == refute and ("showing the change" in text) == (not refute)

    def decides(k):  # the one-sided test at `level` with k boots per arm (rounds), the estimate unchanged
        df = k - 1 if analysis == "paired" else 2 * k - 2
        se = spread / math.sqrt(k)
        z = (dd - log_e) / se if refute else -dd / se
        return st.t.cdf(z, df) <= level

    assert decides(n) and not decides(n - 1)


def test_at_a_sign_flip_look_the_rounds_to_decide_are_never_fewer_than_the_test_can_decide_with():
    import re

    from bisect_harness.decide.evaluate import boots_to_decide

    level = 0.002  # a sign-flip test reaches it from 9 rounds on (2^-9 = 0.00195), 2^-8 = 0.0039 does not
    t_only = boots_to_decide(0.0, 0.01, 0.05, level, "-5.0%", "paired")
    n_t = int(re.search(r"about ([\d,]+) ", t_only).group(1))
    assert n_t < 9  # a small spread: a t-test would refute within a few rounds
    text = boots_to_decide(0.0, 0.01, 0.05, level, "-5.0%", "robust", sign_flip=True)
    assert "about 9 rounds" in text and "2^-9" in text and f"a t-test would need {n_t}" in text
    # where the t-test's count is the larger, it stands as it was
    wide = boots_to_decide(0.0, 0.3, 0.05, level, "-5.0%", "robust", sign_flip=True)
    assert wide == boots_to_decide(0.0, 0.3, 0.05, level, "-5.0%", "robust")
    assert int(re.search(r"about ([\d,]+) ", wide).group(1).replace(",", "")) > 9


def test_a_hypothesis_undecided_at_its_budget_says_how_many_boots_would_decide_it():
    from bisect_harness.decide.design import Design
    from bisect_harness.decide.evaluate import evaluate

    b = [[100.0], [104.0], [97.0]]
    t = [[99.0], [102.0], [96.5]]
    v = evaluate(b, t, expect=Expect.DECREASE, min_effect=0.05, design=Design(min_boots=3, max_boots=3))
    assert v.outcome is Outcome.INCONCLUSIVE and v.final
    assert "At the spread seen, refuting -5.0% would take about" in v.reason


# ------------------------------------------------------------ the robust analysis


def _sf_parts(max_boots):
    d = Design(min_boots=3, max_boots=max_boots, analysis="robust")
    _, _, sf_looks, a_sf = robust_split(d, 0.05)
    return d, sf_looks, _sf_spent(d, sf_looks, a_sf)


def test_robust_splits_alpha_between_its_t_looks_and_its_sign_flip_looks():
    assert robust_split(Design(min_boots=3, max_boots=20, analysis="robust"), 0.05) == (
        (3, 4, 5, 6, 7, 8), pytest.approx(0.03), tuple(range(9, 21)), pytest.approx(0.02))
    assert robust_split(Design(min_boots=3, max_boots=5, analysis="robust"), 0.05) == ((3, 4, 5), 0.05, (), 0.0)
    assert robust_split(Design(min_boots=9, max_boots=11, analysis="robust"), 0.05) == ((), 0.0, (9, 10, 11), 0.05)
    # a sign-flip part that could let fewer than 8 of its 2^max_boots patterns cross: the t-test takes all
    assert robust_split(Design(min_boots=3, max_boots=9, analysis="robust"), 0.01) == (tuple(range(3, 10)), 0.01, (), 0.0)


@pytest.mark.parametrize("mags", [
    np.abs(np.random.default_rng(5).standard_normal(10)),
    np.r_[np.abs(np.random.default_rng(6).standard_normal(9)), 25.0],  # one round a burst hit
    np.ones(10),                                                       # every round alike: ties
    np.arange(1.0, 11.0)])
def test_sign_flip_crosses_at_most_its_spent_alpha_whatever_the_magnitudes(mags):
    """Exact, not simulated: under the null the signs are fair coins given the
    magnitudes, so enumerate all 2^10 sign patterns and count those that cross at
    some look (its looks of a 3..10 design: 9 and 10)."""
    import itertools

    _, sf_looks, spent = _sf_parts(10)
    crossed = 0
    for signs in itertools.product((-1.0, 1.0), repeat=10):
        x = np.array(signs) * mags
        crossed += any(_sign_flip(x, sf_looks[:j + 1], spent[:j + 1])[0] for j in range(len(sf_looks)))
    assert crossed / 2 ** 10 <= spent[-1]
    assert crossed / 2 ** 10 >= spent[-1] / 2  # and not needlessly conservative


def test_robust_aa_rate_holds_with_unequal_variances_tails_and_bursts():
    """A/A with one arm six times noisier, a tail of 20%-slow boots and a neighbour
    that slows whole stretches of boots: the confirm rate stays within alpha."""
    rng = np.random.default_rng(40)
    d = Design(min_boots=3, max_boots=10, analysis="robust")
    n, confirmed = 1500, 0
    for _ in range(n):
        burst = rng.random() < 0.3
        b, t = [], []
        for r in range(d.max_boots):
            for arm, cv in ((b, 0.01), (t, 0.06)):
                slow = 0.8 if rng.random() < 0.05 else 1.0
                slow *= 0.75 if (burst and 3 <= r < 6 and rng.random() < 0.5) else 1.0
                arm.append(list(100 * slow * (1 + cv * rng.standard_normal()) * (1 + 0.02 * rng.standard_normal(3))))
        for k in d.looks:
            v = evaluate(b[:k], t[:k], expect=DEC, min_effect=0.0, design=d, interval=False)
            if v.final:
                break
        confirmed += v.outcome is Outcome.CONFIRMED
    assert confirmed / n <= 0.05 + 0.016  # 3 standard errors


def test_robust_confirms_through_rounds_a_burst_hit_where_the_t_test_cannot():
    """Twelve rounds of a 6% slowdown; three rounds each lose one boot to a neighbour's
    burst (25% slow), one of them the baseline's. The clipped sign-flip test decides;
    the paired t-test, whose spread the three rounds blow up, does not."""
    rng = np.random.default_rng(41)
    b, t = [], []
    for r in range(12):
        bl, tl = 100 * (1 + 0.01 * rng.standard_normal()), 94 * (1 + 0.01 * rng.standard_normal())
        if r in (2, 6, 9):
            bl, tl = (bl * 0.75, tl) if r == 2 else (bl, tl * 0.75)
        b.append([bl])
        t.append([tl])
    robust = evaluate(b, t, expect=DEC, min_effect=0.03, design=Design(min_boots=3, max_boots=12, analysis="robust"))
    paired = evaluate(b, t, expect=DEC, min_effect=0.03, design=Design(min_boots=3, max_boots=12, analysis="paired"))
    assert robust.outcome is Outcome.CONFIRMED and paired.outcome is Outcome.INCONCLUSIVE
    assert robust.ratio == pytest.approx(0.94, abs=0.01)  # Hodges-Lehmann: the bursts barely move it
    lo, hi = robust.ci
    assert lo < robust.ratio < hi < 1.0  # the interval agrees with the verdict
    assert "sign-flip" in robust.test and robust.p_value <= robust.p_threshold


def test_robust_refutes_an_inert_change_and_its_interval_stops_short_of_the_claim():
    rng = np.random.default_rng(42)
    b = boots_from(rng, 100.0, 14, between=0.01)
    t = boots_from(rng, 100.0, 14, between=0.01)
    d = Design(min_boots=3, max_boots=14, analysis="robust")
    for k in d.looks:
        v = evaluate(b[:k], t[:k], expect=DEC, min_effect=0.05, design=d)
        if v.final:
            break
    assert v.outcome is Outcome.REFUTED and v.ci[0] > 0.95  # the bound on the claimed side stops short of -5%


def test_robust_effect_equal_to_min_effect_is_confirmed_about_half_the_time():
    d = Design(min_boots=3, max_boots=6, analysis="robust")
    r = simulate(0.03, between_cv=0.01, within_cv=0.02, min_effect=0.03, design=d, n_sim=1500, seed=33)
    assert 0.4 <= r.confirmed <= 0.6 and r.refuted <= 0.05 + 0.017


def test_a_sign_flip_look_that_no_pattern_can_cross_says_so_instead_of_a_level_of_zero():
    # At a small alpha the sign-flip part's first look (9 rounds, smallest p 2^-9) cannot
    # reach the alpha it has spent there (40% of 0.005, Pocock over 9..20: about 0.0011).
    rng = np.random.default_rng(1)
    b, t = ([[100 + rng.normal()] for _ in range(9)] for _ in range(2))
    design = Design(min_boots=3, max_boots=20, analysis="robust")
    v = evaluate(b, t, expect=Expect.DECREASE, min_effect=0.03, design=design, alpha=0.005)
    assert v.outcome is Outcome.INCONCLUSIVE and not v.final and v.p_threshold == 0.0
    assert "no pattern of signs can cross at 9 rounds" in v.reason and "vs 0;" not in v.reason
    # at 12 rounds (2^-12 below the alpha spent) the look has a level again: here, noise of
    # 1% against a claim of -3%, it refutes
    b12, t12 = ([[100 + rng.normal()] for _ in range(12)] for _ in range(2))
    v12 = evaluate(b12, t12, expect=Expect.DECREASE, min_effect=0.03, design=design, alpha=0.005)
    assert v12.p_threshold > 0 and v12.outcome is Outcome.REFUTED and "no pattern" not in v12.reason
