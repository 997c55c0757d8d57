"""A stand-in for a 2023 llama.cpp ``server``, installed as ``llama-server`` by the tests.

Its argument parser is that era's (``examples/server/server.cpp``, server_params_parse):
an option it does not know, ``--metrics`` among them, stops it with
``error: unknown argument: --metrics``, its usage and exit 1; ``--help`` prints the
usage and exits 0 (with ``OLD_SERVER_HELP=broken``, the help names no option and
exits 1, as a build whose help cannot be read). It serves that era's native
``/completion`` stream (content chunks, then ``stop`` with counts and timings), a
``/props`` and a ``/health``. ``OLD_SERVER_ARGS`` names a file each launch's argv is
appended to, so a test sees what ran.
"""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

OPTIONS = ("-h", "--help", "--host", "--port", "-m", "--model", "-c", "--ctx-size", "-t", "--threads",
           "-np", "--parallel")
TAKES_VALUE = {"--host", "--port", "-m", "--model", "-c", "--ctx-size", "-t", "--threads", "-np", "--parallel"}


def usage() -> None:
    if os.environ.get("OLD_SERVER_HELP") == "broken":
        print("usage: server (help unavailable)")
        sys.exit(1)
    print("usage: ./server [options]\n\noptions:")
    for opt in OPTIONS:
        print(f"  {opt}")


def parse(argv):
    args = {"host": "127.0.0.1", "port": 8080}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            usage()
            sys.exit(0)
        if a not in OPTIONS:
            print(f"error: unknown argument: {a}", file=sys.stderr)
            usage()
            sys.exit(1)
        if a in TAKES_VALUE:
            args[a.lstrip("-")] = argv[i + 1]
            i += 1
        i += 1
    return args


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _send(self, code, body: bytes, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b'{"status": "ok"}')
        elif self.path == "/props":
            self._send(200, json.dumps({"total_slots": 1}).encode())
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path != "/completion":
            self._send(404, b'{"error": "not found"}')
            return
        n = int(body.get("n_predict", 8))
        words = len(str(body.get("prompt", "")).split())
        chunks = [{"content": " w", "stop": False} for _ in range(n)]
        chunks.append({"content": "", "stop": True, "tokens_predicted": n, "tokens_evaluated": words,
                       "timings": {"predicted_n": n, "predicted_per_second": 100.0, "prompt_n": words}})
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
        time.sleep(0.01)
        self._send(200, data, "text/event-stream")


def main() -> None:
    argv = sys.argv[1:]
    if os.environ.get("OLD_SERVER_ARGS"):
        with open(os.environ["OLD_SERVER_ARGS"], "a") as f:
            f.write(json.dumps(argv) + "\n")
    args = parse(argv)
    server = ThreadingHTTPServer((args["host"], int(args["port"])), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
