"""When a sample's requests leave, and how long each one is: seeded traffic that the two
arms of a round share.

**Arrivals** (open loop, ``benchmark.request_rate`` r requests a second): the gaps
between sends are drawn from

- ``poisson``: the exponential law of mean 1/r (a Poisson process);
- ``gamma``: the gamma law of shape k = ``burstiness`` and scale 1 / (r k), mean 1/r as
  well, as ``vllm bench serve`` draws them (``vllm/benchmarks/serve.py``,
  ``get_request``): k < 1 is burstier than Poisson, k > 1 more regular, k = 1 is Poisson;
- ``constant``: every gap 1/r.

The first request leaves at 0 (the sample's start) and request i at the sum of the
first i gaps, so n requests span about (n - 1) / r seconds. Unlike ``vllm bench serve``,
the drawn times are not rescaled to end at n / r: the schedule is the process asked for,
and its own rate varies from sample to sample as a Poisson process's does.

**Lengths** (``prompt_tokens_max``, ``output_tokens_max``): request i's prompt and
output lengths are drawn uniformly from [``prompt_tokens``, ``prompt_tokens_max``] and
[``output_tokens``, ``output_tokens_max``] (fixed where no maximum is set).

**Seeds**: every draw is fixed by the benchmark's ``seed``, the boot's number in its
config (``BootRequest.seq``: the k-th boots of the two arms of a comparison are round k
of it) and the sample's number in the boot, so both arms of a round see the same
arrival times and lengths, and a repeated boot the same again; with
``benchmark.prompt_reuse`` the lengths, like the prompts, are the same in every sample
and boot.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Iterator

from bisect_harness.model import BenchmarkSpec
from bisect_harness.workload import ARRIVALS

__all__ = ["arrival_times", "request_lengths"]


def _rng(*key: object):
    import numpy as np

    digest = hashlib.blake2b(":".join(map(str, key)).encode(), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def _gaps(bench: BenchmarkSpec, boot_seq: int, sample: int, trial: int) -> Iterator[float]:
    """The gaps between sends, drawn in blocks (the same values however many are taken)."""
    rate = bench.request_rate
    if rate is None or not (rate > 0) or math.isinf(rate):
        raise ValueError(f"benchmark.request_rate is {rate!r}: an open-loop sample needs a positive, finite rate "
                         "of requests a second")
    if bench.arrival not in ARRIVALS:
        raise ValueError(f"benchmark.arrival is {bench.arrival!r}; known: {', '.join(ARRIVALS)}")
    if bench.arrival == "constant":
        while True:
            yield 1.0 / rate
    shape = 1.0 if bench.arrival == "poisson" else float(bench.burstiness)
    if not (shape > 0) or math.isinf(shape):
        raise ValueError(f"benchmark.burstiness is {bench.burstiness!r}: the gamma law's shape is a positive, "
                         "finite number (1 is Poisson; for evenly spaced requests set arrival: constant)")
    rng = _rng("arrivals", bench.seed, boot_seq, sample, trial)
    while True:
        yield from rng.gamma(shape, 1.0 / (rate * shape), size=256).tolist()


def arrival_times(bench: BenchmarkSpec, *, boot_seq: int = 0, sample: int = 1, trial: int = 0,
                  count: int | None = None, within_s: float | None = None) -> tuple[float, ...]:
    """The send times (seconds from the sample's start, the first at 0) of sample
    ``sample`` of the ``boot_seq``-th boot (and of its ``trial``-th part: a capacity
    search's trials each draw their own): the first ``count`` of them, or every one
    before ``within_s`` seconds (``benchmark.sample_seconds``). Raises ValueError naming
    the benchmark key that cannot make an arrival process."""
    if (count is None) == (within_s is None):
        raise ValueError("arrival_times takes a count or a window (within_s), one of them")
    out: list[float] = []
    t = 0.0
    gaps = _gaps(bench, boot_seq, sample, trial)
    while (len(out) < count) if count is not None else (t < within_s):
        out.append(t)
        t += next(gaps)
    return tuple(out)


def request_lengths(bench: BenchmarkSpec, index: int, *, boot_seq: int = 0, sample: int = 1) -> tuple[int, int]:
    """(prompt tokens, output tokens) of request ``index`` of a sample: the benchmark's
    ``prompt_tokens`` and ``output_tokens``, or where ``prompt_tokens_max`` /
    ``output_tokens_max`` is set, a length drawn from the range for this request alone
    (module docstring: the same in both arms of a round)."""
    lo_p, hi_p = bench.prompt_tokens, bench.prompt_tokens_max
    lo_o, hi_o = bench.output_tokens, bench.output_tokens_max
    for key, lo, hi in (("prompt_tokens", lo_p, hi_p), ("output_tokens", lo_o, hi_o)):
        if hi is not None and hi < lo:
            raise ValueError(f"benchmark.{key}_max is {hi}, below {key} ({lo}): the range of a request's length "
                             f"is [{key}, {key}_max]")
    if hi_p is None and hi_o is None:
        return lo_p, lo_o
    key = f"lengths:{bench.seed}:reuse:{index}" if bench.prompt_reuse else \
        f"lengths:{bench.seed}:{boot_seq}:{sample}:{index}"
    rng = random.Random(key)
    prompt = rng.randint(lo_p, hi_p) if hi_p is not None else lo_p
    output = rng.randint(lo_o, hi_o) if hi_o is not None else lo_o
    return prompt, output
