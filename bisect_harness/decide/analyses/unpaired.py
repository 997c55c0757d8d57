"""The unpaired analysis (``"unpaired"``): Welch's t-test on log boot means.

``d = mean(L_treatment) - mean(L_baseline)``, compared with a
Welch t statistic (Welch-Satterthwaite degrees of freedom) on the log boot
means. Its null law depends on the ratio of the arms' variances (it is exactly
t_{k-1} when one arm's variance dominates, conservative when they are equal),
so its boundaries are calibrated at the least favourable ratio (:mod:`bisect_harness.decide.boundaries`).
"""

from __future__ import annotations

import math

import numpy as np

from bisect_harness.decide.analyses.base import Analysis, Arms, Estimate
from bisect_harness.decide.design import ANALYSES, Design
from bisect_harness.decide.ttest import _welch_arrays

__all__ = ["Unpaired"]

#: Ratios of the two arms' variances of log boot means over which the unpaired
#: (Welch) boundaries are calibrated; each look takes the smallest level, so the
#: error holds at the least favourable ratio of the grid (1 and ~infinity included).
_LFV_RATIOS = (1.0, 4.0, 16.0, 64.0, 1e6)


class Unpaired(Analysis):
    """The arms compared as two samples of log boot means, round or no round:
    ``d = mean(L_treatment) - mean(L_baseline)``, Welch's standard error and df."""

    name = "unpaired"
    listed = 2
    unit = "boots per arm"
    few = "boot(s) in the smaller arm"
    null_ratios = _LFV_RATIOS

    @staticmethod
    def null_t(rng, n, kmax, idx, k, ratio=1.0):
        x = rng.standard_normal((2, n, kmax))
        x[1] *= math.sqrt(ratio)
        s1 = np.cumsum(x, axis=2)[:, :, idx]
        s2 = np.cumsum(x * x, axis=2)[:, :, idx]
        m = s1 / k
        v = (s2 - k * m * m) / (k - 1)
        d, se, df = _welch_arrays(m[0], v[0], k, m[1], v[1], k)
        t = d / se
        return t, df

    def estimate(self, arms: Arms) -> Estimate:
        return Estimate(arms.mean[1] - arms.mean[0], min(arms.boots))

    def standard_error(self, arms: Arms, est: Estimate) -> tuple[float, float]:
        (mb, mt), (vb, vt), (kb, kt) = arms.mean, arms.var, arms.boots
        _, se, df = _welch_arrays(mb, vb, kb, mt, vt, kt)
        return float(se), float(df)

    def spread(self, arms: Arms, est: Estimate) -> float:
        return math.sqrt(arms.var[0] + arms.var[1])

    def t_df(self, n: int) -> int:
        return 2 * n - 2

    def test_name(self, design: Design, alpha: float, k: int, span: str) -> str:
        return (f"one-sided Welch t-test on log boot means (unpaired), {design.spending} alpha "
                f"spending {span}")

    def path_statistics(self, logs, looks):
        k = looks.astype(float)
        s1 = np.cumsum(logs, axis=2)[:, :, looks - 1]
        s2 = np.cumsum(logs * logs, axis=2)[:, :, looks - 1]
        m = s1 / k
        v = np.maximum(s2 - k * m * m, 0.0) / (k - 1)
        return _welch_arrays(m[0], v[0], k, m[1], v[1], k)


ANALYSES.add(Unpaired())
