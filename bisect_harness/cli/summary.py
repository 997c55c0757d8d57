"""What a run's verdicts read as on the terminal (a table) and in ``--json`` (``run_summary``)."""

from __future__ import annotations

from rich.markup import escape  # every user string shown through Rich markup goes through it
from rich.table import Table

from bisect_harness.evidence import FindingKind, VerdictStats
from bisect_harness.model import NOT_MEASURED, shown_outcome

__all__ = ["curve_lines", "run_summary"]


def _verdict_table(run) -> Table:
    t = Table(title=f"run {run.id}: verdicts")
    for col in ("hypothesis", "metric", "verdict", "ratio t/b", "CI", "p", "boots b/t", "checks"):
        t.add_column(col)
    for h in run.hypotheses:
        v = h.verdict
        if v is None:
            t.add_row(escape(h.hid), escape(h.metric), "not decided", "", "", "", "", "")
            continue
        ci = f"[{v.ci_low:.4f}, {v.ci_high:.4f}]" if v.ci_low is not None else "n/a"
        t.add_row(escape(h.hid), escape(h.metric), shown_outcome(v), f"{v.ratio:.4f}" if v.ratio is not None else "n/a", escape(ci),
                  f"{v.p_value:.3g}" if v.p_value is not None else "n/a",
                  f"{len(v.baseline_boot_ids)}/{len(v.treatment_boot_ids)}",
                  escape(_checks_word(v)))
    return t


def curve_lines(run) -> list[str]:
    """Each load curve's answer under the verdict table, a line each, as the run stored
    it (``curve answer not recorded`` where it stored none)."""
    from bisect_harness.report import curve_view

    return [f"curve {c.id} ({c.metric}, {len(c.points)} points): "
            + (c.answer.words if c.answer is not None else curve_view.NOT_RECORDED)
            for c in curve_view.curves_of(run)]


def _checks_word(v) -> str:
    """The verdict table's checks cell (``journal.checks_cell``) of verdict ``v``, unbolded:
    its findings counted by kind, host drift as the number of its ``HOST_DRIFT`` findings."""
    from bisect_harness.report.journal import checks_cell

    found = v.found
    drift = sum(1 for f in found if f.kind is FindingKind.HOST_DRIFT)
    return checks_cell(found, drift, v.figures.checks).replace("**", "")


def _checks_json(v) -> dict:
    """What the verdict's boots checked: counts per check (``decide.checks_done``: boots per
    check, flags compared and not reported) and a word (``ok`` / ``unchecked`` / the marks,
    with the flags the server did not report named; never ``ok`` for those)."""
    if v is None:
        return {"word": "unchecked", "counts": None}
    return {"word": _checks_word(v), "counts": v.figures.checks}


def _follow_ups_json(run) -> dict[int, dict]:
    """Per hypothesis row id, what its ``bisect: true`` and ``explain: true`` searches
    found (the last of each, as the journal shows them)."""
    from sqlalchemy.orm import object_session

    from bisect_harness.record.ledger import Bisection

    out: dict[int, dict] = {}
    explained = [e for e in (run.summary or {}).get("explain", []) if e.get("hypothesis_id") is not None]
    inner = {(e.get("bisection") or {}).get("id") for e in explained}  # an explanation's own bisection
    session = object_session(run)
    for bis in (session.query(Bisection).filter_by(run_id=run.id).order_by(Bisection.id) if session else []):
        if bis.hypothesis_id is None or bis.id in inner:
            continue
        r = bis.result or {}
        out.setdefault(bis.hypothesis_id, {})["bisection"] = {
            "id": bis.id, "status": bis.status, "culprit": r.get("culprit"), **_leader(r),
            "stopped": r.get("stopped"), "boots": r.get("boots"), "candidate_set": r.get("candidate_set")}
    for e in explained:
        out.setdefault(e["hypothesis_id"], {})["explanation"] = {
            k: e.get(k) for k in ("members", "interactions", "opposite", "undecided", "stopped", "boots", "bisection")}
    return out


def _leader(result: dict) -> dict:
    """A search's leader and its posterior, apart from its culprit: a result stored
    before they had their own keys names the leader's posterior ``probability`` and its
    leader as the first commit of ``candidate_set`` (or the culprit)."""
    leader = result.get("leader", result.get("culprit") or (result.get("candidate_set") or [None])[0])
    return {"leader": leader, "leader_probability": result.get("leader_probability", result.get("probability"))}


def _prior_json(v) -> dict | None:
    """The noise prior a verdict was offered (``decide.prior``): where it came from and
    whether the verdict's look pooled it; None where none was."""
    st = v.figures if v else VerdictStats()
    prior = st.noise_prior or (st.noise_prior_dropped or {}).get("prior")
    if not prior:
        return None
    out = {k: prior.get(k) for k in ("dof", "rounds", "runs", "boots")}
    out["spread"] = prior["var"] ** 0.5 if prior.get("var") else None
    out["pooled"] = bool(st.prior_pooled) if st.noise_prior is not None else False
    if st.noise_prior_dropped is not None:
        out["not_pooled_because"] = st.noise_prior_dropped.get("reason")
    return out


def _mechanisms_json(v) -> dict:
    """Per arm, how often each mechanism read each state over the verdict's boots
    (``BootEvidence.mechanisms``), e.g. ``{"treatment": {"CUDA graphs":
    {"set_up_not_seen": 2}}}``; {} when no boot checked one."""
    from sqlalchemy.orm import object_session

    from bisect_harness.record.ledger import Boot

    session = object_session(v) if v is not None else None
    out: dict[str, dict] = {}
    for arm, ids in (("baseline", v.baseline_boot_ids), ("treatment", v.treatment_boot_ids)) if session else ():
        for b in session.query(Boot).filter(Boot.id.in_(list(ids or []))).order_by(Boot.id):
            for m in b.evidence.mechanisms or ():
                states = out.setdefault(arm, {}).setdefault(m.get("name"), {})
                states[m.get("state")] = states.get(m.get("state"), 0) + 1
    return out


def _failed_requests_json(v) -> dict:
    """Per arm, the verdict's boots' failed requests (``BootEvidence.request_retries``):
    tries sent again, requests failed after them, and the boots and samples that had
    any, e.g. ``{"treatment": {"retries": 3, "failed": 0, "boots": 2, "samples": 3}}``; {}
    when none failed."""
    from sqlalchemy.orm import object_session

    from bisect_harness.record.ledger import Boot

    session = object_session(v) if v is not None else None
    out: dict[str, dict] = {}
    for arm, ids in (("baseline", v.baseline_boot_ids), ("treatment", v.treatment_boot_ids)) if session else ():
        for b in session.query(Boot).filter(Boot.id.in_(list(ids or []))).order_by(Boot.id):
            seen = b.evidence.request_retries
            if seen:
                arm_out = out.setdefault(arm, {"retries": 0, "failed": 0, "boots": 0, "samples": 0})
                arm_out["retries"] += seen.get("retries", 0)
                arm_out["failed"] += seen.get("failed", 0)
                arm_out["boots"] += 1
                arm_out["samples"] += len(seen.get("samples") or {})
    return out


def run_summary(run) -> dict:
    """The ``--json`` object of ``harness run``: each hypothesis' verdict, what its
    bisection and explanation found where the file asked for them, and its arms'
    profiles side by side (``profile``) where a boot of either arm was profiled, and
    each arm's mean of the engine's declared metrics over the verdict's windows
    (``window_metrics``), and each arm's failed requests (``failed_requests``), and
    what the verdict cost (``cost``: every boot of its two configs in the run, their
    samples and node seconds, and the cost model that priced a boot; None for a
    verdict recorded before costs were kept). A hypothesis of a load curve says its
    ``curve`` and ``point`` (null for one of one point); ``curves`` groups the points'
    verdicts per curve with the curve's answer as the run stored it
    (``report.curve_view.curve_json``)."""
    from bisect_harness.report import curve_view
    from bisect_harness.spec.metric_defs import declared_metrics
    from bisect_harness.report.profile_view import hypothesis_json
    from bisect_harness.report.window_view import hypothesis_json as window_json

    out = []
    searches = _follow_ups_json(run)
    declared = declared_metrics(run.spec_text)
    points = curve_view.memberships(run)
    for h in run.hypotheses:
        v = h.verdict
        profile = hypothesis_json(h, run)  # where a boot of either arm was profiled
        out.append({**searches.get(h.id, {}), **({"profile": profile} if profile else {}),
            "id": h.hid, "verdict": shown_outcome(v) if v else "inconclusive", "metric": h.metric,
            "curve": points[h.id][0] if h.id in points else None, "point": points[h.id][1] if h.id in points else None,
            "measured": bool(v) and v.test != NOT_MEASURED,
            "effect": v.ratio if v else None,
            "ci": [v.ci_low, v.ci_high] if v and v.ci_low is not None else None,
            "p_value": v.p_value if v else None,
            "boots": {"baseline": len(v.baseline_boot_ids) if v else 0,
                      "treatment": len(v.treatment_boot_ids) if v else 0},
            "reason": v.reason if v else "no verdict recorded",
            "checks": _checks_json(v),
            "mechanisms": _mechanisms_json(v),
            "failed_requests": _failed_requests_json(v),
            "cost": v.figures.cost if v else None,
            "noise_prior": _prior_json(v),
            "window_metrics": (window_json(h, declared) or {}).get("metrics", []),
            "warnings": list(v.warnings or []) if v else []})
    return {"run_id": run.id, "status": run.status, "hypotheses": out,
            "curves": [curve_view.curve_json(c) for c in curve_view.curves_of(run)]}
