"""A server in the shape of llama.cpp's of late 2023 (native ``POST /completion``,
``stop: true`` on the last object) whose requests sometimes produce nothing, one way
per MODE:

- ``ok``: every stream is whole;
- ``empty-every-third``: every third request (the 3rd, 6th, ...) is answered with an
  empty HTTP 200 stream, as that server answered a request arriving as the previous
  one ended ("slot unavailable" in its log only);
- ``cut-every-other``: every second request's stream stops after its text, before
  its ``stop: true`` object, and ends as a whole HTTP body;
- ``empty-after-first``: the first request is answered; every later one gets an
  empty 200 stream.

As a process (what a boot launches)::

    python flaky_engine.py --port N --mode MODE

In a test, :class:`FlakyServer` serves the same on a free port of 127.0.0.1. Both
answer ``GET /health`` and ``GET /metrics``, and 404 to any other POST (no tokenizer);
only ``POST /completion`` counts as a request.
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKENS = 8


def _handler(state: dict):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            body = (b"# TYPE flaky_tokens_total counter\nflaky_tokens_total 0\n" if self.path == "/metrics"
                    else b'{"status": "ok"}')
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path != "/completion":  # no tokenizer: prompts go in words
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with state["lock"]:
                state["posts"] += 1
                n = state["posts"]
            mode = state["mode"]
            empty = (mode == "empty-every-third" and n % 3 == 0) or (mode == "empty-after-first" and n > 1)
            cut = mode == "cut-every-other" and n % 2 == 0
            tokens = min(TOKENS, int(asked.get("n_predict", TOKENS)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if empty:
                print(f"request {n}: slot unavailable", flush=True)  # said in the log only, as that server did
                self.wfile.write(b"0\r\n\r\n")
                return
            for _ in range(tokens):
                self._chunk({"content": " a", "stop": False})
            if not cut:
                self._chunk({"content": "", "stop": True, "tokens_predicted": tokens, "tokens_evaluated": 4,
                             "timings": {"predicted_n": tokens, "predicted_per_second": 100.0, "prompt_n": 4}})
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, obj: dict) -> None:
            data = b"data: " + json.dumps(obj).encode() + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


def _state(mode: str) -> dict:
    return {"mode": mode, "posts": 0, "lock": threading.Lock()}


class FlakyServer:
    """In-process, on a free port: ``url``, and ``posts``: the completions it was asked for."""

    def __init__(self, mode: str):
        self.state = _state(mode)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def posts(self) -> int:
        return self.state["posts"]

    def __enter__(self) -> "FlakyServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="ok",
                    choices=["ok", "empty-every-third", "cut-every-other", "empty-after-first"])
    args = ap.parse_args()
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(_state(args.mode)))
    httpd.daemon_threads = True
    print(f"flaky engine ({args.mode}) on 127.0.0.1:{args.port}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
