"""Each throughput figure beside the demo engine's in-process timing of the same requests.

    python bench/bench_metric_definitions.py [--device cpu|cuda] [--samples 6]
        [--requests 4] [--prompt-tokens 32] [--output-tokens 128] [--quick]

One boot of the demo engine at HEAD per mode (on cuda: CUDA graphs on, then
off; on cpu: one mode, CUDA graphs cannot apply), a warmup, then ``--samples``
sample windows measured by the harness's own client exactly as a run measures
them, with the server's token counter scraped around each window. The windows
alternate two ways of holding the HTTP client, side by side in one boot:

- ``session``: one client and the model name per boot (``client.boot_session``),
  made before any window opens, as the executor does now;
- ``own_client``: each sample makes its own client and asks ``/v1/models`` inside
  the window, as the executor did before (the 7-16% gap seen on an H200).

Figures per sample (names as in docs/hypotheses-format.md, "What each number means"):

- ``tok_s``: the client's end-to-end tok/s (output tokens over the sample window);
- ``decode_tok_s``: the client's decode tok/s (tokens after each first chunk over
  the first-to-last-chunk times);
- ``gen_tok_rate``: the server counter ``demo_generation_tokens_total``, its increase
  between the scrapes around the window per second between them;
- ``engine_decode_tok_s``: the engine's in-process decode rate for the same
  requests (``engine_timing``: decode tokens over first-to-last-token-ready times);
- ``engine_cycle_tok_s``: decode tokens over the decode cycles' compute alone
  (the ``decode cycle: X ms/cyc`` figure's rate);
- ``client_e2e_tok_s`` / ``engine_e2e_tok_s``: output tokens over the summed
  per-request end-to-end times, as the client saw them and as the server did
  (``server_s``: request handed to the workers -> last token back).

Ratios (per sample, of two figures of its requests, then the median over the
samples of each kind): the ones that measure the same thing (goal within 1%) and
the ones that do not, whose gap names what lies between them. Gaps, per sample
(medians printed):

- ``decode_span_gap_ms`` and ``e2e_gap_ms``: the mean per-request differences
  (client minus engine) of the decode span and of the whole request;
- ``first_chunk_lag_ms`` and ``last_chunk_lag_ms``: where a decode span gap comes
  from. Per request, the client's stamp of its first (last) output chunk minus the
  engine's ready time of its first (last) token, both on the host's monotonic clock
  (``RequestRecord.sent_at``, ``engine_timing.first_token_at``/``last_token_at``);
  their difference is ``-decode_span_gap_ms``;
- ``scrape_window_extra_ms``: the counter's seconds (between the scrapes) minus the
  client's sample window.

The counter's increase is checked against the client's token count
(``tokens_match``). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bisect_harness.measure import client  # noqa: E402
from bisect_harness.demo import create_demo_repo  # noqa: E402
from bisect_harness.model import BenchmarkSpec  # noqa: E402
from bisect_harness.engines.presets import get_preset  # noqa: E402
from bisect_harness.engines.server import ServerProcess, free_port  # noqa: E402
from bisect_harness.measure.sources import SourceCollector, parse_source  # noqa: E402
# What a run has loaded before its first sample window (numpy.ma among it, which the
# client's first percentile would import inside the first window: 5 ms here).
import bisect_harness.run.executor  # noqa: E402,F401

DEMO = get_preset("demo")
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COUNTER = parse_source({"name": "gen_tok_rate", "from": "prometheus", "metric": "demo_generation_tokens_total",
                        "kind": "rate", "unit": "tok/s", "better": "higher"}, "bench")
TOKENS = parse_source({"name": "gen_tokens", "from": "prometheus", "metric": "demo_generation_tokens_total",
                       "kind": "delta", "better": "higher"}, "bench")

#: Ratios of two figures that measure the same thing (goal: within 1%), by key.
SAME = {
    "decode_tok_s_vs_engine": ("decode_tok_s", "engine_decode_tok_s"),
    "gen_tok_rate_vs_tok_s": ("gen_tok_rate", "tok_s"),
}
#: Ratios of figures that differ by definition; the gap is what lies between them.
APART = {
    "client_e2e_vs_engine_e2e": ("client_e2e_tok_s", "engine_e2e_tok_s"),
    "tok_s_vs_decode_tok_s": ("tok_s", "decode_tok_s"),
    "tok_s_vs_client_e2e": ("tok_s", "client_e2e_tok_s"),
    "engine_decode_vs_cycles": ("engine_decode_tok_s", "engine_cycle_tok_s"),
    "tok_s_vs_engine_cycles": ("tok_s", "engine_cycle_tok_s"),
}


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def sample_figures(detail: client.SampleDetail, counter: dict[str, float]) -> dict[str, float]:
    """One sample's figures from the client's records and the engine's own timing."""
    ok = [r for r in detail.requests if r.ok]
    timing = [(r.usage or {}).get("engine_timing") or {} for r in ok]
    missing = sum(1 for t in timing if "first_token_at" not in t)
    if missing:
        raise SystemExit(f"{missing} response(s) carried no usage.engine_timing: is the demo engine current?")
    tokens = sum(r.output_tokens for r in ok)
    dec_tok = sum(t["decode_tokens"] for t in timing)
    return {
        "tok_s": detail.result.metrics["tok_s"],
        "decode_tok_s": detail.result.metrics["decode_tok_s"],
        "gen_tok_rate": counter.get("gen_tok_rate", math.nan),
        "engine_decode_tok_s": _ratio(dec_tok, math.fsum(t["decode_s"] for t in timing)),
        "engine_cycle_tok_s": _ratio(dec_tok, math.fsum(t["decode_cycles_s"] for t in timing)),
        "client_e2e_tok_s": _ratio(tokens, math.fsum(r.e2e_s for r in ok)),
        "engine_e2e_tok_s": _ratio(tokens, math.fsum(t["server_s"] for t in timing)),
        "ttft_ms": detail.result.metrics["ttft_ms"],
        "engine_prefill_ms": 1e3 * statistics.fmean(t["prefill_s"] for t in timing),
        "engine_cycle_ms": _ratio(1e3 * math.fsum(t["decode_cycles_s"] for t in timing),
                                  sum(t["decode_cycles"] for t in timing)),
        "decode_span_gap_ms": 1e3 * statistics.fmean(r.decode_s - t["decode_s"] for r, t in zip(ok, timing)),
        "e2e_gap_ms": 1e3 * statistics.fmean(r.e2e_s - t["server_s"] for r, t in zip(ok, timing)),
        "first_chunk_lag_ms": 1e3 * statistics.fmean(r.sent_at + r.ttft_s - t["first_token_at"]
                                                     for r, t in zip(ok, timing)),
        "last_chunk_lag_ms": 1e3 * statistics.fmean(r.sent_at + r.ttft_s + r.decode_s - t["last_token_at"]
                                                    for r, t in zip(ok, timing)),
        "tokens_match": float(counter.get("gen_tokens", -1) == tokens),
        # The counter's seconds (between the scrapes) minus the client's sample window:
        # the client's own work before its first request and after its last stream.
        "scrape_window_extra_ms": 1e3 * (_ratio(counter.get("gen_tokens", math.nan),
                                                counter.get("gen_tok_rate", math.nan)) - detail.result.duration_s),
        "window_s": detail.result.duration_s,
    }


def run_mode(tree: Path, flags: list[str], bench: BenchmarkSpec, samples: int, log: Path) -> dict:
    port = free_port()
    argv = [a.format(python=sys.executable, host="127.0.0.1", port=port) for a in DEMO.launch] + flags
    base = f"http://127.0.0.1:{port}"
    rows: dict[str, list[dict[str, float]]] = {"session": [], "own_client": []}
    with ServerProcess(argv, env={**os.environ, **SAFETY_ENV}, cwd=tree, log_path=log, base_url=base,
                       health_path=DEMO.health_path, ready_timeout_s=DEMO.ready_timeout_s):
        client.warmup(base, bench)
        collector = SourceCollector([COUNTER, TOKENS], base, None)
        with client.boot_session(base, bench) as (http, resolved):
            for i in range(2 * samples):
                kind = ("session", "own_client")[i % 2]
                collector.begin_sample()
                if kind == "session":  # each sample its own prompts, as a boot numbers them
                    detail = client.measure_sample_detail(base, resolved, client=http, sample=i + 1)
                else:
                    detail = client.measure_sample_detail(base, bench, sample=i + 1)
                counter = collector.end_sample(detail.responses, detail.result.duration_s)
                rows[kind].append(sample_figures(detail, counter))
        problems = collector.problems()
        if problems:
            raise SystemExit("counter scrape failed: " + "; ".join(problems))
        info = httpx.get(base + "/server_info", timeout=10, trust_env=False).json()
    out: dict = {"device": info["device"], "cuda_graph": info["cuda_graph"]}
    for kind, figs in rows.items():
        med = {k: statistics.median(f[k] for f in figs) for k in figs[0]}
        med["tokens_match"] = all(f["tokens_match"] == 1.0 for f in figs)
        # Each ratio pairs two figures of the same sample's requests; then the median
        # over samples (a ratio of the figures' medians could pair two samples).
        ratios = {name: statistics.median(_ratio(f[a], f[b]) for f in figs)
                  for name, (a, b) in {**SAME, **APART}.items()}
        out[kind] = {"median": med, "ratios": ratios}
    return out


def _fmt(x: float, digits: int = 4) -> str:
    return "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.{digits}f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--samples", type=int, default=6, help="sample windows of each kind per mode")
    ap.add_argument("--requests", type=int, default=4, help="requests per sample")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 samples of 2 requests of 32 tokens")
    args = ap.parse_args(argv)
    if args.quick:
        args.samples, args.requests, args.output_tokens = 2, 2, 32
    bench = BenchmarkSpec(api="completions", prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                          requests_per_sample=args.requests, warmup_requests=args.warmup, concurrency=1)
    modes = {"graphs_on": ["--device", "cuda"], "graphs_off": ["--device", "cuda", "--disable-cuda-graph"]} \
        if args.device == "cuda" else {"cpu": ["--device", "cpu"]}
    started = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-metric-defs-") as tmp:
        tmp = Path(tmp)
        hist = create_demo_repo(tmp / "engine")
        tree = tmp / "head"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), hist.head], cwd=hist.path, check=True,
                       capture_output=True)
        subprocess.run([a.format(python=sys.executable) for a in DEMO.build], cwd=tree, check=True,
                       capture_output=True)
        for name, flags in modes.items():
            results[name] = run_mode(tree, flags, bench, args.samples, tmp / f"{name}.log")
            print(f"{name}: done ({time.monotonic() - started:.0f} s)", flush=True)

    for name, res in results.items():
        print(f"\n== {name} (device {res['device']}, cuda_graph {res['cuda_graph']})")
        for kind in ("session", "own_client"):
            med, ratios = res[kind]["median"], res[kind]["ratios"]
            print(f"  {kind}: " + ", ".join(f"{k} {_fmt(med[k], 1)}" for k in (
                "tok_s", "decode_tok_s", "gen_tok_rate", "engine_decode_tok_s", "engine_cycle_tok_s",
                "client_e2e_tok_s", "engine_e2e_tok_s")))
            print(f"    ttft {_fmt(med['ttft_ms'], 3)} ms, engine prefill {_fmt(med['engine_prefill_ms'], 3)} ms, "
                  f"cycle {_fmt(med['engine_cycle_ms'], 4)} ms, decode span client-engine "
                  f"{_fmt(med['decode_span_gap_ms'], 3)} ms, e2e client-engine {_fmt(med['e2e_gap_ms'], 3)} ms, "
                  f"tokens match {med['tokens_match']}")
            print(f"    token ready -> client stamp: first chunk {_fmt(med['first_chunk_lag_ms'], 3)} ms, "
                  f"last chunk {_fmt(med['last_chunk_lag_ms'], 3)} ms; scrape window - sample window "
                  f"{_fmt(med['scrape_window_extra_ms'], 3)} ms")
            print("    same thing:  " + ", ".join(f"{k} {_fmt(ratios[k])}" for k in SAME))
            print("    not the same: " + ", ".join(f"{k} {_fmt(ratios[k])}" for k in APART))
    summary = {"device": args.device, "samples": args.samples, "requests": args.requests,
               "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
               "machine": platform.machine(), "seconds": round(time.monotonic() - started, 1),
               "modes": {name: {kind: {"ratios": {k: round(v, 4) for k, v in res[kind]["ratios"].items()},
                                       "median": {k: (round(v, 4) if isinstance(v, float) else v)
                                                  for k, v in res[kind]["median"].items()}}
                                for kind in ("session", "own_client")} | {"cuda_graph": res["cuda_graph"]}
                         for name, res in results.items()}}
    same = [res["session"]["ratios"][k] for res in results.values() for k in SAME]
    summary["same_within_1pct"] = all(abs(r - 1) <= 0.01 for r in same)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
