"""What the ``harness`` commands share: their common options, the console, the
reading of ``--min-effect``, the run's backend, and the journal written after a run.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import typer
from rich.console import Console

from bisect_harness.backends import BACKENDS
from bisect_harness.errors import HarnessError, InfrastructureError, UserError
from bisect_harness.secrets import redact_text
from bisect_harness.spec import effect_value

__all__ = ["BACKEND_OPT", "JOURNAL_OPT", "LEDGER_OPT", "RESUME_NEWEST", "SLOTS_OPT", "WAIT_QUIET_OPT"]

LEDGER_OPT = typer.Option("sqlite:///results.db", "--ledger", help="SQLAlchemy URL of the ledger.")
JOURNAL_OPT = typer.Option(Path("experiments"), "--journal-dir", help="Folder for journals, logs and plots.")
BACKEND_OPT = typer.Option(None, "--backend", help="Where boots run: " + BACKENDS.in_words(
    lambda k: f"{k.name} ({k.summary})") + ". Default: the file's backend.kind, else local.")
SLOTS_OPT = typer.Option(None, "--slots", help="Boots at once: local, disjoint CPU cores and GPUs per boot; "
                         "slurm, jobs in flight. Default: the file's backend.slots, else 1.")
WAIT_QUIET_OPT = typer.Option(None, "--wait-quiet", metavar="[SECONDS]",
                              help="Before the first boot, wait up to SECONDS (600 without a value) for a quiet host.")


#: The width the tables are laid out in when the output is not a terminal (a CI log, a
#: file, a pipe): wide enough that rich never cuts a verdict, an interval or a check to
#: fit 80 columns; a line is as long as its table needs and no longer.
OFF_TERMINAL_WIDTH = 400


def _console(json_mode: bool) -> Console:
    """The console a command prints to (stderr under ``--json``). Off a terminal it is
    :data:`OFF_TERMINAL_WIDTH` wide, unless ``COLUMNS`` says otherwise: rich would lay
    tables out in 80 columns there and cut their words with an ellipsis."""
    console = Console(stderr=json_mode, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=json_mode, highlight=False, width=OFF_TERMINAL_WIDTH)
    return console


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


@contextlib.contextmanager
def _backend(spec, kind: str | None, slots: int | None, journal_dir: Path):
    """The run's backend (``--backend``/``--slots`` over the file's ``backend:``), closed
    on the way out: a Slurm backend cancels jobs still in flight."""
    from bisect_harness.backends import make_backend

    backend = make_backend(spec, kind=kind, slots=slots, log_dir=journal_dir / "logs")
    try:
        yield backend
    finally:
        backend.close()
