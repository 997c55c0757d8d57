"""What the old-ledger fixture's maker and its test share (``tests/fixtures/old_ledger``).

``fixtures/old_ledger/make.py`` wrote ``results.db`` with the harness of the commit
named in that folder's README; ``test_old_ledger.py`` opens it with the harness of
today. Both render the journals the one way :func:`render_journals` does, and both
boot the interrupted run's configs with :func:`interrupted_samples`, so the part of
that run booted before its interruption and the part its resume boots draw from
one law. The boots are answered by the mock backend with plain samples (mappings
of metrics), the least of the boot API a later harness must still take.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from mock_boots import harness_in_process

FIXTURE = Path(__file__).parent / "fixtures" / "old_ledger"
LEDGER = FIXTURE / "results.db"
SPECS = FIXTURE / "specs"
GOLDEN = FIXTURE / "journals"
#: The spec of the run left interrupted, as the ledger names it (relative: the runs were made in its folder).
INTERRUPTED_SPEC = "interrupted.yaml"
#: The mock backend's name in the interrupted run's record, lent again to its resume.
BACKEND_NAME = "old-ledger"


def draw(*parts: Any) -> random.Random:
    """A generator seeded by ``parts`` alone (never by the order boots happened in)."""
    return random.Random(hashlib.sha256(":".join(map(str, parts)).encode()).digest())


#: The treatment's level over the baseline's, by the flag that makes each arm of ``interrupted.yaml``.
INTERRUPTED_EFFECTS = {"1": 1.6, "2": 1.0, "3": 1.06}


def interrupted_samples(r) -> list[dict]:
    """The samples of boot ``r.seq`` of config ``r.config_key`` of ``interrupted.yaml``
    (and ``resumed.yaml``): a function of the request alone. The treatment of flag
    ``level`` = 1, 2, 3 runs 1.6x, 1.0x and 1.06x the baseline; the boots spread 8%, the
    samples within a boot 1%."""
    flags = dict(r.flags)
    rng = draw("interrupted", r.config_key, r.seq)
    level = 100.0 * INTERRUPTED_EFFECTS.get(str(flags.get("level", "")), 1.0) * rng.lognormvariate(0.0, 0.08)
    return [{"tok_s": round(level * rng.lognormvariate(0.0, 0.01), 4)} for _ in range(max(1, r.samples))]


def query(db: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows of ``sql`` on the SQLite file ``db``, opened read-only."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def empty_png(figure, fname, **kwargs) -> None:
    """``Figure.savefig`` that writes nothing into the file it is given."""
    if not hasattr(fname, "write"):
        Path(fname).write_bytes(b"")


def render_journals(db: Path, out: Path) -> dict[str, str]:
    """``harness journal RUN --ledger sqlite:///DB --journal-dir journals`` for every run
    of the ledger ``db``, oldest first, run in ``out``: the markdown files written
    (each run's journal, and ``index.md`` as the last call left it), by name.

    The plots are not compared: each is made from the ledger's rows as the journal
    makes it, but its file is written empty (matplotlib's ``savefig`` stubbed), as
    drawing the pixels is most of the rendering's time."""
    runs = [i for (i,) in query(db, "SELECT id FROM runs ORDER BY id")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("matplotlib.figure.Figure.savefig", empty_png)
        for run_id in runs:
            done = harness_in_process("journal", run_id, "--ledger", f"sqlite:///{db}", "--journal-dir", "journals",
                                      cwd=out)
            assert done.returncode == 0, f"harness journal {run_id} exited {done.returncode}: {done.stderr[-2000:]}"
    return {p.name: p.read_text() for p in sorted((out / "journals").glob("*.md"))}


def recorded_host(db: Path, run_id: int) -> tuple[dict, str]:
    """The host description and fingerprint run ``run_id`` recorded (``runs.host`` less
    what the run added beside the host: its owner, backend, seed, options, resumes),
    as ``backends.procedure.this_host`` gives them: a resume that reads them as its own
    host counts the run's boots."""
    (host,), = query(db, "SELECT host FROM runs WHERE id = ?", (run_id,))
    fingerprints = {f for (f,) in query(db, "SELECT DISTINCT host_fingerprint FROM boots WHERE run_id = ?",
                                        (run_id,))}
    (fingerprint,) = fingerprints
    beside = {"harness_process", "backend", "order_seed", "run_options", "resumed"}
    return {k: v for k, v in json.loads(host).items() if k not in beside}, fingerprint
