"""The one reader of hypotheses.yaml: the spec's types, its sections' parsers, the metric definitions, and the JSON Schema."""
