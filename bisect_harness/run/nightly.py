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
"""

from __future__ import annotations

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
class NightlyOutcome:
    """What one night found. ``status``: ``first-night`` (nothing to compare yet),
    ``ok``, ``regression`` or ``broken`` (tonight's commit failed to build or boot)."""

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
                "findings": findings_to_json(self.findings)}


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
    min_effect, alpha, window = options.min_effect, options.alpha, options.window
    run = ex.run
    if st.failed:
        return NightlyOutcome(run.id, sha, metric, "broken", 0, None, None, (), None,
                              f"tonight's commit {sha[:12]} could not be measured: {st.failed}")
    history = ledger.nightly_history(series_key(ex.spec, arm), before_run=run.id)
    # After an alert the level it found is the new normal: compare with that night onwards.
    last_alert = max((i for i, (r, _, _) in enumerate(history) if r.status == "alert"), default=0)
    history = history[last_alert:]
    nights = [(r, c, [list(v) for v in ledger.boot_values(boots, metric).values]) for r, c, boots in history]
    nights = [n for n in nights if n[2]][-window:]
    newest = [list(v) for v in ledger.boot_values(st.good_boots, metric).values]
    if len(nights) < 2 or not newest:
        return NightlyOutcome(run.id, sha, metric, "first-night", len(nights), None, None, (), None,
                              f"{len(nights)} earlier night(s) of this series to compare with; the test needs 2 "
                              "(the spread between nights is its noise); tonight is recorded as a reference")
    rule = NightRule([n[2] for n in nights], newest, worse=worse, min_effect=min_effect, alpha=alpha, window=window)
    if rule.wants_fresh_boots:  # an alert must survive fresh boots of tonight's commit, up to the budget
        budget = ex.spec.defaults.max_boots_per_arm
        ex.measure([st], max(0, budget - len(st.good_boots)), metric=metric, budget=max(0, budget - len(st.boots)))
        rule.record([list(v) for v in ledger.boot_values(st.good_boots, metric).values])
    shift = rule.shift
    reference = nights[-1][1]
    last_boots = [b for r, c, boots in history if r.id == nights[-1][0].id for b in boots]
    drift = tuple(d.message for d in host_drift(boot_records(last_boots), boot_records(st.good_boots)))
    thresholds = ex.spec.defaults.host_thresholds
    findings = tuple(host_state.contention_findings({"last night": last_boots, "tonight": st.boots}, thresholds)
                     + host_state.calibration_findings([run], thresholds))
    if not shift.regressed:
        return NightlyOutcome(run.id, sha, metric, "ok", len(nights), shift, reference, drift, None, shift.reason,
                              findings)
    outcome = None
    reason = shift.reason
    if options.bisect and reference and reference != sha:
        commits = ex.ws.commits_between(reference, sha)
        outcome = search_commits(ex, commits, SearchTarget(metric, worse, env=arm.env, flags=arm.flags),
                                 options.search())
        reason += (f"; culprit {outcome.culprit[:12]} (p={outcome.leader_probability:.2f})" if outcome.culprit
                   else f"; bisection ended {outcome.stopped}")
    elif reference == sha:
        reason += "; same commit as the last night: the host or environment moved (see drift)"
    return NightlyOutcome(run.id, sha, metric, "regression", len(nights), shift, reference, drift, outcome, reason,
                          findings)
