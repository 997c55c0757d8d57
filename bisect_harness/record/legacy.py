"""Findings of a verdict or a search written before findings were stored (schema 3 and older).

Until schema version 4 a verdict kept what it found about its boots only as sentences
(``verdicts.warnings``, ``bisections.result["warnings"]``). A row of such a ledger has
no ``findings``; this module is the one reader of those sentences, and it reads only
the shapes the older harness wrote (each named below), so an old ledger's journal
groups and counts its warnings as it did then. A sentence of no known shape is kept
as a note, said as it was. Nothing newer is ever read this way: a row written by
this harness carries its findings.
"""

from __future__ import annotations

from typing import Sequence

from bisect_harness.evidence import Finding, FindingKind

__all__ = ["findings_of_sentences"]

#: The older harness's opening words of each kind that has no boot to name (the marked
#: and busy boots are read below, by their full shape).
_OPENINGS = (
    ("engine version", FindingKind.ENGINE_VERSIONS),
    ("attached server", FindingKind.ATTACHED),
    ("host drift: ", FindingKind.HOST_DRIFT),
    ("device sets confounded", FindingKind.DEVICES_CONFOUNDED),
    ("contention differed", FindingKind.CONTENTION_DIFFERED),
    ("calibration (", FindingKind.CALIBRATION_NOISY),
    ("host busy at the start", FindingKind.PREFLIGHT_BUSY),
)


def _marked(text: str) -> Finding | None:
    """``baseline boot 12: host_busy, usage_mismatch`` (``verdict.side_warnings``)."""
    side, _, rest = text.partition(" boot ")
    number, sep, marks = rest.partition(": ")
    if side not in ("baseline", "treatment") or not sep or not number.isdigit() or not marks:
        return None
    names = marks.split(", ")
    if not all(n and n.replace("_", "").replace("-", "").isalnum() for n in names):
        return None
    return Finding(FindingKind.MARKED_BOOT, text, side=side, boots=(int(number),), figures={"marks": names})


def _busy(text: str) -> Finding | None:
    """``host busy during baseline boot 12: ...`` (a verdict's) or ``host busy during boot
    12 (commit abc, probe): ...`` (a search's), from ``host_state.busy_sentence``."""
    opening = "host busy during "
    if not text.startswith(opening):
        return None
    head, sep, _ = text[len(opening):].partition(": ")
    if not sep:
        return None
    side = None
    if head.startswith(("baseline boot ", "treatment boot ")):
        side, _, head = head.partition(" ")
    if not head.startswith("boot "):
        return None
    number, _, where = head[len("boot "):].partition(" ")
    if not number.isdigit():
        return None
    if side is None and where.startswith("(") and where.endswith(")"):
        side = where[1:-1].split(", ")[0] or None
    return Finding(FindingKind.BUSY_BOOT, text, side=side, boots=(int(number),))


def findings_of_sentences(sentences: Sequence[str] | None) -> tuple[Finding, ...]:
    """The findings an older harness's sentences stand for, in their order."""
    out = []
    for text in sentences or ():
        found = _marked(text) or _busy(text)
        if found is None:
            kind = next((k for opening, k in _OPENINGS if text.startswith(opening)), FindingKind.NOTE)
            found = Finding(kind, text)
        out.append(found)
    return tuple(out)
