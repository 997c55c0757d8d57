"""A load curve as people read it: its answer as stored, its points' table and plot, its ``--json``.

A curve is one hypothesis asked at several load points (``sweep:``), expanded into
one hypothesis per point (``spec-wins@concurrency=4``), each with verdict rows of
its own; the executor stores the curve's answer (``decide.curve.CurveAnswer``: words
that follow from the points' verdicts, its shape, where it crosses, the point of its
largest confirmed effect) in ``runs.summary["curves"]``. This module reads both back
and decides nothing: a run whose answer is not stored (one from before curves were
answered, or one still going) reads :data:`NOT_RECORDED`, never an answer worked
out here.

- :func:`curves_of`: a run's curves (:class:`Curve`), each point with its verdict
  row's figures and each arm's boot means at that point;
- :func:`default_point`: where ``harness bisect`` and ``harness explain`` look on a
  curve when no ``--at`` names a point: the stored answer's ``largest``; where none
  is stored, the confirmed point whose ratio lies farthest in the claimed direction,
  read from the verdict rows (reading, not deciding: a verdict row is a decision
  already made);
- :func:`section`: the journal's block of a curve (:class:`CurveSection`), its
  plot drawn by ``plots.plot_curve``; :func:`curve_line`: its summary line;
- :func:`curve_json`: a curve in ``harness run --json`` (``cli.outputs``' ``curve``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from bisect_harness.decide.curve import CurveAnswer
from bisect_harness.model import Outcome, shown_outcome
from bisect_harness.record.ledger import boot_records
from bisect_harness.report import plots, reproduce
from bisect_harness.report.cells import effect, fmt, md

__all__ = ["NOT_RECORDED", "Curve", "CurvePoint", "CurveRow", "CurveSection", "axis_of", "curve_json", "curve_line",
           "curves_of", "default_point", "memberships", "section", "stored_answers"]

#: What the page and ``--json`` say of a curve whose answer the run did not store.
NOT_RECORDED = "curve answer not recorded"

#: The swept axes whose values are drawn on a log scale once they span more than :data:`LOG_SPAN`.
LOG_AXES = ("concurrency", "request_rate")
LOG_SPAN = 8.0


def stored_answers(run) -> dict[str, CurveAnswer]:
    """The curves' answers ``run`` stored (``runs.summary["curves"]``: each a
    ``CurveAnswer.to_json``, as a list or keyed by curve id), by curve id; {} where none is."""
    summary = run.summary if isinstance(run.summary, Mapping) else {}
    stored = summary.get("curves") or []
    items = stored.values() if isinstance(stored, Mapping) else stored
    answers = (CurveAnswer.from_json(d) for d in items if isinstance(d, Mapping))
    return {a.curve: a for a in answers}


def memberships(run, answers: Mapping[str, CurveAnswer] | None = None) -> dict[int, tuple[str, str, dict]]:
    """Per hypothesis row id of ``run`` that is a point of a curve: (curve id, point label,
    the point's settings), as its row holds them (``spec["curve"]``, ``spec["point"]``),
    else as a stored answer names its hypothesis (settings then unknown: {})."""
    answers = stored_answers(run) if answers is None else answers
    named = {p.hypothesis: (a.curve, p.label) for a in answers.values() for p in a.points}
    out = {}
    for h in run.hypotheses:
        spec = h.spec if isinstance(h.spec, Mapping) else {}
        point = spec.get("point") if isinstance(spec.get("point"), Mapping) else None
        if spec.get("curve") and point is not None:
            out[h.id] = (str(spec["curve"]), str(point["label"]), dict(point.get("settings") or {}))
        elif h.hid in named:
            out[h.id] = (*named[h.hid], {})
    return out


@dataclass(frozen=True)
class CurvePoint:
    """One point of a curve as its verdict row holds it: the point's ``label`` and
    ``settings``, the hypothesis (id and row) that holds it, its verdict (``outcome``
    as the verdict table shows it, whether it is ``final``, ``ratio`` treatment /
    baseline, ``ci``), and each arm's boot means at the point over the boots the
    verdict used."""

    label: str
    settings: Mapping[str, Any]
    hypothesis: str
    row_id: int
    outcome: str
    final: bool
    ratio: float | None
    ci: tuple[float, float] | None
    baseline: tuple[float, ...]
    treatment: tuple[float, ...]


@dataclass(frozen=True)
class Curve:
    """A run's curve: its id, metric, claim (``expect``, ``min_effect``), its points in
    the sweep's order, and its ``answer`` as stored (None: not recorded)."""

    id: str
    metric: str
    expect: str
    min_effect: float
    points: tuple[CurvePoint, ...]
    answer: CurveAnswer | None

    def labels(self) -> tuple[str, ...]:
        return tuple(p.label for p in self.points)


def curves_of(run) -> list[Curve]:
    """The curves of ``run``, in the order their first point's hypothesis comes; each
    curve's points in its stored answer's order (the sweep's), else in the rows' order."""
    answers = stored_answers(run)
    member = memberships(run, answers)
    rows: dict[str, list] = {}
    for h in run.hypotheses:
        if h.id in member:
            rows.setdefault(member[h.id][0], []).append(h)
    out = []
    for curve, hs in rows.items():
        answer = answers.get(curve)
        points = [_point(h, *member[h.id][1:]) for h in hs]
        if answer is not None:
            order = {p.label: i for i, p in enumerate(answer.points)}
            points.sort(key=lambda p: order.get(p.label, len(order)))
        first = hs[0]
        out.append(Curve(id=curve, metric=first.metric, expect=first.expect, min_effect=first.min_effect,
                         points=tuple(points), answer=answer))
    return out


def _point(h, label: str, settings: Mapping[str, Any]) -> CurvePoint:
    v = h.verdict
    means = {}
    for side, cfg in (("baseline", h.baseline), ("treatment", h.treatment)):
        used = set((v.baseline_boot_ids if side == "baseline" else v.treatment_boot_ids) or []) if v else set()
        boots = [b for b in cfg.boots if b.id in used and b.status == "ok"]
        vals = (rec.values(h.metric, point=label) for rec in boot_records(boots))
        means[side] = tuple(sum(x) / len(x) for x in vals if x)
    ci = (v.ci_low, v.ci_high) if v is not None and v.ci_low is not None and v.ci_high is not None else None
    return CurvePoint(label=label, settings=dict(settings), hypothesis=h.hid, row_id=h.id, outcome=shown_outcome(v),
                      final=bool(v is not None and v.final),
                      ratio=v.ratio if v is not None else None, ci=ci, baseline=means["baseline"],
                      treatment=means["treatment"])


def default_point(curve: Curve) -> str | None:
    """The point a search looks at on ``curve`` without ``--at``: the stored answer's
    ``largest`` (None where it confirmed no point); where no answer is stored, the
    point whose final verdict is confirmed with its ratio farthest in the claimed
    direction, as its verdict row holds it; None where no point is confirmed."""
    if curve.answer is not None:
        return curve.answer.largest
    confirmed = [p for p in curve.points
                 if p.final and p.outcome == Outcome.CONFIRMED.value and p.ratio is not None]
    if not confirmed:
        return None
    sign = 1.0 if curve.expect == "increase" else -1.0
    return max(confirmed, key=lambda p: sign * p.ratio).label


# --------------------------------------------------------------------------- the journal's block


@dataclass(frozen=True)
class CurveRow:
    """One point in a curve's table: its label, hypothesis, each arm's mean of its boot
    means, the ratio with its interval, the verdict (and whether it differs from the
    point before: ``changes``)."""

    point: str
    hypothesis: str
    baseline: str
    treatment: str
    ratio: str
    verdict: str
    changes: bool


@dataclass(frozen=True)
class CurveSection:
    """A curve as the page prints it, before its points' own sections: its claim, its
    answer's words as stored (or :data:`NOT_RECORDED`), the point searches look at by
    default where the answer names one, the table of points and the plot."""

    id: str
    metric: str
    claim: str
    words: str
    recorded: bool
    largest: str | None
    rows: tuple[CurveRow, ...]
    plot: str | None
    plot_missing: str | None


def section(curve: Curve, *, plots_dir: Path | None, stem: str, unit: str) -> CurveSection:
    """The journal's block of ``curve``; its plot written into ``plots_dir`` (None: no
    plot) as ``<stem>-curve-<id>.png``."""
    rows, before = [], None
    for p in curve.points:
        rows.append(CurveRow(point=md(p.label), hypothesis=md(p.hypothesis), baseline=_mean_cell(p.baseline, unit),
                             treatment=_mean_cell(p.treatment, unit),
                             ratio=effect(p.ratio, *(p.ci or (None, None))), verdict=p.outcome,
                             changes=before is not None and p.outcome != before))
        before = p.outcome
    plot, missing = _plot(curve, plots_dir, stem, unit)
    return CurveSection(id=curve.id, metric=curve.metric, claim=_claim(curve), words=md(_words(curve)),
                        recorded=curve.answer is not None, largest=curve.answer.largest if curve.answer else None,
                        rows=tuple(rows), plot=plot, plot_missing=missing)


def curve_line(curve: Curve) -> str:
    """The summary's line of a curve: ``curve `spec-wins` (tok_s, increase >= 10%, 4 points):
    tok_s higher up to concurrency=4, lower from concurrency=16: it crosses between ...``."""
    return md(f"curve `{curve.id}` ({curve.metric}, {_claim(curve)}, {len(curve.points)} points): "
              f"**{_words(curve)}**")


def _words(curve: Curve) -> str:
    return curve.answer.words if curve.answer is not None else NOT_RECORDED


def _claim(curve: Curve) -> str:
    size = f"{curve.min_effect:.0%}" if curve.min_effect >= 0.01 else f"{curve.min_effect:.1%}"
    return f"{curve.expect} >= {size}"


def _mean_cell(means: Sequence[float], unit: str) -> str:
    if not means:
        return "no boot used"
    return f"{fmt(sum(means) / len(means), 2)}{' ' + unit if unit else ''} ({len(means)} boots)"


def axis_of(points: Sequence[CurvePoint]) -> tuple[str | None, tuple[float | None, ...], bool]:
    """The swept axis of ``points``: the one setting whose value differs between them,
    where it is a number at every point (its name, each point's value, and whether a
    log scale shows it: concurrency or request rate spanning more than
    :data:`LOG_SPAN` times); else (None, Nones, False): the points are placed in order."""
    keys = sorted({k for p in points for k in p.settings})
    varying = [k for k in keys if len({repr(p.settings.get(k)) for p in points}) > 1]
    if len(varying) != 1:
        return None, tuple(None for _ in points), False
    axis = varying[0]
    values = [p.settings.get(axis) for p in points]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        return None, tuple(None for _ in points), False
    xs = tuple(float(v) for v in values)
    log = axis in LOG_AXES and min(xs) > 0 and max(xs) / min(xs) > LOG_SPAN
    return axis, xs, log


def _plot(curve: Curve, plots_dir: Path | None, stem: str, unit: str) -> tuple[str | None, str | None]:
    if plots_dir is None:
        return None, None
    axis, xs, log = axis_of(curve.points)
    drawn_points = [plots.CurvePlotPoint(tick=f"{x:g}" if axis is not None else p.label, x=x,
                                         baseline=p.baseline, treatment=p.treatment, ratio=p.ratio, ci=p.ci,
                                         outcome=p.outcome) for p, x in zip(curve.points, xs)]
    size = curve.min_effect
    threshold = (1.0 + size if curve.expect == "increase" else 1.0 - size) if size else None
    try:
        drawn = plots.plot_curve(drawn_points, Path(plots_dir) / f"{stem}-curve-{reproduce.file_part(curve.id)}.png",
                                 title=f"curve {curve.id}: {curve.metric} ({_claim(curve)}) at each load point",
                                 metric=curve.metric, unit=unit, axis=axis, log=log, threshold=threshold)
    except plots.PlotNotWritten as exc:  # a full disk: the journal says what is missing
        return None, md(str(exc))
    return (drawn.name if drawn else None), None


# --------------------------------------------------------------------------- --json


def curve_json(curve: Curve) -> dict:
    """A curve in ``harness run --json``: each point's verdict (from its row), grouped
    under the curve, and the stored answer's words, shape, crossing and largest (null
    where the run stored none: :data:`NOT_RECORDED`)."""
    a = curve.answer
    return {"curve": curve.id, "metric": curve.metric, "expect": curve.expect, "min_effect": curve.min_effect,
            "points": [{"label": p.label, "hypothesis": p.hypothesis, "verdict": p.outcome, "effect": p.ratio,
                        "ci": list(p.ci) if p.ci is not None else None,
                        "baseline_mean": _mean(p.baseline), "treatment_mean": _mean(p.treatment)}
                       for p in curve.points],
            "answer": None if a is None else {"words": a.words, "shape": a.shape,
                                              "crossing": list(a.crossing) if a.crossing else None,
                                              "largest": a.largest},
            "answer_note": None if a is not None else NOT_RECORDED}


def _mean(means: Sequence[float]) -> float | None:
    return sum(means) / len(means) if means else None
