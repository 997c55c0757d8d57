"""The journal's first lines: each hypothesis' answer in one line, each search's too.

A reader's first screen holds the answers, the evidence follows. One line per
hypothesis: its verdict, the effect with its interval, the boots per arm, what the
boot checks found, and, where a search followed it, that search's answer (the
culprit commit with its posterior probability, the explanation's set). A search
of its own (``harness bisect``, ``harness explain``) gets a line of its own. Every
figure is read from the ledger's rows; a verdict's sentence leads with its answer
(:func:`verdict_lead`) and leaves the test's mechanics to a line of their own.
"""

from __future__ import annotations

from bisect_harness.model import NOT_MEASURED, shown_outcome
from bisect_harness.report.cells import boots_per_arm, effect, md

__all__ = ["verdict_lead", "explanation_answer", "hypothesis_line"]


def verdict_lead(v) -> str:
    """``Confirmed: 0.60x [0.55, 0.66], 5 boots per arm.``: the verdict, its estimate
    with its interval and the boots it rests on; why there is none where there is not."""
    if v is None:
        return "Not decided: no verdict was recorded (the run stopped early)."
    word = shown_outcome(v)
    if v.test == NOT_MEASURED:
        return f"Not measured: {v.reason.removeprefix('not measured: ')}."
    return (f"{word[0].upper()}{word[1:]}: {effect(v.ratio, v.ci_low, v.ci_high)}, "
            f"{boots_per_arm(v.baseline_boot_ids or [], v.treatment_boot_ids or [])}.")


def explanation_answer(rec: dict) -> str:
    """An explain search's answer in one line: the set shown to matter and its effect,
    or why there is none."""
    slow = rec.get("slowdown") or {}
    if slow.get("outcome") != "confirmed":
        return (f"the slow arm was not shown slower by {rec.get('min_effect', 0):.0%} ({slow.get('outcome')}): "
                "nothing to explain")
    members = rec.get("members") or []
    if not members:
        text = "no difference shown to matter on its own"
    else:
        e = rec.get("effect") or {}
        ci = e.get("ci") or (None, None)
        text = (" + ".join(f"`{m}`" for m in members)
                + (" together" if len(members) > 1 else "")
                + f" ({effect(e.get('ratio'), ci[0], ci[1])} of the fast arm)")
        undecided = rec.get("undecided") or []
        text += f", {len(undecided)} more undecided" if undecided else ", the minimal set"
    return text + f"; stopped `{rec.get('stopped')}` after {rec.get('boots')} boots"


def hypothesis_line(h, searches: list[str]) -> str:
    """One hypothesis of the page (``journal.HypothesisSection``): ``faster`` (tok_s, increase
    >= 20%): **confirmed**, 1.50x [1.34, 1.68], 3 boots per arm; checks: ... and each
    ``searches`` answer after it."""
    v = h.verdict
    text = (f"`{h.id}` ({h.metric}, {h.claim}): **{v.outcome}**, "
            + (v.effect + ", " if v.effect != "no estimate" else "")
            + f"{v.boots_text}; checks: {v.checks}")
    return md(text + "".join(f"; {s}" for s in searches))
