"""The hypothesis loop: boot rounds until every hypothesis is decided.

Boots of the configs still in question are interleaved round after round (the
scheduler shuffles the order inside each round by a seeded generator,
``order_seed``, stored with every verdict), so slow drift of the host lands on
both sides. A round is a block: with ``defaults.analysis: paired`` a hypothesis
is judged on the per-round ratios of its two configs (the i-th good boot of each
config is round i). After each round every undecided hypothesis is looked at
again by the rule in ``decide`` and stops asking for boots once decided or out of
budget. Once every hypothesis is final, the points of each load curve are judged
together (``decide.multiplicity.step_down``: a point confirmed frees its share of
alpha for the others, each judged again over its looks; what that confirms is
stored as a further look), and each curve's answer (``decide.curve.answer``) is
stored in ``runs.summary["curves"]``.

Booting and recording belong to the :class:`~bisect_harness.run.scheduler.Scheduler`;
the verdict rule to ``decide``; this module only says which configs to boot next
and when to look.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Mapping

from bisect_harness.decide import allocation
from bisect_harness.decide import curve as curve_rule
from bisect_harness.decide import verdict as verdict_rule
from bisect_harness.decide.multiplicity import step_down
from bisect_harness.decide.design import ANALYSES, Design
from bisect_harness.decide.prior import NoisePrior, prior_from_runs
from bisect_harness.decide.power import noise_floor
from bisect_harness.backends import Backend
from bisect_harness.engines import attach
from bisect_harness.record.ledger import Bisection, HypothesisRow, Ledger, Run, VerdictRow, boot_records, verdict_row
from bisect_harness.model import Outcome
from bisect_harness.plan.build import Plan, PlannedHypothesis, make_config, verdict_rules
from bisect_harness.run import points
from bisect_harness.run import resume as resume_mod
from bisect_harness.run.bisect_runner import bisect_hypothesis
from bisect_harness.run.explain_runner import explain_hypothesis, explanation_lines
from bisect_harness.run.scheduler import ConfigState, Observer, Scheduler, boot_seconds

__all__ = ["Executor", "Observer", "ConfigState"]


class Executor:
    """Runs a plan's hypotheses against a ledger, booting through a scheduler."""

    def __init__(self, plan: Plan, ledger: Ledger, *, log_dir: Path, observer: Observer | None = None,
                 calibrate: bool = True, aa_check: bool = False, order_seed: int | None = None,
                 wait_quiet_s: float | None = None, backend: Backend | None = None, resume: Run | None = None,
                 profile: bool = False):
        # --profile: every hypothesis' arms take a profiled sample; a resume keeps what the run was started with
        self.profile = profile or (resume is not None and bool(resume_mod.options(resume).profile))
        if self.profile and not plan.profile_all:
            plan = dataclasses.replace(plan, profile_all=True)
        self.sched = Scheduler(plan, ledger, log_dir=log_dir, observer=observer, calibrate=calibrate,
                               order_seed=order_seed, wait_quiet_s=wait_quiet_s, backend=backend)
        self.plan = plan
        self.spec = plan.spec
        self.rules = verdict_rules(plan.spec)
        self.ledger = ledger
        self.obs = self.sched.obs
        self.aa_check = aa_check
        self.resume = resume  # --resume: the interrupted run this one continues (resume.check_plan passed)
        if resume is not None:
            self.aa_check = aa_check or bool(resume_mod.options(resume).aa_check)
        self.underpowered: dict[str, str] = {}
        self.noise: dict[str, dict] = {}
        self.verdicts: dict[str, VerdictRow] = {}  # each hypothesis' final verdict, as the rounds end it
        self.priors: dict[str, NoisePrior] = {}  # hypothesis id -> its noise prior of earlier runs (decide.prior)

    @property
    def run(self) -> Run | None:
        return self.sched.run

    @property
    def states(self) -> dict[str, ConfigState]:
        return self.sched.states

    @property
    def order_seed(self) -> int:
        return self.sched.order_seed

    def start_run(self, kind: str = "run") -> Run:
        return self.sched.start_run(kind)

    def finish_run(self, status: str = "done", error: str | None = None) -> None:
        self.sched.finish_run(status, error)

    def design(self) -> Design:
        return self.rules.design

    def alpha_each(self) -> float:
        return self.rules.alpha_each

    def execute(self) -> Run:
        """The whole experiment: calibrate, boot rounds until decided, bisect and explain
        the confirmed hypotheses that ask for it, calibrate again."""
        with self.sched.recording("run", resume=self.resume, calibrated=True, finish="done") as run:
            rows = self._hypothesis_rows()
            if self.resume is None:  # what a later resume needs beyond the file
                resume_mod.record_options(self.ledger, run, aa_check=self.aa_check or self.spec.defaults.aa_check,
                                          hypotheses=[h.id for h in self.plan.hypotheses], profile=self.profile)
                earlier = {}
            else:  # the looks recorded before the interruption, read once
                earlier = resume_mod.looks_done(self.ledger, rows)
            if self.spec.defaults.aa_check or self.aa_check:
                self._aa_check(rows)
            self._sequential(rows, earlier)
            self._curves(rows)
            self._follow_ups(rows)
        return run

    def _hypothesis_rows(self) -> dict[str, HypothesisRow]:
        rows = {}
        earlier = {r.hid: r for r in self.run.hypotheses} if self.resume is not None else {}
        for h in self.plan.hypotheses:
            if h.id in earlier:  # --resume: the row (and its looks) of the interrupted run
                rows[h.id] = earlier[h.id]
                continue
            rows[h.id] = self.ledger.add(HypothesisRow(
                run_id=self.run.id, hid=h.id, statement=h.spec.statement, metric=h.metric.name,
                expect=h.spec.expect.value, min_effect=h.spec.min_effect,
                baseline_config_id=self.states[h.baseline.key].row.id,
                treatment_config_id=self.states[h.treatment.key].row.id,
                spec={"baseline": _arm_dict(h.spec.baseline), "treatment": _arm_dict(h.spec.treatment),
                      "matrix_point": dict(h.spec.matrix_point), "bisect": h.spec.bisect,
                      "is_aa": h.is_aa, "line": h.spec.line, **_point_dict(h.spec),
                      "metric_def": {"unit": h.metric.unit, "better": h.metric.better.value,
                                     "description": h.metric.description}}))
        return rows

    # ------------------------------------------------------------------ A/A power check

    def _aa_check(self, rows: Mapping[str, HypothesisRow]) -> None:
        """Boot each baseline config against an independent replica of itself, measure
        the noise, and refuse to claim effects smaller than the run can resolve."""
        d = self.spec.defaults
        design, alpha_each = self.rules.design, self.rules.alpha_each
        groups: dict[tuple[str, str, str | None], list[PlannedHypothesis]] = {}
        for h in self.plan.hypotheses:
            if not h.is_aa:
                groups.setdefault((h.baseline.key, h.metric.name, h.spec.point_label), []).append(h)
        for (key, metric, point), hyps in groups.items():
            base = self.states[key]
            replica = self.sched.state_for(make_config(self.spec, base.planned.arm, replica=2))
            self.sched.boot_round([base, replica], d.boots_per_arm)
            if base.failed or replica.failed:
                self.obs.message(f"A/A check of {base.planned.label}: could not be measured")
                continue
            # The check's own boots: the first of each side (after --resume the baseline holds more).
            a = self.ledger.boot_values(base.good_boots[:d.boots_per_arm], metric, point=point).values
            b = self.ledger.boot_values(replica.good_boots[:d.boots_per_arm], metric, point=point).values
            if len(a) < 2 or len(b) < 2:
                continue
            noise = noise_floor([list(x) for x in a], [list(x) for x in b], design=design, alpha=alpha_each)
            sde = noise.smallest_detectable_effect
            self.noise[key] = {"metric": metric, "boot_mean_cv": noise.boot_mean_cv,
                               "smallest_detectable_effect": sde}
            self.obs.message(f"A/A check of {base.planned.label}: boot-to-boot CV {noise.boot_mean_cv:.2%} "
                             f"on {metric}; smallest effect this run can resolve: {sde:.2%}")
            for h in hyps:
                if h.spec.min_effect < sde:
                    self.underpowered[h.id] = (
                        f"min_effect {h.spec.min_effect:.1%} is below the smallest effect this run can resolve "
                        f"({sde:.1%} from an A/A check); raise min_effect or defaults.max_boots_per_arm")

    # ------------------------------------------------------------------ sequential rounds

    def _sequential(self, rows: Mapping[str, HypothesisRow],
                    earlier: Mapping[str, tuple[VerdictRow | None, int]]) -> None:
        """``earlier``: per hypothesis, its final verdict and the looks recorded before a resume."""
        d = self.spec.defaults
        alpha_each = self.rules.alpha_each
        pending = []
        for h in self.plan.hypotheses:
            final, _ = earlier.get(h.id, (None, 0))
            if final is not None:  # --resume: decided before the interruption; the verdict stands
                self.verdicts[h.id] = final
                self.obs.verdict(h, final)
            elif h.id in self.underpowered:  # the power check refused it up front: no boots spent
                v = self.ledger.add(VerdictRow(hypothesis_id=rows[h.id].id, outcome=Outcome.INCONCLUSIVE.value,
                                               final=True, test="A/A power check", alpha=alpha_each,
                                               reason=self.underpowered[h.id], findings=[],
                                               stats={"noise": self.noise.get(h.baseline.key),
                                                      "family_size": self.spec.multiplicity}))
                self.verdicts[h.id] = v
                self.obs.verdict(h, v)
            else:
                pending.append(h)
        self.priors = self._noise_priors()
        # A noise prior brings the first look to 2 rounds (``decide.verdict.prior_design``):
        # the rounds start there for every hypothesis, the others' first looks say
        # "before the first look". --resume: continue at the first look not yet
        # recorded; a hypothesis that had its look at that round before the
        # interruption skips it (not looked at twice).
        first = min([d.boots_per_arm, *(verdict_rule.prior_design(self.rules.design, p).min_boots
                                        for p in self.priors.values())])
        done = {h.id: earlier.get(h.id, (None, 0))[1] for h in pending}
        target = first + min(done.values(), default=0)
        skip = {hid: n - (target - first) for hid, n in done.items()}
        try:
            self._rounds(pending, rows, target, skip)
        finally:
            self.sched.samples_per_boot = None  # the searches after the rounds take the file's count

    def _noise_priors(self) -> dict[str, NoisePrior]:
        """Each hypothesis' noise prior (``decide.prior``): the per-round log ratios of
        the final verdicts of earlier runs that compared the same two configs on the
        same metric, every boot on this host, those of rounds whose boots took at most
        the samples this run's first rounds take (and no later round of a hypothesis
        with a prior takes fewer than the most its prior's rounds took: ``_rounds``),
        so a prior never counts rounds less noisy than this run's; none with
        ``defaults.noise_prior: false``, an analysis that does not read rounds, or no
        such run. Said once per hypothesis."""
        d = self.spec.defaults
        if not d.noise_prior or not ANALYSES[self.rules.design.analysis].takes_prior:
            return {}
        first = self.samples_next([])
        out = {}
        for h in self.plan.hypotheses:
            runs = self.ledger.earlier_round_ratios(h.baseline.key, h.treatment.key, h.metric.name,
                                                    self.sched.host_fp, before_run=self.run.id)
            kept = [[r for r in rounds if r[1] <= first] for rounds in runs]
            prior = prior_from_runs([[x for x, _, _ in rounds] for rounds in kept],
                                    [[i for _, _, pair in rounds for i in pair] for rounds in kept],
                                    [[m for _, m, _ in rounds] for rounds in kept])
            if prior is not None:
                out[h.id] = prior
                self.obs.message(f"{h.id}: {prior.describe()}; its first look comes at 2 rounds, and a look whose "
                                 f"rounds contradict the prior tests them alone")
        return out

    def _rounds(self, pending, rows, target: int, skip: dict) -> None:
        d = self.spec.defaults
        while pending:
            needed: list[ConfigState] = []
            for h in pending:
                for pc in (h.baseline, h.treatment):
                    st = self.states[pc.key]
                    if st not in needed and st.failed is None:
                        needed.append(st)
            chosen = self.samples_next(pending)
            floor = max((self.priors[h.id].samples for h in pending if h.id in self.priors), default=0)
            samples = max(chosen, floor)
            if samples != (self.sched.samples_per_boot or d.samples_per_boot):
                self.obs.message(self._samples_said(target, samples, chosen))
            self.sched.samples_per_boot = samples
            self.sched.boot_round(needed, target)
            still = []
            for h in pending:
                if skip.get(h.id, 0) > 0:
                    skip[h.id] -= 1
                    still.append(h)
                    continue
                verdict = self._look(h, rows[h.id], force_final=target >= d.max_boots_per_arm)
                if verdict.final:
                    self.verdicts[h.id] = verdict
                else:
                    still.append(h)
            pending = still
            target += 1

    def _samples_said(self, target: int, samples: int, chosen: int) -> str:
        """Why round ``target`` takes ``samples`` samples (at each point of a curve's boot)."""
        points = len(self.spec.points)
        per = f"samples at each of a boot's {points} points" if points > 1 else "samples per boot"
        if samples > chosen:
            return (f"round {target}: {samples} {per} (the most a boot of a noise prior's rounds took: "
                    f"no round is less noisy than the prior says)")
        cost = self.cost_model()
        if cost is None:
            return (f"round {target}: {samples} {per} (defaults.samples_per_boot spread over the points until a "
                    f"boot has measured what a sample costs; decide.allocation)")
        return (f"round {target}: {samples} {per} (a boot costs {cost.boot_s:.1f} s, a sample {cost.sample_s:.2f} s, "
                f"{cost.source}; decide.allocation)")

    # ------------------------------------------------------------------ bisect: true, explain: true

    def _follow_ups(self, rows: Mapping[str, HypothesisRow]) -> None:
        """A confirmed hypothesis with ``bisect: true`` is bisected, one with ``explain:
        true`` explained, inside the run: their boots are the run's, held by it, judged
        by its calibration after, and an interruption in them marks the run interrupted
        (so ``--resume`` takes it up). After ``--resume`` a search that ended before the
        interruption is not made again. A load curve is searched once, at the point of
        its largest confirmed effect (``run.points.default_points``), not at each point."""
        bisected = {b.hypothesis_id for b in self.ledger.session.query(Bisection).filter_by(run_id=self.run.id)
                    if b.status == "done"}
        explained = {e.get("hypothesis_id") for e in (self.run.summary or {}).get("explain", [])}
        at = points.default_points(self.run)
        for h in self.plan.hypotheses:
            row, verdict = rows[h.id], self.verdicts.get(h.id)
            if verdict is None or verdict.outcome != Outcome.CONFIRMED.value:
                continue
            if h.spec.curve is not None and at.get(h.spec.curve) != h.spec.point_label:
                continue  # its curve is searched at another point
            if h.spec.bisect and row.id not in bisected:
                self.obs.message(f"bisecting {h.id} between {h.baseline.arm.commit[:12]} and "
                                 f"{h.treatment.arm.commit[:12]}")
                result = bisect_hypothesis(self.sched, h, row, verdict)
                self.obs.message(f"  culprit: {result.culprit or 'undecided'} (p={result.leader_probability:.3f}, "
                                 f"{result.boots} boots, {result.stopped})")
            if h.spec.explain and row.id not in explained:
                self.obs.message(f"explaining {h.id}: which differences between its arms make the difference")
                for line in explanation_lines(explain_hypothesis(self.sched, h, row, verdict)):
                    self.obs.message(line)

    def _look(self, h: PlannedHypothesis, row: HypothesisRow, *, force_final: bool) -> VerdictRow:
        verdict = self._judge(h, row, force_final=force_final)
        self.ledger.add(verdict)
        self.obs.verdict(h, verdict)
        return verdict

    # ------------------------------------------------------------------ node time: boots or samples

    def cost_model(self) -> allocation.CostModel | None:
        return self.sched.cost_model()

    def samples_next(self, pending) -> int:
        """Samples per boot at each load point for the next round of ``pending``
        hypotheses: the two-stage optimum of ``decide.allocation`` from their rounds so
        far (pooled per metric, the most any metric asks for), within the fewest
        (``samples_per_boot``, spread over the points a boot measures:
        ``allocation.fewest_per_point``) .. ``max_samples_per_boot``, a sample priced
        at every point (``allocation.for_points``: a curve's boot takes its samples at
        each point; ``bench/bench_curve.py`` prices it); before two rounds, the choice
        for equal parts when the file states the costs, else the fewest until a boot
        has measured them. A fixed count (``max_samples_per_boot`` at most
        ``samples_per_boot``) is taken at every point."""
        d = self.spec.defaults
        if d.max_samples_per_boot <= d.samples_per_boot:
            return d.samples_per_boot
        points = max(1, len(self.spec.points))
        fewest = allocation.fewest_per_point(d.samples_per_boot, points)
        cost = self.cost_model()
        if cost is None:
            return fewest
        by_metric: dict[str, list] = {}
        for h in pending:
            b, t = self.states[h.baseline.key], self.states[h.treatment.key]
            bv, tv = (self.ledger.boot_values(st.boots, h.metric.name, point=h.spec.point_label) for st in (b, t))
            by_metric.setdefault(h.metric.name, []).extend(zip(bv.values, tv.values))
        comps = [allocation.round_components(pairs) for pairs in by_metric.values()] or [None]
        priced = allocation.for_points(cost, points)
        return max(allocation.samples_per_boot(priced, c, min_samples=fewest, max_samples=d.max_samples_per_boot)
                   for c in comps)

    def verdict_cost(self, b: ConfigState, t: ConfigState) -> dict:
        """What a verdict cost so far: every boot of its two configs in this run (failed
        and left-out ones too), their samples, and their node time as measured, with
        the cost model (stated or measured) that prices a boot of this node."""
        sides = {"baseline": b.boots, "treatment": t.boots}
        seconds = [boot_seconds(x) for boots in sides.values() for x in boots]
        out = {"boots": {k: len(v) for k, v in sides.items()},
               "samples": sum(n for _, _, n in seconds), "node_s": round(sum(s for s, _, _ in seconds), 1)}
        model = self.cost_model()
        if model is not None:
            out["model"] = {"boot_s": round(model.boot_s, 2), "sample_s": round(model.sample_s, 3),
                            "source": model.source}
        d = self.spec.defaults
        out["samples_chosen"] = d.max_samples_per_boot > d.samples_per_boot  # by the prices, or fixed
        return out

    def _judge(self, h: PlannedHypothesis, row: HypothesisRow, *, force_final: bool) -> VerdictRow:
        b, t = self.states[h.baseline.key], self.states[h.treatment.key]
        v = verdict_rule.look(self.rules, *self._sides(h), self._question(h), force_final=force_final,
                              order_seed=self.order_seed, prior=self.priors.get(h.id),
                              config_findings=attach.verdict_findings([b.planned, t.planned]))
        return verdict_row(row.id, v.with_stats(cost=self.verdict_cost(b, t)))

    def _sides(self, h: PlannedHypothesis) -> tuple[verdict_rule.Side, verdict_rule.Side]:
        b, t = self.states[h.baseline.key], self.states[h.treatment.key]
        return (verdict_rule.Side("baseline", boot_records(b.boots), b.failed),
                verdict_rule.Side("treatment", boot_records(t.boots), t.failed))

    @staticmethod
    def _question(h: PlannedHypothesis) -> verdict_rule.Question:
        at = h.spec.point_label
        return verdict_rule.Question(h.metric.name, h.spec.expect, h.spec.min_effect, mechanism=tuple(
            verdict_rule.Question(m.metric, m.expect, m.min_effect, point=at) for m in h.spec.mechanism), point=at)

    # ------------------------------------------------------------------ load curves: the points together

    def _curves(self, rows: Mapping[str, HypothesisRow]) -> None:
        """Each curve's points (the hypotheses of one ``HypothesisSpec.curve``, in the
        sweep's order) judged together by the step-down, and its answer stored in
        ``runs.summary["curves"]`` (``decide.curve.CurveAnswer.to_json`` each), where
        the report reads it. A run without a curve stores nothing."""
        groups: dict[str, list[PlannedHypothesis]] = {}
        for h in self.plan.hypotheses:
            if h.spec.curve is not None and h.id in self.verdicts:
                groups.setdefault(h.spec.curve, []).append(h)
        if not groups:
            return
        answers = [self._curve(curve, hyps, rows) for curve, hyps in groups.items()]
        self.run.summary = {**(self.run.summary or {}), "curves": [a.to_json() for a in answers]}
        self.ledger.commit()

    def _curve(self, curve: str, hyps: list[PlannedHypothesis], rows: Mapping[str, HypothesisRow]
               ) -> curve_rule.CurveAnswer:
        """One curve: the closed test of its points at their shares of alpha; a point it
        confirms beyond its first verdict gets that verdict as a further look (its
        ``stats.step_down`` saying how), or keeps the one an interrupted run stored."""
        by_label = {h.spec.point_label: h for h in hyps}
        first = self.rules.alpha_each
        found: dict[tuple[str, float], verdict_rule.Verdict | None] = {}

        def confirms(label: str, level: float) -> bool:
            h = by_label[label]
            if level == first:
                return self.verdicts[h.id].outcome == Outcome.CONFIRMED.value
            found[(label, level)] = self._rejudge(h, self.verdicts[h.id], level)
            return found[(label, level)] is not None

        sd = step_down(list(by_label), first, confirms)
        for label in sd.stepped:
            h, level = by_label[label], sd.confirmed[label]
            row = self._stepped_before(rows[h.id])
            if row is None:
                b, t = self.states[h.baseline.key], self.states[h.treatment.key]
                v = found[(label, level)].with_stats(cost=self.verdict_cost(b, t), step_down={
                    "curve": curve, "level": level, **sd.to_json()})
                row = self.ledger.add(verdict_row(rows[h.id].id, v))
            self.verdicts[h.id] = row
            self.obs.message(f"{curve}: {label} confirmed by the step-down at alpha {level:.3g} (the shares of "
                             f"{', '.join(p for p, a in sd.confirmed.items() if a < level) or 'its points'} "
                             f"confirmed before it)")
            self.obs.verdict(h, row)
        points = []
        for label, h in by_label.items():
            v = self.verdicts[h.id]
            ci = (v.ci_low, v.ci_high) if v.ci_low is not None and v.ci_high is not None else None
            points.append(curve_rule.PointVerdict(label, h.id, Outcome(v.outcome), v.ratio, ci, alpha=v.alpha))
        h0 = hyps[0]
        return curve_rule.answer(curve, h0.metric.name, h0.spec.expect, points, better=h0.metric.better)

    def _rejudge(self, h: PlannedHypothesis, verdict: VerdictRow, alpha: float) -> verdict_rule.Verdict | None:
        """``h`` judged again at ``alpha`` over the looks up to its final verdict's
        (``decide.verdict.rejudge``): the confirming look's verdict, or None."""
        b, t = self._sides(h)
        upto = (verdict_rule.looks_used(b, verdict.baseline_boot_ids),
                verdict_rule.looks_used(t, verdict.treatment_boot_ids))
        planned = [self.states[h.baseline.key].planned, self.states[h.treatment.key].planned]
        return verdict_rule.rejudge(self.rules.at(alpha), b, t, self._question(h), upto=upto,
                                    order_seed=self.order_seed, config_findings=attach.verdict_findings(planned),
                                    prior=self.priors.get(h.id))

    def _stepped_before(self, row: HypothesisRow) -> VerdictRow | None:
        """The step-down's look an interrupted run already stored for ``row`` (``--resume``)."""
        return next((v for v in reversed(self.ledger.looks(row)) if v.final and v.figures.step_down), None)


def _point_dict(h) -> dict:
    """A point hypothesis' curve and load point, as the report reads them (``report.curve_view``):
    ``{"curve": id, "point": {"label": ..., "settings": {...}}}``; {} for a hypothesis of one point."""
    if h.point is None:
        return {}
    return {"curve": h.curve, "point": {"label": h.point.label, "settings": dict(h.point.settings)}}


def _arm_dict(arm) -> dict:
    out = {"commit": arm.commit, "env": dict(arm.env), "flags": dict(arm.flags)}
    if getattr(arm, "release", None) is not None:  # a released build (engine.releases): its version
        out["release"] = arm.release
    return out
