"""JUnit XML of a run or a night (``--junit FILE``): the answers any CI system reads as tests.

One ``<testsuite>`` per run, named by its experiment, its properties the run id, the
run's status, each commit it measured, the harness's version, the ledger (its
password never written) and, where the report is published (``--report-url``), the
run's page. One ``<testcase>`` per hypothesis (a swept hypothesis is one per load
point already: ``id@label``), its ``classname`` the experiment, read from the
ledger by ``report.answers``:

- a *regression* (confirmed in the direction the metric gets worse) is a
  ``<failure type="regression">`` whose message is the verdict in words with its
  ratio and interval, and whose text holds the figures, the reason and the warnings;
- an *undetermined* verdict (inconclusive, never measured, not decided) is
  ``<skipped>`` with its reason;
- a *refuted* claim or a confirmed *improvement* passes.

A night is one test case per load point it watched (one for a file of one point):
``regression`` a failure, ``broken`` (tonight's commit did not build or boot) a
failure of type ``broken``, ``first-night`` skipped (nothing to compare with yet),
``ok`` passes; the bisection's answer goes into the failure's text.

The shape follows the Ant JUnit format that Jenkins, GitLab and GitHub's JUnit
reporters read (``testsuites`` > ``testsuite`` > ``properties``, ``testcase``,
``system-out``, ``system-err``); ``tests/data/junit.xsd`` is the schema the tests hold
it to. :func:`write` writes a file whole or not at all.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bisect_harness.report.answers import HypothesisAnswer, NightAnswer, Reading, answers_of, night_of, run_commits
from bisect_harness.report.cells import fmt, probability
from bisect_harness.report.site_links import NoSite, PublishedSite, run_page
from bisect_harness.secrets import redact_text, url_secret_values

__all__ = ["Case", "Suite", "night_suite", "run_suite", "to_xml", "write"]


@dataclass(frozen=True)
class Case:
    """One test case: its ``name`` and ``classname``, and how it ended: ``passed``,
    ``failure`` or ``skipped`` (``kind``), with a one-line ``message``, a ``type``
    (``regression``, ``broken``) for a failure, and ``text`` (the figures) for a failure."""

    name: str
    classname: str
    kind: str = "passed"
    message: str = ""
    type: str = ""
    text: str = ""

    def __post_init__(self):
        if self.kind not in ("passed", "failure", "skipped"):
            raise ValueError(f"a test case ends passed, failure or skipped, not {self.kind!r}")


@dataclass(frozen=True)
class Suite:
    """One run as a test suite: its ``name``, when it ran (``timestamp``, UTC, no zone as
    the format wants), how long (``seconds``), its ``properties`` (name, value pairs; a
    name may repeat) and its cases."""

    name: str
    timestamp: _dt.datetime
    seconds: float
    properties: tuple[tuple[str, str], ...]
    cases: tuple[Case, ...]

    def count(self, kind: str) -> int:
        return sum(c.kind == kind for c in self.cases)


def _properties(run, ledger_url: str | None, site: PublishedSite | NoSite) -> tuple[tuple[str, str], ...]:
    props = [("run_id", str(run.id)), ("run_kind", run.kind), ("run_status", run.status),
             ("harness_version", run.harness_version or "")]
    props += [("commit", c) for c in run_commits(run)]
    if ledger_url:
        props.append(("ledger", redact_text(ledger_url, values=url_secret_values(ledger_url))))
    report = site.url(run_page(run.id))
    if report is not None:
        props.append(("report", report))
    return tuple(props)


def _suite(run, cases: Sequence[Case], ledger_url: str | None, site: PublishedSite | NoSite) -> Suite:
    from bisect_harness.report.answers import experiment_of

    end = run.finished_at or run.created_at
    return Suite(name=experiment_of(run), timestamp=run.created_at,
                 seconds=max(0.0, (end - run.created_at).total_seconds()),
                 properties=_properties(run, ledger_url, site), cases=tuple(cases))


def _figures(a: HypothesisAnswer) -> str:
    p = f"{a.p_value:.3g}" if a.p_value is not None else "n/a"
    lines = [f"claim: {a.claim}", f"verdict: {a.outcome}", f"ratio treatment/baseline: {a.effect}",
             f"p-value: {p}", f"boots baseline/treatment: {a.boots[0]}/{a.boots[1]}", f"reason: {a.reason}"]
    return "\n".join(lines + [f"warning: {w}" for w in a.warnings])


def _hypothesis_case(a: HypothesisAnswer, classname: str) -> Case:
    if a.reading is Reading.REGRESSION:
        return Case(a.hid, classname, "failure", f"regression: {a.claim}: {a.lead}", "regression", _figures(a))
    if a.reading is Reading.UNDETERMINED:
        return Case(a.hid, classname, "skipped", f"{a.outcome}: {a.why_undetermined}")
    return Case(a.hid, classname)


def run_suite(run, *, ledger_url: str | None = None, site: PublishedSite | NoSite = NoSite()) -> Suite:
    """``run``'s hypotheses as test cases (see the module's docstring)."""
    from bisect_harness.report.answers import experiment_of

    name = experiment_of(run)
    return _suite(run, [_hypothesis_case(a, name) for a in answers_of(run)], ledger_url, site)


def _bisection_text(b) -> str:
    if not b:
        return ""
    if b.get("culprit"):
        return (f"bisection: culprit {b['culprit']} (probability {probability(b.get('leader_probability'))}, "
                f"{b.get('boots')} boots)")
    return f"bisection: no culprit named (stopped {b.get('stopped')}, {b.get('boots')} boots)"


def night_suite(run, *, ledger_url: str | None = None, site: PublishedSite | NoSite = NoSite()) -> Suite:
    """Nightly run ``run``'s points as test cases (see the module's docstring)."""
    n: NightAnswer = night_of(run)
    cases = []
    for p in n.points:
        name = f"{n.metric}@{p.point}" if p.point is not None else n.metric
        figures = "\n".join(
            [f"commit: {n.commit}", f"status: {p.status}", f"nights compared: {p.nights_compared}",
             f"reference commit: {p.reference_commit or 'n/a'}", f"ratio tonight/earlier nights: {p.effect}",
             f"p-value: {fmt(p.p_value, 4)}", f"reason: {p.reason}"]
            + ([_bisection_text(n.bisection)] if n.bisection and (p.point == n.night.point or not n.swept) else [])
            + [f"host drift: {d}" for d in n.drift] + [f"warning: {w}" for w in n.warnings])
        if n.status == "broken":
            cases.append(Case(name, n.experiment, "failure", f"broken: {n.night.reason}", "broken", figures))
        elif p.status == "regression":
            cases.append(Case(name, n.experiment, "failure", f"regression: {p.reason}", "regression", figures))
        elif p.status == "first-night":
            cases.append(Case(name, n.experiment, "skipped", f"first night: {p.reason}"))
        else:
            cases.append(Case(name, n.experiment))
    return _suite(run, cases, ledger_url, site)


def _xml_char(c: str) -> str:
    """``c`` where XML 1.0 can hold it, else ``?``: control characters but tab, newline and
    return, lone surrogates, U+FFFE and U+FFFF it cannot (an engine's log line may carry
    them into a reason)."""
    o = ord(c)
    return c if o in (0x9, 0xA, 0xD) or 0x20 <= o <= 0xD7FF or 0xE000 <= o <= 0xFFFD or o >= 0x10000 else "?"


def _x(text: str) -> str:
    """``text`` as XML 1.0 can hold it: each character it cannot, ``?``."""
    return "".join(map(_xml_char, str(text)))


def to_xml(suites: Sequence[Suite]) -> bytes:
    """The JUnit XML document of ``suites`` (UTF-8, with its declaration)."""
    root = ET.Element("testsuites", name="bisect-harness", tests=str(sum(len(s.cases) for s in suites)),
                      failures=str(sum(s.count("failure") for s in suites)), errors="0",
                      skipped=str(sum(s.count("skipped") for s in suites)),
                      time=f"{sum(s.seconds for s in suites):.3f}")
    host = socket.gethostname() or "localhost"
    for i, s in enumerate(suites):
        el = ET.SubElement(root, "testsuite", name=_x(s.name), tests=str(len(s.cases)), failures=str(s.count("failure")),
                           errors="0", skipped=str(s.count("skipped")), time=f"{s.seconds:.3f}",
                           timestamp=s.timestamp.strftime("%Y-%m-%dT%H:%M:%S"), hostname=host, id=str(i),
                           package="bisect-harness")
        props = ET.SubElement(el, "properties")
        for name, value in s.properties:
            ET.SubElement(props, "property", name=_x(name), value=_x(value))
        for c in s.cases:
            case = ET.SubElement(el, "testcase", name=_x(c.name), classname=_x(c.classname), time="0.000")
            if c.kind == "failure":
                ET.SubElement(case, "failure", message=_x(c.message), type=c.type).text = _x(c.text)
            elif c.kind == "skipped":
                ET.SubElement(case, "skipped", message=_x(c.message))
        ET.SubElement(el, "system-out").text = ""
        ET.SubElement(el, "system-err").text = ""
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def write(path: Path, document: bytes) -> Path:
    """Write ``document`` to ``path`` whole or not at all: into a temporary file in the
    same folder, then renamed onto it, so a CI step never reads half a file; the
    temporary file is removed where the write fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(document)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
