"""One tensor-parallel worker process, started by serve.py.

Protocol: one JSON request per line on stdin (every rank gets every request);
rank 0 answers with JSON event lines on stdout: ``accepted`` once the request
is valid (before its prefill), ``tokens`` as each batch of tokens is ready, then
``done`` with the request's timing; or ``error`` instead of all of them. A ``tokens``
event says its ``kind`` (prefill, decode, verify), ``cycle_ms``, whether a CUDA graph
ran it (``graph``) and its forward passes (``passes``; a verify cycle: ``draft_passes``
and ``draft_ms`` besides ``verify_ms``). Logs go to stderr. The worker
exits when stdin reaches end-of-file or when its parent dies.

A request with ``"type": "start_profile"`` (``output_dir``, ``profile_id``) starts
``torch.profiler`` in rank 0 (CPU activities, and CUDA where the worker runs on a
GPU); ``"type": "stop_profile"`` stops it and writes the Chrome trace, gzipped, to
``<output_dir>/<profile_id>-TP-0.trace.json.gz`` (SGLang's name for rank 0's trace).
Rank 0 answers each with one ``done`` event (``profile``: started | stopped; on stop
the trace's ``path`` and the decode and verify ``steps`` run while it recorded), or
``error``; the other ranks take no part.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from model import Comm, ModelConfig, TinyLM
from tokenizer import EOS

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill us when the server dies; close the race by hand."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Engine:
    """Prefill, plain decode, and draft-and-verify decode over one TinyLM."""

    def __init__(self, model: TinyLM, *, spec_steps: int, use_graph: bool, rank: int):
        self.model = model
        self.spec_steps = spec_steps
        self.rank = rank
        self.device = model.device
        self.graph = None
        # Decode attention under the Simple protocol has no fused reduction: each plain
        # decode step runs twice. Set after construction from the flag and the env.
        self.unfused = False
        if use_graph:
            self._capture_decode_graph()

    def _capture_decode_graph(self) -> None:
        m = self.model
        t0 = time.perf_counter()
        self.static_tok = torch.zeros(1, dtype=torch.long, device=self.device)
        self.static_pos = torch.zeros(1, dtype=torch.long, device=self.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                m.forward(self.static_tok, self.static_pos)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.static_logits = m.forward(self.static_tok, self.static_pos)
        self.graph = graph
        # a capture at start, as SGLang logs it: set up, not yet run
        log(f"Capture decode CUDA graph end. elapsed={time.perf_counter() - t0:.2f} s")

    def decode_step(self, token: int, pos: int) -> torch.Tensor:
        for _ in range(2 if self.unfused else 1):
            if self.graph is not None:
                self.static_tok.fill_(token)
                self.static_pos.fill_(pos)
                self.graph.replay()
                logits = self.static_logits[-1]
            else:
                t = torch.tensor([token], device=self.device)
                p = torch.tensor([pos], device=self.device)
                logits = self.model.forward(t, p)[-1]
        return logits

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def generate(self, req: dict, emit, log_cycles: bool = True) -> None:
        prompt = [int(t) for t in req["prompt_ids"]]
        max_new = int(req["max_new_tokens"])
        ignore_eos = bool(req.get("ignore_eos", False))
        temperature = float(req.get("temperature", 0.0))
        gen = torch.Generator(device="cpu").manual_seed(int(req.get("seed", 0)))
        cap = self.model.cfg.max_seq
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) + max_new + self.spec_steps + 1 > cap:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new}) "
                             f"exceeds the context length {cap}")

        def pick(logits: torch.Tensor) -> int:
            if temperature <= 0:
                return int(torch.argmax(logits).item())
            probs = torch.softmax(logits.float().cpu() / temperature, dim=-1)
            return int(torch.multinomial(probs, 1, generator=gen).item())

        # The request is valid: say so before the prefill, so the server sends its
        # response headers now and the first token's chunk goes out alone, like
        # every later one (SGLang and vLLM send theirs before the first token too).
        emit({"event": "accepted"})
        m = self.model
        m.start_request()
        t0 = time.perf_counter()
        logits = m.forward(torch.tensor(prompt, device=self.device),
                           torch.arange(len(prompt), device=self.device))
        out = [pick(logits[-1])]
        self.sync()
        # In-process timing of this request, stamped when each batch of tokens is
        # ready to send: prefill = arrival -> first token; decode = first -> last.
        t_first = t_last = time.perf_counter()
        cycles, cycles_s = 0, 0.0
        emit({"event": "tokens", "ids": out[:], "cycle_ms": (t_first - t0) * 1e3,
              "kind": "prefill", "graph": False, "passes": 1})
        prefill_s = t_first - t0
        pos = len(prompt)  # position of the newest token, not yet in the cache
        verify_ct = 0
        finish = "length"
        while len(out) < max_new:
            if not ignore_eos and out[-1] == EOS:
                finish = "stop"
                break
            t0 = time.perf_counter()
            if self.spec_steps == 0:
                new = [pick(self.decode_step(out[-1], pos))]
                self.sync()
                ms = (time.perf_counter() - t0) * 1e3
                graph = self.graph is not None
                if self.rank == 0 and log_cycles:
                    log(f"decode cycle: {ms:.2f} ms/cyc, cuda graph: {graph}")
                # an unfused step runs the model twice: two forward passes
                event = {"event": "tokens", "kind": "decode", "cycle_ms": ms, "graph": graph,
                         "passes": 2 if self.unfused else 1}
            else:
                new, accepted, verify_ms, draft_ms = self._spec_cycle(out[-1], pos, pick)
                verify_ct += 1
                ms = (time.perf_counter() - t0) * 1e3
                if self.rank == 0 and log_cycles:
                    log(f"Target verify: {verify_ms:.2f} ms/cyc accept_len={len(new):.2f}, cuda graph: False")
                # draft and verify run eagerly, whether or not a decode graph was captured
                event = {"event": "tokens", "kind": "verify", "cycle_ms": ms, "graph": False,
                         "accepted": accepted, "verify_ms": verify_ms,
                         "draft_passes": self.spec_steps, "draft_ms": draft_ms}
            if not ignore_eos and EOS in new:
                new = new[: new.index(EOS) + 1]
            new = new[: max_new - len(out)]
            cycles += 1
            cycles_s += ms / 1e3
            t_last = time.perf_counter()
            emit({**event, "ids": new})
            out.extend(new)
            pos += len(new)
        if not ignore_eos and out and out[-1] == EOS:
            finish = "stop"
        # The two stamps themselves too (time.perf_counter: on Linux the host's
        # CLOCK_MONOTONIC, which a client on the same host reads as well).
        timing = {"prefill_s": prefill_s, "decode_s": t_last - t_first, "decode_tokens": len(out) - 1,
                  "decode_cycles": cycles, "decode_cycles_s": cycles_s,
                  "first_token_at": t_first, "last_token_at": t_last}
        emit({"event": "done", "prompt_tokens": len(prompt), "completion_tokens": len(out),
              "spec_verify_ct": verify_ct, "finish_reason": finish, "timing": timing})

    def _spec_cycle(self, last: int, pos: int, pick) -> tuple[list[int], int, float, float]:
        """Draft ``spec_steps`` tokens with the first layers, verify them in one pass."""
        m = self.model
        draft = []
        tok = last
        t_draft = time.perf_counter()
        for j in range(self.spec_steps):
            logits = m.forward(torch.tensor([tok], device=self.device),
                               torch.tensor([pos + j], device=self.device),
                               n_layers=m.cfg.draft_layers)[-1]
            tok = int(torch.argmax(logits).item())
            draft.append(tok)
        t_verify = time.perf_counter()
        draft_ms = (t_verify - t_draft) * 1e3
        seq = [last] + draft
        logits = m.forward(torch.tensor(seq, device=self.device),
                           torch.arange(pos, pos + len(seq), device=self.device))
        self.sync()
        verify_ms = (time.perf_counter() - t_verify) * 1e3
        new = []
        accepted = 0
        for j in range(len(seq)):
            target = pick(logits[j])
            new.append(target)
            if j < len(draft) and draft[j] == target:
                accepted += 1
                continue
            break
        return new, accepted, verify_ms, draft_ms


class Profile:
    """``torch.profiler`` over the requests between a start and a stop (rank 0 only)."""

    REQUESTS = ("start_profile", "stop_profile")

    def __init__(self, device_type: str):
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if device_type == "cuda":
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = None
        self.path: Path | None = None
        self.steps = {"decode": 0, "verify": 0}

    def counting(self, emit):
        """``emit``, counting the decode and verify steps while a profile records."""
        if self.prof is None:
            return emit

        def counted(event: dict) -> None:
            if event.get("event") == "tokens" and event.get("kind") in self.steps:
                self.steps[event["kind"]] += 1
            emit(event)

        return counted

    def handle(self, req: dict, emit) -> None:
        try:
            if req["type"] == "start_profile":
                self._start(req)
                emit({"event": "done", "profile": "started",
                      "activities": [a.name for a in self.activities]})
            else:
                path, steps = self._stop()
                emit({"event": "done", "profile": "stopped", "path": str(path), "steps": steps})
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            emit({"event": "error", "message": f"{req['type']}: {exc}"})

    def _start(self, req: dict) -> None:
        if self.prof is not None:
            raise RuntimeError("a profile is already recording; POST /stop_profile first")
        out = Path(str(req["output_dir"]))
        name = str(req.get("profile_id") or f"{time.time():.3f}")
        if "/" in name or name.startswith("."):
            raise ValueError(f"profile_id {name!r} must be a plain file name")
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / f"{name}-TP-0.trace.json.gz"
        self.steps = {"decode": 0, "verify": 0}
        prof = torch.profiler.profile(activities=self.activities, record_shapes=False, with_stack=False)
        prof.start()
        self.prof = prof
        log(f"Profiling starts. Traces will be saved to: {out} (with profile id: {name})")

    def _stop(self) -> tuple[Path, dict]:
        if self.prof is None:
            raise RuntimeError("no profile is recording; POST /start_profile first")
        prof, self.prof = self.prof, None
        prof.stop()
        # Written under a temporary name and renamed: a reader never sees half a trace.
        part = self.path.with_suffix(".partial.gz")  # gzipped too: torch reads the suffix
        prof.export_chrome_trace(str(part))
        os.replace(part, self.path)
        log(f"Profiling done. Traces are saved to: {self.path}")
        return self.path, dict(self.steps)


def loopback_store(port: int, rank: int, world_size: int, timeout: timedelta):
    """The workers' rendezvous store, on 127.0.0.1 alone: torch's store server listens
    on every address unless it is handed a socket, so rank 0 binds one itself."""
    fd = None
    if rank == 0:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(64)
        fd = sock.detach()  # the store owns it from here
    return dist.TCPStore("127.0.0.1", port, world_size, rank == 0, timeout=timeout, master_listen_fd=fd,
                         use_libuv=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--dist-port", type=int, required=True)
    ap.add_argument("--parent-pid", type=int, required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cuda-graph", type=int, default=1)
    ap.add_argument("--speculative-num-steps", type=int, default=0)
    ap.add_argument("--attention-mode", default="prefill")
    args = ap.parse_args(argv)
    die_with_parent(args.parent_pid)

    here = Path(__file__).resolve().parent
    kernels = json.loads((here / "build" / "kernels.json").read_text())
    cfg = ModelConfig.from_kernels(kernels)
    if args.device == "auto":
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device_type = args.device
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("worker: --device cuda requested but CUDA is not available")
        torch.cuda.set_device(args.rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, args.threads))
    # The demo serves on loopback only, its collectives too: gloo's pair sockets and NCCL's
    # bootstrap, proxy and RAS sockets listen on the interface named here, else on the
    # host's own address (one more socket beyond loopback per rank on every GPU boot).
    # Where the config sets them, its values stand.
    loopback = "lo0" if sys.platform == "darwin" else "lo"
    for name, value in (("GLOO_SOCKET_IFNAME", loopback), ("NCCL_SOCKET_IFNAME", loopback),
                        ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(name, value)
    tuned = os.environ.get("DEMO_COMM_TUNING", "") == "1"
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                            store=loopback_store(args.dist_port, args.rank, args.world_size, timedelta(seconds=120)),
                            rank=args.rank, world_size=args.world_size,
                            timeout=timedelta(seconds=120),
                            device_id=device if device_type == "cuda" else None)
    comm = Comm(args.world_size, tuned, cfg.comm_chunk)
    model = TinyLM(cfg, rank=args.rank, world_size=args.world_size, seed=args.seed,
                   device=device, comm=comm)
    use_graph = bool(args.cuda_graph) and device_type == "cuda"
    engine = Engine(model, spec_steps=args.speculative_num_steps, use_graph=use_graph,
                    rank=args.rank)
    engine.unfused = args.attention_mode == "decode" and os.environ.get("NCCL_PROTO", "") == "Simple"
    # Warm up a short request so the first real one does not pay for lazy init.
    engine.generate({"prompt_ids": [1, 2, 3, 4], "max_new_tokens": 4, "temperature": 0.0,
                     "ignore_eos": True}, lambda event: None, log_cycles=False)
    engine.sync()
    dist.barrier()

    out = sys.stdout
    profile = Profile(device_type)

    def emit(event: dict) -> None:
        if args.rank == 0:
            out.write(json.dumps(event) + "\n")
            out.flush()

    ready = {"event": "ready", "rank": args.rank, "pid": os.getpid(), "device": device_type,
             "cuda_graph": engine.graph is not None, "threads": torch.get_num_threads(),
             "attention_mode": args.attention_mode, "context_length": cfg.max_seq}
    out.write(json.dumps(ready) + "\n")
    out.flush()
    log(f"worker rank {args.rank}/{args.world_size} ready on {device_type} "
        f"(threads={torch.get_num_threads()}, cuda_graph={engine.graph is not None})")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("type") in Profile.REQUESTS:
            if args.rank == 0:
                profile.handle(req, emit)
            continue
        try:
            engine.generate(req, profile.counting(emit))
        except ValueError as exc:
            emit({"event": "error", "message": str(exc)})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
