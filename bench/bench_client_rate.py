"""Does the open-loop client keep up with the rate it is asked, and measure what the peer
measures? This client against ``vllm bench serve``, side by side, in one run against
the same local server.

A loopback server (a separate process, owned by ``engines.server.ServerProcess``)
plays a model whose timing is known: each ``/v1/completions`` stream waits ``--ttft-ms``
before its first token and ``--itl-ms`` between tokens, one token a chunk, then a
usage chunk; every request on a thread of its own, so the server never queues and
any lateness is the client's. It notes (CLOCK_MONOTONIC) when the first request of a
run arrived and when the last response ended.

At each asked rate (``--rates``, requests a second, evenly spaced: ``arrival:
constant`` here, ``--burstiness inf`` for vLLM, whose schedule is then k/r), for
``--seconds`` of arrivals, each client sends its requests, in alternating order:

- **ours**: ``measure.client.measure_sample_detail`` with ``request_rate`` in this
  process (the boot session, its HTTP client, made before);
- **vllm**: ``vllm bench serve --backend openai --dataset-name random`` from the vLLM
  venv (``--vllm``; made by ``.ci/install-vllm``), with a word-level tokenizer built
  locally (``tests/tinyllama.py``: nothing is downloaded), ``--save-detailed`` so its
  per-request send times, TTFTs and ITLs come back.

Reported per rate and client, from each client's own per-request records:

- ``achieved_rps``: (n - 1) / (last send - first send), beside the rate asked;
- ``lag_p99_ms``: p99 over requests of how late request k left against the even
  schedule k / r, placed at the offset of the send that was earliest against it (the
  same formula for both, from their send times alone; ours also reports its own
  ``send_lag_p99_ms``, measured against its schedule);
- TTFT and ITL p50 / p99 (ms), and their differences between the clients (the server
  sets them: ``--ttft-ms`` and ``--itl-ms`` plus the loopback's own time);
- ``cpu_ms_per_request``: the client's CPU time (user + system) over the window from
  the first request's arrival at the server to the last response's end, divided by
  the requests: ours from ``resource.getrusage(RUSAGE_SELF)`` around the sample; vLLM's
  from its process's CPU times sampled every 20 ms (``psutil``) and taken at the
  server's first arrival and last end, so its start-up (imports, tokenizer, dataset)
  is left out; its whole run's CPU (``resource.getrusage(RUSAGE_CHILDREN)``) is
  reported beside it.

The last line printed is one JSON object.

    python bench/bench_client_rate.py [--rates 2,8,32] [--seconds 8] [--pin] [--vllm ~/.cache/bisect-harness/vllm-venv]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client import read_request  # noqa: E402  (the loopback server's request reader)

ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- the server


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_TOKEN = ('data: {"id":"cmpl-rate","object":"text_completion","created":0,"model":"bench",'
          '"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}],"usage":null}\n\n').encode()


def _serve_conn(conn: socket.socket, stats: dict, lock: threading.Lock, ttft_s: float, itl_s: float) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    with conn:
        while True:
            got = read_request(conn, buf)
            if got is None:
                return
            method, path, body, buf = got
            if method == b"GET":
                if path == b"/reset":
                    with lock:
                        stats.update(first=None, last=None, requests=0)
                with lock:
                    payload = json.dumps(stats if path in (b"/stats", b"/reset") else
                                         {"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(payload), payload))
                continue
            arrived = time.monotonic()
            with lock:
                stats["first"] = arrived if stats["first"] is None else min(stats["first"], arrived)
                stats["requests"] += 1
            n = int(json.loads(body).get("max_tokens") or 16)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            time.sleep(ttft_s)
            for k in range(n):
                if k:
                    time.sleep(itl_s)
                conn.sendall(_chunk(_TOKEN))
            usage = json.dumps({"id": "cmpl-rate", "object": "text_completion", "created": 0, "model": "bench",
                                "choices": [], "usage": {"prompt_tokens": 32, "completion_tokens": n,
                                                         "total_tokens": n + 32}})
            conn.sendall(_chunk(f"data: {usage}\n\n".encode()) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            with lock:
                stats["last"] = time.monotonic() if stats["last"] is None else max(stats["last"], time.monotonic())


def serve(port: int, cpu: int | None, ttft_s: float, itl_s: float) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    stats: dict = {"first": None, "last": None, "requests": 0}
    lock = threading.Lock()
    srv = socket.create_server(("127.0.0.1", port), backlog=512)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_serve_conn, args=(conn, stats, lock, ttft_s, itl_s), daemon=True).start()


# --------------------------------------------------------------------------- figures


def _pct(values: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(values, q)) if values else None


def _schedule_figures(sends: list[float], rate: float) -> dict:
    """The achieved rate and the p99 lag against an even schedule, both from the sends alone:
    the schedule k / r placed at the offset of the send that was earliest against it, so
    each lag is >= 0 and a late first send does not hide the others' lateness."""
    offsets = [s - k / rate for k, s in enumerate(sends)]
    lags = [o - min(offsets) for o in offsets]
    span = sends[-1] - sends[0]
    return {"achieved_rps": (len(sends) - 1) / span if span > 0 else None,
            "lag_p99_ms": 1e3 * _pct(lags, 99), "lag_max_ms": 1e3 * max(lags)}


def _latency_figures(ttfts_ms: list[float], itls_ms: list[float]) -> dict:
    return {"ttft_p50_ms": _pct(ttfts_ms, 50), "ttft_p99_ms": _pct(ttfts_ms, 99),
            "itl_p50_ms": _pct(itls_ms, 50), "itl_p99_ms": _pct(itls_ms, 99)}


def _server_window(base_url: str, reset: bool = False) -> dict:
    import httpx

    return httpx.get(base_url + ("/reset" if reset else "/stats"), trust_env=False, timeout=10).json()


# --------------------------------------------------------------------------- the clients


def run_ours(base_url: str, rate: float, n: int, output_tokens: int) -> dict:
    from bisect_harness.measure.client import boot_session, measure_sample_detail
    from bisect_harness.model import BenchmarkSpec

    bench = BenchmarkSpec(api="completions", model="bench", prompt_tokens=32, output_tokens=output_tokens,
                          request_rate=rate, arrival="constant", requests_per_sample=n, warmup_requests=0)
    with boot_session(base_url, bench) as (http, bench):
        _server_window(base_url, reset=True)
        before = resource.getrusage(resource.RUSAGE_SELF)
        detail = measure_sample_detail(base_url, bench, client=http)
        after = resource.getrusage(resource.RUSAGE_SELF)
    ok = [r for r in detail.requests if r.ok]
    sends = [r.start_s for r in detail.requests]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    m = detail.result.metrics
    return {"requests": len(ok), "errors": detail.result.errors,
            **_schedule_figures(sends, rate), "send_lag_p99_ms": m["send_lag_p99_ms"],
            **_latency_figures([1e3 * r.ttft_s for r in ok], [1e3 * g for r in ok for g in r.token_gaps_s]),
            "cpu_ms_per_request": 1e3 * cpu / max(1, len(ok)), "cpu_s_run": cpu}


class _CpuTrace(threading.Thread):
    """The CPU times (user + system, all threads) of the ``vllm bench serve`` process under
    our supervisor, sampled every ``interval`` s against CLOCK_MONOTONIC."""

    def __init__(self, interval: float = 0.02):
        super().__init__(daemon=True)
        self.interval, self.samples, self.stop = interval, [], threading.Event()

    def run(self) -> None:
        import psutil

        me, proc = psutil.Process(), None
        while not self.stop.is_set():
            try:
                if proc is None:
                    proc = next((p for p in me.children(recursive=True)
                                 if "bench" in p.cmdline() and "serve" in p.cmdline()), None)
                if proc is not None:
                    t = proc.cpu_times()
                    self.samples.append((time.monotonic(), t.user + t.system))
            except psutil.Error:
                if proc is not None:
                    return  # it ended
            time.sleep(self.interval)

    def at(self, when: float) -> float | None:
        """The CPU time at ``when``, linear between the samples around it."""
        before = [s for s in self.samples if s[0] <= when]
        after = [s for s in self.samples if s[0] >= when]
        if not before or not after:
            return None
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (when - t0) / (t1 - t0)


def run_vllm(venv: Path, tokenizer: Path, base_url: str, rate: float, n: int, output_tokens: int,
             workdir: Path) -> dict:
    from bisect_harness.engines.benchtools import run_owned

    result = workdir / f"vllm-{rate:g}.json"
    result.unlink(missing_ok=True)
    argv = [str(venv / "bin" / "vllm"), "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions",
            "--base-url", base_url, "--model", "bench", "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", str(output_tokens),
            "--random-range-ratio", "0.0", "--num-prompts", str(n), "--request-rate", repr(float(rate)),
            "--burstiness", "inf", "--num-warmups", "0", "--seed", "0", "--ignore-eos", "--temperature", "0.0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--ready-check-timeout-sec", "0", "--save-result", "--save-detailed", "--result-dir", str(workdir),
            "--result-filename", result.name, "--disable-tqdm"]
    _server_window(base_url, reset=True)
    trace = _CpuTrace()
    trace.start()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rc, wall = run_owned(argv, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, cwd=workdir,
                         log_path=workdir / "vllm.log", timeout_s=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    trace.stop.set()
    trace.join()
    if rc != 0:
        tail = (workdir / "vllm.log").read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"vllm bench serve exited {rc}:\n" + "\n".join(tail))
    data = json.loads(result.read_text())
    window = _server_window(base_url)
    ok = [i for i, e in enumerate(data["errors"]) if not e]
    sends = [data["start_times"][i] for i in range(len(data["start_times"]))]
    c0, c1 = trace.at(window["first"]), trace.at(window["last"])
    cpu = (c1 - c0) if c0 is not None and c1 is not None else None
    whole = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"requests": len(ok), "errors": data.get("failed"), **_schedule_figures(sends, rate),
            **_latency_figures([1e3 * data["ttfts"][i] for i in ok], [1e3 * g for i in ok for g in data["itls"][i]]),
            "cpu_ms_per_request": 1e3 * cpu / max(1, len(ok)) if cpu is not None else None,
            "cpu_s_run": whole, "wall_s_run": wall}


def build_tokenizer(venv: Path, where: Path) -> Path:
    """The tests' word-level tokenizer (``tests/tinyllama.py``), saved for ``--tokenizer``."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from tinyllama import build_tokenizer; "
            "build_tokenizer().save_pretrained(sys.argv[2])")
    subprocess.run([str(venv / "bin" / "python"), "-c", code, str(ROOT / "tests"), str(where)], check=True,
                   stdin=subprocess.DEVNULL, timeout=600)
    return where


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="2,8,32", help="asked request rates, requests a second")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of arrivals at each rate")
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--ttft-ms", type=float, default=40.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--vllm", type=Path, default=Path.home() / ".cache/bisect-harness/vllm-venv",
                    help="a venv with vLLM (.ci/install-vllm DIR)")
    ap.add_argument("--pin", action="store_true",
                    help="pin the server to one core and the clients to another (off: the host's scheduler places "
                         "them; on a shared host a pinned client waits for its one core, and its lag shows it)")
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--server-cpu", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.server_cpu, args.ttft_ms / 1e3, args.itl_ms / 1e3)
        return
    if not (args.vllm / "bin" / "vllm").exists():
        sys.exit(f"Error: no vLLM at {args.vllm}: run .ci/install-vllm {args.vllm}, or pass --vllm DIR")

    from bisect_harness.engines.server import ServerProcess, free_port

    rates = [float(r) for r in args.rates.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 and args.pin else (None, None)
    port = free_port()
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve", str(port), "--ttft-ms", str(args.ttft_ms),
            "--itl-ms", str(args.itl_ms)]
    if server_cpu is not None:
        argv += ["--server-cpu", str(server_cpu)]
        os.sched_setaffinity(0, {client_cpu})  # ours, and vLLM (a child: it inherits it)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(
            argv, env=dict(os.environ), cwd=Path(tmp), log_path=Path(tmp) / "server.log",
            base_url=f"http://127.0.0.1:{port}", health_path="/v1/models", ready_timeout_s=30) as server:
        tokenizer = build_tokenizer(args.vllm, Path(tmp) / "tokenizer")
        run_ours(server.base_url, 4.0, 4, args.output_tokens)  # imports and connections warm
        for i, rate in enumerate(rates):
            n = max(2, round(rate * args.seconds))
            row: dict = {"asked_rps": rate, "requests": n}
            order = ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours")
            for name in order:
                row[name] = (run_ours(server.base_url, rate, n, args.output_tokens) if name == "ours" else
                             run_vllm(args.vllm, tokenizer, server.base_url, rate, n, args.output_tokens, Path(tmp)))
            o, v = row["ours"], row["vllm"]
            row["agreement"] = {k: round(o[k] - v[k], 3) for k in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                                                                     "itl_p99_ms")}
            row["ours_keeps_up_at_least_as_closely"] = abs(o["achieved_rps"] - rate) <= abs(v["achieved_rps"] - rate)
            row["ours_uses_no_more_cpu_per_request"] = (v["cpu_ms_per_request"] is not None
                                                        and o["cpu_ms_per_request"] <= v["cpu_ms_per_request"])
            rows.append(row)
            print(f"{rate:>6g} req/s  n={n:<4}", "  ".join(
                f"{name}: achieved {row[name]['achieved_rps']:.2f} lag p99 {row[name]['lag_p99_ms']:.1f} ms "
                f"ttft p50 {row[name]['ttft_p50_ms']:.1f} itl p50 {row[name]['itl_p50_ms']:.1f} "
                f"cpu/req {row[name]['cpu_ms_per_request'] or float('nan'):.2f} ms" for name in ("ours", "vllm")),
                flush=True)
    summary = {"ttft_ms_served": args.ttft_ms, "itl_ms_served": args.itl_ms, "output_tokens": args.output_tokens,
               "seconds": args.seconds, "client_cpu": client_cpu, "server_cpu": server_cpu,
               "load_average": os.getloadavg(), "rates": rows,
               "goal_met": all(r["ours_keeps_up_at_least_as_closely"] and r["ours_uses_no_more_cpu_per_request"]
                               for r in rows)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
