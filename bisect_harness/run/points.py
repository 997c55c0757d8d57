"""Which load point a search reads, on a file that sweeps points: ``--at``, or the point
of a curve's largest confirmed effect.

Every boot of a file with a sweep measures every point (boots are shared), and a
search (``harness bisect``, ``harness explain``, a run's ``bisect: true`` and
``explain: true``) compares one point's values. ``--at LABEL`` (``--at
concurrency=32``) names it. Without it a curve is searched where its effect is
largest: ``report.curve_view.default_point`` of the curve as the newest ``harness
run`` of this file (same path or same text) in the ledger recorded it (its stored
answer's ``largest``, else the confirmed point farthest in the claimed direction,
read from the verdict rows). A run's own ``bisect: true`` search reads its own
rows, so a curve is bisected once, at that point, not once per point. Nothing here
decides a verdict: it reads the ones recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from bisect_harness.errors import UserError
from bisect_harness.record.ledger import Ledger, Run
from bisect_harness.report import curve_view
from bisect_harness.run.resume import spec_hash
from bisect_harness.spec import HypothesisSpec, Spec

__all__ = ["PointChoice", "curve_hypothesis", "default_points", "search_point"]


@dataclass(frozen=True)
class PointChoice:
    """The load point a search reads (``label``; None: the benchmark's one point, a file
    without a sweep) and how it was chosen (``why``), said before the search starts."""

    label: str | None
    why: str


def _curves(spec: Spec) -> dict[str, tuple[HypothesisSpec, ...]]:
    """The file's curves: curve id -> its point hypotheses, in the file's order."""
    out: dict[str, list[HypothesisSpec]] = {}
    for h in spec.hypotheses:
        if h.curve is not None and h.point is not None:
            out.setdefault(h.curve, []).append(h)
    return {k: tuple(v) for k, v in out.items()}


def _labels(hs) -> str:
    return ", ".join(h.point_label for h in hs)


def curve_hypothesis(spec: Spec, ledger: Ledger, curve: str, at: str | None) -> tuple[HypothesisSpec, PointChoice]:
    """The point hypothesis of ``curve`` (``<curve>@<label>``) at ``at``, or without it at
    the point of the curve's largest confirmed effect in the newest run of the file;
    a UserError naming the curve's points where ``at`` is not one of them, or where no
    run confirmed any."""
    hs = _curves(spec).get(curve)
    if not hs:
        raise UserError(f"{curve!r} is no load curve of {spec.path.name}; its curves: "
                        f"{', '.join(_curves(spec)) or 'none (no hypothesis has a sweep:)'}")
    by_label = {h.point_label: h for h in hs}
    if at is not None:
        if at not in by_label:
            raise UserError(f"--at {at}: no such point of curve {curve} in {spec.path.name}; its points: "
                            f"{_labels(hs)} (write one as it is written there, e.g. --at {hs[-1].point_label})")
        return by_label[at], PointChoice(at, f"--at {at}")
    found = _recorded(spec, ledger, curve)
    label = found[1] if found else None
    if label is None or label not in by_label:
        raise UserError(f"curve {curve}: no run of {spec.path.name} in the ledger {ledger.url} confirmed a point of it, "
                        f"so it has no point of largest effect to look at; name one with --at (its points: "
                        f"{_labels(hs)})")
    run = found[0]
    return by_label[label], PointChoice(label, f"the point of curve {curve}'s largest confirmed effect in run {run.id}")


def search_point(spec: Spec, ledger: Ledger, metric: str, at: str | None) -> PointChoice:
    """The point ``harness bisect --metric METRIC`` reads: none on a file without a sweep
    (``--at`` refused there); ``at``, where it is one of the file's points; else the
    point of the largest confirmed effect among the file's curves on ``metric``, as
    the newest run of each recorded it (the farthest from no change where they
    differ). A UserError naming the points where none can be chosen."""
    labels = tuple(p.label for p in spec.points)
    if not labels:
        if at is not None:
            raise UserError(f"--at {at}: {spec.path.name} sweeps no load points (no hypothesis has a sweep:), so "
                            "every boot measures its one benchmark point; drop --at")
        return PointChoice(None, "the benchmark's one point")
    if at is not None:
        if at not in labels:
            raise UserError(f"--at {at}: no such load point in {spec.path.name}; its points: {', '.join(labels)}")
        return PointChoice(at, f"--at {at}")
    best: tuple[float, str, str] | None = None
    for curve, hs in _curves(spec).items():
        if hs[0].metric != metric:
            continue
        found = _recorded(spec, ledger, curve)
        if found is None or found[1] is None:
            continue
        run, label, ratio = found
        size = abs(math.log(ratio)) if ratio and ratio > 0 else 0.0
        if best is None or size > best[0]:
            best = (size, label, f"the point of curve {curve}'s largest confirmed effect in run {run.id}")
    if best is None:
        raise UserError(f"{spec.path.name} sweeps load points ({', '.join(labels)}) and no run of it in the ledger "
                        f"{ledger.url} confirmed a point of a curve on {metric}: name the point to bisect at with "
                        "--at (e.g. --at " + labels[-1] + ")")
    return PointChoice(best[1], best[2])


def _recorded(spec: Spec, ledger: Ledger, curve: str) -> tuple[Run, str | None, float | None] | None:
    """The newest ``harness run`` of this file (same path, or same text) that recorded
    ``curve``: (the run, its default point, that point's ratio); None where none did."""
    here, text = _resolved(spec.path), spec_hash(spec.text)
    for run in ledger.session.scalars(select(Run).where(Run.kind == "run").order_by(Run.id.desc())).all():
        if _resolved(run.spec_path) != here and run.spec_hash != text:
            continue
        found = next((c for c in curve_view.curves_of(run) if c.id == curve), None)
        if found is None:
            continue
        label = curve_view.default_point(found)
        ratio = next((p.ratio for p in found.points if p.label == label), None)
        return run, label, ratio
    return None


def default_points(run: Run) -> dict[str, str | None]:
    """Per curve of ``run``, the point its ``bisect: true`` and ``explain: true`` searches
    run at (``curve_view.default_point`` of the run's own rows): one search per curve."""
    return {c.id: curve_view.default_point(c) for c in curve_view.curves_of(run)}


def _resolved(path) -> Path | None:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError, TypeError):
        return None
