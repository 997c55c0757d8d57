"""One answer for a load curve, in words that follow from its points' verdicts.

A curve is a hypothesis asked at several load points (``sweep:``): one verdict per
point (each a hypothesis of its own, ``hid@concurrency=4``), their family's error
held across the points. This module reads the points' verdicts, in the sweep's
order, and says what they show together:

- ``tok_s lower at every point``;
- ``tok_s lower from concurrency=16 up`` (and undecided below);
- ``tok_s higher up to concurrency=4, lower from concurrency=16: it crosses between
  concurrency=4 and concurrency=16``;
- ``no point decided``.

A point *shows* a direction only where its verdict says so: confirmed (the claimed
direction, by at least the claimed size), or refuted with its whole interval on the
other side of no change (the opposite direction). A refuted point whose interval
holds no change shows nothing, and neither does an inconclusive one: the words never
claim more than a point's verdict.

Pure: no I/O; the executor stores the answer (:meth:`CurveAnswer.to_json`) and the
report reads it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from bisect_harness.model import Expect, Outcome

__all__ = ["CurveAnswer", "PointVerdict", "answer"]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class PointVerdict:
    """One point's verdict as the curve reads it: its label (``concurrency=4``), the
    hypothesis id that holds it, its outcome, ratio (treatment / baseline) and interval."""

    label: str
    hypothesis: str
    outcome: Outcome
    ratio: float | None = None
    ci: tuple[float, float] | None = None

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
                "ratio": self.ratio, "ci": list(self.ci) if self.ci is not None else None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PointVerdict":
        ci = d.get("ci")
        return cls(label=str(d["label"]), hypothesis=str(d.get("hypothesis", "")), outcome=Outcome(d["outcome"]),
                   ratio=d.get("ratio"), ci=(float(ci[0]), float(ci[1])) if ci else None)


@dataclass(frozen=True)
class CurveAnswer:
    """What a curve's points show together: ``words`` (a sentence), ``shape`` (``every``,
    ``from``, ``up_to``, ``crosses``, ``mixed``, ``none``), ``crossing`` (the two labels
    it crosses between, where it does) and ``largest`` (the label of the point whose
    confirmed effect is largest: where ``bisect`` and ``explain`` look by default)."""

    curve: str
    metric: str
    expect: Expect
    points: tuple[PointVerdict, ...]
    words: str
    shape: str
    crossing: tuple[str, str] | None = None
    largest: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "curve": self.curve, "metric": self.metric,
                "expect": self.expect.value, "points": [p.to_json() for p in self.points], "words": self.words,
                "shape": self.shape, "crossing": list(self.crossing) if self.crossing else None,
                "largest": self.largest}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "CurveAnswer":
        crossing = d.get("crossing")
        return cls(curve=str(d["curve"]), metric=str(d["metric"]), expect=Expect(d["expect"]),
                   points=tuple(PointVerdict.from_json(p) for p in d.get("points") or ()), words=str(d["words"]),
                   shape=str(d["shape"]), crossing=(crossing[0], crossing[1]) if crossing else None,
                   largest=d.get("largest"))


def _way(expect: Expect, sign: int) -> str:
    up = (expect is Expect.INCREASE) == (sign > 0)
    return "higher" if up else "lower"


def _largest(points: Sequence[PointVerdict], expect: Expect) -> str | None:
    confirmed = [p for p in points if p.outcome is Outcome.CONFIRMED and p.ratio is not None]
    if not confirmed:
        return None
    best = max(confirmed, key=lambda p: p.ratio if expect is Expect.INCREASE else -p.ratio)
    return best.label


def answer(curve: str, metric: str, expect: Expect, points: Sequence[PointVerdict]) -> CurveAnswer:
    """The curve's answer from its points' verdicts, ``points`` in the sweep's order
    (its axis ascending). See the module docstring for the words."""
    pts = tuple(points)
    signs = [p.shows(expect) for p in pts]
    largest = _largest(pts, expect)

    def made(words: str, shape: str, crossing: tuple[str, str] | None = None) -> CurveAnswer:
        return CurveAnswer(curve, metric, expect, pts, words, shape, crossing, largest)

    claim, other = _way(expect, 1), _way(expect, -1)
    if not pts or not any(signs):
        return made("no point decided", "none")
    if all(s == 1 for s in signs):
        return made(f"{metric} {claim} at every point", "every")
    if all(s == -1 for s in signs):
        return made(f"{metric} {other} at every point", "every")
    decided = [(i, s) for i, s in enumerate(signs) if s]
    runs: list[tuple[int, int, int]] = []  # (sign, first index, last index) of the decided points, in order
    for i, s in decided:
        if runs and runs[-1][0] == s:
            runs[-1] = (s, runs[-1][1], i)
        else:
            runs.append((s, i, i))
    n = len(pts)
    if len(runs) == 1:
        s, first, last = runs[0]
        way = _way(expect, s)
        undecided = [p.label for p, x in zip(pts, signs) if not x]
        gaps = [k for k in range(first, last + 1) if not signs[k]]
        if not gaps and last == n - 1:
            return made(f"{metric} {way} from {pts[first].label} up (undecided at {', '.join(undecided)})", "from")
        if not gaps and first == 0:
            return made(f"{metric} {way} up to {pts[last].label} (undecided at {', '.join(undecided)})", "up_to")
    if len(runs) == 2:
        (s1, a1, b1), (s2, a2, b2) = runs
        if not any(signs[k] for k in range(b1 + 1, a2)):  # two runs of opposite sign, nothing between
            low = pts[b1].label
            high = pts[a2].label
            head = f"{_way(expect, s1)} up to {low}" if a1 == 0 else f"{_way(expect, s1)} at {_labels(pts, a1, b1)}"
            tail = f"{_way(expect, s2)} from {high}" if b2 == n - 1 else f"{_way(expect, s2)} at {_labels(pts, a2, b2)}"
            return made(f"{metric} {head}, {tail}: it crosses between {low} and {high}", "crosses", (low, high))
    parts = []
    for s in (1, -1):
        at = [p.label for p, x in zip(pts, signs) if x == s]
        if at:
            parts.append(f"{_way(expect, s)} at {', '.join(at)}")
    undecided = [p.label for p, x in zip(pts, signs) if not x]
    tail = f"; undecided at {', '.join(undecided)}" if undecided else ""
    return made(f"{metric} " + "; ".join(parts) + tail, "mixed")


def _labels(pts: Sequence[PointVerdict], first: int, last: int) -> str:
    return ", ".join(p.label for p in pts[first:last + 1])
