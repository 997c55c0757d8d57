"""The journal's view of a bisection (``bisections`` and ``bisect_probes`` rows).

Answer first: the culprit (or why there is none) in one sentence, the facts it rests
on as short lines (the stop reason, the head-to-head test, how many boots ran on a
busy host), then the steps by commit in the history's order, so the step is seen
where the values move, in a table of a few rows whatever the search's length. The
evidence follows: the paired tests, the candidates, the warnings grouped
(``warnings_view``) and every step in the order it was taken, folded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bisect_harness.decide.bisect.result import StopReason
from bisect_harness.model import reused_from
from bisect_harness.report import plots, warnings_view
from bisect_harness.report.cells import apart, fmt, md, probability

__all__ = ["PURPOSES", "view", "answer"]

#: what a bisection step was for; ledgers before schema 3 wrote it into the note
PURPOSES = ("probe", "anchor", "endpoints", "verify", "reused")


def _probe_purpose(p) -> str:
    parts = (p.note or "").split(" | ")[1:]
    return p.purpose or next((x for x in parts if x in PURPOSES), "reused" if p.reused else "probe")


def _probe_note(p) -> str:
    """What became of a bisection step, past its subject: reused, skipped (and why), short."""
    rest = [x for x in (p.note or "").split(" | ")[1:] if x not in PURPOSES]
    if p.reused:
        rest.insert(0, f"{p.reused} reused")
    elif p.skipped:  # stepped over for good: say so first, then why
        rest.insert(0, "skipped")
    return md("; ".join(rest))


def _subject(p) -> str:
    return md(p.note.split(" | ")[0]) if p.note else ""


def _why(stopped: str) -> str:
    try:
        return StopReason(stopped).meaning
    except ValueError:
        return "a stop reason this version does not know"


def _after(result: dict, sep: str = "") -> str:
    """`` after 23 boots`` (with ``sep`` before it), or "" where the result does not say."""
    return f"{sep} after {result['boots']} boots" if result.get("boots") is not None else ""


def answer(bis, busy: tuple[int, int] | None = None) -> str:
    """The search's answer in one line (the journal's summary): ``culprit `abc` (P 0.99998)
    after 23 boots``, or the candidate set, or why it stopped without one. ``busy``:
    (boots marked host_busy, boots booted) of this search."""
    result = bis.result or {}
    stopped = result.get("stopped", bis.status)
    if result.get("culprit"):
        text = f"culprit `{result['culprit'][:12]}` (P {probability(result.get('probability'))})" + _after(result)
    elif bis.status == "running":
        text = "not finished"
    else:
        cset = result.get("candidate_set") or []
        text = (f"no single culprit: candidates {', '.join(f'`{c[:12]}`' for c in cset)} (P "
                f"{probability(result.get('probability'))} together)" if len(cset) > 1 else "no single culprit")
        text += f", stopped `{stopped}`" + _after(result)
    if busy and busy[0]:
        text += f", {busy[0]} of its {busy[1]} boots on a busy host"
    return text


def _lead(bis, result: dict, subjects: dict[str, str]) -> str:
    culprit = result.get("culprit")
    if culprit:
        subject = f" ({subjects[culprit]})" if subjects.get(culprit) else ""
        return (f"Culprit: `{culprit[:12]}`{subject}, posterior probability {probability(result.get('probability'))}"
                + _after(result, ",") + ".")
    if bis.status == "running":
        return ("The bisection did not finish; " + (
            "`harness run FILE --resume` bisects again, its boots feeding the new search."
            if bis.hypothesis_id is not None else "`harness bisect` resumes it from the ledger."))
    cset = result.get("candidate_set") or []
    return ("No single culprit" + (f": candidate set {', '.join(f'`{c[:12]}`' for c in cset)} (posterior "
                                   f"probability {probability(result.get('probability'))})" if len(cset) > 1 else "")
            + _after(result, ",") + ".")


def _facts(bis, result: dict, busy: tuple[int, int]) -> list[str]:
    """The lines under the answer: each a fact the answer rests on, from the stored result."""
    out = []
    stopped = result.get("stopped", bis.status)
    if bis.status != "running":
        out.append(f"stopped: `{stopped}` ({_why(stopped)})")
    opened = result.get("verdict_rounds") or []
    if opened:
        out.append(f"endpoint check: opened by the {len(opened)} paired rounds of the hypothesis' verdict (boots "
                   f"{', '.join(f'{g} and {b}' for g, b in opened)}); "
                   f"{max(0, len(((result.get('tests') or [{}])[0]).get('boot_ids') or []) // 2 - len(opened))} "
                   "more paired rounds booted for it")
    et = result.get("endpoint_test")
    if et and et.get("decision") == "below" and et.get("upper") is not None:
        upper, least = apart(et.get("upper"), et.get("below"))
        out.append(f"endpoint check: the change between the endpoints is smaller than the least that counts "
                   f"(its upper bound {upper} against {least} {bis.metric}, after {et.get('pairs')} paired rounds "
                   f"at level {fmt(et.get('alpha_per_look'), 4)} per look; `--min-effect` sets the least change)")
    vt = result.get("verify_test")
    if vt:
        p, level = apart(vt.get("p_value"), vt.get("alpha_per_look"))
        out.append(f"head-to-head test: {vt.get('decision')} after {vt.get('pairs')} paired rounds "
                   f"(p = {p}, level per look {level})")
    und = result.get("undetermined")
    if und:
        out.append(f"undetermined: it would have stopped `{und.get('would_have_stopped')}`, but {und.get('why')}: "
                   f"{und.get('would_decide')}")
    if result.get("revisions") == "releases":
        d = result.get("descent")
        out.append("The revisions were releases; " + (
            f"the commits between the culprit release and the one before it were then bisected (bisection "
            f"{d.get('bisection_id')}: " + (f"culprit `{str(d.get('culprit'))[:12]}`" if d.get("culprit")
                                             else f"stopped `{d.get('stopped')}`") + ")"
            if d else f"no descent into commits: {result.get('descent_note')}"))
    if result.get("reused_runs"):
        n = sum(p.reused or 0 for p in bis.probes)
        out.append(f"{n} boots {reused_from(result['reused_runs'], bis.run_id)} fed the posterior, not its "
                   "paired tests (`reused` in the tables; hollow in the plot)")
    if busy[0]:
        out.append(f"host: {busy[0]} of its {busy[1]} boots ran on a busy host (marked `host_busy`; their "
                   "figures below the tables)")
    skipped = result.get("skipped") or []
    if skipped:
        out.append(f"skipped (could not be measured): {', '.join(f'`{s[:12]}`' for s in skipped)}")
    return [md(x) for x in out]


def _by_commit(bis, culprit: str | None) -> list[dict]:
    """One row per commit the search measured, in the history's order (good first)."""
    order = {c: i for i, c in enumerate(bis.commits or [])}
    rows: dict[str, dict] = {}
    for p in bis.probes:
        row = rows.setdefault(p.commit, {"commit": p.commit[:12], "subject": _subject(p), "for": [], "values": [],
                                         "reused": 0, "skipped": False, "culprit": p.commit == culprit})
        purpose = _probe_purpose(p)
        if purpose not in row["for"]:
            row["for"].append(purpose)
        row["values"] += [float(x) for x in p.values or []]
        row["reused"] += p.reused or 0
        row["skipped"] = row["skipped"] or bool(p.skipped)
    out = []
    for sha in sorted(rows, key=lambda c: order.get(c, len(order))):
        r = rows[sha]
        vals = r["values"]
        note = [f"{r['reused']} reused"] if r["reused"] else []
        note += ["skipped"] if r["skipped"] else []
        out.append({**r, "for": ", ".join(r["for"]), "boots": len(vals),
                    "vals": ", ".join(fmt(v, 2) for v in vals) or "-",
                    "mean": fmt(sum(vals) / len(vals), 2) if vals else "n/a", "note": "; ".join(note)})
    return out


def view(bis, *, boot_of: Callable[[int], object | None], plots_dir: Path | None, stem: str) -> dict:
    """The template's dict for one bisection. ``boot_of(id)``: the Boot row of a boot id."""
    result = bis.result or {}
    booted = [b for p in bis.probes if not p.reused for i in (p.boot_ids or []) if (b := boot_of(i)) is not None]
    busy = (sum("host_busy" in (b.marks or []) for b in booted), len(booted))
    subjects = {p.commit: _subject(p) for p in bis.probes if p.note}
    steps = [{"commit": p.commit[:12], "subject": _subject(p), "purpose": _probe_purpose(p),
              "boots": len(p.values or []), "vals": ", ".join(fmt(float(x), 2) for x in (p.values or [])) or "-",
              "boot_ids": ", ".join(str(b) for b in (p.boot_ids or [])) or "-", "note": _probe_note(p)}
             for p in bis.probes]
    tests = []
    for t in result.get("tests") or []:
        p, level = apart(t.get("p_value"), t.get("alpha_per_look"))
        tests.append({"name": "endpoint check" if t.get("kind") == "endpoints" else f"head-to-head {t.get('test')}",
                      "good": str(t.get("good", ""))[:12], "bad": str(t.get("bad", ""))[:12], "pairs": t.get("pairs"),
                      "mean": fmt(t.get("mean"), 4), "p": p, "level": level, "decision": md(str(t.get("decision"))),
                      "boot_ids": ", ".join(map(str, t.get("boot_ids") or [])) or "-"})
    cands = [{"commit": c["commit"][:12], "p": probability(c["probability"])}
             for c in result.get("candidates", [])[:5]]
    warnings = warnings_view.grouped(bis.found, boot_of)
    warnings["marks"] = warnings_view.marks_from_boots(booted)  # the search's boots carry no verdict's mark lines
    warnings["any"] = bool(warnings["marks"] or warnings["busy"] or warnings["other"])
    plot = plot_missing = None
    if plots_dir is not None and bis.probes:
        try:
            plot = plots.plot_bisection(bis, plots_dir, stem)
        except plots.PlotNotWritten as exc:  # a full disk: the journal says what is missing
            plot_missing = md(str(exc))
    point = result.get("point")  # a search of a load curve reads one point's values (``--at``)
    return {"id": bis.id, "good": bis.good[:12], "bad": bis.bad[:12],
            "metric": f"{bis.metric} at {point}" if point else bis.metric,
            "lead": md(_lead(bis, result, subjects)), "facts": _facts(bis, result, busy),
            "answer": md(answer(bis, busy)), "hypothesis_id": bis.hypothesis_id,
            "commits": _by_commit(bis, result.get("culprit")), "probes": steps,
            "candidates": cands, "plot": plot, "plot_missing": plot_missing,
            "tests": tests, "warnings": warnings}
