"""Benchmark: what an environment per commit costs, and what sharing one gets wrong.

A package laid out like SGLang (``python/pyproject.toml``, one module carrying
``__version__``) gets ``--commits`` commits, each a new version. Side by side in
one run, over the same commits:

* venv: each commit gets ``Workspace.environment`` (a venv over this
  interpreter) and ``{python} -m pip install --no-deps --no-build-isolation -e
  python`` into it, once;
* shared: every commit is installed into one throwaway base environment, once per
  commit, the way the harness built before (a commit already built is not
  rebuilt).

Then ``--rounds`` rounds of interleaved "boots" (A B C ... A B C ...) import
the package with the commit's interpreter and compare the version it reports
with the commit's. Figures: seconds to make an environment, its size, the
install time per commit in each mode (and their ratio), and the share of boots
that ran another commit's code in each mode.

Run: ``python bench/bench_env_per_commit.py [--commits 4] [--rounds 2]``. The last
line printed is one JSON object with every figure. Works offline (``--no-index``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bisect_harness.plan.cache import list_cache
from bisect_harness.engines.checkout import Workspace

PYPROJECT = ('[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n\n'
             '[project]\nname = "benchengine"\nversion = "{v}"\n')
PIP = ["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation", "-e", "python"]


def git(repo: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_AUTHOR_NAME": "b",
                "GIT_AUTHOR_EMAIL": "b@example.invalid", "GIT_COMMITTER_NAME": "b",
                "GIT_COMMITTER_EMAIL": "b@example.invalid"})
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, n: int) -> list[tuple[str, str]]:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "python" / "benchengine").mkdir(parents=True)
    out = []
    for i in range(n):
        v = f"{i + 1}.0.0"
        (path / "python" / "pyproject.toml").write_text(PYPROJECT.format(v=v))
        (path / "python" / "benchengine" / "__init__.py").write_text(f'__version__ = "{v}"\n')
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", v)
        out.append((git(path, "rev-parse", "HEAD"), v))
    return out


def reported(python: str) -> str:
    proc = subprocess.run([python, "-c", "import benchengine; print(benchengine.__version__)"],
                          capture_output=True, text=True, cwd=tempfile.gettempdir())
    return proc.stdout.strip()


def timed_build(ws: Workspace, sha: str, python: str, env: dict) -> float:
    t0 = time.perf_counter()
    ws.build(sha, [python, *PIP], env, python=python)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commits", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        commits = make_repo(root / "engine", a.commits)
        base = root / "base"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(base)], check=True)
        shared_python = str(base / "bin" / "python")
        ws_venv = Workspace(root / "engine", root / "cache-venv")
        ws_shared = Workspace(root / "engine", root / "cache-shared")
        env_s, install_venv, install_shared = [], [], []
        wrong = {"venv": 0, "shared": 0}
        boots = 0
        pythons: dict[str, str] = {}
        for r in range(a.rounds):
            for sha, version in commits:  # interleaved, as the executor boots configs
                if sha not in pythons:
                    t0 = time.perf_counter()
                    cenv = ws_venv.environment(sha, sys.executable)
                    env_s.append(time.perf_counter() - t0)
                    pythons[sha] = cenv.python
                    # alternate which mode installs first, so neither always gets the warm file cache
                    first_venv = len(install_venv) % 2 == 0
                    if not first_venv:
                        install_shared.append(timed_build(ws_shared, sha, shared_python, dict(os.environ)))
                    install_venv.append(timed_build(ws_venv, sha, cenv.python, cenv.apply(os.environ)))
                    if first_venv:
                        install_shared.append(timed_build(ws_shared, sha, shared_python, dict(os.environ)))
                else:  # cached, as before: nothing is rebuilt
                    ws_venv.build(sha, [pythons[sha], *PIP], ws_venv.environment(sha, sys.executable).apply(os.environ),
                                  python=pythons[sha])
                    ws_shared.build(sha, [shared_python, *PIP], dict(os.environ), python=shared_python)
                boots += 1
                wrong["venv"] += reported(pythons[sha]) != version
                wrong["shared"] += reported(shared_python) != version
        env_sizes = [e.size_bytes for e in list_cache(root / "cache-venv") if e.kind == "environment"]
    out = {
        "commits": a.commits, "rounds": a.rounds, "boots": boots,
        "env_create_s_median": statistics.median(env_s),
        "env_size_bytes_median": statistics.median(env_sizes),
        "install_venv_s_median": statistics.median(install_venv),
        "install_shared_s_median": statistics.median(install_shared),
        "install_time_ratio_venv_over_shared": statistics.median(install_venv) / statistics.median(install_shared),
        "first_boot_cost_ratio_venv_over_shared": (statistics.median(env_s) + statistics.median(install_venv))
        / statistics.median(install_shared),
        "wrong_code_share_venv": wrong["venv"] / boots,
        "wrong_code_share_shared": wrong["shared"] / boots,
    }
    print(f"environment per commit: {out['env_create_s_median']:.3f}s to make, "
          f"{out['env_size_bytes_median'] / 1024:.0f} KiB after the install; install {out['install_venv_s_median']:.2f}s "
          f"vs {out['install_shared_s_median']:.2f}s shared; boots on the wrong code: venv "
          f"{wrong['venv']}/{boots}, shared {wrong['shared']}/{boots}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
