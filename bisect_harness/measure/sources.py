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
  With ``chunk: last`` the field is looked up in the last JSON chunk of each
  request's stream instead (vLLM 0.33's final usage chunk carries
  ``metrics.speculative_decoding.mean_acceptance_length``), averaged the same way.
* ``log``: a regex with a named group ``value`` applied to the lines the boot's
  log gained during the window, reduced by ``reduce`` (mean, median, last,
  count, sum, min, max; default mean).
* ``derived``: ``ratio: [a, b]`` (a / b) or ``difference: [a, b]`` (a - b) of two
  other sources' values in the same window, times ``scale``, plus ``offset``;
  collected after them, e.g. verify milliseconds per cycle from a seconds
  counter and a passes counter, or vLLM's acceptance length from two counters.

Each kind is a small class registered by ``from:`` name (:func:`register_source`):
it parses and validates its own YAML entry (``from_entry``), describes itself in
one line (``describe``, printed by the dry-run) and reads its value from one
sample window (``collect``). An unknown ``from:`` is a SpecError listing the
known kinds; there is no default kind.

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
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

from bisect_harness.kinds import Registry
from bisect_harness.errors import SpecError
from bisect_harness.model import Better, Limits, Metric
from bisect_harness.measure.bodies import UnreadableBody, decoded
from bisect_harness.measure.jsonpath import lookup

__all__ = [
    "Body",
    "BodyTooLarge",
    "MAX_BODY_BYTES",
    "bounded_get",
    "bounded_request",
    "MetricSource",
    "PrometheusSource",
    "ServerInfoSource",
    "ResponseSource",
    "LastChunkSource",
    "LogSource",
    "DerivedSource",
    "SampleWindow",
    "SourceCollector",
    "parse_source",
    "register_source",
    "resolve_derived",
    "source_kinds",
    "lookup",
    "applicable",
    "ACCEPT_LENGTH",
]

ACCEPT_LENGTH = "accept_length"
PROMETHEUS_KINDS = ("delta", "rate", "gauge")
RESPONSE_CHUNKS = ("merged", "last")
LOG_REDUCERS = ("mean", "median", "last", "count", "sum", "min", "max")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]*")

#: Keys every source kind accepts; each kind adds its own (``MetricSource.keys``).
_COMMON = ("name", "from", "unit", "better", "description", "when")

#: ``from:`` name -> source class, filled by :func:`register_source` as each class is defined.
SOURCE_KINDS: Registry[type["MetricSource"]] = Registry("metric source kind", name_of=attrgetter("kind_name"))


def register_source(cls: type["MetricSource"]) -> type["MetricSource"]:
    """Class decorator: make ``cls`` the source for ``from: <cls.kind_name>``."""
    return SOURCE_KINDS.add(cls)


def source_kinds() -> tuple[str, ...]:
    """The registered ``from:`` names, in the order they were defined."""
    return SOURCE_KINDS.names()


@dataclass(frozen=True)
class MetricSource:
    """Base of the source kinds; ``metric`` is what hypotheses name.

    A kind sets ``kind_name`` (its ``from:``) and ``keys`` (the YAML keys it adds to
    the common ones), and implements ``from_entry`` (parse and validate an entry),
    ``how`` (what it reads, for :meth:`describe`) and ``collect`` (its value for one
    sample window). Instances are frozen, plain data: they pickle, so they travel
    inside a boot request to another host.
    """

    metric: Metric
    # not in repr: engine_fingerprint hashes the sources' repr, and `when` does not change a value
    when: Mapping[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    kind_name: ClassVar[str] = ""
    keys: ClassVar[tuple[str, ...]] = ()
    #: True when the value comes from each request's response JSON, which only the
    #: harness's own client hands back (not an engine's benchmark tool).
    reads_responses: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return self.metric.name

    @property
    def label(self) -> str:
        """``log source 'verify_ms'``: how messages about this source name it."""
        return f"{self.kind_name} source '{self.name}'"

    # --- parsing

    @classmethod
    def from_entry(cls, d: Mapping, key: str, name: str, better: Better, description: str) -> "MetricSource":
        """This kind's source from an ``engine.metrics`` entry whose common keys are
        already checked; SpecError(key=...) naming the key on bad input."""
        raise NotImplementedError

    # --- describing

    def how(self) -> str:
        """What this source reads, in a few words."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line: the source, what it reads, its unit and direction, where it applies."""
        unit = f" [{self.metric.unit}]" if self.metric.unit else ""
        when = ", only where " + ", ".join(f"{k}={v}" for k, v in self.when.items()) if self.when else ""
        return f"{self.label}: {self.how()}{unit}, {self.metric.better.value} is better{when}"

    # --- collecting

    def before_window(self, window: "SampleWindow") -> None:
        """Called when a sample window opens (a counter is scraped here)."""

    def collect(self, window: "SampleWindow") -> float | None:
        """This source's value for the window that just closed, or None after
        ``window.miss(self, why)``."""
        raise NotImplementedError

    def boot_problem(self, samples: int, hits: int) -> str | None:
        """A problem over the whole boot that no single window shows (``hits``: what
        ``window.hit`` counted); None when there is none."""
        return None

    def applies(self, flags: Mapping[str, Any], canonical=lambda name: name.lstrip("-")) -> bool:
        """Does this source apply to a config with ``flags``? ``canonical`` maps a
        flag name to the engine's spelling (``presets.canonical_flag``), so ``tp``
        and ``tp-size`` are one flag."""
        from bisect_harness.observe.provenance import values_equal

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


@register_source
@dataclass(frozen=True)
class PrometheusSource(MetricSource):
    """A counter or gauge from ``/metrics``, summed over the label sets that match."""

    series: str = ""
    kind: str = "delta"
    labels: Mapping[str, str] = field(default_factory=dict)
    kind_name: ClassVar[str] = "prometheus"
    keys: ClassVar[tuple[str, ...]] = ("metric", "kind", "labels")

    @classmethod
    def from_entry(cls, d, key, name, better, description):
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
        return cls(metric=metric, series=series, kind=pkind, labels={str(k): str(v) for k, v in labels.items()})

    def how(self) -> str:
        where = self.series + ("{" + ",".join(f"{k}={v}" for k, v in self.labels.items()) + "}"
                               if self.labels else "")
        what = {"delta": "increase of", "rate": "increase per second of", "gauge": "value of"}[self.kind]
        return f"{what} {where} in /metrics over each sample window"

    def before_window(self, window):
        window.scrape_before()

    def collect(self, window):
        after, after_error = window.scrape_after()
        if after is None:
            window.miss(self, after_error or "scrape failed")
            return None
        end = _select(after, self)
        where = self.series + (f"{dict(self.labels)}" if self.labels else "")
        if end is None:
            window.miss(self, f"metric {where} is absent from {window.metrics_path}")
            return None
        if self.kind == "gauge":
            return end
        before, before_error = window.scrape_before()
        if before is None:
            window.miss(self, before_error or "no scrape before the sample")
            return None
        start = _select(before, self)
        # A labelled counter appears on first increment: absent before means 0.
        delta = end - (start if start is not None else 0.0)
        if delta < 0:
            window.miss(self, f"counter {where} went down ({start} -> {end}): the server restarted or it is not "
                              "a counter; use kind: gauge")
            return None
        if self.kind == "delta":
            return delta
        elapsed = window.seconds
        if elapsed <= 0:
            window.miss(self, "the sample window has no duration")
            return None
        return delta / elapsed


@register_source
@dataclass(frozen=True)
class ServerInfoSource(MetricSource):
    """A field of the server-info JSON, read at the end of each sample window."""

    field: str = ""
    kind_name: ClassVar[str] = "server_info"
    keys: ClassVar[tuple[str, ...]] = ("field",)

    @classmethod
    def from_entry(cls, d, key, name, better, description):
        fld = _str(d, "field", key)
        unit = _str(d, "unit", key, required=False, default=_DEFAULT_UNITS.get(fld, ""))
        return cls(metric=Metric(name, unit, better, description or f"server info field {fld}"), field=fld)

    def how(self) -> str:
        return f"field {self.field} of the server info, read at the end of each sample window"

    def collect(self, window):
        info, why = window.server_info()
        if info is None:
            window.miss(self, why)
            return None
        try:
            return _as_float(lookup(info, self.field))
        except KeyError as exc:
            window.miss(self, f"field {self.field!r} is not in the server info (missing part {exc.args[0]!r})")
        except ValueError as exc:
            window.miss(self, f"field {self.field!r} is not numeric: {exc}")
        return None


@register_source
@dataclass(frozen=True)
class ResponseSource(MetricSource):
    """A field of each request's response JSON, averaged over the window's requests."""

    field: str = ""
    kind_name: ClassVar[str] = "response"
    keys: ClassVar[tuple[str, ...]] = ("field", "chunk")
    reads_responses: ClassVar[bool] = True

    @classmethod
    def from_entry(cls, d, key, name, better, description):
        fld = _str(d, "field", key)
        chunk = d.get("chunk", "merged")
        if chunk not in RESPONSE_CHUNKS:
            raise SpecError(f"unknown chunk {chunk!r}; one of: {', '.join(RESPONSE_CHUNKS)} (merged: the fields "
                            "the client keeps of each response, meta_info and usage; last: the last JSON chunk "
                            "of each request's stream)", key=f"{key}.chunk")
        if chunk == "last":
            if fld == ACCEPT_LENGTH:
                raise SpecError(f"field {ACCEPT_LENGTH} is derived from the merged response fields, not read from "
                                "a chunk; drop 'chunk: last', or name the chunk's own field, e.g. "
                                "metrics.speculative_decoding.mean_acceptance_length (vLLM)", key=f"{key}.field")
            unit = _str(d, "unit", key, required=False, default="")
            return LastChunkSource(metric=Metric(name, unit, better, description or f"field {fld} of the last "
                                                 "chunk of each request's stream, mean over a sample's requests"),
                                   field=fld)
        unit = _str(d, "unit", key, required=False, default=_DEFAULT_UNITS.get(fld, ""))
        return cls(metric=Metric(name, unit, better, description or f"response field {fld}, mean "
                                 "over a sample's requests"), field=fld)

    def how(self) -> str:
        if self.field == ACCEPT_LENGTH:
            return ("completion tokens per verify cycle (sum of completion_tokens over sum of spec_verify_ct) "
                    "of each sample window's responses")
        return f"field {self.field} of each response (or its meta_info), mean over each sample window"

    def collect(self, window):
        responses = window.responses
        if not responses:
            window.miss(self, "the sample had no responses")
            return None
        if self.field == ACCEPT_LENGTH:
            return self._accept_length(window, responses)
        return self._mean(window, [_response_field(r, self.field) for r in responses], "responses")

    def _mean(self, window, found: Sequence[Any], where: str) -> float | None:
        """Mean of the values found (``_MISSING`` where a request had none); a miss
        saying how many were missing or not numeric."""
        values, missing, bad = [], 0, 0
        for v in found:
            if v is _MISSING:
                missing += 1
                continue
            try:
                values.append(_as_float(v))
            except ValueError:
                bad += 1
        if missing or bad:
            window.miss(self, f"field {self.field!r} missing in {missing} and not numeric in {bad} of "
                              f"{len(found)} {where}")
        if not values:
            return None
        return math.fsum(values) / len(values)

    def _accept_length(self, window, responses: Sequence[Mapping]) -> float | None:
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
            window.miss(self, f"{missing} of {len(responses)} responses lack spec_verify_ct or completion_tokens "
                              "(SGLang reports them in meta_info of /generate, with speculative decoding on)")
        if verifies <= 0:
            if not missing:
                window.miss(self, "spec_verify_ct is 0 in every response: speculative decoding did not run")
            return None
        return tokens / verifies


@dataclass(frozen=True)
class LastChunkSource(ResponseSource):
    """``from: response, chunk: last``: a field (dotted path) of the last JSON chunk
    of each request's stream, averaged over the window's requests.

    A class of its own (not a ``chunk`` field) so a merged source's repr, which
    ``plan.engine_fingerprint`` hashes, stays what it was; this one's differs.
    """

    def how(self) -> str:
        return f"field {self.field} of the last chunk of each request's stream, mean over each sample window"

    def collect(self, window):
        chunks = window.last_chunks
        if not chunks:
            window.miss(self, "the sample had no responses")
            return None
        found = []
        for chunk in chunks:
            try:
                found.append(lookup(chunk, self.field))
            except KeyError:
                found.append(_MISSING)
        note = window.note("last_chunk")
        return self._mean(window, found, "last chunks" + (f" ({note})" if note else ""))


_REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "mean": lambda v: math.fsum(v) / len(v),
    "median": lambda v: float(statistics.median(v)),
    "last": lambda v: v[-1],
    "sum": math.fsum,
    "min": min,
    "max": max,
}


@register_source
@dataclass(frozen=True)
class LogSource(MetricSource):
    """A regex with a named group ``value`` over the lines the boot's log gained
    during the window, reduced to one number."""

    pattern: str = ""
    reduce: str = "mean"
    kind_name: ClassVar[str] = "log"
    keys: ClassVar[tuple[str, ...]] = ("pattern", "reduce")

    @property
    def regex(self) -> re.Pattern:
        return re.compile(self.pattern)

    @classmethod
    def from_entry(cls, d, key, name, better, description):
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
        return cls(metric=metric, pattern=pattern, reduce=reduce)

    def how(self) -> str:
        what = "count of" if self.reduce == "count" else f"{self.reduce} 'value' of"
        return f"{what} the server log's new lines matching /{self.pattern}/ in each sample window"

    def collect(self, window):
        lines, log_error = window.log_lines()
        if lines is None or log_error:
            window.miss(self, log_error or "log not read")
            return None
        rx = self.regex
        values, unparsable = [], 0
        for line in lines:
            m = rx.search(line)
            if not m:
                continue
            try:
                values.append(_as_float(m.group("value")))
            except (ValueError, TypeError):
                unparsable += 1
        window.hit(self, len(values))
        if unparsable:
            window.miss(self, f"{unparsable} matching line(s) had a 'value' that is not a number")
        if self.reduce == "count":
            return float(len(values))
        if not values:
            window.miss(self, f"no new line of {window.log_name} matched {self.pattern!r}")
            return None
        return _REDUCERS[self.reduce](values)

    def boot_problem(self, samples, hits):
        # a count of zero is a measurement; a pattern that never matches in a whole boot is a bug
        if self.reduce == "count" and samples and hits == 0:
            return (f"pattern {self.pattern!r} matched no log line in {samples} sample(s); check the pattern "
                    "against the server's log")
        return None


DERIVED_OPS = ("ratio", "difference")


@register_source
@dataclass(frozen=True)
class DerivedSource(MetricSource):
    """A metric computed from two other declared sources' values in the same
    sample window: ``ratio: [a, b]`` is ``a / b``, ``difference: [a, b]`` is
    ``a - b``; then times ``scale`` (default 1) plus ``offset`` (default 0).

    vLLM's mean acceptance length, as vLLM itself defines it
    (``vllm/v1/spec_decode/metrics.py``: ``1 + num_accepted_tokens / num_drafts``),
    from the deltas of its two counters over the window::

        - {name: accepted, from: prometheus, metric: "vllm:spec_decode_num_accepted_tokens", better: higher}
        - {name: drafts, from: prometheus, metric: "vllm:spec_decode_num_drafts", better: higher}
        - {name: acceptance_length, from: derived, ratio: [accepted, drafts], offset: 1,
           unit: tok/draft, better: higher}

    Collected after the sources it names (:class:`SourceCollector` orders them);
    an input without a value in the window is a miss naming it, and so is a
    division by zero: never an infinity. The names are checked when the file is
    loaded (:func:`resolve_derived`): each must be another source of
    ``engine.metrics``, with no cycle.
    """

    op: str = "ratio"
    inputs: tuple[str, ...] = ()
    scale: float = 1.0
    offset: float = 0.0
    kind_name: ClassVar[str] = "derived"
    keys: ClassVar[tuple[str, ...]] = DERIVED_OPS + ("scale", "offset")

    @classmethod
    def from_entry(cls, d, key, name, better, description):
        ops = [op for op in DERIVED_OPS if op in d]
        if len(ops) != 1:
            raise SpecError("a derived metric takes exactly one of 'ratio: [a, b]' (a / b) or 'difference: [a, b]' "
                            "(a - b), naming two other metrics of engine.metrics"
                            + (f"; got both {' and '.join(ops)}" if ops else ""), key=f"{key}.{ops[-1] if ops else 'ratio'}")
        op = ops[0]
        pair = d[op]
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(n, str) and n.strip() for n in pair)):
            raise SpecError(f"'{op}' must name two metrics, e.g. {op}: [verify_seconds, verify_passes]; got {pair!r}",
                            key=f"{key}.{op}")
        if pair[0] == pair[1]:
            raise SpecError(f"'{op}' names {pair[0]!r} twice; name two different metrics", key=f"{key}.{op}")
        if name in pair:
            raise SpecError(f"'{op}' names {name!r}, the metric being defined: a metric cannot be derived from "
                            "itself", key=f"{key}.{op}")
        nums = {}
        for k, default in (("scale", 1.0), ("offset", 0.0)):
            v = d.get(k, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SpecError(f"'{k}' must be a number, got {v!r}", key=f"{key}.{k}")
            nums[k] = float(v)
        if nums["scale"] == 0:
            raise SpecError("'scale' of 0 makes every value the same; leave it out (1) or give the factor, e.g. "
                            "scale: 1000 for seconds to milliseconds", key=f"{key}.scale")
        unit = _str(d, "unit", key, required=False, default="")
        src = cls(metric=Metric(name, unit, better, description), op=op, inputs=(str(pair[0]), str(pair[1])),
                  scale=nums["scale"], offset=nums["offset"])
        formula = src.formula()
        return dataclasses.replace(src, metric=Metric(name, unit, better, f"{description}: {formula}" if description
                                                      else formula))

    def formula(self) -> str:
        """``verify_seconds / verify_passes x 1000``, from each sample window's values of the two."""
        a, b = self.inputs
        text = f"{a} / {b}" if self.op == "ratio" else f"{a} - {b}"
        if self.scale != 1:
            text = (f"({text})" if self.op == "difference" else text) + f" x {self.scale:g}"
        if self.offset:
            text = f"{self.offset:g} + {text}" if self.offset > 0 else f"{text} - {-self.offset:g}"
        return f"{text}, from each sample window's values of those sources"

    def how(self) -> str:
        return self.formula()

    def collect(self, window):
        got = [window.values.get(n) for n in self.inputs]
        missing = [n for n, v in zip(self.inputs, got) if v is None]
        if missing:
            collected = {s.name for s in window.sources}
            why = [f"{n!r} " + ("gave no value in this window (see its own problem)" if n in collected
                                else "is not collected in this boot (its 'when' excludes this config)")
                   for n in missing]
            window.miss(self, "input " + "; input ".join(why))
            return None
        a, b = got
        if self.op == "ratio":
            if b == 0:
                window.miss(self, f"{self.inputs[1]} is 0 in this window: {self.inputs[0]} / {self.inputs[1]} "
                                  "is undefined")
                return None
            value = a / b
        else:
            value = a - b
        value = value * self.scale + self.offset
        if not math.isfinite(value):
            window.miss(self, f"{self.formula().split(',')[0]} is not a finite number ({a!r}, {b!r})")
            return None
        return value


def resolve_derived(sources: Sequence[MetricSource], key: str = "engine.metrics") -> tuple[MetricSource, ...]:
    """Check the derived sources among ``sources`` (entry ``i`` at ``key[i]``): each
    names two other declared sources, and no chain of them comes back to itself.
    SpecError(key=...) naming the entry's ``ratio`` / ``difference``.

    Returns the sources, each derived one's definition completed with its inputs'
    (``... ; verify_seconds: <its definition>; ...``), so the journal's line for
    a derived metric says what every number in it is."""
    by_name = {s.name: i for i, s in enumerate(sources)}
    for i, s in enumerate(sources):
        if not isinstance(s, DerivedSource):
            continue
        for n in s.inputs:
            if n not in by_name:
                raise SpecError(f"names {n!r}, which is not a metric of engine.metrics; a derived metric is "
                                "computed from the other declared sources of the same sample window (the "
                                "client's own metrics, like tok_s, are not among them); declared: "
                                + (", ".join(sorted(by_name)) or "none"), key=f"{key}[{i}].{s.op}")

    def cycle_from(start: int) -> list[str] | None:
        path, seen = [sources[start].name], set()

        def walk(name: str) -> list[str] | None:
            src = sources[by_name[name]]
            for n in getattr(src, "inputs", ()):
                if n == path[0]:
                    return path + [n]
                if n in seen or not isinstance(sources[by_name[n]], DerivedSource):
                    continue
                seen.add(n)
                path.append(n)
                found = walk(n)
                if found:
                    return found
                path.pop()
            return None

        return walk(path[0])

    for i, s in enumerate(sources):
        if isinstance(s, DerivedSource):
            loop = cycle_from(i)
            if loop:
                raise SpecError(f"the derived metrics form a cycle: {' -> '.join(loop)}; each must end in "
                                "sources that read the server", key=f"{key}[{i}].{s.op}")
    done: dict[str, MetricSource] = {}
    for s in _collect_order(sources):  # inputs first, so a derived input's definition is already whole
        if isinstance(s, DerivedSource):
            parts = [f"{n}: {done[n].metric.description or done[n].how()}" for n in s.inputs]
            s = dataclasses.replace(s, metric=dataclasses.replace(
                s.metric, description=f"{s.metric.description}; where " + "; ".join(parts)))
        done[s.name] = s
    return tuple(done[s.name] for s in sources)


def _collect_order(sources: Sequence[MetricSource]) -> tuple[MetricSource, ...]:
    """The sources in declared order, each derived one after the sources it names."""
    placed: list[MetricSource] = [s for s in sources if not isinstance(s, DerivedSource)]
    waiting = [s for s in sources if isinstance(s, DerivedSource)]
    present = {s.name for s in sources}
    while waiting:
        done = {s.name for s in placed}
        ready = [s for s in waiting if all(n in done or n not in present for n in s.inputs)]
        if not ready:  # a cycle (refused at load): keep the declared order, the inputs will miss
            ready = waiting[:1]
        placed.extend(ready)
        waiting = [s for s in waiting if s not in ready]
    return tuple(placed)


# --------------------------------------------------------------------------- parsing


def parse_source(d: Mapping, key: str) -> MetricSource:
    """One ``engine.metrics`` entry -> a MetricSource of the kind its ``from:`` names;
    SpecError(key=...) on bad input."""
    if not isinstance(d, Mapping):
        raise SpecError(f"a metric source must be a mapping with name, from and better, got {d!r}", key=key)
    kind = d.get("from")
    cls = SOURCE_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        what = "missing 'from'" if kind is None else f"unknown source {kind!r}"
        raise SpecError(f"{what}; 'from' must be one of: {', '.join(SOURCE_KINDS)} (the kinds of metric "
                        "source this harness knows)", key=f"{key}.from")
    allowed = _COMMON + cls.keys
    unknown = sorted(set(map(str, d)) - set(allowed))
    if unknown:
        raise SpecError(f"unknown key(s) {', '.join(unknown)} for a {kind} source; allowed: "
                        f"{', '.join(allowed)}", key=f"{key}.{unknown[0]}")
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
    source = cls.from_entry(d, key, name, better, description)
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
    yes = [s for s in sources if s.applies(flags, canonical)]
    while True:  # a derived metric applies only where the sources it names are collected
        names = {s.name for s in yes}
        keep = [s for s in yes if not isinstance(s, DerivedSource) or all(n in names for n in s.inputs)]
        if len(keep) == len(yes):
            break
        yes = keep
    return tuple(yes), tuple(s for s in sources if s not in yes)


# --------------------------------------------------------------------------- reading values

_MISSING = object()


#: The most a ``/metrics`` or server-info body may hold once decoded. Real engines send a
#: few hundred KB; a larger body (or a compressed bomb) is a source problem, not a read
#: that takes the harness's memory and minutes of parsing.
MAX_BODY_BYTES = Limits().body_bytes


class BodyTooLarge(Exception):
    """A server's body went past :data:`MAX_BODY_BYTES`."""


@dataclass(frozen=True)
class Body:
    """A response read whole within bounds: its status and bytes."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        import json

        return json.loads(self.content)


def bounded_get(client: Any, url: str, timeout_s: float, headers: Mapping[str, str] | None = None,
                limit: int = MAX_BODY_BYTES) -> Body:
    """GET ``url`` through an httpx client, reading at most ``limit`` decoded bytes
    within ``timeout_s`` in all (httpx's own timeout bounds each read, not the whole
    body). Asks for no compression; a server that compresses anyway is decoded chunk
    by chunk and stopped at the limit. Raises :class:`BodyTooLarge` or
    :class:`TimeoutError` with what happened."""
    return bounded_request(client, "GET", url, timeout_s, headers, limit)


def bounded_request(client: Any, method: str, url: str, timeout_s: float, headers: Mapping[str, str] | None = None,
                    limit: int = MAX_BODY_BYTES, *, json_body: Any = None, chunk: int = 1 << 20) -> Body:
    """:func:`bounded_get` for any method, with an optional JSON body (a profiler's
    ``POST /start_profile``): the answer read within ``limit`` bytes and ``timeout_s``
    in all."""
    deadline = time.monotonic() + timeout_s
    kwargs = {"json": json_body} if json_body is not None else {}
    with client.stream(method, url, timeout=timeout_s,
                       headers={"Accept-Encoding": "identity", **dict(headers or {})}, **kwargs) as resp:
        chunks, size = [], 0
        for piece in decoded(resp, chunk):
            size += len(piece)
            if size > limit:
                raise BodyTooLarge(f"the body of {url} went past {limit:,} bytes; stopped reading")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the body of {url} was not read within {timeout_s:g} s")
            chunks.append(piece)
        return Body(resp.status_code, b"".join(chunks))


def read_server_info(get: Callable[[str], Any], paths: Sequence[str]) -> tuple[Mapping | None, str]:
    """The first of ``paths`` that answers 200 with a JSON object (``get(path)``
    returns an HTTP response), or (None, what each path answered). The one reader
    of server info: the boot's flag check and the metric sources both call it."""
    tried = []
    for path in paths:
        try:
            resp = get(path)
            if resp.status_code == 200:
                data = resp.json()
                if isinstance(data, Mapping):
                    return data, ""
            tried.append(f"{path}: HTTP {resp.status_code}")
        except Exception as exc:  # a hostile or broken server: say what it did, never raise
            tried.append(f"{path}: {type(exc).__name__}" + (f" ({exc})" if isinstance(exc, (BodyTooLarge, UnreadableBody)) else ""))
    return None, "no server-info path answered with JSON (" + "; ".join(tried) + ")"


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


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(sample name, labels, value)`` of a Prometheus text exposition."""
    return _parse_prometheus(text)


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
        """GET ``path`` on the server, read with bounds (:func:`bounded_get`)."""
        import httpx

        if self._client is not None:
            return bounded_get(self._client, self.base_url + path, self.timeout_s, self._headers, self.body_limit)
        with httpx.Client(trust_env=False) as client:
            return bounded_get(client, self.base_url + path, self.timeout_s, self._headers, self.body_limit)

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
        data, why = read_server_info(self._get, self._server_info_paths)
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
