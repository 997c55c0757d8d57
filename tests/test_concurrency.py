"""Several harness processes on one ledger or one cache, and runs that died.

Real processes (forked, released together by a barrier), a real SQLite file, a
real git repository and real virtual environments in temp folders.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine, event

from bisect_harness.record import ledger as ledger_mod
from bisect_harness.engines.checkout import Workspace
from bisect_harness.record.ledger import Boot, Config, Ledger, Run
from bisect_harness.record.liveness import OWNER_KEY, owner_record
from helpers import FORK, HARNESS, git, query, released_together



def _open_ledger(barrier, url):
    barrier.wait()
    Ledger(url).close()


def test_four_processes_open_one_new_ledger_at_once_twenty_times(tmp_path):
    results = []
    for trial in range(20):
        url = f"sqlite:///{tmp_path / f'ledger-{trial}.db'}"
        results += released_together(_open_ledger, [(url,)] * 4)
        assert query(tmp_path / f"ledger-{trial}.db", "SELECT value FROM meta WHERE key = 'schema_version'") == \
            [(str(ledger_mod.SCHEMA_VERSION),)]
    failed = [(code, err) for code, err in results if code != 0]
    assert len(results) == 80 and failed == [], failed[0][1][-1500:]


def _repo(path: Path) -> list[str]:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    shas = []
    for n in range(3):
        for i in range(100):
            (path / f"m{i:03d}.py").write_text(f"VALUE = {n}\n" * 20)
        git(path, "add", ".")
        git(path, "commit", "-q", "-m", f"c{n}")
        shas.append(git(path, "rev-parse", "HEAD").strip())
    return shas


def _make_tree_and_env(barrier, repo, cache, sha):
    ws = Workspace(repo, cache_dir=cache)
    barrier.wait()
    tree = ws.worktree(sha)
    assert git(tree, "rev-parse", "HEAD").strip() == sha
    env = ws.environment(sha, sys.executable)
    out = subprocess.run([env.python, "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == str(env.venv)


@pytest.mark.parametrize("same_commit", [True, False], ids=["same-commit", "three-commits"])
def test_three_processes_make_worktrees_and_envs_on_one_new_cache(tmp_path, same_commit):
    shas = _repo(tmp_path / "repo")
    picks = [shas[-1]] * 3 if same_commit else shas
    results = released_together(_make_tree_and_env, [(tmp_path / "repo", tmp_path / "cache", sha) for sha in picks])
    assert [code for code, _ in results] == [0, 0, 0], [e for _, e in results if e][:1]
    ws = Workspace(tmp_path / "repo", cache_dir=tmp_path / "cache")
    listed = git(ws.mirror_path, "worktree", "list", "--porcelain")
    assert all(sha in listed for sha in set(picks))
    assert not list(ws.root.glob("mirror.tmp-*")) and not list(ws.envs.glob("*.tmp-*"))


def _dead_owner() -> dict:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = {"pid": proc.pid, "hostname": socket.gethostname(), "create_time": 1.0}
    proc.wait()
    return owner


def _running_run(led: Ledger, owner: dict | None) -> tuple[int, int]:
    host = {"hostname": socket.gethostname()}
    if owner is not None:
        host[OWNER_KEY] = owner
    run = led.add(Run(kind="run", spec_path="h.yaml", spec_text="", spec_hash="x", harness_version="t", host=host))
    cfg = led.add(Config(run_id=run.id, key="k", label="a"))
    boot = led.add(Boot(run_id=run.id, config_id=cfg.id, config_key="k", seq=1))
    return run.id, boot.id


def test_a_running_row_of_a_dead_process_is_marked_interrupted_on_the_next_open(tmp_path):
    db = tmp_path / "r.db"
    with Ledger(f"sqlite:///{db}") as led:
        dead = _running_run(led, _dead_owner())
        live = _running_run(led, owner_record())    # this very process: a concurrent live run
        elsewhere = _running_run(led, {**_dead_owner(), "hostname": "another-host.invalid"})
        unknown = _running_run(led, None)            # an older harness's row: nothing to go by
    with Ledger(f"sqlite:///{db}"):
        pass
    status = dict(query(db, "SELECT id, status FROM runs"))
    boots = dict(query(db, "SELECT id, status FROM boots"))
    assert status[dead[0]] == "interrupted" and boots[dead[1]] == "interrupted"
    (error,), = query(db, "SELECT error FROM runs WHERE id = ?", (dead[0],))
    assert "is gone" in error
    for run_id, boot_id in (live, elsewhere, unknown):
        assert status[run_id] == "running" and boots[boot_id] == "running"


def _v1_ledger(db: Path) -> None:
    """A ledger as schema version 1 made it: every column a migration adds, dropped
    (read from ``MIGRATIONS`` itself, so a new migration is undone here too)."""
    Ledger(f"sqlite:///{db}").close()
    drops = []
    for statements in ledger_mod.MIGRATIONS.values():
        for statement in statements:
            _alter, _table, table, _add, _column, column, *_type = statement.split()
            drops.append(f"ALTER TABLE {table} DROP COLUMN {column};")
    con = sqlite3.connect(db)
    con.executescript("DROP INDEX ix_configs_series; " + " ".join(drops) +
                      " UPDATE meta SET value = '1' WHERE key = 'schema_version';")
    con.close()


def _migrate_and_die(db: Path) -> None:
    """Open a v1 ledger, dying (SIGKILL-like) between the migration's two ALTERs."""
    event.listen(Engine, "connect", lambda c, _r: c.create_function("harness_die", 0, lambda: os._exit(9)))
    first = ledger_mod.MIGRATIONS[2][0]
    ledger_mod.MIGRATIONS[2] = (first, "SELECT harness_die()")
    Ledger(f"sqlite:///{db}")


def test_a_migration_killed_between_its_alters_leaves_the_ledger_as_it_was(tmp_path):
    db = tmp_path / "old.db"
    _v1_ledger(db)
    child = FORK.Process(target=_migrate_and_die, args=(db,))
    child.start()
    child.join(60)
    assert child.exitcode == 9
    assert query(db, "SELECT value FROM meta") == [("1",)]
    assert "series" not in [r[1] for r in query(db, "PRAGMA table_info(configs)")]
    with Ledger(f"sqlite:///{db}"):  # the next open migrates the whole way
        pass
    assert query(db, "SELECT value FROM meta") == [(str(ledger_mod.SCHEMA_VERSION),)]
    assert "summary" in [r[1] for r in query(db, "PRAGMA table_info(runs)")]


def test_a_newer_ledger_is_refused_before_anything_is_written(tmp_path):
    db = tmp_path / "new.db"
    Ledger(f"sqlite:///{db}").close()
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value = '99'")
    con.execute("DROP TABLE bisect_probes")
    con.commit()
    con.close()
    with pytest.raises(ledger_mod.UserError, match="schema version 99"):
        Ledger(f"sqlite:///{db}")
    tables = [r[0] for r in query(db, "SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert "bisect_probes" not in tables


@pytest.mark.parametrize("argv", [["ledger", "list"], ["ledger", "show", "1"], ["journal"]],
                         ids=["ledger-list", "ledger-show", "journal"])
def test_read_only_commands_refuse_a_missing_ledger_and_create_nothing(tmp_path, argv):
    proc = subprocess.run([*HARNESS, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert "--ledger" in proc.stderr and "results.db" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_loopback_calls_ignore_a_proxy(tmp_path, monkeypatch):
    """fetch_server_info on 127.0.0.1 with HTTP_PROXY set to a dead proxy still answers."""
    import http.server
    import threading

    from bisect_harness.backends.procedure import fetch_server_info

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"version": "1"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(var, "http://127.0.0.1:9")  # the discard port: nothing listens
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert fetch_server_info(f"http://127.0.0.1:{srv.server_port}", ["/version"]) == {"version": "1"}
    finally:
        srv.shutdown()
