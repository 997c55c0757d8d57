"""The journal's and ``--json``'s view of what ran in a hypothesis' measured windows.

A verdict says *that* an arm is slower; the profile (``profile_view``) says where its
profiled sample spent its time. Between the two sits what every measured boot
already recorded over the window its samples ran in:

* each mechanism's state per arm, counted over the verdict's boots (``engaged in
  the window`` in 3 of 3 boots against ``set up at start, not seen in the window``
  in 3 of 3), with one boot's own evidence quoted for each state (the counter's
  change per mode: "decode_cuda_graph +0, ..., verify_none +771");
* the engine's declared metrics (``engine.metrics``: counters, log lines, derived
  ratios such as milliseconds per decode cycle) in each arm, as the mean of the
  boot means over the same boots, and their ratio.

Every figure is read from the boots and samples the verdict used; the metrics are
described, not tested (the hypothesis' ``mechanism:`` metrics are tested, in the
layers above). An arm whose boots recorded no mechanism or no declared metric says
nothing of it: nothing is shown that the ledger does not hold.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from bisect_harness.observe import mechanisms
from bisect_harness.model import Metric
from bisect_harness.record.ledger import boot_records

__all__ = ["hypothesis_view", "hypothesis_json", "mechanism_states", "metric_means"]

SIDES = ("baseline", "treatment")


def _used(h) -> dict[str, list]:
    """Each arm's ok boots that the verdict used (in boot order)."""
    v = h.verdict
    ids = {"baseline": set(v.baseline_boot_ids or []) if v else set(),
           "treatment": set(v.treatment_boot_ids or []) if v else set()}
    return {side: sorted((b for b in cfg.boots if b.id in ids[side] and b.status == "ok"), key=lambda b: b.id)
            for side, cfg in (("baseline", h.baseline), ("treatment", h.treatment))}


def mechanism_states(boots: Sequence) -> dict[str, dict[str, Any]]:
    """Per mechanism name: how many of ``boots`` read each state, and the first
    boot's evidence for each state (``{"states": {state: n}, "boots": n,
    "examples": {state: (boot id, evidence)}}``)."""
    out: dict[str, dict[str, Any]] = {}
    for b in boots:
        for r in b.evidence.mechanisms or ():
            if not isinstance(r, Mapping) or not r.get("name"):
                continue
            state = str(r.get("state") or "not_observable")
            state = state if state in mechanisms.STATES else "not_observable"  # an old record's "unknown"
            m = out.setdefault(str(r["name"]), {"states": {}, "boots": 0, "examples": {}})
            m["boots"] += 1
            m["states"][state] = m["states"].get(state, 0) + 1
            m["examples"].setdefault(state, (b.id, str(r.get("evidence") or "")))
    return out


def _recorded(boots: Iterable, declared: Mapping[str, Metric], exclude: str) -> list[str]:
    """The declared metrics (in the order written) that some sample of ``boots`` holds."""
    seen = {k for b in boots for s in b.samples for k in (s.metrics or {})}
    return [name for name in declared if name in seen and name != exclude]


def metric_means(boots: Sequence, metric: str) -> tuple[float | None, int]:
    """The mean of the boot means of ``metric`` over ``boots`` (ledger rows) and how many
    boots had it; a boot's values are ``BootRecord.values``, the one reduction."""
    means = []
    for rec in boot_records(boots):
        vals = rec.values(metric)
        if vals:
            means.append(sum(vals) / len(vals))
    return (sum(means) / len(means) if means else None), len(means)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.3g}"
    return f"{x:.4g}"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _state_text(m: Mapping[str, Any] | None) -> str:
    if not m:
        return "not recorded"
    parts = [f"{mechanisms.WORDS[s]} in {n} of {m['boots']} boot(s)"
             for s, n in sorted(m["states"].items(), key=lambda kv: mechanisms.STATES.index(kv[0]))]
    return "; ".join(parts)


def hypothesis_json(h, declared: Mapping[str, Metric]) -> dict | None:
    """What ran in the verdict's windows, per arm: mechanism states and the means of
    the metrics ``engine.metrics`` declared (``metric_defs.declared_metrics`` of the
    run's file); None when the boots recorded neither."""
    used = _used(h)
    states = {side: mechanism_states(used[side]) for side in SIDES}
    metrics = []
    for name in _recorded([*used["baseline"], *used["treatment"]], declared, h.metric):
        (bm, bn), (tm, tn) = metric_means(used["baseline"], name), metric_means(used["treatment"], name)
        ratio = tm / bm if bm not in (None, 0) and tm is not None else None
        metrics.append({"metric": name, "unit": declared[name].unit or "", "baseline": bm,
                        "baseline_boots": bn, "treatment": tm, "treatment_boots": tn, "ratio": ratio})
    if not any(states.values()) and not metrics:
        return None
    return {"mechanisms": {side: {name: {"states": m["states"], "boots": m["boots"]} for name, m in s.items()}
                           for side, s in states.items()},
            "metrics": metrics}


def hypothesis_view(h, declared: Mapping[str, Metric]) -> dict | None:
    """The journal's lines and table: one line per mechanism (each arm's states over
    the verdict's boots, and the evidence of the first boot in each state), one
    table row per declared metric (each arm's mean of boot means, their ratio)."""
    data = hypothesis_json(h, declared)
    if data is None:
        return None
    used = _used(h)
    states = {side: mechanism_states(used[side]) for side in SIDES}
    lines = []
    for name in dict.fromkeys([*states["baseline"], *states["treatment"]]):
        sides = [f"{side}: {_state_text(states[side].get(name))}" for side in SIDES]
        examples = []
        for side in SIDES:
            for state, (boot, evidence) in (states[side].get(name) or {}).get("examples", {}).items():
                if evidence:
                    examples.append(f"{side} boot {boot} ({mechanisms.WORDS[state]}): {evidence}")
        lines.append(_md(f"{name}: " + "; ".join(sides)) + "".join(f"<br>{_md(e)}" for e in examples))
    rows = [{"metric": m["metric"], "unit": m["unit"], "baseline": _fmt(m["baseline"]),
             "treatment": _fmt(m["treatment"]),
             "ratio": f"{m['ratio']:.3f}x" if m["ratio"] is not None else "-",
             "boots": f"{m['baseline_boots']} / {m['treatment_boots']}"} for m in data["metrics"]]
    return {"lines": lines, "rows": rows}
