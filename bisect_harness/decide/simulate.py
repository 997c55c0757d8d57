"""Operating characteristics of a design, by seeded simulation: how often it
confirms, refutes or stays undecided at a true effect, and at what cost in boots.

Boots are drawn lognormal, with a between-boot and a within-boot CV per arm
(:func:`simulate`), and every simulated experiment is decided exactly as
:func:`~bisect_harness.decide.evaluate.evaluate` decides it, look by look:
vectorised over the paths where the analysis has a closed form per look
(``path_statistics``), path by path through ``evaluate`` itself where its
boundaries depend on the data (the robust analysis). The naive pooled test, which
takes every sample as independent, is simulated beside it for contrast. Noise off
this model (tails, two modes, drift, bursts) is ``bench/bench_stats.py``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy import special

from bisect_harness.decide.boundaries import nominal_levels
from bisect_harness.decide.design import ANALYSES, Design
from bisect_harness.decide.evaluate import evaluate
from bisect_harness.decide.kernel import _decide, log_effect
from bisect_harness.decide.ttest import _welch_arrays
from bisect_harness.model import Expect, Outcome

__all__ = ["SimulationResult", "simulate"]


@dataclass(frozen=True)
class SimulationResult:
    """Operating characteristics of a design from :func:`simulate`.

    Rates are fractions of ``n_sim`` experiments; ``mean_boots`` is the mean boots
    per arm at the verdict. ``outcomes`` holds one code per experiment (1
    confirmed, -1 refuted, 0 inconclusive) and ``boots`` the boots per arm used.
    ``naive_confirmed`` is the confirm rate of :func:`~bisect_harness.decide.ttest.naive_pooled_t` on all samples
    of ``max_boots`` boots per arm (one look), ``naive_peeking_confirmed`` the same
    test applied at every look without correction: both only for contrast.
    """

    effect: float
    n_sim: int
    confirmed: float
    refuted: float
    inconclusive: float
    mean_boots: float
    naive_confirmed: float
    naive_peeking_confirmed: float
    outcomes: np.ndarray = field(repr=False, compare=False)
    boots: np.ndarray = field(repr=False, compare=False)


def _lognormal_sigma(cv: float) -> float:
    return math.sqrt(math.log1p(cv * cv))


def _draw(rng, n_sim: int, effect: float, between_cv: float, within_cv: float,
          kmax: int, s: int, between_cv_b: Optional[float] = None) -> np.ndarray:
    """Samples of shape (2 arms, n_sim, kmax boots, s samples); see :func:`simulate`."""
    sb = np.array([_lognormal_sigma(between_cv),
                   _lognormal_sigma(between_cv if between_cv_b is None else between_cv_b)]).reshape(2, 1, 1, 1)
    sw = _lognormal_sigma(within_cv)
    level = np.array([1.0, 1.0 + effect]).reshape(2, 1, 1, 1)
    boot = np.exp(sb * rng.standard_normal((2, n_sim, kmax, 1)) - sb * sb / 2)
    return level * boot * np.exp(sw * rng.standard_normal((2, n_sim, kmax, s)) - sw * sw / 2)


def _run_paths(samples: np.ndarray, expect: Expect, min_effect: float, design: Design, alpha: float):
    """Sequential verdicts for simulated paths, with the rule of :func:`~bisect_harness.decide.evaluate.evaluate`.

    Returns the outcome code and boots per arm at the verdict for each path, and the
    naive pooled test's confirm decision at each look (paths x looks).
    """
    sign, log_e = expect.sign, log_effect(expect, min_effect)
    n_sim, s = samples.shape[1], samples.shape[3]
    looks = np.array(design.looks)
    logs = np.log(samples.mean(axis=3))  # (2, n_sim, kmax)
    paths = ANALYSES[design.analysis].path_statistics(logs, looks)
    if paths is None:  # data-dependent boundaries (robust): evaluate itself, path by path
        code_of = {Outcome.CONFIRMED: 1, Outcome.REFUTED: -1, Outcome.INCONCLUSIVE: 0}
        outcomes = np.zeros(n_sim, dtype=int)
        boots = np.full(n_sim, design.max_boots)
        for i in range(n_sim):
            for look in design.looks:
                v = evaluate(samples[0, i, :look], samples[1, i, :look], expect=expect, min_effect=min_effect,
                             design=design, alpha=alpha, interval=False)
                if v.final:
                    outcomes[i], boots[i] = code_of[v.outcome], look
                    break
        return outcomes, boots, _naive(samples, sign, log_e, looks, alpha)
    levels = np.array(nominal_levels(design, alpha))
    d, se, df = paths  # boot i of each arm is round i
    codes, _ = _decide(d, se, df, sign, log_e, levels)  # (n_sim, n_looks)
    decided = codes != 0
    first = np.where(decided.any(axis=1), decided.argmax(axis=1), len(looks) - 1)
    outcomes = codes[np.arange(n_sim), first]
    boots = looks[first]
    return outcomes, boots, _naive(samples, sign, log_e, looks, alpha)


def _naive(samples: np.ndarray, sign: int, log_e: float, looks: np.ndarray, alpha: float) -> np.ndarray:
    """Naive contrast: all samples of the first k boots as independent observations;
    its confirm decision at each look (paths x looks), for contrast only."""
    n_sim, s = samples.shape[1], samples.shape[3]
    k = looks.astype(float)
    flat = samples.reshape(2, n_sim, -1)
    n_k = k * s
    f1 = np.cumsum(flat, axis=2)[:, :, looks * s - 1]
    f2 = np.cumsum(flat * flat, axis=2)[:, :, looks * s - 1]
    fm = f1 / n_k
    fv = np.maximum(f2 - n_k * fm * fm, 0.0) / (n_k - 1)
    nd, nse, ndf = _welch_arrays(fm[0], fv[0], n_k, fm[1], fv[1], n_k)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_naive = special.stdtr(ndf, -sign * nd / nse)
    return (p_naive <= alpha) & (sign * np.log(fm[1] / fm[0]) >= log_e)


def simulate(effect: float, *, between_cv: float, within_cv: float, min_effect: float,
             expect: Expect = Expect.INCREASE, design: Design = Design(),
             alpha: Optional[float] = None, n_sim: int = 2000, seed: int = 0,
             between_cv_b: Optional[float] = None) -> SimulationResult:
    """Operating characteristics of ``design`` by seeded simulation (vectorised).

    Each experiment boots both arms ``max_boots`` times; a boot's level is the arm's
    mean times a lognormal factor with CV ``between_cv`` (the treatment's
    ``between_cv_b`` when given: unequal variances); each of
    ``design.samples_per_boot`` samples multiplies that by a lognormal factor with
    CV ``within_cv``. The treatment mean is ``1 + effect`` times the baseline's.
    Every experiment is decided exactly as :func:`evaluate` decides (same
    boundaries, same rule, the design's analysis; paired: boot i of each arm is
    round i) at each look until it stops. Noise off this model (tails, two modes,
    drift, bursts, rounds as blocks) is simulated by ``bench/bench_stats.py``.
    """
    if int(n_sim) != n_sim or n_sim < 1:
        raise ValueError(f"n_sim must be a positive integer, got {n_sim!r}")
    if not effect > -1:
        raise ValueError(f"effect must be > -1 (a relative change), got {effect!r}")
    if between_cv < 0 or within_cv < 0:
        raise ValueError("between_cv and within_cv must be >= 0")
    a = design.alpha if alpha is None else float(alpha)
    log_effect(expect, min_effect)  # refuses a meaningless min_effect here, not in the loop
    if between_cv_b is not None and between_cv_b < 0:
        raise ValueError("between_cv_b must be >= 0")
    samples = _draw(np.random.default_rng(seed), n_sim, effect, between_cv, within_cv,
                    design.max_boots, design.samples_per_boot, between_cv_b)
    outcomes, boots, naive = _run_paths(samples, expect, min_effect, design, a)
    return SimulationResult(
        effect=float(effect), n_sim=int(n_sim),
        confirmed=float(np.mean(outcomes == 1)), refuted=float(np.mean(outcomes == -1)),
        inconclusive=float(np.mean(outcomes == 0)), mean_boots=float(boots.mean()),
        naive_confirmed=float(naive[:, -1].mean()),
        naive_peeking_confirmed=float(naive.any(axis=1).mean()),
        outcomes=outcomes.astype(np.int8), boots=boots)
