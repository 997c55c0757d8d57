"""Reading a server's response body within bounds, whatever it sends.

The harness asks every server for no compression (``Accept-Encoding: identity``).
A server that compresses anyway is decoded here, a bounded slice at a time, from
the raw bytes: httpx's own decoder inflates each received chunk whole, so 64 KiB
of a gzip bomb would become 64 MiB before any limit could look at it.

    with http.stream("GET", url) as resp:
        for piece in decoded(resp, most=1 << 20):  # each piece at most 1 MiB
            ...

Encodings decoded: identity, gzip (x-gzip) and deflate; any other is refused with
:class:`UnreadableBody`, naming it.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterator

__all__ = ["UnreadableBody", "decoded", "read_some"]


class UnreadableBody(Exception):
    """A body compressed in a way the harness does not decode, or corrupt."""


def _inflater(encoding: str, url: str):
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if enc == "deflate":  # RFC 9110: a zlib stream (raw deflate from some servers: tried next)
        return zlib.decompressobj(zlib.MAX_WBITS)
    raise UnreadableBody(f"the body of {url} is {encoding!r}-encoded although the harness asked for none "
                         "(Accept-Encoding: identity); only gzip and deflate are decoded")


def decoded(resp: Any, most: int) -> Iterator[bytes]:
    """The decoded bytes of an httpx streaming response, in pieces of at most
    ``most`` bytes each: the inflater is never asked for more, so a bomb costs
    ``most`` bytes of memory at a time, not its decoded size."""
    url = str(resp.request.url) if getattr(resp, "request", None) is not None else "the server"
    z = _inflater(resp.headers.get("content-encoding", ""), url)
    raw_deflate_tried = False
    for raw in resp.iter_raw():
        if z is None:
            for i in range(0, len(raw), most):
                yield raw[i:i + most]
            continue
        data = raw
        while data:
            try:
                out = z.decompress(data, most)
            except zlib.error as exc:
                if not raw_deflate_tried and resp.headers.get("content-encoding", "").strip().lower() == "deflate":
                    raw_deflate_tried, z = True, zlib.decompressobj(-zlib.MAX_WBITS)
                    continue
                raise UnreadableBody(f"the compressed body of {url} is corrupt: {exc}") from exc
            raw_deflate_tried = True  # the first bytes decoded: the framing is settled
            if out:
                yield out
            data = z.unconsumed_tail
            if z.eof:
                return


def read_some(resp: Any, limit: int) -> bytes:
    """At most ``limit`` decoded bytes of a response's body (an error page, say);
    the rest is not read."""
    got, size = [], 0
    for piece in decoded(resp, max(1, min(limit, 1 << 16))):
        got.append(piece[:limit - size])
        size += len(got[-1])
        if size >= limit:
            break
    return b"".join(got)
