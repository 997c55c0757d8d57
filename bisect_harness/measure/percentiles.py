"""Percentiles (``ttft_p50_ms`` ... ``e2e_p99_ms``, :func:`percentile_metrics`), per
sample, by linear interpolation between order statistics (numpy's default, as
``vllm bench serve`` and SGLang's ``bench_serving`` compute theirs), over the sample's
*pools* (:func:`pools`):

- TTFT, TPOT and end-to-end latency: over the sample's successful requests, one value
  each (TPOT only for requests with two tokens or more);
- ITL: over every output token after each request's first, pooled over the
  sample's requests: a chunk carrying k tokens gives k values of its gap / k (a
  chunk that carries no token adds its gap to the next one that does), so their
  mean is ``itl_ms``; where the server does not say how many tokens a chunk
  carries, each gap gives one value, gap / ((tokens - 1) / (chunks - 1)).

**How far a sample's percentile can be trusted** (:func:`quantile_ranks`): for each
percentile metric, ``<metric>_lo`` and ``<metric>_hi`` (``ttft_p99_ms_lo``) bound the
q-th quantile of the law the sample's values were drawn from, distribution-free, by two
of the sample's order statistics. Of n values drawn independently from a continuous
law, the number B below its q-quantile is Binomial(n, q), so the l-th smallest value
lies above the quantile with probability P(B <= l - 1) and the u-th below it with
probability P(B >= u). Taking l as large and u as small as keep each of these at most
(1 - confidence) / 2 gives an interval [x(l), x(u)] that holds the quantile with
probability at least ``confidence`` (W. R. Thompson, "On confidence ranges for the
median and other expectation distributions for populations of unknown distribution
form", *Ann. Math. Statist.* 7, 1936; Hahn & Meeker, *Statistical Intervals*, 1991;
Conover, *Practical Nonparametric Statistics*, 1999). Each end is also a one-sided
bound at 1 - (1 - confidence) / 2 on its own.

An end is NaN where the sample is too small to have it: a p99's upper end needs
0.99^n <= 0.025, n >= 368 requests (a p50's, n >= 6); below that no order statistic
of the sample is, at that confidence, above the true p99, which is what a "p99 of 100
requests" hides. The interval assumes the values independent: a sample's requests
nearly are (they share the server's state), its ITL values are not (the tokens of one
request share its batch), so the ITL intervals are narrower than the truth.
"""

from __future__ import annotations

import math
from typing import Sequence

from bisect_harness.measure.request import RequestRecord

__all__ = ["CONFIDENCE", "percentile_metrics", "pools", "quantile_interval", "quantile_ranks"]

#: The confidence of a percentile's order-statistic interval (``<metric>_lo`` / ``_hi``).
CONFIDENCE = 0.95


def pools(ok: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """The values each percentile is taken over (module docstring), in seconds, by the
    name of its metric family: ``ttft``, ``itl``, ``tpot``, ``e2e``."""
    return {"ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
            "itl": [g for r in ok for g in r.token_gaps_s],
            "tpot": [r.tpot_s for r in ok if r.tpot_s is not None],
            "e2e": [r.e2e_s for r in ok if r.e2e_s is not None]}


def quantile_ranks(n: int, q: float, confidence: float = CONFIDENCE) -> tuple[int | None, int | None]:
    """The ranks (from 1, of n sorted values) of the ends of the distribution-free
    interval for the ``q``-quantile (0 < q < 1) at ``confidence`` (module docstring):
    ``l`` the largest rank with P(B <= l - 1) <= alpha / 2 and ``u`` the smallest with
    P(B >= u) <= alpha / 2, B ~ Binomial(n, q), alpha = 1 - confidence. An end that no
    rank in 1..n reaches is None. Each is found by bisection over the ranks (both tails
    are monotone in the rank), with the binomial law's CDF and survival function from
    ``scipy.special`` (``bdtr``, ``bdtrc``: the regularised incomplete beta function)."""
    from scipy.special import bdtr, bdtrc

    if not (0.0 < q < 1.0) or not (0.0 < confidence < 1.0):
        raise ValueError(f"a quantile and a confidence are in (0, 1), got q={q!r}, confidence={confidence!r}")
    if n <= 0:
        return None, None
    tail = (1.0 - confidence) / 2.0

    def first(true_from) -> int | None:
        """The smallest k in 0..n-1 where ``true_from(k)`` holds (it holds from some k on), or None."""
        if not true_from(n - 1):
            return None
        a, b = 0, n - 1
        while a < b:
            mid = (a + b) // 2
            if true_from(mid):
                b = mid
            else:
                a = mid + 1
        return a

    # l - 1 is the largest k with P(B <= k) <= tail: one below the first k past it
    past = first(lambda k: bdtr(k, n, q) > tail)
    lo = n if past is None else past  # as a rank: (past - 1) + 1
    # u - 1 is the smallest k with P(B > k) <= tail
    k_hi = first(lambda k: bdtrc(k, n, q) <= tail)
    return (lo if lo >= 1 else None), (k_hi + 1 if k_hi is not None else None)


def quantile_interval(values: Sequence[float], q: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The order statistics that bound the ``q``-quantile of the law ``values`` came from
    at ``confidence`` (:func:`quantile_ranks`); NaN for an end the sample is too small for."""
    return _ends(sorted(values), q, confidence)


def _ends(ordered: Sequence[float], q: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    lo, hi = quantile_ranks(len(ordered), q, confidence)
    return (ordered[lo - 1] if lo is not None else math.nan), (ordered[hi - 1] if hi is not None else math.nan)


def percentile_metrics(ok: Sequence[RequestRecord]) -> dict[str, float]:
    """p50/p90/p99 of TTFT, ITL, TPOT and end-to-end latency over a sample's successful
    requests, in ms (``model.PERCENTILES``; NaN where no request has the value), each
    with the ends of its interval (``<metric>_lo``, ``<metric>_hi``: module docstring)."""
    import numpy as np

    from bisect_harness.model import PERCENTILES

    out = {}
    for what, values in pools(ok).items():
        ordered = sorted(values)
        qs = np.percentile(values, PERCENTILES) if values else [math.nan] * len(PERCENTILES)
        for q, v in zip(PERCENTILES, qs):
            name = f"{what}_p{q}_ms"
            out[name] = 1e3 * float(v)
            lo, hi = _ends(ordered, q / 100.0)
            out[f"{name}_lo"], out[f"{name}_hi"] = 1e3 * lo, 1e3 * hi
    return out
