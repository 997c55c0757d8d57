"""Every deadline is a total: a server that sends its answer one byte at a time (status
line and headers too; ``slow_http``) cannot keep a read past its deadline.

httpx's timeout bounds each network read and restarts with every byte: before the
total deadlines, a health endpoint sending 100 bytes a second apart kept a boot
waiting 99 s against ``ready_timeout_s: 15`` and the boot was recorded ok. Here the
bytes come 0.05 s apart and the deadlines are well under a second, so each test ends
in a few seconds either way."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from bisect_harness.engines.server import ServerProcess, free_port
from bisect_harness.errors import BootTimeout
from bisect_harness.measure.client import SampleFailed, measure_sample_detail
from bisect_harness.measure.deadline import deadline_client, stream_within, total_deadline
from bisect_harness.measure.sources import SourceCollector, parse_source
from bisect_harness.measure.values import read_server_info
from bisect_harness.model import BenchmarkSpec
from slow_http import SlowServer

SLOW = Path(__file__).with_name("slow_http.py")
GAP_S = 0.05      # between two bytes of every answer
DEADLINE_S = 0.5  # each read's total deadline
SLACK_S = 1.0     # a loaded machine's scheduling, never a second per-read timeout


def test_a_health_endpoint_sending_a_byte_at_a_time_does_not_outrun_ready_timeout(tmp_path):
    port = free_port()
    # GET /health: 200 with Content-Length: 100, a byte every 0.05 s: 9 s in all
    server = ServerProcess([sys.executable, str(SLOW), str(port), str(GAP_S), "100"], env=dict(os.environ),
                           cwd=tmp_path, log_path=tmp_path / "boot.log", base_url=f"http://127.0.0.1:{port}",
                           ready_timeout_s=1.5, health_request_timeout_s=5.0, record=False)
    t0 = time.monotonic()
    with pytest.raises(BootTimeout, match=r"not ready .* after 1.5 s \(last: ReadTimeout \(no whole answer"):
        server.start()
    took = time.monotonic() - t0
    assert took < 1.5 + SLACK_S + 1.0, f"readiness took {took:.1f} s against ready_timeout_s 1.5"  # + the launch
    assert server.ready_after_s is None


def test_a_benchmark_request_ends_at_request_timeout_however_slowly_the_stream_comes():
    chunk = {"choices": [{"index": 0, "text": " a", "finish_reason": None}]}
    body = (f"data: {json.dumps(chunk)}\n\n" * 4 + "data: [DONE]\n\n").encode()
    bench = BenchmarkSpec(api="completions", model="m", requests_per_sample=1, concurrency=1, warmup_requests=0,
                          output_tokens=4, prompt_tokens=4, request_timeout_s=DEADLINE_S)
    with SlowServer(body, interval=GAP_S, content_type="text/event-stream") as srv:
        t0 = time.monotonic()
        with pytest.raises(SampleFailed) as failed:
            measure_sample_detail(srv.url, bench)
        took = time.monotonic() - t0
    assert took < DEADLINE_S + SLACK_S, f"the request took {took:.1f} s against request_timeout_s {DEADLINE_S}"
    assert f"total deadline of {DEADLINE_S:g} s" in str(failed.value)
    assert srv.hits == 1  # a request out of time is not sent again


def test_server_info_is_read_within_its_deadline_however_slowly_it_comes():
    with SlowServer(json.dumps({"tp_size": 1, "model_path": "m" * 40}).encode(), interval=GAP_S) as srv:
        t0 = time.monotonic()
        info, why = read_server_info(None, srv.url, ["/server_info"], timeout_s=DEADLINE_S)
        took = time.monotonic() - t0
    assert took < DEADLINE_S + SLACK_S, f"server info took {took:.1f} s against its {DEADLINE_S} s"
    assert info is None and f"within its total deadline of {DEADLINE_S:g} s" in why, why


def test_a_metrics_scrape_ends_at_its_deadline_and_is_a_source_problem():
    source = parse_source({"name": "gen", "from": "prometheus", "metric": "gen_tokens_total", "kind": "delta",
                           "better": "higher"}, "engine.metrics[0]")
    with SlowServer(b"# TYPE gen_tokens_total counter\ngen_tokens_total 42\n", interval=GAP_S,
                    content_type="text/plain") as srv:
        col = SourceCollector([source], srv.url, None, timeout_s=DEADLINE_S)
        t0 = time.monotonic()
        col.begin_sample()  # the scrape before the window
        took = time.monotonic() - t0
        col.end_sample([], 1.0)
    assert took < DEADLINE_S + SLACK_S, f"the /metrics scrape took {took:.1f} s against its {DEADLINE_S} s"
    (problem,) = col.problems()
    assert "GET /metrics failed: ReadTimeout" in problem and "total deadline" in problem, problem


def test_deadlines_nest_and_a_fast_answer_is_untouched():
    with SlowServer(b'{"ok": true}', interval=0.0) as srv, deadline_client() as http:
        with stream_within(http, "GET", srv.url, 5.0) as resp:
            assert resp.read() == b'{"ok": true}'
        with total_deadline(0.2):  # the outer deadline is sooner than the read's own
            t0 = time.monotonic()
            with pytest.raises(Exception, match="deadline"):
                with SlowServer(b"x" * 100, interval=GAP_S) as slow:
                    with stream_within(http, "GET", slow.url, 5.0) as resp:
                        resp.read()
            assert time.monotonic() - t0 < 0.2 + SLACK_S


def test_a_client_that_keeps_no_deadline_is_refused():
    import httpx

    with httpx.Client() as plain, pytest.raises(TypeError, match="deadline_client"):
        with stream_within(plain, "GET", "http://127.0.0.1:9/", 1.0):
            pass
