"""How fast can the benchmark client read a token stream, and does it miss any?

A loopback server (a separate process, started and torn down by
``bisect_harness.engines.server.ServerProcess``) streams OpenAI ``/v1/completions``
chunks as fast as it can, one token per chunk, then a final usage chunk with
the true count. Our client (``bisect_harness.measure.client``) and the reference client
(the ``openai`` package, ``client.completions.create(stream=True)``) read it in
alternating rounds, each pinned to one core and the server to another where
the machine has two. Reported per client: sustained tok/s (the best and the
median round), and the tokens it counted from the chunks against the count the
server states. The last line printed is one JSON object.

    python bench/bench_client.py [--tokens 4000] [--requests 16] [--concurrency 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# --------------------------------------------------------------------------- server

_EVENT = ('data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench",'
          '"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}],"usage":null}\n\n')


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def read_request(conn: socket.socket, buf: bytes) -> tuple[bytes, bytes, bytes, bytes] | None:
    """The next HTTP/1.1 request on ``conn`` after the bytes ``buf`` already read:
    (method, path, body, the bytes read past it), or None once the peer closed."""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    method, path, _ = lines[0].split(b" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(buf) < length:
        buf += conn.recv(65536)
    return method, path, buf[:length], buf[length:]


def _serve_conn(conn: socket.socket, stats: dict) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    token_frame = _chunk(_EVENT.encode())
    buf = b""
    with conn:
        while True:
            got = read_request(conn, buf)
            if got is None:
                return
            method, path, body, buf = got
            if method == b"GET":
                payload = json.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]}).encode()
                if path == b"/stats":
                    payload = json.dumps(stats).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(payload), payload))
                continue
            n = int(json.loads(body).get("max_tokens") or 16)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            for _ in range(n):  # one send per token: the client sees them as they come
                conn.sendall(token_frame)
            usage = json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
                                "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": n,
                                                         "total_tokens": n + 8}})
            conn.sendall(_chunk(f"data: {usage}\n\n".encode()) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            stats["tokens_sent"] += n
            stats["requests"] += 1


def serve(port: int, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    stats = {"tokens_sent": 0, "requests": 0}
    srv = socket.create_server(("127.0.0.1", port), backlog=128)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_serve_conn, args=(conn, stats), daemon=True).start()


# --------------------------------------------------------------------------- clients

def run_ours(base_url: str, tokens: int, requests: int, concurrency: int) -> dict:
    from bisect_harness.measure.client import measure_sample_detail
    from bisect_harness.model import BenchmarkSpec

    bench = BenchmarkSpec(api="completions", model="bench", prompt_tokens=8, output_tokens=tokens,
                          concurrency=concurrency, requests_per_sample=requests, warmup_requests=0)
    detail = measure_sample_detail(base_url, bench)
    counted = sum(r.counted_tokens for r in detail.requests)
    return {"tok_s": counted / detail.result.duration_s, "counted_tokens": counted,
            "usage_tokens": detail.result.output_tokens, "errors": detail.result.errors,
            "wall_s": detail.result.duration_s}


def run_reference(base_url: str, tokens: int, requests: int, concurrency: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    counted, usage_total, errors = [0] * requests, [0] * requests, [0]
    indices = iter(range(requests))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(indices, None)
            if i is None:
                return
            try:
                stream = client.completions.create(
                    model="bench", prompt="hello " * 8, max_tokens=tokens, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].text:
                        counted[i] += 1
                    if chunk.usage is not None:
                        usage_total[i] = chunk.usage.completion_tokens
            except openai.OpenAIError:
                with lock:
                    errors[0] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(min(concurrency, requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    client.close()
    return {"tok_s": sum(counted) / wall, "counted_tokens": sum(counted), "usage_tokens": sum(usage_total),
            "errors": errors[0], "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4000, help="output tokens per request")
    ap.add_argument("--requests", type=int, default=16, help="requests per round")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per client, alternating")
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--server-cpu", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve, args.server_cpu)
        return

    import httpx

    from bisect_harness.engines.server import ServerProcess, free_port

    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)
    port = free_port()
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve", str(port)]
    if server_cpu is not None:
        argv += ["--server-cpu", str(server_cpu)]
        os.sched_setaffinity(0, {client_cpu})
    results: dict[str, list[dict]] = {"ours": [], "openai": []}
    with tempfile.TemporaryDirectory() as tmp, ServerProcess(
            argv, env=dict(os.environ), cwd=Path(tmp), log_path=Path(tmp) / "server.log",
            base_url=f"http://127.0.0.1:{port}", health_path="/v1/models", ready_timeout_s=30) as server:
        # one small round each to warm up connections and imports
        run_ours(server.base_url, 64, 2, 2)
        run_reference(server.base_url, 64, 2, 2)
        for _ in range(args.rounds):
            for name, fn in (("ours", run_ours), ("openai", run_reference)):
                res = fn(server.base_url, args.tokens, args.requests, args.concurrency)
                results[name].append(res)
                print(f"{name:>6}: {res['tok_s']:>9.0f} tok/s  counted {res['counted_tokens']}  "
                      f"usage {res['usage_tokens']}  errors {res['errors']}  wall {res['wall_s']:.2f} s",
                      flush=True)
        server_stats = httpx.get(server.base_url + "/stats", trust_env=False).json()

    expected = args.tokens * args.requests
    summary: dict = {"tokens_per_request": args.tokens, "requests": args.requests,
                     "concurrency": args.concurrency, "rounds": args.rounds,
                     "client_cpu": client_cpu, "server_cpu": server_cpu,
                     "server_tokens_sent": server_stats["tokens_sent"]}
    for name, runs in results.items():
        rates = [r["tok_s"] for r in runs]
        worst_count_err = max(abs(r["counted_tokens"] - expected) / expected for r in runs)
        summary[name] = {"tok_s_best": round(max(rates)), "tok_s_median": round(statistics.median(rates)),
                         "count_error_max": worst_count_err,
                         "usage_matches": all(r["usage_tokens"] == expected for r in runs),
                         "errors": sum(r["errors"] for r in runs)}
    summary["ours_vs_openai_median"] = round(summary["ours"]["tok_s_median"] / summary["openai"]["tok_s_median"], 2)
    summary["goal_met"] = summary["ours"]["tok_s_median"] >= 20000 and summary["ours"]["count_error_max"] <= 0.01
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
