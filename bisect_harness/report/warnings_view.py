"""The journal's warnings, grouped and counted rather than one paragraph.

A verdict or a search carries what it found about its boots as findings
(``evidence.Finding``: ``VerdictRow.found``, ``Bisection.found``; an older ledger's
sentences are read once as findings by ``record.legacy``). Here they fall in three
groups, by :class:`~bisect_harness.evidence.FindingKind`, never by their wording:

* **marks** (``MARKED_BOOT``: a boot and the marks it carries, in its figures),
  one finding per marked boot, become one row per mark with its count and its boots
  (any mark, new ones included: the table names what the boots carry);
* **busy boots** (``BUSY_BOOT``: the boot whose contention window crossed a
  threshold) become one row per boot with the figures that crossed their thresholds,
  read from the boot's stored contention record (``host_state.BootContention``), and
  the busiest foreign process by name; the whole process lists stay in each boot's
  details under "Configs and boots";
* **other** findings (host drift, contention that differed, calibration, engine
  versions, notes), listed as their sentences, folded in ``<details>`` past
  :data:`FOLD_AFTER`.

Every cell is a figure from the ledger; a busy finding whose boot row is not found
(or holds no busy record) stays a sentence.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from bisect_harness.evidence import Finding, FindingKind
from bisect_harness.model import shown_apart
from bisect_harness.observe import host_state
from bisect_harness.report.cells import md

__all__ = ["FOLD_AFTER", "FIGURES", "grouped", "marked", "marks_from_boots"]

#: more rows or lines than this are folded in ``<details>``
FOLD_AFTER = 5

#: a contention figure's short name in a table header, and whether it is a share (printed in %)
FIGURES = {
    "foreign_cpu_share": ("foreign CPU", True), "foreign_runnable_per_core": ("foreign runnable / core", False),
    "cpu_pressure": ("PSI cpu", True), "io_pressure": ("PSI io", True), "memory_pressure": ("PSI memory", True),
    "steal": ("steal", True), "gpu_foreign_processes": ("other GPU processes", False),
}


def _figure(name: str, value: float, limit: float) -> tuple[str, str]:
    """A figure and its limit, with the digits that tell them apart (``93%``, ``90.3%``)."""
    share = FIGURES.get(name, (name, False))[1]
    if name == "gpu_foreign_processes":
        return f"{value:.0f}", f"{limit:.0f}"
    a, b = shown_apart(value * 100, limit * 100) if share else shown_apart(value, limit)
    return (f"{a}%", f"{b}%") if share else (a, b)


def _busy_table(found: Sequence[tuple[str, object]]) -> dict | None:
    """``found``: (what the boot was: a side, a commit; the Boot row), busy boots only."""
    recs = [(where, boot, host_state.BootContention.of(boot)) for where, boot in found]
    recs = sorted(((w, b, r) for w, b, r in recs if r is not None and r.busy), key=lambda x: x[1].id)
    if not recs:
        return None
    crossed_names = {c.get("figure") for _, _, r in recs for c in r.crossed}
    names = [n for n in FIGURES if n in crossed_names] + sorted(n for n in crossed_names if n not in FIGURES)
    limits: dict[str, float] = {}
    for _, _, r in recs:
        for c in r.crossed:
            limits.setdefault(c["figure"], c["limit"])
    columns = [f"{FIGURES.get(n, (n, False))[0]} (limit {_figure(n, limits[n], limits[n])[1]})" for n in names]
    rows = []
    for where, boot, r in recs:
        crossed = {c["figure"]: c for c in r.crossed}
        cells = []
        for n in names:
            value = crossed[n]["value"] if n in crossed else r.window.figures.get(n)
            if value is None:
                cells.append("n/a")
                continue
            shown = _figure(n, float(value), limits[n])[0]
            cells.append(f"**{shown}**" if n in crossed else shown)
        top = (r.window.details.get("top_foreign") or [])[:1]
        busiest = (f"{top[0].get('name') or top[0].get('command')} (pid {top[0].get('pid')}), "
                   f"{float(top[0].get('cores', 0)):.2f} cores" if top else "-")
        rows.append({"boot": boot.id, "where": md(where), "status": boot.status, "cells": cells,
                     "busiest": md(busiest), "seconds": f"{r.window.seconds:.0f}"})
    return {"columns": columns, "rows": rows, "folded": len(rows) > FOLD_AFTER}


def marked(f: Finding) -> tuple[str, ...]:
    """The marks a ``MARKED_BOOT`` finding names (its figures' ``marks``); () for any other."""
    if f.kind is not FindingKind.MARKED_BOOT or not f.boots:
        return ()
    return tuple(str(m) for m in f.figures.get("marks") or ())


def grouped(found: Sequence[Finding], boot_of: Callable[[int], object | None]) -> dict:
    """``found`` in the three groups of the module doc. ``boot_of(id)``: the Boot row
    of a busy finding's boot (its stored figures), or None. The answer's ``marks`` are
    rows (mark, count, boots), ``busy`` a table or None, ``other`` sentences, and
    ``any`` whether there is anything to show at all."""
    marks: dict[str, dict[str, list[int]]] = {}
    busy: list[tuple[str, object, Finding]] = []
    other: list[str] = []
    for f in found or ():
        names = marked(f)
        if names:
            for mark in names:
                marks.setdefault(mark, {}).setdefault(f.side or "-", []).extend(f.boots)
            continue
        boot = boot_of(f.boots[0]) if f.kind is FindingKind.BUSY_BOOT and f.boots else None
        if boot is not None:
            busy.append((f.side or "-", boot, f))
            continue
        other.append(md(f.text))
    table = _busy_table([(where, boot) for where, boot, _ in busy])
    if busy and table is None:  # the finding named a boot whose row holds no busy record: keep its sentence
        other += [md(f.text) for _, _, f in busy]
    rows = _mark_rows(marks)
    return {"marks": rows, "busy": table, "other": other, "other_folded": len(other) > FOLD_AFTER,
            "any": bool(rows or table or other)}


def marks_from_boots(boots: Sequence[object], where: Callable[[object], str] = lambda b: "boots") -> list[dict]:
    """The mark rows of boots read directly (a search's boots, which carry no verdict):
    each mark, how many boots carry it and which."""
    marks: dict[str, dict[str, list[int]]] = {}
    for b in boots:
        for mark in getattr(b, "marks", None) or []:
            marks.setdefault(mark, {}).setdefault(where(b), []).append(b.id)
    return _mark_rows(marks)


def _mark_rows(marks: Mapping[str, Mapping[str, list[int]]]) -> list[dict]:
    rows = []
    for mark, by_where in marks.items():
        n = sum(len(ids) for ids in by_where.values())
        text = "; ".join(f"{w} {', '.join(map(str, sorted(ids)))}" for w, ids in by_where.items())
        rows.append({"mark": md(mark), "n": n, "boots": md(text)})
    return sorted(rows, key=lambda r: (-r["n"], r["mark"]))
