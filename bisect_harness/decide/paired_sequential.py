"""A sequential one-sided paired test, robust to a stalled boot: the bisection's
endpoint check and head-to-head tests.

The differences of paired, randomly ordered rounds (bad minus good, in the
expected direction) are symmetric about zero when nothing changed, whatever the
host did. The test looks at a few pair counts (:func:`look_schedule`), each look
at ``alpha / looks`` (Bonferroni over the looks), with Yuen's trimmed t (20%
trimmed mean over its winsorised standard error; Yuen, Biometrika 1974; the plain
t below 8 pairs), decided by the decision kernel
(:mod:`bisect_harness.decide.kernel`). Used by
:class:`~bisect_harness.decide.bisect.search.BisectionSearch`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

from bisect_harness.decide.kernel import decide
from bisect_harness.model import Expect, Outcome

__all__ = ["PairedTest", "look_schedule", "paired_sequential_test"]


@dataclass(frozen=True)
class PairedTest:
    """A one-sided sequential paired test of ``bad - good`` in the expected direction.

    ``decision``: ``passed`` (the change is shown), ``below`` (the change is shown
    smaller than ``below``, the least change that counts: its upper bound at the
    look's level, ``upper``, fell under it), ``failed`` (the last look did not
    pass, or the mean went the wrong way after ``2 min_pairs + 2`` pairs: stopped
    for futility, which only lowers the error rate), ``abandoned`` (one of its two
    commits became unmeasurable before it decided) or ``open``. ``upper``: the
    one-sided upper confidence bound of the change at the last look, at that look's
    level (NaN before the first look)."""

    pairs: int
    mean: float
    p_value: float
    alpha_per_look: float
    decision: str
    upper: float = math.nan
    below: float | None = None


def look_schedule(min_pairs: int, max_pairs: int) -> tuple[int, ...]:
    """The pair counts at which a paired test looks: from ``min_pairs`` growing by
    half each time (3, 5, 8, 12, ...), and ``max_pairs``. Few looks keep each look's
    share of alpha large."""
    looks, n = [], min_pairs
    while n < max_pairs:
        looks.append(n)
        n = max(n + 1, int(math.ceil(n * 1.5)))
    return tuple(looks + [max_pairs])


def paired_sequential_test(diffs: Sequence[float], *, alpha: float, min_pairs: int,
                           max_pairs: int, below: float | None = None) -> PairedTest:
    """Sequential one-sided paired test on ``diffs`` (positive: the expected change).

    It looks at the pair counts of ``look_schedule``; each look has level
    ``alpha / looks`` (Bonferroni over the looks), so the chance of any false pass
    is at most ``alpha`` whatever the stopping. The statistic is Yuen's trimmed t
    (20% trimmed mean over its winsorised standard error; Yuen, Biometrika 1974;
    the plain t below 8 pairs), so that one stalled boot does not swamp a look; a
    look passes when the decision kernel (:func:`kernel.decide`, a change above
    zero) confirms. With the order inside each pair drawn at random, a difference
    is symmetric about zero when nothing changed, whatever the host did.

    ``below`` (positive, in the diffs' units): the least change that counts. A look
    that does not pass ends the test ``below`` when the change's upper bound at the
    same level is under it, as the decision kernel refutes a hypothesis: a change of
    at least ``below`` ends so at most ``alpha`` of the time, over all looks
    together. Without it the test ends only by the futility rule or at its last
    look.
    """
    if below is not None and not (math.isfinite(below) and below > 0.0):
        raise ValueError(f"below must be a positive finite change, got {below!r}")
    d = np.asarray(diffs, dtype=float)
    looks = look_schedule(min_pairs, max_pairs)
    a = alpha / len(looks)
    p_last, upper = 1.0, math.nan
    for n in looks:
        if n > d.size:
            break
        passed, p_last, upper = _look(d[:n], a)
        if passed:
            return PairedTest(n, float(d[:n].mean()), p_last, a, "passed", upper, below)
        if below is not None and upper < below:
            return PairedTest(n, float(d[:n].mean()), p_last, a, "below", upper, below)
    n = d.size
    mean = float(d.mean()) if n else math.nan
    if n >= max_pairs or (n >= 2 * min_pairs + 2 and mean <= 0.0):
        return PairedTest(n, mean, p_last, a, "failed", upper, below)
    return PairedTest(n, mean, p_last, a, "open", upper, below)


def _look(d: np.ndarray, level: float) -> tuple[bool, float, float]:
    """One look of the paired test: (passed, one-sided p, upper bound) of Yuen's
    trimmed t (20%) for mean > 0, the plain t below 8 values, decided by the kernel;
    the upper bound is the one-sided bound of the (trimmed) mean at ``level``."""
    n = d.size
    g = int(math.floor(0.2 * n)) if n >= 8 else 0
    x = np.sort(d)
    tm = float(x[g:n - g].mean())
    w = np.clip(x, x[g], x[n - 1 - g])
    h = n - 2 * g
    sw = float(np.sqrt(((w - w.mean()) ** 2).sum() / (n - 1))) if n > 1 else 0.0
    se = sw / ((h / n) * math.sqrt(n)) if h >= 2 else 0.0
    if h < 2 or se == 0.0 or not math.isfinite(se):
        p = 0.0 if tm > 0 else 1.0  # no spread to judge by: the sign alone
        return p <= level, p, (tm if n > 1 else math.inf)
    dec = decide(tm, se, h - 1, expect=Expect.INCREASE, min_effect=0.0, level=level)
    upper = tm + float(stats.t.isf(level, h - 1)) * se
    return dec.outcome is Outcome.CONFIRMED, dec.p_value, upper
