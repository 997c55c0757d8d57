"""The mock backend's handler for the tests of what a user sees of a load curve.

:class:`Curved` answers each boot at every load point of its request
(``benchmark.points``, from the file's ``sweep:``), each sample carrying its point's
label, as ``backends.procedure`` does.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Callable

from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import SampleOutcome
from bisect_harness.workload import LoadPoint

POINTS = tuple(LoadPoint.of(concurrency=c) for c in (1, 4, 16, 32))

#: Speculative decoding as the essays found it: 1.5x at concurrency 1, 0.6x at 32.
DRAFTING_FACTORS = {1: 1.5, 4: 1.3, 16: 0.8, 32: 0.6}


def write_drafting_curve(path: Path) -> Path:
    """A hypotheses file at ``path`` whose one hypothesis, ``spec-wins``, sweeps the
    concurrencies of :data:`POINTS` on a launched OpenAI-compatible server: the file the
    CLI tests of a curve run with :func:`drafting_boots`."""
    from helpers import write_spec

    return write_spec(path, engine={"preset": "openai", "launch": ["my-server", "--port", "{port}"]},
                      defaults={"boots_per_arm": 3, "max_boots_per_arm": 4, "samples_per_boot": 2,
                                "host_preflight_s": 0},
                      hypotheses=[{"id": "spec-wins", "baseline": {}, "treatment": {"flags": {"spec": 1}},
                                   "metric": "tok_s", "expect": "increase", "min_effect": "10%",
                                   "sweep": {"concurrency": [dict(p.settings)["concurrency"] for p in POINTS]}}])


def drafting_boots() -> "Curved":
    """Boots of :func:`write_drafting_curve`'s file: the treatment (flag ``spec``) at
    :data:`DRAFTING_FACTORS` of the baseline."""
    return Curved(lambda r, c: DRAFTING_FACTORS[c] if dict(r.flags).get("spec") else 1.0)


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
