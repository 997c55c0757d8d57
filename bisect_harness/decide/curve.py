"""One answer for a load curve, in words that follow from its points' verdicts.

A curve is a hypothesis asked at several load points (``sweep:``): one verdict per
point (each a hypothesis of its own, ``hid@concurrency=4``), their family's error
held across the points. This module reads the points' verdicts, in the sweep's
order, and says what they show together:

- ``tok_s lower at every point``;
- ``tok_s lower from concurrency=16 up (undecided at concurrency=4)``;
- ``tok_s higher up to concurrency=4, lower from concurrency=16: it crosses between
  concurrency=4 and concurrency=16``;
- ``tok_s not higher by the claimed size up to concurrency=1, higher from
  concurrency=4: it crosses between concurrency=1 and concurrency=4``;
- ``no point decided``.

Each point is in one of four states, read from its verdict alone: *claim*
(confirmed: the claimed direction, by at least the claimed size), *opposite*
(refuted, its whole interval on the other side of no change), *short* (refuted
otherwise: confidently less than the claimed size) and *undecided* (inconclusive).
The curve crosses between two neighbouring decided points of different states when
the decided points make exactly two runs; an undecided point is named as such and
never counted on either side: the words never claim more than a point's verdict.

Pure: no I/O; the executor stores the answer (:meth:`CurveAnswer.to_json`) and the
report reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from bisect_harness.model import Better, Expect, Outcome

__all__ = ["CurveAnswer", "PointVerdict", "answer"]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class PointVerdict:
    """One point's verdict as the curve reads it: its label (``concurrency=4``), the
    hypothesis id that holds it, its outcome, ratio (treatment / baseline) and interval,
    and ``alpha``, the level its verdict stands at (its share of the family's alpha, or
    more where the curve's step-down confirmed it: ``decide.multiplicity.step_down``)."""

    label: str
    hypothesis: str
    outcome: Outcome
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    alpha: float | None = None

    def shows(self, expect: Expect) -> int:
        """+1: the claimed direction (confirmed); -1: the opposite (refuted, its interval
        wholly on the other side of 1); 0: no direction decided."""
        if self.outcome is Outcome.CONFIRMED:
            return 1
        if self.outcome is Outcome.REFUTED and self.ci is not None:
            lo, hi = self.ci
            if (expect is Expect.DECREASE and lo > 1.0) or (expect is Expect.INCREASE and hi < 1.0):
                return -1
        return 0

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "hypothesis": self.hypothesis, "outcome": self.outcome.value,
                "ratio": self.ratio, "ci": list(self.ci) if self.ci is not None else None, "alpha": self.alpha}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PointVerdict":
        ci = d.get("ci")
        return cls(label=str(d["label"]), hypothesis=str(d.get("hypothesis", "")), outcome=Outcome(d["outcome"]),
                   ratio=d.get("ratio"), ci=(float(ci[0]), float(ci[1])) if ci else None, alpha=d.get("alpha"))


@dataclass(frozen=True)
class CurveAnswer:
    """What a curve's points show together: ``words`` (a sentence), ``shape`` (``every``,
    ``from``, ``up_to``, ``crosses``, ``mixed``, ``none``), ``crossing`` (the two labels
    it crosses between, where it does), ``largest`` (the label of the point whose
    confirmed effect is largest: where ``bisect`` and ``explain`` look by default) and
    ``better``, the metric's better direction (None where not told), for a reader that
    says "worse" and "better" where the words say "lower" and "higher"."""

    curve: str
    metric: str
    expect: Expect
    points: tuple[PointVerdict, ...]
    words: str
    shape: str
    crossing: tuple[str, str] | None = None
    largest: str | None = None
    better: Better | None = None

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "curve": self.curve, "metric": self.metric,
                "expect": self.expect.value, "points": [p.to_json() for p in self.points], "words": self.words,
                "shape": self.shape, "crossing": list(self.crossing) if self.crossing else None,
                "largest": self.largest, "better": self.better.value if self.better is not None else None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CurveAnswer":
        crossing = d.get("crossing")
        return cls(curve=str(d["curve"]), metric=str(d["metric"]), expect=Expect(d["expect"]),
                   points=tuple(PointVerdict.from_json(p) for p in d.get("points") or ()), words=str(d["words"]),
                   shape=str(d["shape"]), crossing=(crossing[0], crossing[1]) if crossing else None,
                   largest=d.get("largest"), better=Better(d["better"]) if d.get("better") else None)


def _way(expect: Expect, sign: int) -> str:
    up = (expect is Expect.INCREASE) == (sign > 0)
    return "higher" if up else "lower"


def _largest(points: Sequence[PointVerdict], expect: Expect) -> str | None:
    confirmed = [p for p in points if p.outcome is Outcome.CONFIRMED and p.ratio is not None]
    if not confirmed:
        return None
    best = max(confirmed, key=lambda p: p.ratio if expect is Expect.INCREASE else -p.ratio)
    return best.label


def _state(p: PointVerdict, expect: Expect) -> str:
    """``claim`` (confirmed), ``opposite`` (refuted, its interval wholly the other side
    of 1), ``short`` (refuted otherwise: confidently less than the claimed size) or
    ``undecided`` (inconclusive)."""
    shows = p.shows(expect)
    if shows:
        return "claim" if shows > 0 else "opposite"
    return "short" if p.outcome is Outcome.REFUTED else "undecided"


def answer(curve: str, metric: str, expect: Expect, points: Sequence[PointVerdict], *,
           better: Better | None = None) -> CurveAnswer:
    """The curve's answer from its points' verdicts, ``points`` in the sweep's order
    (its axis ascending). See the module docstring for the words; ``better`` (the
    metric's better direction) is kept with the answer, not read by the words."""
    pts = tuple(points)
    states = [_state(p, expect) for p in pts]
    largest = _largest(pts, expect)
    said = {"claim": f"{_way(expect, 1)}", "opposite": f"{_way(expect, -1)}",
            "short": f"not {_way(expect, 1)} by the claimed size"}

    def made(words: str, shape: str, crossing: tuple[str, str] | None = None) -> CurveAnswer:
        return CurveAnswer(curve, metric, expect, pts, words, shape, crossing, largest, better)

    decided = [(i, s) for i, s in enumerate(states) if s != "undecided"]
    undecided = [p.label for p, s in zip(pts, states) if s == "undecided"]
    tail = f" (undecided at {', '.join(undecided)})" if undecided else ""
    if not decided:
        return made("no point decided", "none")
    runs: list[tuple[str, int, int]] = []  # (state, first index, last index) of the decided points, in order
    for i, s in decided:
        if runs and runs[-1][0] == s:
            runs[-1] = (s, runs[-1][1], i)
        else:
            runs.append((s, i, i))
    if len(runs) == 1:
        s = runs[0][0]
        if not undecided:
            return made(f"{metric} {said[s]} at every point", "every")
        first, last = runs[0][1], runs[0][2]
        inside = [k for k in range(first, last + 1) if states[k] == "undecided"]
        if not inside and last == len(pts) - 1 and first > 0:
            return made(f"{metric} {said[s]} from {pts[first].label} up{tail}", "from")
        if not inside and first == 0 and last < len(pts) - 1:
            return made(f"{metric} {said[s]} up to {pts[last].label}{tail}", "up_to")
        return made(f"{metric} {said[s]} at {_labels(pts, [i for i, x in decided])}{tail}", "some")
    if len(runs) == 2:
        (s1, a1, b1), (s2, a2, b2) = runs
        low, high = pts[b1].label, pts[a2].label
        head = f"{said[s1]} up to {low}" if a1 == 0 else f"{said[s1]} at {_labels(pts, range(a1, b1 + 1))}"
        rest = f"{said[s2]} from {high}" if b2 == len(pts) - 1 else f"{said[s2]} at {_labels(pts, range(a2, b2 + 1))}"
        return made(f"{metric} {head}, {rest}: it crosses between {low} and {high}{tail}", "crosses", (low, high))
    parts = [f"{said[s]} at {_labels(pts, [i for i, x in decided if x == s])}"
             for s in ("claim", "opposite", "short") if any(x == s for _, x in decided)]
    return made(f"{metric} " + "; ".join(parts) + tail, "mixed")


def _labels(pts: Sequence[PointVerdict], indices) -> str:
    return ", ".join(pts[i].label for i in indices if pts[i] is not None)
