"""Drive the pure bisection search with real boots, recorded in the ledger.

The search (``bisection.BisectionSearch``) asks for a commit and a number of
boots; here each ask becomes boots of that commit's config through the scheduler,
every one of them committed to the ledger as it is measured. Boots already in the
ledger for the same config on the same host (an earlier run, the hypothesis that
found the regression, or a bisection that was killed) are fed to the search
first, so a bisection resumes where it stopped and never boots again what the
posterior already has. They feed the posterior only: the endpoint check that opens the
search, and the head-to-head test that closes it, are made of paired rounds (see
``bisection``). The one exception is ``bisect: true``: its verdict's paired rounds of
the two endpoints open the endpoint check (``endpoint_rounds``), since the search
exists only because that verdict confirmed; the head-to-head test is always booted
fresh, so the boots that selected a regression never confirm its culprit.

Before each search starts the run says what it plans to need and what it has
(``decide.bisect.budget``: at least so many boots to name a culprit, about so many at the
step expected) and, where it has fewer than the least, that it cannot finish and
by how much to raise ``--max-boots``. A search over releases is given its share
of the budget only (``decide.bisect.budget.release_share``: what the commit stage plans
to need is kept for it); the commit stage gets what the release stage left, and
is not started where that is below its least (the descent note says so).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from bisect_harness.observe import host_state
from bisect_harness.decide.bisect.budget import StagePlan, plan_stage, release_share
from bisect_harness.decide.bisect.result import BisectResult, SearchTest, StopReason
from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.decide.bisect.search import BisectionSearch
from bisect_harness.decide.paired_sequential import PairedTest
from bisect_harness.backends import Backend
from bisect_harness.defaults import DEFAULT_MAX_BOOTS
from bisect_harness.errors import UserError
from bisect_harness.evidence import Finding, findings_to_json
from bisect_harness.run import points
from bisect_harness.run.scheduler import Observer, Scheduler
from bisect_harness.record.ledger import Bisection, Boot, HypothesisRow, Ledger, Probe
from bisect_harness.model import Arm, Expect, Metric, reused_from
from bisect_harness.plan.build import Plan, PlannedHypothesis, check_bisectable, make_config
from bisect_harness.spec import Spec


@dataclass(frozen=True)
class BisectOutcome:
    """What a search found, as ``harness bisect --json`` prints it (:meth:`to_json`) and
    the ledger's ``bisections.result`` holds it (:meth:`to_record`).

    ``culprit``: the commit (or release) named, or None where the search named none
    (its ``stopped`` says why). ``leader``: the first commit of the most probable block
    (``candidate_set``), named or not; ``leader_probability``: that block's posterior
    mass (the commit's own where the block is one commit). A named culprit is the
    leader; a leader is no culprit until named.
    """

    culprit: str | None
    leader: str | None
    leader_probability: float
    candidates: tuple
    candidate_set: tuple[str, ...]
    boots: int
    new_boots: int
    skipped: tuple[str, ...]
    stopped: str
    bisection_id: int
    findings: tuple[Finding, ...] = ()  # busy boots, a busy preflight, noisy calibration (``_host_findings``)
    no_step_probability: float = 0.0
    endpoint_test: dict | None = None
    verify_test: dict | None = None
    tests: tuple[dict, ...] = ()     # every paired test the search ran, with its boots (``_tests_json``)
    reused_runs: tuple[int, ...] = ()  # the runs whose boots fed the posterior (this one's rounds, earlier ones)
    undetermined: dict | None = None   # stopped "undetermined": the busy boots, what would decide it
    releases: bool = False             # the revisions searched were releases (engine.releases), not commits
    descent: "BisectOutcome | None" = None  # then the commits between the culprit release and the one before
    descent_note: str | None = None    # why there was no descent into commits, where there was none
    descent_owed: bool = False         # a descent was possible but the budget left could not finish it
    point: str | None = None           # the load point whose values it compared (None: the one point)
    plan: dict | None = None           # what the search planned to need, and the boots it was given
    step_sd: float | None = None       # the step it measured over the boots' noise sd (plans the next stage)
    verdict_rounds: tuple[tuple[int, int], ...] = ()  # a verdict's paired rounds (good, bad boot) that opened the endpoint check

    @property
    def warnings(self) -> tuple[str, ...]:
        """The findings' sentences, in order."""
        return tuple(f.text for f in self.findings)

    def named(self) -> bool:
        """Whether the run named its culprit: a commit, or a release and then (where a
        descent into its commits was due) the commit."""
        if self.culprit is None:
            return False
        if self.descent is not None:
            return self.descent.named()
        return not self.descent_owed

    def to_json(self) -> dict:
        """The ``--json`` answer (``cli.outputs``' ``bisect`` schema, less its version)."""
        return self._json(record=False)

    def to_record(self) -> dict:
        """What ``bisections.result`` holds: the ``--json`` answer, and ``probability``
        (the leader's posterior, under the key every stored row has had and the journal
        reads), so rows written before and after this read alike."""
        return self._json(record=True)

    def _json(self, *, record: bool) -> dict:
        descent = None
        if self.descent is not None:
            descent = self.descent.to_record() if record else self.descent.to_json()
        return {"culprit": self.culprit, "leader": self.leader, "leader_probability": self.leader_probability,
                **({"probability": self.leader_probability} if record else {}),
                "candidates": [{"commit": c.commit, "probability": c.probability} for c in self.candidates],
                "candidate_set": list(self.candidate_set), "boots": self.boots, "new_boots": self.new_boots,
                "skipped": list(self.skipped), "stopped": self.stopped, "bisection_id": self.bisection_id,
                "no_step_probability": self.no_step_probability, "endpoint_test": self.endpoint_test,
                "verify_test": self.verify_test, "tests": list(self.tests), "reused_runs": list(self.reused_runs),
                "undetermined": self.undetermined, "warnings": list(self.warnings),
                "findings": findings_to_json(self.findings), "plan": self.plan,
                "verdict_rounds": [list(r) for r in self.verdict_rounds], "point": self.point,
                **({"revisions": "releases", "descent": descent,
                    "descent_note": self.descent_note} if self.releases else {})}


def _test_json(test: PairedTest | None) -> dict | None:
    if test is None:
        return None
    return {"pairs": test.pairs, "mean": test.mean if math.isfinite(test.mean) else None,
            "p_value": test.p_value, "alpha_per_look": test.alpha_per_look, "decision": test.decision,
            "upper": test.upper if math.isfinite(test.upper) else None, "below": test.below}


def _tests_json(tests: Sequence[SearchTest], boots: dict[int, list[int]]) -> tuple[dict, ...]:
    """Each paired test as ``--json`` and the journal show it: which, between which
    commits, its decision and figures, and the boots of its rounds (this run's)."""
    return tuple({"test": t.number, "kind": t.kind, "good": t.good, "bad": t.bad, **_test_json(t.test),
                  "boot_ids": sorted(boots.get(t.number, []))} for t in tests)


@dataclass(frozen=True)
class MeasureSetup:
    """Where and how a command boots, whatever it searches: ``log_dir`` for the boot
    logs, ``cache_dir`` for worktrees, builds and environments (None: the user cache),
    the progress ``observer``, ``wait_quiet_s`` (wait up to so long for a quiet host
    before the first boot; None: no wait), the ``backend`` (None: local, one slot) and
    ``order_seed`` (the order of boots; None: a fresh one, stored with the run)."""

    log_dir: Path
    cache_dir: Path | None = None
    observer: Observer | None = None
    wait_quiet_s: float | None = None
    backend: Backend | None = None
    order_seed: int | None = None

    def scheduler(self, plan: Plan, ledger: Ledger, *, calibrate: bool = False) -> Scheduler:
        """The scheduler of ``plan`` with this setup (``calibrate``: probe the host before and after)."""
        return Scheduler(plan, ledger, log_dir=self.log_dir, observer=self.observer, calibrate=calibrate,
                         order_seed=self.order_seed, wait_quiet_s=self.wait_quiet_s, backend=self.backend)


@dataclass(frozen=True)
class BisectRequest:
    """What ``harness bisect`` asks: the first revision whose ``metric`` moved between
    ``good`` and ``bad`` (commits, tags or branches of ``engine.repo``, or two versions
    of ``engine.releases``). ``search``: its ``confidence``, ``max_boots`` (the whole
    command's budget of new boots, both stages of a release search together) and
    ``min_effect``; the runner sets its width from the backend's slots.
    ``first_parent``: follow only the first parent of merges. ``fresh``: new boots only
    (boots of earlier runs do not feed the posterior). ``at``: on a file that sweeps
    load points, the point whose values are compared (``--at concurrency=32``); None:
    the point of the largest confirmed effect of the file's curves on ``metric``
    (``run.points.search_point``)."""

    good: str
    bad: str
    metric: str = "tok_s"
    search: SearchOptions = SearchOptions(max_boots=DEFAULT_MAX_BOOTS)
    first_parent: bool = False
    fresh: bool = False
    at: str | None = None


@dataclass(frozen=True)
class SearchTarget:
    """What one search measures at each revision: ``metric``, the direction ``expect``
    it moved from the good end to the bad, the ``env`` and ``flags`` of every
    revision's arm; ``releases``: the revisions are versions of ``engine.releases``
    (each its installed build), not commits; ``hypothesis_id``: the hypothesis the
    search belongs to (None: a search of its own); ``point``: the load point whose
    values it reads (its label; None: the benchmark's one point)."""

    metric: str
    expect: Expect
    env: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, str] = field(default_factory=dict)
    releases: bool = False
    hypothesis_id: int | None = None
    point: str | None = None


@dataclass(frozen=True)
class SearchStart:
    """What a search starts from and says before its first boot. ``fresh``: no boots
    of earlier runs feed its posterior. ``endpoint_rounds``: (good boot id, bad boot id)
    of paired rounds of the two endpoints made before (a confirmed verdict's): they
    open the endpoint check. ``stage``: its name in the plan it says (default:
    ``bisection``, or ``release stage``); ``total_boots``: the command's whole budget
    that its ``max_boots`` is a share of (default: its own); ``step_sd``: the step
    expected, over the boots' noise sd (from a stage before it)."""

    fresh: bool = False
    endpoint_rounds: tuple[tuple[int, int], ...] = ()
    stage: str | None = None
    total_boots: int | None = None
    step_sd: float | None = None


def engine_plan(spec: Spec, metric: str, cache_dir: Path | None, purpose: str,
                need_repo: bool = True) -> tuple[Metric, Plan]:
    """The metric and the engine's plan (its workspace made once) for a command that
    walks commits, or a UserError naming what is missing."""
    metrics = spec.metrics()
    if metric not in metrics:
        raise UserError(f"--metric {metric!r} is not a metric of {spec.path.name}; known: {', '.join(sorted(metrics))}")
    plan = Plan.for_engine(spec, cache_dir)
    if plan.ws is None and need_repo:
        raise UserError(f"{spec.path.name} has no engine.repo: {purpose} needs the engine's git repository")
    return metrics[metric], plan


def search_commits(sched: Scheduler, commits: Sequence[str], target: SearchTarget, options: SearchOptions,
                   start: SearchStart = SearchStart()) -> BisectOutcome:
    """Bisect ``commits`` (good first, bad last) for ``target`` with the sched's engine
    and benchmark. ``options``: the search's ``confidence``, ``min_effect`` (the
    endpoint check ends *not reproduced* once the change is shown smaller; None: any
    change) and ``max_boots``, the new boots it may book; its width is the backend's
    slots, and boots fed from the ledger raise its own budget by as many. Finished
    boots of the same configs on this host, from earlier runs, feed the posterior
    (never the paired tests) unless ``start.fresh``. Before the first boot it says its
    plan (``start``: its stage, the budget it is a share of, the step expected).

    Long because it is the search's one story, read top to bottom: the commits' builds,
    the search stepped round by round through the one measuring call, the reused boots,
    the stop, the answer; its steps share the search and the scheduler's state."""
    metric, expect, env, flags, releases = target.metric, target.expect, target.env, target.flags, target.releases
    point = target.point
    max_boots = options.max_boots
    spec, ledger = sched.spec, sched.ledger
    bis = ledger.add(Bisection(run_id=sched.run.id, hypothesis_id=target.hypothesis_id, good=commits[0],
                               bad=commits[-1], metric=metric, commits=list(commits)))

    def arm(rev: str) -> Arm:
        if releases:
            return Arm(commit=None, release=rev, env=dict(env), flags=dict(flags))
        return Arm(commit=rev, env=dict(env), flags=dict(flags))

    def subject(rev: str) -> str:
        if releases:
            return f"{spec.engine.releases.package} {rev}"
        return sched.ws.subject(rev) if sched.ws else ""

    sched.obs.search_started("bisection", max_boots, reference=arm(commits[0]))  # its configs: their commits
    configs = {sha: make_config(spec, arm(sha)) for sha in commits}
    quiet = spec.defaults.search_samples == "quiet"
    opening = _opening_rounds(ledger, start.endpoint_rounds, metric, quiet, point)
    in_rounds = {i for ids, _ in opening for i in ids}
    reused_total = 0
    observed: dict[str, tuple[list[float], list[Boot]]] = {}
    for sha, pc in configs.items():
        if start.fresh:
            break
        found = [b for b in ledger.reusable_boots(pc.key, sched.host_fp) if b.id not in in_rounds]
        got = ledger.boot_values(found, metric, quiet=quiet, point=point)
        if got.boot_ids:
            by_id = {b.id: b for b in found}
            observed[sha] = list(got.means()), [by_id[i] for i in got.boot_ids]
            reused_total += len(got.boot_ids)
    search = BisectionSearch(list(commits), expect=expect, options=dataclasses.replace(
        options, max_boots=max(2, max_boots + reused_total + 2 * len(opening)), width=max(1, sched.backend.slots)))
    stage_plan = plan_stage(len(commits), search.options, start.step_sd)
    for line in plan_lines(start.stage or ("release stage" if releases else "bisection"), stage_plan, max_boots,
                           start.total_boots or max_boots):
        sched.obs.message(line)
    reused_runs: set[int] = set()
    for sha, (values, boots) in observed.items():
        search.observe(sha, values)
        runs = sorted({b.run_id for b in boots})
        reused_runs.update(runs)
        ledger.add(Probe(bisection_id=bis.id, commit=sha, boots_requested=0, values=values, reused=len(values),
                         note=f"{subject(sha)} | from run{'s' if len(runs) > 1 else ''} {', '.join(map(str, runs))}",
                         purpose="reused", boot_ids=[b.id for b in boots]))
    if reused_runs:
        sched.obs.message(f"bisection: {reused_total} boots {reused_from(sorted(reused_runs), sched.run.id)}"
                          " feed the posterior, not its paired tests (`harness bisect --fresh` bisects with new boots only)")
    test_boots: dict[int, list[int]] = {}
    for k, ((good_id, bad_id), (good_v, bad_v)) in enumerate(opening):
        search.observe_endpoint_round(good_v, bad_v)
        test_boots.setdefault(0, []).extend((good_id, bad_id))
        for sha, i, v in ((commits[0], good_id, good_v), (commits[-1], bad_id, bad_v)):
            ledger.add(Probe(bisection_id=bis.id, commit=sha, boots_requested=0, values=[v], reused=1,
                             note=f"{subject(sha)} | the verdict's round {k + 1}", purpose="endpoints", boot_ids=[i]))
    if opening:
        sched.obs.message(f"bisection: the verdict's {len(opening)} paired rounds of the two endpoints open its "
                          "endpoint check (it boots more rounds only where they do not decide it)")
    stop, new_boots, searched = _search_loop(sched, search, configs, bis, subject, target, max_boots, test_boots)
    res: BisectResult = search.result()
    stopped = stop or res.stopped
    undetermined = None
    if stopped is StopReason.NOT_REPRODUCED:  # "no step" is a finding only where the host could tell
        undetermined = _busy_verdict(sched, configs.values(), searched, stopped)
        if undetermined is not None:
            stopped = StopReason.UNDETERMINED
    outcome = BisectOutcome(
        culprit=res.culprit, leader=res.leader, leader_probability=float(res.leader_probability),
        candidates=res.candidates,
        candidate_set=tuple(res.candidate_set), boots=res.boots_used, new_boots=new_boots,
        skipped=tuple(s for s, _ in res.skipped), stopped=stopped.value, bisection_id=bis.id,
        findings=tuple(_host_findings(sched, configs.values())),
        no_step_probability=float(res.no_step_probability), endpoint_test=_test_json(res.endpoint_test),
        verify_test=_test_json(res.verify_test), tests=_tests_json(res.tests, test_boots),
        reused_runs=tuple(sorted(reused_runs)), undetermined=undetermined, releases=releases,
        plan={**stage_plan.to_json(), "budget": max_boots}, step_sd=_step_sd(res),
        verdict_rounds=tuple(ids for ids, _ in opening), point=point)
    bis.status = "done" if stopped != StopReason.RUNNING else "running"
    bis.result = outcome.to_record()
    ledger.commit()
    return outcome


def _opening_rounds(ledger: Ledger, rounds: Sequence[tuple[int, int]], metric: str, quiet: bool,
                    point: str | None = None) -> list[tuple[tuple[int, int], tuple[float, float]]]:
    """The rounds that open an endpoint check: ((good id, bad id), (good value, bad
    value)) per round whose two boots both have a value of ``metric`` (at load point
    ``point``) as the search counts it (their quiet samples where ``quiet``); a round
    with a side without one is left out."""
    out = []
    for good_id, bad_id in rounds:
        boots = [ledger.session.get(Boot, good_id), ledger.session.get(Boot, bad_id)]
        if any(b is None for b in boots):
            continue
        got = ledger.boot_values(boots, metric, quiet=quiet, point=point)
        if got.boot_ids == (good_id, bad_id):
            means = got.means()
            out.append(((good_id, bad_id), (float(means[0]), float(means[1]))))
    return out


def _search_loop(sched: Scheduler, search: BisectionSearch, configs, bis: Bisection, subject, target: SearchTarget,
                 max_boots: int, test_boots: dict[int, list[int]]) -> tuple[StopReason | None, int, set[int]]:
    """The search's rounds until it stops: each round's probes booted, recorded as
    probe rows and observed (each paired test's boots added to ``test_boots``), each
    boot's values those of the target's metric at its load point. Returns
    (the stop the loop made itself, or None where the search stopped on its own; boots
    booked; every boot it booked)."""
    ledger = sched.ledger
    metric, point = target.metric, target.point
    searched: set[int] = set()
    new_boots = step = 0
    stop: StopReason | None = None
    while (rnd := search.next_round()) is not None:
        if new_boots >= max_boots:
            stop = StopReason.BUDGET
            break
        # A round's probes are booted in the order the search gives (interleaved in
        # time: a probe beside an anchor, the two sides of a paired round), one boot
        # of each probe per pass; a pass runs at once where the backend has slots
        # (on 8 single-GPU slots, 8 commits are probed together). The measuring call
        # owns retries and the failure policy; the budget counts every boot.
        states = [sched.state_for(configs[probe.commit]) for probe in rnd]
        got = sched.measure(states, [probe.boots for probe in rnd], metric=metric, budget=max_boots - new_boots,
                            point=point)
        booked = sum(m.booted for m in got)
        new_boots += booked
        results: list[list[float] | None] = []
        for probe, m in zip(rnd, got):
            note = subject(probe.commit)  # its purpose has a column of its own
            if m.unmeasurable:
                search.skip(probe.commit, m.unmeasurable)  # stepped over for good: its block widens the set
                note = f"{note} | unmeasurable: {m.unmeasurable}"
            elif m.usable < m.asked:
                note = f"{note} | {m.usable} of {m.asked} usable: {m.short}"
            if m.busy_samples:
                note = f"{note} | {m.busy_samples} busy sample{'s' if m.busy_samples > 1 else ''} left out"
            if m.whole_busy_ids:
                note = (f"{note} | boot{'s' if len(m.whole_busy_ids) > 1 else ''} "
                        f"{', '.join(map(str, m.whole_busy_ids))} busy throughout, counted whole (host busy all "
                        "the time)")
            results.append(None if m.unmeasurable and not m.values else list(m.values))
            booted = sorted(m.boot_ids + m.failed_ids + m.left_out_ids)
            searched.update(booted)
            if probe.test is not None:
                test_boots.setdefault(probe.test, []).extend(booted)
                if probe.test:
                    note = f"{note} | head-to-head test {probe.test}"
            ledger.add(Probe(bisection_id=bis.id, commit=probe.commit, boots_requested=probe.boots,
                             values=list(m.values), skipped=results[-1] is None, note=note,
                             purpose=probe.purpose, boot_ids=booted))
        search.observe_round(rnd, results)
        step += 1
        sched.obs.search_step(step_line(step, rnd, results, search.result(), new_boots, max_boots))
        if booked == 0 and not any(r is None for r in results):
            stop = StopReason.STALLED  # nothing booted and nothing changed: stop rather than spin
            break
    return stop, new_boots, searched


def _step_sd(res: BisectResult) -> float | None:
    """The step the search measured over its boots' noise sd, where it has one."""
    if all(math.isfinite(x) for x in (res.good_mean, res.bad_mean, res.noise_sd)) and res.noise_sd > 0:
        return abs(res.bad_mean - res.good_mean) / res.noise_sd
    return None


def plan_lines(stage: str, plan: StagePlan, budget: int, total: int) -> list[str]:
    """What a search says before it starts: its plan and its boots, and where they
    fall short of its least (it cannot finish) or of its plan (it may stop on its
    budget), by how much to raise ``--max-boots``."""
    lines = [f"bisection plan: {stage}, {plan.revisions} revisions ({plan.candidates} candidates): about "
             f"{plan.planned} boots planned, at least {plan.least} to name a culprit; {budget} of --max-boots "
             f"{total} for it"]
    if budget < plan.least:
        lines.append(f"bisection: the {stage} cannot finish in {budget} boots: it needs at least {plan.least} "
                     f"(about {plan.planned} planned); raise --max-boots to at least "
                     f"{total - budget + plan.least} (about {total - budget + plan.planned} for room)")
    elif budget < plan.planned:
        lines.append(f"bisection: the {stage} may stop on its budget: {budget} boots for about {plan.planned} "
                     f"planned; raise --max-boots to about {total - budget + plan.planned} for room")
    return lines


#: the share of a search's measured boots marked ``host_busy`` from which
#: ``not-reproduced`` reads ``undetermined`` (``budget`` already says it is no answer)
BUSY_SHARE_UNDETERMINED = 0.5


def _busy_verdict(sched: Scheduler, configs, searched: set[int], would_be: StopReason) -> dict | None:
    """A search that stopped without an answer on a host that was mostly busy: what
    it saw (k of n measured boots busy) and what would decide it; None where the
    host was quiet enough for the stop to stand."""
    quiet = sched.spec.defaults.search_samples == "quiet"
    measured = busy = 0
    for pc in configs:
        st = sched.states.get(pc.key)
        for boot in st.boots if st else ():
            if boot.id in searched and boot.status == "ok":
                measured += 1
                # under search_samples: quiet a busy boot's quiet samples were a usable comparison
                mask = host_state.quiet_samples(boot) if quiet else None
                busy += "host_busy" in (boot.marks or []) and not (mask and any(mask))
    if not measured or busy < BUSY_SHARE_UNDETERMINED * measured:
        return None
    what = "busy in every sample (no sample's window was quiet)" if quiet else "marked host_busy"
    return {"would_have_stopped": would_be.value, "busy_boots": busy, "measured_boots": measured,
            "why": f"{busy} of {measured} measured boots were {what} (other work on the host "
                   "during the sample windows)",
            "would_decide": "run again on a quiet host: wait for one (--wait-quiet SECONDS), keep other jobs "
                            "off this host's cores, or give more boots (--max-boots)"}


def step_line(step: int, rnd, results, res: BisectResult, new_boots: int, max_boots: int) -> str:
    """One line of a search's progress: what this step booted and where the search stands,
    e.g. ``bisect step 9: verify e7ae9b5a1d83 1 boot, verify 85ce66b6f99d 1 boot;
    leader 85ce66b6f99d P=0.962, 2 candidates above 1%; 23/100 new boots``."""
    probes = ", ".join(f"{p.purpose} {p.commit[:12]} " + ("skipped" if r is None else _boots(len(r)))
                       for p, r in zip(rnd, results))
    left = sum(1 for c in res.candidates if c.probability >= 0.01)
    lead = res.leader[:12] if res.leader else "none"
    return (f"bisect step {step}: {probes}; leader {lead} P={res.leader_probability:.3f}, {left} candidate"
            f"{'s' if left != 1 else ''} above 1%; {new_boots}/{max_boots} new boots")


def _boots(n: int) -> str:
    return f"{n} boot" if n == 1 else f"{n} boots"


def _host_findings(sched: Scheduler, configs) -> list[Finding]:
    """Busy boots of the bisection's commits (their side the revision; figures what
    crossed, the ``revision`` and the boot's ``status``), a busy preflight, noisy
    calibration."""
    out = host_state.calibration_findings([sched.run], sched.spec.defaults.host_thresholds)
    for pc in configs:
        st = sched.states.get(pc.key)
        for boot in st.boots if st else ():
            rec = host_state.BootContention.of(boot)
            if rec is not None and rec.busy:
                rev = pc.arm.commit[:12] if pc.arm.commit else f"release {pc.arm.release}"
                out.append(host_state.busy_finding(rev, f"boot {boot.id} ({rev}, {boot.status})", boot.id, rec,
                                                   revision=rev, status=str(boot.status)))
    return out


def bisect_range(spec: Spec, ledger: Ledger, request: BisectRequest, setup: MeasureSetup
                 ) -> tuple[BisectOutcome, Scheduler]:
    """``harness bisect``: the engine and benchmark of ``spec``, base env and flags. Where
    ``engine.releases`` holds both ``request.good`` and ``request.bad`` as versions, the
    releases between them are searched first, then (``engine.releases.tag`` and
    ``engine.repo``) the commits between the culprit release and the one before it, on
    what is left of the budget, in the same run. The release stage may use its share
    of ``request.search.max_boots`` only (``decide.bisect.budget.release_share``), so the
    commit stage keeps what it plans to need. ``request.search.min_effect``: the least
    relative change that counts, for both stages.

    Long because it is ``harness bisect`` as one story: the spec read, the range
    resolved (releases first, then commits), each stage searched, the answer recorded."""
    good, bad, metric, first_parent = request.good, request.bad, request.metric, request.first_parent
    options = request.search
    max_boots = options.max_boots
    rel = spec.engine.releases
    released = rel is not None and good in rel.source().versions() and bad in rel.source().versions()
    m, plan = engine_plan(spec, metric, setup.cache_dir, "bisection", need_repo=not released)
    at = points.search_point(spec, ledger, metric, request.at)  # refused before any boot where none can be chosen
    if released:
        revisions = rel.source().between(good, bad)
    else:
        good_sha = plan.ws.resolve(good, where="--good")
        bad_sha = plan.ws.resolve(bad, where="--bad")
        if good_sha == bad_sha:
            raise UserError(f"--good and --bad are the same commit ({good_sha[:12]}); nothing to bisect")
        revisions = plan.ws.commits_between(good_sha, bad_sha, first_parent=first_parent)
    sched = setup.scheduler(plan, ledger)
    with sched.recording("bisect"):
        if at.label is not None:
            sched.obs.message(f"bisection at {at.label} ({at.why}): the search compares that load point's values")
        # One search, or two: a search over releases may add the descent into the commits
        # of its culprit release, searched in turn on what is left of the budget.
        first = max_boots
        if released:
            first = _release_budget(sched, plan, rel, revisions, options, first_parent=first_parent)
        searches: list[tuple[Sequence[str], bool, int, float | None]] = [(revisions, released, first, None)]
        outcomes: list[BisectOutcome] = []
        note, owed = None, False
        for revs, releases, budget, step_sd in searches:
            target = SearchTarget(metric, m.worse, env=spec.engine.env, flags=spec.engine.flags, releases=releases,
                                  point=at.label)
            start = SearchStart(fresh=request.fresh, total_boots=max_boots, step_sd=step_sd,
                                stage="release stage" if releases else "commit stage" if released else "bisection")
            outcomes.append(search_commits(sched, revs, target, dataclasses.replace(options, max_boots=budget), start))
            if not releases:
                continue
            found = outcomes[-1]
            if found.culprit is None:
                note = f"no single culprit release ({found.stopped}): nothing to descend into"
                continue
            if rel.tag is None or plan.ws is None:
                note = ("the releases are not mapped to source commits: set engine.releases.tag (e.g. 'v{version}') "
                        "and engine.repo to descend into the commits between two releases")
                continue
            before = revs[list(revs).index(found.culprit) - 1]
            tags = (rel.tag.format(version=before), rel.tag.format(version=found.culprit))
            try:
                lo, hi = (plan.ws.resolve(t, where=f"engine.releases.tag of {v}") for t, v in
                          zip(tags, (before, found.culprit)))
                commits = plan.ws.commits_between(lo, hi, first_parent=first_parent)
            except UserError as exc:
                commits, note = (), f"the tags {tags[0]} and {tags[1]} could not be followed: {exc}"
            left = max_boots - found.new_boots
            if commits and len(commits) < 3:
                note = (f"{tags[1]} is the only commit after {tags[0]}: it is the culprit commit "
                        f"({commits[-1][:12]})")
            elif commits:
                need = plan_stage(len(commits), _planning(options, sched), found.step_sd)
                if left < need.least:  # said before it starts, and not started: it could not name a culprit
                    note = plan_lines("commit stage", need, left, max_boots)[-1].removeprefix("bisection: ")
                    note = f"culprit release {found.culprit}, but {note}"
                    sched.obs.message(f"bisection: {note}")
                    owed = True
                    continue
                sched.obs.message(f"bisection: culprit release {found.culprit}; descending into the "
                                  f"{len(commits) - 1} commits of {tags[0]}..{tags[1]}")
                searches.append((commits, False, left, found.step_sd))
        outcome = outcomes[0]
        if released:  # the release search's row says what became of the descent
            outcome = dataclasses.replace(outcome, descent=outcomes[1] if len(outcomes) > 1 else None,
                                          descent_note=note, descent_owed=owed)
            bis = ledger.session.get(Bisection, outcome.bisection_id)
            bis.result = outcome.to_record()
            ledger.commit()
    sched.finish_run("done")
    return outcome, sched


def _planning(options: SearchOptions, sched: Scheduler) -> SearchOptions:
    """The options a stage's plan is made with: ``options``' confidence, the backend's
    width, the rest at their defaults (as the plans have always been made)."""
    return SearchOptions(confidence=options.confidence, width=max(1, sched.backend.slots))


def _release_budget(sched: Scheduler, plan: Plan, rel, revisions: Sequence[str], search: SearchOptions, *,
                    first_parent: bool) -> int:
    """The release stage's share of ``search.max_boots``: the commit stage keeps what
    it plans to need for the widest gap between two neighbouring releases it may
    descend into (none where the releases are not mapped to commits). Says the split."""
    max_boots = search.max_boots
    options = _planning(search, sched)
    widest = 0
    if rel.tag is not None and plan.ws is not None:
        for before, after in zip(revisions, revisions[1:]):
            try:
                lo, hi = (plan.ws.resolve(rel.tag.format(version=v), where=f"engine.releases.tag of {v}")
                          for v in (before, after))
                widest = max(widest, len(plan.ws.commits_between(lo, hi, first_parent=first_parent)))
            except UserError:
                continue  # that gap cannot be descended into: said when the descent is tried
    commits = plan_stage(widest, options) if widest >= 3 else None
    releases = plan_stage(len(revisions), options)
    share = release_share(max_boots, releases, commits)
    if commits is not None:
        sched.obs.message(f"bisection plan: the commit stage, up to {commits.revisions} revisions between two "
                          f"releases: about {commits.planned} boots planned, at least {commits.least}; the release "
                          f"stage may use {share} of --max-boots {max_boots}, keeping {max_boots - share} for it")
        if max_boots < releases.least + commits.least:
            sched.obs.message(f"bisection: --max-boots {max_boots} cannot finish both stages: they need at least "
                              f"{releases.least + commits.least} boots ({releases.least} releases, {commits.least} "
                              f"commits); raise --max-boots to at least {releases.least + commits.least} (about "
                              f"{releases.planned + commits.planned} for room)")
    return share


def bisect_hypothesis(sched: Scheduler, h: PlannedHypothesis, row: HypothesisRow, verdict=None,
                      options: SearchOptions = SearchOptions(max_boots=DEFAULT_MAX_BOOTS)) -> BisectOutcome:
    """Bisect a confirmed hypothesis between its baseline and treatment commits with
    ``options`` (its confidence and budget); the hypothesis' ``min_effect`` is the least
    change the search counts. The paired rounds behind ``verdict`` (its sides are the
    two endpoints) open the endpoint check."""
    b, t = h.baseline.arm, h.treatment.arm
    check_bisectable(h.spec, b, t, sched.ws)  # the plan refused such a file already; the rule is one function
    commits = sched.ws.commits_between(b.commit, t.commit)
    target = SearchTarget(h.metric.name, h.spec.expect, env=t.env, flags=t.flags, hypothesis_id=row.id,
                          point=h.spec.point_label)
    rounds = tuple((p["baseline"], p["treatment"]) for p in verdict_rounds(verdict))
    return search_commits(sched, commits, target, dataclasses.replace(options, min_effect=h.spec.min_effect),
                          SearchStart(endpoint_rounds=rounds))


def verdict_rounds(verdict) -> list[dict[str, int]]:
    """The paired rounds behind a verdict, as {"baseline": boot id, "treatment": boot id}:
    the boots it used, matched by their round (``VerdictStats.rounds``: a boot's place
    among its config's good boots), so a boot left out on one side leaves its round out."""
    if verdict is None:
        return []
    ids = (list(verdict.baseline_boot_ids or []), list(verdict.treatment_boot_ids or []))
    rounds = verdict.figures.rounds or [list(range(len(x))) for x in ids]
    by_round = [dict(zip(r, x)) for r, x in zip(rounds, ids)]
    return [{"baseline": by_round[0][r], "treatment": by_round[1][r]} for r in sorted(set(by_round[0]) & set(by_round[1]))]
