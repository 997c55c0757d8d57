"""Where a comparison's node time goes: boots or samples (two-stage sampling).

A boot costs ``boot_s`` (launch to ready, warm-up, teardown) and each sample in it
``sample_s``; its mean varies by ``var_between`` (the boot's own state) plus
``var_within / m`` (the samples' spread, ``m`` samples). Per second of node time, the
information one boot adds is ``1 / ((var_between + var_within / m) (boot_s + m sample_s))``,
largest at ``m* = sqrt((boot_s / sample_s) (var_within / var_between))`` (the optimum of
two-stage sampling: Cochran, *Sampling Techniques*, 3rd ed., 1977, section 10.6). So
more samples per boot when boots are dear and the boots agree with each other; more
boots, each with few samples, when the boots disagree.

The estimates come from the comparison's own rounds, pooled over the run's
hypotheses on one metric (:func:`round_components`): the within-boot part from the
spread of each boot's log samples, the between-boot part from the rounds' log
ratios **uncentred** (``E[d^2] = 2 var_between + var_within (1/m_a + 1/m_b)`` under no
change). Both are unchanged when a round's two boots swap arms, so the samples a
later round takes never depend on which arm came out ahead: each round's ratio stays
symmetric about zero when nothing changed, as the tests need (an effect only raises
the between-boot estimate, and so asks for fewer samples). Two guards keep a small
early estimate from steering far: ``m`` stays in ``[min_samples, max_samples]`` (a
between-boot estimate of zero asks for the most, never more), and until two rounds
and a cost are known the first rounds' count stands. The estimates steer only how
many samples a boot takes; the tests read each round as one ratio of boot means
whatever its count, so an estimate that is off costs node time, never error.

:class:`CostModel` is what a boot and a sample cost on this node: stated in the file
(``defaults.boot_cost_s``, ``defaults.sample_cost_s``: a node the harness has not
seen) or measured from the boots so far (:func:`measured_cost`).

A bisection keeps ``samples_per_boot``: pricing its samples from its own boots was
measured (``bench/bench_bisect.py --priced``) and not adopted; see that bench.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

__all__ = ["CostModel", "Components", "round_components", "samples_per_boot", "measured_cost", "node_time",
           "for_points", "fewest_per_point"]


@dataclass(frozen=True)
class CostModel:
    """What one boot and one sample cost, in seconds of the node. ``source``:
    ``stated`` (the hypotheses file) or ``measured`` (this run's boots)."""

    boot_s: float
    sample_s: float
    source: str = "stated"

    def __post_init__(self):
        for name in ("boot_s", "sample_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"CostModel.{name} must be a positive number of seconds, got {v!r}")

    def boot(self, samples: int) -> float:
        """Node seconds of one boot that takes ``samples`` samples."""
        return self.boot_s + samples * self.sample_s


@dataclass(frozen=True)
class Components:
    """Variance of log values within a boot and between boots (of one config, the
    arm's level taken out), with their degrees of freedom. ``var_between`` None:
    too few rounds to say."""

    var_within: Optional[float]
    df_within: int
    var_between: Optional[float]
    df_between: int


def round_components(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> Components:
    """The two variance components of log values from paired rounds, each a
    (baseline boot's samples, treatment boot's samples), pooled over every round given
    (rounds of several hypotheses on one metric may be pooled: the components are
    the host's and the engine's, the ratio between arms is not used). Both estimates
    are unchanged when a round's two boots swap arms (see the module)."""
    ss_w, df_w = 0.0, 0
    rounds = []
    for a, b in pairs:
        la, lb = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
        if la.size == 0 or lb.size == 0 or not (np.all(np.isfinite(la)) and np.all(np.isfinite(lb))):
            continue
        for x in (la, lb):
            if x.size > 1:
                ss_w += float(((x - x.mean()) ** 2).sum())
                df_w += x.size - 1
        rounds.append((float(lb.mean() - la.mean()), la.size, lb.size))
    var_w = ss_w / df_w if df_w else None
    if len(rounds) < 2 or var_w is None:
        return Components(var_w, df_w, None, len(rounds))
    d2 = np.array([d * d for d, _, _ in rounds])
    inv = np.array([1.0 / ma + 1.0 / mb for _, ma, mb in rounds])
    var_b = max(0.0, float((d2 - var_w * inv).mean()) / 2.0)
    return Components(var_w, df_w, var_b, len(rounds))


def samples_per_boot(cost: CostModel, comps: Optional[Components], *, min_samples: int, max_samples: int) -> int:
    """Samples per boot for the next round: the two-stage optimum
    ``sqrt((boot_s / sample_s) (var_within / var_between))`` rounded, held in
    ``[min_samples, max_samples]``. Before the components are known (``comps`` None,
    or fewer than two rounds) the two parts are taken as equal: ``sqrt(boot_s /
    sample_s)``, the choice whose cost is least far from the best whichever part
    turns out larger; that needs a cost known before any boot (a stated one)."""
    if max_samples <= min_samples:
        return min_samples
    if comps is None or comps.var_within is None or comps.var_between is None:
        m = math.sqrt(cost.boot_s / cost.sample_s)
        return int(min(max_samples, max(min_samples, round(m))))
    if comps.var_within <= 0.0:
        return min_samples  # the samples of a boot agree: more of them add nothing
    var_b = max(comps.var_between, comps.var_within * 1e-9)
    m = math.sqrt((cost.boot_s / cost.sample_s) * (comps.var_within / var_b))
    return int(min(max_samples, max(min_samples, round(m))))


def for_points(cost: CostModel, points: int) -> CostModel:
    """``cost`` for a boot that measures ``points`` load points (a curve, ``sweep:``): a
    boot takes its samples at every point, so one more sample per point costs
    ``points`` samples, and the two-stage optimum per point is ``sqrt(points)`` times
    smaller (each point's boot mean still varies by ``var_between + var_within / m``).
    ``bench/bench_curve.py`` prices it."""
    if int(points) != points or points < 1:
        raise ValueError(f"for_points: points must be an integer >= 1, got {points!r}")
    return cost if points == 1 else dataclasses.replace(cost, sample_s=cost.sample_s * points)


def fewest_per_point(samples_per_boot: int, points: int) -> int:
    """The fewest samples a boot takes at each of ``points`` load points:
    ``samples_per_boot`` (``defaults.samples_per_boot``, the fewest a boot of one point
    takes) spread over the points, at least one each, so a boot of a 5-point curve
    takes at least 5 samples rather than 15. ``bench/bench_curve.py --parts pricing``
    priced it on a small GPU (a boot 10 s, a sample 3 s), where samples are most of a
    boot's cost: with at least 3 at each point a 5-point curve with the same change at
    every point cost 3.5-8.6x one point's node time, with at least 1 (this rule)
    1.6-4.3x (12-20 runs a cell, 11 noise models); on a large node (900 s, 20 s) the
    two rules price alike."""
    if int(points) != points or points < 1:
        raise ValueError(f"fewest_per_point: points must be an integer >= 1, got {points!r}")
    return max(1, math.ceil(samples_per_boot / points))


def measured_cost(boots: Sequence[tuple[float, float, int]]) -> Optional[CostModel]:
    """The cost model of the boots so far, each (node seconds from launch to
    teardown, seconds of its samples together, samples taken): a sample's cost the
    median of the per-sample seconds, a boot's the median of what a boot took beside
    its samples. None before a boot finished with a sample."""
    rows = [(total, sampled, n) for total, sampled, n in boots if n > 0 and total > 0 and sampled >= 0]
    if not rows:
        return None
    per_sample = float(np.median([s / n for _, s, n in rows]))
    beside = float(np.median([max(t - s, 0.0) for t, s, _ in rows]))
    return CostModel(boot_s=max(beside, 1e-3), sample_s=max(per_sample, 1e-3), source="measured")


def node_time(cost: CostModel, samples: Sequence[int]) -> float:
    """Node seconds of boots that took ``samples`` samples each."""
    return float(sum(cost.boot(int(m)) for m in samples))
