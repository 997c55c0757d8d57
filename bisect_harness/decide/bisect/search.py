"""Find the commit that moved a metric, under noise: a stepwise Bayesian bisection
whose confident answers are checked head to head.

The model is a single step change, or none: the posterior over where the step is
(or that there is none) comes from :class:`~bisect_harness.decide.bisect.model.StepModel`
(its module tells the likelihoods, the slow mode, the drift and the priors). The
search's settings are one frozen value,
:class:`~bisect_harness.decide.bisect.options.SearchOptions`; what it hands back are
the frozen values of :mod:`bisect_harness.decide.bisect.result`; its paired tests
are :mod:`bisect_harness.decide.paired_sequential`'s.

The search runs in *rounds*: the caller boots a round's probes in the order given
(interleaved), then hands the values back with ``observe_round``:

1. **The endpoint check, on paired rounds.** Rounds of one boot of the good and one of
   the bad endpoint, in a random order per round, until a one-sided sequential
   paired test on the per-round differences (``paired_sequential_test``) shows the
   expected change. The order is random, so under "no change" each difference is
   symmetric about zero whatever the host does (drift, bursts, two-mode boots);
   each of the test's looks gets ``(1 - confidence) / looks`` (Bonferroni), so the
   repeated looks keep its error rate. The rounds of a confirmed hypothesis' verdict
   whose sides are the endpoints open it (``observe_endpoint_round``): the search
   exists only because that verdict confirmed, so it starts for a change that is not
   there at most the verdict's alpha of the time either way, and the check boots on
   only where those rounds do not decide it. Other boots (reused from a ledger) feed
   the posterior but never this check: they were not booted in paired rounds of a
   random order.
   With a ``min_effect`` the check also ends, as *not reproduced*, once the
   change's upper bound at a look's level is below that share of the good
   endpoint's level: a false alarm, or a change smaller than the one asked about,
   is said in a few rounds instead of at the check's last look.
2. **Probabilistic bisection.** The next probe is the commit where the posterior
   probability of being on the bad side is closest to one half (Horstein 1963;
   Waeber, Frazier & Henderson, SIAM J. Control Optim. 2013), for as many boots as
   call its side right about 90% of the time at the current estimates. Every
   ``anchor_every``-th round also boots an *anchor*: the nearest measured commit
   that is confidently good or bad, alternately, so that the comparison is made
   within time and the drift is learnt.
3. **A head-to-head test before a confident answer.** When one commit holds
   ``confidence`` of the mass, it is booted against its parent in paired,
   randomly ordered rounds, with the same sequential paired test at level
   ``verify_alpha`` (1% by default, apart from ``confidence``: the posterior's mass
   says where to look, the test how often a wrong answer may pass). Only a commit
   whose change against its parent is shown this way is reported as the culprit. A
   wrong commit and its parent are the same code, so a wrong answer is reported at
   most ``verify_alpha`` of the time, whatever the noise, as long as the noise does
   not depend on which commit is booted. A search makes at most three such tests, the first at 80% of
   ``verify_alpha``, the others at 10% each; a test, once started, runs to its
   decision. A commit that fails its test is never reported; when the posterior
   settles on it again, or no test is left, the search ends as ``unverified``.
   With a ``min_effect``, a test that shows the change between the two smaller
   than it ends ``below``, not passed, at once.

A commit that was skipped (failed to build or boot) and never measured cannot be
told apart from the next commit: such a run of skipped commits and the commit after
it form one block; when a block of several commits holds ``confidence`` of the mass,
the answer is that set (``ambiguous-skips``), as ``git bisect`` reports "only
skipped commits left to test". A set is checked head to head like a single
commit: its last member against the parent of its first. Where that parent (or
the last member) can no longer be booted, the set widens over it to the nearest
bootable commit, as asv's ``find`` steps over a commit that does not build; the
answer is the widened set, verified or not. A head-to-head test whose commit
becomes unmeasurable is ``abandoned`` (counted as not passed).

A round may come back with nothing for a commit (an empty list: every boot this
time failed or was left out, but the commit is not unmeasurable): the search
asks again; its caller's budget bounds that.

Everything here is pure: no I/O, no logging, no clock. The state is the list of
observations and paired rounds, so a search rebuilt from them continues exactly
where the old one stood.

Usage::

    search = BisectionSearch(shas, expect=Expect.DECREASE)
    result = run_search(search, measure)   # measure(sha, boots) -> values or None
    result.culprit, result.leader, result.leader_probability, result.candidate_set
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats

from bisect_harness.decide.bisect.model import StepModel
from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.decide.bisect.result import BisectResult, Candidate, Probe, SearchTest, StopReason
from bisect_harness.decide.paired_sequential import PairedTest, paired_sequential_test
from bisect_harness.model import Expect

__all__ = ["BisectionSearch", "probe_boots", "run_search"]

#: shares of ``verify_alpha`` for the first, second and third head-to-head test of a search
GATE_SHARES = (0.8, 0.1, 0.1)


class BisectionSearch:
    """A stepwise noisy bisection over a linear list of commits.

    ``commits[0]`` is the known-good endpoint and ``commits[-1]`` the known-bad one
    (the caller linearises history, e.g. first-parent). ``expect`` is the direction
    the metric's value moved from good to bad (tok/s that dropped: ``DECREASE``).

    Call ``next_round()``, boot its probes in the order given, hand the values to
    ``observe_round()`` (None for a commit that cannot be built or booted), until
    ``next_round()`` returns None; then read ``result()``. ``observe`` and ``skip``
    accept any commit at any time (boots from a ledger, say): they feed the
    posterior but not the paired tests.

    ``options`` is a :class:`~bisect_harness.decide.bisect.options.SearchOptions`, or
    its fields come as keywords (``confidence``, ``max_boots``, ``seed``,
    ``verify_alpha``, ...), checked when the search is made; either way it is kept as
    :attr:`options`.
    """

    def __init__(self, commits: Sequence[str], *, expect: Expect, options: SearchOptions | None = None,
                 **fields):
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
        if options is not None and fields:
            raise ValueError(f"give the search's options as a SearchOptions or as keywords, not both "
                             f"(got options and {', '.join(sorted(fields))})")
        self.options = options if options is not None else SearchOptions(**fields)
        self._commits = commits
        self._index = index
        self._expect = expect
        # Observations: commit index, value, host time (boots observed before it).
        self._obs_i: list[int] = []
        self._obs_x: list[float] = []
        self._values: list[list[float]] = [[] for _ in commits]
        self._skipped: dict[int, str] = {}
        # Paired rounds: (good-side index, bad-side index) -> list of bad - good differences.
        self._pairs: dict[tuple[int, int], list[float]] = {}
        self._pair_rounds = 0
        self._probe_rounds = 0
        self._anchors = 0
        self._gates: list[tuple[int, int]] = []  # (parent, candidate) per head-to-head test
        # Fixed tie-break order: a function of the seed only, so resuming is exact.
        self._tie_rank = np.random.default_rng(self.options.seed).permutation(len(commits))
        self._cache: tuple | None = None

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

    def _checked(self, commit: str, boot_values) -> tuple[int, list[float]]:
        i = self._position(commit)
        values = [float(v) for v in boot_values]
        if not values:
            raise ValueError(f"no boot values given for commit {commit}; use skip() for a "
                             f"commit that could not be measured")
        bad = [v for v in values if not math.isfinite(v)]
        if bad:
            raise ValueError(f"boot values for commit {commit} must be finite, got {bad[0]!r}")
        return i, values

    def observe(self, commit: str, boot_values: Sequence[float]) -> None:
        """Add boot-level values (one float per boot, in the order booted) at ``commit``.

        They feed the posterior, never the paired tests."""
        i, values = self._checked(commit, boot_values)
        self._add(i, values)

    def _add(self, i: int, values: list[float]) -> None:
        for v in values:
            self._obs_i.append(i)
            self._obs_x.append(v)
        self._values[i].extend(values)
        self._cache = None

    def observe_endpoint_round(self, good_value: float, bad_value: float) -> None:
        """A paired round of the two endpoints made before the search: a confirmed
        hypothesis' verdict round (its sides are the endpoints, booted within the round
        in a random order). It opens the endpoint check as the search's own rounds do,
        and feeds the posterior: a search starts only where the verdict confirmed, so a
        search for a change that is not there starts at most the verdict's alpha of the
        time, and the check boots on only where these rounds do not decide it."""
        good, bad = 0, len(self._commits) - 1
        (_, (x,)), (_, (y,)) = (self._checked(self._commits[good], [good_value]),
                                self._checked(self._commits[bad], [bad_value]))
        self._add(good, [x])
        self._add(bad, [y])
        self._pairs.setdefault((good, bad), []).append(self._expect.sign * (y - x))
        self._pair_rounds += 1

    def skip(self, commit: str, reason: str = "") -> None:
        """Mark ``commit`` as unmeasurable (failed to build or boot): never probe it again.

        Boots it already has still count. A skipped commit without boots cannot be
        told apart from the commit after it.
        """
        i = self._position(commit)
        self._skipped.setdefault(i, reason)
        self._cache = None

    def observe_round(self, probes: Sequence[Probe], results: Sequence[Sequence[float] | None]) -> None:
        """Feed the values of a round from ``next_round()``, in its order: a list of
        boot values, an empty list (nothing usable this time; asked again), or None
        (the commit is unmeasurable: skipped for good).

        A paired round whose two boots both came back is recorded as a pair."""
        probes, results = list(probes), list(results)
        if len(probes) != len(results):
            raise ValueError(f"a round of {len(probes)} probes got {len(results)} results")
        checked = []
        for probe, values in zip(probes, results):
            if values is None:
                self.skip(probe.commit, "measure returned None")
                checked.append(None)
            elif len(values) == 0:
                self._position(probe.commit)
                checked.append(None)
            else:
                i, vals = self._checked(probe.commit, values)
                self._add(i, vals)
                checked.append((i, vals))
        if probes and probes[0].purpose in ("endpoints", "verify"):
            self._pair_rounds += 1
            if len(probes) == 2 and all(c is not None and len(c[1]) == 1 for c in checked):
                (i, (x,)), (j, (y,)) = checked
                good, bad = (i, j) if i < j else (j, i)
                diff = (y - x) if i < j else (x - y)
                self._pairs.setdefault((good, bad), []).append(self._expect.sign * diff)
                if probes[0].purpose == "verify" and (good, bad) not in self._gates:
                    self._gates.append((good, bad))
        elif probes:
            self._probe_rounds += 1
            self._anchors += sum(1 for p in probes if p.purpose == "anchor")
        self._cache = None

    # -- the model -------------------------------------------------------------------

    @property
    def boots_used(self) -> int:
        return len(self._obs_x)

    def _posterior(self):
        """Posterior over the culprit index (entry 0 is always 0), P(no step), split stats
        (see :meth:`StepModel.posterior <bisect_harness.decide.bisect.model.StepModel.posterior>`)."""
        return StepModel(self._commits, self._expect, self.options, self._values, self._obs_i,
                         self._obs_x).posterior()

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

    def _paired(self, good: int, bad: int, alpha: float, min_pairs: int, max_pairs: int) -> PairedTest:
        return paired_sequential_test(self._pairs.get((good, bad), []), alpha=alpha,
                                      min_pairs=min_pairs, max_pairs=max_pairs, below=self._least_change(good))

    def _least_change(self, good: int) -> float | None:
        """``min_effect`` in the metric's units: that share of the good side's level
        (the mean of its boots so far); None without a ``min_effect``."""
        share, level = self.options.min_effect, self._values[good]
        if share is None or not level:
            return None
        scale = abs(float(np.mean(level)))
        return share * scale if scale > 0.0 else None

    def _gate_test(self, g: int) -> PairedTest:
        parent, k = self._gates[g]
        t = self._paired(parent, k, self.options.verify_alpha * GATE_SHARES[g], 3, self.options.max_verify_pairs)
        if t.decision == "open" and (parent in self._skipped or k in self._skipped):
            return dataclasses.replace(t, decision="abandoned")
        return t

    def _gate_target(self, block: list[int]) -> tuple[int, int] | None:
        """The pair a block's head-to-head test boots: its last member against the
        parent of its first, each widened over commits that can no longer be booted
        (None when no bootable pair is left)."""
        n = len(self._commits)
        g, h = block[0] - 1, block[-1]
        while g > 0 and g in self._skipped:
            g -= 1
        while h < n - 1 and h in self._skipped:
            h += 1
        if g in self._skipped or h in self._skipped:
            return None
        return g, h

    def _endpoint_test(self) -> PairedTest:
        return self._paired(0, len(self._commits) - 1, 1.0 - self.options.confidence,
                            self.options.initial_boots, self.options.max_endpoint_boots)

    def _pair_round(self, good: int, bad: int, purpose: str) -> tuple[Probe, ...]:
        """One boot each of ``good`` and ``bad``, in an order drawn from the seed and the
        number of paired rounds so far (so a replayed search draws the same)."""
        first_good = bool(np.random.default_rng([self.options.seed, self._pair_rounds]).random() < 0.5)
        a, b = (good, bad) if first_good else (bad, good)
        test = 0 if purpose == "endpoints" else len(self._gates)  # the open test is the last gate
        return (Probe(self._commits[a], 1, purpose, test), Probe(self._commits[b], 1, purpose, test))

    # -- deciding --------------------------------------------------------------------

    def _decide(self):
        """(round or None, stop reason, state) where state holds the posterior's view."""
        if self._cache is not None:
            return self._cache
        out = self._decide_uncached()
        self._cache = out
        return out

    def _decide_uncached(self):
        """The next round, or why the search stops, from the posterior and the tests, in
        the order the search asks: is there anything to bisect (the endpoints), is one
        commit or block settled (checked against its parent), else where to probe."""
        n = len(self._commits)
        p, p_none, j_of_k, split_stats = self._posterior()
        blocks = self._blocks()
        mass = [float(p[b].sum()) for b in blocks]
        best = int(np.argmax(mass))
        best_stats = (math.nan, math.nan, math.nan)
        if j_of_k is not None:
            best_stats = tuple(float(x) for x in split_stats[j_of_k[blocks[best][-1]]])
        state = {"p": p, "p_none": p_none, "blocks": blocks, "best": best, "mass": mass,
                 "stats": best_stats, "endpoint_test": None, "verify_test": None}
        left = self.options.max_boots - self.boots_used
        tests = [self._gate_test(g) for g in range(len(self._gates))]  # the head-to-head tests so far
        answer = self._endpoints_step(state, left, tests)
        if answer is None:
            answer = self._settled_step(state, left, tests)
        if answer is None:
            answer = self._probe_step(state, left)
        rnd, reason = answer
        return rnd, reason, state

    def _endpoints_step(self, state: dict, left: int, tests: list[PairedTest]):
        """1. Is there anything to bisect? Fresh paired rounds of the two endpoints.
        (round, reason) when this step decides, else None; fills the state's tests."""
        n = len(self._commits)
        ends = (0, n - 1)
        for e in ends:
            if e in self._skipped and not self._values[e]:
                return None, StopReason.ENDPOINT_UNMEASURABLE
        state["verify_test"] = tests[-1] if tests else None
        et = self._endpoint_test()
        state["endpoint_test"] = et
        if any(e in self._skipped for e in ends) and et.decision != "passed":
            return None, StopReason.ENDPOINT_UNMEASURABLE
        if et.decision in ("failed", "below"):
            return None, StopReason.NOT_REPRODUCED
        if et.decision == "open":
            if left < 2:
                return None, StopReason.BUDGET
            return tuple(self._pair_round(0, n - 1, "endpoints")), StopReason.RUNNING
        if state["p_none"] >= self.options.confidence:
            return None, StopReason.NOT_REPRODUCED
        return None

    def _settled_step(self, state: dict, left: int, tests: list[PairedTest]):
        """2. Confident in one commit (checked against its parent), or in a block? A
        head-to-head test, once started, runs to its decision (its boots feed the
        posterior too). At most len(GATE_SHARES) of them per search, the g-th at level
        verify_alpha * GATE_SHARES[g]: a wrong commit is reported at most verify_alpha of
        the time in all. (round, reason) when this step decides, else None."""
        if tests and tests[-1].decision == "open":
            parent, k = self._gates[-1]
            if left < 2:
                return None, StopReason.BUDGET
            return tuple(self._pair_round(parent, k, "verify")), StopReason.RUNNING
        blocks, best, mass, p = state["blocks"], state["best"], state["mass"], state["p"]
        if mass[best] < self.options.confidence:
            return None
        block = blocks[best]
        if not self.options.verify:
            return None, (StopReason.CONFIDENT if len(block) == 1 else StopReason.AMBIGUOUS_SKIPS)
        target = self._gate_target(block)
        if target is None:
            return None, StopReason.UNVERIFIED
        state["set"] = list(range(target[0] + 1, target[1] + 1))
        state["set_mass"] = float(p[state["set"]].sum())
        answer = StopReason.CONFIDENT if len(state["set"]) == 1 else StopReason.AMBIGUOUS_SKIPS
        if target in self._gates:
            g = self._gates.index(target)
            state["verify_test"] = tests[g]
            return None, (answer if tests[g].decision == "passed" else StopReason.UNVERIFIED)
        if len(self._gates) >= len(GATE_SHARES):
            return None, StopReason.UNVERIFIED
        self._gates.append(target)
        vt = self._gate_test(len(self._gates) - 1)
        state["verify_test"] = vt
        if vt.decision == "passed":
            return None, answer
        if vt.decision in ("failed", "below", "abandoned"):
            return None, StopReason.UNVERIFIED
        if left < 2:
            return None, StopReason.BUDGET
        return tuple(self._pair_round(*target, "verify")), StopReason.RUNNING

    def _probe_step(self, state: dict, left: int):
        """3. Probabilistic bisection: the probe-able commit nearest the posterior median
        (with ``width`` slots, ``width`` commits at the posterior's quantiles), and every
        so often an anchor. (round, reason)."""
        if left <= 0:
            return None, StopReason.BUDGET
        n, p = len(self._commits), state["p"]
        step_mass = p.sum()
        cum = np.cumsum(p) / (step_mass if step_mass > 0 else 1.0)
        probe_able = np.array([i for i in range(1, n - 1) if i not in self._skipped], dtype=int)
        if probe_able.size == 0:
            return None, StopReason.AMBIGUOUS_SKIPS
        boots = min(self._probe_boots(state["stats"]), left)
        # width w (parallel slots): w commits at the posterior's quantiles j/(w+1), a
        # (w+1)-ary search; with w = 1 the commit nearest the median.
        width = max(1, min(self.options.width, left // max(boots, 1), probe_able.size))
        picked: list[int] = []
        for j in range(1, width + 1):
            free = np.array([k for k in probe_able if k not in picked], dtype=int)
            if free.size == 0:
                break
            gap = np.abs(cum[free] - j / (width + 1))
            tied = free[gap <= gap.min() + 1e-12]
            picked.append(int(tied[np.argmin(self._tie_rank[tied])]))
        i = picked[0] if width == 1 else picked[len(picked) // 2]
        rnd = [Probe(self._commits[k], boots, "probe") for k in sorted(picked)]
        anchor = self._anchor(cum, i) if left > boots * len(rnd) else None
        if anchor is not None and anchor not in picked:
            rnd.append(Probe(self._commits[anchor], 1, "anchor"))
            if np.random.default_rng([self.options.seed, 7, self._probe_rounds]).random() < 0.5:
                rnd.reverse()
        return tuple(rnd), StopReason.RUNNING

    def _anchor(self, cum: np.ndarray, probe: int) -> int | None:
        """Every ``anchor_every``-th probe round: the measured commit nearest the probe
        that is confidently good (even anchors) or confidently bad (odd ones)."""
        if self.options.anchor_every == 0 or (self._probe_rounds + 1) % self.options.anchor_every:
            return None
        n = len(self._commits)
        measured = [i for i in range(n) if self._values[i] and i != probe]
        # cum[i] = P(culprit <= i | a step): commit i is bad with that probability.
        good = [i for i in measured if i < probe and cum[i] <= 0.02]
        bad = [i for i in measured if i > probe and cum[i] >= 0.98]
        want_good = (self._anchors % 2) == 0
        pick = (max(good) if good else None) if want_good else (min(bad) if bad else None)
        if pick is None:
            pick = min(bad) if want_good and bad else (max(good) if good else None)
        return pick

    def _probe_boots(self, best_stats) -> int:
        mg, mb, sd = best_stats
        if not all(math.isfinite(x) for x in best_stats):
            return 1
        if sd <= 0.0:
            return 1
        return probe_boots(abs(mb - mg) / sd, self.options.max_probe_boots)

    def next_round(self) -> tuple[Probe, ...] | None:
        """The probes of the next round, to be booted in this order; None when done."""
        return self._decide()[0]

    def next_probe(self) -> Probe | None:
        """The main probe of the next round (not its anchor; see ``next_round``);
        None when done."""
        rnd = self.next_round()
        if not rnd:
            return None
        return next((p for p in rnd if p.purpose != "anchor"), rnd[0])

    def result(self) -> BisectResult:
        """Where the search stands now (``stopped`` is ``RUNNING`` while it goes on)."""
        rnd, reason, st = self._decide()
        p, blocks, best, mass = st["p"], st["blocks"], st["best"], st["mass"]
        mg, mb, sd = st["stats"]
        order = np.argsort(-p, kind="stable")
        candidates = tuple(Candidate(self._commits[k], float(p[k])) for k in order if p[k] >= 1e-4)
        members = st.get("set") or blocks[best]
        block = tuple(self._commits[k] for k in members)
        culprit = block[0] if reason is StopReason.CONFIDENT else None
        return BisectResult(
            culprit=culprit,
            leader_probability=st.get("set_mass", mass[best]),
            candidates=candidates,
            candidate_set=block,
            boots_used=self.boots_used,
            commits_measured=sum(1 for v in self._values if v),
            skipped=tuple((self._commits[i], r) for i, r in sorted(self._skipped.items())),
            stopped=reason,
            good_mean=mg,
            bad_mean=mb,
            noise_sd=sd,
            no_step_probability=float(st["p_none"]),
            endpoint_test=st["endpoint_test"],
            verify_test=st["verify_test"],
            tests=self._tests(),
        )

    def _tests(self) -> tuple[SearchTest, ...]:
        """The endpoint check (once it has a pair) and every head-to-head test started."""
        c = self._commits
        et = self._endpoint_test()
        out = [SearchTest(0, "endpoints", c[0], c[-1], et)] if et.pairs else []
        out += [SearchTest(g + 1, "verify", c[a], c[b], self._gate_test(g)) for g, (a, b) in enumerate(self._gates)]
        return tuple(out)


def probe_boots(step_sd: float, max_probe_boots: int) -> int:
    """Boots for one probe to call its side right ~90% of the time: a probe of b
    boots, thresholded midway, errs with probability Phi(-d sqrt(b) / 2) where
    d = |mu_b - mu_g| / s is the step over the boots' noise sd (``step_sd``)."""
    if step_sd <= 0.0:
        return max_probe_boots
    b = math.ceil((2.0 * stats.norm.ppf(0.9) / step_sd) ** 2)
    return int(min(max(b, 1), max_probe_boots))


def run_search(search: BisectionSearch,
               measure: Callable[[str, int], Sequence[float] | None]) -> BisectResult:
    """Drive ``search`` to its end. ``measure(commit, boots)`` returns one value per
    boot it managed (at least one), or None when the commit cannot be built or
    booted, which skips it. The probes of a round are measured in the order given,
    so the boots of a round are interleaved in time."""
    while (rnd := search.next_round()) is not None:
        search.observe_round(rnd, [measure(p.commit, p.boots) for p in rnd])
    return search.result()
