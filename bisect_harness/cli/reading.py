"""The commands that read the ledger: ``journal``, ``compare`` and ``ledger list``,
``show`` and ``export``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape  # every user string shown through Rich markup goes through it
from rich.table import Table

from bisect_harness.cli.outputs import FORMAT_OPT, REPORT_URL_OPT, emit, publish_markdown, shown_format
from bisect_harness.cli.common import JOURNAL_OPT, LEDGER_OPT, _console, _effect, _write_journal
from bisect_harness.cli.summary import _verdict_table, run_summary
from bisect_harness.errors import UserError
from bisect_harness.secrets import redact_text

__all__ = ["compare", "journal_cmd", "ledger_export", "ledger_list", "ledger_show"]


def ledger_list(ledger: str = LEDGER_OPT, json_out: bool = typer.Option(False, "--json")) -> None:
    """The runs in the ledger, newest first."""
    from bisect_harness.record.ledger import Ledger, require_existing

    with Ledger(require_existing(ledger)) as led:
        runs = led.runs()
        if json_out:
            emit("ledger-list", {"runs": [{"run_id": r.id, "kind": r.kind, "status": r.status,
                                           "created_at": str(r.created_at), "spec": r.spec_path,
                                           "hypotheses": len(r.hypotheses)} for r in runs]})
            return
        t = Table(title=escape(f"runs in {led.shown}"))  # the URL's password never printed
        for col in ("run", "kind", "date", "status", "spec", "hypotheses", "verdicts"):
            t.add_column(col)
        for r in runs:
            verdicts = ", ".join(f"{h.verdict.outcome}" for h in r.hypotheses if h.verdict)
            t.add_row(str(r.id), r.kind, r.created_at.strftime("%Y-%m-%d %H:%M"), r.status,
                      escape(Path(r.spec_path).name), str(len(r.hypotheses)), verdicts)
        _console(False).print(t)


def ledger_show(run_id: int = typer.Argument(..., metavar="RUN"), ledger: str = LEDGER_OPT,
                json_out: bool = typer.Option(False, "--json")) -> None:
    """One run: its verdicts, configs and boots."""
    from bisect_harness.record.ledger import Ledger, require_existing

    with Ledger(require_existing(ledger)) as led:
        r = led.run(run_id)
        if json_out:
            emit("run", run_summary(r))
            return
        console = _console(False)
        console.print(_verdict_table(r))
        t = Table(title="configs and boots")
        for col in ("config", "label", "status", "boots ok/all", "marks"):
            t.add_column(col)
        for c in r.configs:
            marks = sorted({m for b in c.boots for m in (b.marks or [])})
            t.add_row(str(c.id), escape(c.label), c.status, f"{sum(b.status == 'ok' for b in c.boots)}/{len(c.boots)}",
                      escape(", ".join(marks)))
        console.print(t)


def journal_cmd(run_id: Optional[int] = typer.Argument(None, metavar="RUN", help="Run id (default: the latest)."),
                ledger: str = LEDGER_OPT, journal_dir: Path = JOURNAL_OPT) -> None:
    """Render a run's journal again from the ledger."""
    from bisect_harness.record.ledger import Ledger, require_existing

    with Ledger(require_existing(ledger)) as led:
        r = led.run(run_id) if run_id is not None else led.latest_run()
        _write_journal(led, r, journal_dir, _console(False), ledger)

def compare(
    run_a: int = typer.Argument(..., metavar="RUN_A", help="The earlier run (the baseline)."),
    run_b: int = typer.Argument(..., metavar="RUN_B", help="The later run (judged against RUN_A)."),
    metric: str = typer.Option("tok_s", "--metric", help="Metric to compare."),
    min_effect: str = typer.Option("5%", "--min-effect", help="Smallest relative change that counts (0.05 or 5%)."),
    expect: Optional[str] = typer.Option(None, "--expect", help="increase or decrease: the claim about RUN_B. "
                                         "Default: worse in the metric's own direction."),
    ledger: str = LEDGER_OPT,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object as the last line."),
    form: str = FORMAT_OPT,
    report_url: Optional[str] = REPORT_URL_OPT,
) -> None:
    """Each config measured in both runs, RUN_B against RUN_A, by the verdict rule (boot-level
    statistics, host drift and every boot warning)."""
    from bisect_harness.report.compare import compare_runs, render_lines
    from bisect_harness.record.ledger import Ledger, require_existing

    form = shown_format(form)
    if expect is not None and expect not in ("increase", "decrease"):
        raise UserError(f"--expect must be increase or decrease, got {expect!r}")
    with Ledger(require_existing(ledger)) as led:
        rows = compare_runs(led, run_a, run_b, metric=metric, expect=expect, min_effect=_effect(min_effect))
        if form == "github":
            from bisect_harness.report.github import compare_markdown
            from bisect_harness.report.site_links import site_at

            publish_markdown(redact_text(compare_markdown(rows, run_a, run_b, site_at(report_url))),
                             json_mode=json_out)
            if json_out:
                emit("compare", {"run_a": run_a, "run_b": run_b, "configs": [r.to_json() for r in rows]})
            return
        text = "\n".join(render_lines(rows, run_a, run_b))
        if json_out:
            _console(True).print(redact_text(text), markup=False)
            emit("compare", {"run_a": run_a, "run_b": run_b, "configs": [r.to_json() for r in rows]})
        else:
            typer.echo(redact_text(text))


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
