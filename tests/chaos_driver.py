"""The harness side of the chaos test: one ServerProcess on the chaos engine.

    python chaos_driver.py DIR MARKER SEED MODE

MODE ``wait``: boot, write DIR/ready, then wait to be signalled. ``stop``: boot,
wait a moment drawn from SEED, stop, exit 0. ``timeout``: the engine never gets
ready; the boot times out after a moment drawn from SEED (exit 3).
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import faulthandler
import signal

from bisect_harness.errors import BootTimeout
from bisect_harness.engines.server import ServerProcess, free_port


def main() -> int:
    faulthandler.register(signal.SIGUSR1)  # a hung trial can be asked for its stacks
    folder, marker, seed, mode = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rng = random.Random(seed)
    port = free_port()
    engine = Path(__file__).with_name("chaos_engine.py")
    server = ServerProcess(
        [sys.executable, str(engine), str(port), marker, str(seed), "never" if mode == "timeout" else "ok"],
        env=dict(os.environ, CHAOS_MARK=marker), cwd=folder, log_path=folder / "boot.log",
        base_url=f"http://127.0.0.1:{port}", poll_interval_s=0.02, grace_s=0.3,
        ready_timeout_s=rng.uniform(0.1, 0.6) if mode == "timeout" else 30, record=folder / "supervised")
    try:
        server.start()
    except BootTimeout:
        return 3
    (folder / "ready").write_text(str(server.pid))
    if mode == "stop":
        time.sleep(rng.uniform(0.0, 0.3))
        server.stop()
        return 0
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
