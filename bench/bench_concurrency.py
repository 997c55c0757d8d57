"""Concurrent use of one new ledger and one new cache, by real processes.

Each trial starts N fresh Python processes at once (released together by a
shared start time) that open one new SQLite ledger, or that make the worktree
and the per-commit environment of one commit in one new cache folder. Counts
the processes that succeeded. Run it with PYTHONPATH pointing at the tree to
measure; the last line is one JSON object.

    python bench/bench_concurrency.py --trials 20 --procs 4 --cache-trials 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OPEN_LEDGER = """
import sys, time
from bisect_harness.ledger import Ledger
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
Ledger(sys.argv[1]).close()
"""

MAKE_TREE = """
import sys, time
from pathlib import Path
from bisect_harness.checkout import Workspace
start = float(sys.argv[4])
ws = Workspace(Path(sys.argv[1]), cache_dir=Path(sys.argv[2]))
time.sleep(max(0.0, start - time.time()))
tree = ws.worktree(sys.argv[3])
env = ws.environment(sys.argv[3], sys.executable)
assert (tree / "f.txt").read_text() == "2\\n", "wrong checkout"
assert Path(env.python).exists()
"""


def _git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "b",
                "GIT_AUTHOR_EMAIL": "b@example.invalid", "GIT_COMMITTER_NAME": "b",
                "GIT_COMMITTER_EMAIL": "b@example.invalid"})
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def make_repo(repo: Path) -> str:
    """A two-commit repository of a few hundred files (so a clone takes long enough
    for processes to overlap); returns the second commit's sha."""
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    for i in range(300):
        (repo / f"m{i:03d}.py").write_text(f"VALUE = {i}\n" * 50)
    _git(repo, "add", ".")
    for n in (1, 2):
        (repo / "f.txt").write_text(f"{n}\n")
        _git(repo, "add", "f.txt")
        _git(repo, "commit", "-q", "-m", f"c{n}")
    return _git(repo, "rev-parse", "HEAD").strip()


def _together(argvs: list[list[str]], timeout_s: float = 120.0) -> list[tuple[int, str]]:
    procs = [subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL, start_new_session=True) for a in argvs]
    out = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        out.append((p.returncode, err.strip().splitlines()[-1] if err.strip() else ""))
    return out


def ledger_trial(folder: Path, procs: int, lead_s: float) -> list[tuple[int, str]]:
    url = f"sqlite:///{folder / 'ledger.db'}"
    start = time.time() + lead_s
    return _together([[sys.executable, "-c", OPEN_LEDGER, url, str(start)] for _ in range(procs)])


def cache_trial(folder: Path, procs: int, lead_s: float) -> list[tuple[int, str]]:
    sha = make_repo(folder / "repo")
    start = time.time() + lead_s
    return _together([[sys.executable, "-c", MAKE_TREE, str(folder / "repo"), str(folder / "cache"), sha,
                       str(start)] for _ in range(procs)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20, help="ledger trials")
    ap.add_argument("--procs", type=int, default=4, help="processes per ledger trial")
    ap.add_argument("--cache-trials", type=int, default=3)
    ap.add_argument("--cache-procs", type=int, default=3)
    ap.add_argument("--lead-s", type=float, default=2.0, help="time the processes get to import before the start")
    a = ap.parse_args()
    errors: dict[str, int] = {}
    res = {}
    for name, trial, n, k in (("ledger_open", ledger_trial, a.trials, a.procs),
                              ("cache_create", cache_trial, a.cache_trials, a.cache_procs)):
        ok = total = 0
        for _ in range(n):
            with tempfile.TemporaryDirectory() as d:
                for rc, err in trial(Path(d), k, a.lead_s):
                    total += 1
                    ok += rc == 0
                    if rc != 0:
                        errors[err[:120]] = errors.get(err[:120], 0) + 1
        res[name] = {"ok": ok, "attempts": total, "success_ratio": ok / total if total else None}
    res["errors"] = errors
    print(json.dumps(res))


if __name__ == "__main__":
    main()
