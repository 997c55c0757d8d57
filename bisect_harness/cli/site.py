"""``harness report``: the ledger as a folder of static HTML pages (``report.html``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Tuple

import typer

from bisect_harness.cli.common import LEDGER_OPT
__all__ = ["report"]


def report(
    ledger: str = LEDGER_OPT,
    out: Path = typer.Option(Path("report"), "--out", help="Folder for the pages (made if missing)."),
    compare: Optional[Tuple[int, int]] = typer.Option(
        None, "--compare", metavar="RUN_A RUN_B", help="Also write the page of RUN_B against RUN_A."),
) -> None:
    """Write the ledger as static HTML: an index of runs, a page per run, per nightly series
    and per comparison (each run against the run before it of the same file). The pages
    open offline: plots are inline SVG, sorting a few lines of inline script."""
    from bisect_harness.record.ledger import Ledger, require_existing
    from bisect_harness.report.html import INDEX_PAGE, write_site

    pairs = [tuple(compare)] if compare else []
    started = time.monotonic()
    with Ledger(require_existing(ledger)) as led:
        site = write_site(led, out, pairs=pairs)
    largest, size = site.largest()
    typer.echo(f"report: {out / INDEX_PAGE} ({len(site.pages)} pages in {time.monotonic() - started:.1f} s; "
               f"largest {largest}, {size / 1024:.0f} KiB)")
