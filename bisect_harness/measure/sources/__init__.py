"""Declared metric sources: numbers a server exposes besides the client's timings.

Each entry of ``engine.metrics`` in a hypotheses file becomes a ``MetricSource``
with a ``Metric`` (name, unit, direction) that hypotheses may name. A
``SourceCollector`` (:mod:`.collector`) turns each sample window of a boot into one
float per source. The package: :mod:`.base` (the class every kind subclasses, the
registry, :func:`parse_source`), a module per kind, named by its ``from:``, and
:mod:`.collector`; the names below are its public face.

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

# The kinds, in the order ``from:`` lists them: each registers itself as it is imported.
from bisect_harness.measure.sources.base import (  # noqa: F401 (SOURCE_KINDS: the registry, read by name)
    ACCEPT_LENGTH, SOURCE_KINDS, MetricSource, parse_source, register_source, source_kinds,
)
from bisect_harness.measure.sources.prometheus import PrometheusSource
from bisect_harness.measure.sources.server_info import ServerInfoSource
from bisect_harness.measure.sources.response import LastChunkSource, ResponseSource
from bisect_harness.measure.sources.log import LogSource
from bisect_harness.measure.sources.derived import DerivedSource, applicable, resolve_derived
from bisect_harness.measure.sources.collector import SampleWindow, SourceCollector

__all__ = [
    "MetricSource", "PrometheusSource", "ServerInfoSource", "ResponseSource", "LastChunkSource", "LogSource",
    "DerivedSource", "SampleWindow", "SourceCollector", "parse_source", "register_source", "resolve_derived",
    "source_kinds", "applicable", "ACCEPT_LENGTH",
]
