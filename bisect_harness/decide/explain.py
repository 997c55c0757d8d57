"""Which of the differences between two configs make the slow one slow: a noisy delta debugging.

A pure search that boots nothing itself. Two configs differ in a list of
*differences* (each env variable, each flag, the commit range as one more). A
configuration of the search is a subset ``S`` of them: the fast config with the
differences of ``S`` set to their slow values. The search is stepped by its
driver (:class:`ExplainSearch`): it says which configuration to boot once next and
is told that boot's samples of the metric; whoever drives it boots
(``run/explain_runner`` through the scheduler, the benches and tests through
a ``measure`` function, :func:`explain`), so the search calls nothing above it, as
the bisection's search (``bisection.BisectionSearch.next_round``) does not. Every
decision below is sequential: the paired ones by the harness's verdict rule
(:func:`evaluate.evaluate`), the others by a block of many configs against one control
(:mod:`blocks`), so a test stops at its first look when the answer is clear and
spends its budget only where the answer is close.

The search (adaptive group testing, the leave-out form of ddmin):

1. **Slowdown.** slow (all differences) against fast (none), expect the slow one
   worse by ``min_effect``: the harness's paired sequential rule. Not confirmed:
   nothing to explain, stop.
2. **Leave-out blocks.** A group ``G`` *matters* when reverting it from the slow
   config (config ``D \\ G``) makes it better by ``min_effect``. Testing by leaving
   out, not by adding alone, is what finds interactions: reverting either member
   of a pair that is slow only together removes the pair's effect. The groups of
   one level are tested together in a block (:mod:`blocks`): each round boots every
   undecided group's config once, with the slow config booted between chunks of
   them, and each group is compared with the slow config where it ran, by a robust
   fit whose noise is pooled over the whole block. A group that matters is split
   in two for the next level; a group cleared (shown to move the slow config by
   less than ``min_effect`` either way) is cleared with every member; a singleton
   that matters is a member; a singleton shown to make the slow config *worse*
   when left out is a candidate for the opposite sign, claimed only when a paired
   test of fresh boots (slow against slow without it) confirms it: in that tail the
   block's p-values run 8 to 21 times too small on hosts whose bad boots are slow
   (``bench/bench_blocks.py``). Every block decision
   about a config must also hold with any one of its boots left out: no decision
   rests on one boot (in ``bench/bench_explain.py``, deciding without this check
   named inert differences as causes, and lost causes, under stalls and bursts).
   Up to 16 differences start
   as singletons; above, in groups of a power of two, 8 to 16 groups.
   The decisions that shape the set (a group matters, a group is cleared: at any
   look, of the ``n`` singletons or at most ``2n`` groups) share ``alpha`` by
   Bonferroni: the chance that the search claims an inert difference or clears one
   that matters is at most ``alpha`` in all, on the model's assumptions; off them,
   ``bench/bench_explain.py`` measures it.
3. **Sufficiency.** The members together (config ``C``) against fast: the
   minimal set's effect size, and against slow (does ``C`` account for all of it).
4. **Alone.** Each member alone against fast. A member whose effect alone is
   refuted, yet matters when left out, acts only with another member; pairs of
   such members are tested together and reported as interactions.
   Steps 3 and 4 run as a block against the fast config, as the leave-out tests
   do against the slow one (their own Bonferroni share of ``alpha`` over the
   block's configs); the minimal set against slow is a paired test, since the two
   configs differ in many differences and may differ in noise. So is each pair:
   an interaction is a "slower" claim, the tail in which a block's p-values run too
   small on hosts whose bad boots are slow (the pairs share ``alpha``).

Each member's confidence is its leave-out test's: outcome, ratio, interval and
p-value at the look that decided it. A group left undecided at the budget is split
anyway (a smaller group may decide); a singleton left undecided is reported as
undecided, never as a member (the search claims nothing it did not decide). A group
whose test ended with half of a clearing, shown to hold no cause (left out, the slow
config is not better by ``min_effect``, with any one boot left out too) but not shown
free of the opposite sign, is not split: the set is settled for it, and its members
are reported as ``sign_open``, neither claimed nor cleared that way (on the two-mode
host at 32 differences, splitting such groups cost 12% of the search's boots and
settled nothing about the set). Since a
group that matters and one left open are both split, only a clearing (or that half
of one) changes the search: a group stops, open, at the first look at which even an estimate of exactly
no effect could not clear it within the budget (on a host too noisy to clear
anything, waiting out the budget at every level cost more than one-at-a-time
testing in ``bench/bench_explain.py``; stopping claims nothing, so it spends no alpha).
A singleton shown to hold no cause stops, its sign open, at the first look at which
it could be neither cleared nor shown of the opposite sign by the budget, even with
its estimate moved a standard error either way. (Stopping any singleton that could
settle nothing more cut another 8% of the boots on the two-mode host at 32
differences, but lost true causes whose first boots drew low: exact answers fell from
0.97 to 0.80 on the bursty host at 8 differences and to 0.73 at 32.)
Every test names the boots asked for behind each of its sides (by their place in the
order asked), so a boot shared by several tests is counted once in ``boots`` and
traced from each.

**Configurations that cannot be measured.** The driver may record :class:`Unmeasured`
(why) instead of samples: the measuring call behind it booted the configuration and its
retries and gave up (a refused flag, a build that fails, boots that fail in a row). The
search steps over it, never asks for it again, and says why in the test it ended: a
leave-out config that cannot be measured leaves its group undecided (a group of more
than one is split: a smaller one may boot), a side or paired test ends inconclusive; when
the fast or the slow config itself cannot be measured, every test still open ends that
way and the search claims only what it had decided. ``stopped`` says how the search
ended, one value of :data:`STOP_REASONS`; ``unmeasurable`` lists each configuration
stepped over with its reason.

Known limit: a group holding a cause and an opposite-sign difference of about the
same size reads as inert when left out together; the opposite-sign test on the
same boots still sees it when the opposite member dominates.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Callable, Generator, Optional, Sequence

import numpy as np
from scipy import stats as _st

from bisect_harness.model import Expect, Outcome, shown_apart
from bisect_harness.decide import blocks
from bisect_harness.decide.design import Design
from bisect_harness.decide.evaluate import evaluate
from bisect_harness.decide.kernel import decide, log_effect

__all__ = ["Difference", "Test", "Explanation", "ExplainSearch", "explain", "Measure", "Unmeasured",
           "STOP_REASONS"]


@dataclass(frozen=True)
class Unmeasured:
    """What the driver records for a configuration it cannot measure (after its retries):
    why. The search steps over that configuration and never asks for it again."""

    reason: str


Measure = Callable[[frozenset], "Sequence[float] | Unmeasured"]
#: the search inside :class:`ExplainSearch`: yields a configuration to boot once, is
#: sent that boot's samples (or :class:`Unmeasured`), returns the :class:`Explanation`
_Steps = Generator[frozenset, "Sequence[float] | Unmeasured", "Explanation"]

#: how a search ended (``Explanation.stopped``), one value each
STOP_REASONS = {
    "explained": "a minimal set was found and nothing was left undecided",
    "undecided": "some differences were left undecided by the budget: what was shown to matter is not "
                 "claimed as the whole set",
    "config-unmeasurable": "a configuration of the search could not be measured, so the differences it "
                           "tests were left undecided (the others were decided)",
    "no-member": "the slowdown is real, yet no difference was shown to matter on its own group's test",
    "no-slowdown": "the slow config was not shown slower than the fast one by min_effect: nothing to explain",
    "arm-unmeasurable": "the fast or the slow config itself could not be measured: the search claims only "
                        "what it had decided before",
}


class _Lost(Exception):
    """A configuration the driver could not measure (raised inside the search only)."""

    def __init__(self, config: frozenset):
        super().__init__(config)
        self.config = config


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
    baseline_calls: tuple = ()  # which boots asked for (0-based, in order) made each side's
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
    open, ``sign_open`` differences shown to hold no cause whose opposite sign the
    budget left open (neither claimed nor cleared that way), ``tests`` every
    configuration tried in order, ``boots`` all boots spent (usable ones: the
    measuring call's failed boots and retries are its own), ``stopped`` how the
    search ended (one of :data:`STOP_REASONS`), ``unmeasurable`` each configuration
    stepped over: (its differences, sorted; why)."""

    slowdown: Test
    members: tuple
    confidence: dict
    interactions: tuple
    opposite: tuple
    undecided: tuple
    sign_open: tuple
    effect: Optional[Test]
    residual: Optional[Test]
    tests: tuple
    boots: int
    stopped: str = "explained"
    unmeasurable: tuple = ()

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
                "undecided": list(self.undecided), "sign_open": list(self.sign_open),
                "effect": self.effect.to_json() if self.effect else None,
                "residual": self.residual.to_json() if self.residual else None,
                "tests": [t.to_json() for t in self.tests], "boots": self.boots,
                "confident": self.confident, "stopped": self.stopped,
                "unmeasurable": [{"config": list(c), "reason": why} for c, why in self.unmeasurable]}


class _Search:
    def __init__(self, names: Sequence[str], *, worse: Expect, min_effect: float,
                 design: Design, alpha: float, seed: int, block_rounds: Optional[int] = None,
                 rounds: Sequence[tuple] = ()):
        self.names = tuple(names)
        # Rounds of the fast and the slow config measured before the search (its run's):
        # the slowdown test starts from them; they are calls 0 .. 2 * len(rounds) - 1.
        self.rounds = tuple((list(f), list(sl)) for f, sl in rounds)
        self.all = frozenset(names)
        self.worse, self.min_effect = worse, min_effect
        self.better = Expect.INCREASE if worse is Expect.DECREASE else Expect.DECREASE
        self.design, self.alpha = design, alpha
        # A block may run twice the paired budget: it spends rounds only on configs still
        # open, and a noisy host needs them. It looks at rounds 3, 4, 5, 6, then at every
        # second round to 12, then every fourth (fewer looks, less alpha split).
        self.max_rounds = max(block_rounds or 2 * design.max_boots, 3)
        self.looks = sorted({r for r in range(3, self.max_rounds + 1)
                             if r <= 6 or (r <= 12 and r % 2 == 0) or r % 4 == 0} | {self.max_rounds})
        # The leave-out decisions that shape the set share alpha by Bonferroni over every
        # look and every group the search can test (n singletons, or at most 2n groups
        # when it starts from larger ones), so the chance of naming an inert difference
        # or clearing one that matters stays below alpha over the whole search. A group
        # can be wrong only one way: an inert one by "matters" (its test of no effect),
        # one that matters by "cleared" or "opposite" (both reject its test of an effect of
        # min_effect). An inert group called "opposite" does not change the set: those
        # claims are a family of their own, at the same level.
        n_groups = len(self.first_groups())
        self.max_groups = len(self.names) if n_groups == len(self.names) else 2 * len(self.names)
        self.block_thr = alpha / (self.max_groups * len(self.looks))
        self.rng = random.Random(seed)
        self.tests: list[Test] = []
        self.boots = 0
        self.lost: dict[frozenset, str] = {}  # configurations the driver could not measure: why

    def _boot(self, config: frozenset):
        """One boot of ``config``, asked of the driver: (its call index, its samples);
        raises :class:`_Lost` for a configuration that cannot be measured (asked once only)."""
        if config in self.lost:
            raise _Lost(config)
        got = yield config
        if isinstance(got, Unmeasured):
            self.lost[config] = got.reason
            raise _Lost(config)
        samples = list(got)
        self.boots += 1
        return 2 * len(self.rounds) + self.boots - 1, samples

    def _label(self, config: frozenset) -> str:
        if config == self.all:
            return "the slow config"
        if not config:
            return "the fast config"
        rest = [n for n in self.names if n not in config]
        return ("the slow config without " + ", ".join(rest) if len(rest) < len(config)
                else "the fast config with " + ", ".join(n for n in self.names if n in config))

    def _unmeasured(self, config: frozenset) -> str:
        return (f"Not measurable: {self._label(config)} could not be measured ({self.lost[config]}); "
                "the search stepped over it")

    def compare(self, purpose: str, base: frozenset, treat: frozenset, expect: Expect, *,
                alpha: Optional[float] = None, given: Sequence[tuple] = ()) -> Generator[frozenset, object, Test]:
        """One paired test: rounds of one boot of each config, in a random order, until
        the harness's sequential rule decides (at ``alpha``, default the search's) or
        the budget ends. ``given``: rounds measured before, as (base samples, treatment
        samples, base call, treatment call); the rule looks at them first, at their
        count, then boots on where it has not decided. Looking first at a later look
        than the rule's first only drops looks, so its error stays within alpha,
        whatever rule stopped the rounds given."""
        bb: list = [b for b, _, _, _ in given]
        tb: list = [t for _, t, _, _ in given]
        bc: list = [i for _, _, i, _ in given]
        tc: list = [j for _, _, _, j in given]
        look_first = bool(given)
        while True:
            for c in () if look_first else self.rng.sample((base, treat), 2):
                try:
                    idx, smp = yield from self._boot(c)
                except _Lost:
                    t = Test(purpose, base, treat, expect.value, Outcome.INCONCLUSIVE.value, None, None, None,
                             (len(bb), len(tb)), self._unmeasured(c), None, tuple(bc), tuple(tc))
                    self.tests.append(t)
                    return t
                (bc if c is base else tc).append(idx)
                (bb if c is base else tb).append(smp)
            look_first = False
            v = evaluate(bb, tb, expect=expect, min_effect=self.min_effect, design=self.design,
                         alpha=self.alpha if alpha is None else alpha)
            if v.final:
                t = Test(purpose, base, treat, expect.value, v.outcome.value, v.ratio, v.ci, v.p_value,
                         (len(bb), len(tb)), v.reason, None, tuple(bc), tuple(tc))
                self.tests.append(t)
                return t

    def _judge_leave_out(self, c: blocks.Contrast, thr: float) -> tuple[str, str, Optional[str], float, tuple]:
        """(status, outcome, opposite, p, ci) of one leave-out contrast; status is
        ``matters``, ``opposite``, ``cleared`` or ``open``: the decision kernel
        (:func:`kernel.decide`) in each direction."""
        b = decide(c.estimate, c.se, c.df, expect=self.better, min_effect=self.min_effect, level=thr)
        w = decide(c.estimate, c.se, c.df, expect=self.worse, min_effect=self.min_effect, level=thr)
        better, not_better = b.outcome is Outcome.CONFIRMED, b.outcome is Outcome.REFUTED
        worse, not_worse = w.outcome is Outcome.CONFIRMED, w.outcome is Outcome.REFUTED
        if better:
            status, outcome, opp = "matters", Outcome.CONFIRMED, Outcome.REFUTED if not_worse else Outcome.INCONCLUSIVE
        elif worse:
            status, outcome, opp = "opposite", Outcome.REFUTED, Outcome.CONFIRMED
        else:
            status = "cleared" if (not_better and not_worse) else "open"
            outcome = Outcome.REFUTED if not_better else Outcome.INCONCLUSIVE
            opp = Outcome.REFUTED if not_worse else Outcome.INCONCLUSIVE
        return status, outcome.value, opp.value, b.p_value, b.ci

    def _judge_worse(self, c: blocks.Contrast, thr: float) -> tuple[str, str, Optional[str], float, tuple]:
        """A config against the fast one, one direction: is it worse by ``min_effect``?"""
        w = decide(c.estimate, c.se, c.df, expect=self.worse, min_effect=self.min_effect, level=thr)
        status = {Outcome.CONFIRMED: "confirmed", Outcome.REFUTED: "refuted"}.get(w.outcome, "open")
        return status, w.outcome.value, None, w.p_value, w.ci

    def _clearable(self, c: blocks.Contrast, thr: float) -> bool:
        """Could this contrast still be cleared by ``max_rounds``? Only if an estimate of
        exactly 0 would be, at the standard error its boots so far project to the cap
        (shrinking as one over the root of its boots), read with the normal quantile
        (below the t one at any degrees of freedom: in the contrast's favour)."""
        margin = min(log_effect(self.better, self.min_effect), log_effect(self.worse, self.min_effect))
        se_cap = c.se * math.sqrt(c.boots / self.max_rounds)
        return float(_st.norm.isf(thr)) * se_cap < margin

    def _settles_nothing(self, c: blocks.Contrast, thr: float, judge, outcome: str) -> bool:
        """Would this open test settle nothing more by ``max_rounds`` (still open, its
        outcome still ``outcome``, such as shown to hold no cause), with its estimate
        moved one standard error either way? Projected like :meth:`_clearable` (standard
        error shrunk to the cap, normal quantile). Taken at the estimate alone, without
        the move, this stopped true causes whose few boots had drawn low: 3 of 30
        searches on the two-mode host at 8 differences lost a member
        (``bench/bench_explain.py``); with the move it still did on the bursty host, so
        only a test already shown to hold no cause stops this way."""
        se_cap = c.se * math.sqrt(c.boots / self.max_rounds)
        for shift in (-c.se, c.se):
            proj = blocks.Contrast(c.estimate + shift, se_cap, 1e9, self.max_rounds)
            if judge(proj, thr)[:2] != ("open", outcome):
                return False
        return True

    def block(self, control: frozenset, items: Sequence[tuple[str, frozenset]], *, expect: Expect,
              thr: float, judge, only_clearing: Sequence[bool] = ()) -> Generator[frozenset, object, list]:
        """Configs ``items`` ((purpose, config)) against ``control`` in one block of rounds
        (:mod:`blocks`): each round boots every undecided config once, the control booted
        between chunks of them. A config stops being booted once ``judge`` decides it;
        the block ends when every config is decided or at ``max_rounds``. No decision
        before a config's third boot: with two, one spoiled boot cannot be told from an
        effect. A config whose ``only_clearing`` is true (a group of the leave-out search:
        only a clearing changes what the search does next) also stops, open, once it can
        no longer be cleared within the budget (:meth:`_clearable`): more boots would buy
        nothing. One whose ``only_clearing`` is false (a singleton of the leave-out
        search) and that is shown to hold no cause stops, open, once it would settle
        nothing more by the budget even with its estimate moved a standard error either
        way (:meth:`_settles_nothing`).

        Long because it is a generator the driver steps boot by boot: the block's rounds,
        its boots per config and its open configs live in its frame between yields, and
        each look reads all three."""
        seq: list[tuple] = []
        calls: dict = {k: [] for k in range(-1, len(items))}
        open_ = set(range(len(items)))
        done: dict = {}
        name = "the slow config" if control == self.all else "the fast config"

        def step_over(k: int, config: frozenset) -> None:  # a config the driver cannot measure
            done[k] = ("unmeasurable", Test(items[k][0], control, items[k][1], expect.value,
                                            Outcome.INCONCLUSIVE.value, None, None, None,
                                            (len(calls[-1]), len(calls[k])), self._unmeasured(config), None,
                                            tuple(calls[-1]), tuple(calls[k])))
            open_.discard(k)

        for rnd in range(1, self.max_rounds + 1):
            for k in blocks.round_order(sorted(open_), -1, self.rng):
                if k != -1 and k not in open_:
                    continue
                try:
                    idx, smp = yield from self._boot(control if k == -1 else items[k][1])
                except _Lost as lost:
                    for j in (sorted(open_) if k == -1 else [k]):  # without its control, no test goes on
                        step_over(j, lost.config)
                    if not open_:
                        break
                    continue
                seq.append((k, math.log(float(np.mean(smp)))))
                calls[k].append(idx)
            if not open_:
                break
            if rnd not in self.looks:
                continue
            fitted = blocks.fit(seq, -1, min_boots=3)
            for k in sorted(open_):
                c = fitted.get(k)
                if c is None:
                    continue
                status, outcome, opp, p, ci = judge(c, thr)
                unstable = status != "open" and not self._stable(seq, k, thr, judge, status)
                if unstable:
                    status = "open"
                # An open test may still have settled one half: no effect in the expected
                # direction (a leave-out group shown to hold no cause). That half, too, must
                # hold with any one boot left out; checked only where it ends a test.
                def half_holds() -> bool:
                    return self._stable(seq, k, thr, lambda cc, tt: (judge(cc, tt)[1],), Outcome.REFUTED.value)
                futile = half_checked = False
                if status == "open" and rnd < self.max_rounds and k < len(only_clearing):
                    if only_clearing[k]:
                        futile = not self._clearable(c, thr)
                    elif outcome == Outcome.REFUTED.value and self._settles_nothing(c, thr, judge, outcome):
                        futile = half_checked = half_holds()
                if status == "open" and rnd < self.max_rounds and not futile:
                    continue
                ratio = math.exp(c.estimate)
                p_text, thr_text = shown_apart(p, thr)  # the digits that tell p from its threshold
                where = (f"{c.boots} boots against {name} booted between them, robust pooled fit, "
                         f"{c.df:.0f} error df, {c.segments_left_out} host block(s) left out as unsettled, "
                         f"threshold p <= {thr_text} per direction and look")
                if status == "open" and outcome != Outcome.INCONCLUSIVE.value and not (
                        outcome == Outcome.REFUTED.value and (half_checked or half_holds())):
                    outcome = Outcome.INCONCLUSIVE.value
                if (unstable and opp == Outcome.REFUTED.value
                        and not self._stable(seq, k, thr, lambda cc, tt: (judge(cc, tt)[2],), opp)):
                    opp = Outcome.INCONCLUSIVE.value
                no_cause = status == "open" and outcome == Outcome.REFUTED.value
                head = ("Decided" if status != "open" else
                        ("Budget spent" if not futile else f"Stopped at round {rnd}") + ", no cause shown, its sign open"
                        if no_cause else "Budget spent, undecided" if not futile else
                        f"Stopped undecided at round {rnd}")
                if futile:
                    head += (f": the noise leaves no clearing possible within {self.max_rounds} rounds"
                             + ("" if no_cause else ", so the group is split") if only_clearing[k] else
                             ": with its estimate one standard error either way, the test would settle nothing "
                             f"more within {self.max_rounds} rounds")
                reason = (f"{head}: "
                          f"{ratio:.4f}x {name}, interval {ci[0]:.4f}x..{ci[1]:.4f}x, p={p_text} ({where}).")
                done[k] = (status, Test(items[k][0], control, items[k][1], expect.value, outcome, ratio, ci, p,
                                        (len(calls[-1]), len(calls[k])), reason, opp, tuple(calls[-1]),
                                        tuple(calls[k])))
                open_.discard(k)
            if not open_:
                break
        out = [done[k] for k in range(len(items))]
        self.tests.extend(t for _, t in out)
        return out

    @staticmethod
    def _stable(seq: Sequence[tuple], k, thr: float, judge, status: str) -> bool:
        """No decision rests on one boot: the decision ``status`` about config ``k``
        (matters, cleared, opposite; slower or not) must also be reached with any one
        of its boots left out."""
        for i in [i for i, (kk, _) in enumerate(seq) if kk == k]:
            c = blocks.fit(seq[:i] + seq[i + 1:], -1, min_boots=2).get(k)
            if c is None or judge(c, thr)[0] != status:
                return False
        return True

    def leave_out_level(self, groups: Sequence[tuple]) -> Generator[frozenset, object, list]:
        items = [("leave out", self.all - frozenset(g)) for g in groups]
        return (yield from self.block(self.all, items, expect=self.better, thr=self.block_thr,
                                      judge=self._judge_leave_out, only_clearing=[len(g) > 1 for g in groups]))

    def side_block(self, items: Sequence[tuple[str, frozenset]]) -> Generator[frozenset, object, list]:
        """Configs near the fast one against it, each expected worse: their own
        Bonferroni share of ``alpha`` (over the block's configs and looks)."""
        if not items:
            return []
        thr = self.alpha / (len(items) * len(self.looks))
        tests = yield from self.block(frozenset(), items, expect=self.worse, thr=thr, judge=self._judge_worse)
        return [t for _, t in tests]

    def first_groups(self) -> list[tuple]:
        """Singletons up to 16 differences; above, groups of a power of two so that the
        first block holds 8 to 16 of them (a few causes among many: most groups clear)."""
        n = len(self.names)
        size = 1 if n <= 16 else 2 ** int(math.log2(n / 8))
        return [self.names[i:i + size] for i in range(0, n, size)]

    def run(self) -> _Steps:
        slowdown = yield from self.compare("slowdown", frozenset(), self.all, self.worse,
                                given=[(f, sl, 2 * i, 2 * i + 1) for i, (f, sl) in enumerate(self.rounds)])
        if slowdown.outcome != Outcome.CONFIRMED.value:
            return Explanation(slowdown, (), {}, (), (), (), (), None, None, tuple(self.tests), self.boots,
                               self._stopped([], []), self._lost_list())
        members: list[str] = []
        conf: dict = {}
        opposite: list[str] = []
        candidates: list[str] = []  # worse when left out, on a block's test: confirmed below
        undecided: list[str] = []
        sign_open: list[str] = []
        if len(self.names) == 1:
            members, conf = [self.names[0]], {self.names[0]: slowdown}
            groups: list = []
        else:
            groups = self.first_groups()
        while groups:
            nxt: list = []
            for g, (status, t) in zip(groups, (yield from self.leave_out_level(groups))):
                if status == "cleared":
                    continue
                if status == "open" and t.outcome == Outcome.REFUTED.value:  # no cause in it; its sign open
                    sign_open.extend(g)
                    continue
                if len(g) > 1:  # a group that matters, masks a cause, or stayed open: split it
                    nxt += [g[:len(g) // 2], g[len(g) // 2:]]
                elif status == "matters":
                    members.append(g[0])
                    conf[g[0]] = t
                elif status == "opposite":
                    candidates.append(g[0])
                else:
                    undecided.append(g[0])
            groups = nxt
        for d in sorted(candidates, key=self.names.index):
            t = yield from self.compare("opposite sign", self.all, self.all - {d}, self.worse,
                             alpha=self.alpha / len(candidates))
            if t.outcome == Outcome.CONFIRMED.value:
                opposite.append(d)
            elif t.outcome == Outcome.INCONCLUSIVE.value:
                undecided.append(d)
        members.sort(key=self.names.index)
        undecided.sort(key=self.names.index)
        effect = residual = None
        interactions: list[tuple] = []
        if members:
            m_f = frozenset(members)
            items = [("minimal set vs fast", m_f)] if m_f != self.all else []
            if len(members) > 1:
                items += [("alone vs fast", frozenset([m])) for m in members]
            side = yield from self.side_block(items)
            if m_f != self.all:
                effect, side = side[0], side[1:]
                residual = yield from self.compare("minimal set vs slow", m_f, self.all, self.worse)
            else:
                effect = slowdown  # the whole set is the slowdown test already: its boots stand for it
            inert = [m for m, t in zip(members, side) if t.outcome == Outcome.REFUTED.value]
            pairs = list(itertools.combinations(inert, 2))
            # An interaction is claimed in the slower tail, where a block's p-values run
            # too small on hosts whose bad boots are slow (bench/bench_blocks.py): each
            # pair is a paired test of its own, the pairs sharing alpha by Bonferroni.
            for p in pairs:
                t = slowdown if frozenset(p) == self.all else (yield from self.compare(
                    "pair vs fast", frozenset(), frozenset(p), self.worse, alpha=self.alpha / len(pairs)))
                if t.outcome == Outcome.CONFIRMED.value:
                    interactions.append(p)
        return Explanation(slowdown, tuple(members), conf, tuple(interactions), tuple(opposite),
                           tuple(undecided), tuple(sorted(sign_open, key=self.names.index)), effect, residual,
                           tuple(self.tests), self.boots, self._stopped(members, undecided), self._lost_list())

    def _lost_list(self) -> tuple:
        return tuple((tuple(sorted(c)), why) for c, why in self.lost.items())

    def _stopped(self, members: Sequence[str], undecided: Sequence[str]) -> str:
        """How the search ended: one value of :data:`STOP_REASONS`."""
        if frozenset() in self.lost or self.all in self.lost:
            return "arm-unmeasurable"
        if self.tests[0].outcome != Outcome.CONFIRMED.value:
            return "no-slowdown"
        if undecided:
            # a singleton's leave-out config (or the opposite-sign check's) that could not be measured
            if any(self.all - {d} in self.lost for d in undecided):
                return "config-unmeasurable"
            return "undecided"
        return "explained" if members else "no-member"


class ExplainSearch:
    """Find a minimal set of ``names`` (the differences) that makes the slow config slow,
    stepped by its driver, as :class:`bisection.BisectionSearch` is: ask
    :meth:`next_config` what to boot, boot it once, :meth:`record` what came back;
    ``None`` from :meth:`next_config` means the search has ended and :attr:`result`
    holds the :class:`Explanation`::

        search = ExplainSearch(names, worse=Expect.DECREASE, min_effect=0.05)
        while (config := search.next_config()) is not None:
            search.record(boot_once(config))   # its samples, or Unmeasured(why)

    A configuration is a subset of ``names``: the fast config with those differences
    set to their slow values. What is recorded for it is that boot's samples of the
    metric, or :class:`Unmeasured` (why) for a configuration the driver could not
    measure after its retries. ``worse`` is the metric's bad direction
    (``Expect.DECREASE`` for tok/s), ``min_effect`` the smallest relative change that
    counts. ``alpha`` is the error of each paired test (the slowdown, the minimal set
    against slow) and of each family of decisions (the leave-out decisions of the whole
    search share it; so do the side tests of one block, the opposite-sign checks, and
    the pairs' tests); ``seed`` orders each round's boots. ``design`` decides the paired
    tests; ``block_rounds`` caps each block of leave-out or side tests (default twice
    ``design.max_boots``: a block spends rounds only on the configs still open).
    ``rounds``: (fast samples, slow samples) of paired rounds measured before the search
    (a run's rounds of the two arms); the slowdown test judges them first, by its own
    rule and alpha, and boots on only where they do not decide. They are calls 0 to
    ``2 * len(rounds) - 1`` in the tests (fast, slow, round after round; the boots the
    search asks for follow) and are not counted in ``boots``. Bad arguments raise
    ``ValueError`` before the first configuration is asked for.
    """

    def __init__(self, names: Sequence[str], *, worse: Expect, min_effect: float,
                 design: Design = Design(min_boots=3, max_boots=8, analysis="paired"),
                 alpha: float = 0.01, seed: int = 0, block_rounds: Optional[int] = None,
                 rounds: Sequence[tuple] = ()):
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"explain: the differences must be distinct and at least one, got {list(names)!r}")
        if not 0 < min_effect < 1:
            raise ValueError(f"explain: min_effect must be in (0, 1), got {min_effect!r}")
        self._steps = _Search(names, worse=worse, min_effect=min_effect, design=design, alpha=alpha,
                              seed=seed, block_rounds=block_rounds, rounds=rounds).run()
        self._asked: Optional[frozenset] = None
        self.result: Optional[Explanation] = None
        self._step(lambda: next(self._steps))

    def next_config(self) -> Optional[frozenset]:
        """The configuration to boot once next; ``None`` once the search has ended."""
        return self._asked

    def record(self, got: "Sequence[float] | Unmeasured") -> None:
        """What one boot of :meth:`next_config`'s configuration gave: its samples of the
        metric, or :class:`Unmeasured`."""
        if self._asked is None:
            raise RuntimeError("ExplainSearch.record: the search asked for nothing (it has ended)")
        self._step(lambda: self._steps.send(got))

    def _step(self, advance: Callable[[], frozenset]) -> None:
        try:
            self._asked = advance()
        except StopIteration as end:
            self._asked, self.result = None, end.value


def explain(names: Sequence[str], measure: Measure, **options) -> Explanation:
    """An :class:`ExplainSearch` (``options`` are its) driven to its end by
    ``measure(subset)``: that configuration booted once, its samples or
    :class:`Unmeasured`. For drivers that boot in one call: the benches' and the
    tests' simulated hosts."""
    search = ExplainSearch(names, **options)
    while (config := search.next_config()) is not None:
        search.record(measure(config))
    return search.result
