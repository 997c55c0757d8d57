"""Decoding a ``text/event-stream`` body as it arrives: the events of a streamed
completion, each line bounded (:data:`MAX_SSE_LINE`, ``limits.stream_line_bytes``)::

    dec = SSEDecoder()
    for raw in response_pieces:
        for event, data in dec.feed(raw):   # (None, b'{"choices": ...}')
            ...
    dec.close()                              # a last event without its blank line
"""

from __future__ import annotations

from bisect_harness.errors import ServerReplyError
from bisect_harness.model import BenchmarkSpec

__all__ = ["MAX_SSE_LINE", "SSEDecoder", "SSELineTooLong"]

#: The longest line an event stream may send: a real chunk is a few KB (a few MB with
#: log-probabilities); past this the request fails instead of taking the memory.
MAX_SSE_LINE = BenchmarkSpec().limits.stream_line_bytes


class SSELineTooLong(ServerReplyError, ValueError):
    """An event-stream line went past the decoder's ``max_line``."""


class SSEDecoder:
    """Incremental decoder of a ``text/event-stream`` body.

    Feed it bytes as they arrive; it returns the complete events as
    ``(event_type, data)`` pairs (``event_type`` is None unless an ``event:``
    field was sent; ``data`` joins multi-line data with ``\\n``). Handles lines
    split across reads, ``\\r\\n`` and ``\\r`` line ends, comments and keepalives
    (``: ping``), and a last event not followed by a blank line (:meth:`close`).
    """

    __slots__ = ("_parts", "_pending", "_data", "_event", "max_line")

    def __init__(self, max_line: int | None = None) -> None:
        self._parts: list[bytes] = []  # the unfinished line, as it arrived (joined once it ends)
        self._pending = 0
        self._data: list[bytes] = []
        self._event: bytes | None = None
        self.max_line = MAX_SSE_LINE if max_line is None else max_line

    @property
    def _buf(self) -> bytes:
        return b"".join(self._parts)

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        held = self._parts and self._parts[-1].endswith(b"\r")
        if not held and b"\n" not in chunk and b"\r" not in chunk:
            # the line goes on: keep the piece, copy nothing (a long line costs its length, once)
            if chunk:
                self._parts.append(chunk)
                self._pending += len(chunk)
                self._check_line()
            return []
        buf = self._buf + chunk if self._parts else chunk
        held_cr = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # maybe the first half of "\r\n": wait for the next read
                buf, held_cr = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        rest = lines.pop() + held_cr
        self._parts = [rest] if rest else []
        self._pending = len(rest)
        self._check_line()
        out: list[tuple[str | None, bytes]] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append((self._event.decode() if self._event else None,
                                data[0] if len(data) == 1 else b"\n".join(data)))
                    data.clear()
                self._event = None
            elif line[0] == 58:  # ':' comment / keepalive
                continue
            else:
                name, sep, value = line.partition(b":")
                if sep and value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    self._event = value
                # id:, retry: and unknown fields carry nothing we measure
        return out

    def _check_line(self) -> None:
        if self._pending > self.max_line:
            size = self._pending
            self._parts, self._pending = [], 0
            raise SSELineTooLong(f"a line of the event stream went past {self.max_line:,} bytes "
                                 f"({size:,} without a line end); stopped reading")

    def close(self) -> list[tuple[str | None, bytes]]:
        """Flush at end of stream: a trailing line and an event without its blank line."""
        out = self.feed(b"\n") if self._buf.rstrip(b"\r") else []
        out += self.feed(b"\n") if self._data else []
        self._parts, self._pending = [], 0
        return out
