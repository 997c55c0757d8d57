"""Sequential looks: how much of alpha each look may spend (:func:`spent_alpha`),
and the nominal level of each look (:func:`nominal_levels`), calibrated by a
seeded simulation of the test's law under the null.

Sequential looks
----------------
The caller boots both arms in rounds and calls :func:`~bisect_harness.decide.evaluate.evaluate` after each round.
Looks happen at ``k = min_boots .. max_boots`` boots per arm; a group-sequential
alpha-spending function (Lan & DeMets, Biometrika 1983) decides how much of
``alpha`` each look may use: Pocock-type ``alpha*ln(1+(e-1)*tau)`` (default: it
spends early, so clear effects stop at the first look) or O'Brien-Fleming-type
``2*(1-Phi(z_{1-alpha/2}/sqrt(tau)))``, with information fraction
``tau = k/max_boots``. With only 2..8 boots per arm the statistic is a t, not a z,
and the usual normal-theory boundaries do not hold; so the nominal level ``p_k``
of each look is calibrated once, by a seeded Monte Carlo simulation of the exact
joint law of the sequence of p-values under the null (normal log boot means: the
law is free of the mean and the scale), such that the chance of crossing by look
``k`` equals the spent alpha. For the paired test that law is free of the arms'
variances too. For the unpaired (Welch) test it is not: at equal variances
Welch's p-values are conservative, and boundaries calibrated there let the A/A
false-confirm rate rise to 0.0625-0.066 at alpha 0.05 when the arms' between-boot
CVs differ (1% vs 4-8%). So each look's level is the smallest that any variance
ratio of a grid from 1 to 10^6 needs: the error holds at the least favourable
ratio, and the test is conservative (and less powerful) at equal variances.
The refute test is shift-equivalent (its statistic has the same null law when ``D*d = e``), so it
uses the same levels; it is non-binding for the confirm test and vice versa.
Because both tests use ``p_k``, the reported interval is the repeated confidence
interval ``d +- t_{p_k, df} * se`` (Jennison & Turnbull, 2000, ch. 9) at level
``1 - 2*alpha``: it holds at whatever look the run stopped, and it agrees with the
verdict (confirmed: the lower bound excludes "no change" and the estimate reaches
``E``; refuted: the bound on the hypothesised side stops short of ``E``).

Each analysis (``decide/analyses/``) draws its own t statistic's null paths
(``null_t``) and names the variance ratios its levels must hold at
(``null_ratios``); this module turns them into levels.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import numpy as np
from scipy import special
from scipy import stats as _st

from bisect_harness.decide.design import ANALYSES, Design

__all__ = ["spent_alpha", "nominal_levels"]

#: Seed and path counts of the Monte Carlo boundary calibration (fixed: the
#: boundaries are a deterministic function of the design).
_CAL_SEED = 0x5EED_B007
_CAL_MIN_PATHS = 200_000
_CAL_MAX_PATHS = 400_000
_CAL_CHUNK = 100_000


def spent_alpha(design: Design, alpha: Optional[float] = None) -> np.ndarray:
    """Cumulative alpha the spending function allows by each look of ``design``."""
    a = design.alpha if alpha is None else alpha
    tau = np.array(design.looks, dtype=float) / design.max_boots
    if design.spending == "pocock":
        return a * np.log1p((math.e - 1.0) * tau)
    z = _st.norm.isf(a / 2.0)
    return 2.0 * _st.norm.sf(z / np.sqrt(tau))


def _null_p_paths(rng, n_paths: int, looks: tuple[int, ...], p_cut: float, analysis: str,
                  ratio: float = 1.0, prior_dof: int = 0) -> np.ndarray:
    """One-sided p-values at each look for null paths of normal log boot means.

    The t statistic of each path is drawn by the analysis named ``analysis``
    (its ``null_t``): ``"unpaired"``: Welch on two arms of N(0,1) and N(0,
    ``ratio``) boot means. ``"paired"``: the one-sample t-test of N(0,1)
    per-round differences (its null law is exact and free of both arms'
    variances; with ``prior_dof``, pooled with a noise prior of that many degrees of
    freedom where the rounds do not contradict it). p-values above ``p_cut`` are
    left at 1 (a t quantile is never below the normal one, so ``t < z_{1-p_cut}``
    implies ``p > p_cut``). This spares most of the costly t tail calls; the
    caller checks that no level reaches ``p_cut``.
    """
    kmax = looks[-1]
    idx = np.array(looks) - 1
    k = np.array(looks, dtype=float)
    out = np.empty((n_paths, len(looks)))
    z_min = float(_st.norm.isf(p_cut))
    null_t = ANALYSES[analysis].null_t
    for start in range(0, n_paths, _CAL_CHUNK):
        c = min(_CAL_CHUNK, n_paths - start)
        t, df = null_t(rng, c, kmax, idx, k, ratio, prior_dof=prior_dof) if prior_dof else \
            null_t(rng, c, kmax, idx, k, ratio)
        p = np.ones_like(t)
        near = t >= z_min
        p[near] = special.stdtr(df[near], -t[near])
        out[start:start + c] = p
    return out


def _level_for(ps_alive: np.ndarray, need: float) -> float:
    """The p-value threshold that lets ``need`` of the still-running paths cross."""
    ps = np.sort(ps_alive)
    need = int(round(need))
    if need <= 0:
        return float(ps[0] / 2.0)
    if need >= ps.size:
        return float(ps[-1])
    return float(0.5 * (ps[need - 1] + ps[need]))


@functools.lru_cache(maxsize=128)
def _levels_cached(alpha: float, min_boots: int, max_boots: int, spending: str,
                   analysis: str = "unpaired", prior_dof: int = 0) -> tuple[float, ...]:
    design = Design(alpha=alpha, min_boots=min_boots, max_boots=max_boots, spending=spending,
                    analysis=analysis, prior_dof=prior_dof)
    looks = design.looks
    if len(looks) == 1:
        return (alpha,)
    n_paths = int(min(_CAL_MAX_PATHS, max(_CAL_MIN_PATHS, 1000.0 / alpha)))
    # Welch p-values (random df) are conservative at equal variances, so a level may
    # exceed the alpha spent by its look; a look's level cannot exceed what a uniform
    # p-value would allow by much, and 4*alpha leaves ample room (checked below).
    p_cut = min(0.45, 4.0 * alpha)
    ratios = ANALYSES[analysis].null_ratios
    seed = [_CAL_SEED, min_boots, max_boots] + ([prior_dof] if prior_dof else [])
    paths = [_null_p_paths(np.random.default_rng(seed + [i]), n_paths, looks, p_cut, analysis, r, prior_dof)
             for i, r in enumerate(ratios)]
    # Aim two Monte Carlo standard errors below the spending function, so that the
    # calibration's own noise does not push the error rate above alpha.
    expected = spent_alpha(design) * n_paths
    target = expected - 2.0 * np.sqrt(expected)
    alive = [np.ones(n_paths, dtype=bool) for _ in ratios]
    crossed = [0] * len(ratios)
    levels = []
    for j in range(len(looks)):
        # Least favourable ratio: the smallest level any ratio of the grid needs.
        thr = min(_level_for(p[a, j], target[j] - c) for p, a, c in zip(paths, alive, crossed))
        for i, p in enumerate(paths):
            hit = alive[i] & (p[:, j] <= thr)
            crossed[i] += int(hit.sum())
            alive[i] &= ~hit
        levels.append(thr)
    if max(levels) >= p_cut:  # pragma: no cover - would need a pathological design
        raise ArithmeticError(
            f"boundary calibration: a nominal level {max(levels):.3g} reached the cut "
            f"{p_cut:.3g}; the design alpha={alpha}, looks {looks} is outside the supported range")
    return tuple(levels)


def nominal_levels(design: Design, alpha: Optional[float] = None) -> tuple[float, ...]:
    """Nominal one-sided p-value threshold of each look (boots per arm = ``design.looks``).

    Calibrated so that the chance, under no effect, that the one-sided p-value of
    the design's analysis falls at or below the threshold at some look up to look
    ``j`` is at most :func:`spent_alpha` at ``j`` (Monte Carlo with a fixed seed and
    200,000 to 400,000 paths, aimed two Monte Carlo standard errors low: at alpha
    0.05 the spent alpha is about 0.049 +- 0.0005). The paired test's null law is
    exact for any pair of arm variances. The unpaired (Welch) test's is not: its
    levels are the smallest over a grid of variance ratios (its ``null_ratios``,
    1 to 10^6), so they hold at the least favourable ratio. With ``design.prior_dof``
    the paired law pools a noise prior of the same noise (and drops it where the
    rounds contradict it, as the test does). A single-look design returns ``(alpha,)``.
    """
    a = design.alpha if alpha is None else float(alpha)
    if not (0.0 < a < 0.5):
        raise ValueError(f"alpha must be in (0, 0.5), got {a!r}")
    return _levels_cached(a, design.min_boots, design.max_boots, design.spending, design.analysis,
                          design.prior_dof)
