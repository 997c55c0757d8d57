"""The supervisor owns every descendant: real processes that double-fork and ``setsid``.

The chaos test boots a fake engine (``chaos_engine.py``: workers that leave the
session, double-fork, re-fork while being killed, ignore SIGTERM) from a small
harness (``chaos_driver.py``: one ``ServerProcess``), then, at a random moment,
SIGKILLs, SIGTERMs or SIGINTs the harness, lets it stop the server, lets the boot
time out, or SIGKILLs the harness *and* its supervisor and starts again (the next
start kills the leftovers). Every process of the engine carries a unique marker
in its command line and environment; none may survive.

``BISECT_HARNESS_CHAOS_TRIALS`` (default 30) and ``BISECT_HARNESS_CHAOS_SEED``
choose the number of trials and the seed.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from bisect_harness.engines.checkout import Workspace
from bisect_harness.errors import BuildFailed, InfrastructureError
from bisect_harness.process.supervised import LaunchError, Supervised, reap_leftovers, run, supervisors_of
from helpers import git

TESTS = Path(__file__).resolve().parent
REPO_ROOT = TESTS.parent
TRIALS = int(os.environ.get("BISECT_HARNESS_CHAOS_TRIALS", "30"))
SEED = int(os.environ.get("BISECT_HARNESS_CHAOS_SEED", "20261130"))
ENDINGS = ("SIGKILL", "SIGTERM", "SIGINT", "stop", "timeout", "SIGKILL harness and supervisor")


def marked(marker: str) -> list[str]:
    """Live processes (not zombies) with ``marker`` in their command line or environment."""
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.info["cmdline"] or ())
            if marker in cmd or proc.environ().get("CHAOS_MARK") == marker:
                out.append(f"pid {proc.pid}: {cmd[:160]}")
        except psutil.Error:
            continue
    return out


def wait_gone(marker: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        left = marked(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def wait_dead(pids: list[int], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while any(running(p) for p in pids):
        assert time.monotonic() < deadline, f"{pids} still run {timeout} s after SIGKILL"
        time.sleep(0.01)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start_driver(folder: Path, marker: str, seed: int, mode: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    # A test run in the background of a script ignores SIGINT, and so would the driver
    # until it installs its handlers: a handler here (not SIG_IGN) is SIG_DFL after exec.
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _popen_driver(folder, marker, seed, mode, env)
    finally:
        if previous == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _popen_driver(folder: Path, marker: str, seed: int, mode: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TESTS / "chaos_driver.py"), str(folder), marker, str(seed), mode],
                            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(folder / "driver.err", "wb"), start_new_session=True)


def one_trial(folder: Path, rng: random.Random, ending: str) -> tuple[list[str], float, bool]:
    """Run one trial; return the marked processes still alive afterwards, its seconds, and
    whether the engine had started when the harness was signalled (always True otherwise)."""
    folder.mkdir()
    marker = f"chaos-{uuid.uuid4().hex}"
    mode = {"stop": "stop", "timeout": "timeout"}.get(ending, "wait")
    t0 = time.monotonic()
    live = True
    killed: list[int] = []
    driver = start_driver(folder, marker, rng.randrange(2**31), mode)
    try:
        if ending.startswith("SIG"):
            if rng.random() < 0.5:
                time.sleep(rng.uniform(0.0, 0.9))  # anywhere from the harness's imports to after "ready"
            else:  # while the engine runs and its late worker may be forking
                deadline = time.monotonic() + 30
                while not (folder / "ready").exists() and driver.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 0.4))
            live = len(marked(marker)) > 1  # more than the driver: the engine has started
            if ending == "SIGKILL harness and supervisor":
                killed = supervisors_of(driver.pid)
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
                driver.kill()
            else:
                driver.send_signal(getattr(signal, ending))
        try:
            driver.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(driver.pid, signal.SIGUSR1)  # the driver's faulthandler prints every thread's stack
            time.sleep(1.0)
            pytest.fail(f"the harness did not exit 30 s after {ending}: {marked(marker)}, supervisors "
                        f"{supervisors_of(driver.pid)}\n{(folder / 'driver.err').read_text()[-6000:]}")
        if ending == "SIGKILL harness and supervisor":
            wait_dead(killed)  # a next start comes after the death, not while SIGKILL is delivered
            reap_leftovers(folder / "supervised")  # what the next start of a harness does first
        left = wait_gone(marker, 5.0)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    return left, time.monotonic() - t0, live


@pytest.mark.slow
def test_chaos_no_process_of_the_engine_survives(tmp_path):
    rng = random.Random(SEED)
    results = []
    for trial in range(TRIALS):
        ending = rng.choice(ENDINGS)
        left, seconds, live = one_trial(tmp_path / f"trial-{trial}", rng, ending)
        results.append({"trial": trial, "ending": ending, "survivors": len(left), "seconds": round(seconds, 2),
                        "engine_started": live})
        for proc in left:  # leave nothing for the next trial to trip over
            psutil.Process(int(proc.split()[1].rstrip(":"))).kill()
    survivors = sum(r["survivors"] for r in results)
    print(json.dumps({"trials": TRIALS, "seed": SEED, "survivors": survivors,
                      "trials_with_survivors": sum(1 for r in results if r["survivors"]),
                      "trials_engine_started": sum(1 for r in results if r["engine_started"]),
                      "by_ending": {e: sum(1 for r in results if r["ending"] == e) for e in ENDINGS},
                      "mean_trial_s": round(sum(r["seconds"] for r in results) / max(1, TRIALS), 2)}))
    assert survivors == 0, [r for r in results if r["survivors"]]


def test_a_normal_stop_kills_double_forked_and_setsid_workers(tmp_path):
    marker = f"chaos-{uuid.uuid4().hex}"
    driver = start_driver(tmp_path, marker, 7, "wait")
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert driver.poll() is None and time.monotonic() < deadline, (tmp_path / "driver.err").read_text()
            time.sleep(0.02)
        time.sleep(0.4)  # the late worker exists too
        server_pid = int((tmp_path / "ready").read_text())
        # Workers that double-forked or left the session are the supervisor's, not init's.
        (sup,) = supervisors_of(driver.pid)
        tree = {p.pid for p in psutil.Process(sup).children(recursive=True)}
        assert server_pid in tree and len(tree) >= 8
        engine = {int(x.split()[1].rstrip(":")) for x in marked(marker)} - {driver.pid, sup}
        assert engine <= tree
        driver.send_signal(signal.SIGTERM)  # the harness's handler stops the server
        assert driver.wait(timeout=20) == 143
        assert wait_gone(marker, 0.5) == []
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_next_start_kills_what_a_dead_harness_and_supervisor_left(tmp_path):
    marker = f"chaos-{uuid.uuid4().hex}"
    driver = start_driver(tmp_path, marker, 11, "wait")
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ready").exists():
            assert driver.poll() is None and time.monotonic() < deadline, (tmp_path / "driver.err").read_text()
            time.sleep(0.02)
        time.sleep(0.5)
        (sup,) = supervisors_of(driver.pid)
        os.kill(sup, signal.SIGKILL)
        driver.kill()
        driver.wait()
        wait_dead([sup])
        orphans = marked(marker)
        assert orphans, "nothing was left to clean: the test would prove nothing"
        assert reap_leftovers(tmp_path / "supervised") >= len(orphans)
        assert wait_gone(marker, 2.0) == []
        assert not list((tmp_path / "supervised").glob("*.json"))
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_a_record_is_left_alone_while_its_harness_lives(tmp_path):
    """Another harness's live tree on the same cache is never touched."""
    marker = f"sup-{uuid.uuid4().hex}"
    with open(tmp_path / "log", "wb") as log:
        job = Supervised([sys.executable, "-c", "import time; time.sleep(60)", marker], env=dict(os.environ),
                         cwd=tmp_path, stdout=log, record=tmp_path / "supervised").start()
        try:
            time.sleep(0.3)
            assert list((tmp_path / "supervised").glob("*.json"))
            assert reap_leftovers(tmp_path / "supervised") == 0
            assert psutil.Process(job.pid).is_running()
        finally:
            job.stop(1.0)
    assert wait_gone(marker, 0.5) == []
    assert not list((tmp_path / "supervised").glob("*.json"))


def test_what_a_finished_command_left_running_is_killed(tmp_path):
    marker = f"sup-{uuid.uuid4().hex}"
    with open(tmp_path / "log", "wb") as log:
        sleeper = f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(300)' {marker}"
        rc = run(["sh", "-c", f"setsid {sleeper} >/dev/null 2>&1 & exit 7"], env=dict(os.environ),
                 cwd=tmp_path, stdout=log, timeout_s=30, grace_s=1.0, record=False)
    assert rc == 7
    assert wait_gone(marker, 0.5) == []
    assert "left running" in (tmp_path / "log").read_text()


def start_ready(tmp_path, argv: list[str], log) -> Supervised:
    """``argv`` started under its own supervisor, once it has printed ``ready`` to ``log``."""
    job = Supervised(argv, env=dict(os.environ), cwd=tmp_path, stdout=log, record=False).start()
    deadline = time.monotonic() + 30
    while b"ready" not in (tmp_path / "log").read_bytes():
        assert time.monotonic() < deadline and job.poll() is None, (tmp_path / "log").read_text()
        time.sleep(0.02)
    return job


#: A server in the shape of the demo engine and vLLM's front end: a watcher that reports
#: a crash (exit 1) when its worker dies unasked, and a SIGTERM handler that drains for a
#: moment, then stops the worker and exits 0.
WATCHFUL_SERVER = """
import signal, subprocess, sys, threading, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", sys.argv[1]])
stopping = False
def watch():
    while True:
        if worker.poll() is not None and not stopping:
            print("worker died; shutting down", flush=True)
            import os; os._exit(1)
        time.sleep(0.02)
def on_term(signum, frame):
    global stopping
    time.sleep(0.5)  # in-flight requests drain
    stopping = True
    worker.terminate(); worker.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
threading.Thread(target=watch, daemon=True).start()
print("ready", flush=True)
time.sleep(300)
"""


def test_a_stop_lets_the_server_stop_its_own_workers_first(tmp_path):
    """SIGTERM to every process at once kills the worker before its server has handled
    its own SIGTERM: the server reports a crash and exits 1 (a boot marked
    ``stop_unclean`` for nothing). The command alone is asked first."""
    marker = f"sup-{uuid.uuid4().hex}"
    with open(tmp_path / "log", "wb") as log:
        job = start_ready(tmp_path, [sys.executable, "-c", WATCHFUL_SERVER, marker], log)
        time.sleep(0.2)
        job.stop(5.0)
    assert job.wait() == 0, (tmp_path / "log").read_text()
    assert "worker died" not in (tmp_path / "log").read_text()
    assert wait_gone(marker, 0.5) == []


def test_the_exit_code_of_a_command_that_ends_between_reap_and_listing_is_kept():
    """A command that ends just after the supervisor's reap is a zombie when the tree is
    listed, and zombies are not listed: the tree looks gone with the exit code never
    collected, and the boot read 125 (unknown) and was marked stop_unclean. Run in a
    process of its own (the stop lists *its* descendants); the reap that comes too early
    is the one thing faked."""
    script = textwrap.dedent("""
        import os, subprocess, sys, time
        from bisect_harness.process import supervisor as s
        p = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
        time.sleep(1.0)  # ended: a zombie until reaped
        real, calls = s._reap, []
        s._reap = lambda main: calls.append(main) or (None if len(calls) == 1 else real(main))
        r, w = os.pipe()
        print(s._kill_tree(5.0, r, p.pid))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "(0, 3)", (out.stdout, out.stderr)


def _threads_alive(pid: int) -> int:
    """Threads still running in process ``pid`` (0 when it is gone or a plain zombie)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return 0
    rest = data[data.rindex(b")") + 2:].split()
    threads = int(rest[17])
    return threads - 1 if rest[0] == b"Z" else threads


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_process_whose_leader_thread_exited_is_still_stopped(tmp_path):
    """A process whose main thread has exited while others run is listed as a zombie,
    yet alive and not reapable (every multi-threaded server is, for a moment, as it
    ends). The stop waits for it and kills it; it took it for gone, kept no exit code
    (125, stop_unclean on clean demo boots) and left threads of this kind running."""
    code = ("import ctypes, sys, threading, time\n"
            "threading.Thread(target=time.sleep, args=(300,)).start()\n"
            "print('ready', flush=True)\n"
            "ctypes.CDLL(None).pthread_exit(None)\n")
    with open(tmp_path / "log", "wb") as log:
        job = start_ready(tmp_path, [sys.executable, "-c", code], log)
        time.sleep(0.3)
        assert _threads_alive(job.pid) == 1
        job.stop(1.0)
        rc = job.wait()
    deadline = time.monotonic() + 5
    while _threads_alive(job.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _threads_alive(job.pid) == 0
    assert rc == -signal.SIGTERM, rc  # the SIGTERM to its pid ended the whole group, and its code was kept


def test_a_server_that_ignores_sigterm_is_still_stopped_within_the_grace(tmp_path):
    marker = f"sup-{uuid.uuid4().hex}"
    stubborn = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]]); "
                "print('ready', flush=True); time.sleep(300)")
    with open(tmp_path / "log", "wb") as log:
        job = start_ready(tmp_path, [sys.executable, "-c", stubborn, marker], log)
        t0 = time.monotonic()
        job.stop(1.0)
        took = time.monotonic() - t0
    rc = job.wait()
    assert rc == -signal.SIGKILL and took < 5.0, (rc, took)
    assert wait_gone(marker, 0.5) == []


def test_a_command_sits_in_the_harness_session_and_leads_its_own_group(tmp_path):
    """One scheduling group with the harness's client (autogroups are sessions: the module
    docstring of ``supervised`` says what a session of its own cost), a process group of
    its own (a terminal's Ctrl-C reaches the harness, which stops the tree), and a record
    that names no session the harness is in (the next start never reaps the harness's)."""
    ids = tmp_path / "ids"
    code = ("import os, time\n"
            f"open({str(ids) + '.tmp'!r}, 'w').write(f'{{os.getsid(0)}} {{os.getpgrp()}} {{os.getpid()}}')\n"
            f"os.replace({str(ids) + '.tmp'!r}, {str(ids)!r})\n"
            "time.sleep(60)\n")
    with open(tmp_path / "log", "wb") as log:
        job = Supervised([sys.executable, "-c", code], env=dict(os.environ), cwd=tmp_path, stdout=log,
                         record=tmp_path / "records").start()
        try:
            deadline = time.monotonic() + 30
            while not ids.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            sid, pgid, pid = map(int, ids.read_text().split())
            assert (sid, pgid, pid) == (os.getsid(0), job.pid, job.pid)
            assert os.getsid(job.supervisor_pid) == os.getsid(0)
            assert os.getpgid(job.supervisor_pid) == job.supervisor_pid != os.getpgrp()
            (record,) = (tmp_path / "records").glob("*.json")
            while time.monotonic() < deadline:  # the supervisor lists its tree every 0.1 s at first
                listed = json.loads(record.read_text())
                if job.pid in {p for p, _ in listed["processes"]}:
                    break
                time.sleep(0.05)
            assert job.pid in {p for p, _ in listed["processes"]}, listed
            assert listed["sessions"] == [], listed
        finally:
            job.stop(grace_s=1.0)


def test_a_command_that_cannot_start_is_a_launch_error(tmp_path):
    with open(tmp_path / "log", "wb") as log, pytest.raises(LaunchError, match="no-such-command"):
        run([str(tmp_path / "no-such-command")], env={}, cwd=tmp_path, stdout=log, timeout_s=5, record=False)


def test_a_launch_error_is_an_infrastructure_error_and_still_an_os_error(tmp_path):
    """In the harness's error tree (a tool that cannot run), and still caught as the OSError it was."""
    with open(tmp_path / "log", "wb") as log, pytest.raises(InfrastructureError) as got:
        run([str(tmp_path / "no-such-command")], env={}, cwd=tmp_path, stdout=log, timeout_s=5, record=False)
    assert isinstance(got.value, LaunchError) and isinstance(got.value, OSError)
    assert got.value.errno == errno.ENOENT and got.value.exit_code == 3


def test_a_timed_out_build_leaves_none_of_its_processes(tmp_path):
    repo = tmp_path / "engine"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "README").write_text("x\n")
    git(repo, "add", "README")
    git(repo, "commit", "-qm", "one")
    sha = git(repo, "rev-parse", "HEAD").strip()
    tag = f"{os.getpid() % 1000}{time.time_ns() % 10**6:06d}"
    first, second = f"417.{tag}", f"418.{tag}"  # `sleep 417 & sleep 418`, told apart from anyone else's
    ws = Workspace(repo, cache_dir=tmp_path / "cache")
    t0 = time.monotonic()
    with pytest.raises(BuildFailed, match="exit -1"):
        ws.build(sha, ["sh", "-c", f"sleep {first} & sleep {second}"], dict(os.environ), timeout_s=1.0)
    assert time.monotonic() - t0 < 10

    def sleeps():
        return [p.pid for p in psutil.process_iter(["cmdline"])
                if (p.info["cmdline"] or [])[-1:] in ([first], [second])]

    deadline = time.monotonic() + 0.5
    while sleeps() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleeps() == []
    log = next((tmp_path / "cache").rglob("*.log")).read_text()
    assert "timed out after 1s" in log


def test_the_process_table_without_proc_agrees_with_proc(monkeypatch):
    """Hosts without /proc (macOS) list the tree through psutil: same parents, sessions, liveness."""
    from bisect_harness.process import proctree

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        with_proc = proctree._descendants(os.getpid(), proctree._table())
        monkeypatch.setattr(proctree, "_PROC", False)
        without = proctree._descendants(os.getpid(), proctree._table())
        assert child.pid in with_proc and child.pid in without
        assert with_proc[child.pid][:2] == without[child.pid][:2] == (os.getpid(), child.pid)
        assert proctree._alive(child.pid, without[child.pid][2])
        assert not proctree._alive(child.pid, without[child.pid][2] + 1.0)
    finally:
        child.kill()
        child.wait()


def test_a_flooding_command_leaves_the_head_and_tail_of_its_output_and_counts_the_rest(tmp_path):
    from bisect_harness.process.supervised import Supervised

    # 40 MiB of numbered lines, 1,024 at a time; the log keeps 1 MiB of head and of tail
    script = ("import sys\n"
              "line = lambda i: b'line %08d ' % i + b'x' * 50 + b'\\n'\n"
              "for b in range(640):\n"
              "    sys.stdout.buffer.write(b''.join(line(b * 1024 + i) for i in range(1024)))\n"
              "sys.stdout.buffer.flush()\n")
    log_path = tmp_path / "flood.log"
    log_path.write_bytes(b"$ the harness's own first line\n")
    with open(log_path, "ab") as log:
        job = Supervised([sys.executable, "-c", script], env={"PATH": os.environ["PATH"]}, cwd=tmp_path,
                         stdout=log, timeout_s=120, log_cap=(1 << 20, 1 << 20)).start()
        assert job.wait(120) == 0
        job.stop()
    written = 640 * 1024 * 65  # 65-byte lines
    assert (job.log_bytes, job.log_dropped) == (written, written - (2 << 20))
    data = log_path.read_bytes()
    assert len(data) < (2 << 20) + 4096
    assert data.startswith(b"$ the harness's own first line\nline 00000000 ")
    head = data.split(b"\n[bisect-harness supervisor] log capped", 1)[0]
    assert len(head) == len(b"$ the harness's own first line\n") + (1 << 20)
    assert b"bytes between them were dropped\n" in data
    assert data.endswith(b"line %08d " % (640 * 1024 - 1) + b"x" * 50 + b"\n")


def test_a_log_past_its_cap_stays_readable_while_the_command_runs(tmp_path):
    from bisect_harness.process.supervised import Supervised

    script = ("import sys, time\n"
              "sys.stdout.write('x' * 3000000 + '\\nstill running\\n'); sys.stdout.flush()\n"
              "time.sleep(60)\n")
    log_path = tmp_path / "live.log"
    with open(log_path, "ab") as log:
        job = Supervised([sys.executable, "-c", script], env={"PATH": os.environ["PATH"]}, cwd=tmp_path,
                         stdout=log, timeout_s=120, log_cap=(1 << 20, 1 << 20)).start()
        try:
            deadline = time.monotonic() + 10
            while b"still running" not in log_path.read_bytes() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert b"still running" in log_path.read_bytes()
            assert log_path.stat().st_size < (2 << 20) + 4096
        finally:
            job.stop(grace_s=1)
