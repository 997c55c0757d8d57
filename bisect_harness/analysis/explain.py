"""Which of the differences between two configs make the slow one slow: a noisy delta debugging.

Pure search over a seam. Two configs differ in a list of *differences* (each env
variable, each flag, the commit range as one more). A configuration of the
search is a subset ``S`` of them: the fast config with the differences of ``S``
set to their slow values. ``measure(S)`` boots that configuration once and
returns the boot's samples of the metric; every decision below is made by the
harness's verdict rule (:func:`stats.evaluate`, sequential, paired rounds), so a
test stops at its first look when the answer is clear and spends its budget only
where the answer is close.

The search (adaptive group testing, the leave-out form of ddmin):

1. **Slowdown.** slow (all differences) against fast (none), expect the slow one
   worse by ``min_effect``. Not confirmed: nothing to explain, stop.
2. **Leave-out splitting.** A group ``G`` *matters* when reverting it from the slow
   config (config ``D \\ G``) makes it better by ``min_effect``. Testing by leaving
   out, not by adding alone, is what finds interactions: reverting either member
   of a pair that is slow only together removes the pair's effect. A group that
   matters is split in two and each half tested; a group refuted is cleared with
   every member; a singleton that matters is a member of the explanation. The
   same boots test the opposite direction (reverting ``G`` makes it *worse*):
   such singletons are reported as differences with the opposite sign.
3. **Sufficiency.** The members together (config ``C``) against fast: the
   minimal set's effect size, and against slow (does ``C`` account for all of it).
4. **Alone.** Each member alone against fast. A member whose effect alone is
   refuted, yet matters when left out, acts only with another member; pairs of
   such members are tested together and reported as interactions.

Each member's confidence is its leave-out test's: outcome, ratio, interval and
p-value at the look that decided it. A group left inconclusive at the budget is
neither split nor cleared: its members are reported as undecided, never as
members (the search claims nothing it did not decide).

Known limit: a group holding a cause and an opposite-sign difference of about the
same size reads as inert when left out together; the opposite-sign test on the
same boots still sees it when the opposite member dominates.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ..model import Expect, Outcome
from . import stats

__all__ = ["Difference", "Test", "Explanation", "explain", "Measure"]

Measure = Callable[[frozenset], Sequence[float]]


@dataclass(frozen=True)
class Difference:
    """One way the two configs differ: ``kind`` is ``env``, ``flag`` or ``commit``."""

    name: str
    kind: str
    fast: object
    slow: object

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "fast": self.fast, "slow": self.slow}


@dataclass(frozen=True)
class Test:
    """One decided comparison of the search: configuration ``treatment`` (a subset of
    differences) against ``baseline``, with the verdict of the harness's rule."""

    purpose: str
    baseline: frozenset
    treatment: frozenset
    expect: str
    outcome: str
    ratio: float
    ci: Optional[tuple]
    p_value: Optional[float]
    boots: tuple  # boots per side
    reason: str
    opposite: Optional[str] = None  # the same boots' verdict in the other direction

    def to_json(self) -> dict:
        return {"purpose": self.purpose, "baseline": sorted(self.baseline), "treatment": sorted(self.treatment),
                "expect": self.expect, "outcome": self.outcome, "ratio": self.ratio,
                "ci": list(self.ci) if self.ci else None, "p_value": self.p_value, "boots": list(self.boots),
                "reason": self.reason, "opposite": self.opposite}


@dataclass(frozen=True)
class Explanation:
    """The answer: ``members`` the minimal set (names), ``confidence`` each member's
    leave-out test, ``interactions`` pairs slow only together, ``opposite`` differences
    that make the slow config faster, ``undecided`` members of groups the budget left
    open, ``tests`` every configuration tried in order, ``boots`` all boots spent."""

    slowdown: Test
    members: tuple
    confidence: dict
    interactions: tuple
    opposite: tuple
    undecided: tuple
    effect: Optional[Test]
    residual: Optional[Test]
    tests: tuple
    boots: int

    @property
    def explained(self) -> bool:
        return self.slowdown.outcome == Outcome.CONFIRMED.value and bool(self.members)

    @property
    def confident(self) -> bool:
        """A set claimed without reservation: members found, nothing left undecided."""
        return self.explained and not self.undecided

    def to_json(self) -> dict:
        return {"slowdown": self.slowdown.to_json(), "members": list(self.members),
                "confidence": {k: v.to_json() for k, v in self.confidence.items()},
                "interactions": [list(p) for p in self.interactions], "opposite": list(self.opposite),
                "undecided": list(self.undecided), "effect": self.effect.to_json() if self.effect else None,
                "residual": self.residual.to_json() if self.residual else None,
                "tests": [t.to_json() for t in self.tests], "boots": self.boots,
                "confident": self.confident}


class _Search:
    def __init__(self, names: Sequence[str], measure: Measure, *, worse: Expect, min_effect: float,
                 design: stats.Design, alpha: float, seed: int):
        self.names = tuple(names)
        self.all = frozenset(names)
        self.measure, self.worse, self.min_effect = measure, worse, min_effect
        self.better = Expect.INCREASE if worse is Expect.DECREASE else Expect.DECREASE
        self.design, self.alpha = design, alpha
        self.rng = random.Random(seed)
        self.tests: list[Test] = []
        self.boots = 0

    def compare(self, purpose: str, base: frozenset, treat: frozenset, expect: Expect,
                both_ways: bool = False) -> Test:
        """Paired rounds (random order inside each) until the rule decides or the budget ends.
        ``both_ways`` also judges the other direction on the same boots, each at alpha/2."""
        a = self.alpha / 2 if both_ways else self.alpha
        other = Expect.INCREASE if expect is Expect.DECREASE else Expect.DECREASE
        bb: list = []
        tb: list = []
        while True:
            for side in self.rng.sample((0, 1), 2):
                (bb if side == 0 else tb).append(list(self.measure(base if side == 0 else treat)))
                self.boots += 1
            v = stats.evaluate(bb, tb, expect=expect, min_effect=self.min_effect, design=self.design, alpha=a)
            o = stats.evaluate(bb, tb, expect=other, min_effect=self.min_effect, design=self.design,
                               alpha=a) if both_ways else None
            # Both ways: stop at a confirmation either way, or when both directions are final.
            done = v.final if o is None else (v.outcome is Outcome.CONFIRMED or o.outcome is Outcome.CONFIRMED
                                              or (v.final and o.final))
            if done:
                t = Test(purpose, base, treat, expect.value, v.outcome.value, v.ratio, v.ci, v.p_value,
                         (len(bb), len(tb)), v.reason, o.outcome.value if o else None)
                self.tests.append(t)
                return t

    def leave_out(self, group: frozenset) -> Test:
        return self.compare("leave out", self.all, self.all - group, self.better, both_ways=True)

    def run(self) -> Explanation:
        slowdown = self.compare("slowdown", frozenset(), self.all, self.worse)
        if slowdown.outcome != Outcome.CONFIRMED.value:
            return Explanation(slowdown, (), {}, (), (), (), None, None, tuple(self.tests), self.boots)
        members: list[str] = []
        conf: dict = {}
        opposite: list[str] = []
        undecided: list[str] = []
        # Order the differences as given; split each group that matters in two halves.
        # When a group matters and its first half is cleared, the second half must hold
        # what made the group matter: it is split without a test of its own (its parts
        # are still tested; a member is only ever named by its own test).
        todo: list[tuple] = [(self.names, None, 0)]
        cleared_first: set = set()
        matters: set = set()  # parents shown to matter (the whole set, a confirmed group, an implied one)
        parent = 0
        while todo:
            group, pid, idx = todo.pop(0)
            if pid is None:  # the whole set: leaving all out is the slowdown test itself
                t = None
            elif idx == 1 and pid in cleared_first and len(group) > 1:
                t = None
            else:
                t = self.leave_out(frozenset(group))
            if t is not None and t.outcome != Outcome.CONFIRMED.value:
                if t.opposite == Outcome.CONFIRMED.value:
                    if len(group) == 1:
                        opposite.append(group[0])
                        continue
                elif t.outcome == Outcome.REFUTED.value and t.opposite in (Outcome.REFUTED.value, None):
                    if idx == 0 and pid in matters:
                        cleared_first.add(pid)
                    continue  # cleared: no member moves the slow config by min_effect either way
                else:
                    if len(group) == 1:
                        undecided.append(group[0])
                        continue
                    # Undecided group: split it anyway, a smaller group may decide.
            if len(group) == 1:
                members.append(group[0])
                conf[group[0]] = t if t is not None else slowdown  # one difference: the slowdown is its test
                continue
            parent += 1
            if t is None or t.outcome == Outcome.CONFIRMED.value:
                matters.add(parent)
            mid = len(group) // 2
            todo += [(group[:mid], parent, 0), (group[mid:], parent, 1)]
        members_f = frozenset(members)
        effect = residual = None
        interactions: list[tuple] = []
        if members:
            # The whole set is the slowdown test already: its boots stand for it.
            effect = slowdown if members_f == self.all else self.compare("minimal set vs fast", frozenset(),
                                                                        members_f, self.worse)
            if members_f != self.all:
                residual = self.compare("minimal set vs slow", members_f, self.all, self.worse)
            if len(members) > 1:
                inert = []
                for m in members:
                    alone = self.compare("alone vs fast", frozenset(), frozenset([m]), self.worse)
                    if alone.outcome == Outcome.REFUTED.value:
                        inert.append(m)
                for a, b in itertools.combinations(inert, 2):
                    pair = (slowdown if frozenset([a, b]) == self.all else
                            self.compare("pair vs fast", frozenset(), frozenset([a, b]), self.worse))
                    if pair.outcome == Outcome.CONFIRMED.value:
                        interactions.append((a, b))
        return Explanation(slowdown, tuple(members), conf, tuple(interactions), tuple(opposite),
                           tuple(undecided), effect, residual, tuple(self.tests), self.boots)


def explain(names: Sequence[str], measure: Measure, *, worse: Expect, min_effect: float,
            design: stats.Design = stats.Design(min_boots=3, max_boots=8, analysis="paired"),
            alpha: float = 0.01, seed: int = 0) -> Explanation:
    """Find a minimal set of ``names`` (the differences) that makes the slow config slow.

    ``measure(subset)`` boots the fast config with ``subset``'s differences set to their
    slow values and returns that boot's samples. ``worse`` is the metric's bad direction
    (``Expect.DECREASE`` for tok/s), ``min_effect`` the smallest relative change that
    counts. ``alpha`` is each test's error (each leave-out test splits it over its two
    directions); ``seed`` orders each round's two boots.
    """
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"explain: the differences must be distinct and at least one, got {list(names)!r}")
    if not 0 < min_effect < 1:
        raise ValueError(f"explain: min_effect must be in (0, 1), got {min_effect!r}")
    return _Search(names, measure, worse=worse, min_effect=min_effect, design=design, alpha=alpha,
                   seed=seed).run()
