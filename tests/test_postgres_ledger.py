"""The ledger as a team keeps it: the same tests on SQLite and on a real PostgreSQL server.

``postgres_server`` (``tests/postgres_server.py``) starts PostgreSQL once per session
from the distribution's binaries; each test gets a database of its own. The
module's one pair of real ``harness run`` processes on the demo engine, started
together on one new ledger of each database, feeds the tests that need runs: what
two writers at once leave, the journals and the export read back from it, an older
ledger made from it that is upgraded, rendered and resumed, and (on PostgreSQL) the
URL's password looked for in every row and every output.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.pool import NullPool

from bisect_harness.errors import UserError
from bisect_harness.record import database, ledger as ledger_mod, liveness, runlock
from bisect_harness.record.ledger import SCHEMA_VERSION, Ledger, Run
from bisect_harness.report import journal
from bisect_harness.run.resume import spec_hash
from helpers import HARNESS, SMALL_BENCH, harness, last_json, released_together, write_spec
from postgres_server import PostgresServer, ServerUnavailable, free_port

DEFAULTS = {"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 2, "host_preflight_s": 0}
HYPOTHESES = {
    "regression": {"id": "head-regression", "baseline": {"commit": "HEAD~26"}, "treatment": {"commit": "HEAD"},
                   "metric": "tok_s", "expect": "decrease", "min_effect": "10%"},
    "attention": {"id": "decode-attention", "baseline": {"commit": "HEAD"},
                  "treatment": {"commit": "HEAD", "flags": {"attention-mode": "decode"}},
                  "metric": "tok_s", "expect": "increase", "min_effect": "10%"},
}


# --------------------------------------------------------------------------- reading either database


def rows(url: str, sql: str, params: dict | None = None) -> list[tuple]:
    """Rows of ``sql`` on the ledger at ``url``, whichever database it is."""
    engine = create_engine(database.engine_url(url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(sql), params or {}).all()]
    finally:
        engine.dispose()


def execute(url: str, *statements: str) -> None:
    """Run ``statements`` on the ledger at ``url`` in one transaction."""
    engine = create_engine(database.engine_url(url), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for sql in statements:
                conn.execute(text(sql))
    finally:
        engine.dispose()


def schema_of(url: str) -> dict[str, list[str]]:
    """The ledger's tables and their columns, whichever database it is."""
    engine = create_engine(database.engine_url(url), poolclass=NullPool)
    try:
        found = inspect(engine)
        return {table: [c["name"] for c in found.get_columns(table)] for table in found.get_table_names()}
    finally:
        engine.dispose()


def _json(value):
    """A JSON column as stored: SQLite hands back its text, psycopg the value."""
    return json.loads(value) if isinstance(value, str) else value


def _copy_ledger(together, tmp_path: Path) -> str:
    """A copy of the module's ledger to change: the file, or a database made from it."""
    if together["backend"] == "sqlite":
        shutil.copy(together["db"], tmp_path / "copy.db")
        return f"sqlite:///{tmp_path / 'copy.db'}"
    server = together["server"]
    return server.url(server.new_database(template=together["db"]))


# --------------------------------------------------------------------------- two real runs at once


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def together(request, tmp_path_factory):
    """Two real ``harness run`` of two experiments, started at the same moment on one
    new ledger (which neither has created yet)."""
    root = tmp_path_factory.mktemp(f"together-{request.param}")
    server = None
    if request.param == "sqlite":
        db = root / "r.db"
        url = f"sqlite:///{db}"
    else:
        server = request.getfixturevalue("postgres_server")
        db = server.new_database()
        url = server.url(db)
    specs = {}
    for name, hyp in HYPOTHESES.items():
        (root / name).mkdir()
        specs[name] = write_spec(root / name / "hypotheses.yaml", engine={"preset": "demo"},
                                 benchmark=SMALL_BENCH, defaults=DEFAULTS, hypotheses=[hyp])
    procs = {name: subprocess.Popen([*HARNESS, "run", str(spec), "--no-calibration", "--json", "--ledger", url,
                                     "--journal-dir", str(root / "exp")], cwd=root / name,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True) for name, spec in specs.items()}
    outs = {}
    try:
        for name, proc in procs.items():
            outs[name] = proc.communicate(timeout=600)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
    for name, proc in procs.items():
        assert proc.returncode == 0, outs[name][1][-3000:]
    yield {"backend": request.param, "root": root, "url": url, "db": db, "server": server, "specs": specs,
           "outs": outs, "answers": {name: last_json(out) for name, (out, _err) in outs.items()}}
    if server is not None:
        server.drop_database(db)


@pytest.mark.slow
def test_two_runs_at_once_lose_nothing_and_keep_their_rounds_apart(together):
    url, answers = together["url"], together["answers"]
    assert rows(url, "SELECT key, value FROM meta") == [("schema_version", str(SCHEMA_VERSION))]  # made once
    runs = dict(rows(url, "SELECT id, status FROM runs"))
    assert sorted(runs) == sorted(a["run_id"] for a in answers.values()) and set(runs.values()) == {"done"}
    for name, answer in answers.items():
        run_id, (hyp,) = answer["run_id"], answer["hypotheses"]
        assert hyp["id"] == HYPOTHESES[name]["id"]
        (hid, base_cfg, treat_cfg), = rows(url, "SELECT id, baseline_config_id, treatment_config_id FROM hypotheses "
                                                "WHERE run_id = :r", {"r": run_id})
        # lose nothing: every boot the run reported is there with every sample it measured
        ok = dict(rows(url, "SELECT config_id, COUNT(*) FROM boots WHERE run_id = :r AND status = 'ok' "
                            "GROUP BY config_id", {"r": run_id}))
        assert (ok.get(base_cfg), ok.get(treat_cfg)) == (hyp["boots"]["baseline"], hyp["boots"]["treatment"])
        per_boot = rows(url, "SELECT b.id, COUNT(s.id) FROM boots b LEFT JOIN samples s ON s.boot_id = b.id "
                             "WHERE b.run_id = :r AND b.status = 'ok' GROUP BY b.id", {"r": run_id})
        assert per_boot and all(n == DEFAULTS["samples_per_boot"] for _b, n in per_boot), per_boot
        # never interleaved: each config's boots are numbered 1..n, and the run's rounds are its own boots
        for cfg in (base_cfg, treat_cfg):
            seqs = [s for (s,) in rows(url, "SELECT seq FROM boots WHERE config_id = :c ORDER BY seq", {"c": cfg})]
            assert seqs == list(range(1, len(seqs) + 1)), seqs
        finals = rows(url, "SELECT outcome, baseline_boot_ids, treatment_boot_ids FROM verdicts "
                           "WHERE hypothesis_id = :h AND final", {"h": hid})
        assert [f[0] for f in finals] == [hyp["verdict"]]
        owner = dict(rows(url, "SELECT id, config_id FROM boots WHERE run_id = :r", {"r": run_id}))
        (_outcome, base_ids, treat_ids), = finals
        assert {owner.get(i) for i in _json(base_ids)} == {base_cfg}
        assert {owner.get(i) for i in _json(treat_ids)} == {treat_cfg}
    assert not rows(url, "SELECT b.id FROM boots b JOIN configs c ON c.id = b.config_id WHERE b.run_id <> c.run_id")


@pytest.mark.slow
def test_journal_and_export_read_both_runs_back(together, tmp_path):
    """Each run's journal, rendered again from the ledger (in this process: the command
    is one call of ``journal.write``), and ``harness ledger export`` of both runs."""
    url = together["url"]
    with Ledger(url) as led:
        for name, answer in together["answers"].items():
            body = journal.write(led, led.run(answer["run_id"]), tmp_path / "j").read_text()
            assert HYPOTHESES[name]["id"] in body and answer["hypotheses"][0]["verdict"] in body
    proc = harness("ledger", "export", "--format", "csv", "--out", tmp_path / "x", "--ledger", url)
    assert proc.returncode == 0, proc.stderr
    with (tmp_path / "x" / "boots.csv").open() as fh:
        boots = [(int(r["boot_id"]), int(r["run_id"]), r["status"]) for r in csv.DictReader(fh)]
    assert boots == rows(url, "SELECT id, run_id, status FROM boots ORDER BY id")
    with (tmp_path / "x" / "samples.csv").open() as fh:
        samples = [(int(r["sample_id"]), float(r["metric.tok_s"])) for r in csv.DictReader(fh)]
    stored = rows(url, "SELECT id, metrics FROM samples ORDER BY id")
    assert [s for s, _v in samples] == [s for s, _m in stored]
    assert [v for _s, v in samples] == pytest.approx([_json(m)["tok_s"] for _s, m in stored], rel=1e-12)


@pytest.mark.slow
def test_the_html_report_reads_both_runs_back(together, tmp_path):
    """``harness report`` on the ledger: the index lists both runs, and each run's page
    shows its hypothesis with the verdict the ledger holds."""
    proc = harness("report", "--ledger", together["url"], "--out", tmp_path / "site")
    assert proc.returncode == 0, proc.stderr
    index = (tmp_path / "site" / "index.html").read_text()
    for name, answer in together["answers"].items():
        run_id = answer["run_id"]
        assert f'href="runs/{run_id}.html"' in index, index[:3000]
        page = (tmp_path / "site" / "runs" / f"{run_id}.html").read_text()
        (stored,) = rows(together["url"], "SELECT v.outcome FROM verdicts v JOIN hypotheses h ON h.id = v.hypothesis_id "
                                          "WHERE h.run_id = :run AND v.final", {"run": run_id})
        assert HYPOTHESES[name]["id"] in page and stored[0] in page


def _downgrade_to_v1(url: str) -> None:
    """The ledger as schema version 1 left it: every column a migration adds dropped
    (read from ``MIGRATIONS``, as ``test_concurrency._v1_ledger`` does on SQLite)."""
    drops = []
    for statements in ledger_mod.MIGRATIONS.values():
        for statement in statements:
            _alter, _table, table, _add, _column, column, *_type = statement.split()
            drops.append(f"ALTER TABLE {table} DROP COLUMN {column}")
    execute(url, "DROP INDEX ix_configs_series", *drops, "UPDATE meta SET value = '1' WHERE key = 'schema_version'")


@pytest.mark.slow
def test_an_older_ledger_is_upgraded_and_its_runs_render_and_resume(together, tmp_path):
    """A copy of the module's ledger taken back to schema 1, with one run cut short
    before its final look: the journal of the other renders (its warnings read as
    the older harness wrote them), and ``--resume`` takes the cut run up and decides it
    from the boots it had, booting none (its budget is spent)."""
    url = _copy_ledger(together, tmp_path)
    try:
        done, cut = together["answers"]["regression"]["run_id"], together["answers"]["attention"]["run_id"]
        boots_before = rows(url, "SELECT COUNT(*) FROM boots")
        execute(url, f"DELETE FROM verdicts WHERE final AND hypothesis_id IN "
                     f"(SELECT id FROM hypotheses WHERE run_id = {cut})",
                f"UPDATE runs SET status = 'interrupted', finished_at = NULL WHERE id = {cut}")
        _downgrade_to_v1(url)
        assert "findings" not in schema_of(url)["verdicts"]
        with Ledger(url) as led:  # upgraded on this open
            assert rows(url, "SELECT value FROM meta") == [(str(SCHEMA_VERSION),)]
            assert [v.findings for v in led.run(done).hypotheses[0].verdicts] == [None] * len(
                led.run(done).hypotheses[0].verdicts)  # what they found is read from their sentences
            page = journal.write(led, led.run(done), tmp_path / "j").read_text()
        assert together["answers"]["regression"]["hypotheses"][0]["verdict"] in page
        spec = together["specs"]["attention"]
        resumed = harness("run", spec, "--resume", cut, "--no-calibration", "--json", "--ledger", url,
                          "--journal-dir", tmp_path / "j", cwd=spec.parent, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        (hyp,) = last_json(resumed.stdout)["hypotheses"]
        assert hyp["verdict"] == together["answers"]["attention"]["hypotheses"][0]["verdict"]
        assert rows(url, "SELECT status FROM runs WHERE id = :r", {"r": cut}) == [("done",)]
        assert rows(url, "SELECT COUNT(*) FROM boots") == boots_before  # nothing booted again
        assert rows(url, "SELECT COUNT(*) FROM verdicts v JOIN hypotheses h ON h.id = v.hypothesis_id "
                         "WHERE h.run_id = :r AND v.final", {"r": cut}) == [(1,)]
        (host,), = rows(url, "SELECT host FROM runs WHERE id = :r", {"r": cut})
        assert len(_json(host)["resumed"]) == 1
    finally:
        if together["backend"] == "postgres":
            together["server"].drop_database(database.engine_url(url).database)


@pytest.mark.slow
def test_the_url_password_is_never_stored_or_printed(together, tmp_path):
    if together["backend"] != "postgres":
        pytest.skip("a SQLite URL has no password")
    url, password = together["url"], together["server"].password
    for table in schema_of(url):
        for (row,) in rows(url, f"SELECT row_to_json(t)::text FROM {table} t"):
            assert password not in row, (table, row[:300])
    outputs = [out + err for out, err in together["outs"].values()]
    listed = harness("ledger", "list", "--ledger", url)
    assert listed.returncode == 0 and "harness:***@127.0.0.1" in " ".join(listed.stdout.split()), listed.stdout
    errors = []
    port = together["server"].port
    for wrong in (url.rsplit("/", 1)[0] + "/no_such_database", url.replace(f":{port}/", f":{free_port()}/")):
        with pytest.raises(UserError) as refused:  # no database of that name; no server at that port
            Ledger(wrong)
        errors.append(str(refused.value))
    with Ledger(url) as led, pytest.raises(UserError) as missing:
        led.run(999)
    errors.append(str(missing.value))
    assert "no_such_database" in errors[0] and "no run 999" in errors[2], errors
    for out in (*outputs, listed.stdout + listed.stderr, *errors):
        assert password not in out, out[-1500:]
    for path in together["root"].rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path


# --------------------------------------------------------------------------- a run held by one harness


def test_a_held_run_is_refused_naming_its_holder_and_freed_when_the_holder_dies(ledger_url, tmp_path):
    """A run held by another process (a harness mid-resume) is refused to ``harness run
    --resume`` naming that process, exactly as on SQLite; a held ``running`` row is left
    alone by a later open; once the holder is SIGKILLed the lock is free (the kernel
    closed the file, the server the connection) and the row is marked interrupted."""
    spec_path = write_spec(tmp_path / "hypotheses.yaml", engine={"preset": "demo"}, benchmark=SMALL_BENCH,
                           defaults=DEFAULTS, hypotheses=[HYPOTHESES["attention"]])
    text_ = spec_path.read_text()
    with Ledger(ledger_url) as led:
        cut = led.add(Run(kind="run", spec_path=str(spec_path), spec_text=text_, spec_hash=spec_hash(text_),
                          harness_version="t", status="interrupted"))
        live = led.add(Run(kind="run", spec_path="other.yaml", spec_text="", spec_hash="x", harness_version="t",
                           status="running", host={liveness.OWNER_KEY: {"pid": 1, "hostname": "elsewhere.invalid",
                                                                        "create_time": 0.0}}))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom bisect_harness.record import runlock\n"
         f"locks = [runlock.hold({ledger_url!r}, {cut.id}), runlock.hold({ledger_url!r}, {live.id})]\n"
         "print('held', flush=True)\ntime.sleep(120)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        who = rf"run {cut.id} is still running \(harness pid {holder.pid} on {socket.gethostname()}\)"
        with pytest.raises(runlock.RunHeld, match=who):
            runlock.hold(ledger_url, cut.id)
        refused = harness("run", spec_path, "--resume", cut.id, "--no-calibration", "--ledger", ledger_url,
                          "--journal-dir", tmp_path / "exp", cwd=tmp_path, timeout=120)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert (f"run {cut.id} is still running (harness pid {holder.pid} on {socket.gethostname()})"
                in " ".join(refused.stderr.split())), refused.stderr
        assert "Traceback" not in refused.stderr
        with Ledger(ledger_url) as again:
            assert again.run(live.id).status == "running"  # held: left alone, its owner on "another host"
            assert again.run(cut.id).status == "interrupted"  # the refused resume changed nothing
    finally:
        os.killpg(holder.pid, 9)
        holder.wait(timeout=10)
    assert runlock.left_free(ledger_url, live.id)
    with Ledger(ledger_url) as again:
        row = again.run(live.id)
        assert row.status == "interrupted" and "let go of it without recording its end" in row.error
    lock = runlock.hold(ledger_url, cut.id)  # free again
    assert lock.held
    lock.release()


# --------------------------------------------------------------------------- the schema, on PostgreSQL


def _open_ledger(barrier, url):
    barrier.wait()
    Ledger(url).close()


def test_four_processes_open_one_new_postgres_ledger_at_once(postgres_server):
    results = []
    for _trial in range(5):
        url = postgres_server.url(postgres_server.new_database())
        results += released_together(_open_ledger, [(url,)] * 4)
        assert rows(url, "SELECT key, value FROM meta") == [("schema_version", str(SCHEMA_VERSION))]
    failed = [(code, err) for code, err in results if code != 0]
    assert len(results) == 20 and failed == [], failed[0][1][-1500:]


def test_a_newer_postgres_ledger_is_refused_with_the_version_it_needs(postgres_server):
    url = postgres_server.url(postgres_server.new_database())
    Ledger(url).close()
    execute(url, "UPDATE meta SET value = '99'", "DROP TABLE bisect_probes")
    with pytest.raises(UserError, match=rf"schema version 99, newer than this harness understands "
                                        rf"\({SCHEMA_VERSION}\)"):
        Ledger(url)
    assert "bisect_probes" not in schema_of(url)


def test_a_bare_postgresql_url_uses_psycopg_and_a_missing_driver_names_the_extra(postgres_server, tmp_path):
    name = postgres_server.new_database()
    bare = postgres_server.url(name, driver="postgresql")
    with Ledger(bare) as led:
        assert led.engine.dialect.driver == "psycopg"
        assert postgres_server.password not in led.shown and "***" in led.shown
    blocked = subprocess.run(
        [sys.executable, "-c", "import sys\nsys.modules['psycopg'] = None  # as if never installed\n"
         "from bisect_harness.cli import main\nmain(sys.argv[1:])", "ledger", "list", "--ledger", bare],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
    said = " ".join(blocked.stderr.split())
    assert blocked.returncode == 2, blocked.stderr[-2000:]
    assert "pip install 'bisect-harness[postgres]'" in said and "Traceback" not in said
    assert postgres_server.password not in blocked.stdout + blocked.stderr


def test_the_server_fixture_leaves_nothing_running():
    """Another server of this session's kind, started and stopped: no process of its
    group and no folder outlive it."""
    server = PostgresServer()
    try:
        server.start()
    except (ServerUnavailable, ImportError) as exc:  # the reasons the session fixture skips for
        if os.environ.get("BISECT_HARNESS_REQUIRE_POSTGRES") == "1":
            raise
        pytest.skip(f"no PostgreSQL server on this host: {exc}")
    group, root = server.proc.pid, server.root
    assert server.leftovers()
    server.stop()
    assert server.leftovers() == [] and not root.exists(), group


def test_what_postgres_cannot_hold_is_stored_as_near_as_it_can(postgres_server):
    """A NUL in a text column (a server's log tail) and NaN or Infinity in a JSON one
    (PostgreSQL's text and json have neither) would make the server refuse the row:
    the NUL becomes U+FFFD, the number null, and the rest of the row is written."""
    url = postgres_server.url(postgres_server.new_database())
    with Ledger(url) as led:
        run = led.add(Run(kind="run", spec_path="h.yaml", spec_text="", spec_hash="x", harness_version="t",
                          status="done", error="engine said \x00 and died",
                          summary={"values": [float("nan"), 1.5], "top": float("-inf")}))
    with Ledger(url) as led:
        row = led.run(run.id)
        assert row.error == f"engine said {database.NUL_STAND_IN} and died"
        assert row.summary == {"values": [None, 1.5], "top": None}


def test_a_migration_that_fails_half_way_leaves_the_ledger_as_it_was(ledger_url, monkeypatch):
    """Both databases run a migration in the one transaction that read the version: a
    statement that fails after the first ``ALTER`` leaves a schema-1 ledger as it was
    (PostgreSQL, like SQLite, rolls DDL back), and the next open migrates the whole way."""
    Ledger(ledger_url).close()
    _downgrade_to_v1(ledger_url)
    first = ledger_mod.MIGRATIONS[2][0]
    monkeypatch.setitem(ledger_mod.MIGRATIONS, 2, (first, "SELECT no_such_function()"))
    with pytest.raises(ledger_mod.InfrastructureError, match=rf"from schema version 1 to {SCHEMA_VERSION}: .*no_such_function.*; the ledger was left as it was"):
        Ledger(ledger_url)
    assert rows(ledger_url, "SELECT value FROM meta") == [("1",)]
    assert "series" not in schema_of(ledger_url)["configs"]
    monkeypatch.undo()
    Ledger(ledger_url).close()
    assert rows(ledger_url, "SELECT value FROM meta") == [(str(SCHEMA_VERSION),)]
    assert {"series", "summary", "findings", "point"} <= {c for cols in schema_of(ledger_url).values() for c in cols}
