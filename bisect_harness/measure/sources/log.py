"""``from: log``: a regex with a named group ``value`` over the lines the boot's log
gained during each sample window, reduced to one number."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Callable, ClassVar

from bisect_harness.errors import SpecError
from bisect_harness.measure.sources.base import MetricSource, _as_float, _str, register_source
from bisect_harness.model import Metric

__all__ = ["LOG_REDUCERS", "LogSource"]

LOG_REDUCERS = ("mean", "median", "last", "count", "sum", "min", "max")

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
