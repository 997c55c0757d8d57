"""What code the server says it is running, per boot, and a guard on it.

Whatever the build does, the server's own word on its version is the last check
that a boot ran the commit it was meant to: SGLang and the demo engine report
``version`` in their server info, vLLM answers ``GET /version`` with
``{"version": ...}``; some builds add a commit (``commit``, ``git_commit``,
``git_sha``). Each boot stores what it found in its evidence's
``engine_version``; a config whose boots report different values ran
different code under one label, and its verdicts say so
(:func:`mixed_versions`, an ``engine_versions`` finding).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import httpx

from bisect_harness.evidence import Finding, FindingKind, evidence_of
from bisect_harness.measure.bodies import ServerReplyError, bounded_get

__all__ = ["IDENTITY_KEYS", "VERSION_PATH", "ReportedVersion", "read_reported_version",
           "mixed_versions", "describe"]

#: Top-level server-info keys that name the running code.
IDENTITY_KEYS = ("version", "commit", "git_commit", "git_sha", "build_info")  # build_info: llama.cpp /props
#: vLLM's version endpoint (and any server that answers it with ``{"version": ...}``).
VERSION_PATH = "/version"


@dataclass(frozen=True)
class ReportedVersion:
    """What one boot's server reported about its own code: ``values`` maps where it was
    read (``server_info.version``, ``/version``) to the text. Empty: it reported nothing."""

    values: Mapping[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """One string for comparing boots and for reading: the values, by source."""
        return ", ".join(f"{v} ({k})" for k, v in sorted(self.values.items())) if self.values else ""

    def to_dict(self) -> dict:
        return {"values": dict(self.values), "label": self.label}

    @classmethod
    def from_dict(cls, d: Mapping | None) -> "ReportedVersion":
        return cls(values=dict((d or {}).get("values") or {}))


def _text(value) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (str, int, float)):
        text = str(value).strip()
        return text[:200] or None
    return None


def read_reported_version(base_url: str, server_info: Mapping | None, *, timeout_s: float = 5.0,
                          headers: Mapping[str, str] | None = None) -> ReportedVersion:
    """The identity keys of ``server_info`` and the answer of ``GET /version``."""
    values: dict[str, str] = {}
    for key in IDENTITY_KEYS:
        text = _text((server_info or {}).get(key)) if isinstance(server_info, Mapping) else None
        if text:
            values[f"server_info.{key}"] = text
    try:
        r = bounded_get(None, base_url.rstrip("/") + VERSION_PATH, timeout_s, headers, limit=64 << 10)
        if r.status_code == 200:
            data = json.loads(r.content)
            text = _text(data.get("version")) if isinstance(data, dict) else None
            if text:
                values[VERSION_PATH] = text
    except (httpx.HTTPError, ServerReplyError, TimeoutError, ValueError):
        pass  # no such endpoint, or not JSON: this server says nothing there
    return ReportedVersion(values=values)


def _groups(boots: Sequence) -> dict[str, list[int]]:
    """Boot ids by what they reported, in boot order; boots that reported nothing are left out."""
    groups: dict[str, list[int]] = {}
    for b in boots:
        rep = ReportedVersion.from_dict(evidence_of(b).engine_version)
        if rep.values:
            groups.setdefault(rep.label, []).append(b.id)
    return groups


def _boots(ids: Sequence[int]) -> str:
    return f"boot{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"


def mixed_versions(side: str, boots: Sequence) -> Finding | None:
    """An ``engine_versions`` finding when the boots of one config (``boots`` with
    ``.id`` and evidence: ``evidence.evidence_of``) reported different code; None when they agree or said
    nothing. Its boots are those that reported, its figures ``versions``: each label
    reported and the boots that reported it, in boot order."""
    groups = _groups(boots)
    if len(groups) < 2:
        return None
    parts = "; ".join(f"{label} in {_boots(ids)}" for label, ids in groups.items())
    text = (f"engine version: {side} boots report different code ({parts}): this config did not run one "
            "build; give each commit its own environment (engine.environment: venv) and check the build")
    return Finding(FindingKind.ENGINE_VERSIONS, text, side=side,
                   boots=tuple(sorted(i for ids in groups.values() for i in ids)),
                   figures={"versions": {label: list(ids) for label, ids in groups.items()}})


def describe(boots: Sequence) -> str:
    """For the journal: what a config's boots reported, grouped, e.g. ``1.0 (server_info.version): boots 1, 3``."""
    return "; ".join(f"{label}: {_boots(ids)}" for label, ids in _groups(boots).items())
