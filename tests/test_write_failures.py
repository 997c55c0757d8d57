"""A write the kernel refuses is a fact of the boot, never lost in silence.

The disk fills for real, at the writer only: ``/dev/full`` (every write: ENOSPC), a
file-size limit on one process (``RLIMIT_FSIZE``: a write past it fails with EFBIG,
SIGXFSZ being ignored, as Python does), set with ``prlimit`` on the boot's supervisor
while the harness, its ledger and its journal write as usual.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bisect_harness.process.capped_log import MEMORY_TAIL_BYTES, _CappedLog
from bisect_harness.process.supervised import supervisors_of
from helpers import HARNESS, query, write_spec

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_the_log_writer_on_a_full_disk_counts_what_it_could_not_write_and_keeps_the_newest_output():
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        log = _CappedLog(fd, 4096, 4096)
        lines = [b"engine line %05d\n" % i for i in range(3000)]  # past the head: the capped path too
        for line in lines:
            log.write(line)
        log.flush()
    finally:
        os.close(fd)
    assert log.failure() == "ENOSPC: No space left on device"
    assert log.unwritten >= 4096  # the head, then each rewrite of the tail: none reached the disk
    kept = log.memory_tail()
    assert len(kept) == MEMORY_TAIL_BYTES and kept.endswith(b"engine line 02999\n")


_GAP_SCRIPT = textwrap.dedent("""
    import os, resource, sys
    from bisect_harness.process.capped_log import _CappedLog
    path = sys.argv[1]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    log = _CappedLog(fd, 1 << 20, 1 << 20)
    log.write(b"before the disk filled\\n")
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.fstat(fd).st_size + 10, hard))  # "full" 10 bytes on
    log.write(b"lost while it was full\\n")
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again
    log.write(b"after room was made\\n")
    print(log.failure(), log.unwritten)
""")


def test_a_log_that_could_be_written_again_says_how_much_is_missing_above(tmp_path):
    log = tmp_path / "boot.log"
    out = subprocess.run([sys.executable, "-c", _GAP_SCRIPT, str(log)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["EFBIG:", "File", "too", "large", "13"]
    text = log.read_text()
    assert text.startswith("before the disk filled\n")  # the part that fitted stays: 10 bytes of the lost line
    assert text.endswith("\n[bisect-harness supervisor] 13 bytes of output could not be written here "
                         "(EFBIG: File too large)\nafter room was made\n"), text


_PLOT_SCRIPT = textwrap.dedent("""
    import os, resource, sys
    from pathlib import Path
    from bisect_harness.report import plots
    folder = Path(sys.argv[1])
    points = [plots.BootPoint(side=s, boot_id=i, round=i, values=(100.0 + i, 101.0 + i), marked=False, used=True)
              for i, s in enumerate(["baseline", "treatment"] * 4, start=1)]
    plots._pyplot()  # matplotlib's own caches are written before the disk fills
    plots.plot_hypothesis(points, folder / "warm-up.png", title="t", metric="tok_s", unit="tok/s")
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        plots.plot_hypothesis(points, folder / "h.png", title="t", metric="tok_s", unit="tok/s")
    except plots.PlotNotWritten as exc:
        print("not written:", exc)
""")


def test_a_plot_that_cannot_be_written_leaves_no_file_behind_and_says_why(tmp_path):
    out = subprocess.run([sys.executable, "-c", _PLOT_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"not written: {tmp_path / 'h.png'} not written (EFBIG: File too large)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warm-up.png"]  # no PNG cut short, no temporary file
    assert (tmp_path / "warm-up.png").read_bytes().startswith(b"\x89PNG")


def _fill_the_disk_under_every_boot_log(harness_pid: int, stop: threading.Event, limited: set,
                                        skip: frozenset = frozenset()) -> None:
    """Each boot's supervisor (the log's only writer) gets a file-size limit of 0 as it starts;
    those in ``skip`` (another test's servers, still up in this process) are left alone."""
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    while not stop.is_set():
        for pid in supervisors_of(harness_pid):
            if pid not in limited and pid not in skip:
                try:
                    resource.prlimit(pid, resource.RLIMIT_FSIZE, (0, hard))
                    limited.add(pid)
                except ProcessLookupError:
                    pass
        time.sleep(0.005)


@pytest.mark.slow
def test_boots_whose_logs_could_not_be_written_are_marked_and_their_tails_kept(tmp_path):
    engine = {"preset": "openai", "ready_timeout_s": 30,
              "launch": [sys.executable, str(TESTS / "marks_engine.py"), "--port", "{port}", "--mode", "chatty"]}
    hyp = [{"id": "h", "baseline": {}, "treatment": {"env": {"BH_INERT": "1"}},
            "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}]
    spec = write_spec(tmp_path / "h.yaml", engine=engine, hypotheses=hyp,
                      benchmark={"prompt_tokens": 4, "output_tokens": 8, "requests_per_sample": 2,
                                 "warmup_requests": 0, "ignore_eos": False},
                      defaults={"boots_per_arm": 2, "max_boots_per_arm": 2, "samples_per_boot": 1,
                                "boot_retries": 0, "host_preflight_s": 0})
    db = tmp_path / "r.db"
    proc = subprocess.Popen([*HARNESS, "run", str(spec), "--json", "--no-calibration", "--ledger",
                             f"sqlite:///{db}", "--journal-dir", str(tmp_path / "exp")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    stop, limited = threading.Event(), set()
    filler = threading.Thread(target=_fill_the_disk_under_every_boot_log, args=(proc.pid, stop, limited))
    filler.start()
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        stop.set()
        filler.join()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert len(limited) == 4
    boots = query(db, "SELECT status, marks, provenance, log_tail, log_path FROM boots")
    assert len(boots) == 4
    for status, marks, prov, tail, log_path in boots:
        assert status == "ok" and "log_unwritten" in json.loads(marks), (status, marks)
        why = json.loads(prov)["log"]["unwritten"]
        assert "of the server's output could not be written to" in why and "(EFBIG: File too large)" in why, why
        assert "marks_engine: served request 2" in tail, tail  # from the supervisor's memory
        assert "served request" not in Path(log_path).read_text()
    journal = next((tmp_path / "exp").glob("*.md")).read_text()
    assert journal.count("log not written: ") == 4 and "log_unwritten" in journal


def test_a_boot_that_fails_with_its_log_unwritable_says_so_and_keeps_the_engines_last_words(tmp_path):
    from bisect_harness.engines.server import ServerProcess
    from bisect_harness.errors import BootFailed

    script = "import time; time.sleep(1.0); print('engine: model file not found', flush=True); raise SystemExit(1)"
    stop, limited = threading.Event(), set()
    others = frozenset(supervisors_of(os.getpid()))  # servers of other tests in this process
    filler = threading.Thread(target=_fill_the_disk_under_every_boot_log, args=(os.getpid(), stop, limited, others))
    filler.start()
    try:
        with pytest.raises(BootFailed) as info:
            ServerProcess([sys.executable, "-c", script], env=dict(os.environ), cwd=tmp_path,
                          log_path=tmp_path / "boot.log", base_url="http://127.0.0.1:9", ready_timeout_s=30,
                          record=False).start()
    finally:
        stop.set()
        filler.join()
    assert len(limited) == 1
    exc = info.value
    assert exc.log_unwritten and exc.log_unwritten.endswith("(EFBIG: File too large)"), exc.log_unwritten
    assert "engine: model file not found" in exc.log_tail
    assert "model file not found" not in (tmp_path / "boot.log").read_text()
