"""Markdown for a GitHub job's step summary and a pull-request comment (``--format github``).

A reader of a job or a pull request reads the answers first, so each form has three
parts, in this order: the answers (each hypothesis' verdict in words with its ratio
and interval and what it means for the job, each load curve's answer as the run
stored it; a night's status, its figures, its bisection and what it warned of), a
folded table of the evidence (``<details>``), and links to the published HTML
report (``report.site_links``; none where no ``--report-url`` is given). Every
figure and word is read from the ledger (``report.answers``, the stored curve
answers, the night's stored outcome, ``harness compare``'s rows): nothing here
decides.

- :func:`run_markdown`: ``harness run`` (and a run read back);
- :func:`night_markdown`: ``harness nightly``;
- :func:`compare_markdown`: ``harness compare``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from bisect_harness.report import curve_view
from bisect_harness.report.answers import HypothesisAnswer, NightAnswer, Reading, answers_of, experiment_of, night_of
from bisect_harness.report.cells import effect, fmt, md, probability
from bisect_harness.report.site_links import (NoSite, PublishedSite, compare_page, index_page, run_page,
                                              series_page)

__all__ = ["compare_markdown", "night_markdown", "run_markdown"]

#: The words a reading leads with, in the order the counts are said.
_READING_WORDS = {Reading.REGRESSION: "regression", Reading.IMPROVEMENT: "improvement", Reading.REFUTED: "refuted",
                  Reading.UNDETERMINED: "undetermined"}


def _code(text) -> str:
    """``text`` as inline code that a backtick inside cannot end early."""
    text = str(text).replace("\n", " ")
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _links(site: PublishedSite | NoSite, *pages: tuple[str, str]) -> list[str]:
    links = site.links(*pages)
    if not links:
        return []
    return ["", "Report: " + " · ".join(f"[{link.title}]({link.url})" for link in links)]


def _details(summary: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A folded markdown table: GitHub renders a table inside ``<details>`` only after a blank line."""
    lines = ["", "<details>", f"<summary>{summary}</summary>", "", "| " + " | ".join(header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(md(cell) for cell in row) + " |" for row in rows]
    return [*lines, "", "</details>"]


def _counts(answers: Sequence[HypothesisAnswer]) -> str:
    counts = {r: sum(a.reading is r for a in answers) for r in Reading}
    words = [f"{n} {_READING_WORDS[r]}{'s' if n != 1 and r in (Reading.REGRESSION, Reading.IMPROVEMENT) else ''}"
             for r, n in counts.items() if n]
    return ", ".join(words) if words else "no hypothesis"


def _answer_line(a: HypothesisAnswer) -> str:
    """``- **regression**: `tuned` (decode_ms increase >= 10%): Confirmed: 1.90x [1.80, 2.01], 3 boots per arm.``"""
    word = _READING_WORDS[a.reading]
    line = f"- **{word}**: {_code(a.hid)} ({a.claim}): {a.lead}"
    if a.reading is Reading.UNDETERMINED and a.outcome not in ("not measured", "not decided"):
        line += f" {a.why_undetermined.rstrip('.')}."
    return line


def run_markdown(run, site: PublishedSite | NoSite = NoSite()) -> str:
    """The step summary of ``run``: its answers, its curves' stored answers, the folded
    verdict table, the links to its page and the index."""
    answers = answers_of(run)
    lines = [f"## {experiment_of(run)}: run {run.id} ({run.status}): {_counts(answers)}", ""]
    lines += [_answer_line(a) for a in answers if a.curve is None]
    for c in curve_view.curves_of(run):
        words = c.answer.words if c.answer is not None else curve_view.NOT_RECORDED
        lines.append(f"- curve {_code(c.id)} ({c.metric} {c.expect} >= {c.min_effect:.0%}, {len(c.points)} points): "
                     f"{words}")
        lines += ["  " + _answer_line(a) for a in answers if a.curve == c.id]
    rows = [(a.hid, a.claim, a.outcome, _READING_WORDS[a.reading], fmt(a.ratio, 4),
             f"[{fmt(a.ci[0], 4)}, {fmt(a.ci[1], 4)}]" if a.ci else "n/a",
             f"{a.p_value:.3g}" if a.p_value is not None else "n/a", f"{a.boots[0]}/{a.boots[1]}",
             a.reason + "".join(f" Warning: {w}" for w in a.warnings)) for a in answers]
    lines += _details(f"Evidence: {len(answers)} verdict(s), {sum(sum(a.boots) for a in answers)} boots counted",
                      ("hypothesis", "claim", "verdict", "reading", "ratio t/b", "interval", "p", "boots b/t",
                       "reason"), rows)
    lines += _links(site, run_page(run.id), index_page())
    return "\n".join(lines) + "\n"


def _bisection_line(b: Mapping | None) -> list[str]:
    """What the night's bisection found, as it stored it."""
    if not b:
        return []
    if b.get("culprit"):
        return [f"- bisection: culprit {_code(b['culprit'][:12])} (probability "
                f"{probability(b.get('leader_probability'))}, {b.get('boots')} boots)"]
    leader = f"; leader {_code(str(b['leader'])[:12])} at {probability(b.get('leader_probability'))}" \
        if b.get("leader") else ""
    return [f"- bisection: no culprit named (stopped {_code(b.get('stopped'))}, {b.get('boots')} boots{leader})"]


def night_markdown(run, site: PublishedSite | NoSite = NoSite()) -> str:
    """The step summary of nightly run ``run``: the night's status and figures, each
    point's, the bisection's answer, drift and warnings, the change points where the
    night looked for them; the folded table of points; links to the run's page, the
    series' pages and the index."""
    n: NightAnswer = night_of(run)
    alert = " (alert)" if n.alert else ""
    lines = [f"## {experiment_of(run)}: nightly check {n.status}{alert}", "",
             f"Tonight's commit {_code(n.commit[:12])}, {n.metric}: {n.night.reason}"]
    lines.append("")
    if n.swept:
        lines += [f"- **{p.status}** at {_code(p.point)}: {p.reason}" for p in n.points]
    lines += _bisection_line(n.bisection)
    lines += [f"- host drift: {d}" for d in n.drift]
    lines += [f"- warning: {w}" for w in n.warnings]
    if n.changepoints is not None:
        from bisect_harness.report.series import report_lines

        found = report_lines(dict(n.changepoints))
        lines += [f"- {found[0]}", *(f"  - {line.strip()}" for line in found[1:])]
    rows = [(p.point or "(the one point)", p.status, str(p.nights_compared), (p.reference_commit or "n/a")[:12],
             fmt(p.ratio, 4), f"[{fmt(p.ci[0], 4)}, {fmt(p.ci[1], 4)}]" if p.ci else "n/a", fmt(p.p_value, 4),
             p.reason) for p in n.points]
    lines += _details(f"Evidence: {len(n.points)} point(s) of {n.metric} against earlier nights",
                      ("point", "status", "nights", "reference", "ratio", "interval", "p", "reason"), rows)
    series = [series_page(p.series, p.point) for p in n.points if p.series]
    lines += _links(site, run_page(run.id), *series, index_page())
    return "\n".join(lines) + "\n"


def compare_markdown(rows: Sequence, run_a: int, run_b: int, site: PublishedSite | NoSite = NoSite()) -> str:
    """``harness compare``'s rows (``report.compare.ConfigComparison``) as a step summary:
    each config's verdict on its claim, then the folded table, then the comparison's page."""
    outcomes = [r.verdict.outcome.value for r in rows]
    said = ", ".join(f"{outcomes.count(o)} {o}" for o in ("confirmed", "refuted", "inconclusive") if o in outcomes)
    lines = [f"## run {run_b} against run {run_a}: {len(rows)} config(s), {said}", ""]
    for r in rows:
        v = r.verdict
        ci = v.ci or (None, None)
        lines.append(f"- **{v.outcome.value}**: {_code(r.label)}, claim \"run B {r.expect}s {r.metric} by at least "
                     f"{r.min_effect:.1%}\": {effect(v.ratio, *ci)} (B / A), {r.boots[0]}/{r.boots[1]} boots")
        lines += [f"  - host drift: {d}" for d in r.drift]
    table = [(r.label, r.metric, r.verdict.outcome.value, fmt(r.means[0]), fmt(r.means[1]), fmt(r.verdict.ratio, 4),
              f"[{fmt(r.verdict.ci[0], 4)}, {fmt(r.verdict.ci[1], 4)}]" if r.verdict.ci else "n/a",
              fmt(r.verdict.p_value, 4), f"{r.boots[0]}/{r.boots[1]}",
              r.verdict.reason + "".join(f" Warning: {w}" for w in r.verdict.warnings)) for r in rows]
    lines += _details(f"Evidence: {len(rows)} config(s), alpha divided over them",
                      ("config", "metric", "verdict", "mean A", "mean B", "ratio B/A", "interval", "p", "boots A/B",
                       "reason"), table)
    lines += _links(site, compare_page(run_a, run_b), run_page(run_a), run_page(run_b), index_page())
    return "\n".join(lines) + "\n"
