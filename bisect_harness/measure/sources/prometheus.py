"""``from: prometheus``: a counter or gauge scraped from ``/metrics`` around each sample
window; and the Prometheus text parser the harness reads every ``/metrics`` with
(:func:`parse_prometheus`: the mechanism check's scrapes too)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

from bisect_harness.errors import SpecError
from bisect_harness.measure.sources.base import MetricSource, _str, register_source
from bisect_harness.model import Metric

__all__ = ["PROMETHEUS_KINDS", "PrometheusSource", "parse_prometheus"]

PROMETHEUS_KINDS = ("delta", "rate", "gauge")

# What a prometheus source's number is, by kind (the metric's default description).
_PROMETHEUS_DEFINITIONS = {
    "delta": "{series} from /metrics: its increase between the scrapes just before and just after each "
             "sample window",
    "rate": "{series} from /metrics: its increase between the scrapes just before and just after each sample "
            "window, per second between them (the server's count over the client's window)",
    "gauge": "{series} from /metrics: its value scraped just after each sample window",
}


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


def _select(samples, source: PrometheusSource) -> float | None:
    """Sum of the samples named ``series`` (or ``series_total``) whose labels
    include ``source.labels``; None when no sample matches."""
    for name in (source.series, source.series + "_total"):
        vals = [v for n, labels, v in samples if n == name
                and all(labels.get(k) == want for k, want in source.labels.items())]
        if vals:
            return math.fsum(vals)
    return None


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(sample name, labels, value)`` of a Prometheus text exposition."""
    return _parse_prometheus(text)


def _parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]
