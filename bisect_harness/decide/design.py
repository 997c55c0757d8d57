"""How a comparison is sampled and how much error it may make: :class:`Design`,
and the analyses a design may name (:data:`ANALYSES`).

A design fixes the error each of the verdict's two one-sided tests may make over
all looks (``alpha``), the looks (``min_boots`` .. ``max_boots`` boots per arm),
the group-sequential alpha-spending function that shares ``alpha`` between the
looks (Lan & DeMets, Biometrika 1983; :mod:`bisect_harness.decide.boundaries`)
and the analysis that compares the two arms.

The analyses are kinds: each module of ``decide/analyses/`` defines one and adds
it to :data:`ANALYSES`, and whatever needs their names (this class, the spec's
check of ``defaults.analysis``, the JSON Schema, ``bench/bench_stats.py``) reads
them there. The registry imports every one of those modules the first time it is
read (as the backends' registry does), so it is full wherever it is asked.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from operator import attrgetter

from bisect_harness.kinds import Registry

__all__ = ["ANALYSES", "SPENDING_FUNCTIONS", "Design"]

SPENDING_FUNCTIONS = ("pocock", "obrien-fleming")
#: How the two arms are compared, name -> analysis (a
#: :class:`bisect_harness.decide.analyses.base.Analysis`), listed by each one's
#: ``listed``: ``"robust"`` (per-round log ratios: a paired
#: t-test at the first looks, then a sign-flip test of the clipped ratios),
#: ``"paired"`` (per-round log ratios, a paired t-test at every look) or
#: ``"unpaired"`` (Welch on log boot means).
def _import_analyses() -> None:
    """Import each module of ``decide/analyses/``: each adds its analysis."""
    from bisect_harness.decide import analyses

    for found in pkgutil.iter_modules(analyses.__path__):
        importlib.import_module(f"{analyses.__name__}.{found.name}")


ANALYSES: Registry = Registry("analysis", load=_import_analyses, order=attrgetter("listed"))


@dataclass(frozen=True)
class Design:
    """How a comparison is sampled and how much error it may make.

    ``alpha``: one-sided error of each of the two tests, over all looks.
    ``min_boots``: boots per arm before the first look (at least 2).
    ``max_boots``: budget, boots per arm; the verdict at this look is final.
    ``spending``: ``"pocock"`` or ``"obrien-fleming"`` (see :mod:`bisect_harness.decide.boundaries`).
    ``samples_per_boot``: planned samples in each boot; used only for planning
    (:func:`~bisect_harness.decide.simulate.simulate`), the tests take whatever each boot holds.
    ``analysis``: a name of :data:`ANALYSES`: ``"robust"``, ``"paired"`` (a
    one-sample t-test on the per-round log ratios; rounds are blocks) or
    ``"unpaired"`` (Welch on log boot means); see each one's module under
    ``decide/analyses/``. ``min_boots == max_boots`` is a fixed-size design with a
    single look.
    """

    alpha: float = 0.05
    min_boots: int = 3
    max_boots: int = 8
    spending: str = "pocock"
    samples_per_boot: int = 3
    analysis: str = "unpaired"
    prior_dof: int = 0

    def __post_init__(self):
        if not (0.0 < self.alpha < 0.5):
            raise ValueError(f"Design.alpha must be in (0, 0.5), got {self.alpha!r}")
        if int(self.min_boots) != self.min_boots or self.min_boots < 2:
            raise ValueError(
                f"Design.min_boots must be an integer >= 2 (a variance needs two boots), "
                f"got {self.min_boots!r}")
        if int(self.max_boots) != self.max_boots or self.max_boots < self.min_boots:
            raise ValueError(
                f"Design.max_boots must be an integer >= min_boots ({self.min_boots}), "
                f"got {self.max_boots!r}")
        if self.spending not in SPENDING_FUNCTIONS:
            raise ValueError(
                f"Design.spending must be one of {SPENDING_FUNCTIONS}, got {self.spending!r}")
        if int(self.samples_per_boot) != self.samples_per_boot or self.samples_per_boot < 1:
            raise ValueError(
                f"Design.samples_per_boot must be an integer >= 1, got {self.samples_per_boot!r}")
        if self.analysis not in ANALYSES:
            raise ValueError(f"Design.analysis must be one of {ANALYSES.names()}, got {self.analysis!r}")
        if int(self.prior_dof) != self.prior_dof or self.prior_dof < 0:
            raise ValueError(f"Design.prior_dof must be an integer >= 0, got {self.prior_dof!r}")
        if self.prior_dof and not ANALYSES[self.analysis].takes_prior:
            raise ValueError(f"Design.prior_dof: the {self.analysis!r} analysis takes no noise prior; "
                             f"only those that read rounds do "
                             f"({', '.join(n for n in ANALYSES.names() if ANALYSES[n].takes_prior)})")

    @property
    def looks(self) -> tuple[int, ...]:
        """Boots per arm at each planned look."""
        return tuple(range(self.min_boots, self.max_boots + 1))
