"""Does the trace reader keep its memory bounded as a profile grows?

A profiled sample of a real engine writes a torch-profiler Chrome trace of
millions of events (the demo engine's eager speculative sample on an H200: 1.05
million events, 17 MiB gzipped). ``boot.trace_summary.summarize_trace`` reads it
as a stream; the obvious alternative, ``json.load`` of the whole file, holds every
event at once. This bench writes gzipped traces of the shape torch writes (nested
CPU operators on two threads, CUDA runtime calls, kernels, graph launches,
copies) at growing sizes, and reads each both ways in a fresh child process,
alternated, reporting each one's seconds and peak resident memory above the
child's start (``ru_maxrss``) and the ratio of the two. The summary's kernel
count is checked against the events written. The last line printed is one JSON
object.

    python bench/bench_trace_summary.py [--events 100000,1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent


def write_trace(path: Path, steps: int) -> dict:
    """A gzipped Chrome trace of ``steps`` decode steps, ~10 events a step; returns
    what was written (events, kernels, graph launches)."""
    events = kernels = graphs = 0
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write('{"schemaVersion": 1, "traceEvents": [\n')
        first = True
        t = 0.0
        for i in range(steps):
            batch = [
                {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": t, "dur": 40.0},
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 2, "dur": 30.0},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 5,
                 "dur": 4.0, "args": {"correlation": i}},
                {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": t + 10, "dur": 12.0,
                 "args": {"correlation": i}},
                {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 2, "ts": t + 1, "dur": 6.0},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 2, "ts": t + 8,
                 "dur": 3.0},
                {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": 8,
                 "ts": t + 30, "dur": 1.0, "args": {"bytes": 8}},
                {"ph": "X", "cat": "kernel", "name": "flash_fwd", "pid": 0, "tid": 7, "ts": t + 24, "dur": 5.0},
                {"ph": "X", "cat": "user_annotation", "name": "decode_step", "pid": 1, "tid": 1, "ts": t,
                 "dur": 45.0},
                {"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 1, "tid": 1, "ts": t + 44, "s": "t"},
            ]
            for e in batch:
                f.write(("" if first else ",\n") + json.dumps(e))
                first = False
            events += len(batch)
            kernels += 2
            graphs += 1
            t += 50.0
        f.write("\n]}\n")
    return {"events": events, "kernels": kernels, "graph_launches": graphs}


_CHILD = r"""
import gzip, json, resource, sys, time
path, how, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if how == "stream":
    from bisect_harness.observe.trace_summary import summarize_trace
    s = summarize_trace(path, tokens=tokens, max_events=50_000_000, max_bytes=1 << 40)
    out = {"kernels": s.kernel_count, "graph_launches": s.graph_launches, "truncated": s.truncated}
else:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    out = {"kernels": sum(1 for e in ev if e.get("cat") == "kernel"),
           "graph_launches": sum(1 for e in ev if e.get("name") == "cudaGraphLaunch"), "truncated": False}
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({**out, "seconds": seconds, "peak_mib": (peak - before) / 1024}))
"""


def read(path: Path, how: str, tokens: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), how, str(tokens)], capture_output=True,
                          text=True, timeout=1800, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if proc.returncode != 0:
        raise SystemExit(f"reading {path.name} ({how}) failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", default="100000,1000000", help="trace sizes in events, comma-separated")
    ap.add_argument("--rounds", type=int, default=2, help="alternated reads of each size, each way")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.events.split(",") if x.strip()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            path = Path(tmp) / f"trace-{n}.json.gz"
            wrote = write_trace(path, max(1, n // 10))
            runs = {"stream": [], "json.load": []}
            for _ in range(args.rounds):
                for how in ("stream", "json.load"):
                    runs[how].append(read(path, how, tokens=max(1, n // 10)))
            for r in runs["stream"]:
                if r["kernels"] != wrote["kernels"] or r["graph_launches"] != wrote["graph_launches"] or r["truncated"]:
                    raise SystemExit(f"the summary of {path.name} does not count what was written: {r} vs {wrote}")
            med = {how: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "peak_mib")}
                   for how, rs in runs.items()}
            rows.append({"events": wrote["events"], "gzip_mib": round(path.stat().st_size / 2 ** 20, 2),
                         "stream_s": round(med["stream"]["seconds"], 3),
                         "stream_peak_mib": round(med["stream"]["peak_mib"], 1),
                         "json_load_s": round(med["json.load"]["seconds"], 3),
                         "json_load_peak_mib": round(med["json.load"]["peak_mib"], 1),
                         "peak_ratio_stream_over_load": round(med["stream"]["peak_mib"]
                                                              / max(med["json.load"]["peak_mib"], 1e-9), 3),
                         "time_ratio_stream_over_load": round(med["stream"]["seconds"]
                                                              / max(med["json.load"]["seconds"], 1e-9), 3)})
    print(f"{'events':>10} {'gz MiB':>7} {'stream s':>9} {'stream MiB':>11} {'load s':>8} {'load MiB':>9} "
          f"{'MiB ratio':>9} {'s ratio':>8}")
    for r in rows:
        print(f"{r['events']:>10} {r['gzip_mib']:>7} {r['stream_s']:>9} {r['stream_peak_mib']:>11} "
              f"{r['json_load_s']:>8} {r['json_load_peak_mib']:>9} {r['peak_ratio_stream_over_load']:>9} "
              f"{r['time_ratio_stream_over_load']:>8}")
    print(json.dumps({"bench": "trace_summary", "rounds": args.rounds, "sizes": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
