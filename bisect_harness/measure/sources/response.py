"""``from: response``: a field of each request's response JSON (or, with ``chunk: last``,
of the last JSON chunk of its stream), averaged over the window's requests; and
``accept_length``, completion tokens per verify cycle, derived from SGLang's fields."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from bisect_harness.errors import SpecError
from bisect_harness.measure.sources.base import (
    _DEFAULT_UNITS, ACCEPT_LENGTH, MetricSource, _as_float, _str, register_source,
)
from bisect_harness.measure.values import lookup
from bisect_harness.model import Metric

__all__ = ["LastChunkSource", "RESPONSE_CHUNKS", "ResponseSource"]

RESPONSE_CHUNKS = ("merged", "last")

_MISSING = object()


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


def _response_field(resp: Mapping, path: str) -> Any:
    for candidate in (path, f"meta_info.{path}"):
        try:
            return lookup(resp, candidate)
        except KeyError:
            continue
    return _MISSING
