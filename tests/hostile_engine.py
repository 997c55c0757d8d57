"""A small OpenAI-compatible server that misbehaves on purpose, one way per MODE.

    python hostile_engine.py --port N --mode MODE

Every mode answers ``/health`` and ``/v1/models``; ``/v1/completions`` streams
eight one-token chunks of text, then a usage chunk, then ``[DONE]``, except:

- ``ok``: usage says eight tokens (the truth);
- ``low-usage``: usage says one token for the eight chunks of text;
- ``huge-usage``: usage says 10**9 tokens;
- ``wrong-shape``: the first chunk is ``{"choices": [1]}``;
- ``exit-1-at-stop``: answers truly, but exits 1 on SIGTERM (a wrapper whose server
  got the signal first, say).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = "ok"


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
        else:
            self._json({"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        n = min(8, int(body.get("max_tokens", 8)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = [{"choices": [{"index": 0, "text": f" w{i}"}]} for i in range(n)]
        if MODE == "wrong-shape":
            chunks[0] = {"choices": [1]}
        usage = {"ok": n, "low-usage": 1, "huge-usage": 10 ** 9}.get(MODE, n)
        chunks.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": usage}})
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
    global MODE
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="ok")
    a = ap.parse_args()
    MODE = a.mode
    if MODE == "exit-1-at-stop":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
