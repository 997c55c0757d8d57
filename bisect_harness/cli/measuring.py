"""The commands that boot and measure: ``run``, ``explain``, ``bisect`` and ``nightly``.

Each loads the file, calls the library (the executor, the explanation, the
bisection, the nightly check) through the run's backend, writes the journal and
renders; errors go up to the one boundary, ``cli.main``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from bisect_harness.cli.outputs import (FORMAT_OPT, JUNIT_OPT, REPORT_URL_OPT, emit, publish_markdown, shown_format,
                                        write_junit)
from bisect_harness.cli.common import (BACKEND_OPT, JOURNAL_OPT, LEDGER_OPT, RESUME_NEWEST, SLOTS_OPT, WAIT_QUIET_OPT,
                                       _backend, _console, _effect, _write_journal)
from bisect_harness.cli.summary import _verdict_table, curve_lines, run_summary
from bisect_harness.defaults import DEFAULT_CONFIDENCE, DEFAULT_MAX_BOOTS, NIGHTLY_MAX_BOOTS
from bisect_harness.errors import InfrastructureError, UserError
from bisect_harness.model import NOT_MEASURED
from bisect_harness.report.progress import observer_for
from bisect_harness.secrets import redact_obj, redact_text

__all__ = ["EXIT_NO_CULPRIT", "EXIT_UNDETERMINED", "bisect", "explain", "nightly", "run"]


def run(
    file: Path = typer.Argument(..., help="hypotheses.yaml"),
    ledger: str = LEDGER_OPT,
    journal_dir: Path = JOURNAL_OPT,
    only: Optional[List[str]] = typer.Option(None, "--only", help="Run only this hypothesis id (repeatable); "
                                         "alpha is still divided over every hypothesis of the file."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (configs, boots, argv, env); boot nothing."),
    check_flags: bool = typer.Option(False, "--check-flags", help="With --dry-run: build each commit and check "
                                     "every planned flag against its --help (exit 2 if one is refused or a "
                                     "commit does not build)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Worktrees, builds and the demo repo."),
    no_calibration: bool = typer.Option(False, "--no-calibration", help="Skip the calibration probe."),
    aa_check: bool = typer.Option(False, "--aa-check", help="Measure noise with an A/A check per baseline first; "
                                  "refuse hypotheses whose min_effect is below what the run can resolve."),
    wait_quiet: Optional[float] = WAIT_QUIET_OPT,
    backend: Optional[str] = BACKEND_OPT,
    slots: Optional[int] = SLOTS_OPT,
    resume: Optional[str] = typer.Option(None, "--resume", metavar="[RUN]",
                                         help="Continue an interrupted or failed run of FILE (default: the newest) "
                                         "in the same run: its boots on this host count, decided hypotheses "
                                         "keep their verdicts."),
    profile: bool = typer.Option(False, "--profile", help="Profile every hypothesis (as profile: true): one extra "
                                 "sample per arm under the engine's profiler, after the measured ones, never a "
                                 "sample of the verdict; the summary in the ledger, the trace beside the journal."),
    form: str = FORMAT_OPT,
    report_url: Optional[str] = REPORT_URL_OPT,
    junit_file: Optional[Path] = JUNIT_OPT,
) -> None:
    """Run every hypothesis in FILE: boot, verify, benchmark, decide, record."""
    from bisect_harness.plan.build import make_plan
    from bisect_harness.spec import load_spec

    console = _console(json_out)
    form = shown_format(form)
    if dry_run and (form != "text" or junit_file is not None):
        raise UserError("--format github and --junit show a run's answers; --dry-run boots nothing and has none: "
                        "drop one of them")
    spec = load_spec(file).select(tuple(only or ()))
    if dry_run and resume is not None:
        raise UserError("--resume boots what an interrupted run still lacks; --dry-run boots nothing: drop one of them")
    if check_flags and not dry_run:
        raise UserError("--check-flags goes with --dry-run: run `harness run FILE --dry-run --check-flags`")
    resume_id = _resume_id(resume)
    # One plan for the command: a dry run resolves revisions only where the repository is here.
    plan = make_plan(spec, cache_dir=cache_dir, resolve_if_present=dry_run)
    if profile:
        plan = dataclasses.replace(plan, profile_all=True)
    if dry_run:
        _dry_run(plan, console, json_out=json_out, check_flags=check_flags)
        return
    # The measuring and statistics modules load only once the file and the plan are good,
    # so bad input is answered at once.
    from bisect_harness.run.executor import Executor
    from bisect_harness.record.ledger import Ledger
    with Ledger(ledger) as led, observer_for(console) as obs, \
            _backend(spec, backend, slots, journal_dir) as boots:
        earlier = None
        if resume is not None:  # the run to continue, refused before anything is written
            from bisect_harness.run.resume import check_plan, find_run

            earlier = find_run(led, spec, resume_id)
            check_plan(earlier, plan, aa_check=aa_check)
        executor = Executor(plan, led, log_dir=journal_dir / "logs", observer=obs, calibrate=not no_calibration,
                            aa_check=aa_check, wait_quiet_s=wait_quiet, backend=boots, resume=earlier,
                            profile=profile)
        try:
            the_run = executor.execute()  # bisect: true and explain: true searches included
        except BaseException:  # the journal of what was recorded, never hiding why the run stopped
            _write_journal(led, executor.run, journal_dir, console, ledger, after_error=True)
            raise
        _write_journal(led, the_run, journal_dir, console, ledger)
        _ci_forms(console, the_run, form=form, report_url=report_url, junit_file=junit_file, ledger=led.shown,
                  json_out=json_out)
        console.print(f"ledger: {led.shown} (run {the_run.id})", markup=False)  # its password never printed
        if json_out:
            emit("run", run_summary(the_run))
        _fail_if_not_measured(the_run, journal_dir / "logs")
        _exit_if_no_culprit(the_run, console)


def _ci_forms(console: Console, run, *, form: str, report_url: str | None, junit_file: Path | None, ledger: str,
              json_out: bool) -> None:
    """A run's answers as ``--format`` asks (the verdict table and the curves' lines, or
    ``report.github``'s markdown) and, with ``--junit``, as JUnit XML (``report.junit``)."""
    from bisect_harness.report.site_links import site_at

    site = site_at(report_url)
    if form == "github":
        from bisect_harness.report.github import run_markdown

        publish_markdown(redact_text(run_markdown(run, site)), json_mode=json_out)
    else:
        console.print(_verdict_table(run))
        for line in curve_lines(run):
            console.print(line, markup=False)
    if junit_file is not None:
        from bisect_harness.report.junit import run_suite

        console.print(f"junit: {write_junit(junit_file, [run_suite(run, ledger_url=ledger, site=site)])}",
                      markup=False)


def _exit_if_no_culprit(run, console: Console) -> None:
    """A ``bisect: true`` search that named no culprit ends the run with exit 6 (5 where
    it stopped ``undetermined``), once everything is recorded and printed."""
    from bisect_harness.cli.summary import run_summary

    missed = [(h["id"], h["bisection"]) for h in run_summary(run)["hypotheses"]
              if h.get("bisection") and not h["bisection"].get("culprit")]
    if not missed:
        return
    for hid, b in missed:
        console.print(f"{hid}: its bisection named no culprit ({b.get('stopped')}, {b.get('boots')} boots)",
                      markup=False)
    raise typer.Exit(EXIT_UNDETERMINED if any(b.get("stopped") == "undetermined" for _, b in missed)
                     else EXIT_NO_CULPRIT)


def _dry_run(plan, console: Console, *, json_out: bool, check_flags: bool) -> None:
    """``harness run --dry-run``: the plan printed (secrets masked), the flag check's refusals as exit 2."""
    from bisect_harness.plan.dryrun import describe

    text, obj = describe(plan, check_flags=check_flags, say=lambda t: console.print(redact_text(t), markup=False))
    text, obj = redact_text(text), redact_obj(obj)  # secrets masked (secrets.py)
    if json_out:
        emit("plan", obj)
    else:
        typer.echo(text)  # plain: a plan is copied into terminals and issues, never wrapped
    failed_help = obj.get("flags_help_failed") or []
    if failed_help:
        import shlex

        first = failed_help[0]
        where = f"at commit {first['commit'][:12]}" if first["commit"] else "for the installed server"
        raise UserError(f"--check-flags: the help argv `{shlex.join(first['help_argv'])}` could not be read "
                        f"{where} ({first['error'].splitlines()[0]}); so no flag was checked. Make the launch "
                        "runnable (engine.launch, engine.python: the interpreter whose bin holds the engine's "
                        "command) and check again")
    broken = obj.get("builds_failed") or []
    if broken:  # no help to read: the commit's flags are unchecked, and its boots would be skipped
        first = broken[0]
        lines = "\n".join(f"  | {line}" for line in first["last_errors"])
        more = f" (and {len(broken) - 1} other commit(s))" if len(broken) > 1 else ""
        raise UserError(f"--check-flags: {first['error']}{more}, so its flags were not checked; build log: "
                        f"{first['log']}; its last error lines:\n{lines}\nFix engine.build for that commit "
                        "(or leave the commit out) and check again")
    if obj.get("flags_refused"):
        raise UserError("a planned flag is not accepted at some commit (see the flag check above); rename it "
                        "for that commit or drop that hypothesis before booting")


def _fail_if_not_measured(run, log_dir: Path) -> None:
    """A hypothesis whose side never booted ends the run with exit 3 (the machine or a
    tool failed), naming the launch argv and the first failure; all else was recorded."""
    never = [(h.hid, h.verdict.reason) for h in run.hypotheses
             if h.verdict is not None and h.verdict.test == NOT_MEASURED]
    if not never:
        return
    lines = "\n".join(f"  {hid}: {reason}" for hid, reason in never)
    if all("flag not accepted" in reason for _hid, reason in never):  # the argv is wrong: bad input
        raise UserError(f"{len(never)} of {len(run.hypotheses)} hypotheses not measured: the engine refused a "
                        f"flag\n{lines}\nRename the flag for that commit (harness run FILE --dry-run "
                        "--check-flags finds these before any boot) and run again")
    raise InfrastructureError(
        f"{len(never)} of {len(run.hypotheses)} hypotheses not measured: a config never booted\n{lines}\n"
        f"Run the launch argv by hand, or read the boot logs in {log_dir}; fix engine.launch, engine.python "
        "or the build, and run again (every boot, failed ones too, is in the ledger)")


def _resume_id(value: str | None) -> int | None:
    if value is None or value == RESUME_NEWEST:
        return None
    try:
        return int(value)
    except ValueError:
        raise UserError(f"--resume {value!r}: give a run id (`harness ledger list` shows them), or no value for "
                        "the newest interrupted run of the file") from None


def _options(kind, flags: str, **fields):
    """``kind(**fields)``, its refusal of a value a UserError naming the flags to fix."""
    try:
        return kind(**fields)
    except ValueError as exc:
        raise UserError(f"{exc}; fix {flags} and run again") from None


def _print_explanation(console: Console, out) -> None:
    from bisect_harness.run.explain_runner import explanation_lines

    for line in explanation_lines(out):
        console.print(line, markup=False, emoji=False)


#: ``--at`` of the commands that search one load point of a file that sweeps several.
AT_OPT = typer.Option(None, "--at", metavar="LABEL", help="On a file that sweeps load points: the point to search "
                      "at, as its label reads (e.g. concurrency=32). Default: the point of the largest confirmed "
                      "effect in the newest run of the file in the ledger.")

def explain(
    file: Path = typer.Argument(..., help="hypotheses.yaml: its arms name the two configs"),
    fast: str = typer.Option(..., "--fast", help="The fast config: HID.baseline or HID.treatment."),
    slow: str = typer.Option(..., "--slow", help="The slow config: HID.baseline or HID.treatment."),
    min_effect: Optional[str] = typer.Option(None, "--min-effect", help="Smallest relative change that counts, "
                                             "0.05 or 5% (default: the slow arm's hypothesis' min_effect)."),
    alpha: float = typer.Option(0.01, "--alpha", help="Error of the slowdown test, and of the whole set: the "
                                "leave-out decisions share it (Bonferroni over tests and looks)."),
    at: Optional[str] = AT_OPT,
    ledger: str = LEDGER_OPT,
    journal_dir: Path = JOURNAL_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
    wait_quiet: Optional[float] = WAIT_QUIET_OPT,
    backend: Optional[str] = BACKEND_OPT,
    slots: Optional[int] = SLOTS_OPT,
) -> None:
    """Find which differences (env, flags, commit) between two arms make the slow one slow."""
    from bisect_harness.spec import load_spec

    console = _console(json_out)
    spec = load_spec(file)
    from bisect_harness.run.bisect_runner import MeasureSetup
    from bisect_harness.run.explain_runner import ExplainOptions, explain_file
    from bisect_harness.record.ledger import Ledger
    options = ExplainOptions(min_effect=_effect(min_effect), alpha=alpha)
    with Ledger(ledger) as led, observer_for(console) as obs, \
            _backend(spec, backend, slots, journal_dir) as boots:
        setup = MeasureSetup(journal_dir / "logs", cache_dir=cache_dir, observer=obs, wait_quiet_s=wait_quiet,
                             backend=boots)
        out, sched = explain_file(spec, led, fast, slow, options, setup, at=at)
        _write_journal(led, sched.run, journal_dir, console, ledger)
        _print_explanation(console, out)
        if json_out:
            emit("explain", {"run_id": sched.run.id, **out.record})


#: What --good and --bad take.
_REVISION = ("a commit (sha), tag or branch of engine.repo, or a released version (e.g. 1.4.2) where the file "
             "has engine.releases; both of one kind.")


def bisect(
    file: Path = typer.Argument(..., help="hypotheses.yaml: its engine and benchmark are used"),
    good: str = typer.Option(..., "--good", help="A revision before the regression: " + _REVISION),
    bad: str = typer.Option(..., "--bad", help="A revision after it: " + _REVISION),
    metric: str = typer.Option("tok_s", "--metric", help="Metric to bisect on."),
    confidence: float = typer.Option(DEFAULT_CONFIDENCE, "--confidence", help="Posterior mass the culprit must hold."),
    max_boots: int = typer.Option(DEFAULT_MAX_BOOTS, "--max-boots", help="Budget of boots for the search."),
    first_parent: bool = typer.Option(False, "--first-parent", help="Follow only the first parent of merges."),
    fresh: bool = typer.Option(False, "--fresh", help="New boots only: boots of earlier runs in the ledger do not "
                               "feed the search (by default they feed its posterior, never its paired tests)."),
    min_effect: str = typer.Option("5%", "--min-effect", help="Smallest relative change that counts (0.05 or 5%): "
                                   "endpoints shown to differ by less end the search as not reproduced; 'any' "
                                   "counts every change."),
    at: Optional[str] = AT_OPT,
    ledger: str = LEDGER_OPT,
    journal_dir: Path = JOURNAL_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
    wait_quiet: Optional[float] = WAIT_QUIET_OPT,
    backend: Optional[str] = BACKEND_OPT,
    slots: Optional[int] = SLOTS_OPT,
) -> None:
    """Find the first commit between GOOD and BAD whose METRIC moved, under noise."""
    from bisect_harness.spec import load_spec

    console = _console(json_out)
    try:
        least = None if min_effect.strip().lower() == "any" else _effect(min_effect)
    except UserError as exc:
        raise UserError(f"{exc}; or 'any' to count every change") from None
    from bisect_harness.decide.bisect.options import SearchOptions

    search = _options(SearchOptions, "--confidence, --max-boots or --min-effect", confidence=confidence,
                      max_boots=max_boots, min_effect=least)
    spec = load_spec(file)
    from bisect_harness.run.bisect_runner import BisectRequest, MeasureSetup, bisect_range
    from bisect_harness.record.ledger import Ledger
    request = BisectRequest(good, bad, metric, search, first_parent=first_parent, fresh=fresh, at=at)
    with Ledger(ledger) as led, observer_for(console, budget=max_boots) as obs, \
            _backend(spec, backend, slots, journal_dir) as boots:
        setup = MeasureSetup(journal_dir / "logs", cache_dir=cache_dir, observer=obs, wait_quiet_s=wait_quiet,
                             backend=boots)
        result, executor = bisect_range(spec, led, request, setup)
        _write_journal(led, executor.run, journal_dir, console, ledger)
        if result.culprit and result.releases:
            console.print(f"culprit release: {result.culprit} (probability {result.leader_probability:.3f}, "
                          f"{result.boots} boots)", markup=False)
            d = result.descent
            if d is not None and d.culprit:
                console.print(f"culprit commit: {d.culprit} (probability {d.leader_probability:.3f}, {d.boots} boots)",
                              markup=False)
            elif d is not None:
                console.print(f"no single culprit commit ({d.stopped})", markup=False)
            else:
                console.print(f"  {result.descent_note}", markup=False)
        elif result.culprit:
            console.print(f"culprit: {result.culprit} (probability {result.leader_probability:.3f}, "
                          f"{result.boots} boots)",
                          markup=False)
        else:
            et = result.endpoint_test or {}
            if et.get("decision") == "below":
                console.print(f"the endpoints differ by less than --min-effect {min_effect} (upper bound "
                              f"{et['upper']:.4g} against {et['below']:.4g} {metric}, {et['pairs']} paired rounds)",
                              markup=False)
            console.print(f"no single culprit ({result.stopped}); candidates: "
                          + ", ".join(f"{c.commit[:12]} {c.probability:.2f}" for c in result.candidates[:5]),
                          markup=False)
        for w in result.warnings:
            console.print(f"  warning: {w}", markup=False)
        if json_out:
            emit("bisect", result.to_json())
    u = result.undetermined or (result.descent.undetermined if result.descent else None)
    if u:  # the host could not tell: no finding either way
        console.print(f"undetermined, not {u['would_have_stopped']}: {u['why']}; {u['would_decide']}", markup=False)
        raise typer.Exit(EXIT_UNDETERMINED)
    if not result.named():  # budget spent, unverified, no step: whatever it found, no culprit to act on
        raise typer.Exit(EXIT_NO_CULPRIT)


def _night_forms(run, *, form: str, report_url: str | None, junit_file: Path | None, ledger: str
                 ) -> tuple[str | None, Path | None]:
    """The night's markdown where ``--format github`` asks for it, and the path of its
    JUnit file where ``--junit`` does (written here), both read from what the night
    stored; made while the ledger is open."""
    from bisect_harness.report.site_links import site_at

    site = site_at(report_url)
    markdown = None
    if form == "github":
        from bisect_harness.report.github import night_markdown

        markdown = redact_text(night_markdown(run, site))
    path = None
    if junit_file is not None:
        from bisect_harness.report.junit import night_suite

        path = write_junit(junit_file, [night_suite(run, ledger_url=ledger, site=site)])
    return markdown, path


#: ``harness bisect``: the search stopped without an answer on a host that was mostly busy
EXIT_UNDETERMINED = 5
#: ``harness bisect`` (and ``harness run`` with ``bisect: true``): no culprit was named (its
#: stop reason says why: budget, unverified, ambiguous-skips, not-reproduced, ...)
EXIT_NO_CULPRIT = 6


def nightly(
    file: Path = typer.Argument(..., help="hypotheses.yaml: its engine, benchmark and defaults are used"),
    rev: str = typer.Option("HEAD", "--rev", help="The commit to measure tonight."),
    metric: str = typer.Option("tok_s", "--metric", help="Metric to watch."),
    min_effect: str = typer.Option("5%", "--min-effect", help="Smallest relative regression that alerts (0.05 or 5%)."),
    alpha: float = typer.Option(0.01, "--alpha", help="False-alert rate per night."),
    window: int = typer.Option(7, "--window", help="Earlier nights to compare with."),
    no_bisect: bool = typer.Option(False, "--no-bisect", help="Alert without bisecting."),
    max_boots: int = typer.Option(NIGHTLY_MAX_BOOTS, "--max-boots", help="Budget of boots for the bisection."),
    ledger: str = LEDGER_OPT,
    journal_dir: Path = JOURNAL_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
    no_calibration: bool = typer.Option(False, "--no-calibration", help="Skip the calibration probe."),
    wait_quiet: Optional[float] = WAIT_QUIET_OPT,
    backend: Optional[str] = BACKEND_OPT,
    slots: Optional[int] = SLOTS_OPT,
    changepoints: bool = typer.Option(False, "--changepoints", help="Then look for level shifts over the whole "
                                      "series (old ones no night flagged); reported, never an alert."),
    form: str = FORMAT_OPT,
    report_url: Optional[str] = REPORT_URL_OPT,
    junit_file: Optional[Path] = JUNIT_OPT,
) -> None:
    """Measure the newest commit, compare with earlier nights, bisect a regression.

    Exit 4 on an alert (a regression, or tonight's commit failed to build or boot)."""
    from bisect_harness.spec import load_spec

    console = _console(json_out)
    form = shown_format(form)
    from bisect_harness.run.nightly import NightlyOptions, run_nightly

    options = _options(NightlyOptions, "--min-effect or --max-boots", rev=rev, metric=metric,
                       min_effect=_effect(min_effect), alpha=alpha, window=window, bisect=not no_bisect,
                       max_boots=max_boots, calibrate=not no_calibration)
    spec = load_spec(file)
    from bisect_harness.run.bisect_runner import MeasureSetup
    from bisect_harness.record.ledger import Ledger
    # tonight's boots, retries included; a bisection after them counts against its own budget
    with Ledger(ledger) as led, observer_for(console, budget=spec.defaults.boots_per_config) as obs, \
            _backend(spec, backend, slots, journal_dir) as boots:
        setup = MeasureSetup(journal_dir / "logs", cache_dir=cache_dir, observer=obs, wait_quiet_s=wait_quiet,
                             backend=boots)
        outcome, executor = run_nightly(spec, led, options, setup)
        report = None
        if changepoints:
            from bisect_harness.report.series import change_point_report

            report = change_point_report(led, executor.run, metric, alpha=alpha, min_effect=_effect(min_effect),
                                         window=window)
            executor.run.summary = {**(executor.run.summary or {}), "changepoints": report}
            led.commit()
        _write_journal(led, executor.run, journal_dir, console, ledger)
        markdown, junit_path = _night_forms(executor.run, form=form, report_url=report_url, junit_file=junit_file,
                                            ledger=ledger)
    if markdown is not None:
        publish_markdown(markdown, json_mode=json_out)
    else:
        console.print(f"{outcome.status}: {outcome.reason}", markup=False)
        if report is not None:
            from bisect_harness.report.series import report_lines

            for line in report_lines(report):
                console.print(line, markup=False)
        for d in outcome.drift:
            console.print(f"  host drift: {d}", markup=False)
        for w in outcome.warnings:
            console.print(f"  warning: {w}", markup=False)
    if junit_path is not None:
        console.print(f"junit: {junit_path}", markup=False)
    if json_out:
        emit("nightly", {**outcome.to_json(), **({"changepoints": report} if report is not None else {})})
    if outcome.alert:
        raise typer.Exit(4)
