"""A small OpenAI-compatible server that misbehaves on purpose, one way per MODE.

    python hostile_engine.py --port N --mode MODE

Every mode answers ``/health`` and ``/v1/models``; ``/v1/completions`` streams
eight one-token chunks of text, then a usage chunk, then ``[DONE]``, except:

- ``ok``: usage says eight tokens (the truth);
- ``low-usage``: usage says one token for the eight chunks of text;
- ``huge-usage``: usage says 10**9 tokens;
- ``wrong-shape``: the first chunk is ``{"choices": [1]}``;
- ``exit-1-at-stop``: answers truly, but exits 1 on SIGTERM (a wrapper whose server
  got the signal first, say);
- ``huge-metrics``: ``/metrics`` is 64 MiB of comment lines;
- ``metrics-bomb``: ``/metrics`` is gzip-encoded and decodes to 1 GiB (about 1 MB sent);
- ``long-line``: the stream's first line never ends (64 MiB without a newline);
- ``listen-wide``: answers truly on 127.0.0.1, and a side socket (an exporter, say)
  listens on all interfaces (``0.0.0.0``, a free port; nothing is sent to it);
- ``log-flood``: writes ``--flood-mb`` MiB (default 1024) of lines to stdout as it
  starts, before it listens.

``/metrics`` otherwise holds one counter, ``hostile_generation_tokens_total``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = "ok"
TOKENS = 0
BOMB = b""


def gzip_bomb(mib: int) -> bytes:
    """A gzip stream that decodes to ``mib`` MiB of newlines, made in well under a
    second: after a full flush deflate starts afresh, so each MiB compresses to the
    same bytes, compressed once and repeated; the trailer's CRC is computed."""
    block = b"\n" * (1 << 20)
    z = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the gzip frame is written here
    one = z.compress(block) + z.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = crc.to_bytes(4, "little") + ((mib << 20) & 0xFFFFFFFF).to_bytes(4, "little")
    return header + one * mib + z.flush() + trailer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": "hostile", "object": "model"}]})
        elif self.path == "/metrics":
            self._metrics()
        else:
            self._json({"status": "ok"})

    def _metrics(self):
        global TOKENS
        extra = {}
        if MODE == "huge-metrics":
            body = b"# padding\n" * ((64 << 20) // 10)
        elif MODE == "metrics-bomb":
            body, extra = BOMB, {"Content-Encoding": "gzip"}
        else:
            body = (f"# TYPE hostile_generation_tokens_total counter\n"
                    f"hostile_generation_tokens_total {TOKENS}\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the reader stopped at its limit
            pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        n = min(8, int(body.get("max_tokens", 8)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        global TOKENS
        TOKENS += n
        if MODE == "long-line":
            try:
                self._chunk(b"data: {\"choices\": [{\"text\": \"")
                piece = b"x" * (1 << 20)
                for _ in range(64):
                    self._chunk(piece)
            except (BrokenPipeError, ConnectionResetError):  # the client stopped at its limit
                pass
            return
        chunks = [{"choices": [{"index": 0, "text": f" w{i}"}]} for i in range(n)]
        if MODE == "wrong-shape":
            chunks[0] = {"choices": [1]}
        usage = {"ok": n, "low-usage": 1, "huge-usage": 10 ** 9}.get(MODE, n)
        chunks.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": usage}})
        self._stream(chunks)

    def _stream(self, chunks) -> None:
        """Each of ``chunks`` as a server-sent event, then ``[DONE]`` and the chunked body's end."""
        for c in chunks:
            time.sleep(0.002)
            self._chunk(b"data: " + json.dumps(c).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, data: bytes):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def main() -> None:
    global MODE, BOMB
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="ok")
    ap.add_argument("--flood-mb", type=int, default=1024)
    a = ap.parse_args()
    MODE = a.mode
    if MODE == "log-flood":
        mib = b"".join(b"flooding the log %08d %s\n" % (i, b"x" * 37) for i in range(1 << 14))  # 64-byte lines
        for _ in range(a.flood_mb):
            os.write(1, mib)
    if MODE == "metrics-bomb":
        BOMB = gzip_bomb(1024)
    if MODE == "listen-wide":
        import socket

        side = socket.create_server(("0.0.0.0", 0))  # noqa: F841 (held open while serving)
    if MODE == "exit-1-at-stop":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
