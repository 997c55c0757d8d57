"""A fake engine whose workers do what real ones do to escape their parent's process group.

    python chaos_engine.py PORT MARKER SEED MODE

MODE ``ok`` answers 200 on /health once its first workers exist; ``never``
answers 503 for ever. Workers, in an order and with delays drawn from SEED:

- ``setsid``: forked, leaves the session (``setsid``) and forks a child of its own;
- ``double-fork``: forked twice, the middle process exits, so the worker's parent is gone;
  on SIGTERM it double-forks a new process before it exits;
- ``exec``: a new interpreter in a session of its own that double-forks again;
- ``stubborn``: ignores SIGTERM (only SIGKILL ends it);
- ``late``: after the server is ready, a thread forks one more double-forked worker.

Every process keeps MARKER in its command line (forks inherit it; the exec'd
worker gets it as an argument) and in its environment (``CHAOS_MARK``), so a
test finds every one of them.
"""

from __future__ import annotations

import http.server
import os
import random
import signal
import subprocess
import sys
import threading
import time

EXEC_WORKER = """
import os, sys, time
if os.fork() == 0:
    if os.fork() == 0:
        while True:
            time.sleep(1)
    os._exit(0)
while True:
    time.sleep(1)
"""


def _sleep_for_ever() -> None:
    while True:
        time.sleep(1)


def _fork(body) -> None:
    """Run ``body`` in a forked child that never returns into our code."""
    if os.fork() == 0:
        try:
            body()
        finally:
            os._exit(0)


def _double_fork(body) -> None:
    def middle():
        _fork(body)  # the middle process exits at once: its child is an orphan

    pid = os.fork()
    if pid == 0:
        try:
            middle()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def setsid_worker() -> None:
    os.setsid()
    _fork(_sleep_for_ever)
    _sleep_for_ever()


def respawning_worker() -> None:
    def on_term(signum, frame):
        _double_fork(_sleep_for_ever)  # a last child, born while its tree is being killed
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    _sleep_for_ever()


def stubborn_worker() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _sleep_for_ever()


def main() -> None:
    port, marker, seed, mode = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rng = random.Random(seed)
    spawners = [
        lambda: _fork(setsid_worker),
        lambda: _double_fork(respawning_worker),
        lambda: subprocess.Popen([sys.executable, "-c", EXEC_WORKER, marker], start_new_session=True),
        lambda: _fork(stubborn_worker),
    ]
    rng.shuffle(spawners)
    for spawn in spawners:
        spawn()
        time.sleep(rng.uniform(0.0, 0.03))

    def late() -> None:
        time.sleep(rng.uniform(0.0, 0.3))
        _double_fork(_sleep_for_ever)

    threading.Thread(target=late, daemon=True).start()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(503 if mode == "never" else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()


if __name__ == "__main__":
    main()
