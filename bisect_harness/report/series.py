"""A nightly series read back from the ledger, and the change-point pass over all of it.

Each night is one value, as ``harness nightly`` judges it: the median of the log
boot means of its good boots (``exp`` of it, so it reads in the metric's unit).
A change point is *flagged* when a night at or within ``window`` nights after it
raised an alert (status ``alert``); the others are the old, unflagged shifts the
night-by-night test missed, which is what this pass is for.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from bisect_harness.decide.changepoints import find_change_points
from bisect_harness.record.ledger import Ledger, Run

__all__ = ["Night", "nightly_series", "change_point_report", "report_lines"]


@dataclass(frozen=True)
class Night:
    run_id: int
    date: str
    commit: str
    value: float
    boots: int
    status: str


def nightly_series(ledger: Ledger, series: str, metric: str, *, up_to_run: int) -> list[Night]:
    """Every night of ``series`` up to and including ``up_to_run``, oldest first (nights
    without a good boot carrying ``metric`` are left out)."""
    out = []
    for run, commit, boots in ledger.nightly_history(series, before_run=up_to_run + 1):
        means = ledger.boot_values(boots, metric).means()
        means = [m for m in means if m > 0]
        if means:
            value = math.exp(statistics.median(math.log(m) for m in means))
            out.append(Night(run.id, run.created_at.strftime("%Y-%m-%d %H:%M"), commit or "", value, len(means),
                             run.status))
    return out


def change_point_report(ledger: Ledger, run: Run, metric: str, *, alpha: float, min_effect: float,
                        window: int) -> dict:
    """The change points of ``run``'s series (its nightly config's), as a JSON-able dict
    for ``runs.summary["changepoints"]`` and the journal."""
    series = next((c.series for c in run.configs if c.series), None)
    nights = nightly_series(ledger, series, metric, up_to_run=run.id) if series else []
    report = {"metric": metric, "nights": len(nights), "alpha": alpha, "min_effect": min_effect,
              "method": "binary segmentation (ruptures, l2 cost on log night values) with Welch's t-test per split",
              "points": []}
    if len(nights) < 6:
        report["note"] = f"{len(nights)} night(s) in the series; the pass needs 6 (3 on each side of a shift)"
        return report
    for cp in find_change_points([n.value for n in nights], alpha=alpha, min_effect=min_effect):
        first = nights[cp.index]
        flagged = any(n.status == "alert" for n in nights[cp.index:cp.index + window])
        report["points"].append({
            "run_id": first.run_id, "date": first.date, "commit": first.commit, "previous_commit":
            nights[cp.index - 1].commit, "before": cp.before_mean, "after": cp.after_mean, "ratio": cp.ratio,
            "p_value": cp.p_value, "nights_before": cp.before_n, "nights_after": cp.after_n, "flagged": flagged})
    return report


def report_lines(report: dict) -> list[str]:
    """The report as plain lines (the console and the journal say the same)."""
    head = (f"change points over {report['nights']} night(s) of {report['metric']}: "
            f"{len(report['points'])} found")
    lines = [head + (f" ({report['note']})" if report.get("note") else "")]
    for p in report["points"]:
        lines.append(f"  from night run {p['run_id']} ({p['date']}, commit {p['commit'][:12]}, after "
                     f"{p['previous_commit'][:12]}): {p['before']:.4g} -> {p['after']:.4g} ({p['ratio']:.4f}x, "
                     f"p={p['p_value']:.2g}, {p['nights_before']} nights before, {p['nights_after']} after); "
                     + ("flagged by a nightly alert" if p["flagged"] else "**not flagged by any night**"))
    return lines
