"""A noise prior: what earlier runs of the same two configs on the same host say
about the spread of a round's log ratio, pooled with the rounds' own.

The paired t-test estimates the variance of a round's log ratio from the rounds it
has, ``k - 1`` degrees of freedom: at 3 rounds its 1% point is 6.96, where a known
variance would give 2.33, and that, not the noise, is why a clear change costs at
least 3-4 boots a side (``docs/design.md``: "the floor of 3 boots a side"). Boots of
the same two configs on the same host, in earlier runs, measured the same variance
already. :class:`NoisePrior` carries it: their rounds' log ratios, centred on each
run's own mean (so an earlier run's change, or a host level that has moved since,
says nothing here), as a variance with ``dof`` degrees of freedom. The test pools
it with the rounds' own,

    ``s^2 = (dof * s0^2 + (k - 1) * s_k^2) / (dof + k - 1)``,

a t with ``dof + k - 1`` degrees of freedom under the assumption that the host's
noise is what it was; the boundaries are calibrated for that law
(:mod:`bisect_harness.decide.boundaries`, ``Design.prior_dof``), and the first look
comes at 2 rounds.

The assumption is checked at every look: where the rounds' own variance differs
from the prior's beyond what chance allows (an F-test: ``SPREADS_MORE_AT`` where they
spread more, a neighbour moved in or a driver changed the spread; ``SPREADS_LESS_AT``
where they spread less, the prior's rounds held a stalled boot that the run's do
not), :func:`pooled_variance` drops the prior and the look is the plain paired
t-test of the rounds alone; the verdict says which it was. The boundaries are
calibrated for exactly that rule. A prior counts for at most ``MAX_PRIOR_DOF``
degrees of freedom, so the rounds of today always weigh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as _st

__all__ = ["NoisePrior", "MAX_PRIOR_DOF", "SPREADS_MORE_AT", "SPREADS_LESS_AT", "contradicts", "prior_from_runs",
           "pooled_variance"]

#: The most degrees of freedom a prior counts for (earlier rounds beyond it are not
#: pooled: today's rounds keep at least a few percent of the weight from the third
#: on, and a stale prior is contradicted sooner).
MAX_PRIOR_DOF = 24
#: Levels of the check that the rounds' own variance agrees with the prior's, on the
#: side where the rounds spread more (the host got noisier: the side that costs error,
#: so a strict one) and on the side where they spread less (the prior's rounds held a
#: stall the run's do not: the side that costs only boots). Where either fails, the
#: look drops the prior. With the simulation of ``tests/test_noise_prior.py`` (paired,
#: alpha 0.05), a prior from boots a quarter as variable as now confirms no change
#: 0.073 of the time with these, 0.11 with 5% on both sides; a change of twice a
#: round's standard deviation took 3.4 rounds with them, 3.0 with 5% on both sides and
#: 4.0 without a prior (its helpers, 300 runs, measured when these were chosen).
SPREADS_MORE_AT = 0.25
SPREADS_LESS_AT = 0.05


@dataclass(frozen=True)
class NoisePrior:
    """The variance of one round's log ratio (treatment over baseline) that earlier
    runs of the same two configs on the same host showed: ``var`` with ``dof``
    degrees of freedom, from ``rounds`` rounds of ``runs`` runs; ``boots``: the
    ledger ids of their boots (the provenance of every figure), in order;
    ``samples``: the most samples a boot of those rounds held (0: not known). A
    round's log ratio is the noisier the fewer samples its boots hold, so the rounds
    a prior is pooled with should hold at least as many."""

    var: float
    dof: int
    rounds: int
    runs: int
    boots: tuple[int, ...] = ()
    samples: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.var) and self.var > 0):
            raise ValueError(f"NoisePrior.var must be a positive number, got {self.var!r}")
        if int(self.dof) != self.dof or not (1 <= self.dof <= MAX_PRIOR_DOF):
            raise ValueError(f"NoisePrior.dof must be an integer in 1..{MAX_PRIOR_DOF}, got {self.dof!r}")

    def describe(self) -> str:
        return (f"a noise prior of {self.dof} degrees of freedom ({self.rounds} rounds of {self.runs} earlier "
                f"run{'s' if self.runs != 1 else ''} of the same two configs on this host: a round's log ratio "
                f"spread {math.sqrt(self.var) * 100:.2f}%)")


def prior_from_runs(runs: Sequence[Sequence[float]], boots: Sequence[Sequence[int]] = (),
                    samples: Sequence[Sequence[int]] = ()) -> NoisePrior | None:
    """A prior from earlier runs' per-round log ratios (one sequence per run, newest
    first): each run centred on its own mean, pooled, the newest rounds first until
    ``MAX_PRIOR_DOF`` degrees of freedom. ``boots`` and ``samples``, where given, hold
    per run the boot ids of each round (two a round) and the most samples a boot of
    each round held; the prior keeps those of the rounds it pooled. None where no run
    has two rounds, or the ratios do not vary at all."""
    ss, dof, rounds, used, ids, most = 0.0, 0, 0, 0, [], 0
    for j, diffs in enumerate(runs):
        x = np.asarray(diffs, dtype=float)
        if x.size < 2 or not np.isfinite(x).all():
            continue
        take = min(x.size, MAX_PRIOR_DOF - dof + 1)
        if take < 2:
            break
        x = x[:take]
        ss += float(((x - x.mean()) ** 2).sum())
        dof += take - 1
        rounds += take
        used += 1
        if j < len(boots):
            ids.extend(boots[j][:2 * take])
        if j < len(samples):
            most = max(most, *samples[j][:take])
        if dof >= MAX_PRIOR_DOF:
            break
    if dof < 1 or not ss > 0:
        return None
    return NoisePrior(var=ss / dof, dof=dof, rounds=rounds, runs=used, boots=tuple(ids), samples=most)


def contradicts(ratio, own_dof, prior_dof):
    """Whether rounds whose variance is ``ratio`` times the prior's contradict it: the
    F-test's one-sided p-value below ``SPREADS_MORE_AT`` where the host spreads more
    than the prior says, or below ``SPREADS_LESS_AT`` where it spreads less (the
    prior's rounds held a stall or a burst the run's rounds do not). Works on arrays."""
    more = _st.f.sf(ratio, own_dof, prior_dof) < SPREADS_MORE_AT
    return more | (_st.f.cdf(ratio, own_dof, prior_dof) < SPREADS_LESS_AT)


def pooled_variance(prior: NoisePrior | None, diffs: np.ndarray) -> tuple[float, float, bool]:
    """(variance of one round's log ratio, its degrees of freedom, whether the prior
    was pooled) at a look of ``diffs`` (the rounds' log ratios). Without a prior, or
    where the rounds' own variance contradicts it (:func:`contradicts`), the rounds'
    own variance with ``k - 1``."""
    k = int(diffs.size)
    own = float(diffs.var(ddof=1)) if k > 1 else float("nan")
    if prior is None or k < 2:
        return own, float(k - 1), False
    if contradicts(own / prior.var, k - 1, prior.dof):
        return own, float(k - 1), False
    return (prior.dof * prior.var + (k - 1) * own) / (prior.dof + k - 1), float(prior.dof + k - 1), True
