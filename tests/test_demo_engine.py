"""The demo engine: its generated history, its build step and its real server.

Every server here is a real process tree on 127.0.0.1, started in its own
process group and killed (group-wide) when the test ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bisect_harness.demo import DemoHistory, create_demo_repo, ensure_demo_repo, read_demo_history
from bisect_harness.engines.presets import get_preset

pytestmark = pytest.mark.slow

DEMO_LAUNCH = get_preset("demo")  # the harness builds and boots the demo exactly so
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
              "NVSHMEM_DISABLE_NVLS": "1"}
BOOT_TIMEOUT_S = 90.0


# -- helpers -----------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worktree(hist: DemoHistory, sha: str, root: Path, build: bool = True) -> Path:
    path = root / f"wt-{sha[:10]}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=hist.path,
                       check=True, capture_output=True)
    if build:
        proc = run_build(path)
        assert proc.returncode == 0, proc.stderr
    return path


def run_build(path: Path) -> subprocess.CompletedProcess:
    argv = [a.format(python=sys.executable) for a in DEMO_LAUNCH.build]
    return subprocess.run(argv, cwd=path, capture_output=True, text=True, timeout=60)


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


class Server:
    def __init__(self, proc: subprocess.Popen, base: str, log: Path):
        self.proc, self.base, self.log = proc, base, log
        self.client = httpx.Client(base_url=base, timeout=60)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def workers(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)


@contextlib.contextmanager
def boot(path: Path, *flags: str, env: dict[str, str] | None = None):
    port = free_port()
    argv = [a.format(python=sys.executable, host="127.0.0.1", port=port) for a in DEMO_LAUNCH.launch]
    log = path / f"server-{port}.log"
    full_env = {**os.environ, **(env or {})}
    with open(log, "wb") as fh:
        proc = subprocess.Popen([*argv, *flags], cwd=path, env=full_env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"server exited early:\n{server.log_text()}"
            assert time.monotonic() < deadline, f"server not ready:\n{server.log_text()}"
            with contextlib.suppress(httpx.TransportError):
                if server.client.get(DEMO_LAUNCH.health_path).status_code == 200:
                    break
            time.sleep(0.2)
        yield server
    finally:
        server.client.close()
        kill_group(proc)


def sse_events(response: httpx.Response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if not gone(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


# -- fixtures ----------------------------------------------------------------

@pytest.fixture(scope="module")
def hist(tmp_path_factory) -> DemoHistory:
    return create_demo_repo(tmp_path_factory.mktemp("demo") / "engine")


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trees")


@pytest.fixture(scope="module")
def head_server(hist, trees):
    path = worktree(hist, hist.head, trees)
    env = {"DEMO_COMM_TUNING": "1", **SAFETY_ENV}
    with boot(path, "--cuda-graph", "--attention-mode", "decode", "--device", "cpu", env=env) as server:
        yield server


# -- history and build -------------------------------------------------------

def test_history_has_events_in_the_promised_order(hist):
    assert len(hist.shas) >= 30
    assert len(set(hist.shas)) == len(hist.shas)
    reg, bad, scrub = (hist.index(hist.events[k]) for k in ("regression", "build_failure", "env_scrub"))
    assert 0 < reg < scrub, "the regression comes before the environment scrub"
    assert abs(bad - reg) >= 2, "the build failure is near the regression but not adjacent"
    assert 0 < reg < len(hist.shas) - 1 and 0 < bad < len(hist.shas) - 1
    log = subprocess.run(["git", "rev-list", "--reverse", "HEAD"], cwd=hist.path, check=True,
                         capture_output=True, text=True).stdout.split()
    assert tuple(log) == hist.shas
    for word in ("regression", "slow", "break", "scrub"):
        assert not any(word in m.lower() for m in hist.messages)
    assert read_demo_history(hist.path) == hist


def test_history_is_deterministic(hist, tmp_path):
    again = create_demo_repo(tmp_path / "again")
    assert again.shas == hist.shas
    assert again.events == hist.events


def test_ensure_demo_repo_is_cached_and_idempotent(tmp_path):
    first = ensure_demo_repo(tmp_path / "cache")
    mtime = (first / ".git").stat().st_mtime_ns
    second = ensure_demo_repo(tmp_path / "cache")
    assert first == second
    assert (first / ".git").stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]
    assert len(read_demo_history(first).shas) >= 30


def test_ensure_demo_repo_survives_a_race(tmp_path):
    code = ("import sys; from pathlib import Path; from bisect_harness.demo import ensure_demo_repo;"
            "print(ensure_demo_repo(Path(sys.argv[1])))")
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(cache)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1
    assert [p.name for p in cache.iterdir()] == [Path(outs[0][0].strip()).name]


def test_build_fails_only_at_the_build_failure_commit(hist, trees):
    i = hist.index(hist.events["build_failure"])
    results = {}
    for j in (i - 1, i, i + 1):
        path = worktree(hist, hist.shas[j], trees, build=False)
        results[j] = run_build(path)
    assert results[i - 1].returncode == 0
    assert results[i + 1].returncode == 0
    assert results[i].returncode != 0
    assert "Error" in results[i].stderr
    assert (trees / f"wt-{hist.shas[i + 1][:10]}" / "build" / "kernels.json").is_file()


def test_server_refuses_to_start_without_the_build(hist, trees, tmp_path):
    path = tmp_path / "unbuilt"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), hist.head], cwd=hist.path,
                   check=True, capture_output=True)
    proc = subprocess.run([sys.executable, "serve.py", "--port", str(free_port())], cwd=path,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "build.py" in proc.stderr


# -- the server at HEAD ------------------------------------------------------

def test_health_and_streaming_completion(head_server):
    assert head_server.client.get("/health").text.strip() == "ok"
    body = {"model": "demo", "prompt": "w1 w2 w3 w4", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with head_server.client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    timing = usage.pop("engine_timing")
    assert usage == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert timing["decode_tokens"] == 11
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if e.get("choices"))
    assert len(text.split()) == 12
    # Greedy decoding is deterministic, and the non-streaming answer agrees.
    plain = head_server.client.post("/v1/completions", json={**body, "stream": False}).json()
    assert plain["choices"][0]["text"] == text
    assert {k: v for k, v in plain["usage"].items() if k != "engine_timing"} == usage


def test_generate_streams_cumulative_text(head_server):
    body = {"text": "w5 w6 w7", "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                    "ignore_eos": True}, "stream": True}
    with head_server.client.stream("POST", "/generate", json=body) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    texts = [c["text"] for c in chunks]
    for before, after in zip(texts, texts[1:]):
        assert after.startswith(before)
    assert len(texts[-1].split()) == 8
    assert chunks[-1]["meta_info"]["completion_tokens"] == 8
    assert chunks[-1]["meta_info"]["prompt_tokens"] == 3
    assert "spec_verify_ct" not in chunks[-1]["meta_info"]


def test_sampling_with_temperature_is_seeded(head_server):
    body = {"prompt": "w9", "max_tokens": 10, "temperature": 1.0, "ignore_eos": True, "seed": 7}
    a = head_server.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    b = head_server.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    c = head_server.client.post("/v1/completions", json={**body, "seed": 8}).json()["choices"][0]["text"]
    assert a == b
    assert a != c


def test_too_long_request_is_a_400(head_server):
    r = head_server.client.post("/v1/completions", json={"prompt": "w1", "max_tokens": 100000})
    assert r.status_code == 400
    assert "context length" in r.json()["error"]["message"]


def test_too_long_streaming_request_is_a_400_not_a_stream(head_server):
    # The workers check a request before they accept it; only an accepted one opens a stream.
    body = {"prompt": "w1", "max_tokens": 100000, "stream": True}
    with head_server.client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 400
        assert "context length" in json.loads(r.read())["error"]["message"]
    gen = {"text": "w1", "sampling_params": {"max_new_tokens": 100000}, "stream": True}
    assert head_server.client.post("/generate", json=gen).status_code == 400


@pytest.mark.parametrize("route", ["/v1/completions", "/generate"])
def test_stream_headers_go_out_before_the_prefill_and_each_chunk_after_its_token(head_server, route):
    # A long prompt makes the prefill take many times what sending headers takes.
    prompt = " ".join(f"w{1 + i % 500}" for i in range(1200))
    if route == "/generate":
        body = {"text": prompt, "stream": True,
                "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    else:
        body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
    stamps, events = [], []
    sent = time.perf_counter()
    with head_server.client.stream("POST", route, json=body) as r:
        headers_in = time.perf_counter()
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
                events.append(json.loads(line[len("data: "):]))
    done = [e for e in events if "engine_timing" in (e.get("usage") or e.get("meta_info") or {})]
    timing = (done[0].get("usage") or done[0]["meta_info"])["engine_timing"]
    # One clock on both sides (the host's monotonic clock): the headers came before the
    # first token was ready, so the first token's chunk went out alone, like the others.
    assert sent < headers_in < timing["first_token_at"] < stamps[0]
    assert timing["first_token_at"] + timing["decode_s"] == pytest.approx(timing["last_token_at"])
    assert timing["last_token_at"] < stamps[5]  # the sixth token's chunk came after it was ready


def test_server_info_reports_effective_args(head_server):
    info = head_server.client.get("/server_info").json()
    assert info["tp"] == 1
    assert info["attention_mode"] == "decode"
    assert info["speculative_num_steps"] == 0
    assert info["device"] == "cpu"
    assert info["cuda_graph"] is False, "CUDA graphs were requested but cannot be in effect on a CPU"
    assert info["port"] == int(head_server.base.rsplit(":", 1)[1])
    assert isinstance(info["version"], str) and info["version"]


def test_metrics_parse_and_count(head_server):
    before = _counters(head_server)
    head_server.client.post("/v1/completions", json={"prompt": "w1 w2", "max_tokens": 5,
                                                     "temperature": 0, "ignore_eos": True})
    after = _counters(head_server)
    assert after["demo_requests"] - before["demo_requests"] == 1
    assert after["demo_generation_tokens"] - before["demo_generation_tokens"] == 5
    assert after["demo_prompt_tokens"] - before["demo_prompt_tokens"] == 2
    assert after["demo_decode_cycles"] - before["demo_decode_cycles"] == 4  # the first token is prefill
    assert after["demo_spec_verify"] == 0


def _by_mode(server) -> dict[str, dict[str, float]]:
    """``demo:cuda_graph_passes_total`` and ``demo:forward_seconds_total`` by mode."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(server.client.get("/metrics").text):
        if fam.name in ("demo:cuda_graph_passes", "demo:forward_seconds"):
            assert fam.type == "counter"
            out[fam.name] = {s.labels["mode"]: s.value for s in fam.samples if s.name.endswith("_total")}
    return out


def test_forward_passes_are_counted_per_mode_as_sglang_does(head_server):
    """SGLang's mode labels (``<phase>_cuda_graph`` | ``<phase>_none``): on a CPU no
    graph is captured, so every decode pass is ``decode_none``; each mode's seconds beside."""
    before = _by_mode(head_server)
    assert set(before["demo:cuda_graph_passes"]) == {"prefill_none", "decode_cuda_graph", "decode_none",
                                                     "draft_none", "verify_none"}
    head_server.client.post("/v1/completions", json={"prompt": "w1 w2", "max_tokens": 6, "temperature": 0,
                                                     "ignore_eos": True})
    after = _by_mode(head_server)
    moved = {m: after["demo:cuda_graph_passes"][m] - v for m, v in before["demo:cuda_graph_passes"].items()}
    assert moved == {"prefill_none": 1, "decode_cuda_graph": 0, "decode_none": 5, "draft_none": 0, "verify_none": 0}
    secs = {m: after["demo:forward_seconds"][m] - v for m, v in before["demo:forward_seconds"].items()}
    assert secs["decode_none"] > 0 and secs["prefill_none"] > 0 and secs["decode_cuda_graph"] == 0
    assert "cuda graph: False" in head_server.log_text()


def test_every_response_carries_the_engines_own_timing(head_server):
    before = _counters(head_server)
    body = {"model": "demo", "prompt": "w1 w2 w3", "max_tokens": 9, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    with head_server.client.stream("POST", "/v1/completions", json=body) as r:
        timing = sse_events(r)[-2]["usage"]["engine_timing"]
    after = _counters(head_server)
    assert (timing["decode_tokens"], timing["decode_cycles"]) == (8, 8)  # the first token comes from prefill
    assert timing["prefill_s"] > 0 and 0 < timing["decode_cycles_s"] <= timing["decode_s"]
    assert timing["server_s"] >= timing["prefill_s"] + timing["decode_s"]  # one clock, measured around both
    assert timing["decode_tok_s"] == pytest.approx(8 / timing["decode_s"])
    assert after["demo_request_decode_tokens"] - before["demo_request_decode_tokens"] == 8
    assert after["demo_request_decode_seconds"] - before["demo_request_decode_seconds"] == pytest.approx(
        timing["decode_s"])
    assert after["demo_request_prefill_seconds"] - before["demo_request_prefill_seconds"] == pytest.approx(
        timing["prefill_s"])
    gen = {"text": "w5 w6", "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
           "stream": True}
    with head_server.client.stream("POST", "/generate", json=gen) as r:
        chunks = sse_events(r)[:-1]
    assert chunks[-1]["meta_info"]["engine_timing"]["decode_tokens"] == 4
    assert all("engine_timing" not in c["meta_info"] for c in chunks[:-1])


def _counters(server) -> dict[str, float]:
    text = server.client.get("/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if fam.type == "counter" and s.name.endswith("_total"):
                out[fam.name] = s.value
            if fam.type == "histogram" and s.name.endswith("_count"):
                out[fam.name + "_count"] = s.value
    assert out["demo_decode_cycle_seconds_count"] == out["demo_decode_cycles"]
    return out


def test_decode_cycle_lines_are_logged(head_server):
    head_server.client.post("/generate", json={"text": "w1", "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
    import re
    times = re.findall(r"decode cycle: ([0-9.]+) ms/cyc", head_server.log_text())
    assert len(times) >= 3
    assert all(float(t) > 0 for t in times)


def test_env_scrubbed_at_head_but_safety_vars_reach_workers(head_server):
    workers = head_server.workers()
    assert len(workers) == 1
    env = workers[0].environ()
    assert "DEMO_COMM_TUNING" not in env
    for key, value in SAFETY_ENV.items():
        assert env.get(key) == value


def test_env_reaches_workers_before_the_scrub(hist, trees):
    sha = hist.shas[hist.index(hist.events["env_scrub"]) - 1]
    path = worktree(hist, sha, trees)
    env = {"DEMO_COMM_TUNING": "1", **SAFETY_ENV}
    with boot(path, "--device", "cpu", env=env) as server:
        workers = server.workers()
        assert len(workers) == 1
        seen = workers[0].environ()
        assert seen.get("DEMO_COMM_TUNING") == "1"
        for key, value in SAFETY_ENV.items():
            assert seen.get(key) == value


# -- tensor parallelism, speculation, process ownership ----------------------

def test_tp2_with_speculation_matches_plain_greedy(hist, trees, head_server):
    body = {"text": "w11 w12 w13 w14", "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                           "ignore_eos": True}}
    plain = head_server.client.post("/generate", json=body).json()
    path = worktree(hist, hist.head, trees)
    with boot(path, "--tp", "2", "--speculative-num-steps", "2", "--device", "cpu") as server:
        assert len(server.workers()) == 2
        info = server.client.get("/server_info").json()
        assert info["tp"] == 2 and info["speculative_num_steps"] == 2
        spec = server.client.post("/generate", json=body).json()
        assert spec["text"] == plain["text"]
        assert spec["meta_info"]["completion_tokens"] == 24
        verify_ct = spec["meta_info"]["spec_verify_ct"]
        assert 0 < verify_ct <= 23
        metrics = {f.name: f.samples[0].value for f in text_string_to_metric_families(
            server.client.get("/metrics").text) if f.type == "counter"}
        assert metrics["demo_spec_verify"] == verify_ct
        # Each verify yields its accepted draft tokens plus one from the target.
        assert metrics["demo_spec_accepted_tokens"] + verify_ct >= 23
        assert "Target verify:" in server.log_text()
        assert "accept_len=" in server.log_text()
        # each verify cycle: its drafts and one verify pass, all eager; no plain decode pass
        passes = _by_mode(server)["demo:cuda_graph_passes"]
        assert passes["verify_none"] == verify_ct and passes["draft_none"] == 2 * verify_ct
        assert passes["decode_none"] == passes["decode_cuda_graph"] == 0


def test_killing_the_process_group_leaves_no_workers(hist, trees):
    path = worktree(hist, hist.head, trees)
    with boot(path, "--tp", "2", "--device", "cpu") as server:
        pids = [p.pid for p in server.workers()]
        assert len(pids) == 2
        kill_group(server.proc)
        assert wait_gone(pids) == []


def test_workers_die_with_the_server_process_alone(hist, trees):
    path = worktree(hist, hist.head, trees)
    with boot(path, "--device", "cpu") as server:
        pids = [p.pid for p in server.workers()]
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        assert wait_gone(pids) == []


def test_server_exits_when_a_worker_cannot_start(hist, trees):
    import torch
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    path = worktree(hist, hist.head, trees)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "serve.py", "--port", str(port), "--device", "cuda"],
                            cwd=path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            kill_group(proc)
    assert proc.returncode != 0
    assert "CUDA is not available" in out
