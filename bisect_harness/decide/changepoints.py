"""Change points over a whole nightly series: the shifts the night-by-night test missed.

``harness nightly`` judges each night against the few nights before it, so a
shift that came in small steps, or on a night whose test was inconclusive, is
never flagged, and every later night compares with the new level. This pass
looks at the whole series at once, like Apache Otava's E-divisive (itself from
MongoDB's ``signal-processing-algorithms``, Matteson and James 2014): split the
series where its level changes most, keep the split only if the two segments
differ significantly, and recurse into both halves.

The split search is ``ruptures`` (Truong, Oudre and Vayatis 2020, "Selective
review of offline change point detection methods", Signal Processing 167):
binary segmentation with the ``l2`` cost (a shift in the mean) on the log of
each night's value. Apache Otava itself was not used because it pins numpy
2.2 and scipy < 1.17 (and pulls BigQuery, Postgres and Slack clients);
``signal-processing-algorithms`` pins numpy 1.x. The significance test is
Welch's t-test between the two segments' log values (each night one value:
boots of one night are not independent of each other across nights), at
``alpha`` per split, and the shift must be at least ``min_effect`` to count.

Pure: values in, change points out; no ledger, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["ChangePoint", "find_change_points"]


@dataclass(frozen=True)
class ChangePoint:
    """A shift in the series' level before ``index`` (the first night at the new level)."""

    index: int
    before_mean: float     # geometric mean of the segment's values before
    after_mean: float      # and after (up to the next change point)
    ratio: float           # after / before
    p_value: float         # Welch's t-test on the two segments' log values
    before_n: int
    after_n: int


def _best_split(logs: Sequence[float], min_size: int) -> int | None:
    import numpy as np
    import ruptures

    if len(logs) < 2 * min_size:
        return None
    algo = ruptures.Binseg(model="l2", min_size=min_size, jump=1).fit(np.asarray(logs, dtype=float).reshape(-1, 1))
    bkps = algo.predict(n_bkps=1)
    return bkps[0] if bkps and bkps[0] < len(logs) else None


def _welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    from scipy import stats

    if len(set(a)) == 1 and len(set(b)) == 1:  # no spread on either side: any difference is exact
        return 0.0 if a[0] != b[0] else 1.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def find_change_points(values: Sequence[float], *, alpha: float = 0.01, min_effect: float = 0.05,
                       min_size: int = 3) -> list[ChangePoint]:
    """Every significant level shift in ``values`` (positive, oldest first), oldest first.

    Splits are found while significant (``min_size`` nights on each side at least);
    then each point is judged against its neighbouring segments, and one whose p is not
    below ``alpha`` or whose shift is under ``min_effect`` either way is dropped (the
    weakest first, the rest judged again)."""
    if any(v <= 0 or not math.isfinite(v) for v in values):
        raise ValueError("change points need positive, finite values (a rate, a latency)")
    logs = [math.log(v) for v in values]
    found: list[int] = []

    def split(lo: int, hi: int) -> None:  # E-divisive's recursion: split while the split is significant
        at = _best_split(logs[lo:hi], min_size)
        if at is None or _welch_p(logs[lo:lo + at], logs[lo + at:hi]) >= alpha:
            return
        found.append(lo + at)
        split(lo, lo + at)
        split(lo + at, hi)

    split(0, len(logs))
    bounds = sorted(found)
    while True:  # each kept point against its neighbouring segments; drop the weakest that fails, again
        points = _judge_bounds(logs, bounds)
        failing = [(cp.p_value, -abs(math.log(cp.ratio)), cp.index) for cp in points
                   if cp.p_value >= alpha or abs(cp.ratio - 1) < min_effect]
        if not failing:
            return points
        bounds.remove(max(failing)[2])


def _judge_bounds(logs: Sequence[float], bounds: Sequence[int]) -> list[ChangePoint]:
    edges = [0, *bounds, len(logs)]
    out = []
    for i in range(1, len(edges) - 1):
        a, b = logs[edges[i - 1]:edges[i]], logs[edges[i]:edges[i + 1]]
        ma, mb = math.exp(sum(a) / len(a)), math.exp(sum(b) / len(b))
        out.append(ChangePoint(index=edges[i], before_mean=ma, after_mean=mb, ratio=mb / ma,
                               p_value=_welch_p(a, b), before_n=len(a), after_n=len(b)))
    return out
