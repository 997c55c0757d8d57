"""Many hypotheses in one run: each gets its share of alpha (Bonferroni), and the
points of one load curve share theirs by a closed test (Holm's step-down).

Across the file: Bonferroni
---------------------------
Many hypotheses in one run: give each ``alpha/m`` (:func:`adjust_alpha`,
Bonferroni). It is valid under any dependence (a shared baseline) and composes
with the sequential boundaries without further argument: each hypothesis' error is
at most ``alpha/m`` over all of its looks, so the family's is at most ``alpha``.
The family is every hypothesis of the hypotheses file (after matrix and sweep
expansion), whatever ``--only`` selected to run now: selecting after seeing results
would otherwise shrink ``m``; the executor stores ``m`` with each verdict
(``verdicts.stats.family_size``). Holm's step-down across the whole file is not
offered: with sequential looks it is only valid when rejected hypotheses' alpha is
recycled into recomputed boundaries (Maurer & Bretz, Stat. Biopharm. Res. 2013),
which needs the whole family at every look.

Inside a curve: a closed test at the curve's shares
---------------------------------------------------
A curve of ``k`` points (``sweep:``, one hypothesis per point) takes the ``k``
shares of its points, ``A = k alpha/m``, and shares them among its points by
:func:`step_down`; the rest of the file keeps Bonferroni, so the file's error
stays at most ``alpha`` (the curve's is at most ``A``, the others' ``alpha/m`` each).

The test of point ``j`` at level ``a``, ``phi_j(a)``: some look ``1..L_j`` at which
the verdict rule, run at alpha ``a`` on that look's rounds, confirms (the same
rule, ``decide.verdict.judge``, its boundaries recomputed for ``a`` at every look:
:func:`~bisect_harness.decide.verdict.rejudge`), where ``L_j`` is the look at which
the point's verdict at its first level ``A/k`` became final (decided, the budget
spent, or the run's rounds over). ``P(phi_j(a)) <= a`` when point ``j`` has no
change or moves the other way: its looks are planned looks at or before the
budget, and the boundaries at level ``a`` are calibrated so that the confirm test,
run on to the budget whatever the refute test says (it is non-binding,
:mod:`bisect_harness.decide.boundaries`), crosses at some look with chance at
most ``a``. Where ``L_j`` falls (the rounds go on while another point of the curve,
which shares its boots, is undecided) cannot raise that chance: ``phi_j(a)`` is
contained in the crossing by the budget. This is Maurer & Bretz's condition: the
recycled alpha goes into boundaries recomputed over every look, not the current
look's alone.

The closed test (Marcus, Peritz & Gabriel, Biometrika 1976): the intersection of
the points ``J`` (none of them moved as claimed) is rejected when some ``j`` in
``J`` has ``phi_j(A/|J|)``; under it that happens with chance at most
``|J| A/|J| = A`` (Bonferroni: valid whatever the dependence between points, which
share every boot). A point is confirmed when every intersection holding it is
rejected, which holds the curve's familywise error of confirmations at ``A`` in
the strong sense. With ``R_s`` the points whose test confirms at ``A/s``, an
intersection of size ``s`` is rejected when it meets ``R_s``, so point ``i`` is
confirmed when, for every ``s`` in ``1..k``, ``i`` is in ``R_s`` or ``R_s`` holds
more than ``k - s`` points. Where ``phi_j`` grows with its level this is Holm's
step-down (Scand. J. Statist. 1979): confirm what confirms at ``A/k``, judge the
rest at ``A/(k-1)``, and so on; the closed form does not lean on that growth, which
boundaries calibrated by simulation and the robust analysis' split of alpha between
its t and sign-flip parts (which depends on alpha) do not promise exactly. The
executor keeps the verdicts confirmed at their first level (each a Bonferroni
answer) and adds what the closed test confirms beyond them; the two agree wherever
each look's level grows with alpha, as ``tests/test_curve.py`` checks for the shipped
design along a curve's levels. A curve's points that ``--only`` left out of a run
hold no share in it: the run's points share theirs (``k`` counts the points run).

Only confirmations recycle alpha. A refutation says "confidently less than the
claimed size"; its null (the effect is at least the claimed size) is not rejected
by another point's confirmation, so a point's refutation keeps its first level
``A/k``, and the curve's false refutations stay at most ``A`` (Bonferroni) as they
were. What no longer holds is the single bound on both kinds together that
Bonferroni gave (a point can only be wrong one way, so the ``k`` shares bounded
"confidently wrong in either direction" by ``A``): with the step-down, false
confirmations at the points with no change are at most ``A`` and false refutations
at the points whose change reaches the claim at most ``A`` times their share of
the points. A point confirmed by the step-down carries the interval of the level
that confirmed it (the step-down gives no simultaneous intervals).

``bench/bench_curve.py`` checks it by simulation, through ``decide.verdict.judge``
and :func:`~bisect_harness.decide.verdict.rejudge` as the executor calls them: a
5-point curve whose points share each boot's host, in every noise model of
``bench/noise.py``. With no change anywhere (min_effect 0, alpha 0.05, first level
0.01), any point confirmed: 0.01-0.05 over the 11 models (100 runs each; 300 runs
of stationary, drift and host_step: 0.040-0.053, and 0.037-0.080 +- 0.016 with no
boot noise shared between the points). With one point slowed by 6% and min_effect
0, any of the other four confirmed: 0.037-0.070 in those three (300 runs; Bonferroni
alone 0.030-0.053): the recycled shares stay near the curve's alpha, whose own
rule errs at 0.0108 +- 0.0015 per point at 0.01 (one point, 5,000 runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

__all__ = ["adjust_alpha", "StepDown", "step_down"]


def adjust_alpha(alpha: float, m: int, method: str = "bonferroni") -> float:
    """Per-hypothesis alpha for a family of ``m`` hypotheses (Bonferroni: ``alpha/m``).

    Pass the result as ``evaluate(..., alpha=...)`` for every hypothesis of the run,
    including A/A checks. Valid under any dependence and over all sequential looks.
    Only ``"bonferroni"`` is offered across a file; see the module docstring for why
    not Holm there, and :func:`step_down` for the points of one curve.
    """
    if not (0.0 < alpha < 0.5):
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if int(m) != m or m < 1:
        raise ValueError(f"m (the number of hypotheses) must be an integer >= 1, got {m!r}")
    if method != "bonferroni":
        raise ValueError(
            f"adjust_alpha: method {method!r} is not supported; use 'bonferroni' (Holm's "
            f"step-down is not valid across sequential looks without recomputed boundaries)")
    return alpha / m


@dataclass(frozen=True)
class StepDown:
    """The closed test of one curve's points (:func:`step_down`).

    ``first``: each point's first level (its one share, ``A/k``); ``points`` in the
    sweep's order; ``asked``: every answer the test read, as (point, level, whether
    the point's test confirms at it), in the order asked (the test stops asking once
    the answer is known); ``confirmed``: each point the closed test confirms, with
    the smallest level at which its own test confirmed (``A/s`` for the largest
    ``s``: the level its verdict is stored at)."""

    first: float
    points: tuple[str, ...]
    asked: tuple[tuple[str, float, bool], ...]
    confirmed: Mapping[str, float]

    @property
    def alpha(self) -> float:
        """The curve's share of the family's alpha: its points' shares together."""
        return self.first * len(self.points)

    def level(self, s: int) -> float:
        """The level of an intersection of ``s`` points: ``A/s`` (the first level at ``s = k``)."""
        return self.first if s == len(self.points) else self.first * len(self.points) / s

    @property
    def stepped(self) -> tuple[str, ...]:
        """The points the step-down confirmed beyond those confirmed at their first level."""
        return tuple(p for p, level in self.confirmed.items() if level != self.first)

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "alpha": self.alpha, "points": list(self.points),
                "asked": [[p, level, ok] for p, level, ok in self.asked], "confirmed": dict(self.confirmed)}


def step_down(points: Sequence[str], first: float, confirms: Callable[[str, float], bool]) -> StepDown:
    """The closed test of a curve's ``points`` whose intersections are Bonferroni tests
    at the curve's shares (see the module docstring): ``first`` is each point's one
    share ``A/k``; ``confirms(point, level)`` whether that point's test confirms at
    ``level`` (``A/s`` for ``s = k..1``; at ``first``, its verdict at its first
    level). Each (point, level) is asked at most once, and only where the answer
    can change the outcome, so a curve with no point confirmed at its first level
    asks nothing beyond that level.

    >>> answers = {("c=1", 0.01): False, ("c=4", 0.01): True, ("c=16", 0.01): False,
    ...            ("c=1", 0.015): False, ("c=4", 0.015): True, ("c=16", 0.015): True,
    ...            ("c=1", 0.03): False, ("c=4", 0.03): True, ("c=16", 0.03): True}
    >>> sd = step_down(["c=1", "c=4", "c=16"], 0.01, lambda p, a: answers[(p, round(a, 6))])
    >>> sorted(sd.confirmed.items())
    [('c=16', 0.015), ('c=4', 0.01)]
    """
    pts = tuple(points)
    if len(set(pts)) != len(pts) or not pts:
        raise ValueError(f"step_down: the points must be distinct and at least one, got {pts!r}")
    if not (0.0 < first < 0.5):
        raise ValueError(f"step_down: the first level must be in (0, 0.5), got {first!r}")
    k = len(pts)
    asked: list[tuple[str, float, bool]] = []
    seen: dict[tuple[str, int], bool] = {}
    probe = StepDown(first, pts, (), {})

    def ask(p: str, s: int) -> bool:
        if (p, s) not in seen:
            seen[(p, s)] = bool(confirms(p, probe.level(s)))
            asked.append((p, probe.level(s), seen[(p, s)]))
        return seen[(p, s)]

    alive = list(pts)  # the points no unrejected intersection holds yet
    for s in range(k, 0, -1):
        mine = {p: ask(p, s) for p in alive}
        if all(mine.values()):
            continue  # each is in R_s itself
        count, need = sum(mine.values()), k - s + 1  # R_s with more than k - s points rejects every J of size s
        for p in pts:
            if count >= need:
                break
            if p not in mine:
                count += ask(p, s)
        if count < need:
            alive = [p for p in alive if mine[p]]
        if not alive:
            break
    confirmed = {p: min(probe.level(s) for (q, s), ok in seen.items() if q == p and ok) for p in alive}
    return StepDown(first, pts, tuple(asked), confirmed)
