"""Faults at the end of a run: the journal or the ledger refuses a write.

Each test drives the real ``harness run`` boundary in this process (``cli.main``),
on a real SQLite ledger and a real journal folder; only the backend is a stand-in
(the mock backend, lent to the command line as a kind of its own: boots nothing,
reports fixed samples), and the fault is real where it is cheap
(a file where the journal folder should be, a ledger connection switched to
``query_only`` before the last boot) or raised at the journal writer (a full
disk). Each asserts exit 3, one clear line naming what failed and what to do, no
traceback, and the run row's final state.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from sqlalchemy import event

from bisect_harness import cli
from bisect_harness.backends import BACKENDS
from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import BootOutcome, SampleOutcome
from bisect_harness.report import journal
from bisect_harness.record import ledger as ledger_mod
from bisect_harness.record.ledger import Ledger
from helpers import query, write_spec

ENGINE = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}
DEFAULTS = {"boots_per_arm": 2, "max_boots_per_arm": 2, "samples_per_boot": 2, "host_preflight_s": 0}
HYPOTHESES = [{"id": "faster", "baseline": {}, "treatment": {"flags": {"x": 1}}, "metric": "tok_s",
               "expect": "increase", "min_effect": "20%"}]


class Fixed:
    """The mock backend's handler (``self.backend``): boots nothing, every request comes
    back ok with two samples; ``before_boot(n)`` runs before the n-th boot (1-based) is
    reported, where a test puts its fault."""

    def __init__(self, before_boot=None):
        self.before_boot, self.booted = before_boot, 0
        self.backend = MockBackend(self, name="fixed")

    def __call__(self, r):
        self.booted += 1
        if self.before_boot is not None:
            self.before_boot(self.booted)
        level = 100.0 + self.booted
        samples = tuple(SampleOutcome(seq=i + 1, metrics={"tok_s": level + i}, requests=1, output_tokens=10,
                                      duration_s=0.1) for i in range(2))
        return BootOutcome(boot_id=r.boot_id, status="ok", samples=samples)


@pytest.fixture
def harness_in_process(tmp_path, monkeypatch, capsys):
    """``run(*args, fixed=...)``: ``harness run SPEC ARGS`` in this process, its boots answered by
    ``fixed``; (exit code, stderr, stdout)."""
    monkeypatch.setenv("COLUMNS", "1000")  # a message is one line; nothing wraps it
    monkeypatch.setattr("bisect_harness.engines.server.install_signal_handlers", lambda: None)
    spec = write_spec(tmp_path / "hypotheses.yaml", engine=ENGINE, defaults=DEFAULTS, hypotheses=HYPOTHESES)

    lent = []

    def run(*args, fixed):
        backend = fixed.backend
        BACKENDS.add(backend.as_kind())  # --backend fixed makes this backend
        lent.append(backend.name)
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            cli.main(["run", str(spec), "--no-calibration", "--backend", backend.name, *map(str, args)])
        out = capsys.readouterr()
        return stop.value.code, out.err, out.out

    yield run
    for name in lent:
        BACKENDS.discard(name)


def _error_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("Error: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_full_disk_at_the_journal_exits_3_naming_the_journal_and_the_run_stays_done(tmp_path, monkeypatch,
                                                                                      harness_in_process):
    db, exp = tmp_path / "r.db", tmp_path / "exp"

    def full(led, run, journal_dir):
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(journal_dir) / "index.md"))

    monkeypatch.setattr(journal, "write", full)
    code, err, out = harness_in_process("--ledger", f"sqlite:///{db}", "--journal-dir", exp, fixed=Fixed())
    line = _error_line(err)
    assert code == 3
    assert line.startswith(f"Error: could not write the journal of run 1 in {exp}: No space left on device")
    assert "status done" in line and "free space on that disk" in line
    assert f"`harness journal 1 --ledger sqlite:///{db} --journal-dir {exp}`" in line
    assert query(db, "SELECT status, error FROM runs") == [("done", None)]
    assert query(db, "SELECT COUNT(*) FROM verdicts WHERE final = 1") == [(1,)]


def test_a_file_where_the_journal_folder_should_be_exits_3_and_the_run_ends_failed(tmp_path, harness_in_process):
    db, exp = tmp_path / "r.db", tmp_path / "exp"
    exp.write_text("not a folder\n")
    fixed = Fixed()
    code, err, out = harness_in_process("--ledger", f"sqlite:///{db}", "--journal-dir", exp, fixed=fixed)
    line = _error_line(err)
    assert code == 3 and fixed.booted == 0
    assert line.startswith(f"Error: cannot make the log folder {exp / 'logs' / 'run-1'}: ")
    assert "pass --journal-dir with one" in line
    # The journal is tried once more after the error, says why it could not be written, and hides nothing.
    assert f"warning: could not write the journal of run 1 in {exp}" in out
    ((status, error),) = query(db, "SELECT status, error FROM runs")
    assert status == "failed" and error.startswith("cannot make the log folder")
    assert exp.read_text() == "not a folder\n"


def test_a_ledger_that_refuses_writes_before_the_end_exits_3_and_the_run_is_ended_on_the_next_open(
        tmp_path, monkeypatch, harness_in_process):
    db = tmp_path / "r.db"
    url = f"sqlite:///{db}"
    opened: list[Ledger] = []
    real_init = ledger_mod.Ledger.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(ledger_mod.Ledger, "__init__", init)

    def read_only(n):  # before the third boot is reported, the ledger's connections refuse writes
        if n == 3:
            led = opened[0]
            event.listen(led.engine, "checkout", lambda dbapi, _rec, _proxy: dbapi.execute("PRAGMA query_only=ON"))
            led.session.connection().exec_driver_sql("PRAGMA query_only=ON")

    code, err, out = harness_in_process("--ledger", url, "--journal-dir", tmp_path / "exp",
                                   fixed=Fixed(read_only))
    line = _error_line(err)
    assert code == 3
    assert line.startswith(f"Error: the ledger {url} is read-only (attempt to write a readonly database): make "
                           "the ledger file and its folder writable")
    assert "Run 1 could not be marked failed; the next harness to open the ledger marks it interrupted, and " \
           "`harness run FILE --resume 1` continues it" in line
    assert query(db, "SELECT status FROM runs") == [("running",)]  # the write was refused: nothing could say more
    assert query(db, "SELECT COUNT(*) FROM boots WHERE status = 'ok'") == [(2,)]
    # The next open ends it, though the process that ran it (this one) lives: it let go of the run.
    with Ledger(url):
        pass
    ((status, error),) = query(db, "SELECT status, error FROM runs")
    assert status == "interrupted" and "let go of it without recording its end" in error


def test_a_read_only_ledger_says_so_with_exit_3(tmp_path, harness_in_process):
    db = tmp_path / "r.db"
    Ledger(f"sqlite:///{db}").close()
    url = f"sqlite:///file:{db}?mode=ro&uri=true"
    fixed = Fixed()
    code, err, out = harness_in_process("--ledger", url, "--journal-dir", tmp_path / "exp", fixed=fixed)
    line = _error_line(err)
    assert code == 3 and fixed.booted == 0
    assert line.startswith(f"Error: the ledger {url} is read-only (attempt to write a readonly database): make the "
                           "ledger file and its folder writable, or pass --ledger with a writable ledger")
    assert "valid SQLAlchemy URL" not in line
