"""SIGKILL a real ``harness run`` at seeded random moments; count what survives and what is lost.

Each trial starts ``harness run`` (its own session, a fresh ledger) on the demo
engine launched through ``chaos_wrap.py``, whose workers double-fork, call
``setsid``, exec a new interpreter in a session of their own and ignore SIGTERM.
At a moment drawn from the seed (from before the first boot is ready to deep in
the sampling) the harness process alone gets SIGKILL. Then:

- the samples in the ledger are counted right after the kill;
- every process carrying the trial's marker is counted until none is left or
  20 s have passed (the supervisor must take the tree down on its own: SIGTERM,
  then SIGKILL after the server's 10 s grace for a worker that ignores SIGTERM);
- one later start of the harness (``harness run --resume``, which opens the
  ledger, marks the dead run's rows and boots; its first supervised start also
  reaps what a dead supervisor left) runs for a moment and is stopped; the
  marker's processes are counted again, and the samples recorded before the kill
  must all still be there.

Reported: trials, trials killed mid-run, engine processes alive after the kill
and after the later start, samples lost. ``--trials`` (default 30) and ``--seed``.

    python bench/bench_chaos_run.py [--trials 30] [--seed 20261130]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
WRAP = Path(__file__).resolve().with_name("chaos_wrap.py")

SPEC = """version: 1
engine:
  preset: demo
  launch: ["{python}", "%s", "serve.py", "--host", "{host}", "--port", "{port}"]
  env: {CHAOS_MARK: "%s", CHAOS_SEED: "%d"}
benchmark: {prompt_tokens: 16, output_tokens: 32, requests_per_sample: 2, warmup_requests: 1}
defaults: {samples_per_boot: 3, boots_per_arm: 3, max_boots_per_arm: 4, host_preflight_s: 0}
hypotheses:
  - id: h
    baseline: {commit: HEAD~1}
    treatment: {commit: HEAD}
    metric: tok_s
    expect: decrease
    min_effect: 5%%
"""


def marked(marker: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            env = p.info["environ"] or {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if marker in cmd or env.get("CHAOS_MARK") == marker:
            out.append(p.info["pid"])
    return [pid for pid in out if pid != os.getpid()]


def samples(db: Path) -> set[tuple]:
    try:
        with sqlite3.connect(db) as c:
            return set(c.execute("SELECT boot_id, seq, metrics FROM samples").fetchall())
    except sqlite3.Error:
        return set()


def harness(args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bisect_harness.cli", *args], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def trial(tmp: Path, env: dict, seed: int, i: int) -> dict:
    rng = random.Random(f"{seed}:{i}")
    marker = f"chaos-{uuid.uuid4().hex}"
    folder = tmp / f"t{i}"
    folder.mkdir()
    spec = folder / "hypotheses.yaml"
    spec.write_text(SPEC % (WRAP, marker, rng.randrange(1 << 30)))
    db = folder / "r.db"
    args = ["run", str(spec), "--ledger", f"sqlite:///{db}", "--journal-dir", str(folder / "exp"),
            "--no-calibration"]
    proc = harness(args, folder, env)
    delay = rng.uniform(0.5, 15.0)
    time.sleep(delay)
    ended_first = proc.poll() is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = samples(db)
    killed_at = time.monotonic()
    # The supervisor stops the tree on its own: SIGTERM, then SIGKILL after the
    # server's grace (10 s) for what ignores SIGTERM. Wait up to 20 s for it.
    after_kill = marked(marker)
    while after_kill and time.monotonic() - killed_at < 20.0:
        time.sleep(0.2)
        after_kill = marked(marker)
    gone_after = round(time.monotonic() - killed_at, 2)
    later = harness(["run", str(spec), "--resume", "--ledger", f"sqlite:///{db}", "--journal-dir",
                     str(folder / "exp"), "--no-calibration"], folder, env)
    time.sleep(3.0)
    if later.poll() is None:
        later.send_signal(signal.SIGINT)
        try:
            later.wait(timeout=60)
        except subprocess.TimeoutExpired:
            later.kill()
            later.wait()
    time.sleep(1.0)
    after_start = marked(marker)
    lost = before - samples(db)
    for pid in set(after_kill) | set(after_start):  # never leave anything behind the bench itself
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"trial": i, "kill_after_s": round(delay, 2), "run_had_ended": ended_first,
            "samples_at_kill": len(before), "tree_gone_after_s": gone_after, "alive_after_kill": len(after_kill),
            "alive_after_next_start": len(after_start), "samples_lost": len(lost)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=20261130)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "BISECT_HARNESS_CACHE": str(tmp / "cache"),
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        for i in range(args.trials):
            r = trial(tmp, env, args.seed, i)
            results.append(r)
            print(json.dumps(r), flush=True)
    killed = [r for r in results if not r["run_had_ended"]]
    print(json.dumps({
        "trials": len(results), "seed": args.seed, "killed_mid_run": len(killed),
        "killed_with_samples_recorded": sum(1 for r in killed if r["samples_at_kill"]),
        "trials_with_engine_processes_20s_after_kill": sum(1 for r in results if r["alive_after_kill"]),
        "engine_processes_20s_after_kill": sum(r["alive_after_kill"] for r in results),
        "tree_gone_after_s_max": max((r["tree_gone_after_s"] for r in results), default=None),
        "engine_processes_after_next_start": sum(r["alive_after_next_start"] for r in results),
        "samples_recorded_before_kills": sum(r["samples_at_kill"] for r in results),
        "samples_lost": sum(r["samples_lost"] for r in results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
