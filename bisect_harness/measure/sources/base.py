"""What a metric source kind is: the base class every ``from:`` kind subclasses, the
registry of kinds, and :func:`parse_source`, which reads an ``engine.metrics`` entry
as the kind its ``from:`` names.

A kind is one class in a module of its own beside this one (``prometheus``,
``server_info``, ``response``, ``log``, ``derived``), registered by
:func:`register_source` where it is defined; the package's ``__init__`` imports them
in the order ``from:`` lists them. Adding a kind is one new module and its import
there.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar, Mapping

from bisect_harness.kinds import Registry
from bisect_harness.errors import SpecError
from bisect_harness.measure.values import values_equal
from bisect_harness.model import Better, Metric

__all__ = ["ACCEPT_LENGTH", "MetricSource", "SOURCE_KINDS", "parse_source", "register_source", "source_kinds"]

ACCEPT_LENGTH = "accept_length"
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


# ``SampleWindow`` in the annotations below is ``collector.SampleWindow``, not imported:
# the collector imports this module.
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


def _str(d: Mapping, k: str, key: str, *, required: bool = True, default: str | None = None) -> str | None:
    if k not in d:
        if required:
            raise SpecError(f"missing '{k}'", key=f"{key}.{k}")
        return default
    v = d[k]
    if not isinstance(v, str) or not v.strip():
        raise SpecError(f"must be a non-empty string, got {v!r}", key=f"{key}.{k}")
    return v


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
