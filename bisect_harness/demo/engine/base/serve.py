"""HTTP front end of the demo engine.

    python build.py
    python serve.py --port 30000 [--tp 2] [--speculative-num-steps 2]

Endpoints: POST /v1/completions (OpenAI), POST /generate (SGLang-native),
GET /health, GET /server_info, GET /metrics (Prometheus text), GET /v1/models.
The worker processes batch the requests in flight continuously: up to
``--max-running-requests`` of them decode together, one forward pass per step for
the whole batch (``demo_decode_batch_size`` in /metrics: the sequences of each
decode step).

POST /start_profile and POST /stop_profile, as SGLang names them: a JSON body
``{"output_dir": DIR, "profile_id": NAME}`` starts ``torch.profiler`` in rank 0's
worker; the stop writes ``DIR/NAME-TP-0.trace.json.gz`` (Chrome trace, gzipped)
and answers ``{"trace": PATH, "steps": {"decode": N, "verify": M}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import tokenizer

VERSION = "0.3.0"
HERE = Path(__file__).resolve().parent
ARTIFACT = HERE / "build" / "kernels.json"
CYCLE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def worker_env() -> dict[str, str]:
    """The environment every worker process starts with."""
    return dict(os.environ)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Histogram:
    """Cumulative buckets, a sum and a count, as Prometheus keeps them."""

    def __init__(self, bounds: tuple):
        self.bounds = bounds
        self.buckets = [0] * len(bounds)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.buckets[i] += 1

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for bound, count in zip(self.bounds, self.buckets):
            lines.append(f'{name}_bucket{{le="{bound}"}} {float(count)}')
        return lines + [f'{name}_bucket{{le="+Inf"}} {float(self.count)}',
                        f"{name}_sum {float(self.sum)}", f"{name}_count {float(self.count)}"]


class Stats:
    """Counters and two histograms, rendered in Prometheus text format.

    Forward passes are counted per mode as SGLang counts them
    (``sglang:cuda_graph_passes_total{mode}``): ``<phase>_cuda_graph`` when a CUDA
    graph was replayed, ``<phase>_none`` when the pass ran eagerly, for the phases
    prefill, decode, draft and verify; their in-process seconds per mode beside them,
    so that verify milliseconds per cycle and decode milliseconds per step can be
    read over any window (the change in seconds over the change in passes).

    ``demo_decode_batch_size`` observes each decode step's (or verify cycle's) batch:
    its sum over its count across a window is the mean batch the steps ran.
    """

    MODES = ("prefill_none", "decode_cuda_graph", "decode_none", "draft_none", "verify_none")

    COUNTERS = {
        "demo_requests_total": "Requests served.",
        "demo_prompt_tokens_total": "Prompt tokens processed.",
        "demo_generation_tokens_total": "Tokens generated.",
        "demo_decode_cycles_total": "Decode steps run over the batch (a verify cycle counts as one).",
        "demo_spec_verify_total": "Speculative verify passes (one per cycle, over the batch).",
        "demo_spec_accepted_tokens_total": "Draft tokens accepted by verify.",
        "demo_request_prefill_seconds_total": "In-process seconds, request at the worker -> first token.",
        "demo_request_decode_seconds_total": "In-process seconds, first token -> last token of a request.",
        "demo_request_decode_tokens_total": "Tokens generated after each request's first token.",
    }

    def __init__(self):
        self.lock = threading.Lock()
        self.values = dict.fromkeys(self.COUNTERS, 0)
        self.cycles = Histogram(CYCLE_BUCKETS)
        self.batches = Histogram(BATCH_BUCKETS)
        self.running = 0
        self.passes = dict.fromkeys(self.MODES, 0)
        self.forward_s = dict.fromkeys(self.MODES, 0.0)

    def add(self, name: str, value: float = 1) -> None:
        with self.lock:
            self.values[name] += value

    def count_step(self, event: dict) -> None:
        """One ``step`` event of the workers: its forward passes by mode; a decode step or a
        verify cycle is a cycle, of its time and its batch."""
        kind, mode = event["kind"], "cuda_graph" if event.get("graph") else "none"
        with self.lock:
            if kind == "verify":  # its drafts run eagerly first, then one verify pass
                self._pass("draft_none", event["draft_passes"], event["draft_ms"] / 1e3)
                self._pass(f"verify_{mode}", 1, event["verify_ms"] / 1e3)
                self.values["demo_spec_verify_total"] += 1
            else:
                self._pass(f"{kind}_{mode}", event.get("passes", 1), event["cycle_ms"] / 1e3)
            if kind != "prefill":
                self.values["demo_decode_cycles_total"] += 1
                self.cycles.observe(event["cycle_ms"] / 1e3)
                self.batches.observe(event["batch"])

    def _pass(self, mode: str, n: int, seconds: float) -> None:
        self.passes[mode] = self.passes.get(mode, 0) + n
        self.forward_s[mode] = self.forward_s.get(mode, 0.0) + seconds

    def render(self) -> str:
        with self.lock:
            lines = []
            for name, help_text in self.COUNTERS.items():
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter",
                          f"{name} {float(self.values[name])}"]
            for name, help_text, values in (
                    ("demo:cuda_graph_passes_total", "Forward passes by mode: <phase>_cuda_graph (a CUDA graph "
                     "replayed) or <phase>_none (eager).", self.passes),
                    ("demo:forward_seconds_total", "In-process seconds of the forward passes, by mode.",
                     self.forward_s)):
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
                lines += [f'{name}{{mode="{mode}"}} {float(v)}' for mode, v in values.items()]
            lines += ["# HELP demo_running_requests Requests being generated now.",
                      "# TYPE demo_running_requests gauge", f"demo_running_requests {self.running}"]
            lines += self.cycles.render("demo_decode_cycle_seconds", "Wall time of one decode or verify cycle.")
            lines += self.batches.render("demo_decode_batch_size",
                                         "Sequences run by one decode step or verify cycle.")
            return "\n".join(lines) + "\n"


class Workers:
    """The worker processes and the channel to them: requests in, their events back."""

    def __init__(self, args, on_step):
        self.args = args
        self.on_step = on_step  # called with each step event of rank 0
        self.procs: list[subprocess.Popen] = []
        self.ready = threading.Event()
        self.failed: str | None = None
        self.info: dict = {}
        self.lock = threading.Lock()  # one message at a time into the ranks' pipes, in one order
        self.pending: dict[str, queue.Queue] = {}  # rid -> the events of a request in flight
        self.closed = False
        self.stopping = False

    def start(self) -> None:
        a = self.args
        dist_port = free_port()
        threads = a.threads or max(1, (os.cpu_count() or 1) // (a.tp + 1))
        env = worker_env()
        for rank in range(a.tp):
            argv = [sys.executable, "-u", str(HERE / "worker.py"),
                    "--rank", str(rank), "--world-size", str(a.tp),
                    "--dist-port", str(dist_port), "--parent-pid", str(os.getpid()),
                    "--device", a.device, "--seed", str(a.seed), "--threads", str(threads),
                    "--cuda-graph", "1" if a.cuda_graph else "0",
                    "--speculative-num-steps", str(a.speculative_num_steps),
                    "--max-running-requests", str(a.max_running_requests),
                    "--attention-mode", a.attention_mode]
            self.procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               env=env, cwd=str(HERE), text=True, bufsize=1))
        threading.Thread(target=self._wait_ready, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _wait_ready(self) -> None:
        infos = []
        for proc in self.procs:
            line = proc.stdout.readline()
            if not line:
                return  # _watch reports the exit
            infos.append(json.loads(line))
        self.info = infos[0]
        self.info["worker_pids"] = [i["pid"] for i in infos]
        threading.Thread(target=self._dispatch, name="dispatch", daemon=True).start()
        self.ready.set()
        log(f"server ready: {len(infos)} worker(s) on {self.info['device']}")

    def _watch(self) -> None:
        while True:
            for rank, proc in enumerate(self.procs):
                code = proc.poll()
                if code is not None and not self.stopping:
                    log(f"worker rank {rank} exited with code {code}; shutting down")
                    self.stop()
                    os._exit(1)
            time.sleep(0.2)

    def stop(self) -> None:
        self.stopping = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _dispatch(self) -> None:
        """Hand each event of rank 0 to the request it names (a step event to the stats);
        a request whose client left has no queue, and its events go nowhere."""
        for raw in self.procs[0].stdout:
            event = json.loads(raw)
            if event["event"] == "step":
                self.on_step(event)
                continue
            with self.lock:
                events = self.pending.get(event["rid"])
            if events is not None:
                events.put(event)
        with self.lock:
            self.closed = True
            for events in self.pending.values():
                events.put({"event": "error", "message": "worker rank 0 closed its output"})

    def run(self, request: dict):
        """Send one request to every rank; yield rank 0's events for it until it is done."""
        rid = uuid.uuid4().hex
        events: queue.Queue = queue.Queue()
        with self.lock:
            if self.closed:
                raise RuntimeError("worker rank 0 closed its output")
            self.pending[rid] = events
            line = json.dumps({**request, "rid": rid}) + "\n"
            for proc in self.procs:
                proc.stdin.write(line)
                proc.stdin.flush()
        try:
            while True:
                event = events.get()
                yield event
                if event["event"] in ("done", "error"):
                    return
        finally:
            with self.lock:
                self.pending.pop(rid, None)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"demo-engine/{VERSION}"
    # Every SSE chunk is a small write of its own. With Nagle's algorithm on, the
    # first chunk waits for the client to ACK the headers (a delayed ACK, up to
    # 40 ms): TTFT grew by that much and the tokens after it arrived in a burst.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # keep the log for decode lines
        return

    # -- plumbing ---------------------------------------------------------
    def _send_json(self, code: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_text(self, code: int, text: str, ctype: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _start_sse(self) -> None:
        """Send the stream's headers: once the workers accept the request, before its
        prefill. The first token's chunk then goes out alone, like every later one;
        sent with it, the headers delayed it (the client parses them before it reads
        the chunk) and the client's decode span came out shorter than the engine's."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _sse(self, payload) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        chunk = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.flush()

    def _end_sse(self) -> None:
        self._sse("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        obj = json.loads(raw or b"{}")
        if not isinstance(obj, dict):
            raise ValueError("request body must be a JSON object")
        return obj

    # -- routes -----------------------------------------------------------
    def do_GET(self):
        path = self.path.split("?", 1)[0]
        app = self.server.app
        if path == "/health":
            if app.workers.ready.is_set():
                self._send_text(200, "ok\n", "text/plain")
            else:
                self._send_text(503, "starting\n", "text/plain")
        elif path in ("/server_info", "/get_server_info"):
            if not app.workers.ready.is_set():
                self._send_json(503, {"error": "server is starting"})
            else:
                self._send_json(200, app.server_info())
        elif path == "/metrics":
            self._send_text(200, app.stats.render(), "text/plain; version=0.0.4")
        elif path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [
                {"id": app.args.model_name, "object": "model", "owned_by": "demo"}]})
        else:
            self._send_json(404, {"error": f"no route {path}"})

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        app = self.server.app
        if path not in ("/v1/completions", "/generate", "/start_profile", "/stop_profile"):
            self._send_json(404, {"error": f"no route {path}"})
            return
        try:
            body = self._body()
        except ValueError as exc:
            self._send_json(400, {"error": f"bad request body: {exc}"})
            return
        if not app.workers.ready.is_set():
            self._send_json(503, {"error": "server is starting"})
            return
        try:
            if path == "/v1/completions":
                self._completions(app, body)
            elif path == "/generate":
                self._generate(app, body)
            else:
                self._profile(app, path, body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _profile(self, app, path: str, body: dict) -> None:
        """Start or stop rank 0's profiler; the answer comes once the worker has done it."""
        request = {"type": path.strip("/")}
        if path == "/start_profile":
            # SGLang's default folder is SGLANG_TORCH_PROFILER_DIR, else the temporary one
            request["output_dir"] = str(body.get("output_dir") or os.environ.get("DEMO_TORCH_PROFILER_DIR")
                                        or tempfile.gettempdir())
            request["profile_id"] = str(body.get("profile_id") or f"{time.time():.3f}")
        answer = {"event": "error", "message": "the worker did not answer"}
        for event in app.workers.run(request):
            answer = event
        if answer["event"] == "error":
            self._send_json(400, {"error": answer["message"]})
        elif path == "/start_profile":
            self._send_json(200, {"message": "Start profiling.", "activities": answer.get("activities")})
        else:
            self._send_json(200, {"message": "Stop profiling.", "trace": answer.get("path"),
                                  "steps": answer.get("steps")})

    def _completions(self, app, body: dict) -> None:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        ids = prompt if isinstance(prompt, list) else tokenizer.encode(str(prompt))
        request = {"prompt_ids": ids, "max_new_tokens": int(body.get("max_tokens", 16)),
                   "temperature": float(body.get("temperature", 1.0)),
                   "ignore_eos": bool(body.get("ignore_eos", False)),
                   "seed": int(body.get("seed") or app.args.seed)}
        stream = bool(body.get("stream", False))
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage", False))
        rid = f"cmpl-{uuid.uuid4().hex[:24]}"
        base = {"id": rid, "object": "text_completion", "created": int(time.time()),
                "model": app.args.model_name}
        text_parts, done, started = [], None, False
        for event in app.generate(request):
            if event["event"] == "accepted":
                if stream:
                    self._start_sse()
                    started = True
                continue
            if event["event"] == "error":
                if started:
                    self._sse({"error": {"message": event["message"]}})
                    self._end_sse()
                else:
                    self._send_json(400, {"error": {"message": event["message"]}})
                return
            if event["event"] == "done":
                done = event
                break
            text = tokenizer.decode(event["ids"])
            text_parts.append(text)
            if stream:
                self._sse({**base, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                "finish_reason": None}]})
        usage = {"prompt_tokens": done["prompt_tokens"], "completion_tokens": done["completion_tokens"],
                 "total_tokens": done["prompt_tokens"] + done["completion_tokens"],
                 "engine_timing": done["timing"]}
        if not stream:
            self._send_json(200, {**base, "choices": [{"index": 0, "text": "".join(text_parts),
                                                       "logprobs": None,
                                                       "finish_reason": done["finish_reason"]}],
                                  "usage": usage})
            return
        self._sse({**base, "choices": [{"index": 0, "text": "", "logprobs": None,
                                        "finish_reason": done["finish_reason"]}]})
        if usage_wanted:
            self._sse({**base, "choices": [], "usage": usage})
        self._end_sse()

    def _generate(self, app, body: dict) -> None:
        sp = body.get("sampling_params") or {}
        request = {"prompt_ids": tokenizer.encode(str(body.get("text", ""))),
                   "max_new_tokens": int(sp.get("max_new_tokens", 128)),
                   "temperature": float(sp.get("temperature", 1.0)),
                   "ignore_eos": bool(sp.get("ignore_eos", False)),
                   "seed": int(sp.get("seed") or app.args.seed)}
        stream = bool(body.get("stream", False))
        rid = uuid.uuid4().hex
        spec = app.args.speculative_num_steps > 0
        out_ids: list[int] = []
        started = False

        def payload(finish, verify_ct, timing=None):
            meta = {"id": rid, "prompt_tokens": len(request["prompt_ids"]),
                    "completion_tokens": len(out_ids), "finish_reason": finish}
            if spec:
                meta["spec_verify_ct"] = verify_ct
            if timing is not None:
                meta["engine_timing"] = timing
            return {"text": tokenizer.decode(out_ids), "meta_info": meta}

        verify_ct = 0
        for event in app.generate(request):
            if event["event"] == "accepted":
                if stream:
                    self._start_sse()
                    started = True
                continue
            if event["event"] == "error":
                if started:
                    self._sse({"error": {"message": event["message"]}})
                    self._end_sse()
                else:
                    self._send_json(400, {"error": {"message": event["message"]}})
                return
            if event["event"] == "done":
                finish = {"type": event["finish_reason"]}
                if stream:
                    self._sse(payload(finish, event["spec_verify_ct"], event["timing"]))
                    self._end_sse()
                else:
                    self._send_json(200, payload(finish, event["spec_verify_ct"], event["timing"]))
                return
            out_ids.extend(event["ids"])
            if event.get("kind") == "verify":
                verify_ct += 1
            if stream:
                self._sse(payload(None, verify_ct))


class App:
    def __init__(self, args):
        self.args = args
        self.stats = Stats()
        self.workers = Workers(args, self.stats.count_step)

    def server_info(self) -> dict:
        a, info = self.args, self.workers.info
        return {
            "version": VERSION,
            "host": a.host,
            "port": a.port,
            "model": a.model_name,
            "tp": a.tp,
            "device": info["device"],
            "cuda_graph": info["cuda_graph"],
            "attention_mode": a.attention_mode,
            "speculative_num_steps": a.speculative_num_steps,
            "max_running_requests": a.max_running_requests,
            "seed": a.seed,
            "threads_per_worker": info["threads"],
            "context_length": info["context_length"],
            "worker_pids": info["worker_pids"],
        }

    def generate(self, request: dict):
        """Run one request, keeping the metrics; drains the worker even if the client left.

        The done event's ``timing`` holds the request's in-process figures (seconds):
        ``prefill_s`` (arrival at the worker -> first token ready), ``decode_s`` (first ->
        last token ready, over ``decode_tokens`` tokens), ``decode_cycles_s`` (the sum of
        the ``decode_cycles`` cycles' compute alone), ``server_s`` (the request handed to
        the workers -> its done event back here), and ``decode_tok_s`` = decode_tokens /
        decode_s where both are positive; ``first_token_at`` and ``last_token_at`` are
        the first and last token's ready times on the worker's ``time.perf_counter``
        (the host's monotonic clock on Linux), whose difference is ``decode_s``.
        """
        st = self.stats
        t_server = time.perf_counter()
        st.add("demo_requests_total")
        with st.lock:
            st.running += 1
        try:
            for event in self.workers.run(request):
                if event["event"] == "tokens":
                    st.add("demo_generation_tokens_total", len(event["ids"]))
                    if event["kind"] == "verify":
                        st.add("demo_spec_accepted_tokens_total", event["accepted"])
                elif event["event"] == "done":
                    st.add("demo_prompt_tokens_total", event["prompt_tokens"])
                    timing = event["timing"]
                    timing["server_s"] = time.perf_counter() - t_server
                    if timing["decode_s"] > 0 and timing["decode_tokens"] > 0:
                        timing["decode_tok_s"] = timing["decode_tokens"] / timing["decode_s"]
                    st.add("demo_request_prefill_seconds_total", timing["prefill_s"])
                    st.add("demo_request_decode_seconds_total", timing["decode_s"])
                    st.add("demo_request_decode_tokens_total", timing["decode_tokens"])
                yield event
        finally:
            with st.lock:
                st.running -= 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="demo inference engine")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--tp", "--tp-size", dest="tp", type=int, default=1)
    ap.add_argument("--attention-mode", choices=["prefill", "decode"], default="prefill")
    ap.add_argument("--speculative-num-steps", type=int, default=0)
    ap.add_argument("--max-running-requests", type=int, default=64,
                    help="requests decoded together in one batch, at most (1: one at a time)")
    ap.add_argument("--cuda-graph", dest="cuda_graph", action="store_true", default=True)
    ap.add_argument("--disable-cuda-graph", dest="cuda_graph", action="store_false")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per CPU worker (0: auto)")
    ap.add_argument("--model-name", default="demo")
    args = ap.parse_args(argv)
    if args.tp < 1:
        ap.error("--tp must be at least 1")
    if args.speculative_num_steps < 0:
        ap.error("--speculative-num-steps must be >= 0")
    if args.max_running_requests < 1:
        ap.error("--max-running-requests must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not ARTIFACT.is_file():
        log(f"error: {ARTIFACT.relative_to(HERE)} not found; run 'python build.py' first")
        return 2
    app = App(args)
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    httpd.app = app
    log(f"demo engine {VERSION} listening on http://{args.host}:{args.port} "
        f"(tp={args.tp}, speculative_num_steps={args.speculative_num_steps})")

    def on_signal(signum, frame):
        app.workers.stop()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    app.workers.start()
    try:
        httpd.serve_forever()
    finally:
        app.workers.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
