"""Benchmark the demo engine's known effects, interleaved over repeated boots.

    python bench/bench_demo.py [--rounds 3] [--requests 4] [--tokens 64]
    python bench/bench_demo.py --curve [--concurrency 1,2,4,8,16] [--spec-steps 2] [--rounds 2]

Arms (each booted once per round, in an order that rotates every round):

- ``good``        the commit before the regression event, plain environment
- ``regressed``   the regression commit
- ``tuned``       ``good`` with DEMO_COMM_TUNING=1
- ``attn_decode`` ``good`` with --attention-mode decode (the default is prefill)
- ``spec2``       ``good`` with --speculative-num-steps 2

A sample is the output tok/s of one boot (tokens over wall time of its timed
requests, streamed one at a time). The last line printed is one JSON object
with each ratio of medians against ``good`` (higher = faster).

``--curve``: speculative decoding along the load curve. HEAD plain and HEAD with
``--speculative-num-steps`` (booted in turn, the order swapped every round) are
measured by the harness's own client (``measure_sample``, closed loop) at each
concurrency, with the mean batch the engine ran over each sample (the change in
its ``demo_decode_batch_size`` histogram). Drafting pays while the batch leaves
the modeled device idle and costs once the batch is bound by its tokens: the
JSON line holds each point's spec/plain ratio of medians and where it crosses 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bisect_harness.demo import create_demo_repo  # noqa: E402
from bisect_harness.engines.presets import get_preset  # noqa: E402
from bisect_harness.measure.client import measure_sample, warmup  # noqa: E402
from bisect_harness.model import BenchmarkSpec  # noqa: E402

DEMO_LAUNCH = get_preset("demo")

PROMPT = " ".join(f"w{i}" for i in range(1, 33))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def boot(path: Path, flags: list[str], env: dict[str, str], log: Path):
    port = free_port()
    argv = [a.format(python=sys.executable, host="127.0.0.1", port=port) for a in DEMO_LAUNCH.launch]
    with open(log, "ab") as fh:
        proc = subprocess.Popen([*argv, *flags], cwd=path, env={**os.environ, **env}, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
    try:
        deadline = time.monotonic() + DEMO_LAUNCH.ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready in {DEMO_LAUNCH.ready_timeout_s}s; see {log}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(DEMO_LAUNCH.health_path).status_code == 200:
                    break
            time.sleep(0.1)
        yield client
    finally:
        client.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def stream_once(client: httpx.Client, tokens: int) -> int:
    body = {"model": "demo", "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    completion = 0
    with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    completion = usage["completion_tokens"]
    if completion != tokens:
        raise RuntimeError(f"expected {tokens} tokens, the server reported {completion}")
    return completion


def measure(client: httpx.Client, requests: int, tokens: int, warmup: int) -> float:
    for _ in range(warmup):
        stream_once(client, tokens)
    t0 = time.perf_counter()
    total = sum(stream_once(client, tokens) for _ in range(requests))
    return total / (time.perf_counter() - t0)


def mean_batch(client: httpx.Client) -> tuple[float, float]:
    """The sum and count of the engine's ``demo_decode_batch_size`` histogram."""
    figures = dict(line.split() for line in client.get("/metrics").text.splitlines()
                   if line.startswith(("demo_decode_batch_size_sum", "demo_decode_batch_size_count")))
    return float(figures["demo_decode_batch_size_sum"]), float(figures["demo_decode_batch_size_count"])


def curve_point(client: httpx.Client, concurrency: int, tokens: int) -> tuple[float, float, float]:
    """tok/s, ITL (ms) and mean batch of one sample at ``concurrency``, by the harness's client."""
    base = str(client.base_url).rstrip("/")
    bench = BenchmarkSpec(model="demo", prompt_tokens=16, output_tokens=tokens, concurrency=concurrency,
                          requests_per_sample=max(8, 4 * concurrency), warmup_requests=concurrency)
    warmup(base, bench)
    s0, n0 = mean_batch(client)
    outcome = measure_sample(base, bench)
    s1, n1 = mean_batch(client)
    return outcome.metrics["tok_s"], outcome.metrics["itl_ms"], (s1 - s0) / max(1.0, n1 - n0)


def curve(args) -> int:
    points = [int(c) for c in args.concurrency.split(",")]
    arms = {"plain": [], f"spec{args.spec_steps}": ["--speculative-num-steps", str(args.spec_steps)]}
    runs: dict[str, list[dict[int, tuple[float, float, float]]]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        tmp = Path(tmp)
        hist = create_demo_repo(tmp / "engine")
        head = tmp / "head"
        subprocess.run(["git", "worktree", "add", "--detach", str(head), hist.head], cwd=hist.path,
                       check=True, capture_output=True)
        subprocess.run([a.format(python=sys.executable) for a in DEMO_LAUNCH.build], cwd=head,
                       check=True, capture_output=True)
        started = time.monotonic()
        for r in range(args.rounds):
            for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                with boot(head, ["--device", "cpu", *arms[name]], {}, tmp / f"{name}.log") as client:
                    runs[name].append({c: curve_point(client, c, args.tokens) for c in points})
                print(f"round {r + 1}/{args.rounds}  {name:<7} " + "  ".join(
                    f"c={c}: {v[0]:.1f}" for c, v in runs[name][-1].items()), flush=True)
        elapsed = time.monotonic() - started
    plain, spec = runs["plain"], runs[f"spec{args.spec_steps}"]
    print(f"\n{'concurrency':>11} {'plain tok/s':>11} {'ITL ms':>7} {'batch':>6} {'spec tok/s':>10} {'spec/plain':>10}")
    ratios = {}
    for c in points:
        p, s = (statistics.median(run[c][0] for run in arm) for arm in (plain, spec))
        itl, batch = (statistics.median(run[c][i] for run in plain) for i in (1, 2))
        ratios[c] = s / p
        print(f"{c:>11} {p:11.1f} {itl:7.1f} {batch:6.2f} {s:10.1f} {s / p:10.3f}")
    crossing = next(((a, b) for a, b in zip(points, points[1:]) if ratios[a] > 1 >= ratios[b]), None)
    print(f"\n{args.rounds} rounds x 2 arms, {args.tokens}-token requests, {elapsed:.0f} s; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end")
    print(json.dumps({"spec_steps": args.spec_steps, "tokens": args.tokens,
                      "spec_over_plain": {str(c): round(v, 3) for c, v in ratios.items()},
                      "plain_tok_s": {str(c): round(statistics.median(run[c][0] for run in plain), 1) for c in points},
                      "crosses_between": crossing}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--curve", action="store_true", help="speculative decoding along the load curve at HEAD")
    ap.add_argument("--concurrency", default="1,2,4,8,16", help="--curve: the points, comma-separated")
    ap.add_argument("--spec-steps", type=int, default=2, help="--curve: --speculative-num-steps of the spec arm")
    args = ap.parse_args(argv)
    if args.curve:
        return curve(args)

    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        tmp = Path(tmp)
        hist = create_demo_repo(tmp / "engine")
        reg = hist.index(hist.events["regression"])
        trees = {}
        for name, sha in (("good", hist.shas[reg - 1]), ("regressed", hist.shas[reg])):
            path = tmp / name
            subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=hist.path,
                           check=True, capture_output=True)
            subprocess.run([a.format(python=sys.executable) for a in DEMO_LAUNCH.build], cwd=path,
                           check=True, capture_output=True)
            trees[name] = path
        arms = {
            "good": (trees["good"], [], {}),
            "regressed": (trees["regressed"], [], {}),
            "tuned": (trees["good"], [], {"DEMO_COMM_TUNING": "1"}),
            "attn_decode": (trees["good"], ["--attention-mode", "decode"], {}),
            "spec2": (trees["good"], ["--speculative-num-steps", "2"], {}),
        }
        names = list(arms)
        samples: dict[str, list[float]] = {n: [] for n in names}
        started = time.monotonic()
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                path, flags, env = arms[name]
                with boot(path, ["--device", "cpu", *flags], env, tmp / f"{name}.log") as client:
                    tps = measure(client, args.requests, args.tokens, args.warmup)
                samples[name].append(tps)
                print(f"round {r + 1}/{args.rounds}  {name:<12} {tps:7.1f} tok/s", flush=True)
        elapsed = time.monotonic() - started

    med = {n: statistics.median(v) for n, v in samples.items()}
    print()
    print(f"{'arm':<12} {'median tok/s':>12} {'min':>8} {'max':>8} {'vs good':>8}   boots")
    for n in names:
        v = samples[n]
        print(f"{n:<12} {med[n]:12.1f} {min(v):8.1f} {max(v):8.1f} {med[n] / med['good']:8.3f}   {len(v)}")
    print(f"\n{args.rounds} rounds x {len(names)} arms, {args.requests} x {args.tokens}-token requests "
          f"per boot, {elapsed:.0f} s; regression commit is #{reg} of {len(hist.shas)}")
    result = {
        "regression_ratio": round(med["regressed"] / med["good"], 3),
        "comm_tuning_ratio": round(med["tuned"] / med["good"], 3),
        "attention_mode_ratio": round(med["attn_decode"] / med["good"], 3),
        "spec2_ratio": round(med["spec2"] / med["good"], 3),
        "good_tok_s": round(med["good"], 1),
        "boots_per_arm": args.rounds,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
