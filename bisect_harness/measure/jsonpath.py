"""A value at a dotted path in a server's JSON (``a.b.0.c``): how the flag check reads
server info and how metric sources read responses, one rule for both."""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["lookup"]


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
