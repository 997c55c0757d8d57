"""The search's named defaults, in a module of their own that imports nothing.

The CLI reads them to show its options' defaults; keeping them apart from
``analysis.bisection`` (numpy and scipy.stats) lets ``harness --help`` and every
command that stops on bad input start without loading the statistics.
"""

from __future__ import annotations

__all__ = ["DEFAULT_CONFIDENCE", "DEFAULT_VERIFY_ALPHA", "DEFAULT_MAX_BOOTS", "NIGHTLY_MAX_BOOTS"]

#: the posterior mass a culprit must hold (``harness bisect --confidence``, ``bisect: true``, explain, nightly)
DEFAULT_CONFIDENCE = 0.95
#: the level of all head-to-head tests of one search together: the chance that a search
#: names a wrong commit as its culprit, whatever the step's size and the host's noise
DEFAULT_VERIFY_ALPHA = 0.01
#: the boot budget of one search (``harness bisect --max-boots``, ``bisect: true``, explain)
DEFAULT_MAX_BOOTS = 150
#: the boot budget of the bisection a nightly alert starts (``harness nightly --max-boots``)
NIGHTLY_MAX_BOOTS = 40
