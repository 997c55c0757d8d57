"""A checkout is checked before it is used (issue: "what ran is what was asked").

Each fault as it was found: ``trees/<A>`` replaced with a copy of commit B's tree,
a tracked file of A's worktree replaced with a link to B's, a file of A's own
environment changed to B's, and a checkout changed while its boot ran. Real git,
real files, and for the boots a real server (``packaged_engine``) booted through
``run_boot``, whose reported version says which commit's code it imported.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from bisect_harness.backends.procedure import run_boot
from bisect_harness.boot import Sink
from bisect_harness.engines import integrity
from bisect_harness.engines.checkout import Workspace
from bisect_harness.plan.build import make_plan
from bisect_harness.spec import load_spec
from helpers import git, write_spec
from packaged_engine import LAUNCH, make_packaged_engine


@pytest.fixture
def repo(tmp_path):
    """Two commits: VERSION 1 then VERSION 2, and a folder of a few files."""
    repo = tmp_path / "engine"
    (repo / "src").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for v in ("1", "2"):
        (repo / "VERSION").write_text(v + "\n")
        for i in range(5):
            (repo / "src" / f"m{i}.py").write_text(f"VERSION = {v}\nI = {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"version {v}")
    return repo


def _shas(ws):
    return ws.resolve("HEAD~1"), ws.resolve("HEAD")


def test_a_tree_replaced_by_a_copy_of_another_commits_tree_is_made_again(repo, tmp_path):
    ws = Workspace(repo, tmp_path / "cache")
    a, b = _shas(ws)
    tree_a, tree_b = ws.checkout(a, "tree"), ws.checkout(b, "tree")
    shutil.rmtree(tree_a)
    shutil.copytree(tree_b, tree_a, symlinks=True)  # a real copy, not a link: B's files under A's name
    assert (tree_a / "VERSION").read_text() == "2\n"

    again = Workspace(repo, tmp_path / "cache")  # the next run
    got = again.checkout(a, "tree")
    assert got == tree_a and (got / "VERSION").read_text() == "1\n"
    assert (got / "src" / "m3.py").read_text() == "VERSION = 1\nI = 3\n"
    (note,) = again.notes
    assert note.startswith(f"the tree checkout of {a[:12]} is not what it was made from (")
    assert "VERSION: content differs" in note and note.endswith("made it again")
    assert again.checkout(a, "tree") == got and len(again.notes) == 1  # the new one passes


def test_a_tracked_file_replaced_by_a_link_to_another_commits_file_is_made_again(repo, tmp_path):
    ws = Workspace(repo, tmp_path / "cache")
    a, b = _shas(ws)
    wt_a, wt_b = ws.checkout(a), ws.checkout(b)
    (wt_a / "VERSION").unlink()
    (wt_a / "VERSION").symlink_to(wt_b / "VERSION")
    assert (wt_a / "VERSION").read_text() == "2\n"

    got = ws.checkout(a)
    assert not (got / "VERSION").is_symlink() and (got / "VERSION").read_text() == "1\n"
    assert git(got, "rev-parse", "HEAD").strip() == a
    assert any("VERSION: a link where a file was" in n for n in ws.notes), ws.notes


@pytest.mark.parametrize("mode", ["worktree", "clone"])
def test_a_file_added_or_removed_is_a_change_and_gits_own_folder_is_not(repo, tmp_path, mode):
    ws = Workspace(repo, tmp_path / "cache")
    a, _ = _shas(ws)
    tree = ws.checkout(a, mode)
    git(tree, "status", "--porcelain")  # git's own bookkeeping (its index) is not the commit's files
    (tree / "src" / "__pycache__").mkdir()
    (tree / "src" / "__pycache__" / "m0.cpython.pyc").write_bytes(b"bytecode")  # an import's cache
    assert ws.checkout(a, mode) == tree and ws.notes == []
    (tree / "src" / "m0.py").unlink()
    (tree / "src" / "extra.py").write_text("shadow = True\n")
    ws.checkout(a, mode)
    (note,) = ws.notes
    assert "src/extra.py: added (a file)" in note and "src/m0.py: removed" in note
    assert (tree / "src" / "m0.py").is_file() and not (tree / "src" / "extra.py").exists()


def test_the_check_reads_no_file_when_the_stats_match(repo, tmp_path, monkeypatch):
    """The cost seam: ``integrity.file_digest`` is the one read of a file's content."""
    for i in range(200):
        (repo / "src" / f"more{i}.py").write_text(f"X = {i}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "more files")
    ws = Workspace(repo, tmp_path / "cache")
    sha = ws.resolve("HEAD")
    tree = ws.checkout(sha, "tree")
    read: list[str] = []
    real = integrity.file_digest
    monkeypatch.setattr(integrity, "file_digest", lambda path: read.append(path) or real(path))

    for _ in range(3):
        assert ws.checkout(sha, "tree") == tree
    assert read == [] and ws.notes == []  # 207 files, each stat'ed, none read

    os.utime(tree / "src" / "more7.py")  # its stat changed, its content did not
    ws.checkout(sha, "tree")
    assert [Path(p).name for p in read] == ["more7.py"] and ws.notes == []
    ws.checkout(sha, "tree")  # the record took the new stat: a stat again
    assert len(read) == 1

    (tree / "src" / "more9.py").write_text("X = 10\n")  # one file changed: only it is read
    read.clear()
    ws.checkout(sha, "tree")
    assert read[0].endswith("more9.py") and "src/more9.py: content differs" in ws.notes[0]
    assert (tree / "src" / "more9.py").read_text() == "X = 9\n"


# --------------------------------------------------------------------------- boots of a real server


VERSIONS = ("1.0.0", "2.0.0")
#: A build that copies the package into the commit's environment (not an editable install).
COPY_BUILD = ["{python}", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "./python"]
EDITABLE_BUILD = ["{python}", "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "python"]
#: A launch that changes a file of its checkout (its working folder), then serves.
TOUCHES_ITS_CHECKOUT = ["{python}", "-c", "import pathlib, runpy, sys; p = pathlib.Path('python/tinyengine/serve.py'); "
                        "p.write_text(p.read_text() + '# changed while it ran' + chr(10)); "
                        "sys.argv = ['serve', '--host', sys.argv[1], '--port', sys.argv[2]]; "
                        "runpy.run_module('tinyengine.serve', run_name='__main__')", "{host}", "{port}"]


class _Said(Sink):
    def __init__(self):
        self.lines: list[str] = []

    def message(self, text):
        self.lines.append(text)


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setenv("BISECT_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the builds work offline
    return make_packaged_engine(tmp_path / "engine", VERSIONS)


def _request(tmp_path, shas, *, build, launch=LAUNCH, checkout="worktree", boot_id=1):
    """The boot request of the baseline (commit A) as the scheduler makes it."""
    eng = {"preset": "openai", "repo": "engine", "build": build, "launch": launch, "checkout": checkout,
           "health": "/health", "server_info": "/server_info", "ready_timeout_s": 60}
    spec = load_spec(write_spec(
        tmp_path / "h.yaml", engine=eng,
        benchmark={"model": "tiny", "prompt_tokens": 8, "output_tokens": 8, "requests_per_sample": 2,
                   "warmup_requests": 1, "ignore_eos": False},
        defaults={"samples_per_boot": 1, "host_preflight_s": 0},
        hypotheses=[{"id": "h", "baseline": {"commit": shas[0]}, "treatment": {"commit": shas[1]},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]))
    plan = make_plan(spec)
    config = next(c for c in plan.configs if c.arm.commit == shas[0])
    return plan.boot_request(config, boot_id=boot_id, seq=boot_id, log_path=tmp_path / f"boot-{boot_id}.log")


def _version(out) -> str | None:
    return (out.server_info or {}).get("version")


@pytest.mark.slow
def test_a_tree_replaced_by_another_commits_built_tree_boots_the_commit_asked_for(tmp_path, engine):
    a, b = engine
    req = _request(tmp_path, engine, build=EDITABLE_BUILD, checkout="tree")
    first = run_boot(req)
    assert first.status == "ok" and _version(first) == "1.0.0"
    ws = Workspace(tmp_path / "engine", tmp_path / "cache")
    tree_a, tree_b = ws.checkout(a, "tree"), ws.checkout(b, "tree")
    shutil.rmtree(tree_a)
    shutil.copytree(tree_b, tree_a, symlinks=True)

    said = _Said()
    out = run_boot(_request(tmp_path, engine, build=EDITABLE_BUILD, checkout="tree", boot_id=2), said)
    assert out.status == "ok" and _version(out) == "1.0.0", (out.status, out.failure, _version(out))
    assert out.evidence.engine_version["values"]["/version"] == "1.0.0"
    assert len(said.lines) == 1 and said.lines[0].startswith(f"boot 2 (") and "made it again" in said.lines[0]
    assert out.evidence.checkout["remade"] == [said.lines[0].split("): ", 1)[1]]
    assert integrity.CHECKOUT_CHANGED not in out.marks


@pytest.mark.slow
def test_a_changed_file_of_the_commits_environment_rebuilds_it(tmp_path, engine):
    req = _request(tmp_path, engine, build=COPY_BUILD)
    first = run_boot(req)
    assert first.status == "ok" and _version(first) == "1.0.0", (first.failure, first.log_tail)
    venv = Path(first.evidence.environment["venv"])
    (installed,) = venv.glob("lib/python*/site-packages/tinyengine/__init__.py")
    installed.write_text('__version__ = "2.0.0"\n')  # B's code in A's environment

    said = _Said()
    out = run_boot(_request(tmp_path, engine, build=COPY_BUILD, boot_id=2), said)
    assert out.status == "ok" and _version(out) == "1.0.0", (out.status, out.failure, _version(out))
    assert any(f"the environment of {engine[0][:12]} is not what it was made and built as" in s
               and "tinyengine/__init__.py: content differs" in s for s in said.lines), said.lines
    assert installed.read_text() == '__version__ = "1.0.0"\n'


@pytest.mark.slow
def test_a_boot_whose_checkout_changed_while_it_ran_is_marked_and_not_counted(tmp_path, engine):
    req = _request(tmp_path, engine, build=EDITABLE_BUILD, launch=TOUCHES_ITS_CHECKOUT)
    out = run_boot(req)
    assert out.samples, out.failure  # it was measured, and its samples are kept
    assert out.status == "excluded" and integrity.CHECKOUT_CHANGED in out.marks, (out.status, out.marks)
    assert out.evidence.checkout_changed == (f"{engine[0]}: python/tinyengine/serve.py: content differs",)

    said = _Said()  # the next boot starts on the checkout made again (and changes it again)
    again = run_boot(_request(tmp_path, engine, build=EDITABLE_BUILD, launch=TOUCHES_ITS_CHECKOUT, boot_id=2), said)
    assert any("python/tinyengine/serve.py: content differs" in s and "made it again" in s for s in said.lines)
    assert again.status == "excluded" and integrity.CHECKOUT_CHANGED in again.marks


#: The same launch, changing its checkout only where the arm's env says so.
TOUCHES_WHEN_ASKED = ["{python}", "-c", "import os, pathlib, runpy, sys; p = pathlib.Path('python/tinyengine/serve.py'); "
                      "os.environ.get('BH_TOUCH') == '1' and p.write_text(p.read_text() + '# changed' + chr(10)); "
                      "sys.argv = ['serve', '--host', sys.argv[1], '--port', sys.argv[2]]; "
                      "runpy.run_module('tinyengine.serve', run_name='__main__')", "{host}", "{port}"]


@pytest.mark.slow
def test_a_run_never_counts_a_boot_whose_checkout_changed(tmp_path, engine):
    """Through ``harness run``: the treatment's server writes into its checkout on every
    boot, so none of its boots is the commit as checked out; the verdict counts none of
    them, the run says each remake, and the journal says what changed."""
    from helpers import harness, last_json, query

    eng = {"preset": "openai", "repo": "engine", "build": EDITABLE_BUILD, "launch": TOUCHES_WHEN_ASKED,
           "health": "/health", "server_info": "/server_info", "ready_timeout_s": 60}
    spec = write_spec(
        tmp_path / "h.yaml", engine=eng,
        benchmark={"model": "tiny", "prompt_tokens": 8, "output_tokens": 8, "requests_per_sample": 2,
                   "warmup_requests": 1, "ignore_eos": False},
        defaults={"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 2, "boot_retries": 0,
                  "host_preflight_s": 0},
        hypotheses=[{"id": "h", "baseline": {"commit": "HEAD~1"},
                     "treatment": {"commit": "HEAD", "env": {"BH_TOUCH": "1"}},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%"}])
    db = tmp_path / "r.db"
    proc = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir",
                   tmp_path / "exp", "--cache-dir", tmp_path / "cache", cwd=tmp_path, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    boots = query(db, "SELECT c.`commit`, b.id, b.status, b.marks, b.provenance FROM boots b "
                      "JOIN configs c ON c.id = b.config_id ORDER BY b.id")
    treatment = [(i, s, json.loads(m), json.loads(p)) for c, i, s, m, p in boots if c == engine[1]]
    baseline = [(i, s, json.loads(m)) for c, i, s, m, _ in boots if c == engine[0]]
    assert len(treatment) == 3 and all(s == "excluded" and "checkout_changed" in m for _, s, m, _ in treatment)
    assert all(p["checkout_changed"] == [f"{engine[1]}: python/tinyengine/serve.py: content differs"]
               for *_, p in treatment)
    assert all("checkout" in p for *_, p in treatment[1:])  # each later boot started on one made again
    assert baseline and all("checkout_changed" not in m for *_, m in baseline)
    (h,) = last_json(proc.stdout)["hypotheses"]
    assert h["boots"]["treatment"] == 0, h
    assert "checkout_changed" in h["checks"]["word"] or any("checkout_changed" in w for w in h["warnings"]), h
    said = " ".join((proc.stderr + proc.stdout).split())  # the console wraps long lines
    assert said.count(f"the worktree checkout of {engine[1][:12]} is not what it was made from") == 2, said[-3000:]
    (journal,) = (tmp_path / "exp").glob("*-run*.md")
    text = journal.read_text()
    assert "- the checkout changed while the boot ran: " in text and "- before the boot: the worktree checkout" in text


def test_an_environment_whose_package_came_from_another_commits_checkout_is_made_again(tmp_path, monkeypatch):
    """The installed distribution's recorded source (``direct_url.json``) names the
    checkout it came from: one of another commit is not this commit's environment."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    a, b = make_packaged_engine(tmp_path / "engine", VERSIONS)
    ws = Workspace(tmp_path / "engine", tmp_path / "cache")
    other = ws.checkout(b)
    env = ws.environment(a, sys.executable)
    ws.build(a, [env.python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", str(other / "python")],
             env.apply(os.environ), python=env.python)
    rec = integrity.load(env.venv)
    assert any(d.get("editable") and str(other) in d.get("url", "") for d in rec.about["installed"]), rec.about
    assert ws.notes == []
    again = ws.environment(a, sys.executable)
    assert again.venv == env.venv and not list(env.venv.glob("lib/python*/site-packages/*.dist-info"))
    (note,) = ws.notes
    assert f"tinyengine was installed from the checkout of {b[:12]}" in note and note.endswith("made it again")
    assert not list((ws.root / "builds").glob(f"{a}-*.json"))  # its build runs again in the new one


def test_prune_removes_a_checkouts_record_with_it(repo, tmp_path):
    from bisect_harness.plan.cache import list_cache, prune

    ws = Workspace(repo, tmp_path / "cache")
    paths = [ws.checkout(ws.resolve("HEAD"), mode) for mode in ("worktree", "tree", "clone")]
    assert all(integrity.record_path(p).is_file() for p in paths)
    assert len(prune(list_cache(tmp_path / "cache"))) == 3
    assert not any(integrity.record_path(p).exists() for p in paths)
