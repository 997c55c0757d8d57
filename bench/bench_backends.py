"""The default demo bisection's wall time on each backend, side by side in one run.

Runs ``harness bisect hypotheses.yaml --good HEAD~26 --bad HEAD`` (the
repository's own experiment: the demo engine's planted HEAD regression) on the
local backend with one slot and with two (two boots at once on disjoint CPU
cores; the search probes two commits per round), and, with ``--slurm``, on the
Slurm backend with one and two jobs in flight (``SLURM_CONF`` must point at a
running cluster whose nodes share this filesystem; ``--start-cluster`` starts the
tests' local one). Each configuration gets a fresh ledger and the same warm
cache (worktrees made beforehand, so no configuration pays for them); trials
alternate between configurations so drift of the host lands on all of them.

Reported per configuration: wall seconds (median over trials), boots, whether
the culprit is the demo's planted one, and each wall time as a ratio to the
one-slot local run measured in the same trial.

    python bench/bench_backends.py [--trials 1] [--slurm] [--start-cluster]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bisect_harness.cli.measuring import EXIT_NO_CULPRIT  # noqa: E402  (a search that named no culprit still ran)


SPEC = ROOT / "hypotheses.yaml"


def _bisect(tmp: Path, env: dict, name: str, trial: int, args: list[str]) -> dict:
    db = tmp / f"{name}-{trial}.db"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "bisect", str(SPEC),
                           "--good", "HEAD~26", "--bad", "HEAD", "--ledger", f"sqlite:///{db}",
                           "--journal-dir", str(tmp / f"exp-{name}-{trial}"), "--json", *args],
                          env=env, cwd=tmp, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - start
    if proc.returncode not in (0, EXIT_NO_CULPRIT):
        return {"ok": False, "wall_s": wall, "exit_code": proc.returncode, "stderr": proc.stderr[-1500:]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"ok": True, "wall_s": wall, "boots": out.get("new_boots"), "culprit": out.get("culprit"),
            "probability": out.get("leader_probability"), "stopped": out.get("stopped")}


def _warm(cache: Path, env: dict) -> str:
    """Make the demo repository and a worktree for every commit of the range; return
    the planted culprit's sha."""
    os.environ["BISECT_HARNESS_CACHE"] = str(cache)
    from bisect_harness.engines.checkout import Workspace
    from bisect_harness.demo import ensure_demo_repo, read_demo_history

    repo = ensure_demo_repo(cache)
    ws = Workspace(repo, cache)
    good, bad = ws.resolve("HEAD~26"), ws.resolve("HEAD")
    for sha in ws.commits_between(good, bad):
        ws.worktree(sha)
    return read_demo_history(repo).events["regression"]


def main() -> int:
    global SPEC
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--slurm", action="store_true", help="also the Slurm backend, 1 and 2 jobs at once")
    ap.add_argument("--start-cluster", action="store_true", help="start the tests' local Slurm cluster first")
    ap.add_argument("--spec", type=Path, default=SPEC, help="hypotheses file whose engine is bisected "
                    "(experiments/demo-gpu/hypotheses.yaml on a GPU host: one GPU per slot)")
    args = ap.parse_args()
    SPEC = args.spec.resolve()
    configs = [("local-1", ["--backend", "local", "--slots", "1"]),
               ("local-2", ["--backend", "local", "--slots", "2"])]
    if args.slurm or args.start_cluster:
        configs += [("slurm-1", ["--backend", "slurm", "--slots", "1"]),
                    ("slurm-2", ["--backend", "slurm", "--slots", "2"])]
    cluster = None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        env = {**os.environ, "BISECT_HARNESS_CACHE": str(tmp / "cache")}
        if args.start_cluster:
            sys.path.insert(0, str(ROOT / "tests"))
            from slurm_cluster import SlurmCluster  # the tests' real slurmctld/slurmd/munged

            cluster = SlurmCluster(tmp / "slurm", nodes=2, cpus=2)
            cluster.start()
            env["SLURM_CONF"] = str(cluster.conf)
        try:
            culprit = _warm(tmp / "cache", env)
            results: dict[str, list[dict]] = {name: [] for name, _ in configs}
            for trial in range(args.trials):
                order = configs if trial % 2 == 0 else configs[::-1]
                for name, extra in order:
                    r = _bisect(tmp, env, name, trial, extra)
                    results[name].append(r)
                    print(f"trial {trial} {name}: {json.dumps(r)}", flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
    summary = {}
    base = [r["wall_s"] for r in results["local-1"]]
    for name, rs in results.items():
        ok = [r for r in rs if r["ok"]]
        walls = [r["wall_s"] for r in ok]
        ratios = [r["wall_s"] / b for r, b in zip(rs, base) if r["ok"]]
        summary[name] = {
            "trials": len(rs), "ok": len(ok),
            "wall_s_median": round(statistics.median(walls), 1) if walls else None,
            "wall_ratio_to_local_1": round(statistics.median(ratios), 3) if ratios else None,
            "boots_median": statistics.median([r["boots"] for r in ok]) if ok else None,
            "culprit_right": sum(1 for r in ok if culprit and r["culprit"] == culprit),
            "errors": [r.get("stderr", "")[-300:] for r in rs if not r["ok"]],
        }
    print(json.dumps({"spec": SPEC.relative_to(ROOT).as_posix() if SPEC.is_relative_to(ROOT) else SPEC.name,
                      "planted_culprit": culprit, "cpus": len(os.sched_getaffinity(0)), "results": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
