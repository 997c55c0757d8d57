"""The paired analysis (``"paired"``): per-round log ratios, a paired t-test at every look.

The executor boots in rounds (A B, B A, ...: one boot of each
config, in a random order), and a round is a block. ``d`` is the mean over
rounds of the per-round log ratio ``L_treatment,r - L_baseline,r``, tested by a
one-sample t-test with ``rounds - 1`` degrees of freedom. Whatever moves a whole
round (drift, a neighbour's burst) cancels, and the null law of the statistic is
exactly t whatever the two arms' variances are (the differences are i.i.d.
normal with variance ``var_a + var_b``), so unequal noise between the arms
costs no error rate. It gives up about half of the degrees of freedom.

Its boundaries are calibrated on the exact null law of the one-sample t statistic
(normal per-round differences; free of the arms' variances, so one variance ratio
suffices). The robust analysis (:mod:`bisect_harness.decide.analyses.robust`)
reads the rounds the same way.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from bisect_harness.decide.analyses.base import Analysis, Arms, Estimate
from bisect_harness.decide.design import ANALYSES, Design
from bisect_harness.decide.prior import contradicts, pooled_variance

__all__ = ["Paired"]


def _paired_differences(arrs_b: list[np.ndarray], arrs_t: list[np.ndarray],
                        rounds: Optional[tuple[Sequence[int], Sequence[int]]]) -> np.ndarray:
    """Per-round ``log mean(treatment boot) - log mean(baseline boot)``, rounds in order.

    ``rounds`` labels each boot of each arm with its round; without it the i-th boot
    of each arm is round i. Rounds that hold a boot of only one arm are left out.
    """
    return _matched(arrs_b, arrs_t, rounds, lambda b, t: math.log(t.mean()) - math.log(b.mean()))


def round_samples(arrs_b: list[np.ndarray], arrs_t: list[np.ndarray],
                  rounds: Optional[tuple[Sequence[int], Sequence[int]]]) -> np.ndarray:
    """Per round (as :func:`_paired_differences` orders them), the most samples either
    of its two boots holds (a noise prior pools only rounds that took no more samples
    than the rounds it is pooled with: fewer samples, a noisier ratio)."""
    return _matched(arrs_b, arrs_t, rounds, lambda b, t: max(b.size, t.size)).astype(int)


def _matched(arrs_b, arrs_t, rounds, of) -> np.ndarray:
    """``of(baseline boot, treatment boot)`` for each round holding one of each, in round order."""
    if rounds is None:
        rb, rt = list(range(len(arrs_b))), list(range(len(arrs_t)))
    else:
        try:
            rb, rt = [int(r) for r in rounds[0]], [int(r) for r in rounds[1]]
        except (TypeError, ValueError, IndexError):
            raise ValueError("rounds: expected a pair (baseline rounds, treatment rounds) of "
                             "integer round labels, one per boot") from None
        for what, labels, arrs in (("baseline", rb, arrs_b), ("treatment", rt, arrs_t)):
            if len(labels) != len(arrs):
                raise ValueError(f"rounds: {len(labels)} round labels for {len(arrs)} {what} boots; "
                                 f"give one label per boot")
            if len(set(labels)) != len(labels):
                raise ValueError(f"rounds: a {what} round holds two boots; the paired analysis "
                                 f"needs at most one boot of each arm per round")
    bb, tt = dict(zip(rb, arrs_b)), dict(zip(rt, arrs_t))
    return np.array([of(bb[r], tt[r]) for r in sorted(set(bb) & set(tt))])


class Paired(Analysis):
    """Boots matched by round; ``d`` the mean per-round log ratio, tested by a
    one-sample t-test with ``rounds - 1`` degrees of freedom."""

    name = "paired"
    listed = 1
    unit = "rounds"
    few = "round(s) with both arms"
    null_ratios = (1.0,)
    takes_prior = True

    @staticmethod
    def null_t(rng, n, kmax, idx, k, ratio=1.0, prior_dof=0):
        """With ``prior_dof``, the prior's variance is drawn as chi-square over its
        dof (a prior of the same noise) and each look pools it or drops it exactly
        as :func:`~bisect_harness.decide.prior.pooled_variance` does."""
        x = rng.standard_normal((n, kmax))
        m = np.cumsum(x, axis=1)[:, idx] / k
        v = (np.cumsum(x * x, axis=1)[:, idx] - k * m * m) / (k - 1)
        df = np.broadcast_to(k - 1, v.shape).astype(float)
        if prior_dof:
            v0 = rng.chisquare(prior_dof, (n, 1)) / prior_dof
            keep = ~contradicts(v / v0, k - 1, prior_dof)
            v = np.where(keep, (prior_dof * v0 + (k - 1) * v) / (prior_dof + k - 1), v)
            df = np.where(keep, prior_dof + k - 1, df)
        t = m / np.sqrt(v / k)
        return t, df

    def estimate(self, arms: Arms) -> Estimate:
        diffs = _paired_differences(arms.baseline, arms.treatment, arms.rounds)
        k = int(diffs.size)
        d = float(diffs.mean()) if k else arms.mean[1] - arms.mean[0]
        return Estimate(d, k, k, diffs)

    def standard_error(self, arms: Arms, est: Estimate) -> tuple[float, float]:
        var, df, _ = pooled_variance(arms.prior, est.diffs)
        return math.sqrt(var / est.k), df

    def spread(self, arms: Arms, est: Estimate) -> float:
        return math.sqrt(float(est.diffs.var(ddof=1)))

    def t_df(self, n: int) -> int:
        return n - 1

    def test_name(self, design: Design, alpha: float, k: int, span: str) -> str:
        return (f"one-sided paired t-test on per-round log ratios (rounds as blocks), "
                f"{design.spending} alpha spending {span}")

    def path_statistics(self, logs, looks):
        k = looks.astype(float)
        x = logs[1] - logs[0]
        d = np.cumsum(x, axis=1)[:, looks - 1] / k
        vd = np.maximum(np.cumsum(x * x, axis=1)[:, looks - 1] - k * d * d, 0.0) / (k - 1)
        return d, np.sqrt(vd / k), np.broadcast_to(k - 1, d.shape)


ANALYSES.add(Paired())
