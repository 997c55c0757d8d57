"""A run's resolution: the smallest effect a design resolves, from A/A boots.

The noise is the spread of log boot means between boots of one config (pooled
over the arms given; their variance components kept beside it); the smallest
detectable effect is the smallest true relative change that a one-sided t-test at
the last look's nominal level rejects "no change" with the asked ``power``, by
the noncentral t distribution (e.g. Cohen, *Statistical Power Analysis for the
Behavioral Sciences*, 1988, ch. 2). Each analysis plans as a t-test
(``t_equivalent``, ``t_df``): the robust analysis as the paired t-test at its
sign-flip part's level. The executor refuses, up front, a hypothesis whose
minimum effect is below it. Operating characteristics by simulation are
:mod:`bisect_harness.decide.simulate`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy import optimize
from scipy import stats as _st

from bisect_harness.decide.boundaries import nominal_levels
from bisect_harness.decide.components import VarianceComponents, variance_components
from bisect_harness.decide.design import ANALYSES, Design
from bisect_harness.decide.ttest import _check_boots

__all__ = ["NoiseEstimate", "noise_floor", "smallest_detectable_effect"]


@dataclass(frozen=True)
class NoiseEstimate:
    """What an A/A comparison says about the run's resolution.

    ``boot_mean_cv`` is the standard deviation of log boot means (about the CV of a
    boot's mean), pooled over the arms given; ``smallest_detectable_effect`` the
    smallest relative change that the design confirms with probability ``power``
    (when ``min_effect`` is not above it), see :func:`smallest_detectable_effect`.
    """

    components: tuple[VarianceComponents, ...]
    boot_mean_cv: float
    df: int
    design: Design
    power: float
    smallest_detectable_effect: float


def noise_floor(boots_a: Sequence[Sequence[float]],
                boots_b: Optional[Sequence[Sequence[float]]] = None, *,
                design: Design = Design(), power: float = 0.8,
                alpha: Optional[float] = None) -> NoiseEstimate:
    """The run's resolution from A/A boots (one arm, or both arms of an A/A pair).

    The spread of log boot means (pooled over the arms given) is taken as the noise
    of every comparison; the smallest detectable effect is the smallest true
    relative change ``delta`` for which a one-sided t-test at the last look's
    nominal level, with ``max_boots`` boots per arm, rejects "no change" with
    probability ``power`` (noncentral t; df ``max_boots - 1`` for the paired
    analysis, ``2*max_boots - 2`` for the unpaired one; the robust analysis is
    planned as the paired t-test at its sign-flip part's level, which that test
    matches on Gaussian boots and beats under outlying rounds). Early looks only add power,
    so for the test itself this is conservative; it assumes ``min_effect`` is well
    below the effect. With ``min_effect`` equal to the effect, confirmation also
    needs the estimate to reach ``min_effect``: a fixed-size design then confirms
    about half the time, the sequential designs 0.55-0.71 of the time (early
    looks stop on high estimates; ``bench/bench_stats.py`` measures it as ``oc``,
    ``effect_over_E`` 1.0).
    """
    if not (0.0 < power < 1.0):
        raise ValueError(f"power must be in (0, 1), got {power!r}")
    arms = [boots_a] if boots_b is None else [boots_a, boots_b]
    comps, ss, dfs = [], 0.0, 0
    for i, boots in enumerate(arms):
        arrs = _check_boots(boots, f"A/A arm {i}", positive=True)
        if len(arrs) < 2:
            raise ValueError(
                f"noise_floor: A/A arm {i} has a single boot; the noise between boots needs "
                f"at least two boots per arm")
        comps.append(variance_components(arrs))
        logs = np.log([x.mean() for x in arrs])
        ss += float(np.sum((logs - logs.mean()) ** 2))
        dfs += logs.size - 1
    sd = math.sqrt(ss / dfs)
    design, a = ANALYSES[design.analysis].t_equivalent(design, design.alpha if alpha is None else float(alpha))
    thr = nominal_levels(design, a)[-1]
    n = design.max_boots
    # Paired: n rounds, the difference of two boots has variance 2 sd^2, df n - 1.
    df = ANALYSES[design.analysis].t_df(n)
    se = sd * math.sqrt(2.0 / n)
    crit = float(_st.t.isf(thr, df))
    if sd == 0:
        delta = 0.0
    else:
        f = lambda nc: float(_st.nct.sf(crit, df, nc)) - power
        nc = optimize.brentq(f, 0.0, crit + 20.0)
        delta = nc * se
    return NoiseEstimate(components=tuple(comps), boot_mean_cv=sd, df=dfs, design=design,
                         power=power, smallest_detectable_effect=math.expm1(delta))


def smallest_detectable_effect(boots_a: Sequence[Sequence[float]],
                               boots_b: Optional[Sequence[Sequence[float]]] = None, *,
                               design: Design = Design(), power: float = 0.8,
                               alpha: Optional[float] = None) -> float:
    """Smallest relative effect (0.03 = 3%) the design resolves; see :func:`noise_floor`."""
    return noise_floor(boots_a, boots_b, design=design, power=power, alpha=alpha).smallest_detectable_effect
