"""Capacity under an SLO: the highest arrival rate at which every term of
``benchmark.slo`` held, found inside one boot by a bracketing search
(``benchmark.capacity``, :class:`~bisect_harness.workload.Capacity`).

The search (:func:`search`) does no I/O: it asks a *measure*, a function from a rate
to a :class:`Trial` (``client.measure_capacity`` sends an open-loop sample of
``trial_requests`` requests at that rate and checks the SLO in it), and decides
from the answers alone:

1. measure ``start_rps``; while the last rate held, double it, and while it did not,
   halve it, until one rate holds and its neighbour does not: the bracket
   [held, failed];
2. bisect the bracket (its middle, arithmetic) until it is narrower than
   ``tolerance`` times its low end;
3. never more than ``max_trials`` trials in all.

The answer, ``capacity_rps``, is the highest rate that held (0 where none did); it is
a lower bound where the search ended before it bracketed (every rate held up to the
last, or the trials ran out), and :attr:`CapacitySearch.stopped` says so. A trial in
which the client fell behind its schedule (``Trial.behind``: its p99 send lag over
``benchmark.max_lag_ms``) did not measure the rate it was asked for: the search stops
there, with the highest rate that held below it, and says why.

It assumes, as every capacity search does (``vllm bench serve``'s ``serve_sla``,
AIPerf's), that the SLO holds below a rate and fails above it; one noisy trial can move
the answer by the width of the bracket it fell in, which is why the boot is the unit a
verdict replicates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from bisect_harness.workload import Capacity

__all__ = ["STOPS", "CapacitySearch", "Trial", "search"]

#: Why a search ended (:attr:`CapacitySearch.stopped`).
STOPS = {
    "bracketed": "the bracket narrowed to within the tolerance",
    "max_trials": "its trials ran out before the bracket narrowed to within the tolerance",
    "never_failed": "every rate it tried held, up to the last: the capacity is at least that",
    "none_held": "no rate it tried held, down to the last",
    "client_behind": "the client fell behind its schedule at a rate, so no higher rate was measured",
}


@dataclass(frozen=True)
class Trial:
    """One rate tried: whether every SLO term held there, the rate the client achieved,
    the requests sent, the terms' percentiles (``{metric: ms}``), whether the client fell
    behind its schedule, and why it failed where it was not a measurement (a sample
    whose requests failed)."""

    rate_rps: float
    held: bool
    achieved_rps: float = math.nan
    requests: int = 0
    percentiles: Mapping[str, float] = field(default_factory=dict)
    behind: bool = False
    failure: str | None = None

    def to_json(self) -> dict[str, Any]:
        def num(v: float) -> float | None:
            return None if v is None or math.isnan(v) else v

        return {"rate_rps": self.rate_rps, "held": self.held, "achieved_rps": num(self.achieved_rps),
                "requests": self.requests, "percentiles": {k: num(v) for k, v in self.percentiles.items()},
                "behind": self.behind, "failure": self.failure}


@dataclass(frozen=True)
class CapacitySearch:
    """A search's answer: ``capacity_rps`` (the highest rate that held; 0 where none did),
    every trial in the order it ran, the last bracket ``(held, failed)`` where it had one,
    and why it ended (a key of :data:`STOPS`)."""

    capacity_rps: float
    trials: tuple[Trial, ...]
    stopped: str
    bracket: tuple[float, float] | None = None

    @property
    def reason(self) -> str:
        """Why it ended, in words (from :data:`STOPS` and the figures)."""
        words = STOPS[self.stopped]
        if self.bracket is not None:
            words += f" (held at {self.bracket[0]:g} req/s, not at {self.bracket[1]:g})"
        elif self.trials:
            words += f" ({self.trials[-1].rate_rps:g} req/s)"
        return words

    def to_json(self) -> dict[str, Any]:
        return {"capacity_rps": self.capacity_rps, "stopped": self.stopped, "reason": self.reason,
                "bracket": list(self.bracket) if self.bracket is not None else None,
                "trials": [t.to_json() for t in self.trials]}


def search(capacity: Capacity, measure: Callable[[float], Trial]) -> CapacitySearch:
    """The highest rate whose SLO holds, by ``measure`` (module docstring)."""
    if not (capacity.start_rps > 0) or math.isinf(capacity.start_rps):
        raise ValueError(f"capacity.start_rps is {capacity.start_rps!r}: a positive, finite request rate")
    if not (capacity.tolerance > 0):
        raise ValueError(f"capacity.tolerance is {capacity.tolerance!r}: a positive share of the bracket's low end")
    if capacity.max_trials < 1:
        raise ValueError(f"capacity.max_trials is {capacity.max_trials!r}: at least 1")
    trials: list[Trial] = []

    def done(stopped: str, lo: float | None, hi: float | None) -> CapacitySearch:
        bracket = (lo, hi) if lo is not None and hi is not None else None
        return CapacitySearch(lo if lo is not None else 0.0, tuple(trials), stopped, bracket)

    def tried(rate: float) -> Trial:
        t = measure(rate)
        trials.append(t)
        return t

    lo: float | None = None   # the highest rate that held
    hi: float | None = None   # the lowest rate that did not
    rate = capacity.start_rps
    first = tried(rate)
    if first.behind:
        return done("client_behind", None, None)
    step = 2.0 if first.held else 0.5
    if first.held:
        lo = rate
    else:
        hi = rate
    while lo is None or hi is None:  # 1. double or halve until the rate bracket closes
        if len(trials) >= capacity.max_trials:
            return done("never_failed" if lo is not None else "none_held", lo, hi)
        rate *= step
        t = tried(rate)
        if t.behind:
            return done("client_behind", lo, None)
        if t.held:
            lo = rate
        else:
            hi = rate
    while hi - lo > capacity.tolerance * lo:  # 2. bisect it
        if len(trials) >= capacity.max_trials:
            return done("max_trials", lo, hi)
        mid = (lo + hi) / 2.0
        t = tried(mid)
        if t.behind:
            return done("client_behind", lo, hi)
        if t.held:
            lo = mid
        else:
            hi = mid
    return done("bracketed", lo, hi)
