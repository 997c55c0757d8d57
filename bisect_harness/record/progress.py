"""The overall progress bar's budget: how many boots a plan may take at most."""

from __future__ import annotations

__all__ = ["boot_budget"]


def boot_budget(plan) -> int | None:
    """Every config booted up to ``defaults.max_boots_per_arm`` times (configs shared by
    hypotheses are booted once per round for all of them), plus an A/A check's boots.
    None when the plan does not say (the bar then shows boots done without a total)."""
    try:
        per_config = int(plan.spec.defaults.max_boots_per_arm)
        n = len(plan.configs) * per_config
        if plan.spec.defaults.aa_check:
            n += len({h.baseline.key for h in plan.hypotheses}) * per_config
        return n
    except (AttributeError, TypeError, ValueError):
        return None
