"""Did the flags take effect? :func:`flag_report` compares the flags asked for with
a server's effective arguments (its server-info endpoint), by the preset's key map
and compare modes. Values compare by :func:`~bisect_harness.measure.values.values_equal`
(measure's rule for a server-reported value), or by a mode (:func:`values_match`)."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from bisect_harness.observe.provenance._schema import SCHEMA_VERSION, _check_schema
from bisect_harness.measure.values import _as_bool, _as_mapping, _as_number, lookup, values_equal
from bisect_harness.model import jsonable
from bisect_harness.observe.provenance.slot_context import slot_context_matches

#: Where a server commonly reports a flag under another name (normalised keys).
DEFAULT_FLAG_ALIASES: Mapping[str, tuple[str, ...]] = {
    "tp": ("tp_size", "tensor_parallel_size"),
    "tp_size": ("tp", "tensor_parallel_size"),
    "tensor_parallel_size": ("tp_size", "tp"),
    "dp": ("dp_size", "data_parallel_size"),
    "dp_size": ("dp", "data_parallel_size"),
    "pp": ("pp_size", "pipeline_parallel_size"),
    "pp_size": ("pp", "pipeline_parallel_size"),
    "model": ("model_path",),
    "model_path": ("model",),
}

MATCHED, MISMATCHED, NOT_REPORTED = "matched", "mismatched", "not_reported"
#: ``FlagCheck.key`` of a flag the preset knows no server-info key for
NO_KEY = ""


def normalise_flag(key: str) -> str:
    """``--tp-size`` -> ``tp_size``."""
    return str(key).strip().lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class FlagCheck:
    """One requested flag against the server's effective arguments. ``key`` is the
    server-info key it was found under (or the first one tried, when not reported)."""

    flag: str
    key: str
    requested: Any
    effective: Any
    status: str  # matched | mismatched | not_reported

    def to_dict(self) -> dict:
        return {"flag": self.flag, "key": self.key, "requested": jsonable(self.requested),
                "effective": jsonable(self.effective), "status": self.status}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FlagCheck":
        return cls(d["flag"], d["key"], d["requested"], d["effective"], d["status"])


@dataclass(frozen=True)
class FlagReport:
    """Requested flags against the server's effective arguments. ``ok`` is False on
    any mismatch; a flag the server does not report is not a mismatch (it is listed
    under ``not_reported`` so a reader sees what could not be checked)."""

    checks: tuple[FlagCheck, ...]
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.mismatched

    @property
    def matched(self) -> tuple[FlagCheck, ...]:
        return tuple(c for c in self.checks if c.status == MATCHED)

    @property
    def mismatched(self) -> tuple[FlagCheck, ...]:
        return tuple(c for c in self.checks if c.status == MISMATCHED)

    @property
    def not_reported(self) -> tuple[FlagCheck, ...]:
        return tuple(c for c in self.checks if c.status == NOT_REPORTED)

    def check(self, flag: str) -> FlagCheck:
        for c in self.checks:
            if c.flag == flag or normalise_flag(c.flag) == normalise_flag(flag):
                return c
        raise KeyError(flag)

    @property
    def compared(self) -> tuple[FlagCheck, ...]:
        """The flags the server reported, matched or not: the ones checked."""
        return tuple(c for c in self.checks if c.status in (MATCHED, MISMATCHED))

    def describe(self) -> str:
        lines = [f"flags: {len(self.matched)} matched, {len(self.mismatched)} mismatched, "
                 f"{len(self.not_reported)} not reported"]
        if self.note:
            lines.append(f"  note: {self.note}")
        for c in self.mismatched:
            lines.append(f"  --{c.flag}: requested {c.requested!r}, server has {c.key}={c.effective!r}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "ok": self.ok, "note": self.note,
                "checks": [c.to_dict() for c in self.checks]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FlagReport":
        _check_schema(d, "FlagReport")
        return cls(tuple(FlagCheck.from_dict(c) for c in d["checks"]), d.get("note", ""))


_DTYPE_SPELLINGS = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32",
                   "fp32": "float32", "double": "float64", "fp8": "float8_e4m3fn"}


def _dtype_name(v: Any) -> str | None:
    """``torch.bfloat16``, ``bfloat16`` and ``bf16`` -> ``bfloat16``; None for a non-string."""
    if not isinstance(v, str):
        return None
    s = v.strip().lower()
    s = s[len("torch."):] if s.startswith("torch.") else s
    return _DTYPE_SPELLINGS.get(s, s)


def _subset(requested: Any, effective: Any) -> bool:
    rm, em = _as_mapping(requested), _as_mapping(effective)
    if rm is None or em is None:
        return values_equal(requested, effective)
    em_s = {str(k): v for k, v in em.items()}
    return all(str(k) in em_s and _subset(v, em_s[str(k)]) for k, v in rm.items())


def _float32(v: Any) -> float | None:
    """``v`` as the C ``float`` a server holds it in: ``0.8`` -> ``0.800000011920929``; None
    for what is not a finite number."""
    n = _as_number(v)
    if n is None or not math.isfinite(n) or abs(n) > 3.4e38:
        return None
    return struct.unpack("f", struct.pack("f", n))[0]


def _one_of(requested: Any, effective: Any) -> bool:
    """The reported value is one of the requested names (a list, or comma-separated:
    ``a,b``), or equal to the request."""
    if isinstance(requested, str) and "," in requested:
        requested = [name.strip() for name in requested.split(",") if name.strip()]
    if isinstance(requested, (list, tuple)) and requested and not isinstance(effective, (list, tuple)):
        return any(values_equal(name, effective) for name in requested)
    return values_equal(requested, effective)


def values_match(requested: Any, effective: Any, mode: str = "equal") -> bool:
    """Compare a requested flag value with a reported one by ``mode``: ``equal``
    (:func:`values_equal`), ``dtype`` (torch spellings: ``torch.bfloat16`` ==
    ``bfloat16`` == ``bf16``), ``subset`` (every requested key of a mapping is
    reported with an equal value, recursively; the server may report more),
    ``float32`` (equal once both are rounded to a C ``float``, as llama.cpp holds its
    sampling settings: ``0.8`` is reported as ``0.800000011920929``) or ``one_of``
    (the reported value is one of the requested comma-separated names: llama.cpp's
    ``--alias b,a`` is reported as ``a``). ``slot_context`` needs the rest of the
    server info: :func:`flag_report` compares it
    (:func:`~bisect_harness.observe.provenance.slot_context.slot_context_matches`)."""
    if mode == "dtype":
        a, b = _dtype_name(requested), _dtype_name(effective)
        return values_equal(requested, effective) if a is None or b is None else a == b
    if mode == "subset":
        return _subset(requested, effective)
    if mode == "float32":
        a, b = _float32(requested), _float32(effective)
        return values_equal(requested, effective) if a is None or b is None else a == b
    if mode == "one_of":
        return _one_of(requested, effective)
    if mode == "slot_context":
        raise ValueError("compare mode 'slot_context' reads the slot count and the other flags as well: "
                         "compare such a flag through flag_report")
    if mode != "equal":
        raise ValueError(f"unknown compare mode {mode!r}")
    return values_equal(requested, effective)


#: The flags an OpenAI model list answers (``GET /v1/models``: ``{"object": "list", "data":
#: [card]}``), by the field of its one card: vLLM's ModelCard carries the served name
#: (``id``), the model it was loaded from (``root``) and ``max_model_len``
#: (vllm/entrypoints/openai/models/serving.py show_available_models, vLLM 0.32).
MODEL_CARD_FLAGS: Mapping[str, str] = {"id": "served_model_name", "root": "model", "max_model_len": "max_model_len"}


def _model_card(server_info: Mapping[str, Any]) -> dict[str, Any]:
    """The flags a server info that is an OpenAI model list of one model answers, by
    :data:`MODEL_CARD_FLAGS` (normalised names); empty for any other server info, or a
    list of several models (which of them a flag is about is not known)."""
    data = server_info.get("data")
    if server_info.get("object") != "list" or not isinstance(data, list) or len(data) != 1 \
            or not isinstance(data[0], Mapping):
        return {}
    return {flag: data[0][field] for field, flag in MODEL_CARD_FLAGS.items() if data[0].get(field) is not None}


def _reported(server_info: Mapping[str, Any], flat: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """(found, value) of ``key`` in server info: a top-level key (normalised), else a dotted path."""
    if key in flat:
        return True, flat[key]
    if "." in key:
        try:
            return True, lookup(server_info, key)
        except KeyError:
            return False, None
    return False, None


def flag_report(requested: Mapping[str, Any], server_info: Mapping[str, Any] | None, *,
                aliases: Mapping[str, str] | None = None,
                compare: Mapping[str, str] | None = None) -> FlagReport:
    """Compare requested flags (YAML keys such as ``speculative-num-steps``) with a
    server's effective arguments (SGLang's flat ``/server_info``, or vLLM's nested
    ``{"vllm_config": {...}}``).

    A flag is looked up under, in order: its entry in ``aliases`` (keyed by the
    flag as written or normalised; a dotted path such as
    ``vllm_config.parallel_config.tensor_parallel_size`` is followed into nested
    objects), its normalised name (``-`` -> ``_``), then
    :data:`DEFAULT_FLAG_ALIASES`. Values compare with :func:`values_match` by the
    flag's mode in ``compare`` (default ``equal``). ``server_info`` None (the server
    has no info endpoint) reports every flag as not reported, with a note. A flag whose
    entry in ``aliases`` is None has no server-info key the preset knows (llama.cpp's
    ``/props`` echoes few launch arguments): it is not reported (key ``""``), never
    looked up by its name. A flag in mode ``slot_context`` (llama.cpp's ``ctx-size``,
    the total over the slots) is compared with the context of one slot by
    :func:`~bisect_harness.observe.provenance.slot_context.slot_context_matches`, and
    its ``effective`` is the slot and the slot count the server reported. A server info
    that is an OpenAI model list of one model (vLLM's ``/v1/models``, where
    ``/server_info`` is off) answers the flags of :data:`MODEL_CARD_FLAGS`.
    """
    aliases = dict(aliases or {})
    compare = dict(compare or {})
    checks: list[FlagCheck] = []
    info = {**_model_card(server_info), **{normalise_flag(k): v for k, v in server_info.items()}} \
        if server_info is not None else None
    for flag, want in requested.items():
        norm = normalise_flag(flag)
        if flag in aliases and aliases[flag] is None:
            checks.append(FlagCheck(flag, NO_KEY, want, None, NOT_REPORTED))
            continue
        mode = compare.get(flag) or compare.get(norm) or "equal"
        candidates: list[str] = []
        for a in (aliases.get(flag), aliases.get(norm), aliases.get("--" + str(flag))):
            if a:
                candidates.append(a if "." in a else normalise_flag(a))
        candidates.append(norm)
        candidates.extend(DEFAULT_FLAG_ALIASES.get(norm, ()))
        if info is None:
            checks.append(FlagCheck(flag, candidates[0], want, None, NOT_REPORTED))
            continue
        key, got = None, None
        for c in candidates:
            found, value = _reported(server_info, info, c)
            if found:
                key, got = c, value
                break
        if key is None and norm.startswith(("disable_", "no_")) and _as_bool(want) is not None:
            # `--disable-cuda-graph` is reported by its positive twin: cuda_graph = not want
            positive = norm.split("_", 1)[1]
            if positive in info:
                got = info[positive]
                status = MATCHED if values_equal(not _as_bool(want), got) else MISMATCHED
                checks.append(FlagCheck(flag, f"!{positive}", want, got, status))
                continue
        if key is None:
            checks.append(FlagCheck(flag, candidates[0], want, None, NOT_REPORTED))
            continue
        if mode == "slot_context":  # a slot's share of the asked total: read with the slot count
            took, shown = slot_context_matches(want, got, server_info, requested)
            status = NOT_REPORTED if took is None else MATCHED if took else MISMATCHED
            checks.append(FlagCheck(flag, key, want, shown, status))
            continue
        status = MATCHED if values_match(want, got, mode) else MISMATCHED
        checks.append(FlagCheck(flag, key, want, got, status))
    note = "" if server_info is not None else \
        "the server reported no effective arguments (no server-info endpoint answered)"
    return FlagReport(tuple(checks), note)


__all__ = ["DEFAULT_FLAG_ALIASES", "FlagCheck", "FlagReport", "MATCHED", "MISMATCHED", "MODEL_CARD_FLAGS",
           "NOT_REPORTED", "NO_KEY", "flag_report", "normalise_flag", "values_match"]
