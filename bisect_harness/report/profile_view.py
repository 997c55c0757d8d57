"""The journal's and ``--json``'s view of a hypothesis' profiles: where the time goes.

A boot profiled with ``profile: true`` stores in its evidence (``BootEvidence.profile``)::

    evidence.profile = {"state": "taken" | "no_profiler" | "failed", "why": str,
                        "profiler": str, "trace": path | None, "trace_bytes": int,
                        "kept": bool, "tokens": int, "requests": int,
                        "steps": int | None, "seconds": float,
                        "summary": TraceSummary.to_dict() | None}

For each arm of a hypothesis the view takes the last boot of the arm whose
profile was taken (else the last profile record, to say why there is none),
and sets the two side by side: a table of operators and kernels by
milliseconds per generated token in each arm and their difference, largest
difference first, and sentences built only from those figures ("+0.41 ms per
token in aten::mm (baseline 1.20, treatment 1.61)", "graph launches per step:
1.00 vs 0.00"). An arm without a profile says why ("no profile: ..."); a count
a trace cannot give (launches in a trace with no CUDA runtime events, per
step without a step count) is said to be missing, never shown as zero.

A name missing from one arm's top rows is 0 there only when that arm's table
lists every name of its trace; otherwise it may sit below the cut, and the
cell says "<= x" (x: the arm's smallest listed row) with the difference as a
bound.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from bisect_harness.observe.trace_summary import TraceRow, TraceSummary

__all__ = ["ArmProfile", "arm_profile", "difference", "hypothesis_json", "hypothesis_view"]

#: Rows of the side-by-side table; sentences name the largest differences.
TABLE_ROWS = 15
SENTENCES = 3
SIDES = ("baseline", "treatment")
_KIND = {"cpu_op": "op", "user_annotation": "annotation", "cuda_runtime": "CUDA call", "cuda_driver": "CUDA call",
         "kernel": "kernel"}


@dataclass(frozen=True)
class ArmProfile:
    """One arm's profile as the ledger holds it: the boot it came from, its
    state and why, the summary where one was taken. ``record`` is the boot's
    ``BootEvidence.profile`` as stored (a path in ``trace`` is relative to the
    journal's folder unless absolute)."""

    side: str
    boot_id: int | None
    state: str                      # taken | no_profiler | failed | not_taken
    why: str
    summary: TraceSummary | None
    record: dict

    @property
    def usable(self) -> bool:
        return self.state == "taken" and self.summary is not None

    def to_json(self) -> dict:
        r = self.record
        return {"boot": self.boot_id, "state": self.state, "why": self.why, "profiler": r.get("profiler"),
                "trace": r.get("trace") if r.get("kept") else None, "trace_bytes": r.get("trace_bytes"),
                "tokens": r.get("tokens"), "requests": r.get("requests"), "steps": r.get("steps"),
                "seconds": r.get("seconds"), "summary": self.summary.to_dict() if self.summary else None}


def arm_profile(side: str, boots: Iterable[Any]) -> ArmProfile | None:
    """The arm's profile: the last boot whose profile was taken and summed, else the
    last profile record (saying why there is none); None when no boot has one."""
    records = [(b, b.evidence.profile) for b in boots]
    records = [(b, r) for b, r in records if isinstance(r, Mapping)]
    if not records:
        return None
    taken = [(b, r) for b, r in records if r.get("state") == "taken" and r.get("summary")]
    boot, rec = (taken or records)[-1]
    state, why = str(rec.get("state") or "failed"), str(rec.get("why") or "")
    summary = None
    if state == "taken":
        if not rec.get("summary"):
            state, why = "failed", why or "the trace was taken but not summed"
        else:
            try:
                summary = TraceSummary.from_dict(rec["summary"])
            except (ValueError, KeyError, TypeError) as exc:
                state, why = "failed", f"its summary cannot be read: {exc}"
    return ArmProfile(side=side, boot_id=boot.id, state=state, why=why, summary=summary, record=rec)


def _arms(h, run) -> dict[str, ArmProfile | None]:
    v = h.verdict
    used = {"baseline": set(v.baseline_boot_ids or []) if v else set(),
            "treatment": set(v.treatment_boot_ids or []) if v else set()}
    out = {}
    for side, cfg in (("baseline", h.baseline), ("treatment", h.treatment)):
        boots = [b for b in cfg.boots if b.run_id == run.id or b.id in used[side]]
        out[side] = arm_profile(side, boots)
    return out


# --------------------------------------------------------------------------- figures

@dataclass(frozen=True)
class Cell:
    """One arm's ms per token for a name: ``value`` when known (0 where the arm's
    table is complete and does not list it), else ``bound`` (at most)."""

    value: float | None
    bound: float | None = None


@dataclass(frozen=True)
class DiffRow:
    kind: str
    name: str
    baseline: Cell
    treatment: Cell

    @property
    def difference(self) -> float | None:
        if self.baseline.value is not None and self.treatment.value is not None:
            return self.treatment.value - self.baseline.value
        return None

    @property
    def size(self) -> float:
        """How far apart the arms are at least, for sorting."""
        d = self.difference
        if d is not None:
            return abs(d)
        known = self.baseline if self.baseline.value is not None else self.treatment
        other = self.treatment if known is self.baseline else self.baseline
        if known.value is None:
            return 0.0
        return max(0.0, known.value - (other.bound or 0.0))

    def bound_text(self) -> str:
        """The difference where one side is only bounded: treatment - baseline, as a bound."""
        b, t = self.baseline, self.treatment
        if b.value is not None and t.bound is not None:  # t <= bound: difference <= bound - b
            return f"<= {_signed(t.bound - b.value)}"
        if t.value is not None and b.bound is not None:  # b <= bound: difference >= t - bound
            return f">= {_signed(t.value - b.bound)}"
        return "n/a"

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name,
                "baseline_ms_per_token": self.baseline.value, "baseline_at_most": self.baseline.bound,
                "treatment_ms_per_token": self.treatment.value, "treatment_at_most": self.treatment.bound,
                "difference_ms_per_token": self.difference}


def _cell(s: TraceSummary, table: str, rows: dict[tuple[str, str], TraceRow], key: tuple[str, str]) -> Cell:
    row = rows.get(key)
    if row is not None:
        return Cell(s.ms_per_token(row))
    if s.complete(table):
        return Cell(0.0)
    listed = s.ops if table == "ops" else s.kernels
    return Cell(None, bound=min((s.ms_per_token(r) for r in listed), default=0.0))


def difference(base: TraceSummary, treat: TraceSummary) -> list[DiffRow]:
    """Every operator and kernel listed in either arm, largest difference first."""
    out = []
    for table in ("ops", "kernels"):
        b_rows = {(r.cat, r.name): r for r in (base.ops if table == "ops" else base.kernels)}
        t_rows = {(r.cat, r.name): r for r in (treat.ops if table == "ops" else treat.kernels)}
        for key in dict.fromkeys([*b_rows, *t_rows]):
            out.append(DiffRow(kind=_KIND.get(key[0], key[0]), name=key[1], baseline=_cell(base, table, b_rows, key),
                               treatment=_cell(treat, table, t_rows, key)))
    out.sort(key=lambda r: (-r.size, r.name))
    return out


def _num(x: float) -> str:
    """Three significant figures, at least two decimals: 1.20, 0.410, 0.0175."""
    if x == 0 or not math.isfinite(x):
        return f"{x:.2f}"
    decimals = min(6, max(2, 2 - math.floor(math.log10(abs(x)))))
    return f"{x:.{decimals}f}"


def _signed(x: float) -> str:
    return ("+" if x >= 0 else "-") + _num(abs(x))


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _count_lines(b: TraceSummary, t: TraceSummary) -> list[str]:
    """Launches and copies, side by side, where both traces can count them."""
    missing = [side for side, s in (("baseline", b), ("treatment", t)) if not s.has_cuda]
    if missing:
        whose = "neither trace has any" if len(missing) == 2 else f"the {missing[0]}'s trace has no"
        return [f"kernel launches, graph launches and memory copies: not counted: {whose} CUDA activity "
                "(no CUDA runtime call, kernel or copy: a CPU run, or a profiler without CUDA)"]
    out = []
    if b.steps and t.steps:
        out.append(f"graph launches per step: {b.per_step(b.graph_launches):.2f} vs {t.per_step(t.graph_launches):.2f} "
                   f"({b.graph_launches} in {b.steps} steps vs {t.graph_launches} in {t.steps})")
        out.append(f"kernel launches per step: {b.per_step(b.kernel_launches):.1f} vs "
                   f"{t.per_step(t.kernel_launches):.1f}")
    else:
        no_steps = " and ".join(side for side, s in (("baseline", b), ("treatment", t)) if not s.steps)
        out.append(f"graph launches per token: {b.per_token(b.graph_launches):.2f} vs "
                   f"{t.per_token(t.graph_launches):.2f} (per step not known: the {no_steps} "
                   f"profile{'s have' if ' and ' in no_steps else ' has'} no step count)")
    out.append(f"kernel launches per token: {b.per_token(b.kernel_launches):.1f} vs "
               f"{t.per_token(t.kernel_launches):.1f}")
    out.append(f"memory copies per token: {b.per_token(b.copies):.2f} vs {t.per_token(t.copies):.2f} "
               f"({_bytes(b.per_token(b.copy_bytes))} vs {_bytes(t.per_token(t.copy_bytes))} per token; "
               f"copy calls {b.per_token(b.copy_calls):.2f} vs {t.per_token(t.copy_calls):.2f})")
    return out


def _link(rec: dict, base: Path | None) -> str:
    trace = rec.get("trace")
    size = rec.get("trace_bytes")
    if not trace:
        return "no trace file"
    if not rec.get("kept"):
        if rec.get("kept_note"):  # the capture's own words: over the size cap, summed, then removed
            return f"trace not kept: {_md(rec['kept_note'])}"
        return f"trace not kept ({_bytes(size)})" if isinstance(size, (int, float)) else "trace not kept"
    p = Path(trace)
    if base is not None and p.is_absolute():
        p = Path(os.path.relpath(p, base))
    return f"[trace]({p.as_posix()})" + (f" ({_bytes(size)})" if isinstance(size, (int, float)) else "")


def _arm_line(arm: ArmProfile | None, side: str, base: Path | None) -> str:
    if arm is None:
        return f"{side}: no profile: no boot of this arm was profiled"
    if not arm.usable:
        word = {"no_profiler": "no profiler endpoint", "failed": "failed"}.get(arm.state, arm.state)
        return f"{side} (boot {arm.boot_id}): no profile: {_md(arm.why or word)}"
    s, rec = arm.summary, arm.record
    parts = [f"{side} (boot {arm.boot_id}, {_md(rec.get('profiler') or 'profiler')}): {s.tokens} tokens"]
    if rec.get("requests"):
        parts[0] += f" from {rec['requests']} request(s)"
    if s.steps:
        parts[0] += f" in {s.steps} steps"
    if isinstance(rec.get("seconds"), (int, float)):
        parts[0] += f", {rec['seconds']:.2f} s profiled"
    parts.append(f"{s.events} trace events")
    parts.append(f"host self time {_num(s.per_token(s.op_ms))} ms per token")
    if s.has_cuda:
        parts.append(f"kernel time {_num(s.per_token(s.kernel_ms))} ms per token")
    if s.truncated:
        parts.append(f"**truncated**: {_md(s.truncated_why)} (the figures cover what was read)")
    if s.skipped:
        parts.append(f"{s.skipped} event(s) skipped: {_md(s.skipped_why)}")
    parts.append(_link(rec, base))
    return "; ".join(parts)


def hypothesis_view(h, run, base: Path | None = None) -> dict | None:
    """The journal's profile section of hypothesis ``h``, or None when no boot of
    either arm has a profile record. ``base``: the journal's folder, for links."""
    arms = _arms(h, run)
    if all(a is None for a in arms.values()):
        return None
    view: dict[str, Any] = {"arms": [_arm_line(arms[s], s, base) for s in SIDES], "lines": [], "rows": []}
    b, t = arms["baseline"], arms["treatment"]
    if not (b and b.usable and t and t.usable):
        view["lines"].append("no difference to show: "
                             + " and ".join(s for s in SIDES if not (arms[s] and arms[s].usable))
                             + " without a profile")
        return view
    bs, tsum = b.summary, t.summary
    rows = difference(bs, tsum)
    for r in [r for r in rows if r.difference is not None][:SENTENCES]:
        view["lines"].append(f"{_signed(r.difference)} ms per token in {_md(r.name)} ({r.kind}; baseline "
                             f"{_num(r.baseline.value)}, treatment {_num(r.treatment.value)})")
    view["lines"].append(f"host self time per token (operators, annotations, CUDA calls): {_num(bs.per_token(bs.op_ms))} vs "
                         f"{_num(tsum.per_token(tsum.op_ms))} ms ({_signed(tsum.per_token(tsum.op_ms) - bs.per_token(bs.op_ms))})")
    if bs.has_cuda and tsum.has_cuda:
        view["lines"].append(f"kernel time per token: {_num(bs.per_token(bs.kernel_ms))} vs "
                             f"{_num(tsum.per_token(tsum.kernel_ms))} ms")
    view["lines"].extend(_count_lines(bs, tsum))
    for r in rows[:TABLE_ROWS]:
        view["rows"].append({
            "kind": r.kind, "name": _md(r.name),
            "baseline": _num(r.baseline.value) if r.baseline.value is not None else f"<= {_num(r.baseline.bound)}",
            "treatment": _num(r.treatment.value) if r.treatment.value is not None else f"<= {_num(r.treatment.bound)}",
            "difference": _signed(r.difference) if r.difference is not None else r.bound_text()})
    view["more"] = max(0, len(rows) - TABLE_ROWS)
    return view


def hypothesis_json(h, run) -> dict | None:
    """``--json``'s ``profile`` of hypothesis ``h``: each arm (state, why, boot,
    summary) and the difference rows; None when no boot of either arm has a profile."""
    arms = _arms(h, run)
    if all(a is None for a in arms.values()):
        return None
    out: dict[str, Any] = {side: (arms[side].to_json() if arms[side] else
                                  {"state": "not_taken", "why": "no boot of this arm was profiled", "summary": None})
                           for side in SIDES}
    b, t = arms["baseline"], arms["treatment"]
    out["difference"] = ([r.to_json() for r in difference(b.summary, t.summary)]
                         if b and b.usable and t and t.usable else [])
    return out
