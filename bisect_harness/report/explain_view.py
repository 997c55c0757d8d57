"""The journal's view of explain searches (``runs.summary["explain"]``): every
configuration tried, its verdict, and the minimal set with its effect size. Each
sentence is built from the stored record alone."""

from __future__ import annotations

from typing import Mapping

from bisect_harness.decide.explain import STOP_REASONS
from bisect_harness.report.cells import fmt as _p


def _fmt(x, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _config(names, all_names) -> str:
    s, full = set(names), list(all_names)
    if not s:
        return "fast"
    if s == set(full):
        return "slow"
    rest = [n for n in full if n not in s]
    if len(rest) < len(s):
        return "slow without " + ", ".join(f"`{n}`" for n in rest)
    return "fast with " + ", ".join(f"`{n}`" for n in sorted(s))


def _effect(t: dict | None) -> str:
    if not t:
        return "n/a"
    ci = f", interval [{_fmt(t['ci'][0])}, {_fmt(t['ci'][1])}]" if t.get("ci") else ""
    return f"{_fmt(t['ratio'])}x of the fast config's {{metric}}{ci} ({t['outcome']})"


def views(summary: dict | None, boots=(), *, again: str = "") -> list[dict]:
    """One dict per search, for the template; a search the run did not finish
    (``summary["explaining"]``) last, with the run's ``boots`` it had booted and
    ``again``, the command that makes it again."""
    out = []
    for rec in (summary or {}).get("explain", []) if isinstance(summary, dict) else []:
        names = [d["name"] for d in rec["differences"]]
        rows = []
        for i, t in enumerate(rec["tests"], 1):
            verdict = t["outcome"] + (f" (other direction: {t['opposite']})" if t.get("opposite") else "")
            rows.append({"step": i, "purpose": t["purpose"], "baseline": _config(t["baseline"], names),
                         "treatment": _config(t["treatment"], names), "expect": t["expect"],
                         "verdict": verdict, "ratio": _fmt(t["ratio"]),
                         "ci": f"[{_fmt(t['ci'][0])}, {_fmt(t['ci'][1])}]" if t.get("ci") else "n/a",
                         "p": _p(t.get("p_value"), 4), "boots": f"{t['boots'][0]} / {t['boots'][1]}",
                         "boot_ids": ", ".join(str(b) for b in t["baseline_boot_ids"] + t["treatment_boot_ids"]),
                         "reason": t["reason"]})
        members = rec["members"]
        if rec["slowdown"]["outcome"] != "confirmed":
            summary_line = (f"The slow config is not shown slower than the fast one by {rec['min_effect']:.0%} "
                            f"({rec['slowdown']['outcome']}): nothing to explain.")
        elif not members:
            summary_line = "No difference was shown to matter on its own group's test; see the undecided ones below."
        else:
            head = ("Minimal set: " if not rec["undecided"] else
                    f"Shown to matter ({len(rec['undecided'])} more undecided, so not claimed as the whole "
                    "minimal set): ")
            summary_line = (head + ", ".join(f"`{m}`" for m in members) + "; together, "
                            + _effect(rec.get("effect")).replace("{metric}", rec["metric"]) + ".")
        notes = []
        given = rec.get("run_rounds") or []
        if given:
            more = max(0, rec["slowdown"]["boots"][0] - len(given))
            notes.append(f"the slowdown test began with the run's {len(given)} rounds of the two arms (boots "
                         + ", ".join(f"{f}/{sl}" for f, sl in given) + f"), judged by its own rule at alpha "
                         f"{rec['alpha_per_test']}; " + (f"it booted {more} more round(s)." if more else
                                                         "they decided it, so it booted none."))
        for m in members:
            c = rec["confidence"].get(m)
            if c:
                notes.append(f"`{m}`: leaving it out of the slow config gives {_fmt(c['ratio'])}x "
                             f"(p {_p(c.get('p_value'), 4)}, {c['outcome']}).")
        for pair in rec["interactions"]:
            notes.append(f"interaction: {' + '.join(f'`{n}`' for n in pair)}: neither alone is slower "
                         "(refuted), together they are (confirmed).")
        for n in rec["opposite"]:
            notes.append(f"opposite sign: leaving `{n}` out makes the slow config slower still.")
        for n in rec["undecided"]:
            notes.append(f"undecided: `{n}`'s test ended undecided; it is neither claimed nor cleared.")
        for n in rec.get("sign_open") or []:
            notes.append(f"sign open: `{n}` is shown to hold no cause (left out, the slow config is not "
                         f"{rec['min_effect']:.0%} better), but its test ended before it was shown free of "
                         "the opposite sign; that sign is neither claimed nor cleared.")
        if rec.get("residual"):
            r = rec["residual"]
            notes.append(f"the slow config against the minimal set: {_fmt(r['ratio'])}x ({r['outcome']}).")
        for u in rec.get("unmeasurable") or []:
            notes.append(f"stepped over: {_config(u['config'], names)} could not be measured ({u['reason']}); "
                         "the tests that needed it ended inconclusive.")
        if rec.get("stopped"):
            notes.append(f"stopped: `{rec['stopped']}`: {STOP_REASONS.get(rec['stopped'], 'see the tests')}.")
        if rec.get("bisection"):
            b = rec["bisection"]
            notes.append(f"the commit is a member: bisection {b['id']} found "
                         f"{'`' + b['culprit'][:12] + '`' if b.get('culprit') else 'no single culprit'}.")
        out.append({"fast": rec["fast"], "slow": rec["slow"],
                    "metric": f"{rec['metric']} at {rec['point']}" if rec.get("point") else rec["metric"],
                    "differences": [f"`{d['name']}`: {d['fast']!r} -> {d['slow']!r}" for d in rec["differences"]],
                    "summary": summary_line, "notes": notes, "rows": rows, "boots": rec["boots"],
                    "alpha": rec["alpha_per_test"], "unfinished": False})
    started = summary.get("explaining") if isinstance(summary, dict) else None
    if started:
        out.append(unfinished_view(started, boots, again))
    return out


def unfinished_view(started: dict, boots, again: str) -> dict:
    """A search that started and was stopped before its record: what it had booted, and
    that nothing of it is claimed."""
    mine = [b for b in boots if b.id > started.get("after_boot", 0)]
    ok = sum(b.status == "ok" for b in mine)
    span = f" (boots {mine[0].id} to {mine[-1].id}, {ok} ok)" if mine else ""
    line = (f"The search started and did not finish: the run stopped after {len(mine)} boots of its "
            f"configurations{span}. It claims nothing; the boots are listed under Configs and boots."
            + (f" `{again}` makes the search again from its start." if again else ""))
    return {"fast": started["fast"], "slow": started["slow"], "metric": started["metric"], "unfinished": True,
            "differences": [f"`{d['name']}`: {d['fast']!r} -> {d['slow']!r}" for d in started["differences"]],
            "summary": line, "notes": [], "rows": [], "boots": len(mine), "alpha": None}


def layers_lines(lay: Mapping | None) -> list[str]:
    """The three layers of a verdict with a mechanism (``VerdictStats.layers``), as lines."""
    if not lay:
        return []
    f = lay["flag_accepted"]
    missing = f.get("not_reported") or []
    out = [f"layer 1, flag accepted: **{f['accepted']}** ({f['matched']} flag check(s) matched, "
           f"{f['mismatched']} mismatched in the treatment's boots"
           + (f"; not reported by the server: {', '.join(missing)}" if missing else "") + ")"
           + "".join(f"; {d}" for d in f.get("detail") or [])]
    parts = []
    for m in lay["mechanism"]:
        parts.append(f"{m['metric']} expected to {m['expect']} by {m['min_effect']:.0%}: {m['outcome']} "
                     f"({_fmt(m.get('ratio'))}x, p {_p(m.get('p_value'), 4)})")
    out.append(f"layer 2, mechanism engaged: **{lay['mechanism_engaged']}**: " + "; ".join(parts))
    out.append(f"layer 3, outcome moved: **{lay['outcome_moved']}**")
    if lay.get("finding"):
        out.append(f"finding: **{lay['finding']}**")
    return out
