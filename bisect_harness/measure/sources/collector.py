"""Collecting the declared sources over the sample windows of one boot. During a
boot a ``SourceCollector`` turns each sample window into one float per source::

    collector = SourceCollector(spec.engine.metrics, base_url, log_path)
    collector.begin_sample()                # scrape /metrics, mark the log offset
    responses = run_requests()              # the client's per-request JSON
    values = collector.end_sample(responses, duration_s)   # {"verify_ms": 29.4, ...}
    collector.problems()                    # ["log source 'verify_ms': ..."]

Each kind reads its value from a :class:`SampleWindow`, which makes the reads
several sources share (the ``/metrics`` scrapes, the server info, the log's new
lines) at most once per window.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from bisect_harness.measure.bodies import MAX_BODY_BYTES, Body, bounded_get
from bisect_harness.measure.sources.base import MetricSource
from bisect_harness.measure.sources.derived import _collect_order
from bisect_harness.measure.sources.prometheus import _parse_prometheus
from bisect_harness.measure.values import read_server_info

__all__ = ["SampleWindow", "SourceCollector"]


class SourceCollector:
    """Collects every declared source over the sample windows of one boot.

    ``base_url`` is the server's root (``http://127.0.0.1:30000``); ``log_path``
    the boot's log file (stdout and stderr of the server). ``server_info`` is the
    server-info JSON when the caller already fetched it, used as is when no
    ``server_info_paths`` are given; with paths, server info is read again from
    them (first that answers 200 with JSON) at the end of every window in which a
    server_info source needs it. Network and file errors never raise: they become
    problems, reported by ``problems()`` and recorded with the boot. ``notes`` are the
    engine's own words on what a miss means (``presets.Preset.source_notes``: keys
    ``metrics``, ``last_chunk``), so a problem gives the advice of the engine that ran.
    """

    def __init__(self, sources: Sequence[MetricSource], base_url: str, log_path: str | Path | None, *,
                 server_info: Mapping | None = None, server_info_paths: Sequence[str] = (),
                 metrics_path: str = "/metrics", timeout_s: float = 10.0, client=None,
                 headers: Mapping[str, str] | None = None, body_limit: int = MAX_BODY_BYTES,
                 notes: Mapping[str, str] | None = None):
        self.sources = tuple(sources)
        self.notes = dict(notes or {})
        self._order = _collect_order(self.sources)  # a derived source after the ones it names
        self.base_url = base_url.rstrip("/")
        self.body_limit = body_limit  # limits.body_bytes: /metrics and server info read no further
        self.log_path = Path(log_path) if log_path is not None else None
        self.metrics_path = metrics_path
        self.timeout_s = timeout_s
        self._server_info = server_info
        self._server_info_paths = tuple(server_info_paths)
        self._client = client
        self._headers = dict(headers or {})  # e.g. an attached server's Authorization; never stored
        self._samples = 0
        self._misses: dict[str, list[str]] = {s.name: [] for s in self.sources}
        self._hits: dict[str, int] = {s.name: 0 for s in self.sources}
        self._log_offset = 0
        self._window: SampleWindow | None = None
        self._t_begin = 0.0
        self._in_sample = False

    # --- plumbing

    def _get(self, path: str) -> "Body":
        """GET ``path`` on the server, read with bounds (:func:`bounded_get`; on a client
        of its own when the collector was given none)."""
        return bounded_get(self._client, self.base_url + path, self.timeout_s, self._headers, self.body_limit)

    def _scrape(self) -> tuple[list | None, str | None]:
        try:
            resp = self._get(self.metrics_path)
        except Exception as exc:  # any transport failure is a problem, not a crash
            return None, f"GET {self.metrics_path} failed: {type(exc).__name__}: {exc}"
        if resp.status_code != 200:
            note = self.notes.get("metrics")
            return None, f"GET {self.metrics_path} answered HTTP {resp.status_code}" + (f" ({note})" if note else "")
        try:
            return _parse_prometheus(resp.text), None
        except Exception as exc:
            return None, f"could not parse {self.metrics_path}: {exc}"

    def _fetch_server_info(self, fresh: bool = False) -> tuple[Mapping | None, str]:
        if self._server_info is not None and not (fresh and self._server_info_paths):
            return self._server_info, ""
        if not self._server_info_paths:
            return None, "no server-info path is configured (engine.server_info)"
        data, why = read_server_info(self._client, self.base_url, self._server_info_paths, timeout_s=self.timeout_s,
                                     headers=self._headers, limit=self.body_limit)
        if data is not None:
            self._server_info = data
        return data, why

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size if self.log_path else 0
        except OSError:
            return 0

    def _new_log_lines(self) -> tuple[list[str], str | None]:
        if self.log_path is None:
            return [], "no log file is known for this boot"
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                if size < self._log_offset:  # truncated or replaced: read it all
                    self._log_offset = 0
                f.seek(self._log_offset)
                data = f.read()
        except OSError as exc:
            return [], f"cannot read log {self.log_path}: {exc}"
        # Only whole lines: a line still being written is read next sample.
        end = data.rfind(b"\n") + 1
        self._log_offset += end
        return data[:end].decode("utf-8", errors="replace").splitlines(), None

    # --- the sample window

    def begin_sample(self) -> None:
        """Open a sample window: note the log's end, let each source prepare (a
        counter is scraped once for all prometheus sources)."""
        self._in_sample = True
        self._log_offset = self._log_size()
        self._window = SampleWindow(self)
        for s in self.sources:
            s.before_window(self._window)
        self._t_begin = time.monotonic()

    def end_sample(self, responses: Sequence[Mapping], duration_s: float,
                   last_chunks: Sequence[Mapping] = ()) -> dict[str, float]:
        """Close the window; one float per source that produced a value.

        ``responses`` are the window's per-request response JSON objects (for a
        stream, the merged final object); ``duration_s`` is the client's sample
        window, used for ``rate`` when the scrape timing is unavailable;
        ``last_chunks`` the last JSON chunk of each request's stream, for
        ``chunk: last`` sources.
        """
        if not self._in_sample:
            raise RuntimeError("end_sample() without begin_sample()")
        self._in_sample = False
        self._samples += 1
        elapsed = time.monotonic() - self._t_begin
        window = self._window
        window.close(responses, elapsed if elapsed > 0 else duration_s, last_chunks)
        out: dict[str, float] = {}
        window.values = out  # what the window has given so far: a derived source reads its inputs here
        for s in self._order:
            value = s.collect(window)
            if value is not None:
                out[s.name] = value
        return {s.name: out[s.name] for s in self.sources if s.name in out}

    # --- reporting

    def problems(self) -> list[str]:
        """One message per source that failed to yield a value in some sample,
        plus what a source finds wrong over the whole boot (a ``count`` log source
        that never matched a line: a count of zero is a measurement, a pattern
        that never matches is a bug)."""
        out = []
        for s in self.sources:
            misses = self._misses[s.name]
            if misses:
                reasons = list(dict.fromkeys(misses))
                out.append(f"{s.label}: {len(misses)} problem(s) over {self._samples} sample(s): "
                           + "; ".join(reasons[:3]) + (" ..." if len(reasons) > 3 else ""))
                continue
            problem = s.boot_problem(self._samples, self._hits[s.name])
            if problem:
                out.append(f"{s.label}: {problem}")
        return out


_UNREAD = object()


class SampleWindow:
    """One sample window as the sources see it. The reads several sources share
    (the ``/metrics`` scrapes before and after, the server info, the log's new
    lines) happen at most once per window, and only when a source asks."""

    def __init__(self, collector: SourceCollector):
        self._c = collector
        self.responses: Sequence[Mapping] = ()
        self.last_chunks: Sequence[Mapping] = ()
        self.seconds = 0.0  # the window's length: between the scrapes, else the client's
        self.values: dict[str, float] = {}  # the values collected so far in this window, by source name
        self._before: Any = _UNREAD
        self._after: Any = _UNREAD
        self._info: Any = _UNREAD
        self._lines: Any = _UNREAD

    def close(self, responses: Sequence[Mapping], seconds: float, last_chunks: Sequence[Mapping] = ()) -> None:
        self.responses = tuple(responses)
        self.last_chunks = tuple(last_chunks)
        self.seconds = seconds

    @property
    def sources(self) -> tuple[MetricSource, ...]:
        return self._c.sources

    @property
    def metrics_path(self) -> str:
        return self._c.metrics_path

    @property
    def log_name(self) -> str:
        return self._c.log_path.name if self._c.log_path else "the log"

    def scrape_before(self) -> tuple[list | None, str | None]:
        """``/metrics`` as parsed samples when the window opened, or (None, why)."""
        if self._before is _UNREAD:
            self._before = self._c._scrape()
        return self._before

    def scrape_after(self) -> tuple[list | None, str | None]:
        if self._after is _UNREAD:
            self._after = self._c._scrape()
        return self._after

    def server_info(self) -> tuple[Mapping | None, str]:
        # read at the end of this window: a field the server updates while serving
        # (SGLang's internal_states[].avg_spec_accept_length) then describes it
        if self._info is _UNREAD:
            self._info = self._c._fetch_server_info(fresh=True)
        return self._info

    def log_lines(self) -> tuple[list[str], str | None]:
        """The whole lines the boot's log gained during the window."""
        if self._lines is _UNREAD:
            self._lines = self._c._new_log_lines()
        return self._lines

    def note(self, what: str) -> str:
        """The engine's word on a miss of ``what`` (``SourceCollector``'s notes), or ""."""
        return self._c.notes.get(what, "")

    def miss(self, source: MetricSource, why: str) -> None:
        """Record why ``source`` gave no (or an incomplete) value in this window."""
        self._c._misses[source.name].append(why)

    def hit(self, source: MetricSource, n: int) -> None:
        """Count ``n`` things ``source`` found (log lines matched) toward the boot."""
        self._c._hits[source.name] += n
