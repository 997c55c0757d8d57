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


def _usage(events: list[dict]) -> dict | None:
    """The usage the stream reports: on its own last chunk with no choices (the OpenAI
    format, transformers 5.25 and later), or on the chunk that finishes (earlier ones)."""
    found = [e["usage"] for e in events if e.get("usage")]
    return found[-1] if found else None


def test_streaming_completion_streams_every_token_and_counts_them(server):
    # asked as the harness's client asks (``measure/apis``): the usage comes with the stream
    body = {"model": server["model"], "prompt": "the model reads one token", "max_tokens": 12,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    arrivals = []
    with httpx.stream("POST", server["base"] + "/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for event in _sse_events(resp):
            arrivals.append((time.monotonic(), event))
    events = [e for _, e in arrivals]
    assert all(e["object"] == "text_completion" for e in events)
    choices = [e["choices"][0] for e in events if e["choices"]]
    texts = [c["text"] for c in choices if c["text"]]
    # The word-level vocabulary and suppressed specials make the model emit exactly
    # max_tokens words. A chunk may carry more than one token (transformers 5.25 sends
    # what its generation thread made since the last send): the client splits a chunk's
    # gap over its tokens, so what it relies on is the total, in the usage.
    assert len(" ".join(texts).split()) == 12
    assert 2 <= len(texts) <= 12
    assert choices[-1]["finish_reason"] == "length"
    usage = _usage(events)
    assert usage is not None, events[-2:]
    assert usage["completion_tokens"] == 12
    # Tokens are streamed, not delivered in one piece at the end.
    first_text = next(t for t, e in arrivals if e["choices"] and e["choices"][0]["text"])
    assert arrivals[-1][0] > first_text


def test_completion_is_deterministic_at_temperature_zero(server):
    body = {"model": server["model"], "prompt": "river stone cloud", "max_tokens": 6, "temperature": 0}
    first = httpx.post(server["base"] + "/v1/completions", json=body, timeout=60).json()
    second = httpx.post(server["base"] + "/v1/completions", json=body, timeout=60).json()
    assert first["choices"][0]["text"] == second["choices"][0]["text"]
    assert len(first["choices"][0]["text"].split()) == 6
    assert first["usage"]["completion_tokens"] == 6


def test_streaming_chat_completion_deltas(server):
    body = {"model": server["model"], "messages": [{"role": "user", "content": "one two three"}],
            "max_tokens": 5, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server["base"] + "/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        events = _sse_events(resp)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    choices = [e["choices"][0] for e in events if e["choices"]]
    contents = [c["delta"].get("content") for c in choices]
    assert len("".join(c for c in contents if c).split()) == 5  # a delta may hold more than one token
    assert choices[-1]["finish_reason"] == "length"
    assert _usage(events)["completion_tokens"] == 5
