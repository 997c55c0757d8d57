"""Capacity under an SLO: the bracketing search with a fake measure (a function from a rate
to a trial), then against a real server on loopback whose capacity is known, then
inside a real boot of the demo engine, whose provenance keeps the trials."""

from __future__ import annotations

import dataclasses
import json
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bisect_harness.measure.capacity import STOPS, Trial, search
from bisect_harness.measure.client import SampleFailed, measure_capacity, measure_sample_detail
from bisect_harness.measure.deadline import deadline_client
from bisect_harness.workload import Capacity, SloTerm
from test_client import Replay, spec


def _holds_up_to(limit: float, behind_from: float = math.inf):
    """A fake measure: the SLO holds at rates up to ``limit``; the client falls behind from
    ``behind_from``. Records the rates asked."""
    asked: list[float] = []

    def measure(rate: float) -> Trial:
        asked.append(rate)
        return Trial(rate, held=rate <= limit, behind=rate >= behind_from)

    measure.asked = asked
    return measure


@pytest.mark.parametrize("truth", [0.3, 1.0, 5.0, 37.0, 1000.0])
@pytest.mark.parametrize("start", [1.0, 10.0, 64.0])
def test_the_search_brackets_the_true_capacity_within_the_tolerance(truth, start):
    cap = Capacity(start_rps=start, tolerance=0.1, max_trials=30)
    found = search(cap, _holds_up_to(truth))
    assert found.stopped == "bracketed", found.reason
    lo, hi = found.bracket
    assert lo <= truth < hi and hi - lo <= 0.1 * lo
    assert found.capacity_rps == lo == max(t.rate_rps for t in found.trials if t.held)
    assert all(t.held == (t.rate_rps <= truth) for t in found.trials)


def test_the_search_doubles_then_bisects():
    measure = _holds_up_to(37.0)
    found = search(Capacity(start_rps=4.0, tolerance=0.1, max_trials=12), measure)
    assert measure.asked == [4.0, 8.0, 16.0, 32.0, 64.0, 48.0, 40.0, 36.0, 38.0]
    assert found.capacity_rps == 36.0 and found.bracket == (36.0, 38.0)
    assert "held at 36 req/s, not at 38" in found.reason


def test_the_search_halves_from_a_start_that_fails():
    measure = _holds_up_to(3.0)
    found = search(Capacity(start_rps=20.0, tolerance=0.5, max_trials=12), measure)
    assert measure.asked[:4] == [20.0, 10.0, 5.0, 2.5] and found.bracket[0] <= 3.0 < found.bracket[1]


def test_no_rate_that_held_is_a_capacity_of_zero_with_its_reason():
    measure = _holds_up_to(0.0)
    found = search(Capacity(start_rps=8.0, max_trials=4), measure)
    assert found.capacity_rps == 0.0 and found.stopped == "none_held" and found.bracket is None
    assert measure.asked == [8.0, 4.0, 2.0, 1.0]
    assert found.reason == f"{STOPS['none_held']} (1 req/s)"


def test_a_search_that_never_failed_says_its_capacity_is_a_lower_bound():
    found = search(Capacity(start_rps=1.0, max_trials=5), _holds_up_to(math.inf))
    assert found.capacity_rps == 16.0 and found.stopped == "never_failed" and "at least" in found.reason


def test_trials_run_out_inside_the_bracket():
    measure = _holds_up_to(37.0)
    found = search(Capacity(start_rps=4.0, tolerance=0.01, max_trials=7), measure)
    assert len(measure.asked) == 7 and found.stopped == "max_trials"
    assert found.bracket == (32.0, 40.0) and found.capacity_rps == 32.0


def test_a_client_that_fell_behind_stops_the_search_below_it():
    measure = _holds_up_to(100.0, behind_from=50.0)
    found = search(Capacity(start_rps=4.0, max_trials=12), measure)
    assert measure.asked == [4.0, 8.0, 16.0, 32.0, 64.0]
    assert found.stopped == "client_behind" and found.capacity_rps == 32.0
    assert json.loads(json.dumps(found.to_json()))["trials"][-1]["behind"] is True


@pytest.mark.parametrize("changes, key", [({"start_rps": 0.0}, "start_rps"), ({"tolerance": 0.0}, "tolerance"),
                                          ({"max_trials": 0}, "max_trials")])
def test_a_search_that_cannot_run_names_its_key(changes, key):
    with pytest.raises(ValueError, match=f"capacity.{key}"):
        search(dataclasses.replace(Capacity(), **changes), _holds_up_to(1.0))


# --------------------------------------------------------------------------- a real server


class OneAtATime:
    """A loopback server that answers ``/v1/completions`` one request at a time: each holds
    the server for ``service_s`` and then streams two tokens. Below 1 / ``service_s``
    requests a second evenly spaced requests never wait; above it each waits longer than
    the last, so its capacity under an end-to-end limit is known."""

    def __init__(self, service_s: float):
        self.service_s = service_s
        self.lock = threading.Lock()
        self.prompts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args):
                pass

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.prompts.append(payload["prompt"])
                    time.sleep(outer.service_s)
                events = [{"choices": [{"index": 0, "text": " a", "finish_reason": None}]},
                          {"choices": [{"index": 0, "text": " b", "finish_reason": "length"}]},
                          {"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10}}]
                body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # a burst of connections is queued, not refused

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_the_capacity_of_a_server_that_serves_one_request_at_a_time_is_its_service_rate():
    # 25 ms a request: 40 a second at most. Evenly spaced, 40 requests a trial: below 40/s none
    # waits (e2e ~25 ms); at a rate r above it request k waits k (25 ms - 1/r), so the p90's
    # 36th request is past 100 ms once r > 43.6/s. The capacity under e2e p90 <= 100 ms is
    # between the two, less the client's and the server's own time per request.
    bench = spec(output_tokens=2, arrival="constant", slo=(SloTerm("e2e_p90_ms", 100.0),),
                 capacity=Capacity(start_rps=10.0, tolerance=0.1, trial_requests=40, max_trials=8))
    with OneAtATime(0.025) as srv, deadline_client() as http:
        detail = measure_sample_detail(srv.base_url, bench, client=http)
    found = detail.capacity
    assert found is not None and found.stopped in ("bracketed", "max_trials"), found.reason
    assert 25.0 <= detail.result.metrics["capacity_rps"] == found.capacity_rps <= 44.0, found.to_json()
    for t in found.trials:  # every trial an open-loop sample of its own 40 requests, at its rate
        assert t.requests == 40 and t.achieved_rps == pytest.approx(t.rate_rps, rel=0.1)
        assert t.held == (t.percentiles["e2e_p90_ms"] <= 100.0)
    assert detail.result.requests == 40 * len(found.trials) == len(detail.requests)
    assert detail.result.metrics["client_behind"] == 0.0
    assert len(set(srv.prompts)) == len(srv.prompts) == len(detail.requests)  # each trial's requests its own


def test_a_capacity_search_whose_every_trial_failed_is_a_failed_sample():
    bench = spec(slo=(SloTerm("ttft_p50_ms", 100.0),),
                 capacity=Capacity(start_rps=50.0, trial_requests=3, max_trials=2))
    with Replay("vllm_completions.sse", status_for=lambda n: 500) as srv:
        with pytest.raises(SampleFailed, match="HTTP 500"):
            measure_capacity(srv.base_url, bench)
    with pytest.raises(ValueError, match="needs benchmark.capacity and benchmark.slo"):
        measure_capacity("http://127.0.0.1:9", spec(capacity=Capacity()))


@pytest.mark.slow
def test_a_boots_capacity_searches_and_their_trials_are_kept_in_its_provenance(tmp_path):
    from bisect_harness.backends.procedure import run_boot
    from test_open_loop import demo_boot_request

    req = demo_boot_request(tmp_path, output_tokens=4, slo=(SloTerm("ttft_p50_ms", 60_000.0),),
                            capacity=Capacity(start_rps=4.0, trial_requests=4, max_trials=2))
    out = run_boot(req)
    assert out.status == "ok", (out.failure, out.log_tail)
    searches = out.evidence.capacity["samples"]
    assert set(searches) == {"1", "2"}
    for s in out.samples:
        kept = searches[str(s.seq)]
        # a minute's TTFT holds at every rate tried: the capacity is a lower bound, and says so
        assert kept["stopped"] == "never_failed" and [t["rate_rps"] for t in kept["trials"]] == [4.0, 8.0]
        assert s.metrics["capacity_rps"] == kept["capacity_rps"] == 8.0 and s.requests == 8
        assert all(t["held"] and t["percentiles"]["ttft_p50_ms"] > 0 for t in kept["trials"])
