"""The experiment journal: a markdown page rendered from the ledger alone.

Everything on the page is read back from the database, so a journal can be
rendered again at any time (``harness journal RUN``) and every number in it
traces to rows: verdict -> boots -> samples, with each boot's provenance.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Sequence

import jinja2
from sqlalchemy import select

from bisect_harness.observe import engine_identity, mechanisms
from bisect_harness.measure.prompt_size import reuse_text
from bisect_harness.observe import host_state
from bisect_harness.decide.evaluate import OUTCOME_FOOTNOTE
from bisect_harness.spec import metric_defs
from bisect_harness.report import bisection_view, explain_view, profile_view, summary_view, warnings_view, window_view
from bisect_harness.report.cells import boots_per_arm, effect, fmt as _fmt, md as _md
from bisect_harness.record.ledger import Bisection, Boot, Ledger, Run, boot_records
from bisect_harness.observe.drift import host_drift
from bisect_harness.observe.provenance import EnvReport, FlagReport
from bisect_harness.secrets import redact_text
from bisect_harness.model import shown_outcome
from bisect_harness.report import plots, reproduce
from bisect_harness.report import resumed as _resume
from bisect_harness.report.index import journal_stem, write_index


def _mean(vals: Sequence[float]) -> float | None:
    return sum(vals) / len(vals) if vals else None


def _env_cell(report: dict | None) -> str:
    """Did every requested env var reach every process of the server's tree?"""
    if not report:
        return "n/a"
    rep = EnvReport.from_dict(report)
    n = len(rep.processes)
    if not rep.vars:
        return f"(no env requested; {n} processes)"
    if rep.state == "ok":
        return f"yes ({len(rep.vars)} vars in all {len(rep.readable_pids)} processes)"
    if rep.state == "unverified":
        seen = f"; present in all {len(rep.readable_pids)} readable" if rep.readable_pids else ""
        return "**unverified**: " + _md(rep.unverified_text() + seen)
    bad = []
    for v in rep.vars:
        if not v.ok:
            where = [rep.process(pid).name for pid in (*v.absent, *v.mismatched)]
            bad.append(f"{v.name} missing in {len(where)} of {n} processes")
    return "**NO**: " + _md("; ".join(bad) or rep.note or "no process could be read")


def _flag_cell(report: dict | None) -> str:
    """Did each requested flag show up in the server's effective arguments? ``yes``
    only when every flag was compared; a flag the server did not report says so."""
    if not report:
        return "n/a"
    rep = FlagReport.from_dict(report)
    if not rep.checks:
        return "- (no flags)"
    if rep.mismatched:
        return "**NO**: " + _md("; ".join(f"{c.flag}: asked {c.requested!r}, server has {c.effective!r}"
                                          for c in rep.mismatched))
    if not rep.not_reported:
        return f"yes ({len(rep.matched)} compared, all matched)"
    matched = f"{len(rep.matched)} matched; " if rep.matched else ""
    return _md(matched) + "**not reported**: " + _md(", ".join(c.flag for c in rep.not_reported))


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


def _mechanism_cell(results) -> str:
    """Did what the boot's flags claim (or its engine runs by default) run in the
    measured window? The state in words (``mechanisms.WORDS``); ``-`` when nothing
    was checked. A record older than the window check (``unknown``) reads not observable."""
    if not results:
        return "-"
    loud = ("not_engaged", "set_up_not_seen")
    return _md(", ".join(f"{r['name']}: " + (f"**{mechanisms.WORDS[r['state']]}**" if r["state"] in loud
                                             else mechanisms.WORDS.get(r["state"], mechanisms.WORDS["not_observable"]))
                         for r in results))


def _checks_cell(warnings, drift, checked: dict | None = None) -> str:
    """The verdict table's summary of what the boot checks found: marks by kind, host
    drift; else what was checked and passed, or ``unchecked``."""
    counts: dict[str, int] = {}
    for w in warnings or []:
        if w.startswith(engine_identity.WARNING_PREFIX):
            counts["engine versions differ"] = counts.get("engine versions differ", 0) + 1
            continue
        if not w.startswith(("baseline boot ", "treatment boot ")):
            continue
        for mark in w.split(": ", 1)[-1].split(", "):
            counts[mark] = counts.get(mark, 0) + 1
    parts = [f"{mark} x{n}" for mark, n in sorted(counts.items())]
    if drift:
        parts.append(f"host drift ({len(drift)})")
    for prefix, label in (("contention differed", "contention differs"), ("calibration (", "calibration noisy"),
                          (host_state.PREFLIGHT_BUSY, "busy at preflight")):
        n = sum(1 for w in warnings or [] if w.startswith(prefix))
        if n:
            parts.append(label if n == 1 else f"{label} x{n}")
    if not parts:
        return checks_word(checked)
    unchecked = _not_reported(checked)  # beside the marks too: a flag not compared is never hidden
    return "**" + ", ".join(parts) + "**" + (f", {unchecked}" if unchecked else "")


def requests_text(seen: dict | None) -> str | None:
    """The boot's failed requests (``provenance["request_retries"]``) in words, or None."""
    if not seen:
        return None
    parts = []
    if seen.get("retries"):
        parts.append(f"{seen['retries']} tries of {seen['requests']} requests produced nothing and were sent "
                     f"again within their sample (first: {seen.get('example')})")
    if seen.get("failed"):
        parts.append(f"{seen['failed']} requests failed after their retries (first: {seen.get('failed_example')})")
    per = seen.get("samples") or {}
    if per:
        parts.append("by sample: " + ", ".join(f"{k}: {v.get('retries', 0)} sent again, {v.get('failed', 0)} failed"
                                               for k, v in sorted(per.items(), key=lambda kv: int(kv[0]))))
    return "; ".join(parts) or None


def _sampling_text(d: dict) -> str:
    """One line per boot: CPU load and, per GPU, clocks, temperature, power, throttling."""
    def rng(stat: dict | None, unit: str) -> str:
        if not stat:
            return "n/a"
        lo, hi = stat.get("min"), stat.get("max")
        return f"{lo:.0f}-{hi:.0f}{unit}" if lo is not None and hi is not None else "n/a"

    cpu = d.get("cpu", {})
    parts = [f"{d.get('n_samples', 0)} samples over {d.get('duration_s', 0):.1f}s",
             f"CPU busy {rng(cpu.get('cpu_percent'), '%')}", f"load1 {rng(cpu.get('load1'), '')}"]
    for g in d.get("gpus", []):
        st = g.get("stats", {})
        throttle = ", ".join(g.get("throttle_reasons_seen", [])) or "none"
        parts.append(f"GPU{g.get('index')}: SM {rng(st.get('sm_clock_mhz'), ' MHz')} "
                     f"(max {g.get('sm_clock_max_mhz')}), {rng(st.get('temperature_c'), ' C')}, "
                     f"{rng(st.get('power_w'), ' W')}, throttle: {throttle}")
    if d.get("note"):
        parts.append(d["note"])
    return _md("; ".join(parts))


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


def prior_line(stats) -> str | None:
    """The noise prior a verdict was offered, as its stats recorded it, in one
    sentence: where it came from, and whether the verdict's own look pooled it, its
    rounds contradicted it (their own spread, from the rounds' log ratios), the look
    was the sign-flip test's, or a busy boot kept it out; None for a verdict without one."""
    stats = stats or {}
    prior, dropped = stats.get("noise_prior"), stats.get("noise_prior_dropped")
    if not prior and dropped:
        offered = dropped.get("prior") or {}
        return (f"{_prior_source(offered)} was offered but not pooled: boots "
                f"{', '.join(str(i) for i in dropped.get('boots') or [])} of this verdict ran on a host the host "
                "check found busy, not the host the prior measured; the rounds were tested alone")
    if not prior:
        return None
    text = _prior_source(prior)
    if stats.get("prior_pooled") is True:
        return text + "; this look's t-test pooled it with its own rounds"
    if stats.get("prior_contradicted") is True:
        ratios = stats.get("round_log_ratios") or []
        own = (f"{_fmt(100 * statistics.stdev(ratios), 2)}%" if len(ratios) > 1 else "undetermined")
        return text + (f"; this look's {len(ratios)} rounds spread {own}, which contradicts it, so they were "
                       "tested alone")
    if stats.get("prior_contradicted") is False:
        return text + "; this look was the sign-flip test's, which pools no prior"
    return text + "; whether this look pooled it is not recorded"


def _prior_source(prior: dict) -> str:
    boots, var, runs = prior.get("boots") or [], prior.get("var"), prior.get("runs")
    return (f"{prior.get('rounds')} rounds of {runs} earlier run{'' if runs == 1 else 's'} of the same two configs "
            f"on this host (boots {', '.join(str(i) for i in boots)}) gave a round's log ratio a spread of "
            f"{_fmt(100 * var ** 0.5 if var else None, 2)}% with {prior.get('dof')} degrees of freedom")


def _host_line(host: dict) -> str:
    if not host:
        return "unknown"
    gpus = host.get("gpus") or []
    gpu = (f"{len(gpus)}x {gpus[0].get('name')}, driver {gpus[0].get('driver_version')}" if gpus
           else host.get("gpu_note") or "no GPU")
    return (f"{host.get('hostname', '?')}, {host.get('cpu_model', '?')} ({host.get('cpu_count_logical', '?')} cores), "
            f"{gpu}, kernel {host.get('kernel', '?')}, boot id {str(host.get('boot_id', '?'))[:8]}")


def render(ledger: Ledger, run: Run, *, plots_dir: Path | None = None) -> str:
    """The journal's markdown for one run."""
    session = ledger.session
    if not (session.new or session.dirty or session.deleted):
        # Rows read while the run went on hold lists that grew since (the closing
        # calibration, the last looks, a search's boots): the journal reads them again.
        session.expire_all()
    env = jinja2.Environment(loader=jinja2.PackageLoader("bisect_harness", "templates"),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=False, lstrip_blocks=False)
    template = env.get_template("journal.md.j2")
    stem = journal_stem(run)
    hyps = []
    declared = metric_defs.declared_metrics(run.spec_text)  # engine.metrics, read once for the window view
    logs: dict[tuple, tuple[list[str], str]] = {}
    bisection_rows = ledger.session.scalars(select(Bisection).where(Bisection.run_id == run.id)).all()
    later = _after_rounds(run, bisection_rows)

    def boot_of(boot_id: int) -> Boot | None:  # a warning's boot, for its stored figures
        return session.get(Boot, boot_id)

    for h in run.hypotheses:
        v = h.verdict
        boot_rows = []
        points: list[plots.BootPoint] = []
        side_means: dict[str, list[float]] = {"baseline": [], "treatment": []}
        first_used: dict[str, Boot] = {}
        sides = (("baseline", h.baseline, v.baseline_boot_ids if v else []),
                 ("treatment", h.treatment, v.treatment_boot_ids if v else []))
        used_boots: dict[str, list[Boot]] = {"baseline": [], "treatment": []}
        before_resume = {i for r in _resume.resumes(run) for i in r.counted_ok_boot_ids}
        for side, cfg, used in sides:
            for boot in cfg.boots:
                if boot.run_id != run.id and boot.id not in used:
                    continue
                vals = [s.metrics.get(h.metric) for s in boot.samples]
                vals = [float(x) for x in vals if x is not None]
                if boot.status == "ok" and boot.id in used:
                    used_boots[side].append(boot)
                if vals:
                    points.append(plots.BootPoint(side=side, boot_id=boot.id, round=boot.seq, values=tuple(vals),
                                                  marked=bool(boot.marks), used=boot.id in used))
                    if boot.id in used:
                        side_means[side].append(_mean(vals))
                if boot.id in used and side not in first_used:
                    first_used[side] = boot
                boot_rows.append({
                    "side": side, "id": boot.id, "status": boot.status + ("" if boot.id in used or not v else
                                                                          later(boot) or " (unused)")
                    + (", from before the resume" if boot.id in before_resume else ""),
                    "samples": ", ".join(_fmt(x, 2) for x in vals) or "-", "mean": _fmt(_mean(vals), 2),
                    "marks": ", ".join(boot.marks or []) or "-"})
        drift = [{"field": d.field, "a": _md(d.a), "b": _md(d.b), "severity": d.severity.value,
                  "message": _md(d.message)}
                 for d in host_drift(boot_records(used_boots["baseline"]), boot_records(used_boots["treatment"]))]
        claim = f"{h.expect} >= {h.min_effect:.0%}" if h.min_effect >= 0.01 else f"{h.expect} >= {h.min_effect:.1%}"
        same, not_same = host_state.same_host_state(used_boots["baseline"], used_boots["treatment"], drift)
        unit = _unit(h, run.spec_text)
        plot = plot_missing = None
        if plots_dir is not None:
            try:
                drawn = plots.plot_hypothesis(points, Path(plots_dir) / f"{stem}-{reproduce.file_part(h.hid)}.png",
                                              title=f"{h.hid}: {h.metric} per boot", metric=h.metric, unit=unit)
            except plots.PlotNotWritten as exc:  # a full disk: the journal says what is missing
                drawn, plot_missing = None, _md(str(exc))
            plot = drawn.name if drawn else None
        rels = tuple((h.spec or {}).get(side, {}).get("release") for side in ("baseline", "treatment"))
        pair = (h.baseline.commit, h.treatment.commit, rels)  # two releases: the commits between their tags
        if pair not in logs:
            logs[pair] = reproduce.commit_log(run.spec_text, run.spec_path, *pair[:2], releases=rels)
        means = {side: (_fmt(_mean(ms), 2) + (f" {unit}" if unit else "") + f" (mean of {len(ms)} boot means)"
                        if ms else "not recorded (no boot used)") for side, ms in side_means.items()}
        hyps.append({
            "id": h.hid, "row_id": h.id, "metric": h.metric, "claim": claim, "statement": h.statement,
            "metric_def": _md(metric_defs.definition_line(h.metric, (h.spec or {}).get("metric_def"), run.spec_text)),
            "outcome": shown_outcome(v), "lead": _md(summary_view.verdict_lead(v)),
            "effect": effect(v.ratio, v.ci_low, v.ci_high) if v else "no estimate",
            "boots_text": boots_per_arm(v.baseline_boot_ids or [], v.treatment_boot_ids or []) if v else "no boots",
            "ratio": _fmt(v.ratio, 4) if v else "n/a",
            "ci": f"[{_fmt(v.ci_low, 4)}, {_fmt(v.ci_high, 4)}]" if v and v.ci_low is not None else "n/a",
            "baseline_label": h.baseline.label, "treatment_label": h.treatment.label,
            "test": _md(v.test) if v else "n/a", "alpha": _fmt(v.alpha, 4) if v else "n/a",
            "reason": _md(v.reason) if v else "no verdict was recorded (the run stopped early)",
            "warnings": warnings_view.grouped(list(v.warnings or []) if v else [], boot_of),
            "boot_rows": boot_rows, "drift": drift,
            "drift_checked": bool(used_boots["baseline"] and used_boots["treatment"]),
            "same_host": same, "not_same": "; ".join(not_same),
            "checks": _checks_cell(v.warnings if v else [], drift, (v.stats or {}).get("checks") if v else {}),
            "layers": explain_view.layers_lines(v.stats if v else None),
            "profile": profile_view.hypothesis_view(h, run, plots_dir),
            "window": window_view.hypothesis_view(h, declared),
            "resumed": [_md(x) for x in _resume.journal_lines(
                run, v.baseline_boot_ids if v else [], v.treatment_boot_ids if v else [],
                [b.id for b in (*h.baseline.boots, *h.treatment.boots)])],
            "cost": cost_line((v.stats or {}).get("cost") if v else None),
            "prior": prior_line(v.stats if v else None),
            "plot": plot, "plot_missing": plot_missing, "baseline_mean": means["baseline"], "treatment_mean": means["treatment"],
            "commands": [{"side": side, "boot": b.id, "text": reproduce.boot_command(b)}
                         for side, b in sorted(first_used.items())],
            "git_log": logs[pair][0], "git_note": logs[pair][1]})
    configs = []
    for c in run.configs:
        boots = []
        for b in c.boots:
            details = []
            if b.failure:
                details.append(f"- failure: {b.failure}")
            for p in b.source_problems or []:
                details.append(f"- metric source: {p}")
            refused = (b.provenance or {}).get("flag_not_accepted")
            if refused:  # the commit's parser refused the argv: not a crash
                details.append(f"- flag not accepted at this commit: `{refused['engine_message']}`"
                               + "".join(f" ({n})" for n in refused.get("notes") or []))
            not_applicable = (b.provenance or {}).get("sources_not_applicable")
            if not_applicable:
                details.append("- metric sources whose `when` excludes this config (not collected): "
                               + ", ".join(not_applicable))
            if b.env_report and not b.env_report.get("ok", True):
                for line in EnvReport.from_dict(b.env_report).describe().splitlines()[1:]:
                    details.append(f"- env: `{line.strip()}`")
            engaged = (b.provenance or {}).get("mechanisms")
            if engaged:  # what the flags claim to engage, by the engine's own evidence
                details.append("- mechanisms: " + _md(mechanisms.summary(engaged)))
            prompt = (b.provenance or {}).get("prompt")
            if prompt:  # tokens where the server counted them, else words, said as such
                details.append("- " + _md(_prompt_text(prompt)))
            sampled = (b.provenance or {}).get("gpu_sampling")
            if sampled:
                details.append(f"- sampled during the benchmark: {_sampling_text(sampled)}")
            busy = host_state.boot_line(b)
            if busy:
                details.append(f"- contention during the benchmark: {_md(busy)}")
            stop = (b.provenance or {}).get("stop") or {}
            if not stop.get("clean", True):  # how the server ended at the harness's stop
                details.append(f"- stop: {_md(stop.get('note', ''))}")
            details += [f"- {_md(line)}" for line in _boot_facts(b.provenance or {})]
            for note in ((b.provenance or {}).get("checkout") or {}).get("remade") or []:
                details.append(f"- before the boot: {_md(note)}")
            changed = (b.provenance or {}).get("checkout_changed")
            if changed:  # marked checkout_changed: never counted as the commit
                details.append(f"- the checkout changed while the boot ran: {_md('; '.join(changed))}")
            failed = requests_text((b.provenance or {}).get("request_retries"))
            if failed:  # requests that produced nothing: sent again, or failed in the end
                details.append(f"- requests: {_md(failed)}")
            details.append(f"- ran as: `{reproduce.boot_command(b)}`")
            boots.append({
                "id": b.id, "status": b.status, "ready": _fmt(b.ready_s, 1), "samples": len(b.samples),
                "env": _env_cell(b.env_report), "flags": _flag_cell(b.flag_report),
                "mechanisms": _mechanism_cell((b.provenance or {}).get("mechanisms")),
                "marks": ", ".join(b.marks or []) or "-", "details": details,
                "log_tail": (b.log_tail or "").strip() if b.status != "ok" else ""})
        configs.append({
            "id": c.id, "label": c.label, "commit": c.commit or "(installed server)",
            "argv": " ".join(c.argv or []),
            "ran_as": (f"boot {c.boots[0].id}: `{reproduce.boot_command(c.boots[0])}`" if c.boots
                       else "not recorded (no boot started)"), "env": " ".join(f"{k}={v}" for k, v in (c.env or {}).items()),
            "reported": _md(engine_identity.describe(c.boots)),
            "python": _md(_environment_text(c.boots)),
            "status": c.status if c.status != "pending" else "measured", "failure": c.failure,
            "log_tail": (c.log_tail or "").strip(), "boots": boots})
    cals, cal_figures = [], []
    for cal in run.calibrations:
        cals.append({"phase": cal.phase, "text": _md(_calibration_text(cal.result))})
        for m in (cal.result or {}).get("measurements") or []:
            vals = [float(x) for x in m.get("values") or []]
            cal_figures.append({"phase": cal.phase, "name": _md(m.get("name")), "device": _md(m.get("device")),
                                "median": _fmt(float(m["median"]), 2) if m.get("median") is not None else "n/a",
                                "unit": _md(m.get("unit", "")), "spread": f"{m['spread']:.1%}" if m.get("spread")
                                is not None else "n/a", "n": len(vals),
                                "range": f"{_fmt(min(vals), 2)} to {_fmt(max(vals), 2)}" if vals else "n/a"})
    run_command, resume_command = reproduce.run_command(run, bisection_rows), reproduce.resume_command(run)
    bisections = [{**bisection_view.view(bis, boot_of=boot_of, plots_dir=plots_dir, stem=stem),
                   "metric_def": _md(metric_defs.definition_line(bis.metric, None, run.spec_text))}
                  for bis in bisection_rows]
    return _tidy(template.render(
        resumes=[_md(_resume.run_line(r)) for r in _resume.resumes(run)],
        run=run, title=Path(run.spec_path).name, spec_name=run.spec_path, host_line=_host_line(run.host or {}),
        hypotheses=hyps, configs=configs, calibrations=cals, calibration_figures=cal_figures, bisections=bisections,
        summary=_summary_lines(run, hyps, bisections),
        changepoint_lines=_changepoint_lines(run),
        explanations=explain_view.views(
            run.summary, ledger.session.scalars(select(Boot).where(Boot.run_id == run.id).order_by(Boot.id)).all(),
            again=resume_command or run_command),
        run_command=run_command, resume_command=resume_command,
        ci_label="confidence interval", footnote=OUTCOME_FOOTNOTE))


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


def _summary_lines(run: Run, hyps: Sequence[dict], bisections: Sequence[dict]) -> list[str]:
    """The journal's first lines: one per hypothesis, with the answers of the searches that
    followed it, then one per search of its own (``summary_view``)."""
    records = (run.summary or {}).get("explain") or [] if isinstance(run.summary, dict) else []
    lines, told = [], set()
    for h in hyps:
        searches = []
        for b in bisections:
            if b["hypothesis_id"] == h["row_id"]:
                searches.append(f"bisection {b['id']}: {b['answer']}")
                told.add(("bisection", b["id"]))
        for k, rec in enumerate(records):
            if rec.get("hypothesis_id") == h["row_id"]:
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


def _unit(h, spec_text: str) -> str:
    """The metric's unit: as recorded with the hypothesis, else from the spec as written."""
    stored = (h.spec or {}).get("metric_def") or {}
    if stored.get("unit"):
        return str(stored["unit"])
    metric = metric_defs.lookup_metric(h.metric, spec_text)
    return metric.unit if metric is not None and metric.unit else ""


def _environment_text(boots) -> str:
    """The interpreter(s) a config's boots ran with, and whether each was the commit's own."""
    seen = []
    for b in boots:
        env = (b.provenance or {}).get("environment")
        if env:
            rel = env.get("release")
            if rel and rel.get("image"):  # an image through a runtime: which, by its digest
                text = (f"{rel.get('package')} {rel.get('version')} as the image `{rel.get('image')}` through "
                        f"{rel.get('runtime')}, digest {rel.get('digest') or 'not known before it ran'}")
            elif rel:  # a released build: which file, by its hash, and the version installed
                text = (f"`{env['python']}` (the release's own venv over `{env['base_python']}`: "
                        f"{rel.get('package')} {rel.get('version')} installed from `{rel.get('file')}`, "
                        f"sha256 {str(rel.get('sha256'))[:16]}…)")
            elif env["mode"] == "venv":
                text = f"`{env['python']}` (the commit's own venv over `{env['base_python']}`)"
            else:
                text = f"`{env['python']}` (shared by every commit)"
            if text not in seen:
                seen.append(text)
    return "; ".join(seen)


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


def _prompt_text(prompt: dict) -> str:
    """A boot's prompt length (``prompt_size.PromptSize``), in the unit it really is in, and
    whether each sample's prompts were its own (a boot recorded before they were says nothing)."""
    if prompt.get("unit") == "tokens":
        text = (f"prompts: {prompt.get('tokens')} tokens ({prompt.get('words')} words; {prompt.get('asked')} asked), "
                f"counted by the server's {prompt.get('via')}")
    else:
        text = (f"prompts: {prompt.get('words')} words ({prompt.get('asked')} prompt_tokens asked): the server has no "
                "tokenizer endpoint, so the count is in words, not tokens")
    if "unique" not in prompt:
        return text
    return f"{text}; {reuse_text(bool(prompt['unique']), prompt.get('spread'))}"


def _boot_facts(prov: dict) -> list[str]:
    """Facts of a boot that are not marks, and what a mark left missing, as sentences
    from its provenance: a log that could not be written, a server's steady off-by-one
    between its text chunks and its token count, the collective libraries' own sockets
    beyond loopback."""
    out = []
    log = prov.get("log") or {}
    if log.get("unwritten"):
        out.append(f"log not written: {log['unwritten']}; the ledger's log_tail holds the newest output, "
                   "kept in memory")
    offset = prov.get("usage_offset")
    if offset:
        out.append(f"token count: {offset['note']}")
    listening = prov.get("listening") or {}
    if listening.get("collective"):
        out.append("listening beyond loopback for the server's own processes (collective-communication "
                   "bootstrap, not a server port): " + ", ".join(listening["collective"]))
    return out


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

