"""An OpenAI-compatible server (``hostile_engine``'s handler) with one behaviour per MODE
that a boot's marks must tell apart from a fault:

    python marks_engine.py --port N --mode MODE

- ``chatty``: answers truly and prints one line per request to stdout (the boot log),
  nothing before;
- ``extra-chunk``: every stream carries one text chunk more than the tokens its usage
  counts (nine chunks, ``completion_tokens`` 8), as llama.cpp's server of late 2023 does;
- ``extra-chunk-sometimes``: the same on every other request only (the counts disagree
  from request to request);
- ``http-wide``: answers truly, its HTTP port bound to every address (``0.0.0.0``);
- ``bootstrap-wide``: answers truly on 127.0.0.1 and starts two worker processes the way
  a collective-communication library bootstraps: rank 0 listens on ``0.0.0.0`` (a free
  port) and rank 1 connects to it and holds the connection while the server runs.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from http.server import ThreadingHTTPServer

import hostile_engine

MODE = "chatty"
SERVED = 0


class Handler(hostile_engine.Handler):
    def do_POST(self):
        global SERVED
        if MODE not in ("extra-chunk", "extra-chunk-sometimes"):
            super().do_POST()
            SERVED += 1
            if MODE == "chatty":
                print(f"marks_engine: served request {SERVED}", flush=True)
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        n = min(8, int(body.get("max_tokens", 8)))
        SERVED += 1
        extra = 1 if MODE == "extra-chunk" or SERVED % 2 == 0 else 0
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = [{"choices": [{"index": 0, "text": f" w{i}"}]} for i in range(n - 1)]
        chunks += [{"choices": [{"index": 0, "text": " w"}]}, {"choices": [{"index": 0, "text": "."}]}][:1 + extra]
        chunks.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n}})
        self._stream(chunks)


def _rank(rank: int, port: int) -> None:
    """A bootstrap's two ends: rank 0 listens on every address, rank 1 connects and holds on."""
    if rank == 0:
        srv = socket.create_server(("0.0.0.0", port))
        conn, _ = srv.accept()
        conn.recv(1)  # held until the peer goes
    else:
        for _ in range(200):
            try:
                peer = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.05)
        peer.recv(1)


def main() -> None:
    global MODE
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", default="chatty")
    ap.add_argument("--rank", type=int, default=None)
    a = ap.parse_args()
    if a.rank is not None:
        _rank(a.rank, a.port)
        return
    MODE = hostile_engine.MODE = a.mode
    host = "0.0.0.0" if MODE == "http-wide" else "127.0.0.1"
    if MODE == "bootstrap-wide":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        workers = [subprocess.Popen([sys.executable, __file__, "--port", str(port), "--rank", str(r)])
                   for r in (0, 1)]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not _connected(port, workers[1].pid):
            time.sleep(0.05)  # ready once the bootstrap is done, as an engine is
    ThreadingHTTPServer((host, a.port), Handler).serve_forever()


def _connected(port: int, pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/net/tcp") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return False
    return any(r.split()[2].endswith(f":{port:04X}") and r.split()[3] == "01" for r in rows)


if __name__ == "__main__":
    main()
