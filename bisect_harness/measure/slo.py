"""Latency under an SLO (``benchmark.slo``, terms such as ``ttft_p99_ms <= 500``): what a
sample's requests say of it.

- **Per request**: a request *meets* a term where its own quantity is at most the
  limit (``SloTerm.per_request``: ``ttft_ms`` for ``ttft_p99_ms``; ``tpot_ms``; ``e2e_ms``;
  ``itl_ms``, the request's mean inter-token latency). A request without the quantity
  (the TPOT or ITL of a one-token answer) is not held against the term; a failed
  request meets none. ``goodput_rps`` is the requests that met every term over the
  sample's wall time, as ``vllm bench serve --goodput`` counts them.
- **Per sample**: the sample *holds* a term where its percentile (over the pools of
  ``percentiles``, at the term's own percentile, by the same interpolation) is at most
  the limit. ``slo_met`` is 1.0 where every term held, 0.0 where one did not, and NaN
  where one could not be judged (no request had the quantity): never a pass by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from bisect_harness.measure.percentiles import pools
from bisect_harness.measure.request import RequestRecord
from bisect_harness.workload import SloTerm

__all__ = ["SloCheck", "TermCheck", "check_slo", "per_request_ms", "slo_metrics"]

#: The per-request quantities a term may bound, and where a record keeps each (seconds).
_PER_REQUEST = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "e2e_ms": "e2e_s", "itl_ms": "itl_s"}


def _quantity(term: SloTerm) -> str:
    q = term.per_request
    if q not in _PER_REQUEST or not term.metric.endswith("_ms"):
        raise ValueError(f"slo: {term.describe()} is not a latency percentile the client measures; a term bounds "
                         f"one of {', '.join(k.replace('_ms', '_pNN_ms') for k in _PER_REQUEST)} (ttft_p99_ms, say)")
    return q


def per_request_ms(record: RequestRecord, quantity: str) -> float | None:
    """A request's ``quantity`` (``ttft_ms``, ``tpot_ms``, ``e2e_ms``, ``itl_ms``) in ms, or
    None where it has none."""
    value = getattr(record, _PER_REQUEST[quantity])
    return None if value is None else 1e3 * value


@dataclass(frozen=True)
class TermCheck:
    """One term in one sample: its percentile there (ms; NaN where no request had the
    quantity) and whether it held (None: not judged)."""

    term: SloTerm
    value_ms: float
    held: bool | None

    def to_json(self) -> dict:
        return {"metric": self.term.metric, "limit": self.term.limit,
                "value": None if math.isnan(self.value_ms) else self.value_ms, "held": self.held}


@dataclass(frozen=True)
class SloCheck:
    """The SLO in one sample: each term's check, and the requests that met every term."""

    terms: tuple[TermCheck, ...]
    good: int

    @property
    def held(self) -> bool | None:
        """Every term held (True), one did not (False), or one was not judged (None)."""
        if any(t.held is False for t in self.terms):
            return False
        return None if any(t.held is None for t in self.terms) else True


def check_slo(records: Sequence[RequestRecord], terms: Sequence[SloTerm]) -> SloCheck:
    """The SLO ``terms`` in a sample of ``records`` (module docstring)."""
    import numpy as np

    ok = [r for r in records if r.ok]
    pooled = pools(ok)
    checks = []
    for term in terms:
        family = _quantity(term)[: -len("_ms")]
        values = pooled[family]
        value = 1e3 * float(np.percentile(values, term.percentile)) if values else math.nan
        checks.append(TermCheck(term, value, None if math.isnan(value) else value <= term.limit))
    quantities = [(_quantity(t), t.limit) for t in terms]
    good = 0
    for r in ok:
        vals = [(per_request_ms(r, q), limit) for q, limit in quantities]
        if all(v is None or v <= limit for v, limit in vals):
            good += 1
    return SloCheck(tuple(checks), good)


def slo_metrics(check: SloCheck, wall_s: float) -> dict[str, float]:
    """``goodput_rps`` and ``slo_met`` of a sample (module docstring) whose wall time was ``wall_s``."""
    held = check.held
    return {"goodput_rps": check.good / wall_s if wall_s > 0 else math.nan,
            "slo_met": math.nan if held is None else float(held)}
