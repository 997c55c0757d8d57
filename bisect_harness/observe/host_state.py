"""Was the host the same, and quiet, on both sides? Findings from recorded figures.

Reads what the executor stored with each boot (its evidence's ``contention``: the
contention window of its benchmark, the thresholds applied and the figures that
crossed them) and with each run (calibration probes and the preflight window, in
the ``calibrations`` table), and turns them into the findings
(:class:`~bisect_harness.evidence.Finding`) a verdict, a search and a night carry:
each with the figures it was decided from and the sentence the CLI and the journal
print. The claim "same host state" is made only by :func:`same_host_state`, when
the figures of both sides back it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from bisect_harness.evidence import Finding, FindingKind, evidence_of
from bisect_harness.observe.calibration import Measurement, judged_spread, percent_beyond
from bisect_harness.observe.contention import Thresholds, Window, judge, summary_line

PREFLIGHT_BUSY = "host busy at the start"  # the preflight's words: the run says them, and its finding



@dataclass(frozen=True)
class BootContention:
    """One boot's stored contention record."""

    window: Window
    crossed: tuple[Mapping[str, Any], ...]
    samples: tuple[Mapping[str, float], ...]

    @property
    def busy(self) -> bool:
        return bool(self.crossed)

    @classmethod
    def of(cls, boot) -> "BootContention | None":
        """The record of ``boot`` (a ``BootRecord`` or a ledger row:
        ``evidence.evidence_of``), or None where its contention was not measured."""
        rec = evidence_of(boot).contention
        if not rec or "window" not in rec:
            return None
        return cls(Window.from_dict(rec["window"]), tuple(rec.get("crossed", ())), tuple(rec.get("samples", ())))


def quiet_samples(boot) -> tuple[bool, ...] | None:
    """Per sample of ``boot`` (in order), whether its own contention window crossed no
    threshold (the boot's own thresholds, as recorded); None where the boot has no
    window per sample that lines up with its samples (not measured, an older ledger).
    The first sample's window holds the warm-up before it too."""
    rec = evidence_of(boot).contention or {}
    windows = rec.get("samples")
    if not windows or len(windows) != len(boot.samples) or "window" not in rec:
        return None
    known = set(Thresholds.names())
    thresholds = Thresholds(**{k: v for k, v in (rec.get("thresholds") or {}).items() if k in known})
    cores = Window.from_dict(rec["window"]).cores
    return tuple(not judge(Window(0.0, cores, dict(figures), {}), thresholds) for figures in windows)


def busy_sentence(label: str, rec: BootContention) -> str:
    return f"host busy during {label}: " + "; ".join(c["message"] for c in rec.crossed)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def busy_finding(side: str | None, where: str, boot_id: int, rec: BootContention,
                 **figures: Any) -> Finding:
    """A boot whose contention window crossed a threshold: ``where`` names it in the
    sentence (``baseline boot 12``, ``boot 12 (abc123, ok)``); the figures are what
    crossed (``crossed``: figure, value, limit, message each) and ``figures``."""
    return Finding(FindingKind.BUSY_BOOT, busy_sentence(where, rec), side=side, boots=(boot_id,),
                   figures={"crossed": [dict(c) for c in rec.crossed], **figures})


def contention_findings(sides: Mapping[str, Sequence], thresholds: Thresholds | None = None) -> list[Finding]:
    """Each busy boot of each side (:func:`busy_finding`), and a difference in
    contention between the sides (busy boots on one side only, or mean foreign CPU
    apart by more than its threshold): a ``contention_differed`` finding whose figures
    are, per side, its busy and measured boots and their mean foreign CPU share
    (``sides``), and the threshold (``foreign_cpu_share``)."""
    thresholds = thresholds or Thresholds()
    out = []
    summary = {}
    for side, boots in sides.items():
        recs = [(b, BootContention.of(b)) for b in boots]
        for b, rec in recs:
            if rec is not None and rec.busy:
                out.append(busy_finding(side, f"{side} boot {b.id}", b.id, rec))
        measured = [r for _, r in recs if r is not None]
        shares = [r.window.figures["foreign_cpu_share"] for r in measured if "foreign_cpu_share" in r.window.figures]
        summary[side] = (sum(r.busy for r in measured), len(measured), _mean(shares))
    if len(summary) == 2:
        (sa, (ba, na, ma)), (sb, (bb, nb, mb)) = summary.items()
        far = ma is not None and mb is not None and abs(ma - mb) > thresholds.foreign_cpu_share
        if na and nb and ((ba == 0) != (bb == 0) or far):
            def side_text(side, busy, n, mean):
                share = f"mean foreign CPU {mean:.0%} of the server's cores" if mean is not None else "foreign CPU n/a"
                return f"{side} {busy} of {n} boots busy, {share}"
            out.append(Finding(
                FindingKind.CONTENTION_DIFFERED, "contention differed between the sides: " + side_text(sa, ba, na, ma)
                + "; " + side_text(sb, bb, nb, mb),
                figures={"sides": {side: {"busy_boots": busy, "measured_boots": n, "mean_foreign_cpu_share": mean}
                                   for side, (busy, n, mean) in summary.items()},
                         "foreign_cpu_share": thresholds.foreign_cpu_share}))
    return out


def _noisy(result: Mapping[str, Any] | None, limit: float) -> list[tuple[Mapping[str, Any], float, str]]:
    """The calibration measurements of ``result`` whose spread once the probe settled
    (the repetitions after the first; per SM clock where the probe held the GPU at its
    power limit: ``calibration.judged_spread``) is above ``limit``: (the measurement,
    its spread, the sentence) each."""
    if not result or "measurements" not in result:
        return []
    out = []
    for m in result["measurements"]:
        values = m.get("values") or []
        judged = judged_spread(Measurement.from_dict(m)) if values else None
        steady = judged.value if judged is not None else m.get("spread")
        if steady is not None and steady > limit:
            seen, lim = percent_beyond(steady, limit)
            which = "its repetitions after the first" if len(values) >= 4 else "repetitions"
            if judged is not None and judged.per_clock:
                which += f", in {judged.basis}"
            out.append((m, steady, f"{m['name']}@{m['device']} varied {seen} between {which} (> {lim}): the host "
                                   "was not quiet while it was calibrated"))
    return out


def calibration_spreads(result: Mapping[str, Any] | None, limit: float) -> list[str]:
    """The calibration measurements whose spread once the probe settled (:func:`_noisy`)
    is above ``limit``, as sentences whose figures show they crossed it (the scheduler
    prints them as the probe ends)."""
    return [text for _, _, text in _noisy(result, limit)]


def calibration_findings(runs: Sequence, thresholds: Thresholds | None = None) -> list[Finding]:
    """Noisy calibration probes of the given runs (before and after:
    ``calibration_noisy``, figures ``run``, ``phase``, ``name``, ``device``, ``spread``,
    ``limit``), and a busy preflight (``preflight_busy``, figures ``run``, ``phase``,
    ``watched``, ``crossed``)."""
    thresholds = thresholds or Thresholds()
    out = []
    for run in runs:
        for cal in run.calibrations:
            res = cal.result or {}
            if cal.phase == "preflight":
                crossed = res.get("crossed") or []
                if crossed:
                    watched = res.get("watched", "before the first boot")
                    out.append(Finding(
                        FindingKind.PREFLIGHT_BUSY, f"{PREFLIGHT_BUSY} of run {run.id} ({watched}): "
                        + "; ".join(c["message"] for c in crossed),
                        figures={"run": run.id, "phase": cal.phase, "watched": watched,
                                 "crossed": [dict(c) for c in crossed]}))
                continue
            limit = (res.get("judged") or {}).get("spread_limit", thresholds.calibration_spread)
            for m, spread, text in _noisy(res, limit):
                out.append(Finding(FindingKind.CALIBRATION_NOISY, f"calibration ({cal.phase}, run {run.id}): {text}",
                                   figures={"run": run.id, "phase": cal.phase, "name": m["name"],
                                            "device": m["device"], "spread": spread, "limit": limit}))
    return out


def side_runs(*boot_lists: Sequence) -> list:
    seen, out = set(), []
    for boots in boot_lists:
        for b in boots:
            if b.run is not None and b.run_id not in seen:
                seen.add(b.run_id)
                out.append(b.run)
    return out


def same_host_state(a_boots: Sequence, b_boots: Sequence, drift: Sequence) -> tuple[bool, list[str]]:
    """Whether the figures back "the two sides ran on the same host state", and if not,
    why not (each reason a sentence from the figures)."""
    reasons = []
    if drift:
        reasons.append(f"{len(drift)} host difference(s), listed above")
    for side, boots in (("baseline", a_boots), ("treatment", b_boots)):
        recs = [BootContention.of(b) for b in boots]
        missing = sum(r is None for r in recs)
        busy = sum(1 for r in recs if r is not None and r.busy)
        if missing:
            reasons.append(f"contention was not measured for {missing} of {len(boots)} {side} boots")
        if busy:
            reasons.append(f"{busy} of {len(boots)} {side} boots ran on a busy host")
    runs = side_runs(a_boots, b_boots)
    if calibration_findings(runs):
        reasons.append("a calibration probe or the preflight found the host busy")
    return not reasons, reasons


def boot_line(boot) -> str | None:
    """The journal's line for one boot's contention figures."""
    rec = BootContention.of(boot)
    if rec is None:
        return None
    text = summary_line(rec.window)
    if rec.busy:
        text += "; **above thresholds**: " + "; ".join(c["message"] for c in rec.crossed)
    return text


__all__ = ["BootContention", "boot_line", "busy_finding", "busy_sentence", "calibration_findings",
           "calibration_spreads", "contention_findings", "quiet_samples", "same_host_state", "side_runs"]
