"""What Slurm adds to one boot: the same demo boot request run by ``run_boot`` in
this process and as a job through ``SlurmBackend`` on a real Slurm cluster started
on this host (munged, slurmctld, one slurmd; ``tests/slurm_cluster.py``),
alternating local and Slurm boots so both see the same machine.

Per Slurm boot it reports the job's ``queued_s`` (submission to the boot function
starting on the node: scheduling, job launch, interpreter start, imports),
``boot_s`` (the boot on the node), ``returned_s`` (the boot's end to the
controller seeing the outcome) and the wall time of ``backend.run``; per local
boot the wall time of ``run_boot``. The overhead is the median of the paired
differences (Slurm wall minus the local boot next to it). Needs ``slurm-wlm`` and
``munge`` installed (``.ci/run`` installs them). The last line is one JSON object.

    python bench/bench_slurm_overhead.py --boots 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test cluster: one definition for the tests and this bench

SPEC = """\
version: 1
engine: {preset: demo}
benchmark: {prompt_tokens: 8, output_tokens: 16, requests_per_sample: 2, warmup_requests: 1}
defaults: {samples_per_boot: 1, boots_per_arm: 2, max_boots_per_arm: 2}
hypotheses:
  - {id: same, baseline: {commit: HEAD}, treatment: {commit: HEAD, env: {X: "1"}}, metric: tok_s,
     expect: increase, min_effect: 10%}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--boots", type=int, default=10, help="boots on each side (default 10)")
    args = ap.parse_args()

    from slurm_cluster import SlurmCluster

    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        tmp = Path(tmp)
        os.environ["BISECT_HARNESS_CACHE"] = str(tmp / "cache")
        with SlurmCluster(tmp / "slurm", nodes=1, cpus=2) as cluster:
            os.environ["SLURM_CONF"] = str(cluster.conf)
            result = measure(tmp, args.boots)
            result["cluster"] = {"nodes": 1, "slurm": _slurm_version(), "config": "tests/slurm_cluster.py "
                                 "(batch_sched_delay=0, proctrack/linuxproc, no accounting)"}
    print_table(result)
    print(json.dumps(result))


def measure(tmp: Path, boots: int) -> dict:
    from bisect_harness.boot import Sink
    from bisect_harness.backends.procedure import run_boot
    from bisect_harness.backends.slurm import SlurmBackend, SlurmOptions
    from bisect_harness.plan.build import make_plan
    from bisect_harness.spec import load_spec

    (tmp / "h.yaml").write_text(SPEC)
    plan = make_plan(load_spec(tmp / "h.yaml"))
    config = plan.configs[0]
    ids = iter(range(1, 10_000))

    def request():
        i = next(ids)
        return plan.boot_request(config, boot_id=i, seq=i, log_path=tmp / "logs" / f"boot-{i}.log")

    class Keep(Sink):
        def finished(self, req, outcome):
            self.outcome = outcome

    warm = run_boot(request())  # builds the commit's environment once, for both sides
    assert warm.ok, warm.failure
    backend = SlurmBackend(SlurmOptions(time_limit_min=10, poll_s=0.2), slots=1, folder=tmp / "jobs")
    rows = []
    for i in range(boots):
        row = {}
        for side in (("local", "slurm") if i % 2 == 0 else ("slurm", "local")):
            t0 = time.perf_counter()
            if side == "local":
                out = run_boot(request())
            else:
                sink = Keep()
                backend.run([request()], sink)
                out = sink.outcome
            row[side] = time.perf_counter() - t0
            assert out.ok, (side, out.failure, out.log_tail)
            if side == "slurm":
                row.update({k: out.evidence.slurm[k] for k in ("queued_s", "boot_s", "returned_s")})
        rows.append(row)
        print(f"boot {i + 1}/{boots}: local {row['local']:.2f} s, slurm {row['slurm']:.2f} s "
              f"(queued {row['queued_s']:.2f}, on the node {row['boot_s']:.2f}, back {row['returned_s']:.2f})",
              file=sys.stderr)

    def med(key):
        return round(statistics.median(r[key] for r in rows), 3)

    overhead = [r["slurm"] - r["local"] for r in rows]
    return {"boots": boots, "local_wall_s": med("local"), "slurm_wall_s": med("slurm"),
            "overhead_s": round(statistics.median(overhead), 3),
            "overhead_range_s": [round(min(overhead), 3), round(max(overhead), 3)],
            "ratio_slurm_over_local": round(med("slurm") / med("local"), 3),
            "queued_s": med("queued_s"), "node_boot_s": med("boot_s"), "returned_s": med("returned_s"),
            "node_boot_over_local": round(med("boot_s") / med("local"), 3)}


def print_table(r: dict) -> None:
    print(f"{'per boot (median of ' + str(r['boots']) + ')':<34} seconds")
    for label, key in (("run_boot in this process", "local_wall_s"), ("SlurmBackend.run, one job", "slurm_wall_s"),
                       ("  submit -> boot starts on node", "queued_s"), ("  the boot on the node", "node_boot_s"),
                       ("  boot ends -> controller has it", "returned_s"), ("overhead (paired difference)",
                                                                            "overhead_s")):
        print(f"{label:<34} {r[key]:7.2f}")
    print(f"Slurm / local: {r['ratio_slurm_over_local']:.2f}x")


def _slurm_version() -> str:
    import subprocess

    out = subprocess.run(["sinfo", "--version"], capture_output=True, text=True)
    return out.stdout.strip()


if __name__ == "__main__":
    main()
