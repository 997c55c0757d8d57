"""One tensor-parallel worker process, started by serve.py.

Protocol: one JSON message per line on stdin (every rank gets every message, in
the same order); each names its request with ``rid``. Rank 0 answers with JSON
event lines on stdout, each naming the ``rid`` it concerns: ``accepted`` once the
request is valid (before its prefill), ``tokens`` as each of its tokens is ready,
then ``done`` with the request's timing; or ``error`` instead of all of them.
After every forward step rank 0 also writes a ``step`` event (no ``rid``): its
``kind`` (prefill, decode, verify), ``batch`` (the sequences it ran), ``cycle_ms``,
whether a CUDA graph ran it (``graph``) and its forward passes (``passes``; a
verify cycle: ``draft_passes`` and ``draft_ms`` besides ``verify_ms``). Logs go to
stderr. The worker exits when stdin reaches end-of-file or when its parent dies.

Requests are batched continuously: every request accepted and not yet done is a
sequence of the batch, and one decode step (or one draft-and-verify cycle) runs
them all in the same forward passes. Between two steps the requests that arrived
join, up to ``--max-running-requests`` sequences: each is checked and prefilled on
its own, then decodes with the others from the next step on. Rank 0 decides how
many of the waiting messages join and tells the other ranks, so every rank runs
the same batch.

A message with ``"type": "start_profile"`` (``output_dir``, ``profile_id``) starts
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
import queue
import signal
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from model import Comm, KVCache, ModelConfig, TinyLM
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


def read_messages(stream, inbox: queue.Queue) -> None:
    """Put each message of ``stream`` into ``inbox`` with the time it arrived; ``None`` at its end."""
    for line in stream:
        if not line.strip():
            continue
        req = json.loads(line)
        inbox.put((req, time.perf_counter()))
    inbox.put(None)


class Admission:
    """Which waiting messages join the batch before the next step, the same on every rank.

    Every rank reads every message in the same order; rank 0 alone counts how many
    are waiting and broadcasts the count, so the ranks take the same ones.
    """

    def __init__(self, inbox: queue.Queue, *, rank: int, world_size: int, device: torch.device):
        self.inbox, self.rank, self.world_size, self.device = inbox, rank, world_size, device

    def take(self, room: int, idle: bool) -> list:
        """Up to ``room`` messages (``(request, arrived)``, or ``None`` at the end of input);
        with ``idle`` (an empty batch), waits for the first."""
        taken = []
        if idle:
            taken.append(self.inbox.get())  # the same first message on every rank
            room -= 1
        count = min(room, self.inbox.qsize()) if self.rank == 0 else 0
        if self.world_size > 1:
            agreed = torch.tensor([count], dtype=torch.long, device=self.device)
            dist.broadcast(agreed, src=0)
            count = int(agreed.item())
        taken += [self.inbox.get() for _ in range(count)]
        return taken


class Sequence:
    """One request of the batch: its tokens, its KV cache, its sampler and its timing."""

    def __init__(self, req: dict, arrived: float, cache: KVCache):
        self.rid = req.get("rid")
        self.prompt = [int(t) for t in req["prompt_ids"]]
        self.max_new = max(1, int(req["max_new_tokens"]))  # the prefill's token comes in any case
        self.ignore_eos = bool(req.get("ignore_eos", False))
        self.temperature = float(req.get("temperature", 0.0))
        self.gen = torch.Generator(device="cpu").manual_seed(int(req.get("seed", 0)))
        self.cache = cache
        self.out: list[int] = []
        self.pos = len(self.prompt)  # position of the newest token, not yet in the cache
        self.arrived = arrived
        self.prefill_s = 0.0
        self.t_first = self.t_last = 0.0
        self.cycles, self.cycles_s, self.verify_ct = 0, 0.0, 0

    def pick(self, logits: torch.Tensor, greedy: int) -> int:
        """The next token from one row of ``logits``; ``greedy`` is its argmax, already known."""
        if self.temperature <= 0:
            return greedy
        probs = torch.softmax(logits.float().cpu() / self.temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.gen).item())

    def take(self, new: list[int]) -> list[int]:
        """Keep the tokens of ``new`` this request still wants (up to its end-of-sequence and
        its ``max_new_tokens``); returns them."""
        if not self.ignore_eos and EOS in new:
            new = new[: new.index(EOS) + 1]
        new = new[: self.max_new - len(self.out)]
        self.out.extend(new)
        self.pos += len(new)
        return new

    @property
    def finished(self) -> bool:
        return len(self.out) >= self.max_new or (not self.ignore_eos and self.out[-1] == EOS)

    def done_event(self) -> dict:
        # The two stamps themselves too (time.perf_counter: on Linux the host's
        # CLOCK_MONOTONIC, which a client on the same host reads as well).
        timing = {"prefill_s": self.prefill_s, "decode_s": self.t_last - self.t_first,
                  "decode_tokens": len(self.out) - 1, "decode_cycles": self.cycles,
                  "decode_cycles_s": self.cycles_s, "first_token_at": self.t_first,
                  "last_token_at": self.t_last}
        finish = "stop" if not self.ignore_eos and self.out[-1] == EOS else "length"
        return {"event": "done", "rid": self.rid, "prompt_tokens": len(self.prompt),
                "completion_tokens": len(self.out), "spec_verify_ct": self.verify_ct,
                "finish_reason": finish, "timing": timing}


class Engine:
    """Continuous batching over one TinyLM: per-request prefill, then plain decode steps or
    draft-and-verify cycles over every running sequence at once."""

    def __init__(self, model: TinyLM, *, spec_steps: int, use_graph: bool, rank: int, max_running: int):
        self.model = model
        self.spec_steps = spec_steps
        self.rank = rank
        self.max_running = max_running
        self.device = model.device
        self.graph = None
        self.graph_cache: KVCache | None = None
        # On a GPU a sequence's cache holds max_seq positions (a fixed shape); finished
        # sequences hand theirs back for the next, the graph's own first. On a CPU each
        # sequence gets one of the positions it can use.
        self.free_caches: list[KVCache] = []
        # Decode attention under the Simple protocol has no fused reduction: each plain
        # decode step runs twice. Set after construction from the flag and the env.
        self.unfused = False
        if use_graph:
            self._capture_decode_graph()

    def _capture_decode_graph(self) -> None:
        """A graph of the plain decode step of one sequence, over a cache of its own: it
        replays whenever that sequence decodes alone (a lone request takes that cache)."""
        m = self.model
        t0 = time.perf_counter()
        self.graph_cache = m.new_cache(m.cfg.max_seq)
        self.free_caches.append(self.graph_cache)
        self.static_tok = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        self.static_pos = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                m.forward(self.static_tok, self.static_pos, [self.graph_cache])
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.static_logits = m.forward(self.static_tok, self.static_pos, [self.graph_cache])
        self.graph = graph
        # a capture at start, as SGLang logs it: set up, not yet run
        log(f"Capture decode CUDA graph end. elapsed={time.perf_counter() - t0:.2f} s")

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _cache(self, positions: int) -> KVCache:
        if self.model.paced:
            return self.model.new_cache(positions)
        return self.free_caches.pop(0) if self.free_caches else self.model.new_cache(self.model.cfg.max_seq)

    def _release(self, seq: Sequence) -> None:
        if not self.model.paced:
            if seq.cache is self.graph_cache:
                self.free_caches.insert(0, seq.cache)
            else:
                self.free_caches.append(seq.cache)

    def serve(self, admission: Admission, emit, control) -> None:
        """Run until the input ends: between two steps, admit what waits (``control`` takes
        the profiler's messages), then step every running sequence at once."""
        batch: list[Sequence] = []
        while True:
            for message in admission.take(self.max_running - len(batch), idle=not batch):
                if message is None:
                    return
                req, arrived = message
                if req.get("type") in Profile.REQUESTS:
                    control(req)
                    continue
                try:
                    seq = self.admit(req, arrived, emit, idle=not batch)
                except ValueError as exc:
                    emit({"event": "error", "rid": req.get("rid"), "message": str(exc)})
                    continue
                if seq.finished:
                    self._finish(seq, emit)
                else:
                    batch.append(seq)
            if batch:
                batch = self.step(batch, emit)

    def warm_up(self) -> None:
        """A short request through prefill and a few steps, so the first real one does not
        pay for lazy initialisation."""
        def quiet(event: dict) -> None:
            return None

        req = {"rid": "warm-up", "prompt_ids": [1, 2, 3, 4], "max_new_tokens": 4, "temperature": 0.0,
               "ignore_eos": True}
        batch = [self.admit(req, time.perf_counter(), quiet, idle=True)]
        while batch:
            batch = self.step(batch, quiet, log_cycles=False)
        self.sync()

    def admit(self, req: dict, arrived: float, emit, idle: bool) -> Sequence:
        """Check a request, accept it and prefill it: its first token is out when this returns.
        Raises ValueError for a request the engine cannot serve."""
        prompt, max_new = req["prompt_ids"], int(req["max_new_tokens"])
        cap = self.model.cfg.max_seq
        if not prompt:
            raise ValueError("empty prompt")
        need = len(prompt) + max_new + self.spec_steps + 1
        if need > cap:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new}) "
                             f"exceeds the context length {cap}")
        seq = Sequence(req, arrived, self._cache(need))
        # The request is valid: say so before the prefill, so the server sends its
        # response headers now and the first token's chunk goes out alone, like
        # every later one (SGLang and vLLM send theirs before the first token too).
        emit({"event": "accepted", "rid": seq.rid})
        m = self.model
        if idle:
            m.device_idle()
        t0 = time.perf_counter()
        logits = m.forward(torch.tensor([seq.prompt], device=self.device),
                           torch.arange(len(seq.prompt), device=self.device)[None], [seq.cache])[0, -1]
        first = seq.pick(logits, int(torch.argmax(logits).item()))
        self.sync()
        # In-process timing of each request, stamped when its tokens are ready to
        # send: prefill = arrival at the worker -> first token; decode = first -> last.
        seq.t_first = seq.t_last = time.perf_counter()
        seq.prefill_s = seq.t_first - arrived
        emit({"event": "step", "kind": "prefill", "batch": 1, "cycle_ms": (seq.t_first - t0) * 1e3,
              "graph": False, "passes": 1})
        emit({"event": "tokens", "rid": seq.rid, "ids": seq.take([first]), "kind": "prefill"})
        return seq

    def step(self, batch: list[Sequence], emit, log_cycles: bool = True) -> list[Sequence]:
        """One decode step (or draft-and-verify cycle) of every sequence in ``batch``; returns
        those not finished."""
        t0 = time.perf_counter()
        if self.spec_steps == 0:
            news, graph = self._decode(batch)
            accepted = None
            self.sync()
            ms = (time.perf_counter() - t0) * 1e3
            if self.rank == 0 and log_cycles:
                log(f"decode cycle: {ms:.2f} ms/cyc, batch: {len(batch)}, cuda graph: {graph}")
            # an unfused step runs the model twice: two forward passes
            event = {"event": "step", "kind": "decode", "batch": len(batch), "cycle_ms": ms, "graph": graph,
                     "passes": 2 if self.unfused else 1}
        else:
            news, accepted, verify_ms, draft_ms = self._spec_cycle(batch)
            ms = (time.perf_counter() - t0) * 1e3
            if self.rank == 0 and log_cycles:
                accept_len = sum(len(n) for n in news) / len(batch)
                log(f"Target verify: {verify_ms:.2f} ms/cyc accept_len={accept_len:.2f}, batch: {len(batch)}, "
                    "cuda graph: False")
            # draft and verify run eagerly, whether or not a decode graph was captured
            event = {"event": "step", "kind": "verify", "batch": len(batch), "cycle_ms": ms, "graph": False,
                     "verify_ms": verify_ms, "draft_passes": self.spec_steps, "draft_ms": draft_ms}
        emit(event)
        ready = time.perf_counter()
        running = []
        for j, (seq, new) in enumerate(zip(batch, news)):
            seq.cycles += 1
            seq.cycles_s += ms / 1e3
            seq.t_last = ready
            tokens = {"event": "tokens", "rid": seq.rid, "ids": seq.take(new), "kind": event["kind"]}
            if accepted is not None:
                seq.verify_ct += 1
                tokens["accepted"] = accepted[j]
            emit(tokens)
            if seq.finished:
                self._finish(seq, emit)
            else:
                running.append(seq)
        return running

    def _finish(self, seq: Sequence, emit) -> None:
        emit(seq.done_event())
        self._release(seq)

    def _picks(self, batch: list[Sequence], logits: torch.Tensor) -> list[int]:
        """The next token of each sequence from its row of ``logits`` ``[B, vocab]``."""
        greedy = logits.argmax(-1).tolist()
        return [seq.pick(logits[b], greedy[b]) for b, seq in enumerate(batch)]

    def _decode(self, batch: list[Sequence]) -> tuple[list[list[int]], bool]:
        """One plain decode step of the batch: one forward pass over all of its sequences."""
        graph = self.graph is not None and len(batch) == 1 and batch[0].cache is self.graph_cache
        for _ in range(2 if self.unfused else 1):
            if graph:
                self.static_tok.fill_(batch[0].out[-1])
                self.static_pos.fill_(batch[0].pos)
                self.graph.replay()
                logits = self.static_logits[:, -1]
            else:
                tokens = torch.tensor([[seq.out[-1]] for seq in batch], device=self.device)
                positions = torch.tensor([[seq.pos] for seq in batch], device=self.device)
                logits = self.model.forward(tokens, positions, [seq.cache for seq in batch])[:, -1]
        return [[t] for t in self._picks(batch, logits)], graph

    def _spec_cycle(self, batch: list[Sequence]) -> tuple[list[list[int]], list[int], float, float]:
        """Draft ``spec_steps`` tokens with the first layers, verify them in one pass."""
        m, k = self.model, self.spec_steps
        caches = [seq.cache for seq in batch]
        last = torch.tensor([[seq.out[-1]] for seq in batch], device=self.device)
        start = torch.tensor([[seq.pos] for seq in batch], device=self.device)
        t_draft = time.perf_counter()
        tok, drafts = last, []
        for j in range(k):  # every sequence's j-th draft token in one pass of the draft layers
            tok = m.forward(tok, start + j, caches, n_layers=m.cfg.draft_layers)[:, -1].argmax(-1, keepdim=True)
            drafts.append(tok)
        t_verify = time.perf_counter()
        draft_ms = (t_verify - t_draft) * 1e3
        draft = torch.cat(drafts, dim=1)  # [B, k]
        # one verify pass over k + 1 tokens of every sequence: the batch's widest pass
        logits = m.forward(torch.cat([last, draft], dim=1), start + torch.arange(k + 1, device=self.device),
                           caches)
        self.sync()
        verify_ms = (time.perf_counter() - t_verify) * 1e3
        greedy, draft_ids = logits.argmax(-1).tolist(), draft.tolist()
        news, accepted = [], []
        for b, seq in enumerate(batch):  # keep the longest matching prefix plus one
            new = []
            for j in range(k + 1):
                target = seq.pick(logits[b, j], greedy[b][j])
                new.append(target)
                if j < k and draft_ids[b][j] == target:
                    continue
                break
            news.append(new)
            accepted.append(len(new) - 1)
        return news, accepted, verify_ms, draft_ms


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

    def count(self, event: dict) -> None:
        """Count a decode or verify step while a profile records."""
        if self.prof is not None and event.get("event") == "step" and event.get("kind") in self.steps:
            self.steps[event["kind"]] += 1

    def handle(self, req: dict, emit) -> None:
        rid = req.get("rid")
        try:
            if req["type"] == "start_profile":
                self._start(req)
                emit({"event": "done", "rid": rid, "profile": "started",
                      "activities": [a.name for a in self.activities]})
            else:
                path, steps = self._stop()
                emit({"event": "done", "rid": rid, "profile": "stopped", "path": str(path), "steps": steps})
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            emit({"event": "error", "rid": rid, "message": f"{req['type']}: {exc}"})

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
    ap.add_argument("--max-running-requests", type=int, default=1)
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
                    rank=args.rank, max_running=args.max_running_requests)
    engine.unfused = args.attention_mode == "decode" and os.environ.get("NCCL_PROTO", "") == "Simple"
    engine.warm_up()
    dist.barrier()

    out = sys.stdout
    profile = Profile(device_type)

    def emit(event: dict) -> None:
        profile.count(event)
        if args.rank == 0:
            out.write(json.dumps(event) + "\n")
            out.flush()

    def control(req: dict) -> None:
        if args.rank == 0:
            profile.handle(req, emit)

    ready = {"event": "ready", "rank": args.rank, "pid": os.getpid(), "device": device_type,
             "cuda_graph": engine.graph is not None, "threads": torch.get_num_threads(),
             "attention_mode": args.attention_mode, "context_length": cfg.max_seq,
             "max_running_requests": args.max_running_requests}
    out.write(json.dumps(ready) + "\n")
    out.flush()
    log(f"worker rank {args.rank}/{args.world_size} ready on {device_type} "
        f"(threads={torch.get_num_threads()}, cuda_graph={engine.graph is not None})")
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=read_messages, args=(sys.stdin, inbox), daemon=True).start()
    engine.serve(Admission(inbox, rank=args.rank, world_size=args.world_size, device=device), emit, control)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
