"""Concurrent use of one new ledger and one new cache, by real processes.

Each trial forks N processes, released together by a barrier, that open one
new SQLite ledger, or that make the worktree and the per-commit environment of
one commit in one new cache folder. Counts
the processes that succeeded. Run it with PYTHONPATH pointing at the tree to
measure; the last line is one JSON object.

    python bench/bench_concurrency.py --trials 20 --procs 4 --cache-trials 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

FORK = mp.get_context("fork")


def _open_ledger(url: str) -> None:
    from bisect_harness.record.ledger import Ledger

    Ledger(url).close()


def _make_tree(repo: str, cache: str, sha: str) -> None:
    from bisect_harness.engines.checkout import Workspace

    ws = Workspace(Path(repo), cache_dir=Path(cache))
    tree = ws.worktree(sha)
    env = ws.environment(sha, sys.executable)
    assert (tree / "f.txt").read_text() == "2\n", "wrong checkout"
    assert Path(env.python).exists()


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


def _child(barrier, errors, fn, args) -> None:
    barrier.wait()
    try:
        fn(*args)
    except BaseException as exc:  # counted, with its message, by the parent
        errors.put(f"{type(exc).__name__}: {exc}".splitlines()[0])
        errors.close()
        errors.join_thread()
        os._exit(1)
    os._exit(0)


def _together(fn, args_list: list[tuple], timeout_s: float = 120.0) -> list[tuple[int, str]]:
    """Fork one process per args; a barrier releases them at once."""
    barrier, errors = FORK.Barrier(len(args_list)), FORK.Queue()
    procs = [FORK.Process(target=_child, args=(barrier, errors, fn, a)) for a in args_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout_s)
        if p.is_alive():
            p.kill()
            p.join()
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    return [(p.exitcode, msgs.pop() if p.exitcode and msgs else "") for p in procs]


def ledger_trial(folder: Path, procs: int) -> list[tuple[int, str]]:
    return _together(_open_ledger, [(f"sqlite:///{folder / 'ledger.db'}",)] * procs)


def cache_trial(folder: Path, procs: int) -> list[tuple[int, str]]:
    sha = make_repo(folder / "repo")
    return _together(_make_tree, [(str(folder / "repo"), str(folder / "cache"), sha)] * procs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20, help="ledger trials")
    ap.add_argument("--procs", type=int, default=4, help="processes per ledger trial")
    ap.add_argument("--cache-trials", type=int, default=3)
    ap.add_argument("--cache-procs", type=int, default=3)
    a = ap.parse_args()
    errors: dict[str, int] = {}
    res = {}
    for name, trial, n, k in (("ledger_open", ledger_trial, a.trials, a.procs),
                              ("cache_create", cache_trial, a.cache_trials, a.cache_procs)):
        ok = total = 0
        for _ in range(n):
            with tempfile.TemporaryDirectory() as d:
                for rc, err in trial(Path(d), k):
                    total += 1
                    ok += rc == 0
                    if rc != 0:
                        key = re.sub(r"(sqlite:///|/)\S*tmp\w*\S*", "<temp>", err)[:140]
                        errors[key] = errors.get(key, 0) + 1
        res[name] = {"ok": ok, "attempts": total, "success_ratio": ok / total if total else None}
    res["errors"] = errors
    print(json.dumps(res))


if __name__ == "__main__":
    main()
