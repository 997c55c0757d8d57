"""A small OpenAI-compatible server that wants a bearer token, for attach-mode tests.

    python tests/auth_engine.py --port N --key-env VAR [--token-delay-ms 5] [--version X]

Every route (``/health``, ``/v1/models``, ``/v1/completions`` streamed with usage,
``/server_info``, ``/version``, ``/metrics``) answers 401 unless the request carries
``Authorization: Bearer <the value of $VAR>``; the 401 body never repeats what was
sent. Each output token takes ``--token-delay-ms``, so two servers with different
delays are a known A/B difference. Counts of authorised and refused requests are
served at ``/metrics`` (``auth_engine_requests_total``, ``auth_engine_refused_total``).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNTS = {"ok": 0, "refused": 0, "tokens": 0}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, code: int, obj) -> None:
        self._send(code, json.dumps(obj).encode())

    def _authorised(self) -> bool:
        want = "Bearer " + self.server.key
        ok = self.headers.get("Authorization") == want
        with LOCK:
            COUNTS["ok" if ok else "refused"] += 1
        if not ok:
            self._json(401, {"error": {"message": "missing or invalid API key", "type": "invalid_request_error"}})
        return ok

    def do_GET(self):
        if not self._authorised():
            return
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200, b"ok\n", "text/plain")
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": "auth-model", "object": "model"}]})
        elif path == "/server_info":
            self._json(200, {"version": self.server.version, "token_delay_ms": self.server.delay_s * 1e3})
        elif path == "/version":
            self._json(200, {"version": self.server.version})
        elif path == "/metrics":
            with LOCK:
                text = (f"auth_engine_requests_total {COUNTS['ok']}\nauth_engine_refused_total {COUNTS['refused']}\n"
                        f"auth_engine_tokens_total {COUNTS['tokens']}\n")
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._json(404, {"error": f"no route {path}"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        if not self._authorised():
            return
        if self.path.split("?", 1)[0] != "/v1/completions":
            self._json(404, {"error": "no route"})
            return
        body = json.loads(raw or b"{}")
        n = int(body.get("max_tokens", 16))
        prompt = body.get("prompt", "")
        prompt_tokens = len(str(prompt).split())
        base = {"id": "cmpl-auth", "object": "text_completion", "created": int(time.time()), "model": "auth-model"}
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(n):
            time.sleep(self.server.delay_s)
            chunk = {**base, "choices": [{"index": 0, "text": f" t{i}", "logprobs": None, "finish_reason": None}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        with LOCK:
            COUNTS["tokens"] += n
        usage = {**base, "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                                  "total_tokens": prompt_tokens + n}}
        self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--key-env", required=True, help="the environment variable holding the expected key")
    p.add_argument("--token-delay-ms", type=float, default=5.0)
    p.add_argument("--version", default="auth-1.0")
    a = p.parse_args()
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True
    server.key = os.environ[a.key_env]
    server.delay_s = a.token_delay_ms / 1e3
    server.version = a.version
    server.serve_forever()


if __name__ == "__main__":
    main()
