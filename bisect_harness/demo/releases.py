"""Released builds of the demo engine: a wheel per version, tagged in its history.

What an engine's release process does, done for the demo so that ``engine.releases``
can be tried (and tested) with no network: for each version, the tagged commit's
files are exported, built (``build.py``), stamped with the version and packed as a
wheel of the package ``demo_engine`` (``python -m demo_engine`` serves it), into one
folder that pip reads with ``--find-links``.

    hist = create_demo_repo(tmp / "engine")
    versions = release_points(hist)                  # {"0.1.0": sha, ...}, 8 versions
    wheels = build_demo_releases(hist.path, versions, tmp / "wheels")
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Mapping

from bisect_harness.demo.repo import DemoHistory, _git, _git_env

__all__ = ["PACKAGE", "build_demo_releases", "release_points", "tag_releases"]

PACKAGE = "demo-engine"
_MODULE = "demo_engine"
_FILES = ("serve.py", "worker.py", "model.py", "tokenizer.py", "build.py")

_PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "{package}"
version = "{version}"
description = "The bisect-harness demo engine, released"
requires-python = ">=3.9"

[tool.setuptools]
packages = ["{module}"]

[tool.setuptools.package-data]
{module} = ["*.py", "build/*.json"]
"""

# serves the package's own serve.py as the demo does from its checkout: its folder
# first on sys.path (serve.py imports its siblings), the build artifact beside it
_MAIN = """\
import os, runpy, sys
here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.argv[0] = os.path.join(here, "serve.py")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def release_points(hist: DemoHistory, n: int = 8) -> dict[str, str]:
    """``n`` versions over the demo's history, oldest first (``0.1.0`` ...), each at a
    commit that builds; one pair of neighbours holds the planted regression between
    them, with more than one commit in between (something to descend into)."""
    broken = set()
    if "build_failure" in hist.events:  # from the breaking commit to the one that fixes it
        i = hist.index(hist.events["build_failure"])
        broken = {i, i + 1}
    usable = [i for i in range(len(hist.shas)) if i not in broken]
    step = max(1, (len(usable) - 1) // (n - 1))
    picks = [usable[min(k * step, len(usable) - 1)] for k in range(n - 1)] + [usable[-1]]
    picks = sorted(set(picks))
    return {f"0.{k + 1}.0": hist.shas[i] for k, i in enumerate(picks)}


def tag_releases(repo: Path, versions: Mapping[str, str], pattern: str = "v{version}") -> None:
    """Tag each version's commit in ``repo`` (``v0.3.0``), as a release process does."""
    env = _git_env()
    for version, sha in versions.items():
        _git(["tag", "-f", pattern.format(version=version), sha], Path(repo), env)


def build_demo_releases(repo: Path, versions: Mapping[str, str], out: Path) -> Path:
    """A wheel of ``demo_engine`` per version into ``out`` (made if missing); returns ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for version, sha in versions.items():
        if any(out.glob(f"{_MODULE}-{version}-*.whl")):
            continue
        with tempfile.TemporaryDirectory(prefix="demo-release-") as tmp:
            src = Path(tmp) / "src"
            pkg = src / _MODULE
            pkg.mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", sha, *_FILES],
                                     capture_output=True, check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(pkg, filter="data")
            serve = pkg / "serve.py"  # the version the server reports is the release's
            serve.write_text(re.sub(r'^VERSION = ".*"$', f'VERSION = "{version}"', serve.read_text(), count=1,
                                    flags=re.M))
            subprocess.run([sys.executable, "build.py"], cwd=pkg, check=True, capture_output=True)
            (pkg / "__init__.py").write_text(f'__version__ = "{version}"\n')
            (pkg / "__main__.py").write_text(_MAIN)
            (src / "pyproject.toml").write_text(_PYPROJECT.format(package=PACKAGE, version=version, module=_MODULE))
            proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                                   "--quiet", "-w", str(out), str(src)], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"the wheel of {PACKAGE} {version} ({sha[:12]}) did not build:\n"
                                   f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return out
