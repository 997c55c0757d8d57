"""Reading a server's response body within bounds, whatever it sends.

:func:`bounded_get` (and :func:`bounded_request` for any method) reads a whole body
within a byte limit and a deadline, or raises :class:`BodyTooLarge` /
:class:`TimeoutError` saying what happened: how ``/metrics``, server info and a
profiler's answers are read.

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

import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from bisect_harness.errors import ServerReplyError
from bisect_harness.model import Limits

__all__ = ["Body", "BodyTooLarge", "MAX_BODY_BYTES", "UnreadableBody", "bounded_get", "bounded_request", "decoded",
           "read_some"]


class UnreadableBody(ServerReplyError):
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


# --------------------------------------------------------------------------- whole bodies, bounded

#: The most a ``/metrics`` or server-info body may hold once decoded. Real engines send a
#: few hundred KB; a larger body (or a compressed bomb) is a source problem, not a read
#: that takes the harness's memory and minutes of parsing.
MAX_BODY_BYTES = Limits().body_bytes


class BodyTooLarge(ServerReplyError):
    """A server's body went past :data:`MAX_BODY_BYTES`."""


@dataclass(frozen=True)
class Body:
    """A response read whole within bounds: its status and bytes."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        import json

        return json.loads(self.content)


def bounded_get(client: Any, url: str, timeout_s: float, headers: Mapping[str, str] | None = None,
                limit: int = MAX_BODY_BYTES) -> Body:
    """GET ``url`` through an httpx client (None: one of its own), reading at most
    ``limit`` decoded bytes within ``timeout_s`` in all (httpx's own timeout bounds each
    read, not the whole body). Asks for no compression; a server that compresses anyway is decoded chunk
    by chunk and stopped at the limit. Raises :class:`BodyTooLarge` or
    :class:`TimeoutError` with what happened."""
    return bounded_request(client, "GET", url, timeout_s, headers, limit)


def bounded_request(client: Any, method: str, url: str, timeout_s: float, headers: Mapping[str, str] | None = None,
                    limit: int = MAX_BODY_BYTES, *, json_body: Any = None, chunk: int = 1 << 20) -> Body:
    """:func:`bounded_get` for any method, with an optional JSON body (a profiler's
    ``POST /start_profile``): the answer read within ``limit`` bytes and ``timeout_s``
    in all. ``client`` None: a client of the harness's own for this one request."""
    if client is None:
        from bisect_harness.measure.http import http_client

        with http_client() as own:
            return bounded_request(own, method, url, timeout_s, headers, limit, json_body=json_body, chunk=chunk)
    deadline = time.monotonic() + timeout_s
    kwargs = {"json": json_body} if json_body is not None else {}
    with client.stream(method, url, timeout=timeout_s,
                       headers={"Accept-Encoding": "identity", **dict(headers or {})}, **kwargs) as resp:
        chunks, size = [], 0
        for piece in decoded(resp, chunk):
            size += len(piece)
            if size > limit:
                raise BodyTooLarge(f"the body of {url} went past {limit:,} bytes; stopped reading")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the body of {url} was not read within {timeout_s:g} s")
            chunks.append(piece)
        return Body(resp.status_code, b"".join(chunks))
