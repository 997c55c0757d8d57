"""Drive the explain search (``analysis.explain``) with real boots, recorded in the ledger.

Two arms of a hypotheses file (``HID.baseline`` / ``HID.treatment``) are the fast and
the slow config. Their differences are each env variable and each flag whose value
differs (a key set on one side only differs too: absent on the other), and the commit
when the two commits differ. A configuration of the search is the fast arm with some
differences set to the slow arm's values; each is a config of the plan, booted through
the scheduler like any other, so every boot is in the ledger with its provenance.

The search is stored in ``runs.summary["explain"]`` (a list: one entry per search of
the run) with each configuration tried, its verdict, the boot ids of both sides, and
the minimal set, how the search ended (``stopped``: one value of
``analysis.explain.STOP_REASONS``) and every configuration it stepped over because the
measuring call could not measure it after its retries (``unmeasurable``, each with why);
no table of its own. One configuration that cannot be measured never ends the whole
search. When the commit is a member of the minimal set, the commit range is bisected
(``bisect_runner.search_commits``) with the slow arm's env and flags, and the
bisection's id is stored with the search.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.defaults import DEFAULT_CONFIDENCE, DEFAULT_MAX_BOOTS
from bisect_harness.decide.design import Design
from bisect_harness.decide.explain import Difference, ExplainSearch, Explanation, Unmeasured
from bisect_harness.errors import CommitError, UserError
from bisect_harness.model import Arm, Expect, Metric
from bisect_harness.plan.build import Plan, PlannedHypothesis, make_config, make_plan
from bisect_harness.spec import Spec
from bisect_harness.record.ledger import Boot, Ledger
from bisect_harness.run.bisect_runner import MeasureSetup, SearchTarget, search_commits, verdict_rounds
from bisect_harness.run.points import PointChoice, curve_hypothesis
from bisect_harness.run.scheduler import Scheduler

__all__ = ["parse_arm", "differences", "arm_with", "explain_arms", "explain_file", "explain_hypothesis",
           "ExplainOptions", "ExplainOutcome"]

ALPHA_PER_TEST = 0.01
SIDES = ("baseline", "treatment")


@dataclass(frozen=True)
class ExplainOptions:
    """How an explanation judges: ``min_effect``, the smallest relative change that
    counts (None: the slow arm's hypothesis' ``min_effect``, resolved by
    :func:`explain_file`), and ``alpha``, the error of the slowdown test and of the
    whole set (the leave-out decisions share it). Its bisection, where the commit is a
    member, uses ``bisection`` with ``min_effect`` as its least change. ``point``: the
    load point whose values every test reads (its label; None: the benchmark's one point)."""

    min_effect: float | None = None
    alpha: float = ALPHA_PER_TEST
    bisection: SearchOptions = SearchOptions(confidence=DEFAULT_CONFIDENCE, max_boots=DEFAULT_MAX_BOOTS)
    point: str | None = None


def parse_arm(text: str, spec: Spec, *, option: str) -> tuple[str, str]:
    """``HID.baseline`` or ``HID.treatment`` (HID a hypothesis id of the file, matrix
    and load points included, or a load curve's id) -> (hid, side), or a UserError
    naming the option and the choices."""
    hid, dot, side = text.rpartition(".")
    ids = [h.id for h in spec.hypotheses]
    ids += sorted({h.curve for h in spec.hypotheses if h.curve is not None} - set(ids))
    if not dot or side not in SIDES:
        raise UserError(f"{option} {text!r}: write HID.baseline or HID.treatment (HID one of: {', '.join(ids)})")
    if hid not in ids:
        raise UserError(f"{option} {text!r}: no hypothesis {hid!r} in {spec.path.name}; known: {', '.join(ids)}")
    return hid, side


def differences(fast: Arm, slow: Arm) -> list[Difference]:
    """Every env variable and flag whose value differs, then the commit if it does."""
    out = []
    for kind, k in fast.setting_differences(slow):
        a, b = (fast.env, slow.env) if kind == "env" else (fast.flags, slow.flags)
        out.append(Difference(f"{kind}:{k}", kind, a.get(k), b.get(k)))
    if fast.commit != slow.commit:
        out.append(Difference("commit", "commit", fast.commit, slow.commit))
    return out


def arm_with(fast: Arm, slow: Arm, diffs: Sequence[Difference], subset) -> Arm:
    """The fast arm with the differences named in ``subset`` set to the slow arm's values."""
    env, flags, commit = dict(fast.env), dict(fast.flags), fast.commit
    for d in diffs:
        if d.name not in subset:
            continue
        key = d.name.split(":", 1)[1] if d.kind != "commit" else None
        if d.kind == "commit":
            commit = slow.commit
        else:
            target, source = (env, slow.env) if d.kind == "env" else (flags, slow.flags)
            if key in source:
                target[key] = source[key]
            else:
                target.pop(key, None)
    names = sorted(subset)
    label = "fast" if not names else ("slow" if len(names) == len(diffs) else "fast+" + ",".join(names))
    return Arm(commit=commit, env=env, flags=flags, label=label, endpoint=fast.endpoint)


@dataclass(frozen=True)
class ExplainOutcome:
    explanation: Explanation
    differences: tuple
    record: dict  # what runs.summary["explain"] holds for this search


def explain_arms(sched: Scheduler, fast: Arm, slow: Arm, *, names: tuple[str, str], metric: Metric,
                 options: ExplainOptions = ExplainOptions(), hypothesis_id: int | None = None,
                 rounds: Sequence[tuple[int, int]] = ()) -> ExplainOutcome:
    """Run the search between two resolved arms with ``sched`` (a run is open).
    ``names``: how the fast and the slow arm are called (``HID.side``). ``options``:
    its ``min_effect`` as given (None: any change) and ``alpha``. ``rounds``: (fast boot
    id, slow boot id) of paired rounds the run already has of the two arms (a confirmed
    hypothesis' verdict): the slowdown test judges them first."""
    (fast_name, slow_name), min_effect, alpha = names, options.min_effect, options.alpha
    point = options.point
    spec, ledger = sched.spec, sched.ledger
    diffs = differences(fast, slow)
    if not diffs:
        raise UserError(f"{fast_name} and {slow_name} are the same config (commit, env and flags): nothing to explain")
    # its boots depend on what it finds: no budget to show; its configs read as what they add to fast
    sched.obs.search_started("explanation", None, reference=fast)
    # The search in progress, in the run's summary until its record replaces it: a run stopped
    # in it says so in its journal (which search, from which boot), and --resume makes it again.
    run = sched.run
    search = {"fast": fast_name, "slow": slow_name, "metric": metric.name, "min_effect": min_effect,
              "alpha_per_test": alpha, "hypothesis_id": hypothesis_id, "differences": [x.to_json() for x in diffs],
              "point": point}
    after_boot = max((b.id for st in sched.states.values() for b in st.boots), default=0)
    run.summary = {**(run.summary or {}), "explaining": {**search, "after_boot": after_boot}}
    ledger.commit()
    calls: list[tuple[frozenset, int]] = []
    given = []  # the run's rounds, with each boot's samples of the metric
    for f_id, s_id in rounds:
        f, sl = (ledger.boot_values([ledger.session.get(Boot, i)], metric.name, point=point).values
                 for i in (f_id, s_id))
        if not (f and sl):  # a boot without the metric ends the rounds that can be used
            break
        given.append((list(f[0]), list(sl[0])))
        calls += [(frozenset(), f_id), (frozenset(x.name for x in diffs), s_id)]

    d = spec.defaults
    design = Design(alpha=alpha, min_boots=d.boots_per_arm, max_boots=d.max_boots_per_arm, analysis=d.analysis)
    finder = ExplainSearch([x.name for x in diffs], worse=metric.worse, min_effect=min_effect, design=design,
                           alpha=alpha, seed=sched.order_seed, rounds=given)
    while (subset := finder.next_config()) is not None:  # the search says what to boot; this loop boots it
        st = sched.state_for(make_config(spec, arm_with(fast, slow, diffs, subset)))
        m, = sched.measure([st], 1, metric=metric.name, point=point)  # retried under the one failure policy
        if m.samples:
            calls.append((subset, m.boot_ids[0]))
            finder.record(list(m.samples[0]))
        else:  # unmeasurable after its retries: the search steps over it, says why, never asks again
            finder.record(Unmeasured(f"{st.planned.label or 'config ' + st.planned.key}: "
                                     f"{m.unmeasurable or m.short or 'no usable boot of ' + metric.name}; "
                                     "see its boot logs"))
    res = finder.result
    # Each test names, by the order they were asked for, the boots behind each side (a shared boot serves several).
    tests = [{**t.to_json(), "baseline_boot_ids": [calls[i][1] for i in t.baseline_calls],
              "treatment_boot_ids": [calls[i][1] for i in t.treatment_calls]} for t in res.tests]
    record = {**search, "run_rounds": [[calls[2 * i][1], calls[2 * i + 1][1]] for i in range(len(given))],
              **res.to_json(), "tests": tests}
    if "commit" in res.members and sched.ws is not None:
        # Oldest first: from the fast commit the metric gets worse; from the slow one, better.
        try:
            commits, expect = sched.ws.commits_between(fast.commit, slow.commit), metric.worse
        except CommitError:
            commits = sched.ws.commits_between(slow.commit, fast.commit)
            expect = Expect.INCREASE if metric.worse is Expect.DECREASE else Expect.DECREASE
        target = SearchTarget(metric.name, expect, env=slow.env, flags=slow.flags, hypothesis_id=hypothesis_id,
                              point=point)
        bis = search_commits(sched, commits, target, dataclasses.replace(options.bisection, min_effect=min_effect))
        # Rows written before "leader" held the leader's posterior as "probability", beside a null culprit.
        record["bisection"] = {"id": bis.bisection_id, "culprit": bis.culprit, "leader": bis.leader,
                               "leader_probability": bis.leader_probability}
    summary = {k: v for k, v in (run.summary or {}).items() if k != "explaining"}
    summary["explain"] = list(summary.get("explain", [])) + [record]
    run.summary = summary
    ledger.commit()
    return ExplainOutcome(res, tuple(diffs), record)


def explanation_lines(out: ExplainOutcome) -> list[str]:
    """What an explanation found, a line each, as the console shows it (``harness
    explain`` and a run's ``explain: true``)."""
    res = out.explanation
    if res.slowdown.outcome != "confirmed":
        lines = [f"  nothing explained: {res.slowdown.reason}"]
    elif not res.explained:
        lines = ["  nothing explained: the slowdown is real, yet no difference was shown to matter"]
    else:
        lines = [f"  minimal set: {', '.join(res.members)} ({res.boots} boots)"]
    lines += [f"  interaction: {' + '.join(pair)} (slow only together)" for pair in res.interactions]
    lines += [f"  opposite sign: {name}" for name in res.opposite]
    lines += [f"  undecided: {name}" for name in res.undecided]
    lines += [f"  no cause, sign open: {name}" for name in res.sign_open]
    lines += [f"  stepped over: the config with {', '.join(config) or 'none'} of the differences could not be "
              f"measured ({why})" for config, why in res.unmeasurable]
    return lines + [f"  stopped: {res.stopped}"]


def _side(h: PlannedHypothesis, side: str) -> Arm:
    return (h.baseline if side == "baseline" else h.treatment).arm


def explain_file(spec: Spec, ledger: Ledger, fast: str, slow: str, options: ExplainOptions,
                 setup: MeasureSetup, *, at: str | None = None) -> tuple[ExplainOutcome, Scheduler]:
    """``harness explain FILE --fast HID.side --slow HID.side``: the metric and min_effect
    of the slow arm's hypothesis (``options.min_effect`` overrides). ``setup.order_seed``
    seeds the order of boots (and the search's; default: a fresh one, stored with the run).
    A HID that is a load curve's id is its point hypothesis at ``at`` (``--at
    concurrency=32``), or without it at the point of the curve's largest confirmed
    effect (``run.points``); both arms read one point."""
    (fh, fs), (sh, ss) = parse_arm(fast, spec, option="--fast"), parse_arm(slow, spec, option="--slow")
    sh, where = _at_point(spec, ledger, sh, at)
    fast_curve = all(h.id != fh for h in spec.hypotheses)  # a curve's id: at the slow arm's point
    fh, _ = _at_point(spec, ledger, fh, where.label if where is not None and fast_curve else at)
    plan: Plan = make_plan(spec, cache_dir=setup.cache_dir)
    by_id = {h.id: h for h in plan.hypotheses}
    fast_arm, slow_h = _side(by_id[fh], fs), by_id[sh]
    if by_id[fh].metric.name != slow_h.metric.name:
        raise UserError(f"--fast {fast} and --slow {slow} measure different metrics "
                        f"({by_id[fh].metric.name} vs {slow_h.metric.name}); pick arms of hypotheses on one metric")
    if by_id[fh].spec.point_label != slow_h.spec.point_label:
        raise UserError(f"--fast {fast} and --slow {slow} read different load points ({by_id[fh].spec.point_label} "
                        f"vs {slow_h.spec.point_label}); name arms of one point (or their curves, with --at)")
    if options.min_effect is None:
        options = dataclasses.replace(options, min_effect=slow_h.spec.min_effect)
    sched = setup.scheduler(plan, ledger)
    with sched.recording("explain"):
        if where is not None:
            sched.obs.message(f"explanation at {where.label} ({where.why}): every test compares that load "
                              "point's values")
        out = explain_arms(sched, fast_arm, _side(slow_h, ss), names=(fast, slow), metric=slow_h.metric,
                           options=dataclasses.replace(options, point=slow_h.spec.point_label))
    sched.finish_run("done")
    return out, sched


def _at_point(spec: Spec, ledger: Ledger, hid: str, at: str | None) -> tuple[str, PointChoice | None]:
    """The hypothesis an arm's HID names and the load point it reads: a curve's id is its
    point hypothesis at ``at`` (or its default point, ``run.points``); a point
    hypothesis' id is itself, where ``at`` (if given) is its point; (hid, None) for a
    hypothesis of one point, which ``at`` cannot move."""
    h = next((x for x in spec.hypotheses if x.id == hid), None)
    if h is None:  # parse_arm let it through: a curve's id
        found, choice = curve_hypothesis(spec, ledger, hid, at)
        return found.id, choice
    if h.point is None:
        if at is not None:
            raise UserError(f"--at {at}: {hid} is a hypothesis of one load point; drop --at, or name a curve")
        return hid, None
    if at is not None and at != h.point_label:
        raise UserError(f"--at {at}: {hid} is the point {h.point_label} of curve {h.curve}; name the curve "
                        f"({h.curve}.baseline, {h.curve}.treatment) with --at, or drop --at")
    return hid, PointChoice(h.point_label, f"the point of {hid}")


def explain_hypothesis(sched: Scheduler, h: PlannedHypothesis, row, verdict=None) -> ExplainOutcome:
    """``explain: true``: explain a confirmed hypothesis. The worse side is the slow arm:
    the treatment when the hypothesis expects the metric to get worse, else the baseline.
    The rounds behind ``verdict`` (its i-th boot of each side is round i) open the
    search's slowdown test, so the run does not measure again what it has just shown."""
    slow_is_treatment = h.spec.expect == h.metric.worse
    fast, slow = ("baseline", "treatment") if slow_is_treatment else ("treatment", "baseline")
    return explain_arms(sched, _side(h, fast), _side(h, slow), names=(f"{h.id}.{fast}", f"{h.id}.{slow}"),
                        metric=h.metric, options=ExplainOptions(min_effect=h.spec.min_effect, point=h.spec.point_label),
                        hypothesis_id=row.id, rounds=[(p[fast], p[slow]) for p in verdict_rounds(verdict)])
