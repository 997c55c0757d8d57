"""The ledger as a folder of static HTML pages that open offline.

``harness report`` writes, from the ledger alone:

- ``index.html``: every run, newest first, with its verdicts counted at a glance,
  a link to its page, to its comparison with the run before it, and to every
  nightly series;
- ``runs/<run_id>.html``: the run's journal (``journal.sections``, the very
  sections the markdown journal prints), the summary first, its tables sortable,
  each hypothesis' boots and each load curve drawn as inline SVG (``svg``);
- ``series/<series-slug>.html``: a nightly series (``report.series``): each
  night's value with the range of its boots and the interval its night's test
  stored, the change points the newest ``--changepoints`` pass stored, each alert
  linked to the bisection its night ran;
- ``compare/<runA>-<runB>.html``: two runs as ``harness compare`` decides them
  (``report.compare``), for each run against the run before it of the same file
  and kind, and for the pairs asked.

Nothing is decided here: a verdict, an interval, a change point or a curve's
answer is the one the ledger holds (a comparison is the one ``harness compare``
gives). The pages carry their style and their few lines of script inside them,
and fetch nothing: no CDN, no font, no image file.

The page names are fixed (CI outputs link to them): :data:`INDEX_PAGE`,
:func:`run_page`, :func:`series_page` and :func:`compare_page` make them.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import jinja2
from markupsafe import Markup
from sqlalchemy import select

from bisect_harness.errors import UserError
from bisect_harness.model import Outcome, shown_outcome
from bisect_harness.record.ledger import Bisection, Ledger, Run
from bisect_harness.report import curve_view, journal
from bisect_harness.report.cells import effect, fmt
from bisect_harness.report.html import svg
from bisect_harness.report.html.markup import inline
from bisect_harness.report.reproduce import experiment_name
from bisect_harness.report.series import nightly_series, point_series
from bisect_harness.report.site_links import series_slug
from bisect_harness.secrets import redact_text
from bisect_harness.spec import metric_defs

__all__ = ["INDEX_PAGE", "Site", "compare_page", "run_page", "series_page", "series_slug", "write_site"]

INDEX_PAGE = "index.html"

#: the kinds of run compared with the run before them of the same file (a search's runs measure other commits)
COMPARED_KINDS = ("run", "nightly")
#: ``harness compare``'s own defaults, which the report's comparisons take
COMPARE_MIN_EFFECT = 0.05
COMPARE_METRIC = "tok_s"


def run_page(run_id: int) -> str:
    """``runs/<run_id>.html``: a run's page, relative to the report's folder."""
    return f"runs/{int(run_id)}.html"


def series_page(series: str) -> str:
    """``series/<series-slug>.html``: a nightly series' page (``report.series.point_series``'
    key), relative to the report's folder."""
    return f"series/{series_slug(series)}.html"


def compare_page(run_a: int, run_b: int) -> str:
    """``compare/<runA>-<runB>.html``: run B judged against run A, relative to the report's folder."""
    return f"compare/{int(run_a)}-{int(run_b)}.html"


@dataclass(frozen=True)
class Site:
    """What :func:`write_site` wrote: the folder and each page in it (relative paths)."""

    out: Path
    pages: tuple[str, ...]

    def largest(self) -> tuple[str, int]:
        """The largest page and its size in bytes."""
        sizes = [(p, (self.out / p).stat().st_size) for p in self.pages]
        return max(sizes, key=lambda s: s[1])


# --------------------------------------------------------------------------- the reading


@dataclass(frozen=True)
class SeriesRef:
    """A nightly series as the runs name it: its key (the config's series and the load
    point's label), the metric its nights watched, its file, and its nightly runs."""

    key: str
    series: str
    point: str | None
    metric: str
    experiment: str
    runs: tuple[int, ...]


def _series_refs(runs: Sequence[Run]) -> dict[str, SeriesRef]:
    """Every nightly series of ``runs`` (oldest first), by key; its metric the newest night's."""
    found: dict[str, dict] = {}
    for run in runs:
        summary = run.summary if isinstance(run.summary, dict) else {}
        series = next((c.series for c in run.configs if c.series), None)
        if run.kind != "nightly" or not series or not summary.get("metric"):
            continue
        for label in [p.get("point") for p in summary.get("points") or []] or [None]:
            key = point_series(series, label)
            ref = found.setdefault(key, {"series": series, "point": label, "runs": []})
            ref.update(metric=summary["metric"], experiment=experiment_name(run.spec_path))
            ref["runs"].append(run.id)
    return {k: SeriesRef(key=k, series=v["series"], point=v["point"], metric=v["metric"],
                         experiment=v["experiment"], runs=tuple(v["runs"])) for k, v in found.items()}


def _previous_runs(runs: Sequence[Run]) -> dict[int, int]:
    """Each run of :data:`COMPARED_KINDS` -> the run before it of the same file and kind."""
    last: dict[tuple[str, str], int] = {}
    out = {}
    for run in runs:  # oldest first
        if run.kind not in COMPARED_KINDS:
            continue
        key = (run.spec_path, run.kind)
        if key in last:
            out[run.id] = last[key]
        last[key] = run.id
    return out


def _outcome_counts(run: Run) -> dict[str, int]:
    """How many of the run's hypotheses each shown outcome holds (the verdict rows' own)."""
    counts: dict[str, int] = {}
    for h in run.hypotheses:
        word = shown_outcome(h.verdict)
        counts[word] = counts.get(word, 0) + 1
    return counts


# --------------------------------------------------------------------------- the index


@dataclass(frozen=True)
class IndexRow:
    """One run on the index: its figures at a glance and where its pages are."""

    id: int
    when: str
    kind: str
    status: str
    experiment: str
    spec: str
    confirmed: int
    refuted: int
    inconclusive: int
    other: int
    verdicts: str
    nightly: str
    compare: str | None


def _index_rows(runs: Sequence[Run], previous: dict[int, int]) -> list[IndexRow]:
    rows = []
    for run in sorted(runs, key=lambda r: r.id, reverse=True):
        counts = _outcome_counts(run)
        known = (Outcome.CONFIRMED.value, Outcome.REFUTED.value, Outcome.INCONCLUSIVE.value)
        summary = run.summary if isinstance(run.summary, dict) else {}
        rows.append(IndexRow(
            id=run.id, when=run.created_at.strftime("%Y-%m-%d %H:%M"), kind=run.kind, status=run.status,
            experiment=experiment_name(run.spec_path), spec=run.spec_path,
            confirmed=counts.get(known[0], 0), refuted=counts.get(known[1], 0),
            inconclusive=counts.get(known[2], 0), other=sum(n for w, n in counts.items() if w not in known),
            verdicts="; ".join(f"{h.hid}: {shown_outcome(h.verdict)}" for h in run.hypotheses),
            nightly=str(summary.get("status", "")) if run.kind == "nightly" else "",
            compare=compare_page(previous[run.id], run.id) if run.id in previous else None))
    return rows


# --------------------------------------------------------------------------- a run's page


@dataclass(frozen=True)
class HypothesisPlot:
    """A hypothesis' drawings: its boots by side, and the curve it is the first point of."""

    boots: Markup
    curve: Markup


def _run_context(ledger: Ledger, run: Run, refs: dict[str, SeriesRef], previous: dict[int, int]) -> dict:
    """A run's page: the journal's sections of ``run`` (no PNG drawn), each hypothesis'
    boots and each curve (before its first point's hypothesis) as SVG, the series the
    run is a night of, and the comparisons it takes part in."""
    parts = journal.sections(ledger, run)
    curve_by_first = {}
    for c in parts.curves:
        first = next(h.hid for h in run.hypotheses if h.hid in {p.hypothesis for p in c.points})
        curve_by_first[first] = c
    plots = {}
    for h in parts.hypotheses:
        unit = journal.metric_unit(next(x for x in run.hypotheses if x.id == h.row_id), run.spec_text)
        boots = svg.boots_plot(h.points, title=f"{h.id}: {h.metric} per boot", metric=h.metric, unit=unit)
        curve = curve_by_first.get(h.id)
        drawn = ""
        if curve is not None:
            axis, xs, log = curve_view.axis_of(curve.points)
            size = curve.min_effect
            threshold = (1.0 + size if curve.expect == "increase" else 1.0 - size) if size else None
            drawn = svg.curve_plot(curve.points, title=f"curve {curve.id}: {curve.metric} at each load point",
                                   axis=axis, xs=xs, log=log, threshold=threshold)
        plots[h.id] = HypothesisPlot(boots=Markup(boots), curve=Markup(drawn))
    series = [r for r in refs.values() if run.id in r.runs]
    nearby = [(a, b) for b, a in previous.items() if run.id in (a, b)]
    return {"parts": parts, "head": parts.head, "run": run, "plots": plots, "series": series,
            "compares": sorted(nearby), "hypothesis_rows": _hypothesis_rows(parts.hypotheses, run)}


def _hypothesis_rows(hyps, run: Run) -> list[dict]:
    """The run page's verdict table: per hypothesis its verdict, ratio and interval as the
    journal prints them, the verdict row's ratio to sort by, its boots and checks."""
    stored = {h.id: h.verdict for h in run.hypotheses}
    rows = []
    for h in hyps:
        v, row = h.verdict, stored.get(h.row_id)
        rows.append({"id": h.id, "metric": h.metric, "claim": h.claim, "outcome": v.outcome, "ratio": v.ratio,
                     "sort_ratio": row.ratio if row is not None else None, "ci": v.ci, "boots": v.boots_text,
                     "checks": v.checks, "effect": v.effect})
    return rows


# --------------------------------------------------------------------------- a series' page


@dataclass(frozen=True)
class NightRow:
    """One night of a series as ``report.series.nightly_series`` reads it (the rows the
    change-point pass took): its run, date, commit, value, the lowest and highest of
    its boots' means, its status, the interval its night's test stored (tonight / the
    earlier nights), and the bisections its alert ran."""

    run_id: int
    date: str
    commit: str
    value: float
    boots: int
    low: float
    high: float
    status: str
    ratio: str
    bisections: tuple[int, ...]


def _series_context(ledger: Ledger, ref: SeriesRef, runs_by_id: dict[int, Run], bisections: dict[int, list]) -> dict:
    last = max(ref.runs)
    nights = nightly_series(ledger, ref.series, ref.metric, up_to_run=last, point=ref.point)
    spread = {}
    for run, _commit, boots in ledger.nightly_history(ref.series, before_run=last + 1):
        means = [m for m in ledger.boot_values(boots, ref.metric, point=ref.point).means() if m > 0]
        if means:
            spread[run.id] = (min(means), max(means))
    rows = []
    for n in nights:
        low, high = spread.get(n.run_id, (n.value, n.value))
        rows.append(NightRow(run_id=n.run_id, date=n.date, commit=n.commit[:12], value=n.value, boots=n.boots,
                             low=low, high=high, status=n.status, ratio=_night_ratio(runs_by_id.get(n.run_id), ref),
                             bisections=tuple(b.id for b in bisections.get(n.run_id, ()))))
    report, from_run = _stored_changepoints(ref, runs_by_id)
    points = [p for p in (report or {}).get("points") or []
              if (p.get("series") == ref.key if ref.point is not None else "point" not in p)]
    plot = svg.series_plot([svg.NightMark(run_id=r.run_id, commit=r.commit, value=r.value, low=r.low, high=r.high,
                                          alert=r.status == "alert",
                                          label=f"night run {r.run_id} ({r.date}, {r.commit}): {fmt(r.value, 3)}, "
                                                f"boots {fmt(r.low, 3)} to {fmt(r.high, 3)}, {r.status}")
                            for r in rows], [(p["run_id"], str(p["commit"])[:12]) for p in points],
                           title=f"{ref.experiment}: {ref.metric} per night", metric=ref.metric)
    return {"ref": ref, "nights": rows, "plot": Markup(plot), "changepoints": points, "report": report,
            "report_run": from_run, "alerts": [r for r in rows if r.status == "alert"]}


def _night_ratio(run: Run | None, ref: SeriesRef) -> str:
    """The night's test as stored in its summary: tonight / the earlier nights with its interval."""
    summary = run.summary if run is not None and isinstance(run.summary, dict) else {}
    if ref.point is not None:
        summary = next((p for p in summary.get("points") or [] if p.get("point") == ref.point), {})
    ci = summary.get("ci") or (None, None)
    return effect(summary.get("ratio"), ci[0], ci[1]) if summary.get("ratio") is not None else "no test (first nights)"


def _stored_changepoints(ref: SeriesRef, runs_by_id: dict[int, Run]) -> tuple[dict | None, int | None]:
    """The newest change-point pass stored by a night of the series (``--changepoints``)."""
    for run_id in sorted(ref.runs, reverse=True):
        summary = runs_by_id[run_id].summary if isinstance(runs_by_id[run_id].summary, dict) else {}
        if summary.get("changepoints"):
            return summary["changepoints"], run_id
    return None, None


# --------------------------------------------------------------------------- a comparison's page


def _compare_context(ledger: Ledger, a: int, b: int, runs_by_id: dict[int, Run]) -> dict:
    """Run ``b`` against run ``a`` on each metric run B watches, as ``harness compare`` decides."""
    from bisect_harness.report.compare import compare_runs

    run_b = runs_by_id.get(b) or ledger.run(b)
    run_a = runs_by_id.get(a) or ledger.run(a)
    summary = run_b.summary if isinstance(run_b.summary, dict) else {}
    metrics = list(dict.fromkeys([h.metric for h in run_b.hypotheses]
                                 + ([summary["metric"]] if summary.get("metric") else []))) or [COMPARE_METRIC]
    tables = []
    for metric in metrics:
        try:
            rows = compare_runs(ledger, a, b, metric=metric, min_effect=COMPARE_MIN_EFFECT)
            tables.append({"metric": metric, "rows": [_compare_row(r) for r in rows], "refused": None})
        except UserError as exc:
            tables.append({"metric": metric, "rows": [], "refused": str(exc)})
    return {"a": run_a, "b": run_b, "tables": tables, "min_effect": COMPARE_MIN_EFFECT}


def _compare_row(r) -> dict:
    v = r.verdict
    ci = v.ci or (None, None)
    return {"label": r.label, "matched_by": r.matched_by, "a": fmt(r.means[0], 2), "b": fmt(r.means[1], 2),
            "boots": f"{r.boots[0]} / {r.boots[1]}", "ratio": v.ratio, "effect": effect(v.ratio, ci[0], ci[1]),
            "p": fmt(v.p_value, 4), "outcome": v.outcome.value, "claim": f"B {r.expect}s {r.metric} by at least "
            f"{r.min_effect:.1%}", "reason": v.reason, "warnings": list(v.warnings), "drift": list(r.drift)}


# --------------------------------------------------------------------------- writing


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("bisect_harness", "templates"),
                             undefined=jinja2.StrictUndefined, autoescape=True, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["md"] = inline
    env.filters["num"] = lambda x, digits=4: "" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
        else f"{x:.{digits}g}"
    env.globals.update(run_page=run_page, series_page=series_page, compare_page=compare_page, fmt=fmt,
                       index_page=INDEX_PAGE)
    return env


def write_site(ledger: Ledger, out: Path, *, pairs: Sequence[tuple[int, int]] = ()) -> Site:
    """Write the report of every run in ``ledger`` into folder ``out`` (made if missing):
    the index, a page per run, per nightly series and per comparison (each run
    against the run before it of the same file and kind, and each of ``pairs``,
    (run A, run B)). Every page is written through ``secrets.redact_text``."""
    out = Path(out)
    env = _environment()
    runs = sorted(ledger.runs(limit=1_000_000), key=lambda r: r.id)
    runs_by_id = {r.id: r for r in runs}
    for a, b in pairs:
        for rid in (a, b):
            if rid not in runs_by_id:
                raise UserError(f"--compare {a} {b}: run {rid} is not in the ledger; `harness ledger list` "
                                "shows the runs")
    refs = _series_refs(runs)
    previous = _previous_runs(runs)
    bisections: dict[int, list] = {}
    for bis in ledger.session.scalars(select(Bisection).order_by(Bisection.id)):
        bisections.setdefault(bis.run_id, []).append(bis)
    written = []

    def page(name: str, template: str, **context) -> None:
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        root = "../" * name.count("/")
        html = env.get_template(template).render(root=root, generated=_now(), **context)
        path.write_text(redact_text(html), encoding="utf-8")
        written.append(name)

    page(INDEX_PAGE, "report_index.html.j2", rows=_index_rows(runs, previous),
         series=sorted(refs.values(), key=lambda r: (r.experiment, r.key)), ledger_runs=len(runs))
    for run in runs:
        page(run_page(run.id), "report_run.html.j2", **_run_context(ledger, run, refs, previous))
    for ref in refs.values():
        page(series_page(ref.key), "report_series.html.j2", **_series_context(ledger, ref, runs_by_id, bisections))
    for a, b in dict.fromkeys([*((a, b) for b, a in previous.items()), *pairs]):
        page(compare_page(a, b), "report_compare.html.j2", **_compare_context(ledger, a, b, runs_by_id))
    return Site(out=out, pages=tuple(written))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
