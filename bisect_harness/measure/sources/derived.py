"""``from: derived``: a ratio or difference of two other sources' values in the same
window, collected after them; :func:`resolve_derived` checks their names and cycles
when the file is loaded, and :func:`applicable` says which of a config's sources
apply to it (a derived one only where the sources it names do)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from bisect_harness.errors import SpecError
from bisect_harness.measure.sources.base import MetricSource, _str, register_source
from bisect_harness.model import Metric

__all__ = ["DERIVED_OPS", "DerivedSource", "applicable", "resolve_derived"]

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
