"""The journal folder's index page: every run of the ledger with its verdicts.

Rewritten after each run (and by ``harness journal``) from the ledger alone, so
it lists what the ledger holds, newest first, each row linking to its journal
when that journal is in the folder.
"""

from __future__ import annotations

from pathlib import Path

from bisect_harness.model import shown_outcome
from bisect_harness.secrets import redact_text
from bisect_harness.report.reproduce import experiment_name

__all__ = ["INDEX_NAME", "journal_stem", "render_index", "write_index"]

INDEX_NAME = "index.md"


def journal_stem(run) -> str:
    """``<date>-<experiment>-run<id>``: the journal's file name without ``.md`` (plots add a suffix)."""
    return f"{run.created_at.strftime('%Y-%m-%d')}-{experiment_name(run.spec_path)}-run{run.id}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_index(ledger, journal_dir: Path) -> str:
    runs = ledger.runs(limit=100_000)
    lines = ["# Experiments", "",
             f"{len(runs)} run(s) in the ledger, newest first; each links to its journal where it is in this folder.",
             "", "| run | date (UTC) | experiment | kind | status | verdicts | journal |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        verdicts = "; ".join(f"`{h.hid}` {shown_outcome(h.verdict)}"
                             for h in r.hypotheses)
        if r.kind == "nightly" and r.summary:
            verdicts = verdicts or f"nightly {r.summary.get('status', 'not recorded')}"
        name = journal_stem(r) + ".md"
        link = f"[{name}]({name})" if (journal_dir / name).exists() else "not rendered here"
        lines.append(f"| {r.id} | {r.created_at.strftime('%Y-%m-%d %H:%M')} | {_cell(experiment_name(r.spec_path))} "
                     f"| {r.kind} | {r.status} | {_cell(verdicts) or '-'} | {link} |")
    return "\n".join(lines) + "\n"


def write_index(ledger, journal_dir: Path) -> Path:
    journal_dir = Path(journal_dir)
    journal_dir.mkdir(parents=True, exist_ok=True)
    path = journal_dir / INDEX_NAME
    path.write_text(redact_text(render_index(ledger, journal_dir)))  # secrets never written (secrets.py)
    return path
