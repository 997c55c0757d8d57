"""The profiled sample (``boot.profilers``): each kind asks its engine the way the engine's
source says, and every way a profile goes wrong ends as a recorded state, never a crash.

The engine here is a real HTTP server on loopback whose two profiling routes do what each
test says (write a real trace, answer 404, write nothing); the sample runner is the one
stand-in, at the seam where ``run_boot`` hands its runner over. The trace written is a
real one: vLLM 0.32 on CPU (``fixtures/traces``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from bisect_harness.engines import profilers
from bisect_harness.errors import HarnessError, NotObserved
from bisect_harness.engines.benchtools import Endpoint
from bisect_harness.measure.client import SampleDetail, SampleFailed
from bisect_harness.engines.presets import PRESETS, get_preset
from bisect_harness.boot import SampleOutcome
from bisect_harness.model import BenchmarkSpec, Limits

TRACE = Path(__file__).parent / "fixtures" / "traces" / "vllm-0.32-cpu-16tok.pt.trace.json.gz"
MiB = 1 << 20


class Engine:
    """A real server on 127.0.0.1 with ``/start_profile`` and ``/stop_profile``; ``on_start``
    and ``on_stop`` get the parsed body and return (status, body bytes)."""

    def __init__(self, on_start, on_stop):
        self.calls: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else {}
                outer.calls.append((self.path, body))
                route = {"/start_profile": on_start, "/stop_profile": on_stop}.get(self.path)
                code, answer = route(body) if route else (404, b"no route")
                self.send_response(code)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = Endpoint(f"http://127.0.0.1:{self.httpd.server_address[1]}")
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def engine(on_start, on_stop):
    e = Engine(on_start, on_stop)
    try:
        yield e
    finally:
        e.close()


class Runner:
    """The boot's sample runner at its seam: a session, then ``sample(i)``."""

    def __init__(self, tokens=64, fail=None):
        self.tokens, self.fail, self.asked, self.open = tokens, fail, [], False

    @contextlib.contextmanager
    def session(self):
        self.open = True
        try:
            yield self
        finally:
            self.open = False

    def sample(self, index):
        assert self.open, "the profiled sample runs inside the runner's session"
        self.asked.append(index)
        if self.fail:
            raise self.fail
        return SampleDetail(result=SampleOutcome(metrics={"tok_s": 100.0}, requests=4, output_tokens=self.tokens,
                                                 duration_s=0.5), requests=())


def request(preset="sglang", cap=50 * MiB, samples=3):
    return SimpleNamespace(boot_id=7, preset=preset, samples=samples,
                           benchmark=BenchmarkSpec(limits=Limits(profile_trace_bytes=cap)))


def test_every_preset_names_a_registered_profiler_and_the_stand_in_answers_plainly():
    assert set(profilers.PROFILERS) == {"none", "sglang", "vllm", "demo"}
    assert {n: p.profiler for n, p in PRESETS.items() if n in ("sglang", "vllm", "demo", "llamacpp", "openai")} == {
        "sglang": "sglang", "vllm": "vllm", "demo": "demo", "llamacpp": "none", "openai": "none"}
    with pytest.raises(ValueError, match="unknown profiler kind 'nsight'"):
        profilers.get_profiler("nsight")
    with pytest.raises(ValueError, match="profiler must be one of"):
        type(get_preset("openai"))(name="x", profiler="nsight")


def test_an_sglang_profile_is_taken_summed_per_token_and_kept_beside_the_log(tmp_path):
    log = tmp_path / "logs" / "boot-7.log"
    log.parent.mkdir()
    started = {}

    def start(body):
        started.update(body)
        return 200, b"Start profiling.\n"

    def stop(body):
        out = Path(started["output_dir"])
        shutil.copyfile(TRACE, out / f"{started['profile_id']}-TP-0.trace.json.gz")
        shutil.copyfile(TRACE, out / f"{started['profile_id']}-TP-1.trace.json.gz")  # rank 1: not read
        return 200, b"Stop profiling. This will take some time.\n"

    runner = Runner(tokens=16)
    with engine(start, stop) as e:
        rec = profilers.capture(request(), profilers.get_profiler("sglang"), runner, e.endpoint, log)
    assert rec["state"] == "taken", rec
    assert rec["why"] == "" and rec["profiler"] == "sglang"
    # SGLang's ProfileReq fields (io_struct.py, 0.5.23); the folder beside the log, absolute
    assert started == {"output_dir": str((tmp_path / "logs" / "boot-7.profile").absolute()), "profile_id": "boot-7",
                       "activities": ["CPU", "GPU"], "with_stack": False, "record_shapes": False}
    assert [path for path, _ in e.calls] == ["/start_profile", "/stop_profile"]
    assert runner.asked == [3], "one sample, numbered after the boot's three measured ones"
    assert rec["tokens"] == 16 and rec["requests"] == 4 and rec["seconds"] == 0.5 and rec["steps"] is None
    kept = tmp_path / "logs" / "boot-7.trace.json.gz"
    assert rec["trace"] == str(kept.resolve()) and rec["kept"] and kept.read_bytes() == TRACE.read_bytes()
    assert rec["trace_bytes"] == TRACE.stat().st_size
    summary = rec["summary"]
    assert summary["tokens"] == 16 and summary["ops"] and summary["op_ms"] > 0
    assert not (tmp_path / "logs" / "boot-7.profile").exists(), "the engine's folder is gone; the trace kept"
    assert json.loads(json.dumps(rec)) == rec  # the ledger stores it as JSON


def test_a_trace_over_the_cap_is_still_summed_and_then_removed(tmp_path):
    log = tmp_path / "boot-7.log"

    def stop(body):
        out = Path(e.calls[0][1]["output_dir"])
        shutil.copyfile(TRACE, out / "boot-7-TP-0.trace.json.gz")
        return 200, b""

    with engine(lambda body: (200, b""), stop) as e:
        rec = profilers.capture(request(cap=64 << 10), profilers.get_profiler("sglang"), Runner(), e.endpoint, log)
    assert rec["state"] == "taken" and rec["summary"]["ops"], rec
    assert not rec["kept"] and rec["trace"] is None and rec["trace_bytes"] == TRACE.stat().st_size
    assert "over limits.profile_trace_bytes" in rec["kept_note"]
    assert list(tmp_path.iterdir()) == [], "neither the trace nor the engine's folder is left"


def test_no_endpoint_is_no_profiler_and_the_sample_is_not_taken(tmp_path):
    runner = Runner()
    with engine(lambda body: (404, b'{"detail":"Not Found"}'), lambda body: (404, b"")) as e:
        rec = profilers.capture(request("vllm"), profilers.get_profiler("vllm"), runner, e.endpoint,
                                tmp_path / "boot-7.log")
        assert [p for p, _ in e.calls] == ["/start_profile"]
        assert e.calls[0][1] == {"profile_prefix": "boot-7"}  # vLLM 0.32 StartProfileRequest
    assert rec["state"] == "no_profiler" and runner.asked == []
    assert "no profiler endpoint: POST /start_profile answered HTTP 404" in rec["why"]
    assert "launched with --profiler-config" in rec["why"] and "engine preset vllm" in rec["why"]

    rec = profilers.capture(request("llamacpp"), profilers.get_profiler("none"), runner, Endpoint("http://127.0.0.1:9"),
                            tmp_path / "boot-8.log")
    assert rec["state"] == "no_profiler" and rec["why"] == "no profiler endpoint (engine preset llamacpp)"
    assert runner.asked == [] and rec["summary"] is None and rec["trace"] is None


def test_a_profile_not_taken_is_a_harness_error_that_says_nothing_was_observed():
    for cls in (profilers.NoProfilerEndpoint, profilers.ProfileFailed):
        assert issubclass(cls, NotObserved) and issubclass(cls, HarnessError)
    with pytest.raises(NotObserved, match="no profiler endpoint"):
        profilers.get_profiler("none").start(None, Path("."), "boot-1")


def test_a_sample_that_fails_under_the_profiler_still_stops_it_and_is_a_failed_profile(tmp_path):
    runner = Runner(fail=SampleFailed("every request of the sample failed: HTTP 500"))
    with engine(lambda body: (200, b""), lambda body: (200, b"")) as e:
        rec = profilers.capture(request(), profilers.get_profiler("sglang"), runner, e.endpoint,
                                tmp_path / "boot-7.log")
        assert [p for p, _ in e.calls] == ["/start_profile", "/stop_profile"]
    assert rec["state"] == "failed" and rec["summary"] is None
    assert rec["why"] == "the profiled sample failed: SampleFailed: every request of the sample failed: HTTP 500"


def test_a_trace_that_never_appears_or_cannot_be_read_is_a_failed_profile_with_why(tmp_path, monkeypatch):
    monkeypatch.setattr(profilers, "TRACE_WAIT_S", 1.0)
    with engine(lambda body: (200, b""), lambda body: (200, b"")) as e:
        rec = profilers.capture(request(), profilers.get_profiler("sglang"), Runner(), e.endpoint,
                                tmp_path / "boot-7.log")
    assert rec["state"] == "failed"
    assert rec["why"].startswith("no trace matching boot-7-TP-0*.trace.json.gz appeared in "), rec["why"]
    assert "within 1 s after the stop (the folder holds: nothing)" in rec["why"]

    def stop(body):
        (Path(e.calls[0][1]["output_dir"]) / "boot-7-TP-0.trace.json.gz").write_bytes(b"not a trace")
        return 200, b""

    with engine(lambda body: (200, b""), stop) as e:
        rec = profilers.capture(request(), profilers.get_profiler("sglang"), Runner(), e.endpoint,
                                tmp_path / "boot-7.log")
    assert rec["state"] == "failed" and rec["why"].startswith("the trace could not be read: "), rec
    assert rec["trace_bytes"] == len(b"not a trace") and rec["summary"] is None


def test_an_engine_error_at_the_start_is_a_failed_profile_naming_the_answer(tmp_path):
    with engine(lambda body: (500, b"RuntimeError: Profiling is already in progress"), lambda body: (200, b"")) as e:
        rec = profilers.capture(request(), profilers.get_profiler("sglang"), Runner(), e.endpoint,
                                tmp_path / "boot-7.log")
    assert rec["state"] == "failed"
    assert rec["why"] == "POST /start_profile answered HTTP 500: RuntimeError: Profiling is already in progress"


def test_the_demo_stop_answer_gives_the_steps_and_an_absurd_one_gives_none():
    demo = profilers.get_profiler("demo")
    assert demo.read_stop(b'{"trace": "x", "steps": {"decode": 46, "verify": 0}}').steps == 46
    assert demo.read_stop(b'{"steps": {"decode": -1, "verify": 3}}').steps is None
    assert demo.read_stop(b'{"steps": {"decode": true, "verify": 3}}').steps is None
    assert demo.read_stop(b"Stop profiling.").steps is None


def test_vllm_is_profiled_through_a_launch_setting_on_that_boot_alone(tmp_path):
    vllm = profilers.get_profiler("vllm")
    flag, value = vllm.launch_args(Path("rel") / "boot-3.profile")
    config = json.loads(value)
    # vllm/config/profiler.py (0.32): torch_profiler_dir must be absolute; the frontend's own profiler off
    assert flag == "--profiler-config" and Path(config["torch_profiler_dir"]).is_absolute()
    assert config["profiler"] == "torch" and config["ignore_frontend"] is True
    assert config["torch_profiler_with_stack"] is False
    # rank 0's worker file from tensorboard_trace_handler, not the frontend's or rank 1's
    pattern = vllm.trace_pattern("boot-3")
    names = ["boot-3_rank0.1796406835848549700.pt.trace.json.gz",
             "boot-3_dp0_pp0_tp0_dcp0_ep0_rank0.17964.pt.trace.json.gz",
             "boot-3_dp0_pp0_tp1_dcp0_ep0_rank1.17964.pt.trace.json.gz",
             "boot-3_rank0.profiler_out.txt"]
    for name in names:
        (tmp_path / name).write_text("x")
    assert sorted(p.name for p in tmp_path.glob(pattern)) == sorted(names[:2])
    assert profilers.get_profiler("sglang").launch_args(tmp_path) == ()
