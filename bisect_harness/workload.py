"""What a benchmark point asks of a server: the words of the load curve.

A *point* is one workload measured inside a boot: closed loop at a concurrency, or
open loop at an arrival rate (Poisson, gamma with a burstiness, or constant); the
prompt and output lengths (fixed, a seeded range, or a dataset's); and how long a
sample lasts (a number of requests, or of seconds). A *sweep* names several points
(``benchmark.sweep`` or a hypothesis' ``sweep``); every boot of a config measures
every point its hypotheses ask, in an order drawn afresh per boot, so a curve
costs boots once.

An *SLO* (``slo:``) is a set of limits on latency percentiles (``ttft_p99_ms <=
500``); it gives two metrics: **goodput** (requests a second that each met the
per-request form of every limit) and **capacity** (the highest arrival rate at which
every percentile limit held, found inside the boot by a bracketing search).

These are plain frozen values, read by the spec, carried in a boot request, and
used by the client (``measure``); the bottom layer, beside ``model``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, TypeVar, Union

#: a ``model.BenchmarkSpec`` (this module sits beneath ``model``, which holds its values)
Bench = TypeVar("Bench")

__all__ = ["ARRIVALS", "POINT_KEYS", "SWEEP_AXES", "Capacity", "Dataset", "LoadPoint", "MultiTurn", "SharedPrefix",
           "SloTerm", "Workload", "requests_for_percentile"]

#: How open-loop requests arrive: ``poisson`` (exponential gaps), ``gamma`` (gaps of a
#: gamma law whose shape is ``burstiness``: below 1 burstier than Poisson, above 1
#: more regular; 1 is Poisson), ``constant`` (evenly spaced).
ARRIVALS = ("poisson", "gamma", "constant")

#: The benchmark keys a point of a sweep may set (each a field of ``BenchmarkSpec``).
POINT_KEYS = ("concurrency", "request_rate", "prompt_tokens", "output_tokens", "prompt_tokens_max",
              "output_tokens_max", "burstiness", "arrival")

#: The axes a sweep is written over as ``sweep: {axis: [values]}``, in the order a
#: point's label names them.
SWEEP_AXES = ("concurrency", "request_rate", "prompt_tokens", "output_tokens")


def requests_for_percentile(q: float) -> int:
    """The fewest requests that make a ``q``-th percentile (0 < q < 100) more than the
    largest value: ``ceil(100 / (100 - q))`` (a p99 needs 100, a p90 10, a p50 2). A
    sample's percentile from fewer requests is its maximum, not a tail."""
    if not (0.0 < q < 100.0):
        raise ValueError(f"a percentile is in (0, 100), got {q!r}")
    return math.ceil(100.0 / (100.0 - q) - 1e-9)


@dataclass(frozen=True)
class Dataset:
    """Prompts from a local file of conversations: ShareGPT-style JSON (a list of
    ``{"conversations": [{"from": "human"|"gpt", "value": ...}, ...]}``) or JSONL of
    the same (or of OpenAI ``{"messages": [{"role", "content"}]}``). ``mode``:
    ``first_turn`` (each conversation's first user turn, the reply's length as the
    output length) or ``conversation`` (each conversation replayed turn by turn, as a
    multi-turn session). Draws are seeded; conversations whose lengths fall outside the
    filters are left out."""

    path: str
    mode: str = "first_turn"
    min_prompt_tokens: int = 4
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None


@dataclass(frozen=True)
class SharedPrefix:
    """``groups`` prefixes of ``prefix_tokens`` tokens, each followed by ``suffixes``
    distinct suffixes (of ``benchmark.prompt_tokens``): the workload of a prefix cache.
    Prefixes are fresh per boot, so only reuse inside a boot is measured."""

    groups: int
    prefix_tokens: int
    suffixes: int


@dataclass(frozen=True)
class MultiTurn:
    """Sessions of ``turns`` turns, each request carrying the conversation so far (the
    earlier prompts and the server's own replies), a user turn of
    ``benchmark.prompt_tokens``, and ``think_s`` seconds between a reply and the next
    turn."""

    turns: int
    think_s: float = 0.0


#: The source of a point's prompts: the harness's own unique prompts (None), a dataset
#: file, or a generator.
Workload = Union[Dataset, SharedPrefix, MultiTurn, None]


@dataclass(frozen=True)
class SloTerm:
    """One limit of an SLO: ``metric`` (a percentile metric, ``ttft_p99_ms``) at most
    ``limit``. A request meets it when its own quantity (``per_request``, ``ttft_ms``)
    is at most ``limit``; a sample meets it when its percentile is."""

    metric: str
    limit: float

    @property
    def per_request(self) -> str:
        """The per-request quantity the percentile is taken over (``ttft_p99_ms`` -> ``ttft_ms``;
        ``e2e_p99_ms`` -> ``e2e_ms``)."""
        head, _, _ = self.metric.partition("_p")
        return f"{head}_ms"

    @property
    def percentile(self) -> float:
        """The percentile the term bounds (``ttft_p99_ms`` -> 99.0)."""
        return float(self.metric.split("_p", 1)[1].split("_", 1)[0])

    def describe(self) -> str:
        return f"{self.metric} <= {self.limit:g}"


@dataclass(frozen=True)
class Capacity:
    """The bracketing search for the highest arrival rate whose SLO holds, run inside a
    boot: from ``start_rps``, doubling (or halving) until one rate holds and the next
    does not, then bisecting the bracket until it is narrower than ``tolerance`` (a
    share of its low end), each trial a sample of ``trial_requests`` requests."""

    start_rps: float = 1.0
    tolerance: float = 0.1
    trial_requests: int = 100
    max_trials: int = 12


@dataclass(frozen=True)
class LoadPoint:
    """One point of a sweep: the benchmark keys it sets (:data:`POINT_KEYS`), sorted
    by :data:`SWEEP_AXES` then name. Its :attr:`label` (``concurrency=4``,
    ``request_rate=2.5,prompt_tokens=512``) names it in the ledger (``samples.point``),
    in hypothesis ids (``spec-wins@concurrency=4``) and in ``--at``."""

    settings: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **settings: Any) -> "LoadPoint":
        order = {k: i for i, k in enumerate(SWEEP_AXES)}
        return cls(tuple(sorted(settings.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))))

    @property
    def label(self) -> str:
        return ",".join(f"{k}={_shown(v)}" for k, v in self.settings)

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.settings).get(key, default)

    def apply(self, bench: Bench) -> Bench:
        """``bench`` at this point: its keys replaced by the point's (a point that sets a
        ``request_rate`` makes the benchmark open loop; one that sets ``concurrency``
        closed loop)."""
        changes = dict(self.settings)
        if "concurrency" in changes and "request_rate" not in changes:
            changes["request_rate"] = None
        return replace(bench, **changes)

    def __str__(self) -> str:
        return self.label


def _shown(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def boot_order(points: "tuple[LoadPoint, ...]", boot: int, seed: int = 0) -> "tuple[LoadPoint | None, ...]":
    """The order boot ``boot`` measures ``points`` in: drawn afresh per boot (seeded by the
    boot's id and the benchmark's seed, so a resumed or repeated boot is reproducible),
    so no point always runs first on a cold server or last on a warm one. ``()`` is the
    benchmark's one point: ``(None,)``."""
    if not points:
        return (None,)
    import random

    order = list(points)
    random.Random(f"points:{seed}:{boot}").shuffle(order)
    return tuple(order)
