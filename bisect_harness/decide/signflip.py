"""The sign-flip test of paired differences, its estimate and its interval.

Given differences ``x_i`` that are symmetric about 0 under the null (here: the
per-round log ratios, each round's order drawn at random), the signs are fair
coins given the magnitudes, so the law of any statistic of the signed magnitudes
is known exactly: Fisher's randomization argument (*The Design of Experiments*,
1935, section 21). The statistic is the sum of the differences each clipped at
their median magnitude, so one round that a neighbour's burst hit counts no more
than a typical one. Up to ``_SF_EXACT_UPTO`` rounds every sign pattern is
weighed (exact); beyond, the observed pattern and ``_SF_ROWS`` fixed random ones
(a Monte Carlo test that counts the observed pattern keeps its level: Dwass, Ann.
Math. Statist. 1957). The test looks sequentially, each look's threshold spending
alpha as the design's spending function does (:func:`_sf_spent`). The estimate
that goes with it is the Hodges-Lehmann median of the Walsh averages (Hodges &
Lehmann, Ann. Math. Statist. 1963), and the interval the shifts the test does not
reject. The robust analysis (:mod:`bisect_harness.decide.analyses.robust`)
decides its later looks with it.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from bisect_harness.decide.boundaries import spent_alpha
from bisect_harness.decide.design import Design

__all__: list[str] = []

#: The sign-flip test's sign patterns: every one of the 2^k up to ``_SF_EXACT_UPTO``
#: rounds (the test is then exact), else ``_SF_ROWS`` random ones with a fixed seed
#: (the verdict stays a deterministic function of the data) and the observed one.
_SF_EXACT_UPTO = 12
_SF_ROWS = 3999
_SF_SEED = 0x5EED_F11B


@functools.lru_cache(maxsize=64)
def _sign_rows(n: int) -> np.ndarray:
    """The sign patterns (+1/-1) of ``n`` rounds the sign-flip test weighs: all 2^n
    up to ``_SF_EXACT_UPTO`` rounds, else ``_SF_ROWS`` fixed random ones."""
    if n <= _SF_EXACT_UPTO:
        rows = 1.0 - 2.0 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
    else:
        rng = np.random.default_rng([_SF_SEED, n])
        rows = np.where(rng.random((_SF_ROWS, n)) < 0.5, -1.0, 1.0)
    rows.setflags(write=False)
    return rows


def _sf_spent(design: Design, sf_looks: tuple[int, ...], alpha: float) -> np.ndarray:
    """Cumulative alpha of the sign-flip part by each of its looks: the design's
    spending function over information ``k / max_boots``, scaled to ``alpha``."""
    part = Design(alpha=alpha, min_boots=sf_looks[0], max_boots=design.max_boots, spending=design.spending)
    return spent_alpha(part)


def _hodges_lehmann(x: np.ndarray) -> float:
    """The median of the Walsh averages ``(x_i + x_j) / 2, i <= j``: the estimate that
    goes with a signed-rank-type test (one outlying round moves it little)."""
    i, j = np.triu_indices(x.size)
    return float(np.median((x[i] + x[j]) / 2.0))


def _sign_flip(x: np.ndarray, sf_looks: tuple[int, ...], spent: np.ndarray) -> tuple[bool, float, float]:
    """The sign-flip test of "centred at 0" against "shifted up" at the last of
    ``sf_looks``, for round differences ``x`` (at least that many).

    Statistic at a look of ``k`` rounds: the sum of the first ``k`` differences, each
    clipped at the median magnitude of those ``k`` (``sum sign(x_i) min(|x_i|, m)``),
    so one round a burst hit counts no more than a typical one. Under the null each
    difference is symmetric about 0 (the executor orders each round at random, so
    whatever the two arms' variances, tails, modes, drifts or bursts, ``x_i`` and
    ``-x_i`` are equally likely), and given the magnitudes the signs are independent
    fair coins. Each look's threshold is the value that at most the spent alpha of
    the sign patterns reach at that look or an earlier one, so the chance of
    crossing at any look is at most the spent alpha whatever the magnitudes: exactly
    over all 2^k patterns up to ``_SF_EXACT_UPTO`` rounds, and beyond over the
    observed pattern and ``_SF_ROWS`` random ones (a Monte Carlo test that counts
    the observed pattern among its draws keeps its level). Returns (crossed at the
    last look, the look's one-sided p-value: the share of patterns at least as large
    as the observed, the look's threshold as such a share)."""
    kmax = sf_looks[-1]
    rows = _sign_rows(kmax)
    observed = np.where(x[:kmax] >= 0, 1.0, -1.0)
    if kmax <= _SF_EXACT_UPTO:  # the observed pattern is row sum(bit_i 2^i), bit_i = 1 for a minus
        signs, at = rows, int(((observed < 0) * (1 << np.arange(kmax))).sum())
    else:
        signs, at = np.vstack([observed, rows]), 0
    mags = np.abs(x[:kmax])
    n = signs.shape[0]
    alive = np.ones(n, dtype=bool)
    crossed = 0
    for j, k in enumerate(sf_looks):
        m = mags[:k]
        clipped = np.minimum(m, np.median(m))
        t = signs[:, :k] @ clipped
        room = int(math.floor(spent[j] * n + 1e-9)) - crossed  # patterns that may still cross
        ta = t[alive]
        if room <= 0:
            c = math.inf
        elif room >= ta.size:
            c = -math.inf
        else:  # just above the (room+1)-th largest: at most `room` patterns reach it
            c = float(np.nextafter(np.partition(ta, ta.size - room - 1)[ta.size - room - 1], math.inf))
        hit = alive & (t >= c)
        crossed += int(hit.sum())
        alive &= ~hit
    t_obs = float(t[at])  # the same arithmetic as its pattern's row: ties stay ties
    return bool(t_obs >= c), float(np.mean(t >= t_obs)), float(np.mean(t >= c))


def _sf_interval(x: np.ndarray, sf_looks: tuple[int, ...], spent: np.ndarray, tol: float = 1e-5) -> tuple[float, float]:
    """The repeated confidence interval of the sign-flip test at its last look: the
    shifts ``delta`` of the round differences that neither one-sided test rejects
    (found by bisection; -inf/inf where no shift is rejected on that side)."""
    lo_x, hi_x = float(x.min()), float(x.max())
    pad = max(hi_x - lo_x, 1e-6)

    def edge(rejects, start, stop):  # rejects(start) is True, rejects(stop) False
        while abs(stop - start) > tol:
            mid = 0.5 * (start + stop)
            start, stop = (mid, stop) if rejects(mid) else (start, mid)
        return 0.5 * (start + stop)

    def shifted_up(d):   # "the centre is at most d" rejected
        return _sign_flip(x - d, sf_looks, spent)[0]

    def shifted_down(d):  # "the centre is at least d" rejected
        return _sign_flip(d - x, sf_looks, spent)[0]

    below, above = lo_x - pad, hi_x + pad
    lower = edge(shifted_up, below, above) if shifted_up(below) else -math.inf
    upper = edge(shifted_down, above, below) if shifted_down(above) else math.inf
    return lower, upper
