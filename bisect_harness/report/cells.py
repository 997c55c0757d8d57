"""How the journal writes a figure: numbers, table cells, an effect with its interval.

Shared by the journal and its views, so a ratio, an interval or a count reads the
same in the summary at the top and in the evidence below it. A comparison's two
sides are printed with the digits that tell them apart (``model.shown_apart``).
"""

from __future__ import annotations

from typing import Sequence

from bisect_harness.model import shown_apart

__all__ = ["fmt", "md", "effect", "boots_per_arm", "apart", "probability"]


def fmt(x, digits: int = 3) -> str:
    """A number with ``digits`` decimals (very small or large ones in e-notation); "n/a" for None."""
    if x is None:
        return "n/a"
    if isinstance(x, float):
        if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
            return f"{x:.2e}"
        return f"{x:.{digits}f}"
    return str(x)


def md(text) -> str:
    """``text`` safe inside a markdown table cell: one line, pipes escaped."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def effect(ratio: float | None, low: float | None = None, high: float | None = None) -> str:
    """``0.60x [0.55, 0.66]``: a ratio and its interval with two decimals, more where two
    of the three would otherwise print alike (a bound that is not the estimate never
    reads as it). ``no estimate`` without a ratio; ``(no interval yet)`` without bounds."""
    if ratio is None:
        return "no estimate"
    values = [v for v in (low, ratio, high) if v is not None]
    digits = 2
    while digits < 6 and any(f"{a:.{digits}f}" == f"{b:.{digits}f}" and a != b
                             for i, a in enumerate(values) for b in values[i + 1:]):
        digits += 1
    text = f"{ratio:.{digits}f}x"
    if low is None or high is None:
        return text + " (no interval yet)"
    return f"{text} [{low:.{digits}f}, {high:.{digits}f}]"


def boots_per_arm(baseline: Sequence | int, treatment: Sequence | int) -> str:
    """``5 boots per arm``, or ``4 baseline / 5 treatment boots`` where the arms differ."""
    b = baseline if isinstance(baseline, int) else len(baseline)
    t = treatment if isinstance(treatment, int) else len(treatment)
    if b == t:
        return f"{b} boot{'' if b == 1 else 's'} per arm"
    return f"{b} baseline / {t} treatment boots"


def apart(a: float | None, b: float | None) -> tuple[str, str]:
    """Two figures compared in one sentence or row (a p-value and its level), each with
    the digits that tell them apart; "n/a" for a missing one."""
    if a is None or b is None:
        return fmt(a, 4), fmt(b, 4)
    return shown_apart(a, b)


def probability(p: float | None) -> str:
    """A posterior probability with three decimals, more where three would round it to 1
    (``0.99998``, never ``1.000`` for what is not certain), and ``> 0.99999999`` past eight,
    also for a posterior that came out as 1.0: under a noise model it is the float's
    rounding, never certainty."""
    if p is None:
        return "n/a"
    for digits in range(3, 9):
        text = f"{p:.{digits}f}"
        if float(text) < 1:
            return text
    return "> 0.99999999"
