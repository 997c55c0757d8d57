"""Did the mechanism a flag claims really engage? Checks shipped with the presets.

An engine accepts a flag and can still leave its mechanism off: llama.cpp's
``llama-server -md DRAFT`` loads a draft model and, in builds that want
``--spec-type draft-simple`` as well, never drafts a token; vLLM accepts
``--speculative-config`` and a CPU build ignores CUDA graphs. The flag check
(``provenance.flags``) sees the value echoed back; this module asks for the
engine's own evidence that the mechanism ran. Each preset declares, once, the
mechanisms its well-known flags claim (:class:`Mechanism`), each with its
evidence in order of trust (:class:`Counter`, :class:`InfoField`,
:class:`LogLine`). After a boot's samples, :func:`check` reads the evidence of
every mechanism the boot's flags claim and answers, per mechanism, ``engaged``,
``not_engaged`` (mark :data:`NOT_ENGAGED`) or ``unknown`` (no evidence could be
read: never a pass)::

    results = check(preset.mechanisms, flags, metrics_text=..., server_info=..., log_text=...)
    [r.state for r in results]      # ['not_engaged']
    results[0].evidence             # 'llamacpp:spec_decode_num_draft_tokens_total = 0 after the benchmark'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

__all__ = ["Counter", "InfoField", "LogLine", "Mechanism", "MechanismResult", "check", "NOT_ENGAGED",
           "STATES", "summary"]

#: The mark of a boot whose flag was accepted and whose mechanism did not engage.
NOT_ENGAGED = "mechanism_not_engaged"
STATES = ("engaged", "not_engaged", "unknown")


@dataclass(frozen=True)
class Counter:
    """A Prometheus counter that moves only when the mechanism runs: engaged when
    its value (summed over label sets) is above zero after the benchmark."""

    series: str

    def read(self, *, metrics: list | None, server_info, log_text: str) -> tuple[str, str] | None:
        if metrics is None:
            return None
        vals = [v for n, _labels, v in metrics if n in (self.series, self.series + "_total")]
        if not vals:
            return None
        total = math.fsum(vals)
        state = "engaged" if total > 0 else "not_engaged"
        return state, f"{self.series} = {total:g} after the benchmark"


@dataclass(frozen=True)
class InfoField:
    """A field of the server-info JSON (a dotted path); ``engaged`` says from its
    value whether the mechanism runs (True/False), or None when the value says nothing."""

    path: str
    engaged: Callable[[Any], bool | None]
    says: str = ""

    def read(self, *, metrics, server_info, log_text: str) -> tuple[str, str] | None:
        from .sources import lookup

        if not isinstance(server_info, Mapping):
            return None
        try:
            value = lookup(server_info, self.path)
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        verdict = self.engaged(value)
        if verdict is None:
            return None
        return ("engaged" if verdict else "not_engaged"), f"server info {self.path} = {value!r}{self.says}"


@dataclass(frozen=True)
class LogLine:
    """A line of the boot log: ``engaged`` matches when the mechanism ran,
    ``disengaged`` when the engine says it turned it off. The last match wins."""

    engaged: str = ""
    disengaged: str = ""

    def read(self, *, metrics, server_info, log_text: str) -> tuple[str, str] | None:
        last: tuple[int, str, str] | None = None
        for pattern, state in ((self.engaged, "engaged"), (self.disengaged, "not_engaged")):
            if not pattern:
                continue
            for m in re.finditer(pattern, log_text, re.MULTILINE):
                if last is None or m.start() > last[0]:
                    line = log_text[log_text.rfind("\n", 0, m.start()) + 1:].split("\n", 1)[0]
                    last = (m.start(), state, line.strip()[:160])
        if last is None:
            return None
        return last[1], f"log: {last[2]!r}"


@dataclass(frozen=True)
class Mechanism:
    """A mechanism that setting one of ``flags`` (canonical names) claims to engage.

    ``claims(value)`` says whether a flag's value claims it (default: any value
    but false/off/none); ``evidence`` is read in order, the first that answers
    decides; ``source`` cites where the evidence comes from (the engine's code
    or a real server's output)."""

    name: str
    flags: tuple[str, ...]
    evidence: tuple[Any, ...]
    source: str
    claims: Callable[[Any], bool] = field(default=lambda v: _truthy(v))

    def claimed_by(self, flags: Mapping[str, Any]) -> tuple[str, ...]:
        return tuple(f for f in self.flags if f in flags and flags[f] is not None and self.claims(flags[f]))


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "off", "no", "none", "0", "disabled")
    return value is not None


@dataclass(frozen=True)
class MechanismResult:
    name: str
    flags: tuple[str, ...]
    state: str           # engaged | not_engaged | unknown
    evidence: str
    source: str

    def to_dict(self) -> dict:
        return {"name": self.name, "flags": list(self.flags), "state": self.state, "evidence": self.evidence,
                "source": self.source}


def check(mechanisms: Sequence[Mechanism], flags: Mapping[str, Any], *, metrics: list | None,
          server_info: Mapping | None, log_text: str) -> list[MechanismResult]:
    """Each mechanism the canonical ``flags`` claim, judged by its evidence.

    ``metrics`` are the parsed ``/metrics`` samples after the benchmark (None when the
    server serves none), ``server_info`` the server-info JSON, ``log_text`` the boot log.
    """
    out = []
    for m in mechanisms:
        by = m.claimed_by(flags)
        if not by:
            continue
        answer = None
        for probe in m.evidence:
            answer = probe.read(metrics=metrics, server_info=server_info, log_text=log_text)
            if answer is not None:
                break
        state, evidence = answer or ("unknown", "no evidence could be read (" + ", ".join(
            _describe(p) for p in m.evidence) + ")")
        out.append(MechanismResult(m.name, by, state, evidence, m.source))
    return out


def _describe(probe) -> str:
    if isinstance(probe, Counter):
        return f"/metrics {probe.series}"
    if isinstance(probe, InfoField):
        return f"server info {probe.path}"
    return "boot log"


def summary(results: Sequence[Mapping]) -> str:
    """One cell: ``speculative decoding: NOT engaged (...)``; "" when nothing was claimed."""
    parts = []
    for r in results:
        word = {"engaged": "engaged", "not_engaged": "**NOT engaged**", "unknown": "unchecked"}[r["state"]]
        parts.append(f"{r['name']} ({', '.join(r['flags'])}): {word} ({r['evidence']})")
    return "; ".join(parts)
