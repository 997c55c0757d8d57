"""A hypothesis' verdict in three layers: flag accepted / mechanism engaged / outcome moved.

``mechanism: [{metric: verify_ms, expect: decrease}]`` names further metrics that must
move, in a stated direction, for the claim to hold. Each layer has its own statistics:

* **flag accepted**: the treatment's boots' flag check (the server's effective
  arguments against the flags asked for): ``yes`` when every flag was compared and
  matched in every good boot, ``no`` when one was mismatched, ``unknown`` when the server
  did not report one of them (named, never read as accepted);
* **mechanism engaged**: each mechanism metric judged by the same rule as the outcome
  (``decide.verdict.judge``: the boots, the sequential design, the family's alpha), with its own
  verdict; engaged when every one is confirmed, inert when one is refuted;
* **outcome moved**: the hypothesis' own verdict.

"Accepted but inert" (the flag took effect, its mechanism never engaged) is a finding of
its own, named in ``finding``.
"""

from __future__ import annotations

from typing import Sequence

from bisect_harness.observe.provenance import FlagReport

__all__ = ["flag_layer", "layers"]


def flag_layer(boots: Sequence) -> dict:
    """What the flag checks of ``boots`` (good ones) say: accepted yes / no / unknown.
    ``yes`` only when every flag was compared and matched in every boot; a flag the
    server did not report leaves it ``unknown`` and is named in ``not_reported``."""
    matched = mismatched = 0
    detail: list[str] = []
    missing: set[str] = set()
    for b in boots:
        if b.status != "ok" or not b.flag_report:
            continue
        rep = FlagReport.from_dict(b.flag_report)
        matched += len(rep.matched)
        missing |= {c.flag for c in rep.not_reported}
        for c in rep.mismatched:
            mismatched += 1
            detail.append(f"boot {b.id}: {c.flag} asked {c.requested!r}, server has {c.effective!r}")
    state = "no" if mismatched else ("yes" if matched and not missing else "unknown")
    return {"accepted": state, "matched": matched, "mismatched": mismatched, "not_reported": sorted(missing),
            "detail": detail[:5]}


def layers(judge_one, *, flag_boots: Sequence, mechanism: Sequence, outcome: str) -> dict:
    """The three layers. ``judge_one(m) -> decide.verdict.Verdict`` judges one mechanism
    claim ``m`` (its ``metric``, ``expect`` and ``min_effect``) on the hypothesis' boots."""
    flag = flag_layer(flag_boots)
    mech = []
    for m in mechanism:
        v = judge_one(m)
        mech.append({"metric": m.metric, "expect": m.expect.value, "min_effect": m.min_effect,
                     "outcome": v.outcome.value, "ratio": v.ratio, "ci_low": v.ci[0] if v.ci else None,
                     "ci_high": v.ci[1] if v.ci else None, "p_value": v.p_value, "reason": v.reason})
    outcomes = {x["outcome"] for x in mech}
    engaged = ("n/a" if not mech else "yes" if outcomes == {"confirmed"}
               else "no" if "refuted" in outcomes else "undecided")
    if flag["accepted"] == "yes" and engaged == "no":
        finding = "accepted but inert: the flag took effect, its mechanism did not engage"
    elif engaged == "yes" and outcome == "refuted":
        finding = "mechanism engaged, outcome did not move: the mechanism is not the bottleneck"
    elif flag["accepted"] == "no":
        finding = "flag not accepted: the server runs with another value"
    else:
        finding = None
    return {"flag_accepted": flag, "mechanism_engaged": engaged, "mechanism": mech, "outcome_moved": outcome,
            "finding": finding}
