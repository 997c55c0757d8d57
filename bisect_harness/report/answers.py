"""A run's answers as CI reads them: what each verdict means for the job, read from the ledger.

The short forms CI shows (``report.github``'s step summary and pull-request comment,
``report.junit``'s test cases) say the same thing of a verdict, so they read it
here, once. Nothing is decided anew: a verdict row is a decision already made, and
its reading (:class:`Reading`) follows from two stored facts, its outcome and the
direction it claimed against the direction the metric gets worse in:

- *regression*: confirmed, and the claim was the metric's worse direction (tok/s
  lower, latency higher): the treatment is worse by at least the minimum effect;
- *improvement*: confirmed in the metric's better direction;
- *refuted*: confidently smaller than the minimum effect, or the other way;
- *undetermined*: inconclusive, never measured, not decided, or a confirmed claim
  whose metric's direction the ledger does not hold (a row from before metric
  definitions were stored, whose file no longer loads): said, never guessed.

A night (``harness nightly``) is read from the outcome the night stored as its run's
summary (``run.nightly.NightlyOutcome.to_json``): :func:`night_of`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from bisect_harness.model import CLIENT_METRICS, Better, Expect, Outcome, shown_outcome
from bisect_harness.report import curve_view
from bisect_harness.report.cells import effect
from bisect_harness.report.reproduce import experiment_name
from bisect_harness.report.summary_view import verdict_lead

__all__ = ["HypothesisAnswer", "NightAnswer", "PointAnswer", "Reading", "answers_of", "experiment_of", "night_of",
           "run_commits"]


class Reading(str, enum.Enum):
    """What a verdict means for a CI job (see the module's docstring)."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    REFUTED = "refuted"
    UNDETERMINED = "undetermined"


@dataclass(frozen=True)
class HypothesisAnswer:
    """One hypothesis of a run (one point of a curve: ``id@label``) as its verdict row
    holds it: the claim (``metric``, ``expect``, ``min_effect``), the metric's worse
    direction (``worse``; None where the ledger does not say), the verdict as the table
    shows it (``outcome``) and its lead sentence (``lead``: ``Confirmed: 1.90x [1.80,
    2.01], 3 boots per arm.``), its figures, its reason, and its curve and point."""

    hid: str
    metric: str
    expect: str
    min_effect: float
    worse: Expect | None
    outcome: str
    lead: str
    ratio: float | None
    ci: tuple[float, float] | None
    p_value: float | None
    boots: tuple[int, int]
    reason: str
    warnings: tuple[str, ...]
    curve: str | None = None
    point: str | None = None

    @property
    def claim(self) -> str:
        """``decode_ms increase >= 10%``: what the hypothesis claimed before measuring."""
        return f"{self.metric} {self.expect} >= {self.min_effect:.0%}"

    @property
    def effect(self) -> str:
        """The ratio treatment / baseline with its interval (``cells.effect``)."""
        return effect(self.ratio, *(self.ci or (None, None)))

    @property
    def reading(self) -> Reading:
        if self.outcome == Outcome.REFUTED.value:
            return Reading.REFUTED
        if self.outcome != Outcome.CONFIRMED.value or self.worse is None:
            return Reading.UNDETERMINED
        return Reading.REGRESSION if self.expect == self.worse.value else Reading.IMPROVEMENT

    @property
    def why_undetermined(self) -> str:
        """Why a verdict reads undetermined: its reason, or that the ledger does not say
        which way the metric gets worse."""
        if self.outcome == Outcome.CONFIRMED.value and self.worse is None:
            return (f"confirmed, but the ledger does not say whether higher or lower {self.metric} is better, "
                    "so it is neither a regression nor an improvement here")
        return self.reason or self.outcome


def answers_of(run) -> tuple[HypothesisAnswer, ...]:
    """Every hypothesis of ``run`` in the ledger's order, read (see the module's docstring)."""
    points = curve_view.memberships(run)
    out = []
    for h in run.hypotheses:
        v = h.verdict
        curve, point = points[h.id][:2] if h.id in points else (None, None)
        out.append(HypothesisAnswer(
            hid=h.hid, metric=h.metric, expect=h.expect, min_effect=h.min_effect, worse=_worse(run, h),
            outcome=shown_outcome(v), lead=verdict_lead(v),
            ratio=v.ratio if v is not None else None,
            ci=(v.ci_low, v.ci_high) if v is not None and v.ci_low is not None else None,
            p_value=v.p_value if v is not None else None,
            boots=(len(v.baseline_boot_ids or []), len(v.treatment_boot_ids or [])) if v is not None else (0, 0),
            reason=(v.reason if v is not None else "no verdict was recorded (the run stopped early)"),
            warnings=tuple(v.warnings or ()) if v is not None else (), curve=curve, point=point))
    return tuple(out)


def _worse(run, h) -> Expect | None:
    """The direction ``h``'s metric gets worse in: from the metric's definition its row
    stored, else from the run's file as the ledger holds it, else a client metric's."""
    spec = h.spec if isinstance(h.spec, Mapping) else {}
    better = (spec.get("metric_def") or {}).get("better") if isinstance(spec.get("metric_def"), Mapping) else None
    if better in (Better.HIGHER.value, Better.LOWER.value):
        return Expect.DECREASE if better == Better.HIGHER.value else Expect.INCREASE
    from bisect_harness.errors import HarnessError
    from bisect_harness.spec import parse_spec

    try:
        metrics = parse_spec(run.spec_text, Path(run.spec_path)).metrics()
    except HarnessError:
        metrics = CLIENT_METRICS
    return metrics[h.metric].worse if h.metric in metrics else None


def run_commits(run) -> tuple[str, ...]:
    """The commits ``run``'s configs measured, each once, in the configs' order."""
    return tuple(dict.fromkeys(c.commit for c in run.configs if c.commit))


def experiment_of(run) -> str:
    """The experiment's name (the journal's: ``reproduce.experiment_name``)."""
    return experiment_name(run.spec_path)


@dataclass(frozen=True)
class PointAnswer:
    """One load point's night (``run.nightly.PointNight.to_json``): its label (None: the
    benchmark's one point), series, status, the nights it was compared with, its ratio
    tonight / the earlier nights with its interval and p-value, and its sentence."""

    point: str | None
    series: str | None
    status: str
    nights_compared: int
    reference_commit: str | None
    ratio: float | None
    ci: tuple[float, float] | None
    p_value: float | None
    reason: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "PointAnswer":
        ci = d.get("ci")
        return cls(point=d.get("point"), series=d.get("series"), status=str(d["status"]),
                   nights_compared=int(d.get("nights_compared") or 0), reference_commit=d.get("reference_commit"),
                   ratio=d.get("ratio"), ci=(ci[0], ci[1]) if ci else None, p_value=d.get("p_value"),
                   reason=str(d.get("reason") or ""))

    @property
    def effect(self) -> str:
        return effect(self.ratio, *(self.ci or (None, None)))


@dataclass(frozen=True)
class NightAnswer:
    """A night as it stored itself: tonight's ``commit``, the ``metric`` watched, its
    ``status`` (``first-night``, ``ok``, ``regression``, ``broken``) and whether it
    alerted, the figures of the point it names (``night``), each point's night
    (``points``; one for a file of one point), what its bisection found (``bisection``,
    the stored answer) and what it warned of (host ``drift``, ``warnings``), and the
    change points found over the series where the night looked (``changepoints``)."""

    run_id: int
    experiment: str
    commit: str
    metric: str
    status: str
    alert: bool
    night: PointAnswer
    points: tuple[PointAnswer, ...]
    bisection: Mapping[str, Any] | None
    drift: tuple[str, ...]
    warnings: tuple[str, ...]
    changepoints: Mapping[str, Any] | None
    series: str | None

    @property
    def swept(self) -> bool:
        return any(p.point is not None for p in self.points)


def night_of(run) -> NightAnswer:
    """The night ``run`` (a ``nightly`` run) stored as its summary. A run that stored none
    (one still going, or one that failed before judging) raises ``UserError`` naming it."""
    from bisect_harness.errors import UserError

    s = run.summary if isinstance(run.summary, Mapping) else {}
    if run.kind != "nightly" or "status" not in s:
        raise UserError(f"run {run.id} holds no nightly answer (kind {run.kind}, status {run.status}); "
                        "the CI forms of a night read what `harness nightly` stored")
    series = next((c.series for c in run.configs if c.series), None)
    from bisect_harness.report.series import point_series

    night = PointAnswer.from_json({**s, "series": point_series(series, s.get("point")) if series else None})
    points = tuple(PointAnswer.from_json(p) for p in s.get("points") or ()) or (night,)
    return NightAnswer(run_id=run.id, experiment=experiment_of(run), commit=str(s.get("commit") or ""),
                       metric=str(s.get("metric") or ""), status=str(s["status"]), alert=bool(s.get("alert")),
                       night=night, points=points, bisection=s.get("bisection"), drift=tuple(s.get("drift") or ()),
                       warnings=tuple(s.get("warnings") or ()), changepoints=s.get("changepoints"), series=series)

