"""The robust analysis (``"robust"``, the harness's default): per-round log ratios,
a paired t-test at the first looks and a sign-flip test of the clipped ratios later.

The rounds of ``"paired"`` (:mod:`bisect_harness.decide.analyses.paired`), tested in two
parts whose errors add (Bonferroni). Looks up to ``ROBUST_T_LAST_LOOK`` (8)
rounds use the paired t-test with ``ROBUST_T_SHARE`` (60%) of alpha, so a
clear change on a quiet host still stops at 3-4 boots per arm, and no look is
dead: with k rounds a sign-flip test's smallest p-value is 2^-k, which reaches
its share of the spent alpha only from about 9 rounds, so the looks 6..8 that it
held before could never decide (the t-test took 3..5 with 40%; on ``llama-server``
an env var it never reads was then refuted at 10 to 13 boots a side, and at 3 to
6 with the t looks to 8 and samples per boot chosen by ``decide.allocation``:
``experiments/llamacpp-h200/fewer-boots``). Later looks use a
sign-flip test (:mod:`bisect_harness.decide.signflip`) with the rest: the per-round log ratios,
each clipped at the median magnitude of the rounds so far, summed; under no
change every ratio is symmetric about 0 (each round's order is random), so
given the magnitudes its sign is a fair coin, and each look's threshold is read
from the sign patterns (all 2^k up to 12 rounds: exact; beyond, the observed and
3,999 seeded random ones) with the spent alpha, whatever the tails, modes,
bursts or variances of the boots. Its estimate is the Hodges-Lehmann median of
the rounds' Walsh averages, and its interval the shifts the test does not reject.
One boot that a neighbour's burst slowed by 25% moves a t-test's spread a lot
and this test's statistic by one clipped round: on ``bench/noise.py``'s burst
model the robust analysis confirms a 2E change 0.92 of the time at 20 boots per
arm (0.90-0.92 with the t looks to 8), the paired t-test 0.79.

The harness's default (``defaults.analysis: robust`` in hypotheses.yaml) was chosen
by ``bench/bench_stats.py``.
"""

from __future__ import annotations

import math

import numpy as np

from bisect_harness.decide.analyses.base import Estimate, Look
from bisect_harness.decide.analyses.paired import Paired
from bisect_harness.decide.analyses.unpaired import Unpaired
from bisect_harness.decide.boundaries import nominal_levels
from bisect_harness.decide.design import ANALYSES, Design
from bisect_harness.decide.kernel import outcome_code
from bisect_harness.decide.signflip import _hodges_lehmann, _sf_interval, _sf_spent, _sign_flip
from bisect_harness.model import Expect

__all__ = ["Robust", "robust_split", "ROBUST_T_LAST_LOOK", "ROBUST_T_SHARE", "ROBUST_SF_MIN_PATTERNS"]

#: The robust analysis: its paired t-test decides at looks up to this many rounds,
#: with ``ROBUST_T_SHARE`` of alpha; later looks belong to the sign-flip test,
#: with the rest. Below six rounds no sign-flip test can reach a level of a few
#: percent (its smallest p-value is 2^-k), so the first looks need the t-test.
ROBUST_T_LAST_LOOK = 8
ROBUST_T_SHARE = 0.6
#: The sign-flip part runs only where its share of alpha lets at least this many of
#: the 2^max_boots sign patterns cross by the last look (else it could decide
#: almost nothing, and its share is better spent by the t-test).
ROBUST_SF_MIN_PATTERNS = 8


def robust_split(design: Design, alpha: float) -> tuple[tuple[int, ...], float, tuple[int, ...], float]:
    """The robust analysis' two parts: (looks of the paired t-test, its alpha, looks
    of the sign-flip test, its alpha). The t-test keeps every look up to
    ``ROBUST_T_LAST_LOOK`` and ``ROBUST_T_SHARE`` of ``alpha``; the sign-flip test the
    later looks and the rest (all of it where the other part has no look). The two
    errors add (Bonferroni), so the whole is at most ``alpha``. Where the budget is
    too short for the sign-flip test to matter (fewer than
    ``ROBUST_SF_MIN_PATTERNS`` of the 2^max_boots sign patterns could ever cross:
    at alpha 0.05, budgets below 9 boots per arm; smaller alphas need longer ones)
    the paired t-test takes every look and all of ``alpha``."""
    t_looks = tuple(k for k in design.looks if k <= ROBUST_T_LAST_LOOK)
    sf_looks = tuple(k for k in design.looks if k > ROBUST_T_LAST_LOOK)
    a_sf = alpha if not t_looks else (1.0 - ROBUST_T_SHARE) * alpha
    if not sf_looks or a_sf * 2.0 ** min(design.max_boots, 60) < ROBUST_SF_MIN_PATTERNS:
        return design.looks, alpha, (), 0.0  # too short a budget for signs to decide: the paired t-test
    if not t_looks:
        return (), 0.0, sf_looks, alpha
    return t_looks, alpha - a_sf, sf_looks, a_sf


def _robust_sf_look(diffs: np.ndarray, sign: int, log_e: float, design: Design, alpha: float, look: int,
                    interval: bool):
    """The sign-flip part of the robust analysis at ``look`` rounds: (code, estimate
    in the hypothesised direction, p, threshold, (lower, upper) of the estimate or
    None). Confirmed: "no change" rejected and the Hodges-Lehmann estimate reaches
    ``log_e``; refuted: "a change of ``log_e``" rejected (the shifted differences)."""
    _, _, all_looks, a_sf = robust_split(design, alpha)
    sf_looks = tuple(k for k in all_looks if k <= look)
    spent = _sf_spent(design, all_looks, a_sf)[:len(sf_looks)]
    x = sign * diffs[:look]
    est = _hodges_lehmann(x)
    up, p0, thr = _sign_flip(x, sf_looks, spent)
    down = _sign_flip(log_e - x, sf_looks, spent)[0]
    code = outcome_code(up, est, log_e, down)  # the kernel's rule, on the sign-flip tests' answers
    bounds = _sf_interval(x, sf_looks, spent) if interval else None
    return code, est, p0, thr, bounds


class Robust(Paired):
    """The rounds of the paired analysis; its looks up to ``ROBUST_T_LAST_LOOK``
    rounds decided as the paired analysis decides them (with its share of alpha),
    its later looks by the sign-flip test (:func:`_robust_sf_look`), whose
    boundaries depend on the data: it is simulated path by path."""

    name = "robust"
    listed = 0
    # A robust design's own nominal levels are the Welch ones they have always been;
    # nothing asks for them: its t part is calibrated as the paired analysis
    # (t_levels, t_equivalent) and its sign-flip part by the signs themselves.
    null_ratios = Unpaired.null_ratios
    null_t = staticmethod(Unpaired.null_t)

    def _signs_decide(self, design: Design, alpha: float, k: int) -> bool:
        """Whether the look at ``k`` rounds belongs to the sign-flip part."""
        _, _, sf_looks, _ = robust_split(design, alpha)
        return bool(sf_looks) and min(k, design.max_boots) >= sf_looks[0]

    def test_name(self, design: Design, alpha: float, k: int, span: str) -> str:
        a, name = alpha, super().test_name(design, alpha, k, span)
        t_looks, a_t, sf_looks, a_sf = robust_split(design, a)
        if self._signs_decide(design, a, k):
            name = (f"robust paired: one-sided sign-flip test of the per-round log ratios clipped at "
                    f"their median size (rounds as blocks, {1 - a_t / a:.0%} of alpha over looks "
                    f"{sf_looks[0]}..{sf_looks[-1]}), Hodges-Lehmann estimate; a paired t-test "
                    f"decided looks {t_looks[0]}..{t_looks[-1]} with the rest" if t_looks else
                    f"robust paired: one-sided sign-flip test of the per-round log ratios clipped at "
                    f"their median size (rounds as blocks), Hodges-Lehmann estimate")
            name += f", {design.spending} alpha spending {span}"
        elif sf_looks:
            name = (f"robust paired: one-sided paired t-test on per-round log ratios (rounds as blocks) "
                    f"with {a_t / a:.0%} of alpha over looks {t_looks[0]}..{t_looks[-1]}; a sign-flip "
                    f"test of the clipped ratios takes looks {sf_looks[0]}..{sf_looks[-1]}, "
                    f"{design.spending} alpha spending {span}")
        else:
            name = (f"robust paired, as the paired t-test at every look (a budget of "
                    f"{design.max_boots} boots per arm is too short for its sign-flip part): " + name)
        return name

    def path_statistics(self, logs, looks):
        return None  # data-dependent boundaries: each path is decided by evaluate

    def t_levels(self, design: Design, alpha: float) -> tuple[tuple[float, ...], int]:
        """The t part: its own looks and share of alpha."""
        t_looks, a_t, _, _ = robust_split(design, alpha)
        t_design = Design(alpha=a_t, min_boots=t_looks[0], max_boots=t_looks[-1], spending=design.spending,
                          analysis="paired", prior_dof=design.prior_dof)
        return nominal_levels(t_design, a_t), t_looks[-1]

    def t_equivalent(self, design: Design, alpha: float) -> tuple[Design, float]:
        """The paired t-test over its last part's looks and alpha."""
        t_looks, a_t, sf_looks, a_sf = robust_split(design, alpha)
        looks, a = (sf_looks, a_sf) if sf_looks else (t_looks, a_t)
        return Design(alpha=a, min_boots=looks[0], max_boots=looks[-1], spending=design.spending,
                      samples_per_boot=design.samples_per_boot, analysis="paired"), a

    def look(self, est: Estimate, se: float, df: float, expect: Expect, log_e: float, design: Design,
             alpha: float, interval: bool) -> Look:
        """At a sign-flip look: the sign-flip test; ``d`` the Hodges-Lehmann estimate and
        the interval the inverted test's (None until it bounds the change on both
        sides, or with ``interval`` False). Else the paired t-test's look."""
        if not self._signs_decide(design, alpha, est.k):
            return super().look(est, se, df, expect, log_e, design, alpha, interval)
        a, k = alpha, est.k
        look = min(k, design.max_boots)
        code, hl, p0, thr, bounds = _robust_sf_look(est.diffs, expect.sign, log_e, design, a, look, interval)
        d = expect.sign * hl
        ratio = math.exp(d)
        if bounds is None:
            ci, ci_txt = None, f"{ratio:.4f}x (interval not computed)"
        elif not all(map(math.isfinite, bounds)):
            ci, ci_txt = None, (f"{ratio:.4f}x, no {(1 - 2 * a) * 100:.0f}% repeated CI yet (at {look} rounds "
                                f"the sign-flip test cannot yet bound the change on both sides)")
        else:
            lo, hi = sorted(expect.sign * b for b in bounds)
            ci = (math.exp(lo), math.exp(hi))
            ci_txt = (f"{ratio:.4f}x, {(1 - 2 * a) * 100:.0f}% repeated CI "
                      f"{ci[0]:.4f}x..{ci[1]:.4f}x")
        return Look(code, p0, thr, look, d, ci, ci_txt, sign_flip=True)


ANALYSES.add(Robust())
