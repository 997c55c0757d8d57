"""``harness nightly``: one night of a fixed experiment, compared with the nights before.

Each night measures the engine's newest commit (the hypotheses file's engine, base
env and flags) for ``boots_per_arm`` boots and stores it as a ``nightly`` run. The
series is the config without its commit (same env, flags, launch, benchmark), so
nights at different commits line up. The newest night is tested against the last
``window`` nights since the last alert (``shift.detect_shift``), each night one
value (the median of its log boot means): nights differ by more than their boots
do (a 2% night-to-night CV is common), so boots of different nights are not
independent replicates. The test
needs two earlier nights at least (until then the status is ``first-night``).
More boots tonight would not narrow the spread between nights, which is what
bounds it, so there is no sequential sampling; but an alert must survive fresh
boots of tonight's commit up to the budget (``decide.NightRule``), so a night whose
few boots stalled together does not alert. A regression is bisected at once between the
last good night's commit and tonight's, reusing every boot the ledger already
holds, and the run ends with status ``alert`` so the CI job can fail loudly. A
commit that no longer builds or boots is an alert too.

A file that sweeps load points measures them all in every boot, and each point is a
series of its own (``report.series.point_series``: the config's series and the
point's label): each is judged against its own earlier nights (from its own last
alert), at ``alpha`` shared by Bonferroni over the points, so a night's false-alert
rate stays ``alpha`` however many points it watches. The night names the point that
regressed most (``NightlyOutcome.point``: its figures are the outcome's), says each
point's answer (``points``), and bisects at that point.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from bisect_harness.run.bisect_runner import BisectOutcome, MeasureSetup, SearchTarget, engine_plan, search_commits
from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.defaults import DEFAULT_CONFIDENCE, NIGHTLY_MAX_BOOTS
from bisect_harness.observe import host_state
from bisect_harness.errors import UserError
from bisect_harness.evidence import Finding, findings_to_json
from bisect_harness.decide.verdict import NightRule
from bisect_harness.observe.drift import host_drift
from bisect_harness.run.scheduler import ConfigState, Scheduler
from bisect_harness.record.ledger import Ledger, boot_records
from bisect_harness.model import Arm, Expect
from bisect_harness.plan.build import make_config, series_key
from bisect_harness.spec import Spec
from bisect_harness.decide.shift import Shift
from bisect_harness.report.series import alerted_at, point_series


@dataclass(frozen=True)
class NightlyOptions:
    """What one night measures and how it judges: the commit ``rev`` (resolved in
    ``engine.repo``), the ``metric`` watched, the least relative regression that alerts
    (``min_effect``, 0.05 for 5%), the false-alert rate per night (``alpha``), the
    earlier nights compared (``window``, at least 2), whether a regression is bisected
    (``bisect``, with ``confidence`` and a budget of ``max_boots`` new boots; the
    search's least change is ``min_effect``) and whether the host is probed before
    and after (``calibrate``)."""

    rev: str = "HEAD"
    metric: str = "tok_s"
    min_effect: float = 0.05
    alpha: float = 0.01
    window: int = 7
    bisect: bool = True
    max_boots: int = NIGHTLY_MAX_BOOTS
    confidence: float = DEFAULT_CONFIDENCE
    calibrate: bool = True

    def __post_init__(self):
        if self.bisect:
            self.search()  # its budget and confidence checked before tonight's boots, not after

    def search(self) -> SearchOptions:
        """The options of the night's bisection."""
        return SearchOptions(confidence=self.confidence, max_boots=self.max_boots, min_effect=self.min_effect)


@dataclass(frozen=True)
class PointNight:
    """One load point's night: its ``point`` (label; None: the benchmark's one point),
    its ``series`` (``report.series.point_series``), its ``status`` (``first-night``,
    ``ok`` or ``regression``), the earlier nights it was compared with, its shift and
    the sentence that says it."""

    point: str | None
    series: str
    status: str
    nights_compared: int
    shift: Shift | None
    reason: str
    reference_commit: str | None = None

    def to_json(self) -> dict:
        s = self.shift
        return {"point": self.point, "series": self.series, "status": self.status,
                "nights_compared": self.nights_compared, "reference_commit": self.reference_commit,
                "ratio": s.ratio if s else None, "ci": list(s.ci) if s else None,
                "p_value": s.p_value if s else None, "reason": self.reason}


@dataclass(frozen=True)
class NightlyOutcome:
    """What one night found. ``status``: ``first-night`` (nothing to compare yet),
    ``ok``, ``regression`` or ``broken`` (tonight's commit failed to build or boot).
    On a file that sweeps load points, ``point`` is the point the night names (the one
    that regressed most, else the nearest to alerting) whose figures these are, and
    ``points`` each point's night."""

    run_id: int
    commit: str
    metric: str
    status: str
    nights_compared: int
    shift: Shift | None
    reference_commit: str | None
    drift: tuple[str, ...]
    bisection: BisectOutcome | None
    reason: str
    findings: tuple[Finding, ...] = ()  # contention of either night's boots, noisy calibration, a busy preflight
    point: str | None = None
    points: tuple[PointNight, ...] = ()

    @property
    def warnings(self) -> tuple[str, ...]:
        """The findings' sentences, in order."""
        return tuple(f.text for f in self.findings)

    @property
    def alert(self) -> bool:
        return self.status in ("regression", "broken")

    def to_json(self) -> dict:
        s = self.shift
        return {"run_id": self.run_id, "commit": self.commit, "metric": self.metric, "status": self.status,
                "alert": self.alert, "nights_compared": self.nights_compared,
                "reference_commit": self.reference_commit,
                "ratio": s.ratio if s else None, "ci": list(s.ci) if s else None, "p_value": s.p_value if s else None,
                "test": "one-sided prediction t-test, each night one value" if s else None,
                "df": s.df if s else None,
                "drift": list(self.drift), "reason": self.reason,
                "bisection": self.bisection.to_json() if self.bisection else None, "warnings": list(self.warnings),
                "findings": findings_to_json(self.findings), "point": self.point,
                "points": [p.to_json() for p in self.points]}


def run_nightly(spec: Spec, ledger: Ledger, options: NightlyOptions, setup: MeasureSetup
                ) -> tuple[NightlyOutcome, Scheduler]:
    """``harness nightly``: measure ``options.rev``, judge it against the nights before
    and bisect a regression (see the module's docstring). The outcome is stored as the
    run's summary; the run ends ``alert`` where the outcome alerts."""
    if options.window < 2:
        raise UserError(f"--window {options.window}: the nightly test compares tonight with at least 2 earlier "
                        "nights (their spread is its noise); pass --window 2 or more (7 is the default)")
    m, plan = engine_plan(spec, options.metric, setup.cache_dir, "a nightly run")
    sha = plan.ws.resolve(options.rev, where="--rev")
    ex = setup.scheduler(plan, ledger, calibrate=options.calibrate)
    with ex.recording("nightly") as run:
        ex.record_calibration("before")
        arm = Arm(commit=sha, env=dict(spec.engine.env), flags=dict(spec.engine.flags))
        st = ex.state_for(make_config(spec, arm))
        ex.boot_round([st], spec.defaults.boots_per_arm)
        outcome = _judge(ex, st, arm, m.worse, options)
        ex.record_calibration("after")
    run.summary = outcome.to_json()
    ex.finish_run("alert" if outcome.alert else "done")
    return outcome, ex


def _judge(ex: Scheduler, st: ConfigState, arm: Arm, worse: Expect, options: NightlyOptions) -> NightlyOutcome:
    ledger, sha, metric = ex.ledger, arm.commit, options.metric
    run = ex.run
    if st.failed:
        return NightlyOutcome(run.id, sha, metric, "broken", 0, None, None, (), None,
                              f"tonight's commit {sha[:12]} could not be measured: {st.failed}")
    series = series_key(ex.spec, arm)
    history = ledger.nightly_history(series, before_run=run.id)
    labels = [p.label for p in ex.spec.points] or [None]
    alpha = options.alpha / len(labels)  # Bonferroni over the points: a night's false-alert rate stays alpha
    looks = {label: _look(ledger, st, history, label, worse, options, alpha) for label in labels}
    wanting = [label for label, (rule, _) in looks.items() if rule is not None and rule.wants_fresh_boots]
    if wanting:  # an alert must survive fresh boots of tonight's commit, up to the budget (shared by the points)
        budget = ex.spec.defaults.max_boots_per_arm
        ex.measure([st], max(0, budget - len(st.good_boots)), metric=metric, budget=max(0, budget - len(st.boots)),
                   point=wanting[0])
        for label in wanting:
            looks[label][0].record([list(v) for v in ledger.boot_values(st.good_boots, metric, point=label).values])
    nights = tuple(_point_night(series, label, rule, found, len(labels)) for label, (rule, found) in looks.items())
    named = _named(nights)
    swept = labels != [None]
    _, last_night, _ = looks[named.point][1]
    last_boots = [b for r, c, boots in history if r.id == last_night for b in boots]
    drift = tuple(d.message for d in host_drift(boot_records(last_boots), boot_records(st.good_boots)))
    thresholds = ex.spec.defaults.host_thresholds
    findings = tuple(host_state.contention_findings({"last night": last_boots, "tonight": st.boots}, thresholds)
                     + host_state.calibration_findings([run], thresholds))
    reason = named.reason
    if swept:
        others = [f"{p.point} {p.status}" for p in nights if p is not named]
        reason = f"at {named.point}: {reason}" + (f" (the other points: {', '.join(others)})" if others else "")
    outcome = NightlyOutcome(run.id, sha, metric, named.status, named.nights_compared, named.shift,
                             named.reference_commit, drift if named.shift else (), None, reason,
                             findings if named.shift else (), point=named.point if swept else None,
                             points=nights if swept else ())
    if named.status != "regression":
        return outcome
    reference = named.reference_commit
    bisection = None
    if options.bisect and reference and reference != sha:
        commits = ex.ws.commits_between(reference, sha)
        bisection = search_commits(ex, commits, SearchTarget(metric, worse, env=arm.env, flags=arm.flags,
                                                             point=named.point), options.search())
        reason += (f"; culprit {bisection.culprit[:12]} (p={bisection.leader_probability:.2f})" if bisection.culprit
                   else f"; bisection ended {bisection.stopped}")
    elif reference == sha:
        reason += "; same commit as the last night: the host or environment moved (see drift)"
    return dataclasses.replace(outcome, bisection=bisection, reason=reason)


def _look(ledger: Ledger, st: ConfigState, history, label: str | None, worse: Expect, options: NightlyOptions,
          alpha: float) -> tuple[NightRule | None, tuple]:
    """One point's first look: its rule (None where it has fewer than two earlier nights or
    no value tonight) and (the nights compared, the last one's run id and commit)."""
    metric = options.metric
    # After an alert at this point the level it found is the new normal: compare with that night onwards.
    last_alert = max((i for i, (r, _, _) in enumerate(history) if alerted_at(r, label)), default=0)
    nights = [(r, c, [list(v) for v in ledger.boot_values(boots, metric, point=label).values])
              for r, c, boots in history[last_alert:]]
    nights = [n for n in nights if n[2]][-options.window:]
    newest = [list(v) for v in ledger.boot_values(st.good_boots, metric, point=label).values]
    found = (len(nights), nights[-1][0].id if nights else None, nights[-1][1] if nights else None)
    if len(nights) < 2 or not newest:
        return None, found
    return NightRule([n[2] for n in nights], newest, worse=worse, min_effect=options.min_effect, alpha=alpha,
                     window=options.window), found


def _point_night(series: str, label: str | None, rule: NightRule | None, found: tuple, points: int) -> PointNight:
    n, _, reference = found
    key = point_series(series, label)
    if rule is None:
        return PointNight(label, key, "first-night", n, None,
                          f"{n} earlier night(s) of this series to compare with; the test needs 2 (the spread "
                          "between nights is its noise); tonight is recorded as a reference")
    shift = rule.shift
    reason = shift.reason + (f" (alpha shared by {points} load points)" if points > 1 else "")
    return PointNight(label, key, "regression" if shift.regressed else "ok", n, shift, reason, reference)


def _named(nights) -> PointNight:
    """The point a night names: the one that regressed most, else the one nearest to
    alerting (the smallest p-value), else the first (every point a first night)."""
    regressed = [p for p in nights if p.status == "regression"]
    if regressed:
        return max(regressed, key=lambda p: abs(math.log(p.shift.ratio)) if p.shift.ratio > 0 else 0.0)
    compared = [p for p in nights if p.shift is not None]
    if compared:
        return min(compared, key=lambda p: p.shift.p_value)
    return nights[0]
