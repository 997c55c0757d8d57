"""Declared metric sources: numbers a server exposes besides the client's timings.

Each entry of ``engine.metrics`` in a hypotheses file becomes a ``MetricSource``
with a ``Metric`` (name, unit, direction) that hypotheses may name. During a
boot a ``SourceCollector`` turns each sample window into one float per source::

    collector = SourceCollector(spec.engine.metrics, base_url, log_path)
    collector.begin_sample()                # scrape /metrics, mark the log offset
    responses = run_requests()              # the client's per-request JSON
    values = collector.end_sample(responses, duration_s)   # {"verify_ms": 29.4, ...}
    collector.problems()                    # ["log source 'verify_ms': ..."]

Kinds (``from:``):

* ``prometheus``: a counter or gauge scraped from ``/metrics`` before and after
  the window, summed over the label sets that match ``labels``; ``kind: delta``
  (after minus before), ``rate`` (delta per second between the two scrapes) or
  ``gauge`` (the value after).
* ``server_info``: a field (dotted path into nested objects and lists) of the
  server-info JSON, e.g. ``cuda_graph_config.decode.max_bs`` or
  ``internal_states.0.avg_spec_accept_length``; read again at the end of every
  sample window (when the collector knows the server-info paths), so a field the
  server updates as it serves describes the traffic so far, not the warmup.
* ``response``: a field (dotted path) of each request's response JSON, looked up
  as written and then under ``meta_info`` (SGLang's per-request info), averaged
  over the window's requests. ``field: accept_length`` is derived: the sum of
  completion tokens over the sum of ``spec_verify_ct`` (tokens per verify cycle).
* ``log``: a regex with a named group ``value`` applied to the lines the boot's
  log gained during the window, reduced by ``reduce`` (mean, median, last,
  count, sum, min, max; default mean).

A source that yields nothing (no log line matched, a field missing, a metric
absent, a scrape failed) gives no value for that sample and is reported by
``problems()``: never a silent zero.

A source may apply only to some configs: ``when: {speculative-algorithm: true}``
(the flag is set) or ``when: {speculative-algorithm: EAGLE3}`` (set to that
value; ``false`` means not set). :func:`applicable` splits a config's sources
into those that apply and those that do not; the latter are not collected and
not problems (a baseline without speculative decoding has no accept length).
A condition is on flags, not on "baseline" or "treatment": one config is often
the baseline of one hypothesis and the treatment of another.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import SpecError
from .model import Better, Metric

__all__ = [
    "MetricSource",
    "PrometheusSource",
    "ServerInfoSource",
    "ResponseSource",
    "LogSource",
    "SourceCollector",
    "parse_source",
    "lookup",
    "applicable",
    "ACCEPT_LENGTH",
]

ACCEPT_LENGTH = "accept_length"
PROMETHEUS_KINDS = ("delta", "rate", "gauge")
LOG_REDUCERS = ("mean", "median", "last", "count", "sum", "min", "max")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")


@dataclass(frozen=True)
class MetricSource:
    """Base of the four kinds; ``metric`` is what hypotheses name."""

    metric: Metric
    # not in repr: engine_fingerprint hashes the sources' repr, and `when` does not change a value
    when: Mapping[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    @property
    def name(self) -> str:
        return self.metric.name

    kind_name = ""

    def describe(self) -> str:
        return f"{self.kind_name} source '{self.name}'"

    def applies(self, flags: Mapping[str, Any], canonical=lambda name: name.lstrip("-")) -> bool:
        """Does this source apply to a config with ``flags``? ``canonical`` maps a
        flag name to the engine's spelling (``presets.canonical_flag``), so ``tp``
        and ``tp-size`` are one flag."""
        from .provenance import values_equal

        have = {canonical(str(k)): v for k, v in flags.items()}
        for name, want in self.when.items():
            got = have.get(canonical(str(name)))
            is_set = got is not None and got is not False
            if want is True or want is False:
                if is_set != want:
                    return False
            elif not is_set or not values_equal(want, got):
                return False
        return True


@dataclass(frozen=True)
class PrometheusSource(MetricSource):
    series: str = ""
    kind: str = "delta"
    labels: Mapping[str, str] = field(default_factory=dict)
    kind_name = "prometheus"


@dataclass(frozen=True)
class ServerInfoSource(MetricSource):
    field: str = ""
    kind_name = "server_info"


@dataclass(frozen=True)
class ResponseSource(MetricSource):
    field: str = ""
    kind_name = "response"


@dataclass(frozen=True)
class LogSource(MetricSource):
    pattern: str = ""
    reduce: str = "mean"
    kind_name = "log"

    @property
    def regex(self) -> re.Pattern:
        return re.compile(self.pattern)


# --------------------------------------------------------------------------- parsing

_COMMON = ("name", "from", "unit", "better", "description", "when")
_KEYS = {
    "prometheus": _COMMON + ("metric", "kind", "labels"),
    "server_info": _COMMON + ("field",),
    "response": _COMMON + ("field",),
    "log": _COMMON + ("pattern", "reduce"),
}

_DEFAULT_UNITS = {ACCEPT_LENGTH: "tok/verify"}

# What a prometheus source's number is, by kind (the metric's default description).
_PROMETHEUS_DEFINITIONS = {
    "delta": "{series} from /metrics: its increase between the scrapes just before and just after each "
             "sample window",
    "rate": "{series} from /metrics: its increase between the scrapes just before and just after each sample "
            "window, per second between them (the server's count over the client's window)",
    "gauge": "{series} from /metrics: its value scraped just after each sample window",
}


def _str(d: Mapping, k: str, key: str, *, required: bool = True, default: str | None = None) -> str | None:
    if k not in d:
        if required:
            raise SpecError(f"missing '{k}'", key=f"{key}.{k}")
        return default
    v = d[k]
    if not isinstance(v, str) or not v.strip():
        raise SpecError(f"must be a non-empty string, got {v!r}", key=f"{key}.{k}")
    return v


def parse_source(d: Mapping, key: str) -> MetricSource:
    """One ``engine.metrics`` entry -> a MetricSource; SpecError(key=...) on bad input."""
    if not isinstance(d, Mapping):
        raise SpecError(f"a metric source must be a mapping with name, from and better, got {d!r}", key=key)
    kind = d.get("from")
    if kind not in _KEYS:
        raise SpecError(f"unknown source {kind!r}; 'from' must be one of: {', '.join(_KEYS)}", key=f"{key}.from")
    unknown = sorted(set(map(str, d)) - set(_KEYS[kind]))
    if unknown:
        raise SpecError(f"unknown key(s) {', '.join(unknown)} for a {kind} source; allowed: "
                        f"{', '.join(_KEYS[kind])}", key=f"{key}.{unknown[0]}")
    name = _str(d, "name", key)
    if not _NAME.fullmatch(name):
        raise SpecError(f"metric name {name!r} must start with a letter or '_' and contain no spaces",
                        key=f"{key}.name")
    better_raw = d.get("better")
    try:
        better = Better(better_raw)
    except ValueError:
        raise SpecError(f"'better' must be 'higher' or 'lower' (the direction is never guessed from a name), "
                        f"got {better_raw!r}", key=f"{key}.better") from None
    description = _str(d, "description", key, required=False, default="")
    source = _parse_kind(d, key, kind, name, better, description)
    when = d.get("when")
    if when is None:
        return source
    if not isinstance(when, Mapping) or not when or not all(
            isinstance(v, (str, int, float, bool)) for v in when.values()):
        raise SpecError(f"'when' must map flag names to a value (or true: the flag is set, false: it is not), "
                        f"e.g. when: {{speculative-algorithm: true}}; got {when!r}", key=f"{key}.when")
    return dataclasses.replace(source, when={str(k): v for k, v in when.items()})


def applicable(sources: Sequence["MetricSource"], flags: Mapping[str, Any],
               canonical=lambda name: name.lstrip("-")) -> tuple[tuple["MetricSource", ...], tuple["MetricSource", ...]]:
    """(sources that apply to a config with ``flags``, sources whose ``when`` excludes it)."""
    yes = tuple(s for s in sources if s.applies(flags, canonical))
    return yes, tuple(s for s in sources if s not in yes)


def _parse_kind(d: Mapping, key: str, kind: str, name: str, better: Better, description: str) -> MetricSource:
    if kind == "prometheus":
        series = _str(d, "metric", key)
        pkind = d.get("kind", "delta")
        if pkind not in PROMETHEUS_KINDS:
            raise SpecError(f"unknown kind {pkind!r}; one of: {', '.join(PROMETHEUS_KINDS)}", key=f"{key}.kind")
        labels = d.get("labels") or {}
        if not isinstance(labels, Mapping) or not all(
                isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in labels.values()):
            raise SpecError(f"'labels' must map label names to values, got {labels!r}", key=f"{key}.labels")
        default_unit = "1/s" if pkind == "rate" else ""
        unit = _str(d, "unit", key, required=False, default=default_unit)
        metric = Metric(name, unit, better, description or _PROMETHEUS_DEFINITIONS[pkind].format(series=series))
        return PrometheusSource(metric=metric, series=series, kind=pkind,
                                labels={str(k): str(v) for k, v in labels.items()})
    if kind == "log":
        pattern = _str(d, "pattern", key)
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise SpecError(f"invalid regular expression {pattern!r}: {exc}", key=f"{key}.pattern") from None
        if "value" not in rx.groupindex:
            raise SpecError(f"pattern {pattern!r} has no named group 'value'; write e.g. "
                            "'Target verify: (?P<value>[0-9.]+) ms'", key=f"{key}.pattern")
        reduce = d.get("reduce", "mean")
        if reduce not in LOG_REDUCERS:
            raise SpecError(f"unknown reduce {reduce!r}; one of: {', '.join(LOG_REDUCERS)}", key=f"{key}.reduce")
        unit = _str(d, "unit", key, required=False, default="lines" if reduce == "count" else "")
        metric = Metric(name, unit, better, description or f"log lines matching {pattern!r} ({reduce})")
        return LogSource(metric=metric, pattern=pattern, reduce=reduce)
    fld = _str(d, "field", key)
    unit = _str(d, "unit", key, required=False, default=_DEFAULT_UNITS.get(fld, ""))
    if kind == "server_info":
        return ServerInfoSource(metric=Metric(name, unit, better, description or f"server info field {fld}"),
                                field=fld)
    return ResponseSource(metric=Metric(name, unit, better, description or f"response field {fld}, mean "
                                        "over a sample's requests"), field=fld)


# --------------------------------------------------------------------------- reading values

_MISSING = object()


def lookup(obj: Any, path: str) -> Any:
    """The value at a dotted path (``a.b.0.c``) in nested dicts and lists, or a
    ``KeyError`` naming the first missing part. An exact key containing dots wins."""
    if isinstance(obj, Mapping) and path in obj:
        return obj[path]
    cur = obj
    for part in path.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, (list, tuple)) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise KeyError(part)
    return cur


def _as_float(v: Any) -> float:
    """A JSON value as a float; bools count 1/0; ValueError when not numeric."""
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        f = float(v)
    elif isinstance(v, str):
        f = float(v.strip())
    else:
        raise ValueError(f"{v!r} is not a number")
    if math.isnan(f):
        raise ValueError("NaN")
    return f


def _response_field(resp: Mapping, path: str) -> Any:
    for candidate in (path, f"meta_info.{path}"):
        try:
            return lookup(resp, candidate)
        except KeyError:
            continue
    return _MISSING


def _parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def _select(samples, source: PrometheusSource) -> float | None:
    """Sum of the samples named ``series`` (or ``series_total``) whose labels
    include ``source.labels``; None when no sample matches."""
    for name in (source.series, source.series + "_total"):
        vals = [v for n, labels, v in samples if n == name
                and all(labels.get(k) == want for k, want in source.labels.items())]
        if vals:
            return math.fsum(vals)
    return None


class SourceCollector:
    """Collects every declared source over the sample windows of one boot.

    ``base_url`` is the server's root (``http://127.0.0.1:30000``); ``log_path``
    the boot's log file (stdout and stderr of the server). ``server_info`` is the
    server-info JSON when the caller already fetched it, used as is when no
    ``server_info_paths`` are given; with paths, server info is read again from
    them (first that answers 200 with JSON) at the end of every window in which a
    server_info source needs it. Network and file errors never raise: they become
    problems, reported by ``problems()`` and recorded with the boot.
    """

    def __init__(self, sources: Sequence[MetricSource], base_url: str, log_path: str | Path | None, *,
                 server_info: Mapping | None = None, server_info_paths: Sequence[str] = (),
                 metrics_path: str = "/metrics", timeout_s: float = 10.0, client=None,
                 headers: Mapping[str, str] | None = None):
        self.sources = tuple(sources)
        self.base_url = base_url.rstrip("/")
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
        self._before: list | None = None
        self._before_error: str | None = None
        self._t_begin = 0.0
        self._in_sample = False

    # --- plumbing

    def _get(self, path: str):
        import httpx

        if self._client is not None:
            return self._client.get(self.base_url + path, timeout=self.timeout_s, headers=self._headers)
        return httpx.get(self.base_url + path, timeout=self.timeout_s, headers=self._headers, trust_env=False)

    def _scrape(self) -> tuple[list | None, str | None]:
        try:
            resp = self._get(self.metrics_path)
        except Exception as exc:  # any transport failure is a problem, not a crash
            return None, f"GET {self.metrics_path} failed: {type(exc).__name__}: {exc}"
        if resp.status_code != 200:
            return None, (f"GET {self.metrics_path} answered HTTP {resp.status_code} (SGLang serves /metrics "
                          "only with --enable-metrics)")
        try:
            return _parse_prometheus(resp.text), None
        except Exception as exc:
            return None, f"could not parse {self.metrics_path}: {exc}"

    def _fetch_server_info(self, fresh: bool = False) -> tuple[Mapping | None, str]:
        if self._server_info is not None and not (fresh and self._server_info_paths):
            return self._server_info, ""
        if not self._server_info_paths:
            return None, "no server-info path is configured (engine.server_info)"
        tried = []
        for path in self._server_info_paths:
            try:
                resp = self._get(path)
                if resp.status_code == 200:
                    data = resp.json()
                    if isinstance(data, Mapping):
                        self._server_info = data
                        return data, ""
                tried.append(f"{path}: HTTP {resp.status_code}")
            except Exception as exc:
                tried.append(f"{path}: {type(exc).__name__}")
        return None, "no server-info path answered with JSON (" + "; ".join(tried) + ")"

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

    def _miss(self, source: MetricSource, why: str) -> None:
        self._misses[source.name].append(why)

    # --- the sample window

    def begin_sample(self) -> None:
        """Mark the start of a sample window: scrape counters, note the log's end."""
        self._in_sample = True
        self._log_offset = self._log_size()
        if any(isinstance(s, PrometheusSource) for s in self.sources):
            self._before, self._before_error = self._scrape()
        self._t_begin = time.monotonic()

    def end_sample(self, responses: Sequence[Mapping], duration_s: float) -> dict[str, float]:
        """Close the window; one float per source that produced a value.

        ``responses`` are the window's per-request response JSON objects (for a
        stream, the merged final object); ``duration_s`` is the client's sample
        window, used for ``rate`` when the scrape timing is unavailable.
        """
        if not self._in_sample:
            raise RuntimeError("end_sample() without begin_sample()")
        self._in_sample = False
        self._samples += 1
        elapsed = time.monotonic() - self._t_begin
        out: dict[str, float] = {}
        after, after_error = (None, None)
        if any(isinstance(s, PrometheusSource) for s in self.sources):
            after, after_error = self._scrape()
        lines, log_error = (None, None)
        if any(isinstance(s, LogSource) for s in self.sources):
            lines, log_error = self._new_log_lines()
        info = info_error = None
        if any(isinstance(s, ServerInfoSource) for s in self.sources):
            # read at the end of this window: a field the server updates while serving
            # (SGLang's internal_states[].avg_spec_accept_length) then describes it
            info, info_error = self._fetch_server_info(fresh=True)
        for s in self.sources:
            if isinstance(s, PrometheusSource):
                value = self._prometheus(s, after, after_error, elapsed if elapsed > 0 else duration_s)
            elif isinstance(s, ServerInfoSource):
                value = self._server_info_value(s, info, info_error)
            elif isinstance(s, ResponseSource):
                value = self._response_value(s, responses)
            else:
                value = self._log_value(s, lines, log_error)
            if value is not None:
                out[s.name] = value
        return out

    def _prometheus(self, s: PrometheusSource, after, after_error, elapsed: float) -> float | None:
        if after is None:
            self._miss(s, after_error or "scrape failed")
            return None
        end = _select(after, s)
        where = s.series + (f"{dict(s.labels)}" if s.labels else "")
        if end is None:
            self._miss(s, f"metric {where} is absent from {self.metrics_path}")
            return None
        if s.kind == "gauge":
            return end
        if self._before is None:
            self._miss(s, self._before_error or "no scrape before the sample")
            return None
        start = _select(self._before, s)
        # A labelled counter appears on first increment: absent before means 0.
        delta = end - (start if start is not None else 0.0)
        if delta < 0:
            self._miss(s, f"counter {where} went down ({start} -> {end}): the server restarted or it is not "
                          "a counter; use kind: gauge")
            return None
        if s.kind == "delta":
            return delta
        if elapsed <= 0:
            self._miss(s, "the sample window has no duration")
            return None
        return delta / elapsed

    def _server_info_value(self, s: ServerInfoSource, info, why) -> float | None:
        if info is None:
            self._miss(s, why)
            return None
        try:
            return _as_float(lookup(info, s.field))
        except KeyError as exc:
            self._miss(s, f"field {s.field!r} is not in the server info (missing part {exc.args[0]!r})")
        except ValueError as exc:
            self._miss(s, f"field {s.field!r} is not numeric: {exc}")
        return None

    def _response_value(self, s: ResponseSource, responses: Sequence[Mapping]) -> float | None:
        if not responses:
            self._miss(s, "the sample had no responses")
            return None
        if s.field == ACCEPT_LENGTH:
            return self._accept_length(s, responses)
        values, missing, bad = [], 0, []
        for r in responses:
            v = _response_field(r, s.field)
            if v is _MISSING:
                missing += 1
                continue
            try:
                values.append(_as_float(v))
            except ValueError:
                bad.append(v)
        if missing or bad:
            self._miss(s, f"field {s.field!r} missing in {missing} and not numeric in {len(bad)} of "
                          f"{len(responses)} responses")
        if not values:
            return None
        return math.fsum(values) / len(values)

    def _accept_length(self, s: ResponseSource, responses: Sequence[Mapping]) -> float | None:
        tokens = verifies = 0.0
        missing = 0
        for r in responses:
            ct = _response_field(r, "spec_verify_ct")
            n = _response_field(r, "completion_tokens")
            if n is _MISSING:
                n = _response_field(r, "usage.completion_tokens")
            try:
                ct_f, n_f = _as_float(ct), _as_float(n)
            except ValueError:
                missing += 1
                continue
            tokens += n_f
            verifies += ct_f
        if missing:
            self._miss(s, f"{missing} of {len(responses)} responses lack spec_verify_ct or completion_tokens "
                          "(SGLang reports them in meta_info of /generate, with speculative decoding on)")
        if verifies <= 0:
            if not missing:
                self._miss(s, "spec_verify_ct is 0 in every response: speculative decoding did not run")
            return None
        return tokens / verifies

    def _log_value(self, s: LogSource, lines, log_error) -> float | None:
        if lines is None or log_error:
            self._miss(s, log_error or "log not read")
            return None
        rx = s.regex
        values, unparsable = [], 0
        for line in lines:
            m = rx.search(line)
            if not m:
                continue
            try:
                values.append(_as_float(m.group("value")))
            except (ValueError, TypeError):
                unparsable += 1
        self._hits[s.name] += len(values)
        if unparsable:
            self._miss(s, f"{unparsable} matching line(s) had a 'value' that is not a number")
        if s.reduce == "count":
            return float(len(values))
        if not values:
            self._miss(s, f"no new line of {self.log_path.name if self.log_path else 'the log'} matched "
                          f"{s.pattern!r}")
            return None
        if s.reduce == "mean":
            return math.fsum(values) / len(values)
        if s.reduce == "median":
            return float(statistics.median(values))
        if s.reduce == "last":
            return values[-1]
        if s.reduce == "sum":
            return math.fsum(values)
        if s.reduce == "min":
            return min(values)
        return max(values)

    # --- reporting

    def problems(self) -> list[str]:
        """One message per source that failed to yield a value in some sample,
        plus ``count`` log sources that never matched a line in the whole boot
        (a count of zero is a measurement; a pattern that never matches is a bug)."""
        out = []
        for s in self.sources:
            misses = self._misses[s.name]
            if misses:
                reasons = list(dict.fromkeys(misses))
                out.append(f"{s.describe()}: {len(misses)} problem(s) over {self._samples} sample(s): "
                           + "; ".join(reasons[:3]) + (" ..." if len(reasons) > 3 else ""))
            elif (isinstance(s, LogSource) and s.reduce == "count" and self._samples
                  and self._hits[s.name] == 0):
                out.append(f"{s.describe()}: pattern {s.pattern!r} matched no log line in {self._samples} "
                           "sample(s); check the pattern against the server's log")
        return out
