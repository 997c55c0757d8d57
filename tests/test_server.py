"""ServerProcess against real processes: a small HTTP server that spawns children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import psutil
import pytest

from bisect_harness.errors import BootFailed, BootTimeout
from bisect_harness.engines.server import ServerProcess, free_port, live_servers
from bisect_harness.process.supervised import supervisors_of

REPO_ROOT = Path(__file__).resolve().parent.parent

# mode: "ok" serves 200 on /health; "exit" prints and exits 3; "never" answers 503.
# Spawns one child in its group and one "escaped" worker in a session of its own,
# and writes all pids to pids.json once they exist.
FAKE_SERVER = textwrap.dedent('''
    import http.server, json, os, subprocess, sys, time
    port, mode, pid_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    print("fake server starting on", port, "env FAKE_MARK =", os.environ.get("FAKE_MARK"), flush=True)
    sleeper = [sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"]
    child = subprocess.Popen(sleeper)
    escaped = subprocess.Popen(sleeper, start_new_session=True)
    with open(pid_file + ".tmp", "w") as f:
        json.dump({"leader": os.getpid(), "child": child.pid, "escaped": escaped.pid}, f)
    os.replace(pid_file + ".tmp", pid_file)
    if mode == "exit":
        time.sleep(0.5)  # a real engine crashes after loading for a while
        print("fatal: CUDA out of memory (pretend)", flush=True)
        sys.exit(3)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = 503 if mode == "never" else 200
            self.send_response(code)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    if mode == "slow":
        time.sleep(1.0)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return script


def make_server(tmp_path, script, mode, **kw):
    port = free_port()
    env = dict(os.environ, FAKE_MARK="marked")
    return ServerProcess([sys.executable, str(script), str(port), mode, str(tmp_path / "pids.json")],
                         env=env, cwd=tmp_path, log_path=tmp_path / "logs" / "boot.log",
                         base_url=f"http://127.0.0.1:{port}", **kw)


def read_pids(tmp_path, timeout=10.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    path = tmp_path / "pids.json"
    while not path.exists():
        assert time.monotonic() < deadline, "the fake server never wrote its pids"
        time.sleep(0.02)
    return json.loads(path.read_text())


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_all_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def test_free_port_is_bindable():
    import socket
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_normal_stop_leaves_no_process(tmp_path, fake):
    with make_server(tmp_path, fake, "ok", ready_timeout_s=30) as server:
        pids = read_pids(tmp_path)
        assert server.pid == pids["leader"] == server.pgid
        assert os.getpgid(pids["child"]) == server.pgid
        assert os.getpgid(pids["escaped"]) != server.pgid  # left the group
        assert httpx.get(server.base_url + "/health").status_code == 200
        assert server in live_servers()
        assert all(running(p) for p in pids.values())
    assert wait_all_gone(pids.values(), 0.5) == []
    assert server not in live_servers()
    server.stop()  # idempotent
    assert "FAKE_MARK = marked" in server.log_tail()


def test_exact_env_is_passed(tmp_path, fake):
    port = free_port()
    env = {"PATH": os.environ.get("PATH", ""), "FAKE_MARK": "only-this"}
    server = ServerProcess([sys.executable, str(fake), str(port), "ok", str(tmp_path / "pids.json")],
                           env=env, cwd=tmp_path, log_path=tmp_path / "boot.log",
                           base_url=f"http://127.0.0.1:{port}", ready_timeout_s=30)
    with server:
        proc_env = psutil.Process(server.pid).environ()
    # exactly the caller's env, plus the supervisor's tree token (how the next start finds
    # a process that escaped its supervisor's record: inherited through forks and sessions)
    from bisect_harness.process.proctree import TREE_ENV

    token = proc_env.pop(TREE_ENV)
    assert proc_env == env
    assert token.split("-")[0] == str(server.supervisor_pid)


def test_early_exit_raises_boot_failed_with_tail(tmp_path, fake):
    server = make_server(tmp_path, fake, "exit", ready_timeout_s=30, poll_interval_s=0.05)
    with pytest.raises(BootFailed) as info:
        server.start()
    assert not isinstance(info.value, BootTimeout)
    msg = str(info.value)
    assert "code 3" in msg
    assert "CUDA out of memory" in msg and "CUDA out of memory" in info.value.log_tail
    assert info.value.log_path == str(server.log_path)
    pids = read_pids(tmp_path)
    # the leader is gone, and so are the children it left behind
    assert wait_all_gone(pids.values(), 0.5) == []
    assert server not in live_servers()


def test_never_ready_raises_boot_timeout_within_deadline(tmp_path, fake):
    server = make_server(tmp_path, fake, "never", ready_timeout_s=2.0, poll_interval_s=0.1)
    t0 = time.monotonic()
    with pytest.raises(BootTimeout) as info:
        server.start()
    elapsed = time.monotonic() - t0
    assert 2.0 <= elapsed < 2.0 + 3.0, elapsed
    assert "not ready" in str(info.value) and "fake server starting" in info.value.log_tail
    pids = read_pids(tmp_path)
    assert wait_all_gone(pids.values(), 0.5) == []


def test_slow_start_waits_for_health(tmp_path, fake):
    with make_server(tmp_path, fake, "slow", ready_timeout_s=30, poll_interval_s=0.05) as server:
        assert server.ready_after_s >= 0.9
        pids = read_pids(tmp_path)
    assert wait_all_gone(pids.values(), 0.5) == []


def test_launch_failure_is_boot_failed(tmp_path):
    server = ServerProcess([str(tmp_path / "no-such-binary")], env={}, cwd=tmp_path,
                           log_path=tmp_path / "boot.log", base_url="http://127.0.0.1:9")
    with pytest.raises(BootFailed, match="could not launch"):
        server.start()


def test_sigterm_ignoring_server_is_killed_after_grace(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent('''
        import http.server, signal, sys
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
            def log_message(self, *a): pass
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    '''))
    port = free_port()
    server = ServerProcess([sys.executable, str(script), str(port)], env=dict(os.environ), cwd=tmp_path,
                           log_path=tmp_path / "boot.log", base_url=f"http://127.0.0.1:{port}")
    server.start()
    pid = server.pid
    t0 = time.monotonic()
    server.stop(grace_s=0.5)
    assert 0.5 <= time.monotonic() - t0 < 5
    assert not running(pid)


def test_exception_in_with_block_stops_server(tmp_path, fake):
    with pytest.raises(RuntimeError, match="boom"):
        with make_server(tmp_path, fake, "ok", ready_timeout_s=30):
            pids = read_pids(tmp_path)
            raise RuntimeError("boom")
    assert wait_all_gone(pids.values(), 0.5) == []


# A harness in a subprocess: boots the fake server, writes "ready", then waits.
HARNESS = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    from bisect_harness.engines.server import ServerProcess, free_port
    tmp, fake = Path(sys.argv[1]), sys.argv[2]
    port = free_port()
    try:
        with ServerProcess([sys.executable, fake, str(port), "ok", str(tmp / "pids.json")],
                           env=dict(os.environ), cwd=tmp, log_path=tmp / "boot.log",
                           base_url=f"http://127.0.0.1:{port}", ready_timeout_s=30):
            (tmp / "ready").write_text("1")
            while True:
                time.sleep(0.1)
    except KeyboardInterrupt:
        (tmp / "outcome").write_text("KeyboardInterrupt")
        raise
''')


def start_harness(tmp_path, fake):
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(fake)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        if proc.poll() is not None:
            pytest.fail("harness died: " + proc.stdout.read().decode())
        assert time.monotonic() < deadline, "harness never became ready"
        time.sleep(0.05)
    pids = read_pids(tmp_path)
    assert all(running(p) for p in pids.values())
    return proc, pids


def reaper_pids_of(harness_pid: int) -> list[int]:
    """The supervisors (one per server) the harness started."""
    return supervisors_of(harness_pid)


def test_sigkill_of_harness_kills_server_group(tmp_path, fake):
    proc, pids = start_harness(tmp_path, fake)
    reapers = reaper_pids_of(proc.pid)
    assert len(reapers) == 1
    proc.kill()
    proc.wait()
    assert wait_all_gone(list(pids.values()) + reapers, 8.0) == []


@pytest.mark.parametrize("sig, outcome", [(signal.SIGTERM, None), (signal.SIGINT, "KeyboardInterrupt")])
def test_signal_to_harness_stops_server(tmp_path, fake, sig, outcome):
    proc, pids = start_harness(tmp_path, fake)
    reapers = reaper_pids_of(proc.pid)
    proc.send_signal(sig)
    rc = proc.wait(timeout=20)
    assert rc != 0
    # stopped by the harness itself (not the watchdog): gone by the time it exits
    assert wait_all_gone(pids.values(), 0.3) == []
    assert wait_all_gone(reapers, 2.0) == []
    if outcome:
        assert (tmp_path / "outcome").read_text() == outcome
    else:
        assert rc == 143


# A server of llama.cpp's 2023 kind: no /health (404), POST /completion answers 503
# until its "model" is loaded, then a one-token generation. The request body is read
# only on the route it knows (as such handlers do).
NO_HEALTH_SERVER = textwrap.dedent('''
    import http.server, json, sys, time
    port, loaded_at = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *a): pass
        def _send(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            self._send(404, {"error": "no route"})
        def do_POST(self):
            if self.path != "/completion":
                return self._send(404, {"error": "no route"})
            asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if time.monotonic() < loaded_at:
                return self._send(503, {"error": "loading model"})
            print("generated", asked.get("n_predict"), "token(s)", flush=True)
            self._send(200, {"content": "x", "stop": True, "tokens_predicted": 1})
    http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def test_a_server_without_a_health_route_is_ready_by_its_apis_own_probe(tmp_path):
    from bisect_harness.measure.apis import get_api

    script = tmp_path / "old_server.py"
    script.write_text(NO_HEALTH_SERVER)
    port = free_port()
    server = ServerProcess([sys.executable, str(script), str(port), "1.0"], env={"PATH": os.environ["PATH"]},
                           cwd=tmp_path, log_path=tmp_path / "boot.log", base_url=f"http://127.0.0.1:{port}",
                           ready_timeout_s=30, poll_interval_s=0.05, ready_probe=get_api("llamacpp").ready_probe)
    with server:
        # not before the "model" loaded: a 503 from the probe is "not yet"
        assert server.ready_after_s >= 0.9
        assert server.ready_by == "POST /completion (one token), GET /health answering 404"
    assert "generated 1 token(s)" in server.log_tail()


def test_a_missing_health_route_without_a_probe_says_to_set_engine_health(tmp_path):
    script = tmp_path / "old_server.py"
    script.write_text(NO_HEALTH_SERVER)
    port = free_port()
    server = ServerProcess([sys.executable, str(script), str(port), "0"], env={"PATH": os.environ["PATH"]},
                           cwd=tmp_path, log_path=tmp_path / "boot.log", base_url=f"http://127.0.0.1:{port}",
                           ready_timeout_s=2, poll_interval_s=0.05)
    with pytest.raises(BootTimeout) as info:
        server.start()
    assert "GET /health answered 404" in str(info.value) and "engine.health" in str(info.value)
