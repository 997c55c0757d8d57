"""Benchmark the demo engine's known effects, interleaved over repeated boots.

    python bench/bench_demo.py [--rounds 3] [--requests 4] [--tokens 64]

Arms (each booted once per round, in an order that rotates every round):

- ``good``        the commit before the regression event, plain environment
- ``regressed``   the regression commit
- ``tuned``       ``good`` with DEMO_COMM_TUNING=1
- ``attn_decode`` ``good`` with --attention-mode decode (the default is prefill)
- ``spec2``       ``good`` with --speculative-num-steps 2

A sample is the output tok/s of one boot (tokens over wall time of its timed
requests, streamed one at a time). The last line printed is one JSON object
with each ratio of medians against ``good`` (higher = faster).
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args(argv)

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
