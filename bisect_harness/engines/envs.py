"""One Python environment per commit, over a base environment the user names.

A build such as ``pip install -e python`` installs a commit's code into an
interpreter. Run into one shared interpreter, every commit overwrites the
last, and boots that alternate A, B, A, B import whichever commit was
installed last. So each commit gets its own virtual environment:

- created with ``--without-pip --system-site-packages`` from the base
  interpreter (``engine.python``, default the harness's own), so torch, CUDA
  libraries and the rest of the base are *seen*, not copied (creation takes a
  tenth of a second and a few kilobytes);
- when the base is itself a virtual environment, ``--system-site-packages``
  would reach past it to the interpreter it was made from; a ``.pth`` file adds
  the base's own site folders (its ``.pth`` files included, so its editable
  installs resolve too), after the commit's own site folder;
- an editable install (``pip install -e``) made by setuptools is an import
  finder placed after the path finder, which a copy of the same package in the
  base would shadow; the same ``.pth`` file moves the commit's own finders first;
- ``pip`` is the base's, visible through the site folders; ``{python} -m pip``
  installs into the commit's environment, and a ``bin/pip`` wrapper makes a
  bare ``pip`` in a build argv do the same (the environment's ``bin`` comes
  first on ``PATH`` for the build and the server).

``CommitEnv`` is what a boot needs to know: the interpreter ``{python}`` names,
and the environment variables that make the commit's ``bin`` folder win.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from bisect_harness.errors import BuildFailed, UserError

#: ``engine.environment``: a virtual environment per commit, or the base interpreter for all.
ENV_MODES = ("venv", "shared")
MARKER = ".harness-env.json"
# Sorted after the environment's own .pth files (site processes them in name order),
# so the editable-install finders those registered are there to be moved.
PTH_NAME = "zz_bisect_harness_base.pth"
# An editable install made by setuptools (PEP 660) is a finder appended to
# sys.meta_path, *after* the path finder, so the same package installed in the
# base would shadow the commit's own code. Move the finders the environment's own
# .pth files registered ahead of the path finder, before the base's site folders
# are added: the commit's editable install then wins, as its site folder does.
_PROMOTE_OWN_FINDERS = (
    "import sys, importlib.machinery as _m; _i = sys.meta_path.index(_m.PathFinder) "
    "if _m.PathFinder in sys.meta_path else len(sys.meta_path); _own = sys.meta_path[_i + 1:]; "
    "del sys.meta_path[_i + 1:]; sys.meta_path[_i:_i] = _own")

_PIP_WRAPPER = """#!{python}
# Written by bisect-harness: the base environment's pip, run by this environment's
# interpreter, so `pip install` in a build installs here.
import sys
from pip._internal.cli.main import main
sys.exit(main())
"""

_QUERY = ("import json, site, sys, sysconfig\n"
          "print(json.dumps({'prefix': sys.prefix, 'base_prefix': sys.base_prefix,"
          " 'site': site.getsitepackages() if hasattr(site, 'getsitepackages') else [],"
          " 'purelib': sysconfig.get_paths()['purelib'], 'version': sys.version.split()[0]}))")


@dataclass(frozen=True)
class CommitEnv:
    """The interpreter a commit's build and server run with.

    ``venv`` is the commit's own environment, or None when all commits share
    the base interpreter (``engine.environment: shared``)."""

    python: str
    venv: Path | None = None
    base_python: str | None = None
    installed: Mapping | None = None  # a release installed into it (boot.releases): file, sha256, version

    @property
    def mode(self) -> str:
        return "venv" if self.venv is not None else "shared"

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with this environment's ``bin`` first on PATH (console scripts such
        as ``vllm`` resolve to the commit's), and ``VIRTUAL_ENV`` set. A shared
        environment puts its interpreter's folder first (``engine.python`` a venv's
        ``bin/python``: a preset's ``vllm serve`` then runs that venv's ``vllm``)."""
        out = dict(env)
        if self.venv is not None:
            out["VIRTUAL_ENV"] = str(self.venv)
            first = str(self.venv / "bin")
            out.pop("PYTHONHOME", None)
        else:
            first = os.path.dirname(self.python)
        path = [p for p in out.get("PATH", "").split(os.pathsep) if p and p != first]
        out["PATH"] = os.pathsep.join([first, *path])
        return out

    def to_dict(self) -> dict:
        out = {"mode": self.mode, "python": self.python, "venv": str(self.venv) if self.venv else None,
               "base_python": self.base_python or self.python}
        if self.installed is not None:
            out["release"] = dict(self.installed)
        return out


def resolve_python(python: str | None, *, where: str = "engine.python") -> str:
    """An absolute path to the base interpreter (symlinks kept: a venv's ``bin/python``
    is a link, and resolving it would lose the venv). ``None`` is the harness's own."""
    if python is None:
        return sys.executable
    found = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if not found or not os.path.isfile(found):
        raise UserError(f"{where}: no executable interpreter {python!r}; give the path of the python of the "
                        "base environment (the one with torch and the engine's dependencies), or remove the key "
                        "to use the harness's own interpreter")
    return os.path.abspath(found)


def _query(python: str, timeout_s: float = 60.0) -> dict:
    proc = subprocess.run([python, "-c", _QUERY], capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL, start_new_session=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} could not describe itself (exit {proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _supervised(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Run ``argv`` under a supervisor (nothing it starts outlives it); (code or None on timeout, output)."""
    import tempfile

    from bisect_harness.process import supervised

    with tempfile.TemporaryFile() as out:
        try:
            code = supervised.run(argv, env=dict(os.environ), cwd=Path.cwd(), stdout=out, timeout_s=timeout_s)
        except supervised.LaunchError as exc:
            return 127, f"{argv[0]}: not runnable ({exc})"
        out.seek(0)
        return code, out.read().decode("utf-8", errors="replace")


def installed(venv: Path) -> list[dict]:
    """The distributions installed into the environment's own site folders, each with
    where it was installed from (PEP 610's ``direct_url.json``: a folder's or archive's
    URL, editable or not, a VCS commit), for its record (``engines.integrity``). The
    folder names say name and version; nothing is imported."""
    out = []
    for info in sorted(Path(venv).glob("lib*/python*/site-packages/*.dist-info")):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        item: dict = {"name": name, "version": version}
        try:
            direct = json.loads((info / "direct_url.json").read_text())
        except (OSError, ValueError):
            direct = None
        if isinstance(direct, dict):
            item["url"] = direct.get("url")
            item["editable"] = bool((direct.get("dir_info") or {}).get("editable"))
            commit = (direct.get("vcs_info") or {}).get("commit_id")
            if commit:
                item["commit"] = commit
        out.append(item)
    return out


def is_complete(venv: Path) -> bool:
    return (venv / MARKER).is_file() and (venv / "bin" / "python").exists()


def create_venv(base_python: str, venv: Path, *, timeout_s: float = 300.0) -> CommitEnv:
    """Create (or reuse) the virtual environment at ``venv`` over ``base_python``.

    Made in a private folder and renamed into place, so a run killed half-way, or
    two runs making the same one, never leave a half-made environment in use.
    Raises ``BuildFailed`` with a log when the base cannot make one (a commit's
    environment is part of its build: a failure is that commit's recorded skip)."""
    env = CommitEnv(python=str(venv / "bin" / "python"), venv=venv, base_python=base_python)
    if is_complete(venv):
        return env
    log_path = venv.with_name(venv.name + ".log")
    venv.parent.mkdir(parents=True, exist_ok=True)
    tmp = venv.with_name(f"{venv.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log: list[str] = []
    try:
        base = _query(base_python)
        argv = [base_python, "-m", "venv", "--without-pip", "--system-site-packages", str(tmp)]
        log.append("$ " + " ".join(argv))
        code, output = _supervised(argv, timeout_s)
        log.append(output)
        if code is None:
            raise RuntimeError(f"python -m venv ran past {timeout_s:g} s")
        if code != 0:
            raise RuntimeError(f"python -m venv exited {code}")
        mine = _query(str(tmp / "bin" / "python"))
        # The base's own site folders (a venv base: its site-packages, which
        # --system-site-packages would skip), processed after the commit's own.
        extra = [p for p in base["site"] if p != mine["purelib"]]
        lines = [_PROMOTE_OWN_FINDERS] + [f"import site; site.addsitedir({p!r})" for p in extra]
        Path(mine["purelib"]).mkdir(parents=True, exist_ok=True)
        (Path(mine["purelib"]) / PTH_NAME).write_text("\n".join(lines) + "\n")
        for name in ("pip", "pip3"):
            target = tmp / "bin" / name
            if not target.exists():  # the shebang names the final place: the folder is renamed below
                target.write_text(_PIP_WRAPPER.format(python=env.python))
                target.chmod(0o755)
        (tmp / MARKER).write_text(json.dumps({
            "base_python": base_python, "base_prefix": base["prefix"], "base_site": extra,
            "python_version": mine["version"], "created": time.time()}, indent=1) + "\n")
        if venv.exists() and not is_complete(venv):  # a leftover of an older harness: start over
            shutil.rmtree(venv, ignore_errors=True)
        try:
            os.rename(tmp, venv)
        except OSError:
            if not is_complete(venv):  # not another run's finished one
                raise
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        log.append(f"error: {exc}")
        log_path.write_text("\n".join(log) + "\n")
        raise BuildFailed(f"could not create the environment over {base_python}: {exc}",
                          log_tail="\n".join(log)[-4000:], log_path=str(log_path)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log_path.write_text("\n".join(log) + "\n")
    return env
