"""One sentence per metric: what its number is, for the journal.

A metric's definition is its ``Metric.description`` (with unit and direction).
A hypothesis row stores the definition it was measured under
(``hypotheses.spec["metric_def"]``); for older rows and for bisections the
definition is looked up again: the client's metrics from ``CLIENT_METRICS``, a
declared source from the ``engine.metrics`` entry of the run's own hypotheses
file. The same name never gets two meanings in one journal.

>>> definition_line("tok_s", None, "")[:40]
'`tok_s` (tok/s, higher is better): end-t'
"""

from __future__ import annotations

from typing import Any, Mapping

import yaml

from bisect_harness.errors import SpecError, UserError
from bisect_harness.model import CLIENT_METRICS, Metric
from bisect_harness.measure.sources import parse_source, resolve_derived

__all__ = ["declared_metrics", "definition_line", "lookup_metric"]


def lookup_metric(name: str, spec_text: str) -> Metric | None:
    """The client's metric ``name``, or the one declared under ``engine.metrics`` of
    ``spec_text``; None when neither defines it (or the text cannot be read)."""
    if name in CLIENT_METRICS:
        return CLIENT_METRICS[name]
    return declared_metrics(spec_text).get(name)


def declared_metrics(spec_text: str) -> dict[str, Metric]:
    """The metrics ``engine.metrics`` of ``spec_text`` declares, by name in the order
    written, then its preset's own (``Preset.sources``); an entry that does not parse is
    left out (and so is every entry when the text cannot be read)."""
    try:
        doc = yaml.safe_load(spec_text or "")
    except yaml.YAMLError:
        return {}
    engine = doc.get("engine") if isinstance(doc, Mapping) else None
    entries = engine.get("metrics") if isinstance(engine, Mapping) else None
    parsed = []
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        try:
            parsed.append(parse_source(entry, f"engine.metrics[{i}]"))
        except SpecError:
            continue
    try:  # a derived metric's definition names its inputs' (sources.resolve_derived)
        parsed = list(resolve_derived(parsed))
    except SpecError:
        pass
    try:  # the preset's own sources (vLLM's prefix-cache counters), where the file names a known preset
        from bisect_harness.engines.presets import get_preset

        parsed = list(get_preset(str(engine.get("preset", "openai"))).metric_sources(parsed))
    except UserError:
        pass
    return {s.name: s.metric for s in parsed}


def definition_line(name: str, stored: Mapping[str, Any] | None, spec_text: str) -> str:
    """``name`` with its unit, direction and definition, as one markdown sentence.

    ``stored`` is the definition recorded with the hypothesis (keys ``unit``,
    ``better``, ``description``), preferred over a fresh lookup."""
    if stored and stored.get("description"):
        unit, better, text = stored.get("unit") or "", stored.get("better") or "", stored["description"]
    else:
        metric = lookup_metric(name, spec_text)
        if metric is None:
            return f"`{name}`: no definition recorded (see the hypotheses file below)"
        unit, better, text = metric.unit, metric.better.value, metric.description or "no description given"
    head = ", ".join(x for x in (unit, f"{better} is better" if better else "") if x)
    return f"`{name}` ({head}): {text}" if head else f"`{name}`: {text}"
