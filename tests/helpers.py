"""Small helpers for tests that drive the real ``harness`` command in a subprocess."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sqlite3
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterable, Mapping

import psutil
import yaml

HARNESS = [sys.executable, "-m", "bisect_harness.cli"]

#: The demo spec's benchmark: small, so a boot takes a few seconds on two CPU cores.
SMALL_BENCH = {"prompt_tokens": 16, "output_tokens": 32, "requests_per_sample": 2, "warmup_requests": 1}


def harness(*args: Any, cwd: Path | None = None, timeout: float = 300.0,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``harness ARGS`` to completion; stdout and stderr are captured as text."""
    return subprocess.run([*HARNESS, *(str(a) for a in args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL,
                          env=dict(os.environ if env is None else env))


def write_spec(path: Path, *, engine: Mapping, hypotheses: Iterable[Mapping], benchmark: Mapping | None = None,
               defaults: Mapping | None = None) -> Path:
    """A hypotheses file at ``path`` (block-style YAML, keys in the order given)."""
    doc: dict[str, Any] = {"version": 1, "engine": dict(engine)}
    if benchmark is not None:
        doc["benchmark"] = dict(benchmark)
    if defaults is not None:
        doc["defaults"] = dict(defaults)
    doc["hypotheses"] = [dict(h) for h in hypotheses]
    path.write_text(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return path


def run_inert_pair(tmp_path: Path, engine_script: Path, mode: str, *, benchmark: Mapping,
                   samples_per_boot: int = 1) -> tuple[subprocess.CompletedProcess, Path]:
    """``harness run --json`` of one hypothesis whose two arms differ by a variable no
    engine reads, two boots an arm and no retries, on a test engine script started as
    ``SCRIPT --port {port} --mode MODE``: (the finished process, the ledger's path)."""
    engine = {"preset": "openai", "ready_timeout_s": 30,
              "launch": [sys.executable, str(engine_script), "--port", "{port}", "--mode", mode]}
    hyp = [{"id": "h", "baseline": {}, "treatment": {"env": {"BH_INERT": "1"}},
            "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}]
    spec = write_spec(tmp_path / "h.yaml", engine=engine, hypotheses=hyp, benchmark=benchmark,
                      defaults={"boots_per_arm": 2, "max_boots_per_arm": 2, "samples_per_boot": samples_per_boot,
                                "boot_retries": 0, "host_preflight_s": 0})
    db = tmp_path / "r.db"
    proc = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                   "--journal-dir", tmp_path / "exp", cwd=tmp_path, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc, db


def last_json(stdout: str) -> Any:
    """The ``--json`` object: the last non-empty line of stdout."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert lines, "no output on stdout"
    return json.loads(lines[-1])


def query(db: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows of ``sql`` on the SQLite ledger at ``db``, opened read-only."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def wait_for(predicate, *, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def processes_under(root: Path) -> list[str]:
    """Live processes (not zombies) whose cwd or command line lies inside ``root``."""
    root_s = str(Path(root).resolve())
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cwd = proc.info["cwd"] or ""
            cmd = " ".join(proc.info["cmdline"] or ())
        except psutil.Error:
            continue
        if cwd == root_s or cwd.startswith(root_s + os.sep) or root_s in cmd:
            out.append(f"pid {proc.info['pid']} cwd={cwd} cmd={cmd[:200]}")
    return out


def reapers_of(harness_pid: int) -> list[int]:
    """Supervisor processes started by the harness with pid ``harness_pid`` that still run."""
    from bisect_harness.process.supervised import supervisors_of

    return supervisors_of(harness_pid)


def git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "t",
                "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@example.invalid",
                "GIT_OPTIONAL_LOCKS": "0"})  # `git status` must not rewrite the index it reads
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout


def snapshot_checkout(repo: Path) -> dict:
    """Every file's bytes and mode under ``repo`` (``.git`` included), plus HEAD, status and refs.

    The git commands run after the bytes are read, so a refresh of the index by
    ``git status`` itself cannot hide a change made by the code under test.
    """
    files = {}
    for p in sorted(repo.rglob("*")):
        if p.is_symlink():
            files[str(p.relative_to(repo))] = ("link", os.readlink(p))
        elif p.is_file():
            files[str(p.relative_to(repo))] = (p.stat().st_mode, p.read_bytes())
        elif p.is_dir():
            files[str(p.relative_to(repo)) + "/"] = ("dir",)
    return {"files": files, "head": git(repo, "rev-parse", "HEAD"),
            "status": git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
            "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
            "worktrees": git(repo, "worktree", "list", "--porcelain")}


def diff_snapshots(before: dict, after: dict) -> list[str]:
    """What changed between two :func:`snapshot_checkout` results, one line per difference."""
    out = []
    for key in ("head", "status", "refs", "worktrees"):
        if before[key] != after[key]:
            out.append(f"{key}: {before[key]!r} -> {after[key]!r}")
    a, b = before["files"], after["files"]
    for name in sorted(set(a) | set(b)):
        if name not in b:
            out.append(f"removed {name}")
        elif name not in a:
            out.append(f"added {name}")
        elif a[name] != b[name]:
            out.append(f"changed {name}")
    return out


class FakeServer:
    """A real HTTP server on loopback whose ``/metrics`` text and JSON routes the test sets.

    ``metrics`` and each value of ``routes`` may be a callable of the read's number
    (1 for the first read of that path), for payloads that move as the server serves;
    ``hits`` counts the reads of each path."""

    def __init__(self):
        import threading
        from collections import Counter
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.metrics: Any = ""
        self.routes: dict[str, Any] = {}
        self.hits: Counter = Counter()
        outer = self

        def current(value, path):
            outer.hits[path] += 1
            return value(outer.hits[path]) if callable(value) else value

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/metrics":
                    body, ctype, code = current(outer.metrics, self.path).encode(), "text/plain; version=0.0.4", 200
                elif self.path in outer.routes:
                    body = json.dumps(current(outer.routes[self.path], self.path)).encode()
                    ctype, code = "application/json", 200
                else:
                    body, ctype, code = b"not found", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


#: Forked processes for the tests that release several at once (``released_together``).
FORK = mp.get_context("fork")


def released_together(target, args_list, timeout_s: float = 120.0) -> list[tuple[int | None, str]]:
    """Run ``target(barrier, *args)`` in one forked process per args, released at once;
    (exit code, error text) of each."""
    barrier = FORK.Barrier(len(args_list))
    errors = FORK.Queue()

    def child(index, *args):
        try:
            target(barrier, *args)
        except BaseException:
            errors.put((index, traceback.format_exc(limit=3)))
            errors.close()
            errors.join_thread()  # flushed before the hard exit
            os._exit(1)
        os._exit(0)

    procs = [FORK.Process(target=child, args=(i, *args)) for i, args in enumerate(args_list)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
        if p.is_alive():
            p.kill()
            p.join()
    found = {}
    while not errors.empty():
        index, text = errors.get()
        found[index] = text
    return [(p.exitcode, found.get(i, "")) for i, p in enumerate(procs)]
