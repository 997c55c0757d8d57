"""Verdicts that deserve trust: one look at a hypothesis, from the boots of its two arms.

Pure functions and frozen dataclasses over numpy and scipy; no I/O, no logging.

The unit of replication
-----------------------
An arm's data is a sequence of boots, each boot a sequence of samples (e.g. tok/s).
Samples inside one boot share that boot's state (placement, clocks, caches), so they
are correlated; treating them as independent overstates confidence (see
:func:`~bisect_harness.decide.ttest.naive_pooled_t`, kept only for contrast). Every test and interval here is
built on one number per boot, the log of the boot's mean, ``L = log(mean(boot))``.
The spread of samples is summarised by a one-way random-effects model
(:func:`~bisect_harness.decide.components.variance_components`): ``y_ij = mu + b_i + e_ij`` with between-boot
variance ``var(b)`` and within-boot variance ``var(e)``, reported as CVs.

The test
--------
``ratio = exp(d)`` is the ratio of the geometric means of the boot means (for CVs
of a few percent it equals the ratio of the plain means to well under 0.1%). Three
analyses estimate ``d`` and test it (``Design.analysis``; the harness's default,
``defaults.analysis: robust`` in hypotheses.yaml, was chosen by
``bench/bench_stats.py``), one module each under ``decide/analyses/``:

* ``"robust"`` (the harness's default; :mod:`bisect_harness.decide.analyses.robust`):
  the rounds of ``"paired"``, a paired t-test at the first looks and a sign-flip
  test of the per-round log ratios clipped at their median size later.
* ``"paired"`` (:mod:`bisect_harness.decide.analyses.paired`): the mean per-round
  log ratio, rounds as blocks, by a one-sample t-test.
* ``"unpaired"`` (:mod:`bisect_harness.decide.analyses.unpaired`): the difference
  of the arms' mean log boot means, by Welch's t-test.

Each look is decided by the decision kernel's rule
(:mod:`bisect_harness.decide.kernel`, which says what CONFIRMED, REFUTED and
INCONCLUSIVE promise) at the look's nominal level
(:mod:`bisect_harness.decide.boundaries`: group-sequential alpha spending, levels
calibrated by simulation, repeated confidence intervals); a family of hypotheses
divides alpha (:mod:`bisect_harness.decide.multiplicity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy import stats as _st

from bisect_harness.decide.analyses.base import Arms
from bisect_harness.decide.analyses.paired import round_samples
from bisect_harness.decide.components import variance_components
from bisect_harness.decide.design import ANALYSES, Design
from bisect_harness.decide.kernel import _pct, log_effect
from bisect_harness.decide.prior import NoisePrior, pooled_variance
from bisect_harness.decide.ttest import _check_boots
from bisect_harness.evidence import VerdictStats
from bisect_harness.model import Expect, Outcome, jsonable, shown_apart

__all__ = ["OUTCOME_FOOTNOTE", "StatVerdict", "evaluate", "boots_to_decide"]

OUTCOME_FOOTNOTE = (
    "Confirmed: the change is real and in the stated direction (at most alpha chance "
    "of this verdict when there is no change, over all looks at the data), and the "
    "estimated effect reaches the hypothesised size. "
    "Refuted: the confidence bound shows the effect is smaller than hypothesised, "
    "absent, or the other way (at most alpha chance when the effect really is that "
    "large). "
    "Inconclusive: neither could be shown; more boots are needed, or the budget ran "
    "out. Tests use one value per boot (the boot is the unit): by default (defaults."
    "analysis: robust) the log ratios of the boots of each round, tested by a paired "
    "t-test at the first looks and a sign-flip test of the ratios clipped at their "
    "median size later (two shares of alpha); or a paired t-test at every look (paired), "
    "or a Welch t-test on log boot means (unpaired); all with group-sequential alpha "
    "spending whose error holds whatever the ratio of the two sides' variances; "
    "intervals are repeated confidence intervals at level 1-2*alpha; alpha is "
    "Bonferroni-divided over every hypothesis of the file, whatever --only selected."
)


@dataclass(frozen=True)
class StatVerdict:
    """The statistical answer to one hypothesis at one look.

    ``ratio`` is treatment/baseline (geometric mean of boot means); ``ci`` its
    repeated confidence interval at level ``ci_level = 1 - 2*alpha``; ``p_value``
    the one-sided p-value against "no change" in the hypothesised direction and
    ``p_threshold`` the nominal level of this look (confirmation needs
    ``p_value <= p_threshold``). ``ci``/``p_value`` are None while an arm has fewer
    than two boots. ``look`` is the boots per arm the boundary was taken at (None
    before the first look). ``n_boots``, ``n_samples``, ``between_cv`` and
    ``within_cv`` are (baseline, treatment) pairs. ``analysis`` is the design's
    (``"robust"``, ``"paired"`` or ``"unpaired"``); ``n_pairs`` the rounds holding
    a boot of each arm (the paired tests' sample size; None for the unpaired
    analysis). At the robust analysis' sign-flip looks ``ratio`` is the
    Hodges-Lehmann estimate, ``p_value`` the share of sign patterns at least as
    extreme as the observed at this look, ``p_threshold`` the share at the look's
    threshold, and ``ci`` is None until the test can bound the change on both
    sides. ``prior_pooled``: with a noise prior, whether this look's t-test pooled it;
    ``prior_contradicted``: whether the rounds' own spread contradicted it (the
    prior's check, made at every look; a sign-flip look pools no prior either way);
    both None without one.
    ``round_log_ratios``: the per-round log ratios the paired analyses read, in round
    order (what a later run's noise prior is made of), and ``round_samples`` the most
    samples either boot of each round holds; None for the unpaired analysis.
    """

    outcome: Outcome
    final: bool
    ratio: float
    ci: Optional[tuple[float, float]]
    ci_level: float
    p_value: Optional[float]
    p_threshold: Optional[float]
    test: str
    n_boots: tuple[int, int]
    n_samples: tuple[int, int]
    between_cv: tuple[Optional[float], Optional[float]]
    within_cv: tuple[Optional[float], Optional[float]]
    alpha: float
    min_effect: float
    expect: Expect
    look: Optional[int]
    reason: str
    analysis: str = "unpaired"
    n_pairs: Optional[int] = None
    prior_pooled: Optional[bool] = None
    prior_contradicted: Optional[bool] = None
    round_log_ratios: Optional[tuple[float, ...]] = None
    round_samples: Optional[tuple[int, ...]] = None

    def figures(self) -> VerdictStats:
        """The figures of this answer beyond a verdict's own fields, typed. The
        answer's own fields (outcome, final, ratio, ci, p_value, test, alpha, reason)
        ride along in ``extra`` as they are here, as a verdict's stored statistics have
        always held them (``final`` is this look's, before a caller forces it)."""
        answer = {name: getattr(self, name) for name in _ANSWER_FIELDS}
        return VerdictStats(
            ci_level=self.ci_level, p_threshold=self.p_threshold, n_boots=self.n_boots, n_samples=self.n_samples,
            between_cv=self.between_cv, within_cv=self.within_cv, min_effect=self.min_effect,
            expect=self.expect.value, look=self.look, analysis=self.analysis, n_pairs=self.n_pairs,
            prior_pooled=self.prior_pooled, prior_contradicted=self.prior_contradicted,
            round_log_ratios=self.round_log_ratios, round_samples=self.round_samples, extra=jsonable(answer))


#: The fields of :class:`StatVerdict` a verdict holds as its own (the rest are its figures).
_ANSWER_FIELDS = ("outcome", "final", "ratio", "ci", "p_value", "test", "alpha", "reason")


def _arm_summary(arrs: list[np.ndarray]):
    logs = np.log(np.array([a.mean() for a in arrs]))
    k = logs.size
    var = float(logs.var(ddof=1)) if k > 1 else float("nan")
    if k > 1:
        vc = variance_components(arrs)
        bcv, wcv = vc.between_cv, vc.within_cv
    else:
        bcv = None
        wcv = (float(arrs[0].std(ddof=1) / arrs[0].mean()) if arrs[0].size > 1 else None)
    return float(logs.mean()), var, k, int(sum(a.size for a in arrs)), bcv, wcv


def evaluate(baseline: Sequence[Sequence[float]], treatment: Sequence[Sequence[float]], *,
             expect: Expect, min_effect: float, design: Design = Design(),
             alpha: Optional[float] = None,
             rounds: Optional[tuple[Sequence[int], Sequence[int]]] = None,
             interval: bool = True, prior: Optional[NoisePrior] = None) -> StatVerdict:
    """Decide a hypothesis from all boots measured so far; call after every round.

    ``baseline`` and ``treatment`` are sequences of boots, each a sequence of
    positive samples. ``expect`` is the hypothesised direction of
    treatment vs baseline, ``min_effect`` the hypothesised relative size (0.10 =
    10%). ``alpha`` overrides ``design.alpha`` (pass :func:`~bisect_harness.decide.multiplicity.adjust_alpha`'s value
    for a family of hypotheses). The look is ``min(boots per arm)``; decisions are
    made only when both arms hold the same number of boots (a finished round) or
    the budget is reached; before ``design.min_boots`` boots per arm the answer is
    INCONCLUSIVE and not final. At ``max_boots`` (or more, which are analysed at
    the last look's boundary) the answer is final. See :mod:`bisect_harness.decide.kernel` for
    what each outcome promises.

    With ``design.analysis`` ``"paired"`` or ``"robust"`` the boots are matched by
    round: ``rounds`` is (baseline round labels, treatment round labels), one per
    boot (default: the i-th boot of each arm is round i); the look is the number of
    rounds holding a boot of each arm. The robust analysis decides its looks up to
    ``ROBUST_T_LAST_LOOK`` rounds as the paired one does (with its share of alpha)
    and its later looks by the sign-flip test of :mod:`bisect_harness.decide.signflip`; there ``ratio``
    is the Hodges-Lehmann estimate and ``ci`` the inverted test's repeated interval
    (``interval=False`` skips that inversion, about 40 sign-flip tests, and leaves
    ``ci`` None: the verdict does not depend on it; the benches use it). Rounds past
    the budget are not looked at by the sign-flip test (its boundary ends there).

    ``prior``: a noise prior of earlier runs of the same two configs on the same host
    (:mod:`bisect_harness.decide.prior`), which the paired t-test pools with the
    rounds' own variance where they do not contradict it; ``design.prior_dof`` must
    be its degrees of freedom (the boundaries are calibrated for it).

    >>> v = evaluate([[100, 101, 99], [102, 100, 101], [99, 100, 100]],
    ...              [[120, 121, 119], [122, 120, 121], [119, 121, 120]],
    ...              expect=Expect.INCREASE, min_effect=0.10)
    >>> v.outcome.value, v.final
    ('confirmed', True)

    Long because it is the one place a look becomes an answer: the arms' summaries, the
    analysis' estimate and look, the kernel's code and the reason share a dozen figures
    of the look, which functions would only pass back and forth.
    """
    if not isinstance(expect, Expect):
        raise ValueError(f"expect must be Expect.INCREASE or Expect.DECREASE, got {expect!r}")
    a = design.alpha if alpha is None else float(alpha)
    if not (0.0 < a < 0.5):
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if (prior.dof if prior is not None else 0) != design.prior_dof:
        raise ValueError(f"evaluate: the design is calibrated for a noise prior of {design.prior_dof} degrees of "
                         f"freedom, the prior given has {prior.dof if prior is not None else 0}; build the "
                         f"design with prior_dof=prior.dof")
    log_e = log_effect(expect, min_effect)
    arrs_b = _check_boots(baseline, "baseline", positive=True)
    arrs_t = _check_boots(treatment, "treatment", positive=True)
    mb, vb, kb, nb, bcv_b, wcv_b = _arm_summary(arrs_b)
    mt, vt, kt, nt, bcv_t, wcv_t = _arm_summary(arrs_t)
    span = f"over looks at {design.min_boots}..{design.max_boots} boots/arm"
    analysis = ANALYSES[design.analysis]
    arms = Arms(arrs_b, arrs_t, (mb, mt), (vb, vt), (kb, kt), rounds, prior)
    est = analysis.estimate(arms)
    k = est.k
    name = analysis.test_name(design, a, k, span)
    if prior is not None:
        name += f"; its t-test pools {prior.describe()} where the rounds do not contradict it"
    ratio = math.exp(est.d)
    common = dict(ratio=ratio, ci_level=1 - 2 * a, test=name, n_boots=(kb, kt), n_samples=(nb, nt),
                  between_cv=(bcv_b, bcv_t), within_cv=(wcv_b, wcv_t), alpha=a,
                  min_effect=float(min_effect), expect=expect, analysis=design.analysis,
                  n_pairs=est.n_pairs,
                  round_log_ratios=None if est.diffs is None else tuple(float(x) for x in est.diffs),
                  round_samples=None if est.diffs is None else tuple(
                      int(x) for x in round_samples(arrs_b, arrs_t, rounds)))
    if k < 2:
        return StatVerdict(outcome=Outcome.INCONCLUSIVE, final=False, ci=None, p_value=None,
                           p_threshold=None, look=None,
                           reason=(f"Only {k} {analysis.few}; the first look needs "
                                   f"{design.min_boots} boots per arm."), **common)
    se, df = analysis.standard_error(arms, est)
    if not se > 0:
        raise ValueError(
            "evaluate: every boot mean is identical in both arms (or every round's ratio is); "
            "the metric shows no variation at all, check that it is really measured")
    at_budget = k >= design.max_boots
    lk = analysis.look(est, se, df, expect, log_e, design, a, interval)
    if prior is not None:
        agrees = pooled_variance(prior, est.diffs)[2]
        common["prior_contradicted"], common["prior_pooled"] = not agrees, bool(agrees and not lk.sign_flip)
    code, p0, thr, look, d, ci, ci_txt = lk.code, lk.p_value, lk.threshold, lk.look, lk.d, lk.ci, lk.ci_text
    ratio = math.exp(d)
    common["ratio"] = ratio
    want = f"{'+' if expect is Expect.INCREASE else '-'}{min_effect * 100:.1f}%"
    ps, ts = shown_apart(p0, thr) if p0 is not None and thr is not None else (f"{p0}", f"{thr}")
    if look is None:
        return StatVerdict(outcome=Outcome.INCONCLUSIVE, final=False, ci=ci, p_value=p0,
                           p_threshold=thr, look=None,
                           reason=(f"Before the first look ({k} of {design.min_boots} boots per "
                                   f"arm): {ci_txt}; boot more."), **common)
    if kb != kt and not at_budget:
        return StatVerdict(outcome=Outcome.INCONCLUSIVE, final=False, ci=ci, p_value=p0,
                           p_threshold=thr, look=None,
                           reason=(f"Round incomplete ({kb} vs {kt} boots); decisions are made "
                                   f"only when both arms have the same number of boots."), **common)
    if code == 1:
        outcome, final = Outcome.CONFIRMED, True
        reason = (f"Confirmed: {ci_txt}; p={ps} <= {ts} at look {look}, and the "
                  f"estimate {_pct(ratio - 1)} reaches the hypothesised {want}.")
    elif code == -1:
        outcome, final = Outcome.REFUTED, True
        reason = (f"Refuted: {ci_txt}; the bound on the hypothesised side stops short of "
                  f"{want} at look {look}.")
    else:
        outcome, final = Outcome.INCONCLUSIVE, at_budget
        if at_budget:
            spread = analysis.spread(arms, est)
            reason = (f"Budget of {design.max_boots} boots per arm spent without a decision: "
                      f"{ci_txt}; p={ps} vs {ts}. "
                      + boots_to_decide(expect.sign * d, spread, log_e, thr, want, design.analysis,
                                        sign_flip=lk.sign_flip))
        elif p0 <= thr:
            reason = (f"A change is shown ({ci_txt}, p={p0:.2g}) but the estimate "
                      f"{_pct(ratio - 1)} is below the hypothesised {want}; boot more.")
        elif lk.sign_flip and thr <= 0:  # no sign pattern can cross yet: say so rather than "p vs 0"
            reason = (f"Undecided at look {look}: {ci_txt}; p={p0:.2g}, and no pattern of signs can cross at "
                      f"{look} rounds (the alpha spent by this look is below 2^-{look}); boot more.")
        else:
            reason = f"Undecided at look {look}: {ci_txt}; p={ps} vs {ts}; boot more."
    return StatVerdict(outcome=outcome, final=final, ci=ci, p_value=p0, p_threshold=thr,
                       look=look, reason=reason, **common)


def boots_to_decide(dd: float, spread: float, log_e: float, level: float, want: str = "the hypothesised change",
                    analysis: str = "unpaired", *, sign_flip: bool = False) -> str:
    """What would decide an undecided hypothesis, in a sentence: about how many boots
    per arm (rounds, paired) the one-sided test at ``level`` needs at the spread seen
    to refute ``want`` (when the estimate ``dd``, a log change in the expected
    direction, stops short of ``log_e``), or else to show the change. ``spread``: the
    standard deviation of one round's log ratio (paired) or the root of the two
    arms' variances of log boot means (unpaired): the ``analysis``'s
    ``spread``; the level is the last look's, so the count is a guide for a new
    run's budget, not a promise.

    ``sign_flip``: the level is a sign-flip look's (the robust analysis). The count
    is the t-test's at that level, but never below the rounds at which a sign-flip
    test can reach the level at all (its smallest p-value with k rounds is 2^-k)."""
    kind = ANALYSES[analysis]
    unit = kind.unit
    if not (math.isfinite(dd) and math.isfinite(spread) and spread > 0):
        return "How many more boots would decide it is undetermined: the spread could not be estimated."
    gap, goal = (log_e - dd, f"refuting {want}") if dd < log_e else (dd, "showing the change")
    if gap <= 0:  # an estimate of exactly no change with a zero minimum effect: nothing can separate them
        return f"No number of {unit} would decide it at this estimate."
    def enough(k: int) -> bool:  # the bound at k boots per arm (rounds) clears the gap
        df = kind.t_df(k)
        return float(_st.t.isf(level, df)) * spread / math.sqrt(k) <= gap

    lo, hi = 1, 2  # the fewest k >= 2 that is enough: double, then halve the interval
    while not enough(hi) and hi < 10**7:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    n = hi
    if sign_flip and 0 < level < 1:
        fewest = math.ceil(-math.log2(level) - 1e-12)  # 2^-k <= level
        if fewest > n:
            return (f"At the spread seen, {goal} would take about {fewest:,} {unit}: the fewest at which the "
                    f"sign-flip test can reach the last look's level {level:.2g} (2^-{fewest}); a t-test "
                    f"would need {n:,}.")
    return f"At the spread seen, {goal} would take about {n:,} {unit} (at the last look's level {level:.2g})."
