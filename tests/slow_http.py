"""A real HTTP server on 127.0.0.1 that sends every response one byte at a time,
``interval`` seconds apart, status line and headers included: the server that
outruns a per-read timeout (each byte restarts it).

In a test::

    with SlowServer(b'{"ok": true}', interval=0.05) as srv:
        read_server_info(None, srv.url, ["/server_info"], timeout_s=0.5)

As a server process (what a boot launches)::

    python tests/slow_http.py PORT [INTERVAL] [BODY_BYTES]

serves ``GET /health`` as a 200 with ``Content-Length: BODY_BYTES`` (default 100),
one byte every INTERVAL seconds (default 1).
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _handler(server: "SlowServer | None", body: bytes, interval: float, content_type: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _answer(self):
            if server is not None:
                with server.lock:
                    server.hits += 1
            head = (f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n").encode()
            self.close_connection = True
            try:
                for i in range(len(head) + len(body)):
                    if server is not None and server.stopping.is_set():
                        return
                    self.wfile.write((head + body)[i:i + 1])
                    self.wfile.flush()
                    time.sleep(interval)
            except OSError:  # the client gave up: what the test wants
                return

        def do_GET(self):
            self._answer()

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self._answer()

    return Handler


class SlowServer:
    """In-process: every request on any path is answered with ``body``, a byte at a time.
    ``hits`` counts the requests; leaving the block stops the dribbling."""

    def __init__(self, body: bytes, *, interval: float = 0.05, content_type: str = "application/json"):
        self.lock = threading.Lock()
        self.hits = 0
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self, body, interval, content_type))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "SlowServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def main(argv: list[str]) -> None:
    port = int(argv[1])
    interval = float(argv[2]) if len(argv) > 2 else 1.0
    size = int(argv[3]) if len(argv) > 3 else 100
    httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(None, b"x" * size, interval, "text/plain"))
    httpd.daemon_threads = True
    httpd.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    httpd.serve_forever()


if __name__ == "__main__":
    main(sys.argv)
