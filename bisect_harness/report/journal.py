"""The experiment journal: a markdown page rendered from the ledger alone.

Everything on the page is read back from the database, so a journal can be
rendered again at any time (``harness journal RUN``) and every number in it
traces to rows: verdict -> boots -> samples, with each boot's evidence.

:func:`render` puts four kinds of section on the page, each made by a short
function over the ledger's rows into a frozen record the template reads: the run
section (:class:`RunSection`: the head, the summary, the searches, the
calibration), one section per hypothesis (:class:`HypothesisSection`: its
verdict, what it found grouped by kind, its boots and their values, the host
drift between its sides), one per load curve before its points' hypotheses
(``curve_view.CurveSection``: the curve's answer as stored, its points' table and
plot) and one per config (``config_view.ConfigSection``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jinja2
from sqlalchemy import select

from bisect_harness.observe import host_state
from bisect_harness.decide.evaluate import OUTCOME_FOOTNOTE
from bisect_harness.evidence import Finding, FindingKind, RunHost, VerdictStats
from bisect_harness.spec import metric_defs
from bisect_harness.report import (bisection_view, config_view, curve_view, explain_view, profile_view, summary_view,
                                   warnings_view, window_view)
from bisect_harness.report.cells import boots_per_arm, effect, fmt as _fmt, md as _md
from bisect_harness.record.ledger import Bisection, Boot, Ledger, Run, boot_records
from bisect_harness.observe.drift import host_drift
from bisect_harness.secrets import redact_text
from bisect_harness.model import shown_outcome
from bisect_harness.report import plots, reproduce
from bisect_harness.report import resumed as _resume
from bisect_harness.report.index import journal_stem, write_index


def _mean(vals: Sequence[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def checks_word(checked: dict | None) -> str:
    """``ok (env, flags)``: what the boots' checks answered; ``unchecked`` when none did
    (no env requested, no flag reported back, no mechanism evidence). ``flags`` is
    there only when every planned flag was compared in every boot counted; flags the
    server did not report are named after it (``ok (env), flags: 1 compared, 1 not
    reported (flash-attn)``), never read as ok. ``None``: a verdict recorded before
    the harness counted its checks."""
    if checked is None:
        return "ok"
    # recorded before the harness counted not-reported flags: its "flags" is a boot with any flag compared
    earlier = "flags_not_reported" not in checked
    missing = [] if earlier else list(checked.get("not_reported") or [])
    done = [k for k in ("env", "flags", "mechanisms") if checked.get(k)
            and not (k == "flags" and (earlier or missing))]
    word = f"ok ({', '.join(done)})" if done else "unchecked"
    if missing:
        word += ", " + _not_reported(checked)
    elif earlier and checked.get("flags"):
        word += ", flags: some compared (recorded before not-reported flags were counted)"
    return word


def _not_reported(checked: dict | None) -> str:
    """``flags: 2 compared, 1 not reported (flash-attn)``, or "" when every flag was compared."""
    missing = list((checked or {}).get("not_reported") or [])
    if not missing:
        return ""
    n, compared = checked.get("flags_not_reported") or len(missing), checked.get("flags_compared") or 0
    return "flags: " + (f"{compared} compared, " if compared else "") + f"{n} not reported ({', '.join(missing)})"


#: The findings the verdict table counts apart from the boots' marks, and its word for each.
_COUNTED = ((FindingKind.CONTENTION_DIFFERED, "contention differs"),
            (FindingKind.CALIBRATION_NOISY, "calibration noisy"),
            (FindingKind.PREFLIGHT_BUSY, "busy at preflight"))


def checks_cell(found: Sequence[Finding], drift: int, checked: Mapping | None = None) -> str:
    """The verdict table's summary of what the boot checks found, counted by finding kind
    (never by a sentence's words): each mark of the marked boots, engine versions that
    differ, ``drift`` host differences, contention that differed, noisy calibration and a
    busy preflight; else what was checked and passed (:func:`checks_word` of ``checked``,
    the verdict's ``checks`` figures), or ``unchecked``."""
    counts: dict[str, int] = {}
    for f in found:
        for name in ("engine versions differ",) if f.kind is FindingKind.ENGINE_VERSIONS else warnings_view.marked(f):
            counts[name] = counts.get(name, 0) + 1
    parts = [f"{mark} x{n}" for mark, n in sorted(counts.items())]
    if drift:
        parts.append(f"host drift ({drift})")
    for kind, label in _COUNTED:
        n = sum(1 for f in found if f.kind is kind)
        if n:
            parts.append(label if n == 1 else f"{label} x{n}")
    if not parts:
        return checks_word(checked)
    unchecked = _not_reported(checked)  # beside the marks too: a flag not compared is never hidden
    return "**" + ", ".join(parts) + "**" + (f", {unchecked}" if unchecked else "")


def cost_line(cost) -> str | None:
    """What a verdict cost, as its stats recorded it (the executor's ``verdict_cost``),
    in one sentence; None for a verdict recorded before costs were kept."""
    if not cost:
        return None
    boots = cost.get("boots") or {}
    text = (f"{boots.get('baseline', 0)} + {boots.get('treatment', 0)} boots (baseline + treatment, failed and "
            f"left-out ones included), {cost.get('samples', 0)} samples, {_fmt(cost.get('node_s'), 1)} s of node "
            "time as measured")
    model = cost.get("model")
    if model:
        how = "as the file states them" if model.get("source") == "stated" else "as measured in this run's boots"
        text += (f"; a boot costs {_fmt(model.get('boot_s'), 1)} s beside its samples and a sample "
                 f"{_fmt(model.get('sample_s'), 2)} s ({how})")
        if cost.get("samples_chosen", True):
            text += ", the prices by which later rounds chose their samples per boot"
        else:
            text += "; every boot took the file's fixed count of samples"
    return text


def prior_line(stats: VerdictStats | None) -> str | None:
    """The noise prior a verdict was offered, as its stats recorded it, in one
    sentence: where it came from, and whether the verdict's own look pooled it, its
    rounds contradicted it (their own spread, from the rounds' log ratios), the look
    was the sign-flip test's, or a busy boot kept it out; None for a verdict without one."""
    stats = stats or VerdictStats()
    prior, dropped = stats.noise_prior, stats.noise_prior_dropped
    if not prior and dropped:
        offered = dropped.get("prior") or {}
        return (f"{_prior_source(offered)} was offered but not pooled: boots "
                f"{', '.join(str(i) for i in dropped.get('boots') or [])} of this verdict ran on a host the host "
                "check found busy, not the host the prior measured; the rounds were tested alone")
    if not prior:
        return None
    text = _prior_source(prior)
    if stats.prior_pooled is True:
        return text + "; this look's t-test pooled it with its own rounds"
    if stats.prior_contradicted is True:
        ratios = stats.round_log_ratios or ()
        own = (f"{_fmt(100 * statistics.stdev(ratios), 2)}%" if len(ratios) > 1 else "undetermined")
        return text + (f"; this look's {len(ratios)} rounds spread {own}, which contradicts it, so they were "
                       "tested alone")
    if stats.prior_contradicted is False:
        return text + "; this look was the sign-flip test's, which pools no prior"
    return text + "; whether this look pooled it is not recorded"


def _prior_source(prior: dict) -> str:
    boots, var, runs = prior.get("boots") or [], prior.get("var"), prior.get("runs")
    return (f"{prior.get('rounds')} rounds of {runs} earlier run{'' if runs == 1 else 's'} of the same two configs "
            f"on this host (boots {', '.join(str(i) for i in boots)}) gave a round's log ratio a spread of "
            f"{_fmt(100 * var ** 0.5 if var else None, 2)}% with {prior.get('dof')} degrees of freedom")


def _host_line(host: Mapping[str, Any]) -> str:
    if not host:
        return "unknown"
    gpus = host.get("gpus") or []
    gpu = (f"{len(gpus)}x {gpus[0].get('name')}, driver {gpus[0].get('driver_version')}" if gpus
           else host.get("gpu_note") or "no GPU")
    return (f"{host.get('hostname', '?')}, {host.get('cpu_model', '?')} ({host.get('cpu_count_logical', '?')} cores), "
            f"{gpu}, kernel {host.get('kernel', '?')}, boot id {str(host.get('boot_id', '?'))[:8]}")


SIDES = ("baseline", "treatment")


@dataclass(frozen=True)
class _Page:
    """What every section of one run's page reads: the run, where its plots go, the
    metrics its file declares, and the rows the sections share (read once)."""

    run: Run
    plots_dir: Path | None
    stem: str
    declared: Mapping
    bisections: Sequence[Bisection]
    boot_of: Callable[[int], Boot | None]   # a finding's boot, for its stored figures
    later: Callable[[Boot], str | None]     # a boot's label when the run's searches booted it
    before_resume: frozenset[int]           # ok boots counted before a resume of the run
    points: Mapping[int, str] = field(default_factory=dict)  # hypothesis row id -> its load point's label
    logs: dict = field(default_factory=dict)  # (commits, releases) -> the commits between them


@dataclass(frozen=True)
class JournalSections:
    """One run's page as the sections the journal's template reads: the run section
    (``head``), a section per hypothesis, a block per curve by the id of the
    hypothesis it goes before (``curves_at``), the curves themselves and a section
    per config. The markdown journal and the HTML report (``report.html``) print the
    same sections."""

    head: RunSection
    hypotheses: list[HypothesisSection]
    curves_at: dict[str, curve_view.CurveSection]
    curves: list[curve_view.Curve]
    configs: list


def render(ledger: Ledger, run: Run, *, plots_dir: Path | None = None) -> str:
    """The journal's markdown for one run: the run section (its head, summary, searches
    and calibration), a section per hypothesis and a section per config, each made from
    the ledger's rows by a function of its own (:func:`sections`)."""
    parts = sections(ledger, run, plots_dir=plots_dir)
    env = jinja2.Environment(loader=jinja2.PackageLoader("bisect_harness", "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=False, lstrip_blocks=False)
    return _tidy(env.get_template("journal.md.j2").render(**vars(parts.head), hypotheses=parts.hypotheses,
                                                          configs=parts.configs, curves_at=parts.curves_at))


def sections(ledger: Ledger, run: Run, *, plots_dir: Path | None = None) -> JournalSections:
    """The sections of ``run``'s page, each made from the ledger's rows (plots written
    into ``plots_dir``; None: none drawn)."""
    session = ledger.session
    if not (session.new or session.dirty or session.deleted):
        # Rows read while the run went on hold lists that grew since (the closing
        # calibration, the last looks, a search's boots): the journal reads them again.
        session.expire_all()
    bisection_rows = session.scalars(select(Bisection).where(Bisection.run_id == run.id)).all()
    page = _Page(run=run, plots_dir=plots_dir, stem=journal_stem(run),
                 declared=metric_defs.declared_metrics(run.spec_text),  # engine.metrics, read once for the window view
                 bisections=bisection_rows, boot_of=lambda boot_id: session.get(Boot, boot_id),
                 later=_after_rounds(run, bisection_rows),
                 before_resume=frozenset(i for r in _resume.resumes(run) for i in r.counted_ok_boot_ids),
                 points={row: label for row, (_, label, _) in curve_view.memberships(run).items()})
    hyps = [_hypothesis_section(h, page) for h in run.hypotheses]
    curves = curve_view.curves_of(run)
    curves_at = _curve_sections(curves, page)
    configs = [config_view.config_section(c) for c in run.configs]
    run_boots = session.scalars(select(Boot).where(Boot.run_id == run.id).order_by(Boot.id)).all()
    head = _run_section(page, hyps, run_boots, curves)
    return JournalSections(head=head, hypotheses=hyps, curves_at=curves_at, curves=list(curves), configs=configs)


def _curve_sections(curves: Sequence[curve_view.Curve], page: _Page) -> dict[str, curve_view.CurveSection]:
    """Each curve's block, by the id of the hypothesis it goes before (the curve's first
    point as the run lists its hypotheses)."""
    out = {}
    for curve in curves:
        first = next(h for h in page.run.hypotheses if h.hid in {p.hypothesis for p in curve.points})
        out[first.hid] = curve_view.section(curve, plots_dir=page.plots_dir, stem=page.stem,
                                            unit=metric_unit(first, page.run.spec_text))
    return out


# --------------------------------------------------------------------------- the run section


@dataclass(frozen=True)
class RunSection:
    """The run's own parts of the page, by the template's names: its head (spec, host,
    resumes, the commands that run it again), the summary lines, the nightly
    change points, the searches (bisections, explanations) and the calibration."""

    run: Run
    title: str
    spec_name: str
    host_line: str
    resumes: list[str]
    run_command: str
    resume_command: str | None
    summary: list[str]
    changepoint_lines: list[str]
    bisections: list[dict]
    explanations: list[dict]
    calibrations: list[dict]
    calibration_figures: list[dict]
    ci_label: str = "confidence interval"
    footnote: str = OUTCOME_FOOTNOTE


def _run_section(page: _Page, hyps: Sequence["HypothesisSection"], run_boots: Sequence[Boot],
                 curves: Sequence[curve_view.Curve] = ()) -> RunSection:
    run = page.run
    run_command, resume_command = reproduce.run_command(run, page.bisections), reproduce.resume_command(run)
    bisections = [{**bisection_view.view(bis, boot_of=page.boot_of, plots_dir=page.plots_dir, stem=page.stem),
                   "metric_def": _md(metric_defs.definition_line(bis.metric, None, run.spec_text))}
                  for bis in page.bisections]
    cals, cal_figures = _calibrations(run)
    return RunSection(
        run=run, title=Path(run.spec_path).name, spec_name=run.spec_path, host_line=_host_line(RunHost.from_json(run.host).machine),
        resumes=[_md(_resume.run_line(r)) for r in _resume.resumes(run)],
        run_command=run_command, resume_command=resume_command,
        summary=_summary_lines(run, hyps, bisections, curves), changepoint_lines=_changepoint_lines(run),
        bisections=bisections,
        explanations=explain_view.views(run.summary, run_boots, again=resume_command or run_command),
        calibrations=cals, calibration_figures=cal_figures)


def _calibrations(run: Run) -> tuple[list[dict], list[dict]]:
    """The run's calibration probes in words, and the figures of each probe's measurements."""
    cals, figures = [], []
    for cal in run.calibrations:
        cals.append({"phase": cal.phase, "text": _md(_calibration_text(cal.result))})
        for m in (cal.result or {}).get("measurements") or []:
            vals = [float(x) for x in m.get("values") or []]
            figures.append({"phase": cal.phase, "name": _md(m.get("name")), "device": _md(m.get("device")),
                            "median": _fmt(float(m["median"]), 2) if m.get("median") is not None else "n/a",
                            "unit": _md(m.get("unit", "")), "spread": f"{m['spread']:.1%}" if m.get("spread")
                            is not None else "n/a", "n": len(vals),
                            "range": f"{_fmt(min(vals), 2)} to {_fmt(max(vals), 2)}" if vals else "n/a"})
    return cals, figures


# --------------------------------------------------------------------------- a hypothesis' section


@dataclass(frozen=True)
class BootRow:
    """One boot of a hypothesis' two configs in its table: its side, its status (and why
    the verdict did not use it), its values of the metric and their mean, its marks."""

    side: str
    id: int
    status: str
    samples: str
    mean: str
    marks: str


@dataclass(frozen=True)
class SideBoots:
    """A hypothesis' boots as the section reads them: the table's rows, the plot's
    points, and per side the boots the verdict used (ok ones, in boot order), the
    first boot used of each side, and the boot means of those used."""

    rows: tuple[BootRow, ...]
    points: tuple[plots.BootPoint, ...]
    used: Mapping[str, tuple[Boot, ...]]
    first_used: Mapping[str, Boot]
    means: Mapping[str, tuple[float, ...]]


@dataclass(frozen=True)
class VerdictPart:
    """A hypothesis' verdict in the page's words: its answer, estimate and test, the
    checks cell, what it found (grouped), its cost, noise prior and mechanism layers."""

    outcome: str
    lead: str
    effect: str
    boots_text: str
    ratio: str
    ci: str
    test: str
    alpha: str
    reason: str
    checks: str
    warnings: dict
    layers: list[str]
    cost: str | None
    prior: str | None


@dataclass(frozen=True)
class DriftRow:
    """One difference between the two sides' hosts (``observe.drift``), in words."""

    field: str
    a: str
    b: str
    severity: str
    message: str


@dataclass(frozen=True)
class HypothesisSection:
    """One hypothesis as the page prints it: what it claims, its verdict
    (:class:`VerdictPart`), its boots (:class:`BootRow`), what differed between the
    sides' hosts (:class:`DriftRow`), what ran in the windows, the profiles, the
    commits between the sides and how each side's first boot ran."""

    id: str
    row_id: int
    metric: str
    claim: str
    statement: str
    metric_def: str
    baseline_label: str
    treatment_label: str
    verdict: VerdictPart
    boot_rows: tuple[BootRow, ...]
    baseline_mean: str
    treatment_mean: str
    drift: tuple[DriftRow, ...]
    drift_checked: bool
    same_host: bool
    not_same: str
    window: dict | None
    profile: dict | None
    resumed: list[str]
    plot: str | None
    plot_missing: str | None
    commands: list[dict]
    git_log: list[str]
    git_note: str
    points: tuple[plots.BootPoint, ...] = ()  # the plot's points: each boot's values, as the section read them


def _hypothesis_section(h, page: _Page) -> HypothesisSection:
    run, v = page.run, h.verdict
    boots = _side_boots(h, page)
    drift = tuple(DriftRow(field=d.field, a=_md(d.a), b=_md(d.b), severity=d.severity.value, message=_md(d.message))
                  for d in host_drift(boot_records(boots.used["baseline"]), boot_records(boots.used["treatment"])))
    same, not_same = host_state.same_host_state(boots.used["baseline"], boots.used["treatment"], drift)
    unit = metric_unit(h, run.spec_text)
    plot, plot_missing = _plot(h, boots, unit, page)
    git_log, git_note = _commit_log(h, page)
    means = {side: (_fmt(_mean(ms), 2) + (f" {unit}" if unit else "") + f" (mean of {len(ms)} boot means)"
                    if ms else "not recorded (no boot used)") for side, ms in boots.means.items()}
    return HypothesisSection(
        id=h.hid, row_id=h.id, metric=h.metric, statement=h.statement,
        claim=f"{h.expect} >= {h.min_effect:.0%}" if h.min_effect >= 0.01 else f"{h.expect} >= {h.min_effect:.1%}",
        metric_def=_md(metric_defs.definition_line(h.metric, (h.spec or {}).get("metric_def"), run.spec_text)),
        baseline_label=h.baseline.label, treatment_label=h.treatment.label,
        verdict=_verdict_part(v, len(drift), page), boot_rows=boots.rows,
        baseline_mean=means["baseline"], treatment_mean=means["treatment"],
        drift=drift, drift_checked=bool(boots.used["baseline"] and boots.used["treatment"]),
        same_host=same, not_same="; ".join(not_same),
        window=window_view.hypothesis_view(h, page.declared),
        profile=profile_view.hypothesis_view(h, run, page.plots_dir),
        resumed=[_md(x) for x in _resume.journal_lines(
            run, v.baseline_boot_ids if v else [], v.treatment_boot_ids if v else [],
            [b.id for b in (*h.baseline.boots, *h.treatment.boots)])],
        plot=plot, plot_missing=plot_missing,
        commands=[{"side": side, "boot": b.id, "text": reproduce.boot_command(b)}
                  for side, b in sorted(boots.first_used.items())],
        git_log=git_log, git_note=git_note, points=boots.points)


def _verdict_part(v, drift: int, page: _Page) -> VerdictPart:
    """The verdict ``v`` (None: the run stopped before one) in words; ``drift``: how many
    differences the sides' hosts showed."""
    if v is None:
        return VerdictPart(
            outcome=shown_outcome(v), lead=_md(summary_view.verdict_lead(v)), effect="no estimate",
            boots_text="no boots", ratio="n/a", ci="n/a", test="n/a", alpha="n/a",
            reason="no verdict was recorded (the run stopped early)", checks=checks_cell((), drift, {}),
            warnings=warnings_view.grouped((), page.boot_of), layers=[], cost=None, prior=None)
    figures, found = v.figures, v.found
    return VerdictPart(
        outcome=shown_outcome(v), lead=_md(summary_view.verdict_lead(v)),
        effect=effect(v.ratio, v.ci_low, v.ci_high),
        boots_text=boots_per_arm(v.baseline_boot_ids or [], v.treatment_boot_ids or []),
        ratio=_fmt(v.ratio, 4), ci=f"[{_fmt(v.ci_low, 4)}, {_fmt(v.ci_high, 4)}]" if v.ci_low is not None else "n/a",
        test=_md(v.test), alpha=_fmt(v.alpha, 4), reason=_md(v.reason),
        checks=checks_cell(found, drift, figures.checks), warnings=warnings_view.grouped(found, page.boot_of),
        layers=explain_view.layers_lines(figures.layers), cost=cost_line(figures.cost), prior=prior_line(figures))


def _side_boots(h, page: _Page) -> SideBoots:
    """The boots of ``h``'s two configs that this run booted or its verdict used, each
    with its values of the metric at ``h``'s load point (``BootRecord.values``, the one
    reduction)."""
    v = h.verdict
    point = page.points.get(h.id)
    rows, points = [], []
    used_boots: dict[str, list[Boot]] = {side: [] for side in SIDES}
    first_used: dict[str, Boot] = {}
    means: dict[str, list[float]] = {side: [] for side in SIDES}
    for side, cfg in (("baseline", h.baseline), ("treatment", h.treatment)):
        used = (v.baseline_boot_ids if side == "baseline" else v.treatment_boot_ids) if v else []
        shown = [b for b in cfg.boots if b.run_id == page.run.id or b.id in used]
        for boot, rec in zip(shown, boot_records(shown)):
            vals = rec.values(h.metric, point=point)
            if boot.status == "ok" and boot.id in used:
                used_boots[side].append(boot)
            if vals:
                points.append(plots.BootPoint(side=side, boot_id=boot.id, round=boot.seq, values=vals,
                                              marked=bool(boot.marks), used=boot.id in used))
                if boot.id in used:
                    means[side].append(_mean(vals))
            if boot.id in used and side not in first_used:
                first_used[side] = boot
            status = boot.status + ("" if boot.id in used or not v else page.later(boot) or " (unused)")
            rows.append(BootRow(
                side=side, id=boot.id, status=status + (", from before the resume" if boot.id in page.before_resume
                                                        else ""),
                samples=", ".join(_fmt(x, 2) for x in vals) or "-", mean=_fmt(_mean(vals), 2),
                marks=", ".join(boot.marks or []) or "-"))
    return SideBoots(rows=tuple(rows), points=tuple(points), used={s: tuple(b) for s, b in used_boots.items()},
                     first_used=first_used, means={s: tuple(m) for s, m in means.items()})


def _plot(h, boots: SideBoots, unit: str, page: _Page) -> tuple[str | None, str | None]:
    """The hypothesis' plot's file name (None without a plots folder), or why it is missing."""
    if page.plots_dir is None:
        return None, None
    try:
        drawn = plots.plot_hypothesis(list(boots.points),
                                      Path(page.plots_dir) / f"{page.stem}-{reproduce.file_part(h.hid)}.png",
                                      title=f"{h.hid}: {h.metric} per boot", metric=h.metric, unit=unit)
    except plots.PlotNotWritten as exc:  # a full disk: the journal says what is missing
        return None, _md(str(exc))
    return (drawn.name if drawn else None), None


def _commit_log(h, page: _Page) -> tuple[list[str], str]:
    """The commits between the hypothesis' sides (two releases: between their tags), read
    once per pair of sides."""
    rels = tuple((h.spec or {}).get(side, {}).get("release") for side in SIDES)
    pair = (h.baseline.commit, h.treatment.commit, rels)
    if pair not in page.logs:
        page.logs[pair] = reproduce.commit_log(page.run.spec_text, page.run.spec_path, *pair[:2], releases=rels)
    return page.logs[pair]


def _tidy(text: str) -> str:
    """At most one blank line in a row outside code blocks (the template's optional parts
    leave runs of them); a code block (a log, the spec as written) is kept as it is."""
    out: list[str] = []
    fenced = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and not line.strip() and out and not out[-1].strip():
            continue
        out.append(line)
    return "\n".join(out)


def _summary_lines(run: Run, hyps: Sequence["HypothesisSection"], bisections: Sequence[dict],
                   curves: Sequence[curve_view.Curve] = ()) -> list[str]:
    """The journal's first lines: one per hypothesis, with the answers of the searches that
    followed it, a curve's line (its answer as stored) before its points' lines, then
    one per search of its own (``summary_view``)."""
    records = (run.summary or {}).get("explain") or [] if isinstance(run.summary, dict) else []
    lines, told = [], set()
    curve_first = {}
    for curve in curves:
        first = next(h.id for h in hyps if h.id in {p.hypothesis for p in curve.points})
        curve_first[first] = curve_view.curve_line(curve)
    for h in hyps:
        if h.id in curve_first:
            lines.append(curve_first[h.id])
        searches = []
        for b in bisections:
            if b["hypothesis_id"] == h.row_id:
                searches.append(f"bisection {b['id']}: {b['answer']}")
                told.add(("bisection", b["id"]))
        for k, rec in enumerate(records):
            if rec.get("hypothesis_id") == h.row_id:
                searches.append("explanation: " + summary_view.explanation_answer(rec))
                told.add(("explanation", k))
        lines.append(summary_view.hypothesis_line(h, searches))
    for b in bisections:
        if ("bisection", b["id"]) not in told:
            lines.append(f"bisection {b['id']} (`{b['good']}`..`{b['bad']}` on {b['metric']}): {b['answer']}")
    for k, rec in enumerate(records):
        if ("explanation", k) not in told:
            lines.append(_md(f"explanation ({rec.get('fast')} fast, {rec.get('slow')} slow, on {rec.get('metric')}): "
                             + summary_view.explanation_answer(rec)))
    return lines


def _after_rounds(run: Run, bisection_rows: Sequence[Bisection]):
    """A boot's label in a verdict's table when the run's searches booted it: after the
    run's last final verdict, a boot of a hypothesis' config is a ``bisect: true`` or
    ``explain: true`` search's, not a round's the verdict left out. Else None."""
    if run.kind != "run" or not run.hypotheses or any(h.verdict is None or not h.verdict.final
                                                        for h in run.hypotheses):
        return lambda boot: None  # rounds were still going: a later boot may be a round's
    searches = ["bisection"] if any(b.hypothesis_id is not None for b in bisection_rows) else []
    summary = run.summary if isinstance(run.summary, dict) else {}
    searches += ["explanation"] if (summary.get("explain") or summary.get("explaining")) else []
    if not searches:
        return lambda boot: None
    end = max(h.verdict.created_at for h in run.hypotheses)
    word = f" (booted by the run's {' or '.join(searches)}, after its rounds)"
    return lambda boot: word if boot.started_at is not None and boot.started_at > end else None


def _changepoint_lines(run) -> list[str]:
    """The nightly change-point pass (``harness nightly --changepoints``), when it ran."""
    from bisect_harness.report.series import report_lines

    report = (run.summary or {}).get("changepoints")
    return [_md(line.strip()) for line in report_lines(report)] if report else []


def metric_unit(h, spec_text: str) -> str:
    """The metric's unit: as recorded with the hypothesis, else from the spec as written."""
    stored = (h.spec or {}).get("metric_def") or {}
    if stored.get("unit"):
        return str(stored["unit"])
    metric = metric_defs.lookup_metric(h.metric, spec_text)
    return metric.unit if metric is not None and metric.unit else ""


def _calibration_text(result: dict) -> str:
    if not result:
        return "not run"
    if "error" in result:
        return f"failed: {result['error']}"
    if "contention" in result:  # the preflight: the host watched before or beside the first boot
        from bisect_harness.observe.contention import Window, summary_line

        watched = result.get("watched", "before the first boot")
        text = f"host watched {watched}: {summary_line(Window.from_dict(result['contention']))}"
        if result.get("waited_s"):
            text += f" (after waiting {result['waited_s']:.0f} s)"
        crossed = result.get("crossed") or []
        return text + ("; **busy**: " + "; ".join(c["message"] for c in crossed) if crossed else "; quiet")
    if "measurements" in result:  # the figures, then the settings
        figures = [f"{m['name']}@{m['device']} {_fmt(float(m['median']), 2)} {m['unit']} (spread {m['spread']:.1%} "
                   f"over {len(m.get('values', []))} repetitions)" for m in result["measurements"]]
        noisy = (result.get("judged") or {}).get("noisy") or []
        settings = f"{result.get('device')}, {result.get('threads')} threads, {_fmt(result.get('elapsed_s'), 2)} s"
        return "; ".join(figures) + f" [{settings}]" + ("; **" + "; ".join(noisy) + "**" if noisy else "")
    parts = []
    for k, v in result.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            parts.append(f"{k}={_fmt(float(v), 2)}")
        elif isinstance(v, str) and len(v) < 40:
            parts.append(f"{k}={v}")
    return ", ".join(parts) or json.dumps(result, default=str)[:300]


def write(ledger: Ledger, run: Run, journal_dir: Path) -> Path:
    """Render and write ``<journal_dir>/<date>-<experiment>-run<id>.md`` (plots beside it),
    then rewrite the folder's ``index.md`` of every run in the ledger."""
    journal_dir = Path(journal_dir)
    journal_dir.mkdir(parents=True, exist_ok=True)
    text = redact_text(render(ledger, run, plots_dir=journal_dir))  # secrets never written (secrets.py)
    path = journal_dir / f"{journal_stem(run)}.md"
    path.write_text(text)
    write_index(ledger, journal_dir)
    return path

