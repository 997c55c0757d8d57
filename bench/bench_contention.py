"""Contention figures of quiet and busy windows on this host, side by side.

    python bench/bench_contention.py [--trials 3] [--seconds 6] [--burners 2]

States, in this order within each trial (so slow drift lands on all of them):

- ``quiet``  nothing of ours but the demo server;
- ``busy``   ``--burners`` Python busy loops of the bench's own (started detached, so
  they are *foreign* to the monitored tree, as a neighbour's job is; each has a
  deadline and is stopped by the bench).

For each state two windows are measured: ``idle`` (the demo server booted but
idle: what the preflight sees) and ``load`` (the demo server streaming
completions: what a boot's sampling window sees), plus a CPU calibration probe
(its spread is judged too). The table gives the median of each figure over the
trials; the last line is one JSON object: the figures per state and window, the
demo's tok/s ratio busy/quiet measured side by side, and which figures each
window crossed with the default thresholds (``contention.Thresholds``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_demo import DEMO_LAUNCH, boot, stream_once  # noqa: E402
from bisect_harness.observe import calibration, contention  # noqa: E402
from bisect_harness.demo import create_demo_repo  # noqa: E402

#: Started by an intermediate process that exits at once, so the loops are not
#: descendants of the bench (whose tree the monitor counts as its own).
LAUNCHER = """
import subprocess, sys
n, seconds = int(sys.argv[1]), float(sys.argv[2])
loop = f"import time\\nend = time.time() + {seconds}\\nwhile time.time() < end: pass"
procs = [subprocess.Popen([sys.executable, "-c", loop], start_new_session=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
print(" ".join(str(p.pid) for p in procs), flush=True)
"""

FIGURES = ("foreign_cpu_share", "foreign_runnable_per_core", "cpu_pressure", "io_pressure", "memory_pressure",
           "steal", "host_cpu_busy")


def start_burners(n: int, seconds: float) -> list[int]:
    out = subprocess.run([sys.executable, "-c", LAUNCHER, str(n), str(seconds)], capture_output=True,
                         text=True, check=True, timeout=30)
    return [int(p) for p in out.stdout.split()]


def stop_burners(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)  # each loop leads its own session
        except ProcessLookupError:
            pass


def load_window(client, server_pid: int, seconds: float, tokens: int) -> tuple[contention.Window, float]:
    """Stream completions for ``seconds`` under a monitor; returns the window and tok/s."""
    with contention.Monitor(server_pid=server_pid, interval_s=0.5) as mon:
        t0 = time.perf_counter()
        total = 0
        while time.perf_counter() - t0 < seconds:
            total += stream_once(client, tokens)
        rate = total / (time.perf_counter() - t0)
    return mon.window(), rate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each window")
    ap.add_argument("--burners", type=int, default=2, help="busy loops in the busy state")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args(argv)
    thresholds = contention.Thresholds()
    rows: dict[tuple[str, str], list[dict]] = {}
    rates: dict[str, list[float]] = {"quiet": [], "busy": []}
    spreads: dict[str, list[float]] = {"quiet": [], "busy": []}
    crossed: dict[str, set] = {}
    neighbours: dict[str, set] = {}  # the busiest foreign processes seen: in "quiet", someone else's jobs
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as tmp:
        tmp = Path(tmp)
        hist = create_demo_repo(tmp / "engine")
        subprocess.run([a.format(python=sys.executable) for a in DEMO_LAUNCH.build], cwd=hist.path,
                       check=True, capture_output=True)
        pids: list[int] = []
        try:
            with boot(hist.path, ["--device", "cpu"], {}, tmp / "server.log") as client:
                stream_once(client, args.tokens)  # warm-up
                server_pid = _server_pid(hist.path)
                for trial in range(args.trials):
                    for state in ("quiet", "busy"):
                        if state == "busy":
                            pids = start_burners(args.burners, 4 * args.seconds + 60)
                        try:
                            idle = contention.Monitor(server_pid=server_pid, interval_s=0.5)
                            with idle:
                                threading.Event().wait(args.seconds)  # the idle window itself
                            windows = {"idle": idle.window()}
                            windows["load"], rate = load_window(client, server_pid, args.seconds, args.tokens)
                            rates[state].append(rate)
                            cal = calibration.calibrate("cpu", seconds_budget=1.0)
                            spreads[state].append(max(m.spread for m in cal.measurements))
                        finally:
                            stop_burners(pids)
                            pids = []
                        for kind, w in windows.items():
                            rows.setdefault((state, kind), []).append(dict(w.figures))
                            for p in w.details.get("top_foreign", [])[:3]:
                                neighbours.setdefault(f"{state}/{kind}", set()).add(p["name"])
                            crossed.setdefault(f"{state}/{kind}", set()).update(
                                c.figure for c in contention.judge(w, thresholds))
                        print(f"trial {trial + 1}/{args.trials} {state:<5} load {rate:6.1f} tok/s  "
                              f"{contention.summary_line(windows['load'])}", flush=True)
        finally:
            stop_burners(pids)
    med = {f"{s}/{k}": {f: round(statistics.median(r.get(f, 0.0) for r in v), 4) for f in FIGURES}
           for (s, k), v in rows.items()}
    print()
    print(f"{'window':<11}" + "".join(f"{f[:18]:>19}" for f in FIGURES))
    for name, figs in med.items():
        print(f"{name:<11}" + "".join(f"{figs[f]:>19.3f}" for f in FIGURES))
    q, b = statistics.median(rates["quiet"]), statistics.median(rates["busy"])
    print(f"\ndemo tok/s under load: quiet {q:.1f}, busy {b:.1f} (busy/quiet {b / q:.3f}); calibration spread "
          f"quiet {statistics.median(spreads['quiet']):.1%}, busy {statistics.median(spreads['busy']):.1%}")
    print(json.dumps({
        "trials": args.trials, "seconds": args.seconds, "burners": args.burners, "cores": os.cpu_count(),
        "figures": med, "tok_s_busy_over_quiet": round(b / q, 3),
        "calibration_spread": {s: round(statistics.median(v), 4) for s, v in spreads.items()},
        "crossed_default_thresholds": {k: sorted(v) for k, v in crossed.items()},
        "top_foreign_names": {k: sorted(v) for k, v in neighbours.items()},
        "thresholds": thresholds.to_dict()}))
    return 0


def _server_pid(cwd: Path) -> int:
    """The demo server's root process: the child of this bench whose cwd is the engine."""
    import psutil

    for child in psutil.Process().children():
        try:
            if Path(child.cwd()) == cwd:
                return child.pid
        except psutil.Error:
            continue
    raise RuntimeError("demo server process not found")


if __name__ == "__main__":
    sys.exit(main())
