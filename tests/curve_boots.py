"""Load curves for the tests of what a user sees of them, answered by the mock backend.

:func:`swept` expands a hypothesis of a loaded file into one hypothesis per load
point, as the spec's ``sweep:`` does (ids ``<id>@<label>``, ``curve`` the id,
``point`` the point), so these tests need no spec reader of sweeps. :class:`Curved`
is the mock backend's handler: each boot answers at every load point of its
request, each sample carrying its point's label, as ``backends.procedure`` does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from typing import Callable

from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import SampleOutcome
from bisect_harness.workload import LoadPoint

POINTS = tuple(LoadPoint.of(concurrency=c) for c in (1, 4, 16, 32))


def swept(spec, hid: str, points=POINTS):
    """``spec`` with hypothesis ``hid`` expanded into one hypothesis per point."""
    out = []
    for h in spec.hypotheses:
        if h.id != hid:
            out.append(h)
            continue
        out += [dataclasses.replace(h, id=f"{hid}@{p.label}", point=p, curve=hid) for p in points]
    return dataclasses.replace(spec, hypotheses=tuple(out), family_size=len(out))


class Curved:
    """The mock backend's handler: at each load point of the request, ``samples`` samples
    of ``tok_s``, ``100 * concurrency ** 0.5`` times ``factor(request, concurrency)``,
    with seeded noise between boots (``between``, lognormal sigma) and a twentieth of it
    within one, a function of the config and the boot's number among its config's boots
    (never of the order a round booted in)."""

    def __init__(self, factor: Callable[[object, int], float], *, between: float = 0.02, name: str = "curved"):
        self.factor, self.between = factor, between
        self.made: dict[str, int] = {}
        self.backend = MockBackend(self, name=name)

    def __call__(self, r):
        k = self.made.get(r.config_key, 0)
        self.made[r.config_key] = k + 1
        rng = random.Random(hashlib.sha256(f"{r.config_key}:{k}".encode()).digest())
        boot = rng.lognormvariate(0.0, self.between)
        out = []
        for p in r.benchmark.points:
            c = p.get("concurrency")
            level = 100.0 * c ** 0.5 * boot * self.factor(r, c)
            for _ in range(max(1, r.samples)):
                out.append(SampleOutcome(seq=len(out) + 1, requests=c, output_tokens=10, duration_s=0.1,
                                         metrics={"tok_s": level * rng.lognormvariate(0.0, self.between / 20)},
                                         point=p.label))
        return out
