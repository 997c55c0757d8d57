"""One environment per commit, through the real ``harness run``.

An engine installed as a package (``pip install -e python``, as SGLang's example
builds it), two commits whose servers report different versions, boots
interleaved over two rounds (each round both commits, in a shuffled order). With an environment per commit (the
default whenever a build is declared) every boot of each arm reports its own
commit's version. With one shared environment the harness reproduces the bug
the per-commit environment fixes (from round two, both arms import the last
commit installed), and the version guard flags the verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import diff_snapshots, harness, last_json, query, snapshot_checkout, write_spec
from packaged_engine import BUILD, LAUNCH, make_packaged_engine

pytestmark = pytest.mark.slow

VERSIONS = ("1.0.0", "2.0.0")


def _spec(tmp_path, engine_extra=None):
    engine = {"preset": "openai", "repo": "engine", "build": BUILD, "launch": LAUNCH,
              "health": "/health", "server_info": "/server_info", "ready_timeout_s": 60, **(engine_extra or {})}
    return write_spec(
        tmp_path / "hypotheses.yaml", engine=engine,
        benchmark={"model": "tiny", "prompt_tokens": 8, "output_tokens": 8, "requests_per_sample": 2,
                   "warmup_requests": 1, "ignore_eos": False},
        defaults={"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 2},
        hypotheses=[{"id": "new-version", "statement": "2.0.0 is at least 10% faster than 1.0.0",
                     "baseline": {"commit": "HEAD~1"}, "treatment": {"commit": "HEAD"},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%"}])


def _run(tmp_path, spec):
    db = tmp_path / "r.db"
    proc = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                   "--journal-dir", tmp_path / "exp", "--cache-dir", tmp_path / "cache", cwd=tmp_path, timeout=400,
                   env={**os.environ, "PIP_NO_INDEX": "1"})  # the builds must work offline
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    return db, last_json(proc.stdout)


def _boots(db):
    """(config commit, boot id, status, server-info version, provenance) in boot order."""
    rows = query(db, "SELECT c.`commit`, b.id, b.status, b.server_info, b.provenance "
                     "FROM boots b JOIN configs c ON c.id = b.config_id ORDER BY b.id")
    return [(c, i, s, (json.loads(info) or {}).get("version"), json.loads(prov)) for c, i, s, info, prov in rows]


def _importable(python: str, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def test_each_boot_runs_its_own_commit_with_an_environment_per_commit(tmp_path):
    shas = make_packaged_engine(tmp_path / "engine", VERSIONS)
    want = dict(zip(shas, VERSIONS))
    before = snapshot_checkout(tmp_path / "engine")
    db, out = _run(tmp_path, _spec(tmp_path))

    boots = _boots(db)
    assert [b[2] for b in boots] == ["ok"] * 4, boots
    # interleaved: two rounds, each boots both commits (in a shuffled order)
    assert sorted(b[0] for b in boots[:2]) == sorted(b[0] for b in boots[2:]) == sorted(shas)
    envs = {}
    for commit, boot_id, _, version, prov in boots:
        assert version == want[commit], f"boot {boot_id} of {commit[:8]} ran {version}"
        assert prov["engine_version"]["values"] == {"server_info.version": want[commit], "/version": want[commit]}
        assert prov["environment"]["mode"] == "venv"
        assert prov["environment"]["base_python"] == sys.executable
        envs.setdefault(commit, set()).add(prov["environment"]["python"])
    # one interpreter per commit, the same for every boot of it, none shared
    assert all(len(v) == 1 for v in envs.values()) and len(set.union(*envs.values())) == 2
    (h,) = out["hypotheses"]
    assert h["boots"] == {"baseline": 2, "treatment": 2}
    assert not any(w.startswith("engine version") for w in h["warnings"]), h["warnings"]
    # the build installed into the commits' environments, never into the base interpreter
    assert not _importable(sys.executable, "tinyengine")
    for (python,) in envs.values():
        assert _importable(python, "tinyengine")
    # the launch argv names the commit's interpreter
    for commit, argv in query(db, "SELECT c.`commit`, b.argv FROM boots b JOIN configs c ON c.id = b.config_id"):
        assert [json.loads(argv)[0]] == list(envs[commit])
    assert diff_snapshots(before, snapshot_checkout(tmp_path / "engine")) == []
    (journal,) = (tmp_path / "exp").glob("*-run*.md")
    text = journal.read_text()
    for commit, (python,) in envs.items():
        assert f"- python: `{python}` (the commit's own venv over `{sys.executable}`)" in text
        assert f"- the server reported its code as: {want[commit]} (/version), {want[commit]} (server_info.version)" \
            in text
    assert "engine versions differ" not in text


def test_shared_environment_reproduces_the_bug_and_the_version_guard_flags_it(tmp_path):
    shas = make_packaged_engine(tmp_path / "engine", VERSIONS)
    # A throwaway base environment, so the shared build cannot touch the interpreter running the tests.
    base = tmp_path / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(base)], check=True)
    spec = _spec(tmp_path, {"python": "base/bin/python", "environment": "shared"})
    db, out = _run(tmp_path, spec)

    boots = _boots(db)
    # two rounds, each boots both commits; the order inside a round is shuffled
    first, second = boots[0][0], boots[1][0]
    assert sorted((first, second)) == sorted(b[0] for b in boots[2:]) == sorted(shas)
    version = dict(zip(shas, VERSIONS))
    # round one: each commit freshly installed; round two: the builds are cached, so
    # both commits' boots import the last commit installed
    assert [b[3] for b in boots] == [version[first], version[second], version[second], version[second]]
    assert all(b[4]["environment"] == {"mode": "shared", "python": str(base / "bin" / "python"), "venv": None,
                                       "base_python": str(base / "bin" / "python")} for b in boots)
    (h,) = out["hypotheses"]
    flagged = [w for w in h["warnings"] if w.startswith("engine version")]
    assert len(flagged) == 1, h["warnings"]
    side = "baseline" if first == shas[0] else "treatment"  # the commit installed first is the mixed one
    assert flagged[0].startswith(f"engine version: {side} boots report different code")
    mixed = [b[1] for b in boots if b[0] == first]
    old, new = version[first], version[second]
    assert f"{old} (/version), {old} (server_info.version) in boot {mixed[0]}" in flagged[0]
    assert f"{new} (/version), {new} (server_info.version) in boot {mixed[1]}" in flagged[0]
    (journal,) = (tmp_path / "exp").glob("*-run*.md")
    text = journal.read_text()
    assert "engine versions differ x1" in text
    assert f"- python: `{base / 'bin' / 'python'}` (shared by every commit)" in text
    assert f"- warning: {flagged[0]}" in text
    assert f"- the server reported its code as: {old} (/version), {old} (server_info.version): boot {mixed[0]}; " \
           f"{new} (/version), {new} (server_info.version): boot {mixed[1]}" in text
