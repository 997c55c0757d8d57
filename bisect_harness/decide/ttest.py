"""Welch's t-test, and the checks every method makes of the boots it is given.

Welch's unequal-variance t-test of ``mean(b) - mean(a)`` (Welch, Biometrika 1947;
degrees of freedom by Welch-Satterthwaite: Satterthwaite, Biometrics Bulletin
1946), checked against ``scipy.stats.ttest_ind(equal_var=False)``; vectorised for
the simulations and the boundaries (:func:`_welch_arrays`). :func:`naive_pooled_t`
is the same test on every sample as if each were independent, kept only for
contrast: samples inside one boot share that boot's state, so its p-values are
too small (the boot is the unit of replication; see
:mod:`bisect_harness.decide.evaluate`).

:func:`_check_boots` is how every method here reads an arm: a sequence of boots,
each a sequence of finite samples, with a message that names what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import special

__all__ = ["TTest", "welch_t", "naive_pooled_t"]


@dataclass(frozen=True)
class TTest:
    """A two-sample t-test of ``b - a``: statistic, degrees of freedom, p-values."""

    statistic: float
    df: float
    difference: float
    se: float
    p_two_sided: float
    p_greater: float  # H1: mean(b) > mean(a)
    p_less: float  # H1: mean(b) < mean(a)


def _welch_arrays(mean_a, var_a, n_a, mean_b, var_b, n_b):
    """Welch difference, standard error and df, vectorised (``b - a``)."""
    qa = np.asarray(var_a, dtype=float) / n_a
    qb = np.asarray(var_b, dtype=float) / n_b
    se2 = qa + qb
    with np.errstate(divide="ignore", invalid="ignore"):
        df = se2 ** 2 / (qa ** 2 / (n_a - 1) + qb ** 2 / (n_b - 1))
    return mean_b - mean_a, np.sqrt(se2), df


def _clean(values, what: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: expected a sequence of numbers ({exc})") from None
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a flat sequence of numbers, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what}: contains NaN or infinite values; drop or re-measure them")
    return arr


def _ttest_from(diff: float, se: float, df: float) -> TTest:
    if not se > 0:
        raise ValueError(
            "t-test: both groups have zero variance; the values are constant, "
            "so no test of their difference is possible")
    t = diff / se
    return TTest(statistic=float(t), df=float(df), difference=float(diff), se=float(se),
                 p_two_sided=float(2 * special.stdtr(df, -abs(t))),
                 p_greater=float(special.stdtr(df, -t)), p_less=float(special.stdtr(df, t)))


def welch_t(a: Sequence[float], b: Sequence[float]) -> TTest:
    """Welch's unequal-variance t-test of ``mean(b) - mean(a)``.

    Matches ``scipy.stats.ttest_ind(b, a, equal_var=False)``. Each group needs two
    finite values.
    """
    xa, xb = _clean(a, "welch_t group a"), _clean(b, "welch_t group b")
    if xa.size < 2 or xb.size < 2:
        raise ValueError(
            f"welch_t: each group needs at least 2 values, got {xa.size} and {xb.size}")
    d, se, df = _welch_arrays(xa.mean(), xa.var(ddof=1), xa.size, xb.mean(), xb.var(ddof=1), xb.size)
    return _ttest_from(float(d), float(se), float(df))


def _check_boots(boots: Sequence[Sequence[float]], what: str, *, positive: bool) -> list[np.ndarray]:
    if isinstance(boots, (str, bytes)) or not hasattr(boots, "__len__"):
        raise ValueError(f"{what}: expected a sequence of boots, each a sequence of samples")
    if len(boots) == 0:
        raise ValueError(f"{what}: no boots; boot the config at least once before analysing it")
    out = []
    for i, boot in enumerate(boots):
        if isinstance(boot, (int, float, np.floating, np.integer)):
            raise ValueError(
                f"{what}: boot {i} is a single number; pass each boot as a sequence of samples")
        arr = _clean(boot, f"{what} boot {i}")
        if arr.size == 0:
            raise ValueError(f"{what}: boot {i} has no samples; drop it or re-measure it")
        if positive and np.any(arr <= 0):
            raise ValueError(
                f"{what}: boot {i} has a non-positive value ({arr[arr <= 0][0]!r}); ratios need "
                f"positive metrics such as tok/s or latency")
        out.append(arr)
    return out


def naive_pooled_t(baseline: Sequence[Sequence[float]],
                   treatment: Sequence[Sequence[float]]) -> TTest:
    """The naive test, for contrast only: every sample as independent.

    Welch's t-test of ``treatment - baseline`` over all samples pooled across boots.
    It ignores that samples of one boot share that boot's state, so its p-values
    are too small whenever between-boot variance exists. Never base a verdict on it.
    """
    a = np.concatenate(_check_boots(baseline, "baseline", positive=False))
    b = np.concatenate(_check_boots(treatment, "treatment", positive=False))
    return welch_t(a, b)
