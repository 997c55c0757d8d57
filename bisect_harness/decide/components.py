"""How an arm's samples spread: between boots and within them.

A one-way random-effects model, ``y_ij = mu + b_i + e_ij``, with boots as groups:
between-boot variance ``var(b)`` and within-boot variance ``var(e)``, estimated
by the method of moments (Montgomery, *Design and Analysis of Experiments*, the
random effects model; Searle, Casella & McCulloch, *Variance Components*, 1992,
ch. 3, for unbalanced data) and reported as CVs. The verdicts report both
(``StatVerdict.between_cv``, ``within_cv``), and :func:`noise_floor
<bisect_harness.decide.power.noise_floor>` keeps them with a run's resolution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from bisect_harness.decide.ttest import _check_boots

__all__ = ["VarianceComponents", "variance_components"]


@dataclass(frozen=True)
class VarianceComponents:
    """One-way random-effects ANOVA of one arm (boots as groups).

    ``var_between`` is the method-of-moments estimate ``(MSB - MSW) / n0``, clipped
    at zero; ``n0`` is the effective samples per boot for unbalanced data
    (``(N - sum n_i^2 / N) / (k - 1)``). CVs divide the standard deviations by the
    grand mean. ``within_cv`` is None when no boot has two samples.
    """

    n_boots: int
    n_samples: int
    grand_mean: float
    ms_between: float
    ms_within: Optional[float]
    df_between: int
    df_within: int
    n0: float
    var_between: Optional[float]
    var_within: Optional[float]
    between_cv: Optional[float]
    within_cv: Optional[float]


def variance_components(boots: Sequence[Sequence[float]]) -> VarianceComponents:
    """One-way random-effects ANOVA of one arm's boots (method of moments).

    Needs at least two boots. For the model see :class:`VarianceComponents`; see
    e.g. Montgomery, *Design and Analysis of Experiments*, section on the random
    effects model (the loom example), or Searle, Casella & McCulloch, *Variance
    Components* (1992), ch. 3, for unbalanced data.
    """
    arrs = _check_boots(boots, "variance_components", positive=False)
    k = len(arrs)
    if k < 2:
        raise ValueError(
            "variance_components: a single boot cannot separate between-boot from "
            "within-boot variance; boot the config at least twice")
    n = np.array([a.size for a in arrs], dtype=float)
    big_n = n.sum()
    means = np.array([a.mean() for a in arrs])
    grand = float(np.concatenate(arrs).mean())
    ssb = float(np.sum(n * (means - grand) ** 2))
    ssw = float(sum(np.sum((a - m) ** 2) for a, m in zip(arrs, means)))
    df_b, df_w = k - 1, int(big_n - k)
    msb = ssb / df_b
    n0 = float((big_n - np.sum(n ** 2) / big_n) / df_b)
    if df_w > 0:
        msw = ssw / df_w
        var_b = max(0.0, (msb - msw) / n0)
        var_w = msw
    else:
        msw, var_w = None, None
        # One sample per boot: the boot means' variance mixes both components.
        var_b = None
    cv = (lambda v: None if v is None or grand == 0 else math.sqrt(v) / abs(grand))
    return VarianceComponents(
        n_boots=k, n_samples=int(big_n), grand_mean=grand, ms_between=msb, ms_within=msw,
        df_between=df_b, df_within=df_w, n0=n0, var_between=var_b, var_within=var_w,
        between_cv=cv(var_b), within_cv=cv(var_w))
