"""A demo-engine launch whose process tree does what real engines do to escape their parent.

    python chaos_wrap.py serve.py --host H --port P ...   (run in the demo's worktree)

Before the demo server starts, it leaves behind the chaos test's workers (a
``setsid`` worker with a child, a double-forked worker that double-forks again on
SIGTERM, an exec'd interpreter in a session of its own that double-forks, a worker
that ignores SIGTERM, and one more double-forked late), then execs the demo server
in its own place (same pid: the harness's server). Every worker carries
``CHAOS_MARK`` from the environment in its command line or environment, so
``bench_chaos_run.py`` finds each one.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import chaos_engine as ce  # noqa: E402  (the supervisor tests' workers)


def main() -> None:
    marker = os.environ["CHAOS_MARK"]
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "0")))
    spawners = [
        lambda: ce._fork(ce.setsid_worker),
        lambda: ce._double_fork(ce.respawning_worker),
        lambda: subprocess.Popen([sys.executable, "-c", ce.EXEC_WORKER, marker], start_new_session=True),
        lambda: ce._fork(ce.stubborn_worker),
        lambda: ce._double_fork(lambda: (time.sleep(rng.uniform(0.0, 2.0)), ce._double_fork(ce._sleep_for_ever))),
    ]
    rng.shuffle(spawners)
    for spawn in spawners:
        spawn()
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])


if __name__ == "__main__":
    main()
