"""The checks one boot runs on itself, and what they write into its evidence.

Each check takes ``b``, the boot in progress (``backends.procedure``'s record: its
``status``, ``marks``, ``note(**fields)`` to set fields of its
:class:`~bisect_harness.evidence.BootEvidence`, and what it gathered on the way), and
marks, excludes or stops the boot by the rule of its ``defaults.*_check``:

* while the samples run: each request's token count against its chunks of text
  (:func:`usage_check`, judged by :func:`usage_verdict`), requests sent again or failed
  (:func:`retry_check`);
* after them: the mechanisms the flags claim, over the measured window
  (:class:`MechanismWindow`, :func:`mechanism_check`), and the host's contention
  (:func:`host_check`);
* once the server is stopped: its exit (:func:`stop_check`), its log's size and a log
  that could not be written (:func:`log_check`, :func:`log_unwritten`), and the
  checkout it ran from (:func:`checkout_check`).

The boot procedure calls them in that order; nothing here boots or touches the ledger.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any, Mapping, Sequence

from bisect_harness.boot import BootRequest
from bisect_harness.engines import integrity, presets
from bisect_harness.evidence import BootStatus
from bisect_harness.measure import bodies
from bisect_harness.measure.deadline import deadline_client
from bisect_harness.measure.sources.prometheus import parse_prometheus
from bisect_harness.measure.values import read_server_info
from bisect_harness.observe import contention, mechanisms

__all__ = ["fetch_server_info", "STEADY_EXTRA_CHUNKS", "STOPPED_AS_ASKED", "usage_check", "usage_verdict", "stop_check", "log_check",
           "log_unwritten", "checkout_check", "retry_check", "Retries", "log_text", "MechanismWindow",
           "mechanism_check", "host_check"]


def fetch_server_info(base_url: str, paths: Sequence[str], headers: Mapping[str, str] | None = None,
                      limit: int = bodies.MAX_BODY_BYTES) -> dict | None:
    """The first server-info endpoint that answers with a JSON object, or None
    (``values.read_server_info``, the rule the metric sources use too); no body
    is read past ``limit`` bytes (``limits.body_bytes``)."""
    with deadline_client() as client:
        data, _ = read_server_info(client, base_url, paths, timeout_s=10.0, headers=headers, limit=limit)
    return dict(data) if data is not None else None


#: A server that sends this many more chunks of text than the tokens it counts, on every
#: request of a boot, has a steady off-by-one of its own (llama.cpp's server of late 2023:
#: 33 chunks for ``tokens_predicted`` 32), learnt and noted, not a disagreement.
STEADY_EXTRA_CHUNKS = 1


def usage_check(b, requests) -> None:
    """Each answered request's difference between the chunks of text it carried and the
    server's count of its tokens, gathered for :func:`usage_verdict`."""
    for r in requests:
        if r.ok and r.server_tokens is not None:
            d = r.chunks - r.server_tokens
            b.usage_diffs[d] = b.usage_diffs.get(d, 0) + 1
            if r.usage_mismatch:
                b.usage_examples.setdefault(d, r.usage_mismatch)


def usage_verdict(b) -> None:
    """A server whose token count is below the text chunks it sent is not believed: the
    client's count stands for those requests (``measure.request``). The boot is marked
    ``usage_mismatch`` with how often and one example, unless every request of the boot
    (two at least) showed the same :data:`STEADY_EXTRA_CHUNKS` extra chunk: that is the
    server's own steady off-by-one, said once in ``evidence.usage_offset``, not a mark. A
    difference beyond it, or one that changes from request to request, marks."""
    over = {d: n for d, n in b.usage_diffs.items() if d > 0}
    if not over:
        return
    total = sum(b.usage_diffs.values())
    if set(b.usage_diffs) == {STEADY_EXTRA_CHUNKS} and total >= 2:
        b.note(usage_offset={
            "extra_chunks": STEADY_EXTRA_CHUNKS, "requests": total,
            "note": (f"the server sent {STEADY_EXTRA_CHUNKS} chunk of text more than the tokens it counted on "
                     f"every one of the boot's {total} requests ({b.usage_examples[STEADY_EXTRA_CHUNKS]}): its "
                     "steady off-by-one, not a disagreement; the chunks' count stands for the token figures")})
        return
    worst = max(over)
    # usage_offset, said by an earlier look before the counts disagreed, is taken back
    b.note(usage_offset=None,
           usage_mismatch={"requests": sum(over.values()), "example": b.usage_examples[worst]})
    if "usage_mismatch" not in b.marks:
        b.marks.append("usage_mismatch")


#: How a server's top process may end when the harness stops it: exit 0, or killed by
#: SIGTERM (-15 as Python reports a signal, 143 as a shell wrapper passes it on).
STOPPED_AS_ASKED = (0, -signal.SIGTERM, 128 + signal.SIGTERM)


def stop_check(b, server) -> None:
    """The launched server's exit code at the harness's stop, in the boot's record
    (``evidence.stop``); any other end than :data:`STOPPED_AS_ASKED` (a wrapper
    that exits 1 when SIGTERM reached its server first, a server killed after the
    grace) is said there and marks the boot ``stop_unclean``. Its samples were taken
    before the stop and count."""
    rc = getattr(server, "returncode", None)  # an attached server is not ours to stop
    if rc is None:
        return
    clean = rc in STOPPED_AS_ASKED
    stop: dict[str, Any] = {"exit_code": rc, "clean": clean}
    if not clean:
        how = f"killed by signal {-rc}" if rc < 0 else f"exited {rc}"
        stop["note"] = (f"the server's top process {how} when the harness stopped it (SIGTERM, "
                        "then SIGKILL after the grace); its samples were taken before and count")
        if "stop_unclean" not in b.marks:
            b.marks.append("stop_unclean")
    b.note(stop=stop)


def log_check(b, server) -> None:
    """How much the server wrote to its boot log and, past the log's cap (the first
    and last 32 MiB kept), how much was dropped: ``evidence.log``, and the mark
    ``log_capped`` when anything was; where the log could not be written, see
    :func:`log_unwritten`."""
    out = getattr(server, "log_output", None)
    if out is None:
        return
    written, dropped = out
    b.note(log={"bytes_written": written, "bytes_dropped": dropped})
    if dropped and "log_capped" not in b.marks:
        b.marks.append("log_capped")


def log_unwritten(b, why: str | None) -> None:
    """A boot whose log could not be written (a full disk, an I/O error) is marked
    ``log_unwritten``, and ``evidence.log["unwritten"]`` says how much is missing
    and why; its ``log_tail`` is the newest output, kept in memory. Its samples count."""
    if not why:
        return
    b.note(log={**(b.evidence.log or {}), "unwritten": why})
    if "log_unwritten" not in b.marks:
        b.marks.append("log_unwritten")


def checkout_check(b, held: integrity.Held) -> None:
    """After the server stopped: is the checkout (and the commit's environment) still
    what the boot was started on? One that changed while the boot ran says nothing of
    the commit: the boot is marked ``checkout_changed``, what changed is in
    ``evidence.checkout_changed``, and it is excluded (booted again, on a checkout made
    again)."""
    changed = integrity.changed_since(held)
    if not changed:
        return
    b.note(checkout_changed=tuple(changed[:20]) + ((f"and {len(changed) - 20} more",) if len(changed) > 20 else ()))
    b.marks.append(integrity.CHECKOUT_CHANGED)
    if b.status in (BootStatus.RUNNING, BootStatus.OK):
        b.status = BootStatus.EXCLUDED


def retry_check(b, requests, seq: int) -> None:
    """Requests that failed in sample ``seq``: those sent again within it (the server said
    "try again", never took them, answered 200 with nothing, or cut the stream) and those
    that failed in the end, in ``evidence.request_retries``: how many, how often, the
    first answer, the first failure, and per sample (``samples``: ``{seq: {"retries",
    "failed"}}``). The boot is marked ``requests_failed``."""
    tried = [r for r in requests if r.retries]
    failed = [r for r in requests if not r.ok]
    if not tried and not failed:
        return
    b.retries.add(tried, failed, seq)
    b.note(request_retries=b.retries.to_dict())
    if "requests_failed" not in b.marks:
        b.marks.append("requests_failed")


def lag_check(b, behind, seq: int) -> None:
    """An open-loop sample whose client fell behind its schedule (``client.ClientBehind``:
    its p99 send lag over ``benchmark.max_lag_ms``) did not send at the rate asked: the
    boot is marked ``client_behind`` and ``evidence.client_behind`` holds each such
    sample's figures (``samples``: ``{seq: {lag_p99_ms, max_lag_ms, sends, asked_rps,
    achieved_rps}}``). Its samples stay, each carrying ``client_behind: 1.0``."""
    if behind is None:
        return
    samples = dict((b.evidence.client_behind or {}).get("samples", {}))
    samples[str(seq)] = behind.to_json()
    b.note(client_behind={"samples": samples})
    if "client_behind" not in b.marks:
        b.marks.append("client_behind")


class Retries:
    """Requests sent again or failed in the end, over the boot's samples so far
    (``evidence.request_retries``, :func:`retry_check`)."""

    def __init__(self):
        self.requests = self.retries = self.failed = 0
        self.example: str | None = None
        self.failed_example: str | None = None
        self.samples: dict[str, dict[str, int]] = {}

    def add(self, tried, failed, seq: int) -> None:
        self.requests += len(tried)
        self.retries += sum(r.retries for r in tried)
        self.example = self.example or (tried[0].retry_reason if tried else None)
        self.failed += len(failed)
        self.failed_example = self.failed_example or (failed[0].error if failed else None)
        self.samples[str(seq)] = {"retries": sum(r.retries for r in tried), "failed": len(failed)}

    def to_dict(self) -> dict:
        return {"requests": self.requests, "retries": self.retries, "example": self.example, "failed": self.failed,
                "failed_example": self.failed_example, "samples": dict(self.samples)}


LOG_READ_MAX = 8 << 20  # bytes of a boot log read for mechanism evidence: its head and its tail


def log_text(path: Path, start: int = 0, end: int | None = None) -> str:
    """The boot log's bytes ``start`` to ``end`` (the file's end when None) as text,
    its head and tail past :data:`LOG_READ_MAX`; "" when the log is unreadable or was
    cut back under ``start`` (the log cap rewrote its tail)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            end = size if end is None else min(end, size)
            if end <= start:
                return ""
            f.seek(start)
            if end - start <= LOG_READ_MAX:
                data = f.read(end - start)
            else:
                data = f.read(LOG_READ_MAX // 2)
                f.seek(end - LOG_READ_MAX // 2)
                data += b"\n" + f.read(LOG_READ_MAX // 2)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


class MechanismWindow:
    """The window the mechanism check reads (``boot.mechanisms.Window``): ``/metrics``
    and the log's length just before the first measured sample (after the warm-up)
    and just after the last, then server info. Nothing is read for a boot no
    mechanism of its preset applies to. The log is written by the supervisor a
    moment behind the server: a line at either edge may fall on the other side."""

    def __init__(self, req: BootRequest, base_url: str, headers: Mapping[str, str], log_path: Path):
        preset = presets.get_preset(req.preset)
        self.req, self.base_url, self.headers, self.log_path = req, base_url, headers, log_path
        self.flags = {presets.canonical_flag(f, preset): v for f, v in req.flags}
        self.mechanisms = tuple(m for m in preset.mechanisms if m.applies(self.flags))
        self.before: list | None = None
        self.offset = 0
        self.window: mechanisms.Window | None = None

    def _scrape(self) -> list | None:
        try:
            with deadline_client() as client:
                r = bodies.bounded_get(client, self.base_url + self.req.metrics_path, 10.0, self.headers,
                                       limit=self.req.benchmark.limits.body_bytes)
            return parse_prometheus(r.text) if r.status_code == 200 else None
        except Exception:  # past the limit, undecodable, unparsable: no counter evidence (the log may have some)
            return None

    def open(self) -> "MechanismWindow":
        if self.mechanisms:
            self.before = self._scrape()
            with contextlib.suppress(OSError):
                self.offset = self.log_path.stat().st_size
        return self

    def close(self) -> None:
        if not self.mechanisms:
            return
        after = self._scrape()
        self.window = mechanisms.Window(
            before=self.before, after=after, log=log_text(self.log_path, self.offset),
            startup_log=log_text(self.log_path, 0, self.offset),
            server_info=fetch_server_info(self.base_url, self.req.server_info_paths, headers=self.headers,
                                          limit=self.req.benchmark.limits.body_bytes))


def mechanism_check(b, w: MechanismWindow) -> None:
    """After the samples: did each mechanism the boot's flags claim (or that its engine
    runs by default) run in the measured window, by the engine's own evidence
    (``boot.mechanisms``)? Results in ``evidence.mechanisms``; a mechanism that did
    not run marks the boot ``mechanism_not_engaged``, one set up and not seen running
    ``mechanism_not_seen``."""
    if w.window is None:
        return
    results = mechanisms.check(w.mechanisms, w.flags, w.window)
    b.note(mechanisms=tuple(r.to_dict() for r in results))
    b.marks.extend(m for m in mechanisms.marks(results) if m not in b.marks)


def host_check(b, req: BootRequest, monitor: contention.Monitor) -> None:
    """Store the boot's contention figures; when they crossed a threshold, mark the
    boot ``host_busy`` and apply ``defaults.host_check`` (as ``_verify`` does for env)."""
    checks = req.checks
    window = monitor.window()
    crossed = contention.judge(window, checks.thresholds)
    b.note(contention=contention.record(window, monitor.samples(), crossed, checks.thresholds))
    if not crossed:
        return
    b.marks.append(contention.HOST_BUSY)
    why = "; ".join(c.message for c in crossed)
    if checks.host_check in ("exclude", "retry") and b.status is BootStatus.RUNNING:
        b.status = BootStatus.EXCLUDED
        b.busy = checks.host_check == "retry"
    elif checks.host_check == "fatal":
        b.status, b.fatal = BootStatus.FATAL, "infrastructure"
        b.failure = (f"host_busy: {why} (defaults.host_check is fatal: stop the other jobs on this host, "
                     "run with --wait-quiet, or set defaults.host_check: retry to re-boot busy boots)")
