"""The verdict rule, in one place.

:func:`judge` turns the boots of a hypothesis' two sides into a :class:`Verdict`
(confirmed / refuted / inconclusive, with its statistics and every finding about
the boots it used, :func:`side_findings`); :class:`NightRule` is nightly's rule for one night against
the nights before, stepped by its driver as the searches are. The executor's
hypothesis loop, ``harness compare`` and ``harness nightly`` all decide through
here; the statistics themselves live in ``evaluate``, ``shift`` and their kin.

It reads values, never the ledger or the hypotheses file: each side's boots as
frozen records (``boot.BootRecord``, which ``record.ledger.boot_records`` makes
from the rows), the :class:`Rules` the file sets (``plan.build.verdict_rules``
reads them), and the findings only the caller can know (an attached server's).
It knows nothing of the ledger's columns: ``record.ledger.verdict_row`` stores a
verdict.

A side that never booted (no good boot at all: every launch failed, or its
commit never built) gives no verdict to speak of: it is ``inconclusive``
with the test :data:`NOT_MEASURED`, and :func:`shown_outcome` reads it as "not
measured" wherever a verdict is shown; :func:`never_booted` says why, naming the
launch argv and the first failure.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Callable, Mapping, Sequence

from bisect_harness.boot import BootRecord, BootValues
from bisect_harness.evidence import Finding, FindingKind, VerdictStats, evidence_of
from bisect_harness.observe import engine_identity
from bisect_harness.observe.contention import Thresholds
from bisect_harness.observe.mechanisms import ANSWERED
from bisect_harness.observe import host_state
from bisect_harness.decide.design import ANALYSES, Design
from bisect_harness.decide.prior import NoisePrior
from bisect_harness.decide.evaluate import evaluate
from bisect_harness.decide.multiplicity import adjust_alpha
from bisect_harness.decide.shift import Shift, detect_shift
from bisect_harness.decide.layers import layers
from bisect_harness.model import jsonable
from bisect_harness.observe.drift import drift_findings
from bisect_harness.model import NOT_MEASURED, Expect, Outcome, shown_outcome

__all__ = ["Rules", "Question", "Verdict", "judge", "look", "rejudge", "looks_used", "side_findings", "marked_boots",
           "NightRule", "judge_night", "Side", "NOT_MEASURED", "never_booted", "shown_outcome", "checks_done"]

def never_booted(name: str, boots: Sequence[BootRecord], failed: str | None) -> str | None:
    """Why a side with no good boot could not be measured (its launch argv and first
    failure), or None when it has a good boot or did not fail."""
    if failed is None or any(b.status in ("ok", "excluded") for b in boots):
        return None  # it booted (a boot a check left out booted too)
    tried = [b for b in boots if b.status == "failed"]
    if not tried:
        return f"{name} never booted: {failed}"
    first = tried[0]
    argv = f"; launch argv: {shlex.join(str(a) for a in first.argv)}" if first.argv else ""
    n = len(tried)
    why = (first.failure or failed).strip()
    if failed not in why and "in a row failed" not in failed:  # the config's own reason (a refused flag, a build)
        why = f"{failed}; {why}"
    return f"{name} never booted ({n} boot{'s' if n != 1 else ''} failed; the first: {why}{argv})"


@dataclasses.dataclass(frozen=True)
class Side:
    """One side of a comparison: its boots (all of them, good or not, as records), and
    why it could not be measured (a failed build or boot), if so."""

    name: str
    boots: Sequence[BootRecord]
    failed: str | None = None

    @property
    def good_boots(self) -> list[BootRecord]:
        return [b for b in self.boots if b.status == "ok"]


@dataclasses.dataclass(frozen=True)
class Rules:
    """What the verdict takes from the hypotheses file: the sequential design (the
    family's alpha, the boots per arm before the first look and at most, the
    analysis), the size of the multiplicity family (every hypothesis of the file,
    whatever ``--only`` kept) and the host thresholds its warnings judge by."""

    design: Design
    family_size: int
    thresholds: Thresholds = dataclasses.field(default_factory=Thresholds)
    #: the shares of the family's alpha a look may spend: 1 (Bonferroni), more where a curve's
    #: step-down recycled the shares of its confirmed points (``decide.multiplicity.step_down``)
    shares: float = 1.0
    #: False: a look leaves the robust analysis' interval uncomputed where only its outcome
    #: is read (the curve's step-down at the looks that do not confirm; the benches)
    interval: bool = True

    @property
    def alpha_each(self) -> float:
        """Each hypothesis' alpha: Bonferroni over the family, times :attr:`shares`."""
        return adjust_alpha(self.design.alpha, self.family_size) * self.shares

    def at(self, alpha: float) -> "Rules":
        """These rules with the shares that make :attr:`alpha_each` ``alpha`` (a curve's
        step-down level: ``decide.multiplicity.step_down``)."""
        return dataclasses.replace(self, shares=alpha / adjust_alpha(self.design.alpha, self.family_size))


def prior_design(design: Design, prior: NoisePrior | None) -> Design:
    """The design a look takes with ``prior``: calibrated for its degrees of freedom,
    its first look at 2 rounds; ``design`` itself without a prior, or where its
    analysis does not read rounds (the prior is then not used)."""
    if prior is None or not ANALYSES[design.analysis].takes_prior:
        return design
    return dataclasses.replace(design, min_boots=min(2, design.min_boots), prior_dof=prior.dof)


def _prior_for(prior: NoisePrior | None, *sides: Sequence[BootRecord]) -> tuple[NoisePrior | None, dict | None]:
    """The prior a look may pool, and why one offered was not: a look with a boot the
    host check found busy does not pool it (that host is not the one the prior
    measured: a neighbour spreads boots more than its rounds can show at 2 or 3)."""
    if prior is None:
        return None, None
    busy = [b.id for side in sides for b in side if (c := host_state.BootContention.of(b)) is not None and c.busy]
    if not busy:
        return prior, None
    return None, {"boots": busy, "prior": dataclasses.asdict(prior),
                  "reason": "boots the host check found busy: the host is not the one the prior measured"}


@dataclasses.dataclass(frozen=True)
class Question:
    """What a hypothesis claims of its two sides: ``metric`` moves in the direction
    ``expect`` by at least ``min_effect`` (a fraction: 0.05 is 5%); ``mechanism``: the
    further claims (each a :class:`Question`) that must hold for the claim's mechanism
    to count as engaged (``decide.layers``), judged by :func:`look` on the same boots."""

    metric: str
    expect: Expect
    min_effect: float
    mechanism: tuple["Question", ...] = ()
    point: str | None = None  # the load point (workload.LoadPoint.label) whose samples answer it; None: the one


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One look at a hypothesis, decided: ``outcome`` (confirmed, refuted, inconclusive);
    ``final`` (no more boots will change it: decided, the budget spent, or forced);
    ``ratio`` treatment over baseline, ``ci`` its repeated interval, ``p_value`` against
    no change (None where the look did not reach them); ``test`` and ``alpha`` (this
    hypothesis' share of the family's) what decided it, ``reason`` why, in a sentence;
    the boots of each side whose values it used; ``findings`` what it found about its
    boots (marks, busy hosts, drift, ...); ``stats`` its figures beyond these.
    ``record.ledger.verdict_row`` stores it."""

    outcome: Outcome
    final: bool
    test: str
    alpha: float
    reason: str
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    p_value: float | None = None
    baseline_boot_ids: tuple[int, ...] = ()
    treatment_boot_ids: tuple[int, ...] = ()
    findings: tuple[Finding, ...] = ()
    stats: VerdictStats = VerdictStats()

    @property
    def warnings(self) -> tuple[str, ...]:
        """The findings' sentences, in order (what the CLI prints)."""
        return tuple(f.text for f in self.findings)

    def with_stats(self, **changes) -> "Verdict":
        """This verdict with ``changes`` (fields of :class:`VerdictStats`) set in its stats."""
        return dataclasses.replace(self, stats=self.stats.with_(**changes))


def judge(rules: Rules, baseline: Side, treatment: Side, question: Question, *, force_final: bool = False,
          order_seed: int | None = None, config_findings: Sequence[Finding] = (),
          prior: NoisePrior | None = None) -> Verdict:
    """The verdict of one look at ``question`` (its metric alone: :func:`look` judges its
    mechanism too). ``force_final``: the caller will look no more (the budget is spent).
    ``order_seed``: the seed that drew the order of the sides in each round, kept in the
    stats. ``config_findings``: what the caller knows of the configs compared that
    their boots do not say (``engines.attach.verdict_findings``: an attached server's).
    ``prior``: the noise prior of earlier runs of the same two configs on this host
    (:mod:`bisect_harness.decide.prior`), pooled where the design's analysis reads
    rounds; its first look is then at 2 rounds (see :func:`prior_design`).
    ``rules.interval``: False leaves the robust analysis' interval uncomputed where only the
    outcome is wanted (``evaluate``'s: the outcome does not depend on it).

    What this module works out itself comes first (the boots' checks, device sets,
    the design), then what it asks of others (the sides' findings, the values, the test)."""
    metric = question.metric
    bgood, tgood = baseline.good_boots, treatment.good_boots
    never = [w for w in (never_booted(s.name, s.boots, s.failed) for s in (baseline, treatment)) if w]
    checks_all, checks_good = checks_done([*baseline.boots, *treatment.boots]), checks_done([*bgood, *tgood])
    blocks = device_blocks(bgood, tgood)
    prior, prior_dropped = _prior_for(prior, bgood, tgood)
    the_design = prior_design(rules.design, prior)
    prior = prior if the_design.prior_dof else None
    findings = tuple(side_findings(rules, baseline, treatment, config_findings))
    bv = BootValues.of(bgood, metric, point=question.point)
    tv = BootValues.of(tgood, metric, point=question.point)
    alpha = rules.alpha_each
    undecided = Verdict(outcome=Outcome.INCONCLUSIVE, final=True, test="none", alpha=alpha, reason="",
                        findings=findings, stats=VerdictStats(family_size=rules.family_size, checks=checks_all))
    if never:
        return dataclasses.replace(undecided, reason="not measured: " + "; ".join(never), test=NOT_MEASURED)
    failed = [s for s in (baseline, treatment) if s.failed]
    if failed:
        which = " and ".join(f"{s.name} ({s.failed})" for s in failed)
        return dataclasses.replace(undecided, reason=f"could not be measured: {which}")
    if not bv.values or not tv.values:
        return dataclasses.replace(undecided, reason=f"metric {metric} has no values in "
                                   f"{'baseline' if not bv.values else 'treatment'} boots (see the boots' source "
                                   "problems)")
    ids = dict(baseline_boot_ids=tuple(bv.boot_ids), treatment_boot_ids=tuple(tv.boot_ids))
    # Round of a boot: its place among its config's good boots (round i holds the i-th of each).
    rounds = tuple([i for i, x in enumerate(good) if x.id in set(v.boot_ids)]
                   for good, v in ((bgood, bv), (tgood, tv)))
    try:
        res = evaluate([list(v) for v in bv.values], [list(v) for v in tv.values], expect=question.expect,
                       min_effect=question.min_effect, design=the_design, alpha=alpha, rounds=rounds, prior=prior,
                       interval=rules.interval)
    except ValueError as exc:  # e.g. a metric that is zero or constant: there is no ratio to test
        return dataclasses.replace(undecided, reason=f"metric {metric} cannot be compared: {exc}. Pick a metric with "
                                   "positive, varying values (a rate, a latency, a count per sample)", **ids)
    stats = res.figures().with_(
        family_size=rules.family_size, checks=checks_good, family_alpha=rules.design.alpha,
        rounds=tuple(tuple(r) for r in rounds), order_seed=order_seed,
        noise_prior=jsonable(dataclasses.asdict(prior)) if prior is not None else None,
        noise_prior_dropped=jsonable(prior_dropped) if prior_dropped else None, device_blocks=blocks or None)
    return Verdict(outcome=res.outcome, final=res.final or force_final, ratio=res.ratio, ci=res.ci,
                   p_value=res.p_value, test=res.test, alpha=alpha, reason=res.reason, findings=findings,
                   stats=stats, **ids)


def looks_used(side: Side, used: Sequence[int]) -> int:
    """How many of ``side``'s good boots a verdict that used the boots ``used`` had
    before it: the place of the last of them among the side's good boots (its look,
    where every good boot had values)."""
    ids = set(used)
    places = [i + 1 for i, b in enumerate(side.good_boots) if b.id in ids]
    return max(places, default=0)


def _first_good(side: Side, n: int) -> Side:
    """``side`` as it stood at its ``n``-th good boot: its boots up to that one, in order."""
    out, good = [], 0
    for b in side.boots:
        if good >= n:
            break
        out.append(b)
        good += b.status == "ok"
    return dataclasses.replace(side, boots=tuple(out))


def rejudge(rules: Rules, baseline: Side, treatment: Side, question: Question, *,
            upto: tuple[int, int], order_seed: int | None = None, config_findings: Sequence[Finding] = (),
            prior: NoisePrior | None = None) -> Verdict | None:
    """A hypothesis judged again under ``rules`` at a recycled level (``Rules.at(alpha)``)
    over its looks: the verdict of the first look at which :func:`judge`, its boundaries
    recomputed for that level, confirms, or
    None where none does. ``upto``: each side's good boots at the look that ended its
    first verdict (:func:`looks_used`); look ``n`` reads each side's first ``n`` of them,
    as the rounds did. A curve's step-down asks it (``decide.multiplicity.step_down``:
    why "some look up to the first verdict's" holds its level), and a refutation at
    that level stops nothing: only the first verdict's level refutes. The looks that do
    not confirm are judged without the interval (``Rules.interval``); the confirming one
    with it, unless ``rules.interval`` is False (the benches)."""
    kw = dict(order_seed=order_seed, config_findings=config_findings, prior=prior)
    quick = dataclasses.replace(rules, interval=False)
    for n in range(2, max(upto) + 1):
        sides = (_first_good(baseline, min(n, upto[0])), _first_good(treatment, min(n, upto[1])))
        if judge(quick, *sides, question, **kw).outcome is Outcome.CONFIRMED:
            return dataclasses.replace(judge(rules, *sides, question, **kw), final=True)
    return None


def look(rules: Rules, baseline: Side, treatment: Side, question: Question, *, force_final: bool = False,
         order_seed: int | None = None, config_findings: Sequence[Finding] = (),
         prior: NoisePrior | None = None) -> Verdict:
    """One look at a hypothesis: :func:`judge` on its metric and, when the question
    names mechanism claims, on each of them too, split into three layers (flag
    accepted / mechanism engaged / outcome moved, ``mechanism.layers``) in the
    stats' ``layers``. ``prior``: the noise prior of the hypothesis' metric (the
    mechanism metrics are judged without one)."""
    v = judge(rules, baseline, treatment, question, force_final=force_final, order_seed=order_seed,
              config_findings=config_findings, prior=prior)
    if not question.mechanism:
        return v

    def judge_one(m: Question) -> Verdict:
        return judge(rules, baseline, treatment, m, force_final=force_final, config_findings=config_findings)

    return v.with_stats(layers=layers(judge_one, flag_boots=treatment.boots, mechanism=question.mechanism,
                                      outcome=v.outcome.value))


def checks_done(boots: Sequence[BootRecord]) -> dict:
    """How many of ``boots`` (the good ones) had each check answer: the env check
    (a requested var, every process read), the flag check, the mechanism check
    (the measured window read: a state in ``mechanisms.ANSWERED``; "not observable"
    is no answer). A verdict whose boots answered none of them is *unchecked*,
    never "ok".

    ``flags`` counts the boots whose every planned flag the server reported back
    (compared, matched or not); ``flags_compared`` and ``flags_not_reported`` count
    the flags by name over the boots, and ``not_reported`` names those the server
    did not report in some boot (a flag with no server-info key, or no server
    info): such a flag is never counted as checked."""
    out: dict = {"env": 0, "flags": 0, "mechanisms": 0}
    compared: set[str] = set()
    missing: set[str] = set()
    for b in boots:
        if b.status != "ok":
            continue
        env = b.env_report or {}
        if env.get("vars") and env.get("state", "ok" if env.get("ok") else "missing") != "unverified":
            out["env"] += 1
        flag_checks = (b.flag_report or {}).get("checks", [])
        answered = {c.get("flag") for c in flag_checks if c.get("status") in ("matched", "mismatched")}
        compared |= answered
        missing |= {c.get("flag") for c in flag_checks if c.get("status") not in ("matched", "mismatched")}
        if flag_checks and len(answered) == len(flag_checks):
            out["flags"] += 1
        if any(m.get("state") in ANSWERED for m in evidence_of(b).mechanisms or ()):
            out["mechanisms"] += 1
    out.update(flags_compared=len(compared), flags_not_reported=len(missing), not_reported=sorted(map(str, missing)))
    return out


def _block(boot: BootRecord) -> str | None:
    """The device set (and node) a boot ran on, as recorded by its backend."""
    d = evidence_of(boot).devices
    if not isinstance(d, Mapping):
        return None
    return str(d.get("label") or d.get("slot"))


def device_blocks(a: Sequence[BootRecord], b: Sequence[BootRecord]) -> dict | None:
    """How each side's good boots spread over device sets (slots, nodes). None when
    every boot ran on one set (nothing to block on)."""
    sides = {"baseline": [_block(x) for x in a], "treatment": [_block(x) for x in b]}
    labels = {x for xs in sides.values() for x in xs if x is not None}
    if len(labels) <= 1:
        return None
    return {side: {label: xs.count(label) for label in sorted(labels)} for side, xs in sides.items()}


def _device_finding(a: Sequence[BootRecord], b: Sequence[BootRecord]) -> list[Finding]:
    """Side and device set confounded: each side ran on its own sets only, so a
    difference between GPUs, cores or nodes reads as an effect. Its figures: the
    sets each side used (``baseline``, ``treatment``) and the boots per set and side
    (``blocks``, :func:`device_blocks`)."""
    blocks = device_blocks(a, b)
    if not blocks:
        return []
    used = {side: sorted(k for k, n in counts.items() if n) for side, counts in blocks.items()}
    if set(used["baseline"]) & set(used["treatment"]):
        return []
    text = (f"device sets confounded with the sides: baseline ran only on {', '.join(used['baseline'])}, "
            f"treatment only on {', '.join(used['treatment'])}; a difference between those devices or nodes "
            "reads as an effect (more rounds rotate the sets, or run with one slot)")
    return [Finding(FindingKind.DEVICES_CONFOUNDED, text, boots=tuple(x.id for x in (*a, *b)),
                    figures={**used, "blocks": blocks})]


def marked_boots(side: Side) -> list[Finding]:
    """A ``marked_boot`` finding for each boot of ``side`` that carries marks (figures
    ``marks``: their names, in the order the boot recorded them)."""
    return [Finding(FindingKind.MARKED_BOOT, f"{side.name} boot {bt.id}: {', '.join(bt.marks)}", side=side.name,
                    boots=(bt.id,), figures={"marks": list(bt.marks)}) for bt in side.boots if bt.marks]


def side_findings(rules: Rules, b: Side, t: Side, config_findings: Sequence[Finding] = ()) -> list[Finding]:
    """Marked boots on either side, a config whose boots reported different code,
    what the caller knows of the configs (``config_findings``), and every way the two
    sides' hosts differed: drift, device sets, contention, calibration and preflight."""
    bgood, tgood = b.good_boots, t.good_boots
    mixed = [m for m in (engine_identity.mixed_versions(side.name, side.boots) for side in (b, t)) if m]
    thresholds = rules.thresholds
    return [*marked_boots(b), *marked_boots(t), *mixed, *config_findings, *drift_findings(bgood, tgood),
            *_device_finding(bgood, tgood),
            *host_state.contention_findings({b.name: b.boots, t.name: t.boots}, thresholds),
            *host_state.calibration_findings(host_state.side_runs(b.boots, t.boots), thresholds)]


class NightRule:
    """Nightly's rule, stepped by its driver: an alert must survive fresh boots.

    Made with the earlier nights' boots and tonight's, it looks once
    (``shift.detect_shift``). When that look alerts, :attr:`wants_fresh_boots` is
    true: the driver boots tonight's commit again (up to its budget) and gives
    :meth:`record` all of tonight's boots, and the test runs again on them. Only an
    alert at both looks stands (:attr:`shift`). Requiring both can only lower the
    false-alert rate (the first look alone holds alpha), and it removes the false
    alerts of a night whose few boots stalled together (a heavy-tailed host), which a
    regression cannot survive: its new boots are slow too::

        rule = NightRule(history, tonight, worse=Expect.DECREASE, min_effect=0.05, alpha=0.01, window=7)
        if rule.wants_fresh_boots:
            rule.record(tonight_after_more_boots)
        rule.shift
    """

    def __init__(self, history: Sequence[Sequence[Sequence[float]]], tonight: Sequence[Sequence[float]], *,
                 worse: Expect, min_effect: float, alpha: float, window: int):
        self._history, self._tonight = history, tonight
        self._kw = dict(worse=worse, min_effect=min_effect, alpha=alpha, window=window)
        self.shift: Shift = detect_shift(history, tonight, **self._kw)
        self.wants_fresh_boots = self.shift.regressed

    def record(self, again: Sequence[Sequence[float]]) -> None:
        """All of tonight's boots after booting it again (those the first look had, first)."""
        if not self.wants_fresh_boots:
            raise RuntimeError("NightRule.record: the first look did not alert; no second look is asked for")
        self.wants_fresh_boots = False
        first, tonight = self.shift, self._tonight
        if len(again) <= len(tonight):  # no fresh boots to be had: the first look stands
            return
        second = detect_shift(self._history, again, **self._kw)
        self.shift = second if second.regressed else dataclasses.replace(second, reason=(
            f"{second.reason}; the first look's alert ({first.ratio:.4f}x on {len(tonight)} boots) did not "
            f"survive {len(again) - len(tonight)} fresh boots"))


def judge_night(history: Sequence[Sequence[Sequence[float]]], tonight: Sequence[Sequence[float]],
                more: Callable[[], Sequence[Sequence[float]]], *, worse: Expect, min_effect: float, alpha: float,
                window: int) -> Shift:
    """:class:`NightRule` driven by ``more()`` (boots tonight again, returns all of
    tonight's boots), for drivers that boot in one call: the benches' simulated hosts."""
    rule = NightRule(history, tonight, worse=worse, min_effect=min_effect, alpha=alpha, window=window)
    if rule.wants_fresh_boots:
        rule.record(more())
    return rule.shift
