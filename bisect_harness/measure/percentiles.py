"""Percentiles (``ttft_p50_ms`` ... ``tpot_p99_ms``, :func:`percentile_metrics`), per
sample, by linear interpolation between order statistics (numpy's default, as
``vllm bench serve`` and SGLang's ``bench_serving`` compute theirs):

- TTFT and TPOT: over the sample's successful requests, one value each (TPOT only
  for requests with two tokens or more);
- ITL: over every output token after each request's first, pooled over the
  sample's requests: a chunk carrying k tokens gives k values of its gap / k (a
  chunk that carries no token adds its gap to the next one that does), so their
  mean is ``itl_ms``; where the server does not say how many tokens a chunk
  carries, each gap gives one value, gap / ((tokens - 1) / (chunks - 1)).
"""

from __future__ import annotations

import math

from bisect_harness.measure.request import RequestRecord

__all__ = ["percentile_metrics"]


def percentile_metrics(ok: list[RequestRecord]) -> dict[str, float]:
    """p50/p90/p99 of TTFT, ITL and TPOT over a sample's successful requests, in ms
    (``model.PERCENTILES``; NaN where no request has the value)."""
    import numpy as np

    from bisect_harness.model import PERCENTILES

    pools = {"ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
             "itl": [g for r in ok for g in r.token_gaps_s],
             "tpot": [r.tpot_s for r in ok if r.tpot_s is not None]}
    out = {}
    for what, values in pools.items():
        qs = np.percentile(values, PERCENTILES) if values else [math.nan] * len(PERCENTILES)
        for q, v in zip(PERCENTILES, qs):
            out[f"{what}_p{q}_ms"] = 1e3 * float(v)
    return out
