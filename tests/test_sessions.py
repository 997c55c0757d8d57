"""Multi-turn sessions and dataset workloads against real servers on loopback.

:class:`CacheServer` is a small HTTP/1.1 server in a thread that speaks the completions, chat
and llama.cpp APIs, tokenizes two tokens a word (``POST /tokenize``, llama.cpp's form), and
keeps a prefix cache of what it saw: each request's prompt is compared, token by token, with
every earlier prompt and its reply, and the longest run they share is reported as cached
(``usage.prompt_tokens_details.cached_tokens``, llama.cpp's ``timings.cache_n``). Its replies
are words it makes up, so a later turn that carries them is seen to carry the server's own.

The last test does the same against the real ``llama-server`` (skipped where it is not built).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bisect_harness.measure.apis import get_api
from bisect_harness.measure.client import SampleFailed, measure_sample_detail
from bisect_harness.measure.datasets import read_dataset
from bisect_harness.measure.deadline import deadline_client
from bisect_harness.measure.sessions import SessionJob, Turn
from bisect_harness.model import BenchmarkSpec
from bisect_harness.workload import Dataset, MultiTurn

DATASET = str(Path(__file__).parent / "fixtures" / "datasets" / "sharegpt.json")


def tokens(text: str) -> list[str]:
    """The server's tokens: two a word."""
    return [piece for w in text.split() for piece in (w, "+")]


class CacheServer:
    """Completions, chat and llama.cpp streams, a tokenizer and a prefix cache, on 127.0.0.1.
    ``fail``: a function of the request's number (from 1) that answers HTTP 500 where true."""

    def __init__(self, *, fail=lambda n: False):
        self.seen: list[list[str]] = []  # the token runs a cache holds: each prompt, then with its reply
        self.requests: list[dict] = []   # (path, body, prompt, reply, cached, start, end)
        self.lock = threading.Lock()
        self.fail = fail
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _json(self, obj, status=200):
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._json({"data": [{"id": "tiny"}]} if self.path == "/v1/models" else {}, 200)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/tokenize":
                    if "content" not in body:
                        return self._json({"error": "content"}, 400)
                    return self._json({"tokens": list(range(len(tokens(body["content"]))))})
                server.stream(self, self.path, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stream(self, h: BaseHTTPRequestHandler, path: str, body: dict) -> None:
        start = time.perf_counter()
        if path == "/v1/chat/completions":
            prompt = "\n\n".join(f"{m['role']}: {m['content']}" for m in body["messages"])
            most = body["max_tokens"]
        elif path == "/completion":
            prompt, most = body["prompt"], body["n_predict"]
        else:
            prompt, most = body["prompt"], body["max_tokens"]
        toks = tokens(prompt)
        with self.lock:
            n = len(self.requests) + 1
            cached = max((_shared(toks, run) for run in self.seen), default=0)
            reply = "".join(f" r{n}w{j}" for j in range(most))
            self.seen.append(toks)
            self.seen.append(tokens(prompt + reply))
            rec = {"path": path, "body": body, "prompt": prompt, "reply": reply, "cached": cached, "start": start}
            self.requests.append(rec)
        if self.fail(n):
            body = b"no"
            h.send_response(500)
            h.send_header("Content-Length", "2")
            h.end_headers()
            h.wfile.write(body)
            return
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def send(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            h.wfile.flush()

        words = [f" r{n}w{j}" for j in range(most)]
        for w in words:
            if path == "/completion":
                send({"content": w, "stop": False})
            elif path == "/v1/chat/completions":
                send({"choices": [{"delta": {"content": w}}]})
            else:
                send({"choices": [{"text": w}]})
        if path == "/completion":
            send({"content": "", "stop": True, "tokens_predicted": most, "tokens_evaluated": len(toks),
                  "timings": {"prompt_n": len(toks) - cached, "cache_n": cached}})
        else:
            send({"choices": [{"finish_reason": "length", **({"delta": {}} if "chat" in path else {"text": ""})}],
                  "usage": {"prompt_tokens": len(toks), "completion_tokens": most,
                            "prompt_tokens_details": {"cached_tokens": cached}}})
            send(b"[DONE]")
        h.wfile.write(b"0\r\n\r\n")
        rec["end"] = time.perf_counter()

    def __enter__(self) -> "CacheServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _shared(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _sessions(requests: list[dict], key) -> dict:
    """The requests grouped by session (``key``: the session of a request)."""
    out: dict = {}
    for r in requests:
        out.setdefault(key(r), []).append(r)
    return out


def test_a_multi_turn_session_carries_the_servers_replies_into_later_turns():
    bench = BenchmarkSpec(api="completions", prompt_tokens=6, output_tokens=3, concurrency=2, requests_per_sample=5,
                          warmup_requests=0, workload=MultiTurn(turns=3))
    with CacheServer() as srv:
        detail = measure_sample_detail(srv.base_url, bench, boot=1, sample=1)
    # five requests asked, whole sessions sent: two sessions of three turns, two at a time
    assert len(srv.requests) == len(detail.requests) == 6 and detail.result.requests == 6
    by_session = _sessions(srv.requests, lambda r: r["prompt"].split("\n\n")[0])
    assert sorted(len(turns) for turns in by_session.values()) == [3, 3]
    for turns in by_session.values():
        users = [r["prompt"].split("\n\nUser: ")[-1].removesuffix("\n\nAssistant:").removeprefix("User: ")
                 for r in turns]
        assert len(set(users)) == 3 and all(len(u.split()) == 6 for u in users)
        assert turns[0]["prompt"] == f"User: {users[0]}\n\nAssistant:"
        for before, after, user in zip(turns, turns[1:], users[1:]):
            # the whole of the previous turn, the server's own reply, then the new user turn
            assert after["prompt"] == before["prompt"] + before["reply"] + f"\n\nUser: {user}\n\nAssistant:"
            # so the cache holds all of it: the previous prompt and its reply
            assert after["cached"] == len(tokens(before["prompt"] + before["reply"]))
        assert turns[0]["cached"] <= 2  # "User:" is every session's first word
    # the client kept each reply as the server sent it and records the server's cached counts
    sent = {r["reply"] for r in srv.requests}
    assert {r.text for r in detail.requests} == sent
    metrics = detail.result.metrics
    cached = sum(r["cached"] for r in srv.requests)
    prompt = sum(len(tokens(r["prompt"])) for r in srv.requests)
    assert metrics["cached_prompt_tokens"] == pytest.approx(cached / 6)
    assert metrics["prefix_cache_hit_share"] == pytest.approx(cached / prompt)
    assert 0.5 < metrics["prefix_cache_hit_share"] < 1


def test_a_chat_session_sends_messages_and_waits_its_think_time():
    bench = BenchmarkSpec(api="chat", prompt_tokens=4, output_tokens=2, requests_per_sample=3, warmup_requests=0,
                          workload=MultiTurn(turns=3, think_s=0.3))
    with CacheServer() as srv:
        detail = measure_sample_detail(srv.base_url, bench, boot=1, sample=1)
    assert len(srv.requests) == 3 and detail.result.errors == 0
    messages = [r["body"]["messages"] for r in srv.requests]
    assert [m["role"] for m in messages[2]] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[2][:3] == messages[1] and messages[1][:1] == messages[0]
    assert [messages[2][1]["content"], messages[2][3]["content"]] == [srv.requests[0]["reply"],
                                                                        srv.requests[1]["reply"]]
    assert srv.requests[0]["body"]["model"] == "tiny"  # resolved from /v1/models as for any request
    for before, after in zip(srv.requests, srv.requests[1:]):
        assert after["start"] - before["end"] >= 0.3  # the user's think time after each reply


def test_a_dataset_conversation_is_replayed_turn_by_turn_with_lengths_from_the_servers_tokenizer():
    conversations = {c.where: c for c in read_dataset(DATASET).conversations}
    bench = BenchmarkSpec(api="llamacpp", requests_per_sample=6, warmup_requests=0,
                          workload=Dataset(DATASET, mode="conversation", max_output_tokens=400))
    with CacheServer() as srv:
        detail = measure_sample_detail(srv.base_url, bench, boot=1, sample=1)
        first = measure_sample_detail(srv.base_url, dataclasses.replace(bench, workload=Dataset(DATASET)),
                                      boot=1, sample=2)
    replayed = srv.requests[:len(detail.requests)]
    assert len(replayed) >= 6 and detail.result.errors == 0
    # each request a turn of a conversation of the file, in order, with the server's replies between
    by_first_user = {c.turns[0][0]: c for c in conversations.values()}
    k = 0
    while k < len(replayed):
        prompt = replayed[k]["prompt"]
        head = prompt.split("\n\n")
        conv = by_first_user[(head[1] if head[0].startswith("System: ") else head[0]).removeprefix("User: ")]
        if conv.system:
            assert prompt.startswith(f"System: {conv.system}\n\nUser: ")
        for t, (user, reply) in enumerate(conv.turns):
            r = replayed[k + t]
            assert r["prompt"].endswith(f"User: {user}\n\nAssistant:")
            # the output asked is the file's reply's length as the server's tokenizer counts it
            assert r["body"]["n_predict"] == len(tokens(reply))
            if t:
                before = replayed[k + t - 1]
                assert r["prompt"].startswith(before["prompt"] + before["reply"] + "\n\nUser: ")
        k += len(conv.turns)
    assert detail.result.metrics["prefix_cache_hit_share"] > 0
    # first_turn: one request a conversation, its first user turn alone, its reply's length
    singles = srv.requests[len(detail.requests):]
    assert len(singles) == len(first.requests) == 6
    for r in singles:
        conv = by_first_user[r["prompt"]]
        assert r["body"]["n_predict"] == len(tokens(conv.turns[0][1]))


def test_a_failed_turn_ends_its_session_and_its_later_turns_count_as_failed():
    with CacheServer(fail=lambda n: n == 2) as srv:
        job = SessionJob(srv.base_url + "/v1/completions", get_api("completions"),
                         (Turn("one two", 2), Turn("three four", 2), Turn("five six", 2)), timeout_s=10,
                         model="tiny")
        with deadline_client() as http:
            records = job.run(http, time.perf_counter())
        assert len(srv.requests) == 2  # the third turn was never sent
        assert [r.ok for r in records] == [True, False, False]
        assert records[1].error.startswith("HTTP 500")
        assert records[2].error.startswith("turn 3 of its session not sent: turn 2 failed (HTTP 500")
        # a sample of such sessions: two of its three requests failed, more than it may lose
        bench = BenchmarkSpec(api="completions", prompt_tokens=2, output_tokens=2, requests_per_sample=3,
                              warmup_requests=0, workload=MultiTurn(turns=3))
        srv.fail = lambda n: n == 4
        with pytest.raises(SampleFailed, match="2 of the sample's 3 requests .* failed"):
            measure_sample_detail(srv.base_url, bench, boot=1, sample=1)


# --------------------------------------------------------------------------- the real llama-server

LLAMACPP = Path(os.environ.get("BISECT_HARNESS_LLAMACPP", Path.home() / ".cache" / "bisect-harness" / "llamacpp"))
LLAMA_SERVER = LLAMACPP / "bin" / "llama-server"


@pytest.mark.slow
def test_a_dataset_and_multi_turn_sessions_on_the_real_llama_server(tmp_path):
    """llama-server (``--parallel 1``) keeps what it computed: a session's later turns find the
    earlier ones there, and say so per request (``timings.cache_n``); a prompt the boot has not
    sent before finds next to nothing (the BOS, a session's ``User: `` and a few bytes). Through the harness's own
    runner: the boot's prompts sized by the server's tokenizer, a warm-up, then two samples,
    for multi-turn sessions, a dataset's first turns and its whole conversations."""
    if not LLAMA_SERVER.exists():
        msg = f"no llama-server at {LLAMA_SERVER} (build it with .ci/install-llamacpp {LLAMACPP})"
        if os.environ.get("BISECT_HARNESS_REQUIRE_REAL_ENGINES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    from bisect_harness.engines.benchtools import ClientRunner, Endpoint
    from bisect_harness.engines.server import ServerProcess, free_port
    from bisect_harness.measure.datasets import draw
    from bisect_harness.measure.workloads import dataset_lengths
    from tinygguf import build_tiny_gguf

    # this vocabulary spends several tokens on a word, and the random model's replies (bytes that
    # are no UTF-8) come back as three tokens each: a context of 4096 holds them
    model = build_tiny_gguf(tmp_path / "tiny.gguf", layers=4, ctx=4096)
    port = free_port()
    argv = [str(LLAMA_SERVER), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--ctx-size", "4096", "--threads", "1", "--parallel", "1"]
    env = {**os.environ, "PATH": f"{LLAMA_SERVER.parent}{os.pathsep}{os.environ['PATH']}"}
    base = BenchmarkSpec(api="llamacpp", prompt_tokens=32, output_tokens=8, requests_per_sample=6,
                         warmup_requests=1, ignore_eos=True)
    workloads = {"multi_turn": MultiTurn(turns=3), "first_turn": Dataset(DATASET),
                 "conversation": Dataset(DATASET, mode="conversation", max_output_tokens=200)}
    figures, sessions = {}, {}
    with ServerProcess(argv, env=env, cwd=tmp_path, log_path=tmp_path / "server.log",
                       base_url=f"http://127.0.0.1:{port}", ready_timeout_s=60) as server:
        for boot, (name, workload) in enumerate(workloads.items(), start=1):
            runner = ClientRunner(dataclasses.replace(base, workload=workload), Endpoint(server.base_url), boot)
            runner.warmup()
            with runner.session():
                details = [runner.sample(i) for i in range(2)]
            for d in details:
                assert d.result.errors == 0, [r.error for r in d.requests if not r.ok]
            figures[name] = [{"prefix_cache_hit_share": round(d.result.metrics["prefix_cache_hit_share"], 3),
                              "cache_n": [r.cached_tokens for r in d.requests],
                              "prompt": [r.prompt_tokens for r in d.requests]} for d in details]
            if isinstance(workload, Dataset):  # what the boot sent, in order: the warm-up's, then the samples'
                lengths = dataset_lengths(server.base_url, None, boot)
                sessions[name] = [[u for u, _ in c.turns] for sample, n in ((0, 1), (1, 6), (2, 6))
                                  for c in draw(workload, n, lengths, seed=0, boot=boot, sample=sample)]
            else:
                sessions[name] = [[None] * 3] * 6
    print(json.dumps(figures))
    for name, per_sample in figures.items():
        turns = sessions[name][1 if name != "multi_turn" else 2:]  # past the warm-up's
        cached = [n for f in per_sample for n in f["cache_n"]]
        prompt = [n for f in per_sample for n in f["prompt"]]
        assert len(cached) == sum(len(t) for t in turns) == 12, (name, cached, turns)
        firsts = {u for t in sessions[name][:1 if name != "multi_turn" else 2] for u in t}
        k = 0
        for t in turns:
            fresh = t[0] is None or t[0] not in firsts  # a first turn the boot has not sent before
            if fresh:  # the BOS, a session's "User: " and a few bytes: no more
                assert cached[k] <= 16, (name, k, cached, prompt)
            for j in range(1, len(t)):  # a later turn of a session finds the turn before it and its reply
                assert cached[k + j] >= prompt[k + j - 1] - 2, (name, k + j, cached, prompt)
            firsts |= set(t)
            k += len(t)
    for f in figures["multi_turn"]:  # two of every three turns carry the ones before them
        assert f["prefix_cache_hit_share"] > 0.4, figures["multi_turn"]


@pytest.mark.slow
@pytest.mark.parametrize("workload", [{"multi_turn": {"turns": 3}},
                                      {"dataset": {"path": "sharegpt.json", "mode": "conversation",
                                                   "max_output_tokens": 200}}], ids=["multi_turn", "dataset"])
def test_a_run_on_the_real_llama_server_records_its_cache_hits_per_sample(tmp_path, workload):
    """``harness run`` of a workload on llama-server, end to end: every sample holds the
    server's own cache figures (``timings.cache_n`` over its prompt tokens), and the journal
    shows them per sample for a hypothesis on them. The arms differ by a variable nothing
    reads: a multi-turn session's share of cached prompt tokens does not move."""
    if not LLAMA_SERVER.exists():
        msg = f"no llama-server at {LLAMA_SERVER} (build it with .ci/install-llamacpp {LLAMACPP})"
        if os.environ.get("BISECT_HARNESS_REQUIRE_REAL_ENGINES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    import shutil

    from helpers import harness, last_json, query, write_spec
    from tinygguf import build_tiny_gguf

    build_tiny_gguf(tmp_path / "tiny.gguf", layers=4, ctx=4096)
    shutil.copy(DATASET, tmp_path / "sharegpt.json")
    spec = write_spec(
        tmp_path / "h.yaml",
        engine={"preset": "llamacpp", "ready_timeout_s": 60,
                "flags": {"model": "{spec_dir}/tiny.gguf", "ctx-size": 4096, "threads": 1, "parallel": 1}},
        benchmark={"api": "llamacpp", "prompt_tokens": 32, "output_tokens": 8, "requests_per_sample": 6,
                   "warmup_requests": 1, "workload": workload},
        hypotheses=[{"id": "inert", "baseline": {}, "treatment": {"env": {"BH_INERT": "1"}},
                     "metric": "prefix_cache_hit_share", "expect": "decrease", "min_effect": "10%"}],
        defaults={"boots_per_arm": 2, "max_boots_per_arm": 2, "samples_per_boot": 2, "boot_retries": 0,
                  "host_preflight_s": 0})
    db = tmp_path / "r.db"
    env = {**os.environ, "PATH": f"{LLAMA_SERVER.parent}{os.pathsep}{os.environ['PATH']}"}
    r = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir",
                tmp_path / "exp", cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (verdict,) = last_json(r.stdout)["hypotheses"]
    rows = query(db, "SELECT json_extract(metrics, '$.prefix_cache_hit_share'), "
                     "json_extract(metrics, '$.cached_prompt_tokens'), requests, errors FROM samples")
    assert len(rows) == 8 and all(share is not None and cached is not None and n >= 6 and not errors
                                  for share, cached, n, errors in rows), rows
    shares = [share for share, *_ in rows]
    print(json.dumps({"workload": workload, "verdict": verdict["verdict"], "prefix_cache_hit_share": shares}))
    (journal,) = (tmp_path / "exp").glob("*-run1.md")
    text = journal.read_text()
    assert "| side | boot | status | prefix_cache_hit_share per sample | boot mean | marks |" in text
    assert f"{shares[0]:.2f}" in text
    if "multi_turn" in workload:  # two of every three turns carry the turns before them
        assert all(share > 0.4 for share in shares), shares
        assert verdict["verdict"] != "confirmed", verdict
