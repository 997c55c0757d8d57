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
import math
import random
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
from scipy import special
from scipy import stats as _st

from ..model import Expect, Outcome
from . import blocks, stats

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
    baseline_calls: tuple = ()  # which measure() calls (0-based, in order) made each side's boots
    treatment_calls: tuple = ()

    def to_json(self) -> dict:
        return {"purpose": self.purpose, "baseline": sorted(self.baseline), "treatment": sorted(self.treatment),
                "expect": self.expect, "outcome": self.outcome, "ratio": self.ratio,
                "ci": list(self.ci) if self.ci else None, "p_value": self.p_value, "boots": list(self.boots),
                "reason": self.reason, "opposite": self.opposite,
                "baseline_calls": list(self.baseline_calls), "treatment_calls": list(self.treatment_calls)}


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
        self.max_rounds = max(design.max_boots, 3)
        # Every leave-out decision (either way, at any look, of any of at most 2n groups)
        # shares alpha: Bonferroni, so the chance of any wrong claim or clearance stays
        # below alpha over the whole search.
        self.block_thr = alpha / (2 * 2 * len(self.names) * (self.max_rounds - 1))
        self.rng = random.Random(seed)
        self.tests: list[Test] = []
        self.boots = 0

    def _boot(self, config: frozenset) -> tuple[int, list]:
        samples = list(self.measure(config))
        self.boots += 1
        return self.boots - 1, samples

    def paired(self, specs: Sequence[tuple]) -> list[Test]:
        """Paired tests ``(purpose, base, treat, expect, both_ways)`` run side by side: each
        round boots every config an unfinished test needs once, in a random order, so a
        config shared by several tests (the fast one, say) is booted once per round for
        all of them. Each test is the harness's sequential rule on its own rounds."""
        state = [dict(bb=[], tb=[], bc=[], tc=[], done=None) for _ in specs]
        while any(s["done"] is None for s in state):
            need: list = []
            for (_, base, treat, _, _), s in zip(specs, state):
                if s["done"] is None:
                    need += [c for c in (base, treat) if c not in need]
            got = {c: self._boot(c) for c in self.rng.sample(need, len(need))}
            for (purpose, base, treat, expect, both), s in zip(specs, state):
                if s["done"] is not None:
                    continue
                for arm, calls, c in ((s["bb"], s["bc"], base), (s["tb"], s["tc"], treat)):
                    calls.append(got[c][0])
                    arm.append(got[c][1])
                a = self.alpha / 2 if both else self.alpha
                other = Expect.INCREASE if expect is Expect.DECREASE else Expect.DECREASE
                v = stats.evaluate(s["bb"], s["tb"], expect=expect, min_effect=self.min_effect,
                                   design=self.design, alpha=a)
                o = stats.evaluate(s["bb"], s["tb"], expect=other, min_effect=self.min_effect,
                                   design=self.design, alpha=a) if both else None
                done = v.final if o is None else (v.outcome is Outcome.CONFIRMED or o.outcome is Outcome.CONFIRMED
                                                  or (v.final and o.final))
                if done:
                    s["done"] = Test(purpose, base, treat, expect.value, v.outcome.value, v.ratio, v.ci, v.p_value,
                                     (len(s["bb"]), len(s["tb"])), v.reason, o.outcome.value if o else None,
                                     tuple(s["bc"]), tuple(s["tc"]))
        out = [s["done"] for s in state]
        self.tests.extend(out)
        return out

    def _judge(self, c: blocks.Contrast) -> tuple[str, str, Optional[str], float, tuple]:
        """(status, outcome, opposite, p, ci) of one leave-out contrast; status is
        ``matters``, ``opposite``, ``cleared`` or ``open``."""
        thr = self.block_thr
        dd = self.better.sign * c.estimate
        e_b = stats._log_effect(self.better, self.min_effect)
        e_w = stats._log_effect(self.worse, self.min_effect)
        p_b = float(special.stdtr(c.df, -dd / c.se))
        p_w = float(special.stdtr(c.df, dd / c.se))
        better = p_b <= thr and dd >= e_b
        worse = p_w <= thr and -dd >= e_w
        not_better = float(special.stdtr(c.df, (dd - e_b) / c.se)) <= thr
        not_worse = float(special.stdtr(c.df, (-dd - e_w) / c.se)) <= thr
        half = float(_st.t.isf(thr, c.df)) * c.se
        ci = (math.exp(c.estimate - half), math.exp(c.estimate + half))
        if better:
            status, outcome, opp = "matters", Outcome.CONFIRMED, Outcome.REFUTED if not_worse else Outcome.INCONCLUSIVE
        elif worse:
            status, outcome, opp = "opposite", Outcome.REFUTED, Outcome.CONFIRMED
        else:
            status = "cleared" if (not_better and not_worse) else "open"
            outcome = Outcome.REFUTED if not_better else Outcome.INCONCLUSIVE
            opp = Outcome.REFUTED if not_worse else Outcome.INCONCLUSIVE
        return status, outcome.value, opp.value, p_b, ci

    def leave_out_level(self, groups: Sequence[tuple]) -> list[tuple[str, Test]]:
        """Leave each group out of the slow config, all groups in one block of rounds
        against the slow config booted between them (:mod:`blocks`). A group stops
        being booted once decided; the block ends when every group is decided or at
        ``max_rounds``. No decision before a group's third boot: with two, one
        spoiled boot cannot be told from an effect."""
        seq: list[tuple] = []
        calls: dict = {k: [] for k in range(-1, len(groups))}
        open_ = set(range(len(groups)))
        done: dict = {}
        for rnd in range(1, self.max_rounds + 1):
            keys = blocks.round_order(sorted(open_), -1, self.rng)
            for k in keys:
                idx, smp = self._boot(self.all if k == -1 else self.all - frozenset(groups[k]))
                seq.append((k, math.log(float(np.mean(smp)))))
                calls[k].append(idx)
            fitted = blocks.fit(seq, -1, min_boots=3)
            for k in sorted(open_):
                c = fitted.get(k)
                if c is None:
                    continue
                status, outcome, opp, p, ci = self._judge(c)
                if status == "open" and rnd < self.max_rounds:
                    continue
                ratio = math.exp(c.estimate)
                where = (f"{c.boots} boots against the slow config booted between them, robust pooled fit, "
                         f"{c.df:.0f} error df, threshold p <= {self.block_thr:.2g} per direction and look")
                reason = (f"{'Decided' if status != 'open' else 'Budget spent, undecided'}: leaving it out gives "
                          f"{ratio:.4f}x the slow config, interval {ci[0]:.4f}x..{ci[1]:.4f}x, "
                          f"p={p:.2g} ({where}).")
                done[k] = (status, Test("leave out", self.all, self.all - frozenset(groups[k]), self.better.value,
                                        outcome, ratio, ci, p, (len(calls[-1]), len(calls[k])), reason, opp,
                                        tuple(calls[-1]), tuple(calls[k])))
                open_.discard(k)
            if not open_:
                break
        out = [done[k] for k in range(len(groups))]
        self.tests.extend(t for _, t in out)
        return out

    def first_groups(self) -> list[tuple]:
        """Singletons up to 16 differences; above, groups of a power of two so that the
        first block holds 8 to 16 of them (a few causes among many: most groups clear)."""
        n = len(self.names)
        size = 1 if n <= 16 else 2 ** int(math.log2(n / 8))
        return [self.names[i:i + size] for i in range(0, n, size)]

    def run(self) -> Explanation:
        slowdown = self.paired([("slowdown", frozenset(), self.all, self.worse, False)])[0]
        if slowdown.outcome != Outcome.CONFIRMED.value:
            return Explanation(slowdown, (), {}, (), (), (), None, None, tuple(self.tests), self.boots)
        members: list[str] = []
        conf: dict = {}
        opposite: list[str] = []
        undecided: list[str] = []
        if len(self.names) == 1:
            members, conf = [self.names[0]], {self.names[0]: slowdown}
            groups: list = []
        else:
            groups = self.first_groups()
        while groups:
            nxt: list = []
            for g, (status, t) in zip(groups, self.leave_out_level(groups)):
                if status == "cleared":
                    continue
                if len(g) > 1:  # a group that matters, masks a cause, or stayed open: split it
                    nxt += [g[:len(g) // 2], g[len(g) // 2:]]
                elif status == "matters":
                    members.append(g[0])
                    conf[g[0]] = t
                elif status == "opposite":
                    opposite.append(g[0])
                else:
                    undecided.append(g[0])
            groups = nxt
        members.sort(key=self.names.index)
        effect = residual = None
        interactions: list[tuple] = []
        if members:
            m_f = frozenset(members)
            specs = []
            if m_f != self.all:
                specs += [("minimal set vs fast", frozenset(), m_f, self.worse, False),
                          ("minimal set vs slow", m_f, self.all, self.worse, False)]
            if len(members) > 1:
                specs += [("alone vs fast", frozenset(), frozenset([m]), self.worse, False) for m in members]
            res = self.paired(specs) if specs else []
            if m_f != self.all:
                effect, residual, res = res[0], res[1], res[2:]
            else:
                effect = slowdown  # the whole set is the slowdown test already: its boots stand for it
            inert = [m for m, t in zip(members, res) if t.outcome == Outcome.REFUTED.value]
            pairs = [p for p in itertools.combinations(inert, 2)]
            tested = self.paired([("pair vs fast", frozenset(), frozenset(p), self.worse, False)
                                  for p in pairs if frozenset(p) != self.all])
            it = iter(tested)
            for p in pairs:
                t = slowdown if frozenset(p) == self.all else next(it)
                if t.outcome == Outcome.CONFIRMED.value:
                    interactions.append(p)
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
