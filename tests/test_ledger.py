"""The ledger: versioned schema, older ledgers upgraded in place, newer ones refused."""

from __future__ import annotations

import sqlite3

import pytest

from bisect_harness.errors import UserError
from bisect_harness.record.ledger import SCHEMA_VERSION, Config, Ledger, Run

V1_SCHEMA = """
CREATE TABLE meta (key VARCHAR(64) PRIMARY KEY, value TEXT);
INSERT INTO meta VALUES ('schema_version', '1');
CREATE TABLE runs (id INTEGER PRIMARY KEY, kind VARCHAR(16), created_at DATETIME, finished_at DATETIME,
  status VARCHAR(16), spec_path TEXT, spec_text TEXT, spec_hash VARCHAR(64), harness_version VARCHAR(32),
  host JSON, error TEXT);
CREATE TABLE configs (id INTEGER PRIMARY KEY, run_id INTEGER REFERENCES runs(id), key VARCHAR(64), label TEXT,
  "commit" VARCHAR(64), env JSON, flags JSON, argv JSON, status VARCHAR(16), failure TEXT, log_tail TEXT);
INSERT INTO runs VALUES (1, 'run', '2026-01-01 00:00:00', NULL, 'done', 'h.yaml', 'x', 'abc', '0.1.0', '{}', NULL);
INSERT INTO configs VALUES (1, 1, 'k1', 'HEAD', 'deadbeef', '{}', '{}', '[]', 'ok', NULL, NULL);
"""


def test_new_ledger_records_its_version(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}"):
        pass
    db = sqlite3.connect(tmp_path / "r.db")
    assert db.execute("select value from meta where key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_older_ledger_is_upgraded_and_keeps_its_rows(tmp_path):
    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript(V1_SCHEMA)
    db.close()
    with Ledger(f"sqlite:///{tmp_path / 'old.db'}") as led:
        assert led.run(1).spec_path == "h.yaml"
        cfg = led.session.get(Config, 1)
        assert cfg.commit == "deadbeef" and cfg.series is None
        led.add(Run(kind="nightly", spec_path="n.yaml", spec_text="", spec_hash="h", harness_version="x",
                    summary={"status": "ok"}))
    db = sqlite3.connect(tmp_path / "old.db")
    assert db.execute("select value from meta where key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)


def test_newer_ledger_is_refused(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}"):
        pass
    db = sqlite3.connect(tmp_path / "r.db")
    db.execute("update meta set value = ? where key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    db.commit()
    db.close()
    with pytest.raises(UserError, match="newer than this harness"):
        Ledger(f"sqlite:///{tmp_path / 'r.db'}")


def test_bad_url_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="--ledger"):
        Ledger("nosuchdialect://x")


def test_sides_from_runs_whose_calibration_differs_get_a_drift(tmp_path):
    import copy

    from bisect_harness.observe.calibration import calibrate
    from bisect_harness.observe.drift import host_drift
    from bisect_harness.record.ledger import Boot, Calibration, boot_records
    from bisect_harness.observe.provenance import collect_host

    host = collect_host().to_dict()
    fast = calibrate("cpu", 0.2).to_dict()
    slow = copy.deepcopy(fast)
    for m in slow["measurements"]:
        m["median"] *= 0.6
        m["values"] = [v * 0.6 for v in m["values"]]
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        boots = []
        for cal in (fast, slow):
            run = led.add(Run(spec_path="h.yaml", spec_text="", spec_hash="h", harness_version="x"))
            led.add(Calibration(run_id=run.id, phase="before", result=cal))
            cfg = led.add(Config(run_id=run.id, key="k"))
            boots.append(led.add(Boot(run_id=run.id, config_id=cfg.id, config_key="k", seq=1, status="ok",
                                      provenance={"host": host})))
        led.session.expire_all()
        fast_boot, slow_boot = boot_records(boots)
        drifts = host_drift([fast_boot], [slow_boot])
        assert any(d.field.startswith("calibration") for d in drifts), drifts
        assert host_drift([fast_boot], [fast_boot]) == []  # same run, same host: nothing to say


def test_only_finished_boots_of_the_same_config_on_the_same_host_are_reusable(tmp_path):
    """What a bisection may reuse from earlier runs: ok boots (busy-marked ones included, as
    host_check "mark" counts them), never excluded, failed or running boots, another config's
    or another host's."""
    from bisect_harness.record.ledger import Boot

    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = led.add(Run(spec_path="h.yaml", spec_text="", spec_hash="h", harness_version="x"))
        cfg = led.add(Config(run_id=run.id, key="k"))
        other = led.add(Config(run_id=run.id, key="k2"))

        def boot(seq, status, *, key="k", host="h1", marks=()):
            return led.add(Boot(run_id=run.id, config_id=(cfg if key == "k" else other).id, config_key=key,
                                seq=seq, status=status, host_fingerprint=host, marks=list(marks)))

        ok = boot(1, "ok")
        busy_ok = boot(2, "ok", marks=["host_busy"])
        boot(3, "excluded", marks=["host_busy"])
        boot(4, "failed")
        boot(5, "running")
        boot(6, "ok", host="h2")
        boot(7, "ok", key="k2")
        assert [b.id for b in led.reusable_boots("k", "h1")] == [ok.id, busy_ok.id]
        assert len(led.reusable_boots("k", None)) == 3  # no fingerprint: any host's
