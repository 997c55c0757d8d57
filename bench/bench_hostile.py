"""Benchmark: the real ``harness run`` against servers that misbehave, with the cost of each.

Each mode of ``tests/hostile_engine.py`` (a small OpenAI-compatible server that
misbehaves one way on purpose) is one ``harness run`` of two configs, two boots
each, with a ``from: prometheus`` source on ``/metrics``; ``ok`` is the same
server behaving. For each mode: the harness's exit code, how its boots ended
(statuses, marks, the first failure or source problem), the harness process's
peak resident memory (polled every 50 ms) and the run's seconds, the memory and
seconds also as ratios to the ``ok`` run made in the same invocation. What a
bounded harness shows: a 64 MiB ``/metrics``, a gzip bomb that decodes to 1 GiB
and a stream line that never ends cost about what a good server costs, and end
as a recorded source problem or failed request with its reason, never a crash,
a believed number or gigabytes of memory.

    python bench/bench_hostile.py [--modes ok huge-metrics metrics-bomb long-line log-flood low-usage wrong-shape]

Measured on a shared 2-core x86 VM (Python 3.11, one invocation, 4 boots a mode
but 2 where the boots fail): the harness's peak RSS 195 MB with a good server;
64 MiB ``/metrics`` 194 MB (0.99x), the 1 GiB gzip bomb 194 MB (0.99x; 282 MB
when httpx inflated each received chunk whole), the endless stream line 226 MB
(1.16x: the 16 MiB line cap), all ending as a recorded source problem or a failed
boot with its reason. A server writing 1 GiB to stdout at each of 4 boots: 8.3 s
against 5.5 s for ``ok`` (1.5x), every boot log 64.0 MB (the first and last
32 MiB), the boots marked ``log_capped`` with the bytes dropped in their
provenance; the supervisor that writes the log peaked at 49 MB (16.5 MB otherwise).

The last line printed is one JSON object: per mode, the figures above.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "tests" / "hostile_engine.py"
MODES = ("ok", "huge-metrics", "metrics-bomb", "long-line", "log-flood", "low-usage", "wrong-shape")


def _spec(folder: Path, mode: str) -> Path:
    doc = {
        "version": 1,
        "engine": {"preset": "openai", "ready_timeout_s": 60,
                   "launch": [sys.executable, str(ENGINE), "--port", "{port}", "--mode", mode],
                   "metrics": [{"name": "gen_rate", "from": "prometheus", "metric": "hostile_generation_tokens_total",
                                "kind": "rate", "better": "higher"}]},
        "benchmark": {"prompt_tokens": 4, "output_tokens": 8, "requests_per_sample": 2, "warmup_requests": 0,
                      "ignore_eos": False, "request_timeout_s": 60},
        "defaults": {"boots_per_arm": 2, "max_boots_per_arm": 2, "samples_per_boot": 1, "boot_retries": 0,
                     "host_preflight_s": 0},
        "hypotheses": [{"id": "h", "baseline": {}, "treatment": {"env": {"BH_INERT": "1"}},
                        "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}],
    }
    path = folder / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _peak_rss(pid: int, stop: threading.Event, out: list[int], sup: list[int]) -> None:
    """The harness process's largest resident set, and its supervisors' (the processes
    that own each boot's tree and write its log), polled until ``stop``."""
    try:
        proc = psutil.Process(pid)
        while not stop.is_set():
            out.append(proc.memory_info().rss)
            for child in proc.children():
                try:
                    if any(a.endswith("supervisor.py") for a in child.cmdline()):
                        sup.append(child.memory_info().rss)
                except psutil.Error:
                    pass
            stop.wait(0.05)
    except psutil.Error:
        pass


def run_mode(work: Path, mode: str) -> dict:
    folder = work / mode
    folder.mkdir()
    db = folder / "r.db"
    cmd = [sys.executable, "-m", "bisect_harness.cli", "run", str(_spec(folder, mode)), "--json", "--no-calibration",
           "--ledger", f"sqlite:///{db}", "--journal-dir", str(folder / "exp")]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    stop, rss, sup = threading.Event(), [], []
    watcher = threading.Thread(target=_peak_rss, args=(proc.pid, stop, rss, sup), daemon=True)
    watcher.start()
    out, err = proc.communicate(timeout=900)
    stop.set()
    watcher.join()
    seconds = time.monotonic() - t0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        boots = con.execute("SELECT status, marks, failure, source_problems FROM boots ORDER BY id").fetchall()
    finally:
        con.close()
    statuses: dict[str, int] = {}
    for status, *_ in boots:
        statuses[status] = statuses.get(status, 0) + 1
    marks = sorted({m for _, mk, _, _ in boots for m in json.loads(mk or "[]")})
    failure = next((f for _, _, f, _ in boots if f), None)
    problem = next((p for *_, ps in boots for p in json.loads(ps or "[]")), None)
    return {"exit_code": proc.returncode, "traceback": "Traceback" in err, "boots": statuses, "marks": marks,
            "first_failure": failure and failure[:200], "first_source_problem": problem and str(problem)[:200],
            "peak_rss_mb": round(max(rss) / 2**20, 1) if rss else None,
            "supervisor_peak_rss_mb": round(max(sup) / 2**20, 1) if sup else None,
            "largest_log_mb": round(max((f.stat().st_size for f in (folder / "exp").rglob("*.log")), default=0)
                                    / 2**20, 1),
            "seconds": round(seconds, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    a = p.parse_args()
    modes = ["ok"] + [m for m in a.modes if m != "ok"]  # the reference first
    work = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    results = {}
    for mode in modes:
        results[mode] = r = run_mode(work, mode)
        ref = results["ok"]
        if mode != "ok" and ref["peak_rss_mb"] and r["peak_rss_mb"]:
            r["rss_vs_ok"] = round(r["peak_rss_mb"] / ref["peak_rss_mb"], 3)
            r["seconds_vs_ok"] = round(r["seconds"] / ref["seconds"], 3)
        print(f"{mode:13s} exit {r['exit_code']}  boots {r['boots']}  marks {r['marks']}  "
              f"peak RSS {r['peak_rss_mb']} MB (supervisor {r['supervisor_peak_rss_mb']} MB)  "
              f"largest log {r['largest_log_mb']} MB  {r['seconds']} s", flush=True)
    print(json.dumps({"bench": "hostile", "python": sys.version.split()[0], "cpus": os.cpu_count(),
                      "modes": results}), flush=True)
    return 0 if all(not r["traceback"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
