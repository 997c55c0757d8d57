"""Host drift: what differed between the hosts two sides of a comparison ran on.

Below the journal, the decision and nightly (each reads it; none of them owns it).
A side's first and last boots are compared with the other side's last and first,
so a reboot or a driver change in the middle of a side shows too; sides from
different runs also compare their runs' calibration probes. The boots come as
frozen records (``boot.BootRecord``, made from the ledger's rows by
``record.ledger.boot_records``), so this reads no storage. :func:`drift_findings`
says the same as findings (``host_drift``, the figures each :class:`~bisect_harness.
observe.calibration.Drift`'s own record), for a verdict to carry.
"""

from __future__ import annotations

from typing import Sequence

from bisect_harness.boot import BootRecord
from bisect_harness.evidence import Finding, FindingKind
from bisect_harness.observe import calibration, provenance

__all__ = ["host_drift", "drift_findings"]


def _boot_host(boot: BootRecord):
    ev = boot.evidence
    if ev.host is None:
        return None, None
    host = provenance.HostInfo.from_dict(ev.host)
    samples = provenance.SamplerSummary.from_dict(ev.gpu_sampling) if ev.gpu_sampling else None
    return host, samples


def _boot_calibration(boot: BootRecord):
    result = boot.run.calibration("before") if boot.run is not None else None
    return calibration.Calibration.from_dict(result) if result else None


def host_drift(a_boots: Sequence[BootRecord], b_boots: Sequence[BootRecord]) -> list[calibration.Drift]:
    """What differed between the hosts of two sides (first and last boot of each,
    so a reboot or a driver change in the middle of a side shows too), including the
    calibration probes of the runs the boots belong to (sides from different runs)."""
    return [d for d, _ in _drifts(a_boots, b_boots)]


def drift_findings(a_boots: Sequence[BootRecord], b_boots: Sequence[BootRecord]) -> list[Finding]:
    """:func:`host_drift` as findings: ``host drift: <the drift's message>``, the boots
    of the pair it was first seen between (one of each side), the figures the
    drift's record (``Drift.to_dict``: field, a, b, severity, message)."""
    return [Finding(FindingKind.HOST_DRIFT, f"host drift: {d.message}", boots=pair, figures=d.to_dict())
            for d, pair in _drifts(a_boots, b_boots)]


def _drifts(a_boots: Sequence[BootRecord],
            b_boots: Sequence[BootRecord]) -> list[tuple[calibration.Drift, tuple[int, int]]]:
    pairs = []
    if a_boots and b_boots:
        pairs = [(a_boots[0], b_boots[-1]), (a_boots[-1], b_boots[0])]
    seen, out = set(), []
    for x, y in pairs:
        (ha, sa), (hb, sb) = _boot_host(x), _boot_host(y)
        if ha is None or hb is None:
            continue
        cal_a, cal_b = (_boot_calibration(x), _boot_calibration(y)) if x.run_id != y.run_id else (None, None)
        for d in calibration.compare_hosts(ha, hb, cal_a, cal_b, samples_a=sa, samples_b=sb):
            if d.field not in seen:
                seen.add(d.field)
                out.append((d, (x.id, y.id)))
    return out
