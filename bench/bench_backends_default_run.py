"""The repository's default experiment (``hypotheses.yaml``: three hypotheses and a
bisection of the demo engine's planted regression) on each backend, timed side by
side: the local backend with 1 and 2 slots, and the Slurm backend with one job at a
time (one node) and two (two nodes, a job filling a node) on a real two-node Slurm
cluster started on this host (``tests/slurm_cluster.py``). Each run has a fresh
cache, as ``bench/bench_default_run.py`` does. Reports wall time, verdicts, the
culprit, boots, and for Slurm the median per-boot ``queued_s``.

    python bench/bench_backends_default_run.py                       # all four
    python bench/bench_backends_default_run.py --only local-1 slurm-1

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
sys.path.insert(0, str(ROOT / "tests"))  # the test cluster

SETUPS = {"local-1": ("local", 1), "local-2": ("local", 2), "slurm-1": ("slurm", 1), "slurm-2": ("slurm", 2)}


def run_one(tmp: Path, name: str, spec: Path) -> dict:
    kind, slots = SETUPS[name]
    where = tmp / name
    where.mkdir()
    env = {**os.environ, "BISECT_HARNESS_CACHE": str(where / "cache")}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "run", str(spec), "--backend", kind,
                           "--slots", str(slots), "--ledger", f"sqlite:///{where / 'results.db'}",
                           "--journal-dir", str(where / "exp"), "--json"], env=env, cwd=where,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"ok": False, "exit_code": proc.returncode, "wall_s": round(wall, 1), "stderr": proc.stderr[-1500:]}
    summary = json.loads(proc.stdout.strip().splitlines()[-1])

    from bisect_harness.demo import read_demo_history
    from bisect_harness.ledger import Bisection, Boot, Ledger
    from sqlalchemy import select

    events = read_demo_history(next((where / "cache").glob("demo-engine-v*"))).events
    with Ledger(f"sqlite:///{where / 'results.db'}") as led:
        bis = led.session.scalars(select(Bisection)).first()
        result = (bis.result or {}) if bis else {}
        boots = led.session.scalars(select(Boot)).all()
        queued = [b.provenance["slurm"]["queued_s"] for b in boots
                  if b.status == "ok" and b.provenance and b.provenance.get("slurm", {}).get("queued_s") is not None]
        nodes = sorted({b.provenance["slurm"]["node"] for b in boots
                        if b.provenance and b.provenance.get("slurm", {}).get("node")})
    out = {"ok": True, "wall_s": round(wall, 1), "boots": len(boots),
           "verdicts": {h["id"]: h["verdict"] for h in summary["hypotheses"]},
           "culprit_correct": result.get("culprit") == events["regression"], "bisection_boots": result.get("new_boots")}
    if kind == "slurm":
        out.update(queued_s_median=round(statistics.median(queued), 3) if queued else None, nodes=nodes)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=sorted(SETUPS), default=list(SETUPS))
    args = ap.parse_args()
    from slurm_cluster import SlurmCluster

    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-backends-") as tmp:
        tmp = Path(tmp)
        # the default file, plus the Slurm keys for the Slurm runs: a job takes a whole node
        spec = tmp / "hypotheses.yaml"
        spec.write_text((ROOT / "hypotheses.yaml").read_text()
                        + "\nbackend:\n  kind: slurm\n  cpus_per_boot: 2\n  time_limit_min: 20\n  poll_s: 0.2\n")
        cluster = None
        try:
            if any(SETUPS[n][0] == "slurm" for n in args.only):
                cluster = SlurmCluster(tmp / "slurm", nodes=2, cpus=2).start()
                os.environ["SLURM_CONF"] = str(cluster.conf)
            for name in args.only:
                results[name] = r = run_one(tmp, name, spec)
                print(f"{name:8s} {r['wall_s']:7.1f} s  boots {r.get('boots')}  verdicts {r.get('verdicts')}  "
                      f"culprit correct {r.get('culprit_correct')}", file=sys.stderr, flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
    base = results.get("local-1", {}).get("wall_s")
    for name, r in results.items():
        if base and r.get("ok"):
            r["wall_over_local_1"] = round(r["wall_s"] / base, 3)
    print(f"{'setup':8s} {'wall s':>8s} {'boots':>6s} {'x local-1':>10s}")
    for name, r in results.items():
        print(f"{name:8s} {r['wall_s']:8.1f} {r.get('boots', 0):6d} {r.get('wall_over_local_1', float('nan')):10.2f}")
    print(json.dumps(results))
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
