"""What an analysis is: the contract every kind of
:data:`~bisect_harness.decide.design.ANALYSES` keeps, and the t-test look they share.

An analysis reads the two arms' boots (:class:`Arms`) as one estimate ``d`` of the
change of the log metric, treatment over baseline (:class:`Estimate`), with a
standard error and degrees of freedom; a look compares it with the look's nominal
level (:func:`~bisect_harness.decide.boundaries.nominal_levels`, calibrated with
the analysis' own null law) by the decision kernel's rule
(:mod:`bisect_harness.decide.kernel`) and returns a :class:`Look`.
:func:`~bisect_harness.decide.evaluate.evaluate` asks the design's analysis each of
these in turn and writes the verdict; the simulations
(:mod:`bisect_harness.decide.simulate`), the planning
(:mod:`bisect_harness.decide.power`) and the boundaries ask it for the rest.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence

import numpy as np
from scipy import stats as _st

from bisect_harness.decide.boundaries import nominal_levels
from bisect_harness.decide.design import Design
from bisect_harness.decide.kernel import _decide
from bisect_harness.decide.prior import NoisePrior
from bisect_harness.model import Expect

__all__ = ["Analysis", "Arms", "Estimate", "Look"]


@dataclass(frozen=True)
class Arms:
    """The two arms as an analysis reads them: each one's boots (arrays of samples),
    and (baseline, treatment) pairs of the mean and the variance of the arm's log
    boot means and of its number of boots; ``rounds`` the round labels given to
    :func:`~bisect_harness.decide.evaluate.evaluate` (None: boot i of each arm is
    round i); ``prior`` a noise prior of earlier runs
    (:class:`~bisect_harness.decide.prior.NoisePrior`) for the analyses that take one."""

    baseline: list[np.ndarray]
    treatment: list[np.ndarray]
    mean: tuple[float, float]
    var: tuple[float, float]
    boots: tuple[int, int]
    rounds: Optional[tuple[Sequence[int], Sequence[int]]] = None
    prior: Optional[NoisePrior] = None


@dataclass(frozen=True)
class Estimate:
    """``d``: the estimated change of the log metric, treatment over baseline; ``k``:
    the look's sample size (rounds holding a boot of each arm, or boots in the
    smaller arm); ``n_pairs``: the rounds holding a boot of each arm (None for an
    analysis that does not match boots by round); ``diffs``: the per-round log
    ratios, in round order (None likewise)."""

    d: float
    k: int
    n_pairs: Optional[int] = None
    diffs: Optional[np.ndarray] = None


@dataclass(frozen=True)
class Look:
    """One look decided. ``code``: 1 confirmed, -1 refuted, 0 undecided; ``p_value``
    against "no change", one-sided, and ``threshold`` the look's level;
    ``look``: the boots per arm (rounds) whose boundary was used, None before the
    first look; ``d``: the estimate the verdict reports; ``ci``: the repeated
    interval of the ratio (None where not computed or not bounded on both
    sides) and ``ci_text`` how a reason says it; ``sign_flip``: decided by a
    sign-flip test (its ``threshold`` a share of sign patterns)."""

    code: int
    p_value: float
    threshold: float
    look: Optional[int]
    d: float
    ci: Optional[tuple[float, float]]
    ci_text: str
    sign_flip: bool = False


class Analysis(ABC):
    """One way to compare two arms, registered by its :attr:`name`.

    A kind says what it counts (:attr:`unit`, :attr:`few`), how it estimates and
    how it tests (:meth:`estimate`, :meth:`standard_error`, :meth:`look`), the null
    law its boundaries are calibrated with (:attr:`null_ratios`, :meth:`null_t`),
    how to simulate it fast (:meth:`path_statistics`) and how to plan it
    (:meth:`t_df`, :meth:`t_equivalent`). The default :meth:`look` is the t-test
    look at the nominal levels of :meth:`t_levels`.
    """

    #: the name a design and hypotheses.yaml's ``defaults.analysis`` give
    name: ClassVar[str]
    #: where the name is listed (the spec's message, the JSON Schema, the benches):
    #: lowest first
    listed: ClassVar[int]
    #: what a budget counts, in advice ("rounds", "boots per arm")
    unit: ClassVar[str]
    #: what a look needs two of, in "Only {k} ..." ("round(s) with both arms")
    few: ClassVar[str]
    #: ratios of the arms' variances of log boot means at which the levels must
    #: hold; each look takes the smallest level any of them needs
    null_ratios: ClassVar[tuple[float, ...]]
    #: whether its t-test pools a noise prior of earlier runs (``Design.prior_dof``);
    #: its :meth:`null_t` then takes ``prior_dof``
    takes_prior: ClassVar[bool] = False

    @staticmethod
    @abstractmethod
    def null_t(rng: np.random.Generator, n: int, kmax: int, idx: np.ndarray, k: np.ndarray,
               ratio: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """``n`` null paths of the test's t statistic and its df at the looks (``idx``:
        boots per arm less one, ``k``: the same as floats), drawn from ``rng`` as
        normal log boot means of mean 0 and variance 1 (the treatment's variance
        ``ratio``), ``kmax`` boots per arm."""

    @abstractmethod
    def estimate(self, arms: Arms) -> Estimate:
        """The change ``d`` and the look's sample size, from the two arms."""

    @abstractmethod
    def standard_error(self, arms: Arms, est: Estimate) -> tuple[float, float]:
        """(standard error of ``est.d``, its degrees of freedom); ``est.k >= 2``."""

    @abstractmethod
    def spread(self, arms: Arms, est: Estimate) -> float:
        """The standard deviation that a budget's advice scales by (see
        :func:`~bisect_harness.decide.evaluate.boots_to_decide`)."""

    @abstractmethod
    def t_df(self, n: int) -> int:
        """Degrees of freedom of the t-test at ``n`` boots per arm (rounds)."""

    @abstractmethod
    def test_name(self, design: Design, alpha: float, k: int, span: str) -> str:
        """The test in words, as the verdict names it at a look of ``k``."""

    def path_statistics(self, logs: np.ndarray,
                        looks: np.ndarray) -> Optional[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(d, se, df) at each look (paths x looks) for simulated paths of log boot
        means ``logs`` (2 arms x paths x boots; boot i of each arm is round i), or
        None where the boundaries depend on the data: then each path is decided by
        :func:`~bisect_harness.decide.evaluate.evaluate` itself."""
        return None

    def t_levels(self, design: Design, alpha: float) -> tuple[tuple[float, ...], int]:
        """(the nominal level of each look from ``design.min_boots`` on, the last
        look they cover)."""
        return nominal_levels(design, alpha), design.max_boots

    def t_equivalent(self, design: Design, alpha: float) -> tuple[Design, float]:
        """The t-test design that stands for ``design`` in closed-form planning."""
        return design, alpha

    def look(self, est: Estimate, se: float, df: float, expect: Expect, log_e: float, design: Design,
             alpha: float, interval: bool) -> Look:
        """Decide the look at ``est.k``: the kernel's rule at the look's nominal level,
        and the repeated confidence interval ``d +- t_{p_k, df} * se``."""
        d, k, a = est.d, est.k, alpha
        levels, last = self.t_levels(design, a)
        if k < design.min_boots:
            look, thr = None, levels[0]
        else:
            look = min(k, last)
            thr = levels[look - design.min_boots]
        code, p0 = _decide(d, se, df, expect.sign, log_e, thr)
        code, p0 = int(code), float(p0)
        half = float(_st.t.isf(thr, df)) * se
        ci = (math.exp(d - half), math.exp(d + half))
        ratio = math.exp(d)
        ci_txt = (f"{ratio:.4f}x, {(1 - 2 * a) * 100:.0f}% repeated CI "
                  f"{ci[0]:.4f}x..{ci[1]:.4f}x")
        return Look(code, p0, thr, look, d, ci, ci_txt)
