"""Find the commit that moved a metric, under noise: a stepwise Bayesian bisection.

The model is a single step change. Between a known-good commit ``commits[0]`` and a
known-bad commit ``commits[-1]`` exactly one commit, the *culprit* at index ``k``
(``1 <= k <= n-1``), moved the metric: every commit before it is on the good side,
it and every commit after it on the bad side. A boot's value (one float per boot,
e.g. the boot's mean tok/s; the boot is the unit of replication) is modelled as

    good side: x ~ N(mu_g, s^2)        bad side: x ~ N(mu_b, s^2)

with ``mu_g``, ``mu_b`` and ``s`` unknown. The search keeps the exact posterior over
``k``: with flat priors on the two means, the scale prior ``1/s^2`` and the sign of
``mu_b - mu_g`` restricted to the expected direction, the marginal likelihood of a
split of the observed boots into a good group (sizes ``n_g``) and a bad group
(``n_b``, ``N`` boots in all, within-group sum of squares ``SSE``) is

    p(data | k)  ∝  (n_g n_b)^(-1/2) * SSE^(-(N-2)/2) * T_{N-2}(t_k)

where ``t_k = sign * (mean_b - mean_g) / sqrt(SSE/(N-2) * (1/n_g + 1/n_b))`` and
``T`` is Student's t CDF (the posterior probability that the means moved the
expected way). The prior over ``k`` is uniform. Every observed commit thus votes
with all its boots, the noise level is learnt from all of them, and nothing is
thresholded: a boot near the midpoint simply moves the posterior little.

The next probe is the commit where the posterior probability of being on the bad
side, ``P(k <= i)``, is closest to one half: probabilistic bisection (Horstein
1963; Waeber, Frazier & Henderson, "Bisection search with noisy responses", SIAM
J. Control Optim. 2013). An already probed commit whose side is still uncertain is
chosen again, which is how boots are added where they buy the most. A probe asks
for as many boots as make one probe call its side right about 90% of the time at
the current estimate of the effect and the noise (one boot when the effect is
several times the boot-to-boot noise).

The search stops when one commit holds ``confidence`` of the posterior mass. A
commit that was skipped (failed to build or boot) and never measured cannot be
told apart from the next commit: ``k = j`` and ``k = j + 1`` split the data the
same way. Such a run of skipped commits and the commit after it form one block;
when a block of several commits holds ``confidence`` of the mass, the answer is that
set, as ``git bisect`` reports "only skipped commits left to test".

Everything here is pure: no I/O, no logging, no clock. The state is the set of
observations, so a search rebuilt from a ledger's boots continues exactly where the
old one stood and never asks again for boots it already has.

Usage::

    search = BisectionSearch(shas, expect=Expect.DECREASE)
    result = run_search(search, measure)   # measure(sha, boots) -> values or None
    result.culprit, result.probability, result.candidate_set
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import special, stats

from bisect_harness.model import Expect

__all__ = [
    "BisectResult",
    "BisectionSearch",
    "Candidate",
    "Probe",
    "StopReason",
    "run_search",
]


class StopReason(str, enum.Enum):
    """Why a search stopped (or that it has not)."""

    RUNNING = "running"
    #: one commit holds ``confidence`` of the posterior mass
    CONFIDENT = "confident"
    #: a run of unmeasurable commits and the commit after it hold ``confidence``
    #: of the mass together; ``candidate_set`` lists them
    AMBIGUOUS_SKIPS = "ambiguous-skips"
    #: ``max_boots`` boots were spent before either of the above
    BUDGET = "budget"
    #: the endpoints, after ``max_endpoint_boots`` boots each, do not show the
    #: expected change with probability ``confidence``: nothing to bisect
    NOT_REPRODUCED = "not-reproduced"
    #: an endpoint could not be measured at all (skipped with no boots)
    ENDPOINT_UNMEASURABLE = "endpoint-unmeasurable"


@dataclass(frozen=True)
class Probe:
    """Measure ``commit`` for ``boots`` more boots."""

    commit: str
    boots: int


@dataclass(frozen=True)
class Candidate:
    """A commit and its posterior probability of being the culprit."""

    commit: str
    probability: float


@dataclass(frozen=True)
class BisectResult:
    """Where a search stands.

    ``culprit`` is set only when ``stopped`` is ``CONFIDENT``. ``candidate_set`` is
    the most probable block: one commit, or a run of unmeasurable commits and the
    commit after it, which no measurement can separate; ``probability`` is its
    posterior mass. ``candidates`` lists every commit with posterior probability at
    least 1e-4, most probable first. ``good_mean``, ``bad_mean`` and ``noise_sd``
    are estimates of the two sides' boot means and of the boot-to-boot standard
    deviation under the most probable split (NaN before both endpoints have boots).
    """

    culprit: str | None
    probability: float
    candidates: tuple[Candidate, ...]
    candidate_set: tuple[str, ...]
    boots_used: int
    commits_measured: int
    skipped: tuple[tuple[str, str], ...]
    stopped: StopReason
    good_mean: float
    bad_mean: float
    noise_sd: float


class BisectionSearch:
    """A stepwise noisy bisection over a linear list of commits.

    ``commits[0]`` is the known-good endpoint and ``commits[-1]`` the known-bad one
    (the caller linearises history, e.g. first-parent). ``expect`` is the direction
    the metric's value moved from good to bad (tok/s that dropped: ``DECREASE``).

    Call ``next_probe()``, measure what it asks, feed the boots to ``observe()``
    (or ``skip()`` a commit that cannot be built or booted), until ``next_probe()``
    returns None; then read ``result()``. ``observe`` and ``skip`` accept any commit
    at any time, so a search can be rebuilt from recorded boots.

    ``initial_boots`` boots are taken at each endpoint before anything else; if the
    endpoints do not show the expected change with probability ``confidence``, more
    endpoint boots are taken, up to ``max_endpoint_boots`` each, before giving up.
    ``max_probe_boots`` caps the boots asked for in one probe. ``seed`` only breaks
    exact ties between equally good probes, the same way on every run.
    """

    def __init__(self, commits: Sequence[str], *, expect: Expect, confidence: float = 0.95,
                 max_boots: int = 200, seed: int = 0, initial_boots: int = 3,
                 max_endpoint_boots: int = 10, max_probe_boots: int = 8):
        commits = tuple(commits)
        if len(commits) < 2:
            raise ValueError(f"bisection needs at least 2 commits (a good and a bad endpoint), "
                             f"got {len(commits)}")
        index: dict[str, int] = {}
        for i, sha in enumerate(commits):
            if not isinstance(sha, str) or not sha:
                raise ValueError(f"commit at position {i} is {sha!r}; expected a non-empty sha string")
            if sha in index:
                raise ValueError(f"commit {sha} appears twice (positions {index[sha]} and {i}); "
                                 f"pass a linear history with each commit once")
            index[sha] = i
        if not isinstance(expect, Expect):
            raise ValueError(f"expect must be Expect.INCREASE or Expect.DECREASE, got {expect!r}")
        if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
            raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
        for name, value, low in (("max_boots", max_boots, 2), ("initial_boots", initial_boots, 1),
                                 ("max_endpoint_boots", max_endpoint_boots, 1),
                                 ("max_probe_boots", max_probe_boots, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if max_endpoint_boots < initial_boots:
            raise ValueError(f"max_endpoint_boots ({max_endpoint_boots}) must be >= "
                             f"initial_boots ({initial_boots})")
        self._commits = commits
        self._index = index
        self._expect = expect
        self._confidence = float(confidence)
        self._max_boots = max_boots
        self._initial_boots = initial_boots
        self._max_endpoint_boots = max_endpoint_boots
        self._max_probe_boots = max_probe_boots
        self._values: list[list[float]] = [[] for _ in commits]
        self._skipped: dict[int, str] = {}
        # Fixed tie-break order: a function of the seed only, so resuming is exact.
        self._tie_rank = np.random.default_rng(seed).permutation(len(commits))

    # -- feeding ---------------------------------------------------------------------

    @property
    def commits(self) -> tuple[str, ...]:
        return self._commits

    def _position(self, commit: str) -> int:
        try:
            return self._index[commit]
        except KeyError:
            raise ValueError(f"unknown commit {commit!r}: it is not in the bisection range "
                             f"({self._commits[0]}..{self._commits[-1]}, {len(self._commits)} commits)"
                             ) from None

    def observe(self, commit: str, boot_values: Sequence[float]) -> None:
        """Add boot-level values (one float per boot) measured at ``commit``."""
        i = self._position(commit)
        values = [float(v) for v in boot_values]
        if not values:
            raise ValueError(f"no boot values given for commit {commit}; use skip() for a "
                             f"commit that could not be measured")
        bad = [v for v in values if not math.isfinite(v)]
        if bad:
            raise ValueError(f"boot values for commit {commit} must be finite, got {bad[0]!r}")
        self._values[i].extend(values)

    def skip(self, commit: str, reason: str = "") -> None:
        """Mark ``commit`` as unmeasurable (failed to build or boot): never probe it again.

        Boots it already has still count. A skipped commit without boots cannot be
        told apart from the commit after it.
        """
        i = self._position(commit)
        self._skipped.setdefault(i, reason)

    # -- the model -------------------------------------------------------------------

    @property
    def boots_used(self) -> int:
        return sum(len(v) for v in self._values)

    def _splits(self):
        """Log marginal likelihood of each distinct split of the observed commits.

        Returns ``(obs, loglik, stats)`` where ``obs`` holds the indices of observed
        commits in order and ``loglik[j]`` is the log likelihood of "the first ``j``
        observed commits are good, the rest bad", for ``j = 1..len(obs)-1`` (entries
        0 and ``len(obs)`` are -inf: an endpoint always sits on its own side).
        ``stats`` holds (mean_g, mean_b, sd) per split in original units.
        None when the endpoints lack boots or fewer than 3 boots exist.
        """
        n = len(self._commits)
        if not self._values[0] or not self._values[n - 1]:
            return None
        obs = np.array([i for i in range(n) if self._values[i]], dtype=int)
        allv = np.concatenate([np.asarray(self._values[i]) for i in obs])
        total = allv.size
        if total < 3:
            return None
        center = float(allv.mean())
        scale = float(allv.std())
        if scale == 0.0:
            scale = abs(center) if center != 0.0 else 1.0
        cnt = np.array([len(self._values[i]) for i in obs], dtype=float)
        z = [(np.asarray(self._values[i]) - center) / scale for i in obs]
        s1 = np.array([v.sum() for v in z])
        s2 = np.array([(v * v).sum() for v in z])
        cn = np.concatenate([[0.0], np.cumsum(cnt)])
        c1 = np.concatenate([[0.0], np.cumsum(s1)])
        c2 = np.concatenate([[0.0], np.cumsum(s2)])
        m = obs.size
        j = np.arange(1, m)  # first j observed commits good
        ng, nb = cn[j], cn[m] - cn[j]
        sg, sb = c1[j], c1[m] - c1[j]
        qg, qb = c2[j], c2[m] - c2[j]
        mg, mb = sg / ng, sb / nb
        # Tiny floor: noise-free data stays finite (the prior scale is 1e-6 of the spread).
        sse = np.maximum(qg - sg * mg, 0.0) + np.maximum(qb - sb * mb, 0.0) + 1e-12 * total
        df = total - 2
        se = np.sqrt(sse / df * (1.0 / ng + 1.0 / nb))
        t = self._expect.sign * (mb - mg) / se
        ll = -0.5 * np.log(ng * nb) - 0.5 * df * np.log(sse) + stats.t.logcdf(t, df)
        loglik = np.full(m + 1, -np.inf)
        loglik[1:m] = ll
        sd = np.sqrt(sse / df) * scale
        split_stats = np.full((m + 1, 3), np.nan)
        split_stats[1:m] = np.column_stack([center + mg * scale, center + mb * scale, sd])
        return obs, loglik, split_stats

    def _posterior(self):
        """Posterior over the culprit index (entry 0 is always 0) and the split stats."""
        n = len(self._commits)
        splits = self._splits()
        if splits is None:
            p = np.full(n, 1.0 / (n - 1))
            p[0] = 0.0
            return p, None, None
        obs, loglik, split_stats = splits
        k = np.arange(n)
        j_of_k = np.searchsorted(obs, k, side="left")  # observed commits strictly before k
        logp = loglik[j_of_k]
        logp[0] = -np.inf
        p = np.exp(logp - special.logsumexp(logp))
        p[0] = 0.0
        return p, j_of_k, split_stats

    def _blocks(self) -> list[list[int]]:
        """Culprit indices grouped so that no measurement can split a group."""
        n = len(self._commits)
        blocks: list[list[int]] = []
        run: list[int] = []
        for k in range(1, n):
            run.append(k)
            if not (k in self._skipped and not self._values[k]):
                blocks.append(run)
                run = []
        if run:  # only reachable when the bad endpoint is skipped without boots
            blocks.append(run)
        return blocks

    def _endpoint_direction(self) -> float:
        """P(metric moved the expected way) from the endpoints' boots alone."""
        g = np.asarray(self._values[0])
        b = np.asarray(self._values[-1])
        df = g.size + b.size - 2
        if df < 1:
            return 0.5
        spread = float(np.concatenate([g, b]).std()) or max(abs(float(g.mean())), 1.0)
        sse = ((g - g.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum() + 1e-12 * spread ** 2
        se = math.sqrt(sse / df * (1.0 / g.size + 1.0 / b.size))
        return float(stats.t.cdf(self._expect.sign * (b.mean() - g.mean()) / se, df))

    # -- deciding --------------------------------------------------------------------

    def _decide(self):
        """(probe or None, stop reason, posterior, blocks, split stats at the best split)."""
        n = len(self._commits)
        p, j_of_k, split_stats = self._posterior()
        blocks = self._blocks()
        mass = [float(p[b].sum()) for b in blocks]
        best = int(np.argmax(mass))
        best_stats = (math.nan, math.nan, math.nan)
        if j_of_k is not None:
            best_stats = tuple(float(x) for x in split_stats[j_of_k[blocks[best][-1]]])

        def done(reason):
            return None, reason, p, blocks, best, mass, best_stats

        left = self._max_boots - self.boots_used
        ends = (0, n - 1)
        for e in ends:
            if e in self._skipped and not self._values[e]:
                return done(StopReason.ENDPOINT_UNMEASURABLE)
        if left <= 0:
            return done(StopReason.BUDGET)
        # 1. The endpoints first: each gets initial_boots (those it has count).
        for e in ends:
            need = self._initial_boots - len(self._values[e])
            if need > 0 and e not in self._skipped:
                return Probe(self._commits[e], min(need, left)), StopReason.RUNNING, p, blocks, best, \
                    mass, best_stats
        # 2. Is there anything to bisect? The endpoints must show the expected change.
        if self._endpoint_direction() < self._confidence:
            open_ends = [e for e in ends if e not in self._skipped
                         and len(self._values[e]) < self._max_endpoint_boots]
            if not open_ends:
                return done(StopReason.NOT_REPRODUCED)
            e = min(open_ends, key=lambda e: (len(self._values[e]), e))
            return Probe(self._commits[e], 1), StopReason.RUNNING, p, blocks, best, mass, best_stats
        # 3. Confident in one commit, or in a block no measurement can split?
        if mass[best] >= self._confidence:
            if len(blocks[best]) == 1:
                return done(StopReason.CONFIDENT)
            return done(StopReason.AMBIGUOUS_SKIPS)
        # 4. Probabilistic bisection: the probe-able commit nearest the posterior median.
        cum = np.cumsum(p)
        probe_able = np.array([i for i in range(1, n - 1) if i not in self._skipped], dtype=int)
        if probe_able.size == 0:
            return done(StopReason.AMBIGUOUS_SKIPS)
        gap = np.abs(cum[probe_able] - 0.5)
        tied = probe_able[gap <= gap.min() + 1e-12]
        i = int(tied[np.argmin(self._tie_rank[tied])])
        return Probe(self._commits[i], min(self._probe_boots(best_stats), left)), StopReason.RUNNING, \
            p, blocks, best, mass, best_stats

    def _probe_boots(self, best_stats) -> int:
        """Boots for one probe to call its side right ~90% of the time: a probe of b
        boots, thresholded midway, errs with probability Phi(-d sqrt(b) / 2) where
        d = |mu_b - mu_g| / s."""
        mg, mb, sd = best_stats
        if not all(math.isfinite(x) for x in best_stats):
            return 1
        if sd <= 0.0:
            return 1
        d = abs(mb - mg) / sd
        if d <= 0.0:
            return self._max_probe_boots
        b = math.ceil((2.0 * stats.norm.ppf(0.9) / d) ** 2)
        return int(min(max(b, 1), self._max_probe_boots))

    def next_probe(self) -> Probe | None:
        """The next commit to measure and how many boots to spend; None when done."""
        return self._decide()[0]

    def result(self) -> BisectResult:
        """Where the search stands now (``stopped`` is ``RUNNING`` while it goes on)."""
        probe, reason, p, blocks, best, mass, (mg, mb, sd) = self._decide()
        order = np.argsort(-p, kind="stable")
        candidates = tuple(Candidate(self._commits[k], float(p[k])) for k in order if p[k] >= 1e-4)
        block = tuple(self._commits[k] for k in blocks[best])
        culprit = block[0] if reason is StopReason.CONFIDENT else None
        return BisectResult(
            culprit=culprit,
            probability=mass[best],
            candidates=candidates,
            candidate_set=block,
            boots_used=self.boots_used,
            commits_measured=sum(1 for v in self._values if v),
            skipped=tuple((self._commits[i], r) for i, r in sorted(self._skipped.items())),
            stopped=reason,
            good_mean=mg,
            bad_mean=mb,
            noise_sd=sd,
        )


def run_search(search: BisectionSearch,
               measure: Callable[[str, int], Sequence[float] | None]) -> BisectResult:
    """Drive ``search`` to its end. ``measure(commit, boots)`` returns one value per
    boot it managed (at least one), or None when the commit cannot be built or
    booted, which skips it."""
    while (probe := search.next_probe()) is not None:
        values = measure(probe.commit, probe.boots)
        if values is None:
            search.skip(probe.commit, "measure returned None")
        else:
            search.observe(probe.commit, values)
    return search.result()
