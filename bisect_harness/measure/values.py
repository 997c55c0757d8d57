"""Reading and comparing what a server reports: its server-info document, a value at a
dotted path in it, and whether a reported value is the one asked for.

* :func:`read_server_info`: the first server-info endpoint that answers with a JSON
  object, read within bounds; never raises (a hostile server's answer is a reason);
* :func:`lookup`: the value at a dotted path (``a.b.0.c``) in a server's JSON: how the
  flag check reads server info and how metric sources read responses, one rule for both;
* :func:`values_equal`: type-tolerant equality of a requested value and a reported
  one (``2 == "2"``, ``True == "true"``, ``[1, 2] == "1,2"``): how the flag check and a
  metric source's ``when`` compare flags.

Example::

    info, why = read_server_info(None, "http://127.0.0.1:30000", ["/server_info"])
    values_equal(4, lookup(info, "tp_size"))      # True for 4, "4" or 4.0
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

import httpx

from bisect_harness.measure.bodies import MAX_BODY_BYTES, BodyTooLarge, UnreadableBody, bounded_get

__all__ = ["lookup", "read_server_info", "values_equal"]


def lookup(obj: Any, path: str) -> Any:
    """The value at a dotted path (``a.b.0.c``) in nested dicts and lists, or a
    ``KeyError`` naming the first missing part. An exact key containing dots wins."""
    if isinstance(obj, Mapping) and path in obj:
        return obj[path]
    cur = obj
    for part in path.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, (list, tuple)) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise KeyError(part)
    return cur


def read_server_info(client: Any, base_url: str, paths: Sequence[str], *, timeout_s: float = 10.0,
                     headers: Mapping[str, str] | None = None,
                     limit: int = MAX_BODY_BYTES) -> tuple[Mapping | None, str]:
    """The first of ``paths`` under ``base_url`` that answers 200 with a JSON object, or
    (None, what each path answered). Each path is read with ``bodies.bounded_get``
    through ``client`` (a ``deadline.deadline_client``; None: a client of its own for
    each), sending ``headers``, within ``limit`` bytes and ``timeout_s`` in all however
    slowly the server sends. The one reader of server info: the boot's
    flag check and the metric sources both call it."""
    tried = []
    for path in paths:
        try:
            resp = bounded_get(client, base_url + path, timeout_s, headers, limit)
            if resp.status_code == 200:
                data = resp.json()
                if isinstance(data, Mapping):
                    return data, ""
            tried.append(f"{path}: HTTP {resp.status_code}")
        except Exception as exc:  # a hostile or broken server: say what it did, never raise
            said = isinstance(exc, (BodyTooLarge, UnreadableBody, TimeoutError, httpx.TimeoutException))
            tried.append(f"{path}: {type(exc).__name__}" + (f" ({exc})" if said else ""))
    return None, "no server-info path answered with JSON (" + "; ".join(tried) + ")"


# --------------------------------------------------------------------------- comparing

# _as_bool and _as_mapping are also the flag check's (observe.provenance.flags).
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _as_bool(v: Any) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str):
        s = v.strip().lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
    return None


def _as_number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip())
        except ValueError:
            return None
    return None


def _as_sequence(v: Any) -> list | None:
    if isinstance(v, (list, tuple)):
        return list(v)
    if isinstance(v, str):
        s = v.strip()
        if s.startswith("["):
            try:
                parsed = json.loads(s)
            except ValueError:
                return None
            return parsed if isinstance(parsed, list) else None
        parts = [p for p in s.replace(",", " ").split() if p]
        return parts if len(parts) > 1 else None
    return None


def _as_mapping(v: Any) -> dict | None:
    if isinstance(v, Mapping):
        return dict(v)
    if isinstance(v, str) and v.strip().startswith("{"):
        try:
            parsed = json.loads(v)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def values_equal(requested: Any, effective: Any) -> bool:
    """Type-tolerant equality of a requested flag value and a server-reported one:
    ``2 == "2" == 2.0``, ``True == "true"``, ``[1, 2] == "1,2"``, dicts by their
    items (or a JSON string), and a requested ``False`` (flag omitted) matches an
    effective ``None``."""
    if requested is None or effective is None:
        if requested is None and effective is None:
            return True
        other = effective if requested is None else requested
        return requested is False or other == "" or (
            isinstance(other, str) and other.strip().lower() in ("none", "null"))
    rm, em = _as_mapping(requested), _as_mapping(effective)
    if rm is not None or em is not None:
        if rm is None or em is None or set(map(str, rm)) != set(map(str, em)):
            return False
        em_s = {str(k): v for k, v in em.items()}
        return all(values_equal(v, em_s[str(k)]) for k, v in rm.items())
    if isinstance(requested, (list, tuple)) or isinstance(effective, (list, tuple)):
        rs, es = _as_sequence(requested), _as_sequence(effective)
        if rs is None:
            rs = [requested]
        if es is None:
            es = [effective]
        return len(rs) == len(es) and all(values_equal(a, b) for a, b in zip(rs, es))
    if isinstance(requested, bool) or isinstance(effective, bool):
        rb, eb = _as_bool(requested), _as_bool(effective)
        return rb is not None and rb == eb
    if str(requested).strip() == str(effective).strip():
        return True
    rn, en = _as_number(requested), _as_number(effective)
    if rn is not None and en is not None:
        return math.isclose(rn, en, rel_tol=1e-9, abs_tol=1e-12)
    rb, eb = _as_bool(requested), _as_bool(effective)
    return rb is not None and eb is not None and (rn is None or en is None) and rb == eb
