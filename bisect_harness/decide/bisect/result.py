"""What a bisection search hands back: the probes of a round (:class:`Probe`), where
it stands (:class:`BisectResult`, with its :class:`Candidate` commits and every
paired test it ran, :class:`SearchTest`) and why it stopped (:class:`StopReason`).
Frozen values; :class:`~bisect_harness.decide.bisect.search.BisectionSearch` makes them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bisect_harness.decide.paired_sequential import PairedTest

__all__ = ["BisectResult", "Candidate", "Probe", "SearchTest", "StopReason"]


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
    #: the endpoints, in paired rounds, do not show the expected change (or show it
    #: smaller than ``min_effect``), or the posterior holds ``confidence`` on "no step":
    #: nothing to bisect
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
    StopReason.NOT_REPRODUCED: "the endpoints, in paired rounds, did not show the expected change, or "
                               "showed it smaller than the least change that counts",
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
    commit after it, which no measurement can separate; ``leader_probability`` is its
    posterior mass, and :attr:`leader` its first commit, whether or not it is named. ``candidates`` lists every commit with posterior probability at
    least 1e-4, most probable first. ``no_step_probability`` is the posterior mass of
    "no commit moved the metric". ``good_mean``, ``bad_mean`` and ``noise_sd`` are
    estimates of the two sides' levels (at host time 0) and of the boot-to-boot
    standard deviation under the most probable split (NaN before both endpoints
    have boots). ``endpoint_test`` and ``verify_test`` are the paired tests (None
    before they started).
    """

    culprit: str | None
    leader_probability: float
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

    @property
    def leader(self) -> str | None:
        """The search's most probable commit: the first of ``candidate_set`` (the culprit
        once it is named; None only for a search with no block)."""
        return self.candidate_set[0] if self.candidate_set else None
