"""Many hypotheses in one run: each gets its share of alpha (Bonferroni).

Multiplicity
------------
Many hypotheses in one run: give each ``alpha/m`` (:func:`adjust_alpha`,
Bonferroni). It is valid under any dependence (a shared baseline) and composes
with the sequential boundaries without further argument: each hypothesis' error is
at most ``alpha/m`` over all of its looks, so the family's is at most ``alpha``.
The family is every hypothesis of the hypotheses file (after matrix expansion),
whatever ``--only`` selected to run now: selecting after seeing results would
otherwise shrink ``m``; the executor stores ``m`` with each verdict
(``verdicts.stats.family_size``). Holm's step-down is not offered: with sequential looks it is only valid when
rejected hypotheses' alpha is recycled into recomputed boundaries (Maurer & Bretz,
Stat. Biopharm. Res. 2013), which needs the whole family at every look.
"""

from __future__ import annotations

__all__ = ["adjust_alpha"]


def adjust_alpha(alpha: float, m: int, method: str = "bonferroni") -> float:
    """Per-hypothesis alpha for a family of ``m`` hypotheses (Bonferroni: ``alpha/m``).

    Pass the result as ``evaluate(..., alpha=...)`` for every hypothesis of the run,
    including A/A checks. Valid under any dependence and over all sequential looks.
    Only ``"bonferroni"`` is offered; see the module docstring for why not Holm.
    """
    if not (0.0 < alpha < 0.5):
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if int(m) != m or m < 1:
        raise ValueError(f"m (the number of hypotheses) must be an integer >= 1, got {m!r}")
    if method != "bonferroni":
        raise ValueError(
            f"adjust_alpha: method {method!r} is not supported; use 'bonferroni' (Holm's "
            f"step-down is not valid across sequential looks without recomputed boundaries)")
    return alpha / m
