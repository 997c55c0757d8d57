"""``from: server_info``: a field of the server-info JSON, read again at the end of
every sample window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from bisect_harness.measure.sources.base import _DEFAULT_UNITS, MetricSource, _as_float, _str, register_source
from bisect_harness.measure.values import lookup
from bisect_harness.model import Metric

__all__ = ["ServerInfoSource"]


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
