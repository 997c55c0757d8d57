"""The analyses that compare two arms, one module each; importing this package
registers every one of them in :data:`bisect_harness.decide.design.ANALYSES`.

``bisect_harness.decide`` imports this package, so the registry is full wherever
a :class:`~bisect_harness.decide.design.Design` can be made. To add an analysis,
add one module here whose class keeps the contract of
:class:`~bisect_harness.decide.analyses.base.Analysis` (its name, where it is
listed, its estimate and standard error, the null law its boundaries are
calibrated with, its looks) and adds one instance of it with ``ANALYSES.add``,
and its tests: the spec's check of ``defaults.analysis``, the JSON Schema,
:func:`~bisect_harness.decide.evaluate.evaluate`,
:func:`~bisect_harness.decide.simulate.simulate`,
:func:`~bisect_harness.decide.power.noise_floor` and ``bench/bench_stats.py``
find it by its name.
"""

from __future__ import annotations

import importlib
import pkgutil

__all__: list[str] = []

# Every module of this folder, in the order of their names; each adds its analysis
# to ANALYSES, which lists them by their own ``listed``, not in this order.
for _found in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_found.name}")
