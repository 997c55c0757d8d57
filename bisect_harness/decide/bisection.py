"""Find the commit that moved a metric, under noise: a stepwise Bayesian bisection
whose confident answers are checked head to head.

The model is a single step change, or none. Between a known-good commit
``commits[0]`` and a known-bad commit ``commits[-1]`` either exactly one commit, the
*culprit* at index ``k`` (``1 <= k <= n-1``), moved the metric (every commit before
it on the good side, it and every commit after it on the bad side), or no commit
did (``k = none``: the endpoints' difference was noise). A boot's value (one float
per boot; the boot is the unit of replication) at host time ``t`` is modelled as

    x = mu_side + beta * t + s_side * e               e ~ N(0, 1), probability 1 - eps
    x = mu_side + beta * t + o + s_slow * e           the slow mode, probability eps
                                                      (likelihood="slow-mode", the default)
    x = mu_side + beta * t + s * e,   e ~ Student-t(4)     (likelihood="student-t")
    x = mu_side + s * e,              e ~ N(0, 1)          (likelihood="gaussian")

Host time is the order in which boots were observed (every boot of every commit
advances it), so ``beta`` is a linear drift of the host, learnt from commits that
are measured again later (the anchors below). The *slow mode* is what real hosts
make: a boot that stalled 20% slow, a second mode of thread placement, a
neighbour's burst; it is shifted by ``o`` in the regression's own direction (at
least three noise sds), with its rate ``eps`` under a Beta(1, 19) prior, so one
slow boot is one unlikely draw of either side, not a reason to move the step.
Each side has its own noise sd ``s_side`` (shrunk towards the pooled one by three
pseudo-boots), since a regression often makes a config noisier as well as slower.

The posterior over ``k`` (and ``none``) uses the marginal likelihood of each split of
the observed boots into a good and a bad group. For ``gaussian`` without drift it is
exact (flat priors on the means, ``1/s^2`` on the scale, the step's sign restricted
to the expected direction):

    p(data | k)  ∝  (n_g n_b)^(-1/2) * SSE^(-(N-2)/2) * T_{N-2}(t_k)

Otherwise each split is fitted by EM (for ``student-t``, iteratively reweighted
least squares; Lange, Little & Taylor, JASA 1989), all splits at once, and the
marginal is its Laplace approximation. Comparing "a step at k" with "no step"
needs a proper prior on the step: half-Cauchy on the expected side with scale
``step_scale`` times the metric's level (10%; heavy-tailed, so a 40% regression is
not held against the step model); both models share flat priors on
the level and the drift, which cancel (the second noise sd costs the step model
``log(N) / 2``, as in BIC). The prior puts ``no_step_prior`` on ``none`` and
spreads the rest evenly over the commits.

The search runs in *rounds*: the caller boots a round's probes in the order given
(interleaved), then hands the values back with ``observe_round``:

1. **The endpoint check, on fresh boots.** Rounds of one boot of the good and one of
   the bad endpoint, in a random order per round, until a one-sided sequential
   paired test on the per-round differences (``paired_sequential_test``) shows the
   expected change. The order is random, so under "no change" each difference is
   symmetric about zero whatever the host does (drift, bursts, two-mode boots);
   each of the test's looks gets ``(1 - confidence) / looks`` (Bonferroni), so the
   repeated looks keep its error rate. Boots observed outside these rounds (reused from a ledger, or
   the hypothesis that selected the regression) feed the posterior but never this
   check: the evidence that opens a bisection is not the evidence that chose it.
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
    result.culprit, result.probability, result.candidate_set
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import special, stats

from bisect_harness.defaults import DEFAULT_CONFIDENCE, DEFAULT_MAX_BOOTS, DEFAULT_VERIFY_ALPHA
from bisect_harness.model import Expect, Outcome

from bisect_harness.decide.kernel import decide

__all__ = [
    "BisectResult",
    "SearchTest",
    "BisectionSearch",
    "Candidate",
    "PairedTest",
    "Probe",
    "StopReason",
    "look_schedule",
    "paired_sequential_test",
    "run_search",
]

#: degrees of freedom of the Student-t boot noise
NU = 4.0
LIKELIHOODS = ("slow-mode", "student-t", "gaussian")
#: the slow mode's rate has a Beta(1, EPS_PRIOR_B) prior (mean 5%)
EPS_PRIOR_B = 19.0
#: pseudo-boots of the pooled variance that each side's own variance is shrunk with
UNEQUAL_SHRINK = 3.0
#: shares of ``verify_alpha`` for the first, second and third head-to-head test of a search
GATE_SHARES = (0.8, 0.1, 0.1)


class StopReason(str, enum.Enum):
    """Why a search stopped (or that it has not)."""

    RUNNING = "running"
    #: one commit holds ``confidence`` of the posterior mass and its change against
    #: its parent was shown head to head
    CONFIDENT = "confident"
    #: a run of unmeasurable commits and the commit after it hold ``confidence``
    #: of the mass together; ``candidate_set`` lists them
    AMBIGUOUS_SKIPS = "ambiguous-skips"
    #: ``max_boots`` boots were spent before either of the above
    BUDGET = "budget"
    #: the endpoints, in fresh paired rounds, do not show the expected change, or
    #: the posterior holds ``confidence`` on "no step": nothing to bisect
    NOT_REPRODUCED = "not-reproduced"
    #: an endpoint could not be measured at all (skipped with no boots)
    ENDPOINT_UNMEASURABLE = "endpoint-unmeasurable"
    #: one commit (or set) holds ``confidence`` of the mass but the head-to-head test
    #: against its parent did not show the change, could not be booted, or the
    #: search's tests were spent on other commits; it is not reported as the culprit
    UNVERIFIED = "unverified"
    #: a round could boot nothing and the search could not move on (the runner's
    #: guard against asking for the same round for ever)
    STALLED = "stalled"
    #: the search would have stopped ``not-reproduced`` while most of its boots were
    #: marked ``host_busy``: the host could not tell, which is no finding that there
    #: is no step (the runner's judgement of its boots)
    UNDETERMINED = "undetermined"

    @property
    def meaning(self) -> str:
        """The stop reason in words, for the journal and the CLI."""
        return _STOP_MEANING[self]


_STOP_MEANING = {
    StopReason.RUNNING: "the search has not finished",
    StopReason.CONFIDENT: "one commit holds the posterior mass and its change against its parent was shown "
                          "head to head",
    StopReason.AMBIGUOUS_SKIPS: "a set of commits holds the posterior mass (unmeasurable commits and the "
                                "commit after them cannot be told apart); the set's change against the parent "
                                "of its first member was shown head to head",
    StopReason.BUDGET: "the boot budget was spent before an answer",
    StopReason.NOT_REPRODUCED: "the endpoints, in fresh paired rounds, did not show the expected change",
    StopReason.ENDPOINT_UNMEASURABLE: "an endpoint could not be measured after its retries",
    StopReason.UNVERIFIED: "the most probable commit (or set) was not shown to differ from its parent head to "
                           "head: not reported as the culprit",
    StopReason.STALLED: "a round could boot nothing and the search could not move on",
    StopReason.UNDETERMINED: "most of the search's boots were marked busy: the host could not tell whether "
                             "there is a step, which is no finding that there is none",
}


@dataclass(frozen=True)
class Probe:
    """Measure ``commit`` for ``boots`` more boots. ``purpose``: ``probe`` (a bisection
    step), ``anchor`` (a measured commit re-measured in the same round),
    ``endpoints`` or ``verify`` (one boot of a paired, randomly ordered round)."""

    commit: str
    boots: int
    purpose: str = "probe"
    #: the paired test this boot is a side of: 0 the endpoint check, g >= 1 the g-th
    #: head-to-head test; None for a probe or an anchor
    test: int | None = None


@dataclass(frozen=True)
class Candidate:
    """A commit and its posterior probability of being the culprit."""

    commit: str
    probability: float


@dataclass(frozen=True)
class PairedTest:
    """A one-sided sequential paired test of ``bad - good`` in the expected direction.

    ``decision``: ``passed`` (the change is shown), ``failed`` (the last look did
    not pass, or the mean went the wrong way after ``2 min_pairs + 2`` pairs: stopped
    for futility, which only lowers the error rate), ``abandoned`` (one of its two
    commits became unmeasurable before it decided) or ``open``."""

    pairs: int
    mean: float
    p_value: float
    alpha_per_look: float
    decision: str


@dataclass(frozen=True)
class SearchTest:
    """One paired test a search ran: ``number`` 0 is the endpoint check (``good`` the
    known-good, ``bad`` the known-bad commit), 1, 2, ... the head-to-head tests
    (``good`` the parent, ``bad`` the candidate), passed or not."""

    number: int
    kind: str  # "endpoints" | "verify"
    good: str
    bad: str
    test: PairedTest


@dataclass(frozen=True)
class BisectResult:
    """Where a search stands.

    ``culprit`` is set only when ``stopped`` is ``CONFIDENT``. ``candidate_set`` is
    the most probable block: one commit, or a run of unmeasurable commits and the
    commit after it, which no measurement can separate; ``probability`` is its
    posterior mass. ``candidates`` lists every commit with posterior probability at
    least 1e-4, most probable first. ``no_step_probability`` is the posterior mass of
    "no commit moved the metric". ``good_mean``, ``bad_mean`` and ``noise_sd`` are
    estimates of the two sides' levels (at host time 0) and of the boot-to-boot
    standard deviation under the most probable split (NaN before both endpoints
    have boots). ``endpoint_test`` and ``verify_test`` are the paired tests (None
    before they started).
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
    no_step_probability: float = 0.0
    endpoint_test: PairedTest | None = None
    verify_test: PairedTest | None = None
    tests: tuple[SearchTest, ...] = ()  # every paired test, in the order started (the endpoint check first)


def look_schedule(min_pairs: int, max_pairs: int) -> tuple[int, ...]:
    """The pair counts at which a paired test looks: from ``min_pairs`` growing by
    half each time (3, 5, 8, 12, ...), and ``max_pairs``. Few looks keep each look's
    share of alpha large."""
    looks, n = [], min_pairs
    while n < max_pairs:
        looks.append(n)
        n = max(n + 1, int(math.ceil(n * 1.5)))
    return tuple(looks + [max_pairs])


def paired_sequential_test(diffs: Sequence[float], *, alpha: float, min_pairs: int,
                           max_pairs: int) -> PairedTest:
    """Sequential one-sided paired test on ``diffs`` (positive: the expected change).

    It looks at the pair counts of ``look_schedule``; each look has level
    ``alpha / looks`` (Bonferroni over the looks), so the chance of any false pass
    is at most ``alpha`` whatever the stopping. The statistic is Yuen's trimmed t
    (20% trimmed mean over its winsorised standard error; Yuen, Biometrika 1974;
    the plain t below 8 pairs), so that one stalled boot does not swamp a look; a
    look passes when the decision kernel (:func:`stats.decide`, a change above
    zero) confirms. With the order inside each pair drawn at random, a difference
    is symmetric about zero when nothing changed, whatever the host did.
    """
    d = np.asarray(diffs, dtype=float)
    looks = look_schedule(min_pairs, max_pairs)
    a = alpha / len(looks)
    p_last = 1.0
    for n in looks:
        if n > d.size:
            break
        passed, p_last = _look(d[:n], a)
        if passed:
            return PairedTest(n, float(d[:n].mean()), p_last, a, "passed")
    n = d.size
    mean = float(d.mean()) if n else math.nan
    if n >= max_pairs or (n >= 2 * min_pairs + 2 and mean <= 0.0):
        return PairedTest(n, mean, p_last, a, "failed")
    return PairedTest(n, mean, p_last, a, "open")


def _look(d: np.ndarray, level: float) -> tuple[bool, float]:
    """One look of the paired test: (passed, one-sided p) of Yuen's trimmed t (20%)
    for mean > 0, the plain t below 8 values, decided by the kernel."""
    n = d.size
    g = int(math.floor(0.2 * n)) if n >= 8 else 0
    x = np.sort(d)
    tm = float(x[g:n - g].mean())
    w = np.clip(x, x[g], x[n - 1 - g])
    h = n - 2 * g
    sw = float(np.sqrt(((w - w.mean()) ** 2).sum() / (n - 1))) if n > 1 else 0.0
    se = sw / ((h / n) * math.sqrt(n)) if h >= 2 else 0.0
    if h < 2 or se == 0.0 or not math.isfinite(se):
        p = 0.0 if tm > 0 else 1.0  # no spread to judge by: the sign alone
        return p <= level, p
    dec = decide(tm, se, h - 1, expect=Expect.INCREASE, min_effect=0.0, level=level)
    return dec.outcome is Outcome.CONFIRMED, dec.p_value


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

    The endpoint check takes ``initial_boots`` to ``max_endpoint_boots`` paired
    rounds. ``max_probe_boots`` caps the boots of one probe. ``verify`` turns the
    head-to-head test on (``verify_alpha``, default :data:`DEFAULT_VERIFY_ALPHA`, shared by
    every head-to-head test of the search, up to
    ``max_verify_pairs`` rounds). ``anchor_every``: an anchor every so many probe
    rounds (0: none). ``seed`` fixes the order inside paired rounds and breaks
    exact ties between probes, the same way on every run.
    """

    def __init__(self, commits: Sequence[str], *, expect: Expect, confidence: float = DEFAULT_CONFIDENCE,
                 max_boots: int = 200, seed: int = 0, initial_boots: int = 3,
                 max_endpoint_boots: int = 24, max_probe_boots: int = 8,
                 likelihood: str = "slow-mode", drift: bool | None = None,
                 no_step_prior: float = 0.2, step_scale: float = 0.1, verify: bool = True,
                 verify_alpha: float | None = None, max_verify_pairs: int = 24,
                 anchor_every: int = 2, unequal_variances: bool = True, width: int = 1):
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
        for name, value, low in (("max_boots", max_boots, 2), ("initial_boots", initial_boots, 2),
                                 ("max_endpoint_boots", max_endpoint_boots, 2),
                                 ("max_probe_boots", max_probe_boots, 1),
                                 ("max_verify_pairs", max_verify_pairs, 3),
                                 ("anchor_every", anchor_every, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if max_endpoint_boots < initial_boots:
            raise ValueError(f"max_endpoint_boots ({max_endpoint_boots}) must be >= "
                             f"initial_boots ({initial_boots})")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {', '.join(LIKELIHOODS)}, got {likelihood!r}")
        if not (0.0 <= no_step_prior < 1.0):
            raise ValueError(f"no_step_prior must lie in [0, 1), got {no_step_prior!r}")
        if not step_scale > 0.0:
            raise ValueError(f"step_scale must be > 0, got {step_scale!r}")
        verify_alpha = DEFAULT_VERIFY_ALPHA if verify_alpha is None else verify_alpha
        if not (0.0 < verify_alpha < 1.0):
            raise ValueError(f"verify_alpha must lie strictly between 0 and 1, got {verify_alpha!r}")
        self._commits = commits
        self._index = index
        self._expect = expect
        self._confidence = float(confidence)
        self._max_boots = max_boots
        self._initial_boots = initial_boots
        self._max_endpoint_boots = max_endpoint_boots
        self._max_probe_boots = max_probe_boots
        self._likelihood = likelihood
        self._drift = (likelihood != "gaussian") if drift is None else bool(drift)
        self._no_step_prior = float(no_step_prior)
        self._step_scale = float(step_scale)
        self._verify = bool(verify)
        self._verify_alpha = float(verify_alpha)
        self._max_verify_pairs = max_verify_pairs
        self._anchor_every = anchor_every
        if not (isinstance(width, int) and width >= 1):
            raise ValueError(f"width must be a whole number of probes per round, at least 1, got {width!r}")
        self._width = width
        self._unequal = bool(unequal_variances)
        self._seed = seed
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
        self._tie_rank = np.random.default_rng(seed).permutation(len(commits))
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

    def _fit(self):
        """Log marginal likelihood of each split of the observed commits, and of "no step".

        Returns ``(obs, loglik, split_stats, log_none)``: ``obs`` the observed commit
        indices in order; ``loglik[j]`` for "the first ``j`` observed commits are good"
        (entries 0 and ``len(obs)`` are -inf); ``split_stats`` (mean_g, mean_b, sd) per
        split in the data's units; ``log_none`` the marginal of "no step" on the same
        footing (-inf when ``no_step_prior`` is 0 or the fit is the exact Gaussian one).
        None when the endpoints lack boots or fewer than 4 boots exist.
        """
        n = len(self._commits)
        if not self._values[0] or not self._values[n - 1] or len(self._obs_x) < 4:
            return None
        obs = np.array([i for i in range(n) if self._values[i]], dtype=int)
        if self._likelihood == "gaussian" and not self._drift:
            return self._fit_gaussian(obs)
        if self._likelihood == "slow-mode":
            return self._fit_slow_mode(obs)
        return self._fit_robust(obs)

    def _fit_gaussian(self, obs):
        """The exact marginal under Gaussian noise, flat means, 1/s^2 on the scale."""
        allv = np.asarray(self._obs_x)
        total = allv.size
        center = float(allv.mean())
        scale = float(allv.std()) or (abs(center) if center != 0.0 else 1.0)
        cnt = np.array([len(self._values[i]) for i in obs], dtype=float)
        z = [(np.asarray(self._values[i]) - center) / scale for i in obs]
        s1 = np.array([v.sum() for v in z])
        s2 = np.array([(v * v).sum() for v in z])
        cn = np.concatenate([[0.0], np.cumsum(cnt)])
        c1 = np.concatenate([[0.0], np.cumsum(s1)])
        c2 = np.concatenate([[0.0], np.cumsum(s2)])
        m = obs.size
        j = np.arange(1, m)
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
        return obs, loglik, split_stats, -np.inf

    def _splits(self, obs):
        """The boots robustly standardised (median, MAD), host time standardised, and the
        split matrix: row j-1 marks the boots on the good side of split j (rank < j) for
        j = 1..m-1; the last row puts every boot in one group (no step)."""
        y_raw = np.asarray(self._obs_x)
        N = y_raw.size
        center = float(np.median(y_raw))
        scale = float(np.median(np.abs(y_raw - center))) * 1.4826 or float(y_raw.std()) \
            or (abs(center) if center != 0.0 else 1.0)
        y = (y_raw - center) / scale
        tt = np.arange(N, dtype=float)
        tt = (tt - tt.mean()) / (tt.std() or 1.0)
        m = obs.size
        rank = np.searchsorted(obs, np.asarray(self._obs_i))  # each boot's commit among the observed
        G = rank[None, :] < np.arange(1, m)[:, None]
        G = np.vstack([G, np.ones((1, N), dtype=bool)])
        return N, m, center, scale, y, tt, G

    def _fit_robust(self, obs):
        """Student-t (or Gaussian) errors with an optional linear drift: IRLS per split,
        all splits at once, then a Laplace approximation of each marginal."""
        N, m, center, scale, y, tt, G = self._splits(obs)
        S = G.shape[0]
        Bm = ~G
        nu = NU if self._likelihood == "student-t" else math.inf
        w = np.ones((S, N))
        s2 = np.full(S, float(np.var(y)) or 1.0)
        beta = np.zeros(S)
        for _ in range(30 if math.isfinite(nu) else 1):
            wg, wb = (w * G).sum(1), (w * Bm).sum(1)
            wb_safe = np.where(wb > 0, wb, 1.0)
            yg, yb = (w * G * y).sum(1) / wg, (w * Bm * y).sum(1) / wb_safe
            tg, tb = (w * G * tt).sum(1) / wg, (w * Bm * tt).sum(1) / wb_safe
            ymean = np.where(G, yg[:, None], yb[:, None])
            tmean = np.where(G, tg[:, None], tb[:, None])
            yc, tc = y[None, :] - ymean, tt[None, :] - tmean
            stt = (w * tc * tc).sum(1)
            if self._drift:
                beta = np.where(stt > 1e-9, (w * tc * yc).sum(1) / np.maximum(stt, 1e-9), 0.0)
            r = yc - beta[:, None] * tc
            s2_new = np.maximum((w * r * r).sum(1) / N, 1e-12)
            if math.isfinite(nu):
                w_new = (nu + 1.0) / (nu + r * r / s2_new[:, None])
            else:
                w_new = w
            converged = np.allclose(w_new, w, atol=1e-6) and np.allclose(s2_new, s2, rtol=1e-8)
            w, s2 = w_new, s2_new
            if converged:
                break
        s = np.sqrt(s2)
        if math.isfinite(nu):
            ll = (stats.t.logpdf(r / s[:, None], nu) - np.log(s)[:, None]).sum(1)
        else:
            ll = -0.5 * N * np.log(2 * math.pi * s2) - 0.5 * N
        wg, wb = (w * G).sum(1), (w * Bm).sum(1)
        log_det = np.log(wg) + np.log(np.maximum(wb, 1e-12)) - 2 * np.log(s2)
        if self._drift:
            log_det += np.log(np.maximum(stt, 1e-9)) - np.log(s2)
        # The step's size and its standard error (levels at host time 0).
        mg = yg - beta * tg
        mb = yb - beta * tb
        delta = mb - mg
        var_d = s2 * (1.0 / wg + 1.0 / np.maximum(wb, 1e-12)
                      + ((tb - tg) ** 2 / np.maximum(stt, 1e-9) if self._drift else 0.0))
        se = np.sqrt(var_d)
        tau = self._step_scale * (abs(center) if center != 0.0 else scale) / scale
        sign = self._expect.sign
        log_step = (ll[:-1] - 0.5 * log_det[:-1] + 0.5 * math.log(2 * math.pi)
                    + math.log(2.0) + stats.cauchy.logpdf(delta[:-1], 0.0, tau)
                    + stats.norm.logcdf(sign * delta[:-1] / se[:-1]))
        # No step: one level (and the drift); its determinant has one mean, not two.
        log_det0 = np.log(wg[-1]) - np.log(s2[-1]) + (np.log(max(stt[-1], 1e-9)) - np.log(s2[-1])
                                                      if self._drift else 0.0)
        log_none = float(ll[-1] - 0.5 * log_det0)
        loglik = np.full(m + 1, -np.inf)
        loglik[1:m] = log_step
        sd_boot = s[:-1] * (math.sqrt(nu / (nu - 2.0)) if math.isfinite(nu) else 1.0)
        split_stats = np.full((m + 1, 3), np.nan)
        split_stats[1:m] = np.column_stack([center + mg[:-1] * scale, center + mb[:-1] * scale,
                                            sd_boot * scale])
        return obs, loglik, split_stats, log_none

    def _fit_slow_mode(self, obs):
        """A boot is, with probability eps, in a *slow mode* shifted by o in the
        regression's direction (a stalled boot, a second mode, a neighbour's burst),
        else normal around its side's level; plus the drift. EM per split, all splits
        at once, then a Laplace approximation of each marginal."""
        N, m, center, scale, y, tt, G = self._splits(obs)
        S = G.shape[0]
        Bm = ~G
        sign = float(self._expect.sign)
        drift = self._drift
        r = np.zeros((S, N))
        s2 = np.full(S, 0.25)
        s2g, s2b = s2.copy(), s2.copy()
        S2 = np.full((S, N), 0.25)
        s2k = np.full(S, 1.0)
        o = np.full(S, 4.0 * sign * 0.5)
        eps = np.full(S, 0.05)
        beta = np.zeros(S)
        for it in range(40):
            # M-step for the levels and the drift: weighted least squares on y minus the
            # slow offset, with weights from both components.
            om = (1.0 - r) / S2 + r / s2k[:, None]
            z = y[None, :] - (r / s2k[:, None]) * o[:, None] / om
            wg, wb = (om * G).sum(1), (om * Bm).sum(1)
            wb_safe = np.where(wb > 0, wb, 1.0)
            zg, zb = (om * G * z).sum(1) / wg, (om * Bm * z).sum(1) / wb_safe
            tg, tb = (om * G * tt).sum(1) / wg, (om * Bm * tt).sum(1) / wb_safe
            zc = z - np.where(G, zg[:, None], zb[:, None])
            tc = tt[None, :] - np.where(G, tg[:, None], tb[:, None])
            stt = (om * tc * tc).sum(1)
            if drift:
                beta = np.where(stt > 1e-9, (om * tc * zc).sum(1) / np.maximum(stt, 1e-9), 0.0)
            level = np.where(G, (zg - beta * tg)[:, None], (zb - beta * tb)[:, None])
            e = y[None, :] - level - beta[:, None] * tt[None, :]
            # E-step: responsibility of the slow mode.
            l1 = np.log1p(-eps)[:, None] + stats.norm.logpdf(e, 0.0, np.sqrt(S2))
            l2 = np.log(eps)[:, None] + stats.norm.logpdf(e, o[:, None], np.sqrt(s2k)[:, None])
            lse = np.logaddexp(l1, l2)
            r_new = np.exp(l2 - lse)
            # M-step for the noise: main and slow variances, the slow shift and rate.
            w1 = 1.0 - r_new
            s2 = np.maximum((w1 * e * e).sum(1) / np.maximum(w1.sum(1), 1e-9), 1e-6)
            if self._unequal:
                # Each side its own variance, shrunk towards the pooled one by
                # UNEQUAL_SHRINK pseudo-boots so that a side with two boots stays sane.
                k0 = UNEQUAL_SHRINK
                s2g = ((w1 * G * e * e).sum(1) + k0 * s2) / ((w1 * G).sum(1) + k0)
                s2b = ((w1 * Bm * e * e).sum(1) + k0 * s2) / ((w1 * Bm).sum(1) + k0)
                S2 = np.maximum(np.where(G, s2g[:, None], s2b[:, None]), 1e-6)
            else:
                S2 = np.broadcast_to(s2[:, None], (S, N))
            rs = r_new.sum(1)
            o_hat = np.where(rs > 1e-6, (r_new * e).sum(1) / np.maximum(rs, 1e-9), o)
            # The slow mode lies clearly on the slow side: at least 3 main sds away.
            o = sign * np.maximum(sign * o_hat, 3.0 * np.sqrt(s2))
            s2k = np.maximum((r_new * (e - o[:, None]) ** 2).sum(1) / np.maximum(rs, 1e-9), s2)
            s2k = np.where(rs > 1e-6, s2k, np.maximum(s2k, s2))
            # MAP under a Beta(1, EPS_PRIOR_B) prior: with few boots, calling many of
            # them "slow" is not free.
            eps = np.clip(rs / (N + EPS_PRIOR_B - 1.0), 0.005, 0.35)
            done = np.max(np.abs(r_new - r)) < 1e-5
            r = r_new
            if done and it > 2:
                break
        ll = lse.sum(1) + (EPS_PRIOR_B - 1.0) * np.log1p(-eps)
        om = (1.0 - r) / S2 + r / s2k[:, None]
        wg, wb = (om * G).sum(1), (om * Bm).sum(1)
        log_det = np.log(wg) + np.log(np.maximum(wb, 1e-12))
        if drift:
            log_det += np.log(np.maximum(stt, 1e-9))
        mg = zg - beta * tg
        mb = zb - beta * tb
        delta = mb - mg
        var_d = 1.0 / wg + 1.0 / np.maximum(wb, 1e-12) + (
            (tb - tg) ** 2 / np.maximum(stt, 1e-9) if drift else 0.0)
        se = np.sqrt(var_d)
        tau = self._step_scale * (abs(center) if center != 0.0 else scale) / scale
        log_step = (ll[:-1] - 0.5 * log_det[:-1] + 0.5 * math.log(2 * math.pi)
                    + math.log(2.0) + stats.cauchy.logpdf(delta[:-1], 0.0, tau)
                    + stats.norm.logcdf(sign * delta[:-1] / se[:-1]))
        if self._unequal:
            log_step = log_step - 0.5 * math.log(N)  # the second variance, against "no step" (BIC)
        log_det0 = math.log(wg[-1]) + (math.log(max(stt[-1], 1e-9)) if drift else 0.0)
        log_none = float(ll[-1] - 0.5 * log_det0)
        loglik = np.full(m + 1, -np.inf)
        loglik[1:m] = log_step
        split_stats = np.full((m + 1, 3), np.nan)
        split_stats[1:m] = np.column_stack([center + mg[:-1] * scale, center + mb[:-1] * scale,
                                            np.sqrt(s2[:-1]) * scale])
        return obs, loglik, split_stats, log_none

    def _posterior(self):
        """Posterior over the culprit index (entry 0 is always 0), P(no step), split stats."""
        n = len(self._commits)
        fit = self._fit()
        if fit is None:
            p = np.full(n, (1.0 - self._no_step_prior) / (n - 1))
            p[0] = 0.0
            return p, self._no_step_prior, None, None
        obs, loglik, split_stats, log_none = fit
        k = np.arange(n)
        j_of_k = np.searchsorted(obs, k, side="left")  # observed commits strictly before k
        logp = loglik[j_of_k]
        logp[0] = -np.inf
        if self._no_step_prior > 0.0 and math.isfinite(log_none):
            logp = logp + math.log((1.0 - self._no_step_prior) / (n - 1))
            l0 = log_none + math.log(self._no_step_prior)
        else:
            l0 = -np.inf
        z = special.logsumexp(np.append(logp, l0))
        p = np.exp(logp - z)
        p[0] = 0.0
        return p, float(np.exp(l0 - z)), j_of_k, split_stats

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
                                      min_pairs=min_pairs, max_pairs=max_pairs)

    def _gate_test(self, g: int) -> PairedTest:
        parent, k = self._gates[g]
        t = self._paired(parent, k, self._verify_alpha * GATE_SHARES[g], 3, self._max_verify_pairs)
        if t.decision == "open" and (parent in self._skipped or k in self._skipped):
            return PairedTest(t.pairs, t.mean, t.p_value, t.alpha_per_look, "abandoned")
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
        return self._paired(0, len(self._commits) - 1, 1.0 - self._confidence,
                            self._initial_boots, self._max_endpoint_boots)

    def _pair_round(self, good: int, bad: int, purpose: str) -> tuple[Probe, ...]:
        """One boot each of ``good`` and ``bad``, in an order drawn from the seed and the
        number of paired rounds so far (so a replayed search draws the same)."""
        first_good = bool(np.random.default_rng([self._seed, self._pair_rounds]).random() < 0.5)
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

        def done(reason):
            return None, reason, state

        def go(rnd):
            return tuple(rnd), StopReason.RUNNING, state

        left = self._max_boots - self.boots_used
        ends = (0, n - 1)
        for e in ends:
            if e in self._skipped and not self._values[e]:
                return done(StopReason.ENDPOINT_UNMEASURABLE)
        tests = [self._gate_test(g) for g in range(len(self._gates))]
        state["verify_test"] = tests[-1] if tests else None
        et = self._endpoint_test()
        state["endpoint_test"] = et
        if any(e in self._skipped for e in ends) and et.decision != "passed":
            return done(StopReason.ENDPOINT_UNMEASURABLE)
        # 1. Is there anything to bisect? Fresh paired rounds of the two endpoints.
        if et.decision == "failed":
            return done(StopReason.NOT_REPRODUCED)
        if et.decision == "open":
            if left < 2:
                return done(StopReason.BUDGET)
            return go(self._pair_round(0, n - 1, "endpoints"))
        if p_none >= self._confidence:
            return done(StopReason.NOT_REPRODUCED)
        # 2. Confident in one commit (checked against its parent), or in a block?
        #    A head-to-head test, once started, runs to its decision (its boots feed
        #    the posterior too). At most len(GATE_SHARES) of them per search, the g-th
        #    at level verify_alpha * GATE_SHARES[g]: a wrong commit is reported at
        #    most verify_alpha of the time in all.
        if tests and tests[-1].decision == "open":
            parent, k = self._gates[-1]
            if left < 2:
                return done(StopReason.BUDGET)
            return go(self._pair_round(parent, k, "verify"))
        if mass[best] >= self._confidence:
            block = blocks[best]
            if not self._verify:
                return done(StopReason.CONFIDENT if len(block) == 1 else StopReason.AMBIGUOUS_SKIPS)
            target = self._gate_target(block)
            if target is None:
                return done(StopReason.UNVERIFIED)
            state["set"] = list(range(target[0] + 1, target[1] + 1))
            state["set_mass"] = float(p[state["set"]].sum())
            answer = StopReason.CONFIDENT if len(state["set"]) == 1 else StopReason.AMBIGUOUS_SKIPS
            if target in self._gates:
                g = self._gates.index(target)
                state["verify_test"] = tests[g]
                return done(answer if tests[g].decision == "passed" else StopReason.UNVERIFIED)
            if len(self._gates) >= len(GATE_SHARES):
                return done(StopReason.UNVERIFIED)
            self._gates.append(target)
            vt = self._gate_test(len(self._gates) - 1)
            state["verify_test"] = vt
            if vt.decision == "passed":
                return done(answer)
            if vt.decision in ("failed", "abandoned"):
                return done(StopReason.UNVERIFIED)
            if left < 2:
                return done(StopReason.BUDGET)
            return go(self._pair_round(*target, "verify"))
        if left <= 0:
            return done(StopReason.BUDGET)
        # 3. Probabilistic bisection: the probe-able commit nearest the posterior median.
        step_mass = p.sum()
        cum = np.cumsum(p) / (step_mass if step_mass > 0 else 1.0)
        probe_able = np.array([i for i in range(1, n - 1) if i not in self._skipped], dtype=int)
        if probe_able.size == 0:
            return done(StopReason.AMBIGUOUS_SKIPS)
        boots = min(self._probe_boots(best_stats), left)
        # width w (parallel slots): w commits at the posterior's quantiles j/(w+1), a
        # (w+1)-ary search; with w = 1 the commit nearest the median.
        width = max(1, min(self._width, left // max(boots, 1), probe_able.size))
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
            if np.random.default_rng([self._seed, 7, self._probe_rounds]).random() < 0.5:
                rnd.reverse()
        return go(rnd)

    def _anchor(self, cum: np.ndarray, probe: int) -> int | None:
        """Every ``anchor_every``-th probe round: the measured commit nearest the probe
        that is confidently good (even anchors) or confidently bad (odd ones)."""
        if self._anchor_every == 0 or (self._probe_rounds + 1) % self._anchor_every:
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
            probability=st.get("set_mass", mass[best]),
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


def run_search(search: BisectionSearch,
               measure: Callable[[str, int], Sequence[float] | None]) -> BisectResult:
    """Drive ``search`` to its end. ``measure(commit, boots)`` returns one value per
    boot it managed (at least one), or None when the commit cannot be built or
    booted, which skips it. The probes of a round are measured in the order given,
    so the boots of a round are interleaved in time."""
    while (rnd := search.next_round()) is not None:
        search.observe_round(rnd, [measure(p.commit, p.boots) for p in rnd])
    return search.result()
