"""Revisions that are released builds: a package's versions, installed one environment each.

Most people who see an engine get slower run released builds, not one build per
commit. ``engine.releases`` names a package and where its builds are (a folder of
wheels and sdists, read as pip's ``--find-links``, or a package index URL); each
version is a revision that hypotheses (``release: 0.5.21``) and ``harness bisect
--good 0.5.20 --bad 0.5.23`` take like a commit. A version is installed into an
environment of its own over the base interpreter (never the harness's, never
another version's), made once in the cache: the distribution file is fetched
first (``pip download``), its sha256 recorded, then that very file installed.

    source = ReleaseSource("demo-engine", "/srv/wheels")
    source.versions()                        # ('0.1.0', '0.2.0', ...), oldest first
    env, record = install(ReleaseRequest("demo-engine", "0.3.0", "/srv/wheels"), cache, sys.executable)
    record["sha256"]                         # of demo_engine-0.3.0-py3-none-any.whl

Containers (an image per revision) are not run here: the hosts this was built on
have no container runtime to test one with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from filelock import FileLock

from ..errors import BuildFailed, CommitError
from .envs import CommitEnv, create_venv

__all__ = ["ReleaseRequest", "ReleaseSource", "install", "installed_version", "normalize"]

#: how long one ``pip download`` or ``pip install`` of a release may take
PIP_TIMEOUT_S = 1800.0
_MARKER = "release.json"


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it (``Demo_Engine`` -> ``demo-engine``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_url(index: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*://", index) is not None


@dataclass(frozen=True)
class ReleaseRequest:
    """One release to install: the package, its version, where its builds are (an
    absolute folder or a URL)."""

    package: str
    version: str
    index: str

    def source_args(self) -> list[str]:
        """pip's options naming where the builds are, and nothing else."""
        if _is_url(self.index):
            return ["--index-url", self.index]
        return ["--no-index", "--find-links", self.index]

    def describe(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ReleaseSource:
    """The ordered versions of ``package`` at ``index``: ``versions`` as the spec
    lists them, else every version whose wheel or sdist is in the folder, sorted
    by PEP 440."""

    package: str
    index: str
    listed: tuple[str, ...] = ()

    def versions(self) -> tuple[str, ...]:
        if self.listed:
            return self.listed
        if _is_url(self.index):
            raise CommitError(f"engine.releases: the versions at {self.index} are not listed; give "
                              "engine.releases.versions (oldest first)")
        folder = Path(self.index)
        if not folder.is_dir():
            raise CommitError(f"engine.releases.index: no such folder {folder}; give the folder of the "
                              f"{self.package} builds, or a package index URL")
        from packaging.version import InvalidVersion, Version

        want, found = normalize(self.package), {}
        for f in folder.iterdir():
            got = _name_version(f.name)
            if got and normalize(got[0]) == want:
                try:
                    found[got[1]] = Version(got[1])
                except InvalidVersion:
                    continue
        if not found:
            raise CommitError(f"engine.releases: no build of {self.package} in {folder} (wheels "
                              f"{self.package.replace('-', '_')}-VERSION-*.whl or sdists)")
        return tuple(sorted(found, key=found.get))

    def between(self, good: str, bad: str) -> tuple[str, ...]:
        """The versions from ``good`` to ``bad``, both included, oldest first; a
        CommitError naming the option for a version not among them."""
        order = self.versions()
        for where, v in (("--good", good), ("--bad", bad)):
            if v not in order:
                raise CommitError(f"{where} {v}: no such release of {self.package} (known: "
                                  f"{', '.join(order[:12])}{', ...' if len(order) > 12 else ''})")
        i, j = order.index(good), order.index(bad)
        if i >= j:
            raise CommitError(f"--good {good} is not older than --bad {bad} among the releases of {self.package}")
        return order[i:j + 1]


def _name_version(filename: str) -> tuple[str, str] | None:
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        return (parts[0], parts[1]) if len(parts) >= 5 else None
    for ext in (".tar.gz", ".zip"):
        if filename.endswith(ext):
            stem = filename[: -len(ext)]
            name, _, version = stem.rpartition("-")
            return (name, version) if name and version else None
    return None


def _run(argv: list[str], log: list[str], env: dict[str, str], timeout_s: float) -> None:
    from . import supervisor

    import tempfile

    log.append("$ " + " ".join(argv))
    with tempfile.TemporaryFile() as out:
        try:
            code = supervisor.run(argv, env=env, cwd=Path.cwd(), stdout=out, timeout_s=timeout_s)
        except supervisor.LaunchError as exc:
            raise RuntimeError(f"{argv[0]} is not runnable: {exc}") from None
        out.seek(0)
        log.append(out.read().decode("utf-8", errors="replace"))
    if code is None:
        raise RuntimeError(f"ran past {timeout_s:g} s")
    if code != 0:
        raise RuntimeError(f"exited {code}")


def install(req: ReleaseRequest, cache_dir: Path, base_python: str) -> tuple[CommitEnv, dict]:
    """The environment of ``req`` (made and installed once per release, index and base
    interpreter) and its record: the file installed, its sha256, the version pip
    installed. Raises BuildFailed (the release's recorded skip) with pip's log."""
    ident = hashlib.sha256(f"{req.index}\0{base_python}".encode()).hexdigest()[:10]
    root = Path(cache_dir) / "releases" / normalize(req.package)
    venv = root / f"{req.version}-{ident}"
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(venv.with_name(venv.name + ".lock")), timeout=PIP_TIMEOUT_S * 2):
        env = create_venv(base_python, venv)
        marker = venv / _MARKER
        if marker.is_file():
            record = json.loads(marker.read_text())
            return dataclasses.replace(env, installed=record), record
        log: list[str] = []
        log_path = venv.with_name(venv.name + ".log")
        dist = venv / "dist"
        pip_env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        pip_env.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"})
        try:
            t0 = time.monotonic()
            _run([env.python, "-m", "pip", "download", "--no-deps", "--dest", str(dist), *req.source_args(),
                  f"{req.package}=={req.version}"], log, pip_env, PIP_TIMEOUT_S)
            files = sorted(dist.iterdir())
            if len(files) != 1:
                raise RuntimeError(f"pip download left {len(files)} files in {dist}, expected one")
            file = files[0]
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
            # that very file, its dependencies from the same place (the base's are seen)
            _run([env.python, "-m", "pip", "install", *req.source_args(), str(file)], log, pip_env, PIP_TIMEOUT_S)
            got = installed_version(env.python, req.package)
            if got != req.version:
                raise RuntimeError(f"asked for {req.describe()}, the environment holds {req.package} {got}")
            record = {"package": req.package, "version": got, "index": req.index, "file": file.name,
                      "sha256": digest, "seconds": round(time.monotonic() - t0, 2)}
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            log.append(f"error: {exc}")
            log_path.write_text("\n".join(log) + "\n")
            raise BuildFailed(f"could not install {req.describe()} from {req.index}: {exc}",
                              log_tail="\n".join(log)[-4000:], log_path=str(log_path)) from None
        log_path.write_text("\n".join(log) + "\n")
        marker.write_text(json.dumps(record, indent=1) + "\n")
        return dataclasses.replace(env, installed=record), record


def installed_version(python: str, package: str) -> str | None:
    """The version of ``package`` that ``python`` imports metadata for (None: not installed)."""
    code = ("import importlib.metadata as m, sys\n"
            "try: print(m.version(sys.argv[1]))\n"
            "except m.PackageNotFoundError: print('')\n")
    proc = subprocess.run([python, "-c", code, package], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, start_new_session=True)
    out = proc.stdout.strip()
    return out or None
