"""The demo engine batches the requests in flight: one forward pass per step for all
of them, measured with the harness's own client against a real server.

Evidence is the change of the engine's own figures over the window the client
measured (``demo_decode_batch_size``: the sequences of each decode step or verify
cycle), never a value read once: at concurrency 4 the steps run about four
sequences, at concurrency 1 one, and with ``--max-running-requests 1`` (the
engine serves one request at a time) one whatever the concurrency. Batching
changes how fast tokens come, never which: concurrent greedy requests get the
text each gets alone, with speculative decoding too.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bisect_harness.demo import create_demo_repo
from bisect_harness.measure.client import measure_sample, warmup
from bisect_harness.model import BenchmarkSpec
from test_demo_engine import boot, worktree

pytestmark = pytest.mark.slow

BENCH = BenchmarkSpec(model="demo", prompt_tokens=16, output_tokens=32, requests_per_sample=8, warmup_requests=1)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    hist = create_demo_repo(tmp_path_factory.mktemp("demo") / "engine")
    return worktree(hist, hist.head, tmp_path_factory.mktemp("trees"))


def _figures(server) -> dict[str, float]:
    """The counters and the batch histogram's sum and count, from ``/metrics``."""
    out = {}
    for fam in text_string_to_metric_families(server.client.get("/metrics").text):
        for s in fam.samples:
            if s.name.endswith(("_total", "_sum", "_count")) and not s.labels:
                out[s.name] = s.value
            elif s.name == "demo:cuda_graph_passes_total":
                out[f"passes:{s.labels['mode']}"] = s.value
    return out


@dataclasses.dataclass(frozen=True)
class Window:
    """One sample measured by the harness's client, and what the engine counted meanwhile."""

    tok_s: float
    mean_batch: float
    steps: float
    tokens: float
    decode_passes: float


def _measure(server, concurrency: int) -> Window:
    bench = dataclasses.replace(BENCH, concurrency=concurrency, requests_per_sample=max(8, 2 * concurrency),
                                warmup_requests=concurrency)
    warmup(server.base, bench)
    before = _figures(server)
    outcome = measure_sample(server.base, bench)
    after = _figures(server)
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    assert outcome.errors == 0
    return Window(tok_s=outcome.metrics["tok_s"],
                  mean_batch=moved["demo_decode_batch_size_sum"] / moved["demo_decode_batch_size_count"],
                  steps=moved["demo_decode_batch_size_count"], tokens=moved["demo_generation_tokens_total"],
                  decode_passes=moved["passes:decode_none"])


def test_four_requests_in_flight_decode_in_one_batch_and_serve_more_tokens(head):
    with boot(head, "--device", "cpu") as server:
        assert server.client.get("/server_info").json()["max_running_requests"] > 4
        one, four = _measure(server, 1), _measure(server, 4)
    assert one.mean_batch == 1.0
    # closed loop: a finished request's successor joins at the next step, after its prefill
    assert four.mean_batch > 2.5, four
    # one forward pass per step for the whole batch, not one per request
    assert four.decode_passes == four.steps < four.tokens / 2, four
    assert four.tok_s > 1.5 * one.tok_s, (one, four)


def test_one_running_request_at_a_time_serialises_them(head):
    """The control: the same engine told to run one request at a time never batches,
    and four clients get no more tokens a second than one."""
    with boot(head, "--device", "cpu", "--max-running-requests", "1") as server:
        assert server.client.get("/server_info").json()["max_running_requests"] == 1
        one, four = _measure(server, 1), _measure(server, 4)
    assert one.mean_batch == four.mean_batch == 1.0
    assert four.tok_s < 1.35 * one.tok_s, (one, four)


def _concurrently(server, bodies: list[dict]) -> list[str]:
    texts: list[str | None] = [None] * len(bodies)

    def send(i: int) -> None:
        texts[i] = server.client.post("/generate", json=bodies[i]).json()["text"]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return texts


def test_a_batch_gives_each_request_the_text_it_gets_alone_with_and_without_drafting(head):
    bodies = [{"text": " ".join(f"w{7 * i + j}" for j in range(1, 6 + i)),
               "sampling_params": {"max_new_tokens": 20 + 3 * i, "temperature": 0, "ignore_eos": True}}
              for i in range(4)]
    with boot(head, "--device", "cpu") as server:
        alone = [server.client.post("/generate", json=b).json()["text"] for b in bodies]
        before = _figures(server)
        assert _concurrently(server, bodies) == alone
        after = _figures(server)
        assert after["demo_decode_batch_size_sum"] - before["demo_decode_batch_size_sum"] > (
            after["demo_decode_batch_size_count"] - before["demo_decode_batch_size_count"])
    with boot(head, "--device", "cpu", "--speculative-num-steps", "2") as server:
        before = _figures(server)
        assert _concurrently(server, bodies) == alone
        after = _figures(server)
        cycles = after["demo_spec_verify_total"] - before["demo_spec_verify_total"]
        # each verify cycle runs every sequence's drafts in one pass: fewer cycles than the
        # requests' cycles together, and the batch histogram counts them
        assert after["passes:verify_none"] - before["passes:verify_none"] == cycles
        assert after["demo_decode_batch_size_count"] - before["demo_decode_batch_size_count"] == cycles
        assert after["demo_decode_batch_size_sum"] - before["demo_decode_batch_size_sum"] > cycles
