"""The mock backend's handler for the tests of what a user sees of a load curve.

:class:`Curved` answers each boot at every load point of its request
(``benchmark.points``, from the file's ``sweep:``), each sample carrying its point's
label, as ``backends.procedure`` does.
"""

from __future__ import annotations

import hashlib
import random
from typing import Callable

from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import SampleOutcome
from bisect_harness.workload import LoadPoint

POINTS = tuple(LoadPoint.of(concurrency=c) for c in (1, 4, 16, 32))


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
