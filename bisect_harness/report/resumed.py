"""The journal's sentences about a resumed run (``harness run FILE --resume``).

Each resume appends a record to ``runs.host["resumed"]`` (an
``evidence.ResumeRecord``, written by ``run.resume``): when it happened, what the run had been, and which
recorded boots counted, which ran on another host and which were cut short.
The sentences here are made from those records and a verdict's boot ids only.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from bisect_harness.evidence import ResumeRecord, RunHost
from bisect_harness.record.ledger import Run

__all__ = ["RESUMED_KEY", "resumes", "run_line", "journal_lines"]

#: ``runs.host`` key of the list of resume records.
RESUMED_KEY = RunHost.KEYS["resumed"]


def resumes(run: Run) -> tuple[ResumeRecord, ...]:
    """The run's resumes, oldest first (none for a run never resumed)."""
    return RunHost.from_json(run.host).resumed


def run_line(rec: ResumeRecord) -> str:
    """The journal's line for one resume of the run."""
    why = f" ({rec.previous_error})" if rec.previous_error else ""
    parts = [f"{_boots(len(rec.counted_ok_boot_ids), 'ok boot')} from before counted"]
    other = rec.other_host_ok_boot_ids
    if other:
        parts.append(f"{_boots(len(other), 'ok boot')} not counted (they ran on another host; this host's "
                     f"fingerprint is {str(rec.host_fingerprint)[:12]})")
    cut = rec.cut_short_boot_ids
    if cut:
        parts.append(f"{_boots(len(cut), 'boot')} cut short by the interruption ({', '.join(map(str, cut))}), "
                     "samples kept in the ledger, feeding no verdict")
    return f"at {rec.at.replace('T', ' ')} UTC, after the run was {rec.previous_status}{why}: " + "; ".join(parts)


def _boots(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def journal_lines(run: Run, baseline_ids: Sequence[int], treatment_ids: Sequence[int],
                  config_boot_ids: Iterable[int]) -> list[str]:
    """Per resume, which of a verdict's boots came from before it, and which boots of
    the hypothesis' configs were left out (another host, cut short)."""
    lines = []
    mine = set(config_boot_ids)
    for rec in resumes(run):
        before = set(rec.counted_ok_boot_ids)
        b = sum(1 for i in baseline_ids if i in before)
        t = sum(1 for i in treatment_ids if i in before)
        n = len(baseline_ids) + len(treatment_ids)
        at = rec.at.replace("T", " ")
        text = (f"{b + t} of {n} boots this verdict used came from before the resume at {at} UTC "
                f"(baseline {b} of {len(baseline_ids)}, treatment {t} of {len(treatment_ids)})")
        other = [i for i in rec.other_host_ok_boot_ids if i in mine]
        if other:
            text += (f"; {_boots(len(other), 'ok boot')} from before ({', '.join(map(str, other))}) not counted: "
                     "they ran on a host with another fingerprint")
        cut = [i for i in rec.cut_short_boot_ids if i in mine]
        if cut:
            text += (f"; {_boots(len(cut), 'boot')} ({', '.join(map(str, cut))}) cut short by the interruption: "
                     "samples kept in the ledger, feeding no verdict")
        lines.append(text)
    return lines
