"""The ``harness`` command: thin commands over the library, one error boundary.

Each command loads, calls the library, renders. Only ``main`` turns errors into
exit codes: 0 done, 1 an unexpected error (a bug: traceback shown), 2 bad input
(the message names the key, commit or flag), 3 the machine or a tool failed,
130 interrupted. Machine-readable output (``--json``) is the last line of stdout;
progress and tables go to stderr when ``--json`` is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape  # every user string shown through Rich markup goes through it
from rich.table import Table

from bisect_harness.errors import HarnessError, InfrastructureError, UserError
from bisect_harness.model import NOT_MEASURED, shown_outcome
from bisect_harness.report.progress import observer_for
from bisect_harness.secrets import redact_obj, redact_text
from bisect_harness.spec import effect_value
from bisect_harness.defaults import DEFAULT_CONFIDENCE, DEFAULT_MAX_BOOTS, NIGHTLY_MAX_BOOTS

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Hypothesis-driven regression bisection for LLM inference engines.")
demo_app = typer.Typer(no_args_is_help=True, help="The built-in demo engine (no GPU needed).")
ledger_app = typer.Typer(no_args_is_help=True, help="Read the ledger (results.db).")
app.add_typer(demo_app, name="demo")
app.add_typer(ledger_app, name="ledger")
cache_app = typer.Typer(no_args_is_help=True, help="The cache's worktrees and per-commit environments.")
app.add_typer(cache_app, name="cache")

LEDGER_OPT = typer.Option("sqlite:///results.db", "--ledger", help="SQLAlchemy URL of the ledger.")
JOURNAL_OPT = typer.Option(Path("experiments"), "--journal-dir", help="Folder for journals, logs and plots.")
#: ``--wait-quiet`` without a value waits this long at most (see ``_wait_quiet_value``).
WAIT_QUIET_DEFAULT_S = 600.0
BACKEND_OPT = typer.Option(None, "--backend", help="Where boots run: local (this host) or slurm (jobs on a "
                           "cluster; see docs/slurm.md). Default: the file's backend.kind, else local.")
SLOTS_OPT = typer.Option(None, "--slots", help="Boots at once: local, disjoint CPU cores and GPUs per boot; "
                         "slurm, jobs in flight. Default: the file's backend.slots, else 1.")
WAIT_QUIET_OPT = typer.Option(None, "--wait-quiet", metavar="[SECONDS]",
                              help="Before the first boot, wait up to SECONDS (600 without a value) for a quiet host.")


def _console(json_mode: bool) -> Console:
    return Console(stderr=json_mode, highlight=False)


def _verdict_table(run) -> Table:
    t = Table(title=f"run {run.id}: verdicts")
    from bisect_harness.report.journal import _checks_cell

    for col in ("hypothesis", "metric", "verdict", "ratio t/b", "CI", "p", "boots b/t", "checks"):
        t.add_column(col)
    for h in run.hypotheses:
        v = h.verdict
        if v is None:
            t.add_row(escape(h.hid), escape(h.metric), "not decided", "", "", "", "", "")
            continue
        ci = f"[{v.ci_low:.4f}, {v.ci_high:.4f}]" if v.ci_low is not None else "n/a"
        t.add_row(escape(h.hid), escape(h.metric), shown_outcome(v), f"{v.ratio:.4f}" if v.ratio is not None else "n/a", escape(ci),
                  f"{v.p_value:.3g}" if v.p_value is not None else "n/a",
                  f"{len(v.baseline_boot_ids)}/{len(v.treatment_boot_ids)}",
                  escape(_checks_cell(v.warnings, [w for w in v.warnings or [] if w.startswith("host drift")],
                                      (v.stats or {}).get("checks")).replace("**", "")))
    return t


def _checks_json(v) -> dict:
    """What the verdict's boots checked: counts per check (``decide.checks_done``: boots per
    check, flags compared and not reported) and a word (``ok`` / ``unchecked`` / the marks,
    with the flags the server did not report named; never ``ok`` for those)."""
    from bisect_harness.report.journal import _checks_cell

    if v is None:
        return {"word": "unchecked", "counts": None}
    counts = (v.stats or {}).get("checks")
    word = _checks_cell(v.warnings, [w for w in v.warnings or [] if w.startswith("host drift")], counts)
    return {"word": word.replace("**", ""), "counts": counts}


def _follow_ups_json(run) -> dict[int, dict]:
    """Per hypothesis row id, what its ``bisect: true`` and ``explain: true`` searches
    found (the last of each, as the journal shows them)."""
    from sqlalchemy.orm import object_session

    from bisect_harness.record.ledger import Bisection

    out: dict[int, dict] = {}
    explained = [e for e in (run.summary or {}).get("explain", []) if e.get("hypothesis_id") is not None]
    inner = {(e.get("bisection") or {}).get("id") for e in explained}  # an explanation's own bisection
    session = object_session(run)
    for bis in (session.query(Bisection).filter_by(run_id=run.id).order_by(Bisection.id) if session else []):
        if bis.hypothesis_id is None or bis.id in inner:
            continue
        r = bis.result or {}
        out.setdefault(bis.hypothesis_id, {})["bisection"] = {
            "id": bis.id, "status": bis.status, "culprit": r.get("culprit"), "probability": r.get("probability"),
            "stopped": r.get("stopped"), "boots": r.get("boots"), "candidate_set": r.get("candidate_set")}
    for e in explained:
        out.setdefault(e["hypothesis_id"], {})["explanation"] = {
            k: e.get(k) for k in ("members", "interactions", "opposite", "undecided", "stopped", "boots", "bisection")}
    return out


def _mechanisms_json(v) -> dict:
    """Per arm, how often each mechanism read each state over the verdict's boots
    (``boots.provenance["mechanisms"]``), e.g. ``{"treatment": {"CUDA graphs":
    {"set_up_not_seen": 2}}}``; {} when no boot checked one."""
    from sqlalchemy.orm import object_session

    from bisect_harness.record.ledger import Boot

    session = object_session(v) if v is not None else None
    out: dict[str, dict] = {}
    for arm, ids in (("baseline", v.baseline_boot_ids), ("treatment", v.treatment_boot_ids)) if session else ():
        for b in session.query(Boot).filter(Boot.id.in_(list(ids or []))).order_by(Boot.id):
            for m in (b.provenance or {}).get("mechanisms") or []:
                states = out.setdefault(arm, {}).setdefault(m.get("name"), {})
                states[m.get("state")] = states.get(m.get("state"), 0) + 1
    return out


def run_summary(run) -> dict:
    """The ``--json`` object of ``harness run``: each hypothesis' verdict, what its
    bisection and explanation found where the file asked for them, and its arms'
    profiles side by side (``profile``) where a boot of either arm was profiled, and
    each arm's mean of the engine's declared metrics over the verdict's windows
    (``window_metrics``)."""
    from bisect_harness.spec.metric_defs import declared_metrics
    from bisect_harness.report.profile_view import hypothesis_json
    from bisect_harness.report.window_view import hypothesis_json as window_json

    out = []
    searches = _follow_ups_json(run)
    declared = declared_metrics(run.spec_text)
    for h in run.hypotheses:
        v = h.verdict
        profile = hypothesis_json(h, run)  # where a boot of either arm was profiled
        out.append({**searches.get(h.id, {}), **({"profile": profile} if profile else {}),
            "id": h.hid, "verdict": shown_outcome(v) if v else "inconclusive", "metric": h.metric,
            "measured": bool(v) and v.test != NOT_MEASURED,
            "effect": v.ratio if v else None,
            "ci": [v.ci_low, v.ci_high] if v and v.ci_low is not None else None,
            "p_value": v.p_value if v else None,
            "boots": {"baseline": len(v.baseline_boot_ids) if v else 0,
                      "treatment": len(v.treatment_boot_ids) if v else 0},
            "reason": v.reason if v else "no verdict recorded",
            "checks": _checks_json(v),
            "mechanisms": _mechanisms_json(v),
            "window_metrics": (window_json(h, declared) or {}).get("metrics", []),
            "warnings": list(v.warnings or []) if v else []})
    return {"run_id": run.id, "status": run.status, "hypotheses": out}


@app.command()
def run(
    file: Path = typer.Argument(..., help="hypotheses.yaml"),
    ledger: str = LEDGER_OPT,
    journal_dir: Path = JOURNAL_OPT,
    only: Optional[List[str]] = typer.Option(None, "--only", help="Run only this hypothesis id (repeatable); "
                                         "alpha is still divided over every hypothesis of the file."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (configs, boots, argv, env); boot nothing."),
    check_flags: bool = typer.Option(False, "--check-flags", help="With --dry-run: build each commit and check "
                                     "every planned flag against its --help (exit 2 if one is refused)."),
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
) -> None:
    """Run every hypothesis in FILE: boot, verify, benchmark, decide, record."""
    from bisect_harness.plan.build import make_plan
    from bisect_harness.spec import load_spec

    console = _console(json_out)
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
        console.print(_verdict_table(the_run))
        console.print(f"ledger: {ledger} (run {the_run.id})", markup=False)
        if json_out:
            print(json.dumps(run_summary(the_run)))
        _fail_if_not_measured(the_run, journal_dir / "logs")


#: What a refused write means, by errno, and what to do about it.
_WRITE_FIXES = {
    errno.ENOSPC: "free space on that disk",
    errno.EDQUOT: "free space on that disk (the quota is spent)",
    errno.EROFS: "make it writable, or pass --journal-dir with a writable folder",
    errno.EACCES: "make it writable, or pass --journal-dir with a writable folder",
    errno.EPERM: "make it writable, or pass --journal-dir with a writable folder",
    errno.ENOTDIR: "a file stands where a folder should be: move it, or pass --journal-dir with a folder",
    errno.EEXIST: "a file stands where a folder should be: move it, or pass --journal-dir with a folder",
    errno.EISDIR: "a folder stands where the journal's file should be: move it, or pass another --journal-dir",
}


def _write_journal(led, run, journal_dir: Path, console: Console, ledger_url: str, *,
                   after_error: bool = False) -> None:
    """Write ``run``'s journal and say where. A refused write (disk full, read-only, a
    file where the folder should be) is a machine failure, exit 3, saying what failed
    and how to write the journal again from the ledger; after another error (the run
    already stopped) it is one line, and that error goes on."""
    from bisect_harness.report import journal

    if run is None:
        return
    try:
        path = journal.write(led, run, journal_dir)
    except HarnessError as exc:  # the ledger could not be read back
        if not after_error:
            raise
        console.print(redact_text(f"warning: the journal of run {run.id} was not written: {exc}"), markup=False)
        return
    except OSError as exc:
        fix = _WRITE_FIXES.get(exc.errno, "fix that")
        where = f" ({exc.filename})" if exc.filename else ""
        error = InfrastructureError(
            f"could not write the journal of run {run.id} in {journal_dir}: {exc.strerror or exc}{where}. The run is "
            f"in the ledger (status {run.status}); {fix}, then `harness journal {run.id} --ledger {ledger_url} "
            f"--journal-dir {journal_dir}` writes it again")
        if not after_error:
            raise error from None
        console.print(redact_text(f"warning: {error}"), markup=False)
        return
    console.print(f"journal: {path}", markup=False)


def _dry_run(plan, console: Console, *, json_out: bool, check_flags: bool) -> None:
    """``harness run --dry-run``: the plan printed (secrets masked), the flag check's refusals as exit 2."""
    from bisect_harness.plan.dryrun import describe

    text, obj = describe(plan, check_flags=check_flags, say=lambda t: console.print(redact_text(t), markup=False))
    text, obj = redact_text(text), redact_obj(obj)  # secrets masked (secrets.py)
    if json_out:
        print(json.dumps(obj))
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


@contextlib.contextmanager
def _backend(spec, kind: str | None, slots: int | None, journal_dir: Path):
    """The run's backend (``--backend``/``--slots`` over the file's ``backend:``), closed
    on the way out: a Slurm backend cancels jobs still in flight."""
    from bisect_harness.backends.choose import make_backend

    backend = make_backend(spec, kind=kind, slots=slots, log_dir=journal_dir / "logs")
    try:
        yield backend
    finally:
        backend.close()


def _print_explanation(console: Console, out) -> None:
    from bisect_harness.run.explain_runner import explanation_lines

    for line in explanation_lines(out):
        console.print(line, markup=False, emoji=False)


@app.command()
def explain(
    file: Path = typer.Argument(..., help="hypotheses.yaml: its arms name the two configs"),
    fast: str = typer.Option(..., "--fast", help="The fast config: HID.baseline or HID.treatment."),
    slow: str = typer.Option(..., "--slow", help="The slow config: HID.baseline or HID.treatment."),
    min_effect: Optional[str] = typer.Option(None, "--min-effect", help="Smallest relative change that counts, "
                                             "0.05 or 5% (default: the slow arm's hypothesis' min_effect)."),
    alpha: float = typer.Option(0.01, "--alpha", help="Error of the slowdown test, and of the whole set: the "
                                "leave-out decisions share it (Bonferroni over tests and looks)."),
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
    from bisect_harness.run.explain_runner import explain_file
    from bisect_harness.record.ledger import Ledger
    with Ledger(ledger) as led, observer_for(console) as obs, \
            _backend(spec, backend, slots, journal_dir) as boots:
        out, sched = explain_file(spec, led, fast=fast, slow=slow, min_effect=_effect(min_effect), alpha=alpha,
                                  cache_dir=cache_dir, log_dir=journal_dir / "logs", observer=obs,
                                  wait_quiet_s=wait_quiet, backend=boots)
        _write_journal(led, sched.run, journal_dir, console, ledger)
        _print_explanation(console, out)
        if json_out:
            print(json.dumps({"run_id": sched.run.id, **out.record}))


@app.command()
def bisect(
    file: Path = typer.Argument(..., help="hypotheses.yaml: its engine and benchmark are used"),
    good: str = typer.Option(..., "--good", help="A revision before the regression."),
    bad: str = typer.Option(..., "--bad", help="A revision after it."),
    metric: str = typer.Option("tok_s", "--metric", help="Metric to bisect on."),
    confidence: float = typer.Option(DEFAULT_CONFIDENCE, "--confidence", help="Posterior mass the culprit must hold."),
    max_boots: int = typer.Option(DEFAULT_MAX_BOOTS, "--max-boots", help="Budget of boots for the search."),
    first_parent: bool = typer.Option(False, "--first-parent", help="Follow only the first parent of merges."),
    fresh: bool = typer.Option(False, "--fresh", help="New boots only: boots of earlier runs in the ledger do not "
                               "feed the search (by default they feed its posterior, never its paired tests)."),
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
    spec = load_spec(file)
    from bisect_harness.run.bisect_runner import bisect_range
    from bisect_harness.record.ledger import Ledger
    with Ledger(ledger) as led, observer_for(console, budget=max_boots) as obs, \
            _backend(spec, backend, slots, journal_dir) as boots:
        result, executor = bisect_range(spec, led, good=good, bad=bad, metric=metric, confidence=confidence,
                                        max_boots=max_boots, first_parent=first_parent, cache_dir=cache_dir,
                                        log_dir=journal_dir / "logs", observer=obs, wait_quiet_s=wait_quiet,
                                        backend=boots, fresh=fresh)
        _write_journal(led, executor.run, journal_dir, console, ledger)
        if result.culprit and result.releases:
            console.print(f"culprit release: {result.culprit} (probability {result.probability:.3f}, "
                          f"{result.boots} boots)", markup=False)
            d = result.descent
            if d is not None and d.culprit:
                console.print(f"culprit commit: {d.culprit} (probability {d.probability:.3f}, {d.boots} boots)",
                              markup=False)
            elif d is not None:
                console.print(f"no single culprit commit ({d.stopped})", markup=False)
            else:
                console.print(f"  {result.descent_note}", markup=False)
        elif result.culprit:
            console.print(f"culprit: {result.culprit} (probability {result.probability:.3f}, {result.boots} boots)",
                          markup=False)
        else:
            console.print(f"no single culprit ({result.stopped}); candidates: "
                          + ", ".join(f"{c.commit[:12]} {c.probability:.2f}" for c in result.candidates[:5]),
                          markup=False)
        for w in result.warnings:
            console.print(f"  warning: {w}", markup=False)
        if json_out:
            print(json.dumps(result.to_json()))
    if result.undetermined:  # the host could not tell: no finding either way
        u = result.undetermined
        console.print(f"undetermined, not {u['would_have_stopped']}: {u['why']}; {u['would_decide']}", markup=False)
        raise typer.Exit(EXIT_UNDETERMINED)


#: ``harness bisect``: the search stopped without an answer on a host that was mostly busy
EXIT_UNDETERMINED = 5


@app.command()
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
) -> None:
    """Measure the newest commit, compare with earlier nights, bisect a regression.

    Exit 4 on an alert (a regression, or tonight's commit failed to build or boot)."""
    from bisect_harness.spec import load_spec

    console = _console(json_out)
    spec = load_spec(file)
    from bisect_harness.run.nightly import run_nightly
    from bisect_harness.record.ledger import Ledger
    budget = spec.defaults.max_boots_per_arm + (0 if no_bisect else max_boots)  # tonight, then a bisection
    with Ledger(ledger) as led, observer_for(console, budget=budget) as obs, \
            _backend(spec, backend, slots, journal_dir) as boots:
        outcome, executor = run_nightly(spec, led, rev=rev, metric=metric, min_effect=_effect(min_effect), alpha=alpha,
                                        window=window, bisect=not no_bisect, max_boots=max_boots,
                                        cache_dir=cache_dir, log_dir=journal_dir / "logs", observer=obs,
                                        calibrate=not no_calibration, wait_quiet_s=wait_quiet, backend=boots)
        report = None
        if changepoints:
            from bisect_harness.report.series import change_point_report

            report = change_point_report(led, executor.run, metric, alpha=alpha, min_effect=_effect(min_effect),
                                         window=window)
            executor.run.summary = {**(executor.run.summary or {}), "changepoints": report}
            led.commit()
        _write_journal(led, executor.run, journal_dir, console, ledger)
    console.print(f"{outcome.status}: {outcome.reason}", markup=False)
    if report is not None:
        from bisect_harness.report.series import report_lines

        for line in report_lines(report):
            console.print(line, markup=False)
    for d in outcome.drift:
        console.print(f"  host drift: {d}", markup=False)
    for w in outcome.warnings:
        console.print(f"  warning: {w}", markup=False)
    if json_out:
        print(json.dumps({**outcome.to_json(), **({"changepoints": report} if report is not None else {})}))
    if outcome.alert:
        raise typer.Exit(4)


@demo_app.command("init")
def demo_init(directory: Path = typer.Argument(..., help="Where to create the demo engine's git repository.")) -> None:
    """Lay down the demo engine: a real git history of a small torch inference server."""
    from bisect_harness.demo import create_demo_repo

    if directory.exists() and any(directory.iterdir()):
        raise UserError(f"{directory} exists and is not empty; pick a new folder")
    history = create_demo_repo(directory)
    Console().print(f"demo engine: {directory} ({len(history.shas)} commits, HEAD {history.shas[-1][:12]})", markup=False)


@ledger_app.command("list")
def ledger_list(ledger: str = LEDGER_OPT, json_out: bool = typer.Option(False, "--json")) -> None:
    """The runs in the ledger, newest first."""
    from bisect_harness.record.ledger import Ledger, require_existing

    with Ledger(require_existing(ledger)) as led:
        runs = led.runs()
        if json_out:
            print(json.dumps([{"run_id": r.id, "kind": r.kind, "status": r.status, "created_at": str(r.created_at),
                               "spec": r.spec_path, "hypotheses": len(r.hypotheses)} for r in runs]))
            return
        t = Table(title=escape(f"runs in {ledger}"))
        for col in ("run", "kind", "date", "status", "spec", "hypotheses", "verdicts"):
            t.add_column(col)
        for r in runs:
            verdicts = ", ".join(f"{h.verdict.outcome}" for h in r.hypotheses if h.verdict)
            t.add_row(str(r.id), r.kind, r.created_at.strftime("%Y-%m-%d %H:%M"), r.status,
                      escape(Path(r.spec_path).name), str(len(r.hypotheses)), verdicts)
        Console().print(t)


@ledger_app.command("show")
def ledger_show(run_id: int = typer.Argument(..., metavar="RUN"), ledger: str = LEDGER_OPT,
                json_out: bool = typer.Option(False, "--json")) -> None:
    """One run: its verdicts, configs and boots."""
    from bisect_harness.record.ledger import Ledger, require_existing

    with Ledger(require_existing(ledger)) as led:
        r = led.run(run_id)
        if json_out:
            print(json.dumps(run_summary(r)))
            return
        console = Console()
        console.print(_verdict_table(r))
        t = Table(title="configs and boots")
        for col in ("config", "label", "status", "boots ok/all", "marks"):
            t.add_column(col)
        for c in r.configs:
            marks = sorted({m for b in c.boots for m in (b.marks or [])})
            t.add_row(str(c.id), escape(c.label), c.status, f"{sum(b.status == 'ok' for b in c.boots)}/{len(c.boots)}",
                      escape(", ".join(marks)))
        console.print(t)


@app.command("journal")
def journal_cmd(run_id: Optional[int] = typer.Argument(None, metavar="RUN", help="Run id (default: the latest)."),
                ledger: str = LEDGER_OPT, journal_dir: Path = JOURNAL_OPT) -> None:
    """Render a run's journal again from the ledger."""
    from bisect_harness.record.ledger import Ledger, require_existing

    with Ledger(require_existing(ledger)) as led:
        r = led.run(run_id) if run_id is not None else led.latest_run()
        _write_journal(led, r, journal_dir, Console(highlight=False), ledger)


CACHE_DIR_OPT = typer.Option(None, "--cache-dir", help="The cache folder (default: BISECT_HARNESS_CACHE or "
                             "the user cache folder).")


def _cache_lines(entries) -> list[str]:
    """One plain line per entry (commit, kind, size, last use, repository): never wrapped or cut."""
    from bisect_harness.plan.cache import human_age, human_size

    lines = [f"  {'commit':<12}  {'kind':<11}  {'size':>10}  {'last used':>10}  repository"]
    for e in entries:
        lines.append(f"  {e.commit[:12]:<12}  {e.kind:<11}  {human_size(e.size_bytes):>10}  "
                     f"{human_age(e.age_s()) + ' ago':>10}  {e.repo}")
    return lines


@cache_app.command("list")
def cache_list(cache_dir: Optional[Path] = CACHE_DIR_OPT,
               json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line.")) -> None:
    """Every worktree and environment in the cache, least recently used first."""
    from bisect_harness.plan.cache import human_size, list_cache
    from bisect_harness.places import default_cache_dir

    root = cache_dir or default_cache_dir()
    entries = list_cache(root)
    total = sum(e.size_bytes for e in entries)
    if json_out:
        print(json.dumps({"cache_dir": str(root), "total_bytes": total, "entries": [e.to_dict() for e in entries]}))
        return
    if not entries:
        typer.echo(f"{root}: no worktrees or environments")
        return
    typer.echo(f"{root}, least recently used first:")
    typer.echo("\n".join(_cache_lines(entries)))
    typer.echo(f"{len(entries)} entries, {human_size(total)} in all (`harness cache prune` reclaims them)")


@cache_app.command("prune")
def cache_prune(
    older_than: Optional[str] = typer.Option(None, "--older-than", help="Remove what was not used for this long "
                                             "(30m, 12h, 7d, 2w)."),
    max_size: Optional[str] = typer.Option(None, "--max-size", help="Then remove the least recently used until "
                                           "the rest fits (500M, 20G)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be removed; remove nothing."),
    cache_dir: Optional[Path] = CACHE_DIR_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Reclaim worktrees and environments by age and/or total size (the user's repository is never touched;
    a removed commit is checked out and built again when next used)."""
    from bisect_harness.plan.cache import human_size, list_cache, parse_age, parse_size, prune, select_for_prune
    from bisect_harness.places import default_cache_dir

    age = parse_age(older_than) if older_than is not None else None
    size = parse_size(max_size) if max_size is not None else None
    root = cache_dir or default_cache_dir()
    entries = list_cache(root)
    chosen = select_for_prune(entries, older_than_s=age, max_bytes=size)
    removed = chosen if dry_run else prune(chosen)
    freed = sum(e.size_bytes for e in removed)
    kept = sum(e.size_bytes for e in entries) - freed
    if json_out:
        print(json.dumps({"cache_dir": str(root), "dry_run": dry_run, "removed": [e.to_dict() for e in removed],
                          "freed_bytes": freed, "kept_bytes": kept, "kept_entries": len(entries) - len(removed)}))
        return
    if removed:
        typer.echo("would remove:" if dry_run else "removed:")
        typer.echo("\n".join(_cache_lines(removed)))
    verb = "would free" if dry_run else "freed"
    typer.echo(f"{len(removed)} of {len(entries)} entries, {verb} {human_size(freed)}; "
               f"{human_size(kept)} kept in {root}")


@app.command()
def doctor(json_out: bool = typer.Option(False, "--json"),
           seconds: float = typer.Option(3.0, "--seconds", help="Budget of the calibration probe.")) -> None:
    """This host's provenance and a calibration probe, now."""
    from bisect_harness.observe import calibration

    report = calibration.doctor_report(seconds_budget=seconds)
    if json_out:
        print(json.dumps(report.to_dict(), default=str))
    else:
        Console().print(calibration.render_doctor_text(report), markup=False)


#: ``--resume`` without a value: the newest interrupted or failed run of the file.
RESUME_NEWEST = "newest"


def _effect(value: str | None) -> float | None:
    """``--min-effect``, read like the spec's ``min_effect`` (0.05 or 5%)."""
    if value is None:
        return None
    try:
        return effect_value(value)
    except ValueError as exc:
        raise UserError(f"--min-effect {value!r}: {exc}") from None


def _resume_id(value: str | None) -> int | None:
    if value is None or value == RESUME_NEWEST:
        return None
    try:
        return int(value)
    except ValueError:
        raise UserError(f"--resume {value!r}: give a run id (`harness ledger list` shows them), or no value for "
                        "the newest interrupted run of the file") from None


def _resume_value(argv: list[str]) -> list[str]:
    """``--resume`` may come without a run id: give it ``newest``."""
    out = []
    for i, a in enumerate(argv):
        out.append(a)
        if a == "--resume":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            if not nxt.isdigit():
                out.append(RESUME_NEWEST)
    return out

@app.callback()
def _root(version: bool = typer.Option(False, "--version", is_eager=True, help="Print the harness's version and exit.",
                                       callback=lambda value: _print_version(value))) -> None:
    """Hypothesis-driven regression bisection for LLM inference engines."""


def _print_version(value: bool) -> None:
    if value:
        from bisect_harness import __version__

        typer.echo(f"bisect-harness {__version__}")
        raise typer.Exit(0)


@app.command()
def compare(
    run_a: int = typer.Argument(..., metavar="RUN_A", help="The earlier run (the baseline)."),
    run_b: int = typer.Argument(..., metavar="RUN_B", help="The later run (judged against RUN_A)."),
    metric: str = typer.Option("tok_s", "--metric", help="Metric to compare."),
    min_effect: str = typer.Option("5%", "--min-effect", help="Smallest relative change that counts (0.05 or 5%)."),
    expect: Optional[str] = typer.Option(None, "--expect", help="increase or decrease: the claim about RUN_B. "
                                         "Default: worse in the metric's own direction."),
    ledger: str = LEDGER_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
) -> None:
    """Each config measured in both runs, RUN_B against RUN_A, by the verdict rule (boot-level
    statistics, host drift and every boot warning)."""
    from bisect_harness.report.compare import compare_runs, render_lines
    from bisect_harness.record.ledger import Ledger, require_existing

    if expect is not None and expect not in ("increase", "decrease"):
        raise UserError(f"--expect must be increase or decrease, got {expect!r}")
    with Ledger(require_existing(ledger)) as led:
        rows = compare_runs(led, run_a, run_b, metric=metric, expect=expect, min_effect=_effect(min_effect))
        text = "\n".join(render_lines(rows, run_a, run_b))
        if json_out:
            _console(True).print(redact_text(text), markup=False)
            print(json.dumps({"run_a": run_a, "run_b": run_b, "configs": [r.to_json() for r in rows]}))
        else:
            typer.echo(redact_text(text))


@ledger_app.command("export")
def ledger_export(
    fmt: str = typer.Option("csv", "--format", help="csv or parquet."),
    out: Path = typer.Option(Path("."), "--out", help="Folder for boots.<format> and samples.<format>."),
    run: Optional[List[int]] = typer.Option(None, "--run", help="Only this run (repeatable); default every run."),
    ledger: str = LEDGER_OPT,
) -> None:
    """Boots and samples as flat tables (one row per boot, one per sample, metrics as columns)."""
    from bisect_harness.record.export import export
    from bisect_harness.record.ledger import Ledger, require_existing

    with Ledger(require_existing(ledger)) as led:
        paths = export(led, out, fmt, run_ids=run or None)
    for name, path in paths.items():
        typer.echo(f"{name}: {path}")


@app.command()
def schema() -> None:
    """The JSON Schema of hypotheses.yaml (for editors: completion and checks as you type)."""
    from bisect_harness.spec.schema import hypotheses_schema

    typer.echo(json.dumps(hypotheses_schema(), indent=2))


def _wait_quiet_value(argv: list[str]) -> list[str]:
    """``--wait-quiet`` may come without a value: give it the default (click options
    take a value or none, not either)."""
    out = []
    for i, a in enumerate(argv):
        out.append(a)
        if a == "--wait-quiet":
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            try:
                float(nxt)
            except ValueError:
                out.append(str(WAIT_QUIET_DEFAULT_S))
    return out


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: the one place errors become exit codes."""
    from bisect_harness.engines.server import install_signal_handlers

    install_signal_handlers()  # SIGTERM/SIGHUP stop every server we started, then exit
    argv = _resume_value(_wait_quiet_value(list(sys.argv[1:] if argv is None else argv)))
    try:
        app(args=argv, prog_name="harness", standalone_mode=True)
    except HarnessError as exc:
        Console(stderr=True, highlight=False).print(redact_text(f"Error: {exc}"), markup=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        Console(stderr=True).print("Interrupted: every server we started was stopped; "
                                   "what was measured is in the ledger.")
        sys.exit(130)
    except OSError as exc:
        if exc.errno not in _MACHINE_ERRNOS:
            raise  # anything else is a bug: its traceback shows
        where = f" ({exc.filename})" if exc.filename else ""
        Console(stderr=True, highlight=False).print(redact_text(
            f"Error: the machine refused a write: {exc.strerror}{where}; free space or make it writable, and run "
            "again (what was measured is in the ledger; `harness run FILE --resume` continues an interrupted "
            "run)"), markup=False)
        sys.exit(InfrastructureError.exit_code)


#: Errors of the machine, not of the harness: a full disk or quota, a read-only file system.
_MACHINE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


if __name__ == "__main__":
    main()
