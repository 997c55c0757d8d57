"""How many boots a bisection stage needs, and how a release bisection shares
``--max-boots`` between its two stages.

A search of ``n`` revisions has ``c = n - 1`` candidate culprits. Its boots go to
three parts (:mod:`bisect_harness.decide.bisect.search`), each priced by the search's
own rules:

* **the endpoint check**: paired rounds (2 boots each) of the good and bad
  endpoints until the paired sequential test passes at ``1 - confidence``;
* **the probes**: one bit a probe round at most, so ``ceil(log2 c + log2(confidence
  / (1 - confidence)))`` rounds take the posterior from ``1/c`` on one commit to
  ``confidence`` (with ``w`` probes a round, a ``(w+1)``-ary search: the same bits
  over ``log2(w + 1)`` a round), each probe of :func:`~bisect_harness.decide.bisect.search.probe_boots`
  boots (what calls its side right 90% of the time), and an anchor boot every
  ``anchor_every``-th round;
* **the head-to-head test**: paired rounds of the culprit and its parent until the
  first test passes at ``verify_alpha * GATE_SHARES[0]``.

Two figures come out (:class:`StagePlan`): ``least``, the fewest boots with which
the stage can name a culprit at all (each test at its first look, ``initial_boots``
or 3 rounds; one boot a probe; ``log2 c`` rounds: every probe a full bit), and
``planned``, about what it takes when the step is ``step_sd`` boot-noise sds: a
paired test's rounds are the first look of its schedule at which the expected t
of such a step (``step_sd / sqrt 2`` a round's sd) clears that look's critical t
(even odds of passing there), the probes' boots the search's own rule at that
step. Before anything is measured the step is taken as :data:`NOMINAL_STEP_SD`
(a step of twice the boot-to-boot sd: a 5% regression on a host whose boots
spread by 2.5%); a stage that follows another uses the step and noise the first
one measured. Neither figure counts failed boots or the extra rounds of a busy
host: a stage given ``planned`` can still stop on its budget, one given less than
``least`` cannot finish.

The release stage's share (:func:`release_share`): the release stage may use
``--max-boots`` less what the commit stage plans to need (for the widest gap
between two neighbouring releases, where a descent is possible), but never less
than its own ``least``; what it leaves unspent passes on to the commit stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.decide.bisect.search import GATE_SHARES, probe_boots
from bisect_harness.decide.paired_sequential import look_schedule

__all__ = ["NOMINAL_STEP_SD", "StagePlan", "plan_stage", "release_share"]

#: the step over the boots' noise sd assumed before a stage has measured any
NOMINAL_STEP_SD = 2.0

#: the fewest paired rounds before a head-to-head test's first look
_VERIFY_MIN_PAIRS = 3


@dataclass(frozen=True)
class StagePlan:
    """What one search of ``revisions`` revisions needs, in boots: at ``least`` to be
    able to name a culprit, about ``planned`` at a step of ``step_sd`` noise sds."""

    revisions: int
    least: int
    planned: int
    step_sd: float

    @property
    def candidates(self) -> int:
        return max(self.revisions - 1, 0)

    def to_json(self) -> dict:
        return {"revisions": self.revisions, "candidates": self.candidates, "least_boots": self.least,
                "planned_boots": self.planned, "step_sd": round(self.step_sd, 3)}


def _rounds(step_sd: float, alpha: float, min_pairs: int, max_pairs: int) -> int:
    """Rounds at which a paired sequential test first passes when its rounds' mean
    is ``step_sd / sqrt 2`` of their sd: the first look whose expected t clears the
    look's critical t (``max_pairs`` when none does)."""
    looks = look_schedule(min_pairs, max_pairs)
    level = alpha / len(looks)
    d = step_sd / math.sqrt(2.0)
    for n in looks:
        if d * math.sqrt(n) >= stats.t.ppf(1.0 - level, n - 1):
            return n
    return max_pairs


def plan_stage(revisions: int, options: SearchOptions, step_sd: float | None = None) -> StagePlan:
    """The boots a search of ``revisions`` revisions (good and bad endpoints
    included) with ``options`` needs (see the module)."""
    if revisions < 2:
        raise ValueError(f"a bisection stage needs at least 2 revisions, got {revisions}")
    d = NOMINAL_STEP_SD if step_sd is None or not math.isfinite(step_sd) or step_sd <= 0 else float(step_sd)
    c = revisions - 1
    width = max(1, min(options.width, c - 1))
    bits_per_round = math.log2(width + 1)
    least_rounds = math.ceil(math.log2(c) / bits_per_round - 1e-9) if c > 1 else 0
    rounds = (math.ceil((math.log2(c) + math.log2(options.confidence / (1.0 - options.confidence)))
                        / bits_per_round - 1e-9) if c > 1 else 0)
    anchors = (lambda r: r // options.anchor_every if options.anchor_every else 0)
    endpoint_least = options.initial_boots
    endpoint = _rounds(d, 1.0 - options.confidence, options.initial_boots, options.max_endpoint_boots)
    verify = _rounds(d, options.verify_alpha * GATE_SHARES[0], _VERIFY_MIN_PAIRS, options.max_verify_pairs)
    verify_least = _VERIFY_MIN_PAIRS
    if c == 1:  # the endpoints are the culprit and its parent: the check's rounds are the test's too
        verify, verify_least = max(0, verify - endpoint), max(0, verify_least - endpoint_least)
    least = 2 * endpoint_least + least_rounds * width + anchors(least_rounds) + 2 * verify_least
    planned = (2 * endpoint + rounds * width * probe_boots(d, options.max_probe_boots) + anchors(rounds)
               + 2 * verify)
    return StagePlan(revisions=revisions, least=least, planned=max(planned, least), step_sd=d)


def release_share(max_boots: int, releases: StagePlan, commits: StagePlan | None) -> int:
    """The boots the release stage may use of ``max_boots``: what is left once the
    commit stage keeps its planned figure, never less than the release stage's
    ``least`` (nor more than ``max_boots``); all of it where no descent follows."""
    if commits is None:
        return max_boots
    return min(max_boots, max(releases.least, max_boots - commits.planned))
