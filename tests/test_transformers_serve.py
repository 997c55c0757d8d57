"""``transformers serve`` with a tiny local Llama: a real OpenAI-compatible server
on loopback, booted in seconds, used to check the streaming formats the
harness's client relies on (``/v1/completions`` and ``/v1/chat/completions``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tinyllama import build_tiny_llama

pytestmark = pytest.mark.slow

BOOT_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_argv(model_dir: Path, port: int) -> list[str]:
    exe = shutil.which("transformers")
    if exe is None:
        pytest.skip("the `transformers` command is not installed (pip install 'transformers[serving]')")
    return [exe, "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
            "--device", "cpu", "--log-level", "info"]


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure nothing else in the group survives.
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model_dir = build_tiny_llama(tmp_path_factory.mktemp("tinyllama") / "model")
    port = _free_port()
    log_path = model_dir.parent / "serve.log"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(_serve_argv(model_dir, port), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() - started > BOOT_TIMEOUT_S:
                pytest.fail(f"transformers serve not ready in {BOOT_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(base + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        boot_s = time.monotonic() - started
        print(f"transformers serve ready in {boot_s:.1f} s", file=sys.stderr)
        yield {"base": base, "model": str(model_dir), "proc": proc, "boot_s": boot_s}
    finally:
        _stop_group(proc)


def _sse_events(resp: httpx.Response) -> list[dict]:
    events = []
    for line in resp.iter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            break
        events.append(json.loads(payload))
    return events


def test_health_and_models(server):
    assert httpx.get(server["base"] + "/health").json() == {"status": "ok"}
    models = httpx.get(server["base"] + "/v1/models").json()
    assert server["model"] in [m["id"] for m in models["data"]]


def test_streaming_completion_yields_every_token(server):
    body = {"model": server["model"], "prompt": "the model reads one token", "max_tokens": 12,
            "temperature": 0, "stream": True}
    arrivals = []
    with httpx.stream("POST", server["base"] + "/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for event in _sse_events(resp):
            arrivals.append((time.monotonic(), event))
    events = [e for _, e in arrivals]
    texts = [e["choices"][0]["text"] for e in events if e["choices"][0]["text"]]
    # One chunk per token: the word-level vocabulary and suppressed specials make
    # the model emit exactly max_tokens words.
    assert len(texts) == 12
    assert all(e["object"] == "text_completion" for e in events)
    last = events[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 12
    # Tokens are streamed, not delivered in one piece at the end.
    assert arrivals[-1][0] > arrivals[0][0]


def test_completion_is_deterministic_at_temperature_zero(server):
    body = {"model": server["model"], "prompt": "river stone cloud", "max_tokens": 6, "temperature": 0}
    first = httpx.post(server["base"] + "/v1/completions", json=body, timeout=60).json()
    second = httpx.post(server["base"] + "/v1/completions", json=body, timeout=60).json()
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert len(first["choices"][0]["text"].split()) == 6
    assert first["usage"]["completion_tokens"] == 6


def test_streaming_chat_completion_deltas(server):
    body = {"model": server["model"], "messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", server["base"] + "/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        events = _sse_events(resp)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    contents = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
    assert len([c for c in contents if c]) == 5
    assert events[-1]["choices"][0]["finish_reason"] == "length"
