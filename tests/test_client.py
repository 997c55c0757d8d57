"""The streaming client against recorded streams replayed live on loopback.

Each fixture in ``fixtures/streams`` is a raw ``text/event-stream`` body as
vLLM or SGLang send it. A small HTTP/1.1 server replays it with chunked
encoding, sleeping a known delay before each event that carries output, so
TTFT and ITL can be checked against the delays.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from bisect_harness.measure.deadline import deadline_client
from bisect_harness.measure.client import SampleFailed, boot_session, measure_sample, measure_sample_detail, warmup
from bisect_harness.measure.prompts import request_prompt, synthetic_prompt
from bisect_harness.measure.sse import SSEDecoder
from bisect_harness.model import CAPACITY_METRICS, CLIENT_METRICS, OPEN_LOOP_METRICS, SLO_METRICS, BenchmarkSpec

FIXTURES = Path(__file__).parent / "fixtures" / "streams"

# Timing tolerances: the machine is shared and noisy, so lower bounds are tight
# (a delay cannot be skipped) and upper bounds are generous.
SLACK_S = 0.04


def fixture_events(name: str) -> list[bytes]:
    """Split a recorded body into events, each with its blank-line terminator."""
    raw = (FIXTURES / name).read_bytes()
    sep = b"\r\n\r\n" if b"\r\n\r\n" in raw else b"\n\n"
    parts = raw.split(sep)
    events = [p + sep for p in parts[:-1]]
    if parts[-1]:
        events.append(parts[-1])
    return events


def carries_output(event: bytes) -> bool:
    for line in event.replace(b"\r\n", b"\n").split(b"\n"):
        if line.startswith(b"data:") and b"[DONE]" not in line:
            try:
                obj = json.loads(line[5:])
            except ValueError:  # hostile streams: anything at all
                return False
            if not isinstance(obj, dict):
                return False
            if "text" in obj and "choices" not in obj:
                return True
            choices = obj.get("choices")
            return isinstance(choices, list) and any(isinstance(c, dict) and c.get("text") for c in choices)
    return False


class Replay:
    """Loopback server: POST /v1/completions and /generate replay a fixture."""

    def __init__(self, fixture: str | list[bytes], *, first_delay: float = 0.0, delay: float = 0.0,
                 split_reads: bool = False, status_for=None, cut_after: int | None = None):
        self.events = fixture_events(fixture) if isinstance(fixture, str) else list(fixture)
        self.first_delay, self.delay = first_delay, delay
        self.split_reads = split_reads
        self.status_for = status_for or (lambda n: 200)
        self.cut_after = cut_after
        self.payloads: list[dict] = []
        self.paths: list[str] = []
        self.count = 0
        self.gets = 0
        self.lock = threading.Lock()
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args):
                pass

            def do_GET(self):
                with replay.lock:
                    replay.gets += 1
                body = json.dumps({"object": "list", "data": [{"id": "served-model", "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with replay.lock:
                    n = replay.count
                    replay.count += 1
                    replay.payloads.append(payload)
                    replay.paths.append(self.path)
                status = replay.status_for(n)
                if status != 200:
                    body = json.dumps({"object": "error", "message": "overloaded", "code": status}).encode()
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                first = True
                for i, event in enumerate(replay.events):
                    if replay.cut_after is not None and i == replay.cut_after:
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if carries_output(event):
                        time.sleep(replay.first_delay if first else replay.delay)
                        first = False
                    if replay.split_reads and len(event) > 4:
                        cut = len(event) // 2
                        self.chunk(event[:cut])
                        time.sleep(0.003)
                        self.chunk(event[cut:])
                    else:
                        self.chunk(event)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def chunk(self, data: bytes):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def spec(**kw) -> BenchmarkSpec:
    base = dict(api="completions", model="m", requests_per_sample=1, concurrency=1, warmup_requests=0,
                output_tokens=16, prompt_tokens=8)
    base.update(kw)
    return BenchmarkSpec(**base)


# --------------------------------------------------------------------------- SSE decoder

def decode_all(body: bytes, step: int) -> list[tuple[str | None, bytes]]:
    dec = SSEDecoder()
    out = []
    for i in range(0, len(body), step):
        out += dec.feed(body[i:i + step])
    return out + dec.close()


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 100000])
def test_sse_decoder_is_independent_of_read_boundaries(step):
    body = (b": ping\r\n\r\nevent: error\r\ndata: {\"a\": 1}\r\n\r\ndata: x\rdata: y\r\r"
            b"id: 7\ndata:no-space\n\ndata: [DONE]\n\ndata: tail-without-blank-line")
    assert decode_all(body, step) == [
        ("error", b'{"a": 1}'), (None, b"x\ny"), (None, b"no-space"), (None, b"[DONE]"),
        (None, b"tail-without-blank-line")]


def test_sse_decoder_fixtures_byte_by_byte():
    for path in sorted(FIXTURES.glob("*.sse")):
        body = path.read_bytes()
        whole = decode_all(body, len(body))
        assert decode_all(body, 1) == whole, path.name
        assert whole and all(data for _, data in whole), path.name


# --------------------------------------------------------------------------- live replays

def test_vllm_completions_timing_and_usage():
    with Replay("vllm_completions.sse", first_delay=0.20, delay=0.05) as srv:
        detail = measure_sample_detail(srv.base_url, spec())
    r = detail.result
    # every client metric, the prompt's real length where the server's usage says it; no
    # cached count: vLLM sends usage.prompt_tokens_details only with --enable-prompt-tokens-details;
    # closed loop without an SLO: none of the open loop's or the SLO's
    assert set(r.metrics) == set(CLIENT_METRICS) - {"cached_prompt_tokens", "prompt_tokens_evaluated",
                                                    "prefix_cache_hit_share", *OPEN_LOOP_METRICS, *SLO_METRICS,
                                                    *CAPACITY_METRICS}
    assert r.metrics["prompt_tokens"] == detail.requests[0].prompt_tokens == detail.requests[0].usage["prompt_tokens"]
    assert (r.requests, r.errors, r.output_tokens) == (1, 0, 8)
    req = detail.requests[0]
    assert req.counted_tokens == 8 and req.chunks == 8 and req.usage["completion_tokens"] == 8
    assert 0.20 <= req.ttft_s < 0.20 + SLACK_S * 3
    assert 0.05 <= r.metrics["itl_ms"] / 1e3 < 0.05 + SLACK_S
    assert 0.05 <= r.metrics["tpot_ms"] / 1e3 < 0.05 + SLACK_S
    assert r.metrics["e2e_ms"] / 1e3 >= 0.20 + 7 * 0.05
    assert math.isclose(r.metrics["tok_s"], 8 / r.duration_s)


def test_request_payloads_follow_the_documented_shapes():
    with Replay("vllm_completions.sse") as srv:
        measure_sample(srv.base_url, spec(model=None, output_tokens=33, prompt_tokens=20, seed=4))
        assert srv.paths == ["/v1/completions"]
        p = srv.payloads[0]
        assert p["model"] == "served-model"  # from GET /v1/models
        assert p["stream"] is True and p["stream_options"] == {"include_usage": True}
        assert p["max_tokens"] == 33 and p["temperature"] == 0.0 and p["ignore_eos"] is True
        bench = spec(model=None, output_tokens=33, prompt_tokens=20, seed=4)
        assert p["prompt"] == request_prompt(bench, 0) and len(p["prompt"].split()) == 20
    with Replay("sglang_generate_spec.sse") as srv:
        measure_sample(srv.base_url, spec(api="generate", output_tokens=12))
        assert srv.paths == ["/generate"]
        p = srv.payloads[0]
        assert p["stream"] is True and isinstance(p["text"], str)
        assert p["sampling_params"] == {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}


def test_synthetic_prompt_is_seeded():
    assert synthetic_prompt(50, 1, 0) == synthetic_prompt(50, 1, 0)
    assert synthetic_prompt(50, 1, 0) != synthetic_prompt(50, 2, 0)
    assert synthetic_prompt(50, 1, 0) != synthetic_prompt(50, 1, 1)


def _shared_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split(), b.split()):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("words", [1, 4, 20, 200])
def test_each_request_has_its_own_prompt_in_every_sample_and_boot_and_as_long(words):
    """No prefix cache may serve one sample from another: request i's prompt in any
    sample (the warm-up is sample 0) and boot of a config starts its own way, and has
    the same words (so the same tokens, wherever a tokenizer splits on spaces or counts
    bytes) as request i's everywhere else."""
    bench = BenchmarkSpec(prompt_tokens=words, seed=7)
    keys = [(boot, sample) for boot in (1, 2, 3) for sample in range(4)]
    for index in range(6):
        prompts = [request_prompt(bench, index, boot=b, sample=s) for b, s in keys]
        if words >= 12:  # a tag of six words (a shorter prompt has a tag of half its words)
            assert len(set(prompts)) == len(prompts), "every sample and boot has its own"
        assert {len(p.split()) for p in prompts} == {words}
        assert len({len(p.encode()) for p in prompts}) == 1, "as many bytes: a byte-level vocabulary counts alike"
        assert len({tuple(sorted(p.split()[min(6, max(1, words // 2)):])) for p in prompts}) == 1, "one body"
        if words >= 20:  # a tag of six words: a shared first word is chance (1 in 32), two in a thousand
            shared = [_shared_prefix(a, b) for i, a in enumerate(prompts) for b in prompts[i + 1:]]
            assert max(shared) <= 2 and sum(1 for n in shared if n) <= len(shared) // 4, shared
    # the requests of one sample differ from each other too; the same key gives the same prompt
    if words >= 12:
        assert len({request_prompt(bench, i, boot=1, sample=1) for i in range(16)}) == 16
    assert request_prompt(bench, 3, boot=2, sample=1) == request_prompt(bench, 3, boot=2, sample=1)


def test_prompt_reuse_sends_the_same_prompts_every_sample_and_boot():
    bench = BenchmarkSpec(prompt_tokens=30, prompt_reuse=True)
    for index in range(3):
        prompts = {request_prompt(bench, index, boot=b, sample=s) for b in (1, 2) for s in (0, 1, 2)}
        assert len(prompts) == 1
        assert len(next(iter(prompts)).split()) == 30 == len(request_prompt(BenchmarkSpec(prompt_tokens=30), index).split())


def test_a_boots_samples_and_warmup_send_their_own_prompts():
    """Through the client as a boot drives it: the warm-up and each sample send prompts
    no other sends, and each request's prompt is as long in every sample."""
    from bisect_harness.measure.prompt_size import PromptSize

    bench = spec(requests_per_sample=3, warmup_requests=2, prompt_tokens=12)
    size = PromptSize(12, 12, "words")
    with Replay("vllm_completions.sse") as srv:
        warmup(srv.base_url, bench, prompt=size, boot=5)
        for sample in (1, 2):
            measure_sample_detail(srv.base_url, bench, prompt=size, boot=5, sample=sample)
        measure_sample_detail(srv.base_url, bench, prompt=size, boot=6, sample=1)
    sent = [p["prompt"] for p in srv.payloads]
    assert len(sent) == 2 + 3 * 3 and len(set(sent)) == len(sent)
    assert {len(p.split()) for p in sent} == {12}
    first_requests = [sent[i] for i in (0, 2, 5, 8)]  # request 0 of the warm-up and of each sample
    assert len({len(p.encode()) for p in first_requests}) == 1


def test_the_servers_cached_and_computed_prompt_tokens_are_recorded_per_sample():
    """llama.cpp's timings (cache_n, prompt_n; a 2023 server without cache_n: the prompt
    less what it computed) and SGLang's meta_info.cached_tokens become the sample's
    cached_prompt_tokens and prompt_tokens_evaluated."""
    with Replay("llamacpp_completion.sse", delay=0.001) as srv:
        r = measure_sample_detail(srv.base_url, spec(api="llamacpp", requests_per_sample=2)).result
    assert r.metrics["cached_prompt_tokens"] == 0 and r.metrics["prompt_tokens_evaluated"] == 4
    assert r.metrics["prompt_tokens"] == 4
    now = [e.replace(b'"prompt_n":4,', b'"prompt_n":1,"cache_n":3,') for e in fixture_events("llamacpp_completion.sse")]
    with Replay(now, delay=0.001) as srv:
        r = measure_sample_detail(srv.base_url, spec(api="llamacpp", requests_per_sample=2)).result
    assert r.metrics["cached_prompt_tokens"] == 3 and r.metrics["prompt_tokens_evaluated"] == 1
    assert r.metrics["prefix_cache_hit_share"] == 3 / 4  # of the prompt's 4 tokens (tokens_evaluated), 3 cached
    cut = [e.replace(b'"prompt_n":4,', b'"prompt_n":1,"cache_n":99,') for e in fixture_events("llamacpp_completion.sse")]
    with Replay(cut, delay=0.001) as srv:  # more cached than the prompt has: not believed
        r = measure_sample_detail(srv.base_url, spec(api="llamacpp", requests_per_sample=1)).result
    assert "cached_prompt_tokens" not in r.metrics
    with Replay("sglang_generate_spec.sse", delay=0.001) as srv:
        detail = measure_sample_detail(srv.base_url, spec(api="generate", output_tokens=12))
    assert detail.requests[0].cached_tokens == detail.requests[0].meta_info["cached_tokens"]
    assert detail.result.metrics["cached_prompt_tokens"] == detail.requests[0].cached_tokens


def test_sglang_openai_completions():
    with Replay("sglang_openai_completions.sse", first_delay=0.1, delay=0.03) as srv:
        detail = measure_sample_detail(srv.base_url, spec())
    assert detail.result.output_tokens == 6 and detail.requests[0].chunks == 6
    assert 0.03 <= detail.result.metrics["itl_ms"] / 1e3 < 0.03 + SLACK_S


def test_sglang_generate_cumulative_text_and_spec_fields():
    # completion_tokens: 1, 3, 5, 8, 10, 12 -> 11 tokens after the first chunk, 5 gaps of 60 ms
    with Replay("sglang_generate_spec.sse", first_delay=0.1, delay=0.06, split_reads=True) as srv:
        detail = measure_sample_detail(srv.base_url, spec(api="generate", output_tokens=12))
    req = detail.requests[0]
    assert req.output_tokens == 12 and req.counted_tokens == 12 and req.chunks == 6
    assert req.decode_tokens == 11
    itl = detail.result.metrics["itl_ms"] / 1e3
    assert 5 * 0.06 / 11 <= itl < (5 * 0.06 + SLACK_S * 2) / 11  # per token, not per chunk (60 ms)
    fields = detail.responses[0]
    assert fields["spec_verify_ct"] == 5 and fields["completion_tokens"] == 12
    assert fields["spec_accept_length"] == pytest.approx(12 / 5)


def test_multi_token_chunks_do_not_inflate_itl():
    # 6 chunks, 11 tokens (final usage): 10 tokens after the first chunk over 5 gaps of 60 ms
    with Replay("multi_token_completions.sse", first_delay=0.05, delay=0.06) as srv:
        detail = measure_sample_detail(srv.base_url, spec())
    req = detail.requests[0]
    assert req.output_tokens == 11 and req.counted_tokens == 6 and req.chunks == 6
    itl = detail.result.metrics["itl_ms"] / 1e3
    assert 0.030 <= itl < 0.030 + SLACK_S / 2
    assert req.tpot_s == pytest.approx((req.e2e_s - req.ttft_s) / 10)


def test_stream_without_done_or_usage_counts_chunks():
    with Replay("no_done_no_usage.sse", delay=0.01) as srv:
        detail = measure_sample_detail(srv.base_url, spec())
    req = detail.requests[0]
    assert req.ok and req.usage is None
    assert req.output_tokens == req.counted_tokens == 5


def test_keepalives_crlf_and_split_reads():
    with Replay("keepalive_crlf.sse", first_delay=0.05, delay=0.02, split_reads=True) as srv:
        detail = measure_sample_detail(srv.base_url, spec(requests_per_sample=3, concurrency=3))
    assert detail.result.errors == 0 and detail.result.requests == 3
    for req in detail.requests:
        assert req.output_tokens == 4 and req.counted_tokens == 4 and req.chunks == 4


def test_error_object_in_stream_counts_as_error():
    with Replay("vllm_completions.sse") as good, Replay("error_midstream.sse") as bad:
        with pytest.raises(SampleFailed, match="illegal memory access"):
            measure_sample(bad.base_url, spec(requests_per_sample=2, concurrency=2))
        assert good.count == 0


def test_http_errors_are_counted_and_all_failed_raises():
    with Replay("vllm_completions.sse", status_for=lambda n: 500 if n % 2 else 200) as srv:
        r = measure_sample(srv.base_url, spec(requests_per_sample=6, concurrency=2))
    assert (r.requests, r.errors, r.output_tokens) == (3, 3, 24)
    with Replay("vllm_completions.sse", status_for=lambda n: 500) as srv:
        with pytest.raises(SampleFailed, match="all 2 benchmark requests .* HTTP 500"):
            measure_sample(srv.base_url, spec(requests_per_sample=2))


def test_disconnect_mid_stream_is_an_error():
    with Replay("vllm_completions.sse", cut_after=3) as srv:
        with pytest.raises(SampleFailed) as info:
            measure_sample_detail(srv.base_url, spec())
    assert "RemoteProtocolError" in str(info.value) or "ReadError" in str(info.value)


def test_concurrency_overlaps_requests():
    # 8 requests of ~0.1 + 7*0.03 = 0.31 s each: serial would take ~2.5 s
    with Replay("vllm_completions.sse", first_delay=0.1, delay=0.03) as srv:
        with deadline_client() as http:
            detail = measure_sample_detail(srv.base_url, spec(requests_per_sample=8, concurrency=4),
                                           client=http)
    r = detail.result
    assert r.requests == 8 and r.output_tokens == 64
    assert 2 * 0.31 <= r.duration_s < 2 * 0.31 + 1.2
    starts = sorted(req.start_s for req in detail.requests)
    first_end = min(req.start_s + req.e2e_s for req in detail.requests)
    assert starts[3] < first_end <= starts[4]  # four in flight at once, never five


def test_warmup_sends_requests_and_is_not_a_sample():
    with Replay("vllm_completions.sse") as srv:
        assert warmup(srv.base_url, spec(warmup_requests=3)) == 0
        assert srv.count == 3
        assert warmup(srv.base_url, spec(warmup_requests=0)) == 0
        assert srv.count == 3
    with Replay("error_midstream.sse") as srv:
        with pytest.raises(SampleFailed, match="warmup"):
            warmup(srv.base_url, spec(warmup_requests=2))


def test_unreachable_server_raises_sample_failed():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SampleFailed, match="ConnectError"):
        measure_sample(f"http://127.0.0.1:{port}", spec())


def test_unknown_api_is_rejected():
    with pytest.raises(ValueError, match="unknown benchmark api"):
        measure_sample("http://127.0.0.1:9", spec(api="grpc"))


# --------------------------------------------------------------------------- percentiles

def _record(ttft, gaps, tokens, e2e=None):
    from bisect_harness.measure.request import RequestRecord

    decode = sum(gaps)
    e2e = e2e if e2e is not None else ttft + decode
    return RequestRecord(ok=True, error=None, start_s=0.0, ttft_s=ttft, e2e_s=e2e,
                         itl_s=decode / (tokens - 1) if tokens > 1 else None,
                         tpot_s=(e2e - ttft) / (tokens - 1) if tokens > 1 else None, output_tokens=tokens,
                         counted_tokens=tokens, chunks=tokens, decode_s=decode, decode_tokens=tokens - 1,
                         token_gaps_s=tuple(gaps))


def test_percentiles_are_linear_interpolation_over_requests_and_tokens():
    from bisect_harness.measure.percentiles import percentile_metrics

    recs = [_record(0.1, [0.01, 0.02], 3), _record(0.2, [0.03], 2), _record(0.3, [], 1), _record(0.4, [0.05], 2)]
    m = percentile_metrics(recs)
    # TTFT over the four requests: order statistics 0.1 0.2 0.3 0.4, linear between them
    assert m["ttft_p50_ms"] == pytest.approx(250.0)
    assert m["ttft_p90_ms"] == pytest.approx(370.0)
    assert m["ttft_p99_ms"] == pytest.approx(397.0)
    # ITL pooled over tokens: 0.01 0.02 0.03 0.05
    assert m["itl_p50_ms"] == pytest.approx(25.0)
    assert m["itl_p90_ms"] == pytest.approx(44.0)
    # TPOT only for requests of two tokens or more: 0.015, 0.03, 0.05
    assert m["tpot_p50_ms"] == pytest.approx(30.0)
    assert m["tpot_p99_ms"] == pytest.approx(1e3 * (0.03 + 0.98 * 0.02))
    # one-token answers only: no ITL or TPOT, never a zero
    single = percentile_metrics([_record(0.1, [], 1)])
    assert math.isnan(single["itl_p50_ms"]) and math.isnan(single["tpot_p99_ms"])


def test_token_gaps_split_multi_token_chunks_and_carry_empty_ones():
    from bisect_harness.measure.request import _token_gaps

    # chunks at 0, 0.1 (2 tokens), 0.15 (0 tokens), 0.3 (1 token)
    assert _token_gaps([0.0, 0.1, 0.15, 0.3], [1, 2, 0, 1], 3) == pytest.approx((0.05, 0.05, 0.2))
    # split unknown: 6 tokens after the first over 3 gaps -> 2 tokens per gap
    assert _token_gaps([0.0, 0.1, 0.3, 0.4], [None, None, None, None], 6) == pytest.approx((0.05, 0.1, 0.05))


def test_percentiles_live_match_the_stream_delays():
    # 11 tokens in 6 chunks (the split is not sent): 5 gaps of 60 ms, 2 tokens each, 30 ms a token
    with Replay("multi_token_completions.sse", first_delay=0.05, delay=0.06) as srv:
        detail = measure_sample_detail(srv.base_url, spec(requests_per_sample=3))
    m = detail.result.metrics
    for req in detail.requests:
        assert len(req.token_gaps_s) == 5
        assert sum(req.token_gaps_s) / 5 == pytest.approx(req.itl_s)
    assert 0.030 <= m["itl_p50_ms"] / 1e3 < 0.030 + SLACK_S / 2
    assert m["itl_p50_ms"] <= m["itl_p90_ms"] <= m["itl_p99_ms"]
    assert 0.05 <= m["ttft_p50_ms"] / 1e3 <= m["ttft_p99_ms"] / 1e3 < 0.05 + SLACK_S * 3
    ttfts = sorted(r.ttft_s for r in detail.requests)
    assert m["ttft_p50_ms"] == pytest.approx(1e3 * ttfts[1])


def test_headers_are_sent_with_every_request():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers.get("Authorization"))
            body = (b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choices": [{"text": "b"}]}\n\n'
                    b"data: [DONE]\n\n")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        warmup(url, spec(warmup_requests=1), headers={"Authorization": "Bearer k1"})
        measure_sample(url, spec(requests_per_sample=2), headers={"Authorization": "Bearer k1"})
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Bearer k1"] * 3


def test_decode_tok_s_is_first_to_last_chunk_and_tok_s_is_end_to_end():
    with Replay("vllm_completions.sse", first_delay=0.20, delay=0.05) as srv:
        r = measure_sample_detail(srv.base_url, spec()).result
    assert math.isclose(r.metrics["decode_tok_s"], 1e3 / r.metrics["itl_ms"])
    assert 1 / (0.05 + SLACK_S) < r.metrics["decode_tok_s"] <= 1 / 0.05
    assert r.metrics["tok_s"] <= 8 / (0.20 + 7 * 0.05)  # the 0.2 s TTFT is inside tok_s only


def test_each_request_says_when_it_was_sent_on_the_clock_of_its_stamps():
    with Replay("vllm_completions.sse", first_delay=0.05, delay=0.01) as srv:
        before = time.perf_counter()
        detail = measure_sample_detail(srv.base_url, spec(requests_per_sample=2))
        after = time.perf_counter()
    first, second = detail.requests
    assert before < first.sent_at < first.sent_at + first.ttft_s + first.decode_s < first.sent_at + first.e2e_s
    assert first.sent_at + first.e2e_s <= second.sent_at < second.sent_at + second.e2e_s < after
    assert second.sent_at - first.sent_at == pytest.approx(second.start_s - first.start_s, abs=1e-6)


def test_boot_session_resolves_the_model_once_outside_every_sample():
    with Replay("vllm_completions.sse") as srv:
        with boot_session(srv.base_url, spec(model=None)) as (http, bench):
            assert bench.model == "served-model" and srv.gets == 1
            for _ in range(3):
                measure_sample_detail(srv.base_url, bench, client=http)
            assert (srv.gets, srv.count) == (1, 3)
            assert {p["model"] for p in srv.payloads} == {"served-model"}
        assert http.is_closed
        measure_sample_detail(srv.base_url, spec(model=None))  # a sample on its own asks inside its window
        assert srv.gets == 2
    with Replay("sglang_generate_spec.sse") as srv:
        with boot_session(srv.base_url, spec(api="generate", model=None)) as (_, bench):
            assert bench.model is None and srv.gets == 0


# --------------------------------------------------------------------------- hostile streams


def _sse(*chunks: str) -> list[bytes]:
    return [f"data: {c}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


GOOD_CHUNK = '{"choices": [{"index": 0, "text": " a"}]}'


@pytest.mark.parametrize("api,chunk,reason", [
    ("completions", '{"choices": [1]}', "choices is list [1]"),
    ("completions", '{"choices": [null]}', "not a list of objects"),
    ("completions", '{"choices": {"text": "a"}}', "not a list of objects"),
    ("completions", '{"usage": "lots"}', "usage is str"),
    ("completions", '{"choices": [{"text": 7}]}', "text is int"),
    ("completions", '{"choices": [], "usage": {"completion_tokens": 1000000000}}',
     "more than the 16 tokens the request allowed"),
    ("completions", '{"choices": [], "usage": {"completion_tokens": -3}}', "went down from 0 to -3"),
    ("completions", '{"choices": [], "usage": {"completion_tokens": true}}', "not a whole number"),
    ("completions", '{"choices": [], "usage": {"completion_tokens": 2.5}}', "not a whole number"),
    ("generate", '{"text": 5}', "text is int"),
    ("generate", '{"text": " a", "meta_info": [1]}', "meta_info is list"),
    ("generate", '{"text": " a", "meta_info": {"completion_tokens": 99}}', "more than the 16 tokens"),
])
def test_a_chunk_of_the_wrong_shape_or_an_impossible_count_fails_the_request(api, chunk, reason):
    first = GOOD_CHUNK if api == "completions" else '{"text": " a", "meta_info": {"completion_tokens": 1}}'
    with Replay(_sse(first, chunk)) as srv:
        with pytest.raises(SampleFailed) as info:
            measure_sample_detail(srv.base_url, spec(api=api, requests_per_sample=2))
    assert reason in str(info.value), str(info.value)


def test_a_count_within_the_request_is_believed():
    with Replay(_sse(GOOD_CHUNK, '{"choices": [], "usage": {"completion_tokens": 16}}')) as srv:
        r = measure_sample(srv.base_url, spec())
    assert (r.requests, r.errors, r.output_tokens) == (1, 0, 16)


def test_a_line_split_over_many_reads_is_one_line_and_a_line_past_the_cap_fails():
    dec = SSEDecoder(max_line=1 << 20)
    body = b"data: " + b"x" * 300_000 + b"\n\n"
    out = []
    for i in range(0, len(body), 1000):
        out += dec.feed(body[i:i + 1000])
    assert out == [(None, b"x" * 300_000)]
    from bisect_harness.measure.sse import SSELineTooLong

    with pytest.raises(SSELineTooLong, match="went past 1,048,576 bytes"):
        for _ in range(2000):
            dec.feed(b"y" * 1000)  # no line end, ever


def test_a_stream_whose_line_never_ends_fails_the_request_not_the_harness():
    from bisect_harness.model import Limits

    # the cap is the spec's limits.stream_line_bytes
    with Replay([b"data: " + b"z" * 200_000]) as srv:
        with pytest.raises(SampleFailed, match="went past 65,536 bytes"):
            measure_sample_detail(srv.base_url, spec(limits=Limits(stream_line_bytes=64 * 1024)))


def test_a_server_count_below_its_text_chunks_is_not_believed():
    chunks = [GOOD_CHUNK] * 5 + ['{"choices": [], "usage": {"completion_tokens": 2}}']
    with Replay(_sse(*chunks)) as srv:
        detail = measure_sample_detail(srv.base_url, spec())
    (r,) = detail.requests
    assert r.output_tokens == 5 and r.counted_tokens == 5 and r.chunks == 5
    assert r.usage_mismatch == "the server counted 2 output tokens for 5 chunks of text"
    assert detail.result.output_tokens == 5


def test_a_server_count_above_its_chunks_is_believed_multi_token_chunks_are_real():
    chunks = [GOOD_CHUNK] * 3 + ['{"choices": [], "usage": {"completion_tokens": 9}}']
    with Replay(_sse(*chunks)) as srv:
        detail = measure_sample_detail(srv.base_url, spec())
    (r,) = detail.requests
    assert r.output_tokens == 9 and r.usage_mismatch is None


def test_a_server_that_says_try_again_is_asked_again_within_the_sample_and_counted():
    """503 (and 429, and llama.cpp's "slot unavailable") is the server declining to start:
    the request is sent again, up to MAX_RETRIES times, and each retry is counted."""
    from bisect_harness.measure.request import MAX_RETRIES

    with Replay("vllm_completions.sse", status_for=lambda n: 503 if n % 2 else 200) as srv:
        detail = measure_sample_detail(srv.base_url, spec(requests_per_sample=6, concurrency=1))
    r = detail.result
    assert (r.requests, r.errors, r.output_tokens) == (6, 0, 48)
    assert sum(q.retries for q in detail.requests) == srv.count - 6 > 0
    assert all(q.retry_reason.startswith("HTTP 503") for q in detail.requests if q.retries)
    with Replay("vllm_completions.sse", status_for=lambda n: 503) as srv:
        with pytest.raises(SampleFailed, match="HTTP 503"):
            measure_sample(srv.base_url, spec(requests_per_sample=2))
    assert srv.count == 2 * (1 + MAX_RETRIES)


@pytest.mark.parametrize("api, fixture, path, asks", [
    ("chat", "openai_chat.sse", "/v1/chat/completions", {"messages": [{"role": "user"}], "max_tokens": 16}),
    ("llamacpp", "llamacpp_completion.sse", "/completion", {"n_predict": 16, "stream": True}),
    ("tgi", "tgi_generate_stream.sse", "/generate_stream", {"parameters": {"max_new_tokens": 16, "details": True}}),
])
def test_each_streaming_api_builds_its_request_and_reads_its_stream(api, fixture, path, asks):
    with Replay(fixture, delay=0.005) as srv:
        detail = measure_sample_detail(srv.base_url, spec(api=api, requests_per_sample=2))
    assert srv.paths == [path, path]
    sent = srv.payloads[0]
    for key, value in asks.items():
        if isinstance(value, dict):
            assert value.items() <= sent[key].items(), sent
        elif isinstance(value, list):
            assert value[0].items() <= sent[key][0].items() and sent[key][0]["content"], sent
        else:
            assert sent[key] == value, sent
    r = detail.result
    assert (r.requests, r.errors, r.output_tokens) == (2, 0, 16)
    for req in detail.requests:
        assert req.ok and req.chunks == 8 and req.counted_tokens == 8 and req.output_tokens == 8
        assert req.itl_s is not None and req.usage_mismatch is None
    if api == "llamacpp":  # the server's own timings, for `from: response` sources
        assert detail.responses[0]["timings"]["predicted_per_second"] == 193.7
        assert detail.responses[0]["completion_tokens"] == 8


def test_llamacpp_slot_unavailable_is_sent_again():
    """The 2023 llama-server answered a request it had no free slot for with a 200 and
    no stream: "slot unavailable". That is "try again", not a failed request."""
    busy = [b'{"content":"slot unavailable"}']
    good = fixture_events("llamacpp_completion.sse")
    calls = []

    with Replay(good) as srv:
        original = srv.events

        def status_for(n):
            calls.append(n)
            srv.events = busy if n % 3 == 0 else original
            return 200
        srv.status_for = status_for
        detail = measure_sample_detail(srv.base_url, spec(api="llamacpp", requests_per_sample=3))
    assert detail.result.errors == 0 and detail.result.requests == 3
    assert sum(q.retries for q in detail.requests) >= 1
    assert "slot unavailable" in next(q.retry_reason for q in detail.requests if q.retries)


def test_a_server_without_a_tokenizer_gets_prompts_in_words_and_says_so():
    import httpx

    from bisect_harness.measure.prompt_size import size_prompts

    with Replay("vllm_completions.sse") as srv, httpx.Client() as http:
        size = size_prompts(http, srv.base_url, spec(prompt_tokens=24))
    assert (size.unit, size.words, size.tokens) == ("words", 24, None)
    assert "count is in words" in size.describe()


def test_a_tokenizer_probe_leaves_no_unread_body_for_the_next_request():
    """A keep-alive server that answers an unknown route without reading the request's
    body (the demo engine, many http.server handlers) once had the probe's JSON read as
    the start of the boot's first benchmark request: HTTP 400, every boot failed."""
    import http.server
    import json as _json
    import threading

    import httpx

    from bisect_harness.measure.prompt_size import size_prompts

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            if self.path != "/echo":  # unread body left on the connection
                body = b'{"error": "no route"}'
                self.send_response(404)
            else:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = _json.dumps(_json.loads(raw)).encode()
                self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with httpx.Client(limits=httpx.Limits(max_connections=1)) as http:
            size = size_prompts(http, base, spec(prompt_tokens=24))
            r = http.post(base + "/echo", json={"prompt": "x"})
    finally:
        server.shutdown()
        server.server_close()
    assert size.unit == "words"
    assert r.status_code == 200 and r.json() == {"prompt": "x"}


def test_a_request_on_a_connection_the_server_closed_unanswered_is_sent_again():
    """A keep-alive server that drops a connection as the next request arrives (an idle
    timeout, a cap on requests per connection) never took that request: it is sent again
    on a fresh connection and counted as a retry, not failed. (In CI, under load, a
    sample of a real llama-server lost its second request, the first having streamed
    all its tokens: the failure this race makes.)"""
    events = _sse('{"choices": [{"index": 0, "text": "a"}]}', '{"choices": [{"index": 0, "text": "b"}]}')
    body = b"".join(events)
    served = []

    def serve(conn: socket.socket) -> None:
        with conn:
            for n in range(2):
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(rest) < length:
                    rest += conn.recv(65536)
                if n == 1:  # the second request on this connection: dropped unanswered
                    return
                served.append(json.loads(rest))
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept_loop():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    try:
        detail = measure_sample_detail(f"http://127.0.0.1:{listener.getsockname()[1]}",
                                       spec(requests_per_sample=3, output_tokens=2))
    finally:
        stop.set()
        listener.close()
    assert detail.result.errors == 0 and detail.result.requests == 3, [r.error for r in detail.requests]
    assert len(served) == 3
    retried = [r for r in detail.requests if r.retries]
    assert len(retried) == 2 and all("before any response" in r.retry_reason for r in retried), retried


def test_the_harness_clients_share_one_tls_context_and_ignore_the_environment(monkeypatch):
    # httpx builds a TLS context, loading the whole CA bundle, for every new client;
    # a boot opens about eight: the harness's clients build one per process.
    import ssl

    from bisect_harness.measure import deadline

    built = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: built.append(1) or real(*a, **k))
    deadline._tls_context.cache_clear()
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # a proxy in the shell must not be used
    with Replay("sglang_generate_spec.sse") as srv:
        for _ in range(3):
            with deadline.deadline_client() as client:
                assert client.get(srv.base_url + "/v1/models").status_code == 200
        assert srv.gets == 3  # reached directly, not through the proxy
    assert len(built) == 1
