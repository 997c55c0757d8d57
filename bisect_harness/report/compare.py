"""Two runs side by side (``harness compare RUN_A RUN_B``), like ``pyperf compare_to``.

Each config of run B is matched to run A's config of the same key (the same
commit, env, flags and engine), else of the same label; the boots of the two are
then judged by the verdict rule itself (``decide.verdict.judge``: the same
boot-level statistics, the same warnings, host drift included), run A as the
baseline and run B as the treatment, with alpha divided over the configs
compared. The claim tested is "run B is worse by at least ``min_effect``" in the
metric's own direction, unless ``expect`` says otherwise. The boots go to the
verdict rule as frozen records (``record.ledger.boot_records``). The one warning
not given here is an attached server's (the executor reads it from the planned
config, which the ledger does not hold); every boot mark, contention, calibration
and host-drift warning is given.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from bisect_harness.boot import BootRecord, BootValues
from bisect_harness.errors import HarnessError, UserError
from bisect_harness.model import Expect
from bisect_harness.record.ledger import Config, Ledger, Run, boot_records

if TYPE_CHECKING:
    from bisect_harness.decide.verdict import Verdict

__all__ = ["ConfigComparison", "compare_runs", "matched_configs", "render_lines"]


@dataclasses.dataclass(frozen=True)
class ConfigComparison:
    """One config measured in both runs, and the verdict on B against A."""

    label: str
    key: str
    matched_by: str            # key | label
    metric: str
    expect: str
    min_effect: float
    boots: tuple[int, int]     # good boots with values: run A, run B
    means: tuple[float | None, float | None]
    verdict: Verdict           # decide.verdict.judge's
    drift: tuple[str, ...]     # how the two runs' hosts differed

    def to_json(self) -> dict:
        v = self.verdict
        return {"label": self.label, "key": self.key, "matched_by": self.matched_by, "metric": self.metric,
                "claim": f"run B {self.expect}s {self.metric} by at least {self.min_effect:.1%}",
                "verdict": v.outcome.value, "boots": {"a": self.boots[0], "b": self.boots[1]},
                "means": {"a": self.means[0], "b": self.means[1]}, "ratio": v.ratio,
                "ci": list(v.ci) if v.ci else None, "p_value": v.p_value, "test": v.test, "alpha": v.alpha,
                "reason": v.reason, "warnings": list(v.warnings), "host_drift": list(self.drift)}


def matched_configs(a: Run, b: Run) -> list[tuple[Config, Config, str]]:
    """Pairs (A's config, B's config, how matched), in B's order; by key first, then by label."""
    by_key = {c.key: c for c in a.configs}
    by_label = {c.label: c for c in a.configs}
    out = []
    for cb in b.configs:
        if cb.key in by_key:
            out.append((by_key[cb.key], cb, "key"))
        elif cb.label in by_label:
            out.append((by_label[cb.label], cb, "label"))
    return out


def _boot_mean(boots: Sequence[BootRecord], metric: str) -> tuple[int, float | None]:
    means = BootValues.of(boots, metric).means()
    return len(means), (sum(means) / len(means) if means else None)


def compare_runs(ledger: Ledger, run_a: int, run_b: int, *, metric: str = "tok_s", expect: str | None = None,
                 min_effect: float = 0.05) -> list[ConfigComparison]:
    """Every config the two runs share, judged B against A. Raises ``UserError`` when
    they share none or the metric is unknown to run B's spec."""
    from bisect_harness.decide.verdict import Question, Side, judge
    from bisect_harness.observe.drift import host_drift
    from bisect_harness.plan.build import verdict_rules
    from bisect_harness.spec import parse_spec

    a, b = ledger.run(run_a), ledger.run(run_b)
    pairs = matched_configs(a, b)
    if not pairs:
        raise UserError(f"runs {run_a} and {run_b} share no config (no key or label in common); compare runs of "
                        "the same hypotheses file (`harness ledger list` shows each run's spec)")
    try:
        spec = parse_spec(b.spec_text, Path(b.spec_path))
    except HarnessError as exc:
        raise UserError(f"run {run_b}'s hypotheses file, as stored in the ledger, no longer loads: {exc}") from None
    metrics = spec.metrics()
    if metric not in metrics:
        raise UserError(f"--metric {metric!r} is not a metric of run {run_b}; known: {', '.join(sorted(metrics))}")
    if not 0 < min_effect < 1:
        raise UserError(f"--min-effect must lie between 0 and 1 (0.05 is 5%), got {min_effect}")
    direction = Expect(expect) if expect else metrics[metric].worse
    rules = verdict_rules(dataclasses.replace(spec, family_size=len(pairs)))  # alpha divided over the configs
    out = []
    for ca, cb, how in pairs:
        side_a = Side("run A", boot_records(ca.boots))
        side_b = Side("run B", boot_records(cb.boots))
        verdict = judge(rules, side_a, side_b, Question(metric, direction, min_effect), force_final=True)
        na, ma = _boot_mean(side_a.good_boots, metric)
        nb, mb = _boot_mean(side_b.good_boots, metric)
        drift = tuple(d.message for d in host_drift(side_a.good_boots, side_b.good_boots))
        out.append(ConfigComparison(label=cb.label, key=cb.key, matched_by=how, metric=metric,
                                    expect=direction.value, min_effect=min_effect, boots=(na, nb), means=(ma, mb), verdict=verdict,
                                    drift=drift))
    return out


def render_lines(rows: Sequence[ConfigComparison], run_a: int, run_b: int) -> list[str]:
    """Plain lines (never wrapped): one per config, then its warnings."""
    lines = [f"run {run_b} against run {run_a} (B / A; alpha divided over {len(rows)} config(s)):"]
    for r in rows:
        v = r.verdict
        ma = f"{r.means[0]:.2f}" if r.means[0] is not None else "n/a"
        mb = f"{r.means[1]:.2f}" if r.means[1] is not None else "n/a"
        ratio = f"{v.ratio:.4f}x" if v.ratio is not None else "n/a"
        ci = f" [{v.ci[0]:.4f}, {v.ci[1]:.4f}]" if v.ci else ""
        p = f", p={v.p_value:.3g}" if v.p_value is not None else ""
        lines.append(f"  {r.label}: {r.metric} A {ma} -> B {mb}: {ratio}{ci}{p}, boots {r.boots[0]}/{r.boots[1]}: "
                     f"{v.outcome.value} (claim: B {r.expect}s it by at least {r.min_effect:.1%})")
        lines.append(f"    {v.reason}")
        for w in v.warnings:
            lines.append(f"    warning: {w}")
    return lines
