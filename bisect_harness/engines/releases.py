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

A release may instead be a container image (``engine.releases.image``, a pattern
such as ``lmsysorg/sglang:v{version}``), run through the host's runtime: docker,
podman, apptainer or enroot (:func:`container_argv`). The runtime's client is the
server process the harness owns and stops (docker and podman pass its SIGTERM on
to the container, ``--rm`` removes it; apptainer and enroot run the processes
themselves). The image's digest is the boot's record. The machines this was built
on run no container runtime, so the runner is tested up to the runtime's argv.
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
from typing import Mapping, Sequence
from filelock import FileLock

from bisect_harness.errors import BuildFailed, CommitError
from bisect_harness.engines.envs import CommitEnv, create_venv

__all__ = ["ReleaseRequest", "ReleaseSource", "install", "installed_version", "normalize"]

#: how long one ``pip download`` or ``pip install`` of a release may take
PIP_TIMEOUT_S = 1800.0
_MARKER = "release.json"


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares it (``Demo_Engine`` -> ``demo-engine``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_url(index: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*://", index) is not None


#: the container runtimes a release image runs through, in the order one is looked for
RUNTIMES = ("docker", "podman", "apptainer", "enroot")


@dataclass(frozen=True)
class ReleaseRequest:
    """One release to install: the package, its version, where its builds are (an
    absolute folder or a URL); or, with ``image``, the container image to run
    through ``runtime`` (``runtime_args`` after the runtime's run verb: GPU and
    mount options)."""

    package: str
    version: str
    index: str
    image: str | None = None
    runtime: str | None = None
    runtime_args: tuple[str, ...] = ()

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
    from bisect_harness.process import supervised

    import tempfile

    log.append("$ " + " ".join(argv))
    with tempfile.TemporaryFile() as out:
        try:
            code = supervised.run(argv, env=env, cwd=Path.cwd(), stdout=out, timeout_s=timeout_s)
        except supervised.LaunchError as exc:
            raise RuntimeError(f"{argv[0]} is not runnable: {exc}") from None
        out.seek(0)
        log.append(out.read().decode("utf-8", errors="replace"))
    if code is None:
        raise RuntimeError(f"ran past {timeout_s:g} s")
    if code != 0:
        raise RuntimeError(f"exited {code}")


def container_argv(runtime: str, image: str, argv: Sequence[str], env: Mapping[str, str], *,
                   name: str, runtime_args: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``argv`` inside ``image`` through ``runtime``, with ``env``
    set inside, on the host's network (the server listens where the harness looks).

    >>> container_argv("docker", "sglang:v0.5.21", ["python", "-m", "sglang.launch_server"], {"A": "1"},
    ...                name="bh-1")
    ['docker', 'run', '--rm', '--init', '--network', 'host', '--name', 'bh-1', '-e', 'A=1', 'sglang:v0.5.21', 'python', '-m', 'sglang.launch_server']
    """
    rt = os.path.basename(runtime)
    pairs = [f"{k}={v}" for k, v in sorted(env.items())]
    if rt in ("docker", "podman"):
        return [runtime, "run", "--rm", "--init", "--network", "host", "--name", name, *runtime_args,
                *(x for p in pairs for x in ("-e", p)), image, *argv]
    if rt == "apptainer":  # the host's network and process tree already: no daemon between
        return [runtime, "exec", "--cleanenv", *runtime_args, *(x for p in pairs for x in ("--env", p)), image, *argv]
    if rt == "enroot":  # image: a container created with `enroot create`
        return [runtime, "start", "--rw", *runtime_args, *(x for p in pairs for x in ("-e", p)), image, *argv]
    raise ValueError(f"container runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")


def find_runtime(asked: str | None = None) -> str | None:
    """The runtime asked for, or the first of :data:`RUNTIMES` on PATH (None: none)."""
    import shutil

    for name in ((asked,) if asked else RUNTIMES):
        path = shutil.which(name)
        if path:
            return path
    return None


def image_record(req: ReleaseRequest) -> dict:
    """The image a release boots, by digest, pulled first where the runtime does not
    hold it: ``{"image", "runtime", "digest"}``. Raises BuildFailed (the release's
    recorded skip) when the runtime cannot find or pull it."""
    runtime = find_runtime(req.runtime)
    if runtime is None:
        raise BuildFailed(f"release {req.version} is the image {req.image}, and no container runtime "
                          f"({', '.join(RUNTIMES)}) is on PATH here")
    rt = os.path.basename(runtime)
    log: list[str] = []
    env = dict(os.environ)
    try:
        if rt in ("docker", "podman"):
            inspect = [runtime, "image", "inspect", "--format", "{{.Id}}", req.image]
            try:
                _run(inspect, log, env, 120)
            except RuntimeError:
                _run([runtime, "pull", req.image], log, env, PIP_TIMEOUT_S)
                _run(inspect, log, env, 120)
            digest = log[-1].strip().splitlines()[-1] if log[-1].strip() else ""
        elif Path(req.image).is_file():  # an apptainer .sif, an enroot .sqsh
            digest = "sha256:" + hashlib.sha256(Path(req.image).read_bytes()).hexdigest()
        else:
            digest = ""  # a name the runtime resolves when it runs (docker://..., an enroot container)
    except RuntimeError as exc:
        raise BuildFailed(f"the image {req.image} of release {req.version} is not available to {rt}: {exc}",
                          log_tail="\n".join(log)[-4000:]) from None
    return {"package": req.package, "version": req.version, "image": req.image, "runtime": rt,
            "digest": digest or None}


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
