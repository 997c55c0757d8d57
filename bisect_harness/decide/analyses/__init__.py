"""The analyses that compare two arms, one module each; the registry
:data:`bisect_harness.decide.design.ANALYSES` imports every module of this package
the first time it is read, so each has registered itself wherever a name is asked.
To add an analysis, add one module here whose class keeps the contract of
:class:`~bisect_harness.decide.analyses.base.Analysis` (its name, where it is
listed, its estimate and standard error, the null law its boundaries are
calibrated with, its looks) and adds one instance of it with ``ANALYSES.add``,
and its tests: the spec's check of ``defaults.analysis``, the JSON Schema,
:func:`~bisect_harness.decide.evaluate.evaluate`,
:func:`~bisect_harness.decide.simulate.simulate`,
:func:`~bisect_harness.decide.power.noise_floor` and ``bench/bench_stats.py``
find it by its name.
"""
