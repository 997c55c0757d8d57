"""The ``harness`` command: thin commands over the library, one error boundary.

Each command loads, calls the library, renders. Only ``main`` turns errors into
exit codes: 0 done, 1 an unexpected error (a bug: traceback shown), 2 bad input
(the message names the key, commit or flag), 3 the machine or a tool failed,
4 a nightly alert, 5 a bisection ``undetermined`` (a busy host), 6 a bisection that
named no culprit (``measuring.EXIT_NO_CULPRIT``), 130 interrupted. Machine-readable output (``--json``) is the last line of stdout;
progress and tables go to stderr when ``--json`` is given.

Here: the typer app, its command groups and the one error boundary (``main``). The
commands live by what they do: ``cli.measuring`` (run, explain, bisect, nightly),
``cli.reading`` (journal, compare, ledger), ``cli.upkeep`` (demo, cache, doctor,
schema); ``cli.common`` holds what they share and ``cli.summary`` how a run's
verdicts read.
"""

from __future__ import annotations

import errno
import sys

import typer
from rich.console import Console

from bisect_harness.cli import measuring, reading, upkeep
from bisect_harness.cli.common import RESUME_NEWEST
from bisect_harness.cli import site  # harness report
from bisect_harness.errors import HarnessError, InfrastructureError
from bisect_harness.secrets import redact_text

__all__ = ["app", "main"]

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Hypothesis-driven regression bisection for LLM inference engines.")
demo_app = typer.Typer(no_args_is_help=True, help="The built-in demo engine (no GPU needed).")
ledger_app = typer.Typer(no_args_is_help=True, help="Read the ledger (results.db).")
app.add_typer(demo_app, name="demo")
app.add_typer(ledger_app, name="ledger")
cache_app = typer.Typer(no_args_is_help=True, help="The cache's worktrees and per-commit environments.")
app.add_typer(cache_app, name="cache")

# The commands, in the order `harness --help` lists them (the groups come after).
app.command()(measuring.run)
app.command()(measuring.explain)
app.command()(measuring.bisect)
app.command()(measuring.nightly)
app.command("journal")(reading.journal_cmd)
app.command()(upkeep.doctor)
app.command()(reading.compare)
app.command()(upkeep.schema)
app.command()(site.report)
demo_app.command("init")(upkeep.demo_init)
ledger_app.command("list")(reading.ledger_list)
ledger_app.command("show")(reading.ledger_show)
ledger_app.command("export")(reading.ledger_export)
cache_app.command("list")(upkeep.cache_list)
cache_app.command("prune")(upkeep.cache_prune)

#: ``--wait-quiet`` without a value waits this long at most (see ``_wait_quiet_value``).
WAIT_QUIET_DEFAULT_S = 600.0


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
