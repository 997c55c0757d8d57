"""What the check of a checkout before each boot costs (``engines.integrity``).

Makes a git repository of ``--files`` files (spread over folders, 1 to 16 KiB
each), checks one commit out into a fresh cache (a worktree), and times, side
by side in one run, the median of ``--reps`` repetitions of:

- ``full_digest``: a record made from scratch (every file read and hashed);
- ``unchanged``: the check when nothing changed (every file stat'ed, none read);
- ``one_touched``: the check when one file's stat changed and its content did not
  (that file read; it passes);
- ``one_changed``: the check when one file's content changed (that file read; it
  fails, and the checkout would be made again);
- ``checkout_call``: ``Workspace.checkout`` of the commit, unchanged (the record
  read from disk, the lock, the check), as a boot pays it.

Each is also given as a ratio to ``full_digest``, and the files read in each
check are counted at the seam (``integrity.file_digest``). Run it with
PYTHONPATH pointing at the tree to measure; the last line is one JSON object.

    python bench/bench_checkout_verify.py --files 3000 --reps 7
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.invalid",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.invalid"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def _repo(root: Path, files: int, seed: int) -> Path:
    rng = random.Random(seed)
    repo = root / "engine"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    for i in range(files):
        path = repo / f"d{i % 40}" / f"e{i % 7}" / f"f{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(1024, 16384)))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "files")
    return repo


def _median(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    from bisect_harness.engines import integrity
    from bisect_harness.engines.checkout import Workspace

    reads = {"n": 0}
    real = integrity.file_digest

    def counted(path: str) -> str:
        reads["n"] += 1
        return real(path)

    integrity.file_digest = counted
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        repo = _repo(root, a.files, a.seed)
        ws = Workspace(repo, root / "cache")
        sha = ws.resolve("HEAD")
        tree = ws.checkout(sha)
        rec = integrity.load(tree)
        victim = tree / "d3" / "e3" / "f3.py"
        content = victim.read_bytes()

        def check(expect_ok: bool):
            def run():
                r = integrity.load(tree)  # a fresh copy: a check that passes refreshes the one it is given
                assert integrity.verify(tree, r).ok is expect_ok
            return run

        res: dict = {"files": len(rec.files), "bytes": sum(e[1] for e in rec.files.values()), "reps": a.reps}
        counts = {}
        reads["n"] = 0
        res["full_digest_s"] = _median(lambda: integrity.make(tree, rec.about, skip=rec.skip), a.reps)
        counts["full_digest"] = reads["n"] / a.reps
        reads["n"] = 0
        res["unchanged_s"] = _median(check(True), a.reps)
        counts["unchanged"] = reads["n"] / a.reps
        os.utime(victim)  # the stat differs from the record; the content does not
        reads["n"] = 0
        res["one_touched_s"] = _median(check(True), a.reps)
        counts["one_touched"] = reads["n"] / a.reps
        victim.write_bytes(content[:-1] + bytes([content[-1] ^ 1]))  # one byte of one file
        reads["n"] = 0
        res["one_changed_s"] = _median(check(False), a.reps)
        counts["one_changed"] = reads["n"] / a.reps
        victim.write_bytes(content)
        integrity.save(tree, integrity.update(tree, integrity.load(tree)))  # as made again: passes
        reads["n"] = 0
        res["checkout_call_s"] = _median(lambda: ws.checkout(sha), a.reps)
        counts["checkout_call"] = reads["n"] / a.reps
        assert not ws.notes, ws.notes
        res["files_read_per_check"] = counts
        full = res["full_digest_s"]
        res["ratio_to_full_digest"] = {k: round(res[f"{k}_s"] / full, 4)
                                       for k in ("unchanged", "one_touched", "one_changed", "checkout_call")}
        for k in [k for k in res if k.endswith("_s")]:
            res[k] = round(res[k], 5)
    res["python"] = sys.version.split()[0]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
