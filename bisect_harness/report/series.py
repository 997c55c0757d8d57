"""A nightly series read back from the ledger, and the change-point pass over all of it.

Each night is one value, as ``harness nightly`` judges it: the median of the log
boot means of its good boots (``exp`` of it, so it reads in the metric's unit).
A change point is *flagged* when a night at or within ``window`` nights after it
raised an alert (status ``alert``); the others are the old, unflagged shifts the
night-by-night test missed, which is what this pass is for.

A file that sweeps load points measures them all in every boot; each point is a
series of its own (:func:`point_series`: the config's series and the point's
label), its nights its boots' values at that point, its alerts those that named it
(:func:`alerted_at`), and the pass finds each point's change points apart.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from bisect_harness.decide.changepoints import find_change_points
from bisect_harness.record.ledger import Ledger, Run

__all__ = ["Night", "alerted_at", "nightly_series", "change_point_report", "point_series", "report_lines"]


def point_series(series: str, point: str | None) -> str:
    """The key of a load point's series: the config's ``series`` and the point's label
    (``<series>@concurrency=32``); the config's own for the benchmark's one point."""
    return series if point is None else f"{series}@{point}"


def alerted_at(run: Run, point: str | None) -> bool:
    """Whether nightly run ``run`` alerted at load ``point``: a night that alerted and
    either watched one point, could not be measured (``broken``: every point), or
    found ``point`` regressed (its summary's ``points``)."""
    if run.status != "alert":
        return False
    summary = run.summary if isinstance(run.summary, dict) else {}
    nights = summary.get("points") or []
    if point is None or not nights or summary.get("status") == "broken":
        return True
    return any(p.get("point") == point and p.get("status") == "regression" for p in nights)


@dataclass(frozen=True)
class Night:
    run_id: int
    date: str
    commit: str
    value: float
    boots: int
    status: str


def nightly_series(ledger: Ledger, series: str, metric: str, *, up_to_run: int,
                   point: str | None = None) -> list[Night]:
    """Every night of ``series`` at load ``point`` up to and including ``up_to_run``,
    oldest first (nights without a good boot carrying ``metric`` there are left out);
    a night's status ``alert`` where it alerted at that point."""
    out = []
    for run, commit, boots in ledger.nightly_history(series, before_run=up_to_run + 1):
        means = ledger.boot_values(boots, metric, point=point).means()
        means = [m for m in means if m > 0]
        if means:
            value = math.exp(statistics.median(math.log(m) for m in means))
            status = "alert" if alerted_at(run, point) else "done" if run.status == "alert" else run.status
            out.append(Night(run.id, run.created_at.strftime("%Y-%m-%d %H:%M"), commit or "", value, len(means),
                             status))
    return out


def change_point_report(ledger: Ledger, run: Run, metric: str, *, alpha: float, min_effect: float,
                        window: int) -> dict:
    """The change points of ``run``'s series (its nightly config's), as a JSON-able dict
    for ``runs.summary["changepoints"]`` and the journal; on a file that sweeps load
    points (the night's summary names them), each point's series apart, each change
    point saying its ``point`` and ``series``."""
    series = next((c.series for c in run.configs if c.series), None)
    summary = run.summary if isinstance(run.summary, dict) else {}
    labels = [p.get("point") for p in summary.get("points") or []] or [None]
    report = {"metric": metric, "nights": 0, "alpha": alpha, "min_effect": min_effect,
              "method": "binary segmentation (ruptures, l2 cost on log night values) with Welch's t-test per split",
              "points": []}
    notes = []
    for label in labels:
        nights = nightly_series(ledger, series, metric, up_to_run=run.id, point=label) if series else []
        report["nights"] = max(report["nights"], len(nights))
        if len(nights) < 6:
            notes.append((f"at {label}: " if label else "")
                         + f"{len(nights)} night(s) in the series; the pass needs 6 (3 on each side of a shift)")
            continue
        for cp in find_change_points([n.value for n in nights], alpha=alpha, min_effect=min_effect):
            first = nights[cp.index]
            flagged = any(n.status == "alert" for n in nights[cp.index:cp.index + window])
            report["points"].append({
                **({"point": label, "series": point_series(series, label)} if label else {}),
                "run_id": first.run_id, "date": first.date, "commit": first.commit, "previous_commit":
                nights[cp.index - 1].commit, "before": cp.before_mean, "after": cp.after_mean, "ratio": cp.ratio,
                "p_value": cp.p_value, "nights_before": cp.before_n, "nights_after": cp.after_n, "flagged": flagged})
    if notes:
        report["note"] = "; ".join(notes)
    return report


def report_lines(report: dict) -> list[str]:
    """The report as plain lines (the console and the journal say the same)."""
    head = (f"change points over {report['nights']} night(s) of {report['metric']}: "
            f"{len(report['points'])} found")
    lines = [head + (f" ({report['note']})" if report.get("note") else "")]
    for p in report["points"]:
        lines.append(f"  {'at ' + p['point'] + ', ' if p.get('point') else ''}from night run {p['run_id']} "
                     f"({p['date']}, commit {p['commit'][:12]}, after "
                     f"{p['previous_commit'][:12]}): {p['before']:.4g} -> {p['after']:.4g} ({p['ratio']:.4f}x, "
                     f"p={p['p_value']:.2g}, {p['nights_before']} nights before, {p['nights_after']} after); "
                     + ("flagged by a nightly alert" if p["flagged"] else "**not flagged by any night**"))
    return lines
