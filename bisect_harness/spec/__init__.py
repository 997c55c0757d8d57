"""The one reader of hypotheses.yaml: the spec's types, its sections' parsers, the
metric definitions, and the JSON Schema.

``load_spec(path)`` reads, validates and freezes a file into a ``Spec``; every error
names the key path and its line. The parts, for a reader of the code:
``spec.reader`` (the YAML with the line of each key, the checks of a value),
``spec.types`` (the frozen dataclasses, with the defaults), ``spec.sections`` (one
parser per section), ``spec.workloads`` (the load curve's keys: the benchmark's
workload, ``sweep``, ``slo``, ``capacity``, and samples sized for their percentiles),
``spec.load`` (the entry points), ``spec.schema`` (the JSON Schema, from the
sections' tables) and ``spec.metric_defs`` (a metric's one-line definition, for the
journal).
"""

from bisect_harness.spec.types import Defaults, HypothesisSpec, Spec
from bisect_harness.spec.load import load_spec, parse_spec
from bisect_harness.spec.reader import effect_value

__all__ = ["Defaults", "HypothesisSpec", "Spec", "effect_value", "load_spec", "parse_spec"]
