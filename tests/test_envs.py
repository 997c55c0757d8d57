"""Per-commit environments: made over a base, seeing it, installing only into themselves."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bisect_harness.engines.checkout import Workspace
from bisect_harness.engines.envs import create_venv, resolve_python
from bisect_harness.errors import BuildFailed, UserError
from packaged_engine import make_packaged_engine


def _py(python, code: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", code], capture_output=True, text=True, env=env)


def _importable(python, module: str) -> bool:
    return _py(python, f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
               ).returncode == 0


@pytest.fixture
def venv_base(tmp_path):
    """A base environment that is itself a venv (no system site packages), with a module of its own."""
    base = tmp_path / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    purelib = json.loads(_py(str(base / "bin" / "python"),
                             "import json, sysconfig; print(json.dumps(sysconfig.get_paths()['purelib']))").stdout)
    with open(os.path.join(purelib, "base_marker.py"), "w") as fh:
        fh.write("WHERE = 'base'\n")
    return base


def test_an_environment_over_a_venv_base_sees_the_base_and_comes_first(venv_base, tmp_path):
    env = create_venv(str(venv_base / "bin" / "python"), tmp_path / "envs" / "c1")
    assert env.mode == "venv" and env.python == str(tmp_path / "envs" / "c1" / "bin" / "python")
    # the base venv's own packages (which --system-site-packages alone would skip) and the
    # base interpreter's (pip, torch) are both visible
    assert _importable(env.python, "base_marker")
    assert _importable(env.python, "pip")
    paths = json.loads(_py(env.python, "import json, sys; print(json.dumps(sys.path))").stdout)
    mine = next(i for i, p in enumerate(paths) if p.startswith(str(tmp_path / "envs" / "c1")))
    base = next(i for i, p in enumerate(paths) if p.startswith(str(venv_base)))
    assert mine < base, "the commit's own installs must shadow the base's"
    # made once: a second call reuses it
    marker = (tmp_path / "envs" / "c1" / ".harness-env.json").read_text()
    assert create_venv(str(venv_base / "bin" / "python"), tmp_path / "envs" / "c1") == env
    assert (tmp_path / "envs" / "c1" / ".harness-env.json").read_text() == marker


def test_pip_in_a_build_installs_into_the_commits_environment_only(venv_base, tmp_path):
    make_packaged_engine(tmp_path / "engine", ["1.0.0"])
    env = create_venv(str(venv_base / "bin" / "python"), tmp_path / "envs" / "c1")
    run_env = env.apply(os.environ)
    assert run_env["PATH"].split(os.pathsep)[0] == str(env.venv / "bin")
    assert run_env["VIRTUAL_ENV"] == str(env.venv)
    # a bare `pip` in a build argv, found on PATH, is the environment's wrapper around the base's pip
    proc = subprocess.run(["pip", "install", "--no-deps", "--no-build-isolation", "-e", "python"],
                          cwd=tmp_path / "engine", env=run_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _py(env.python, "import tinyengine; print(tinyengine.__version__)").stdout.strip() == "1.0.0"
    assert not _importable(str(venv_base / "bin" / "python"), "tinyengine")
    assert not _importable(sys.executable, "tinyengine")


def test_a_base_that_cannot_make_an_environment_is_a_build_failure_with_its_log(tmp_path):
    fake = tmp_path / "not-python"
    fake.write_text("#!/bin/sh\necho 'no venv module here' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(BuildFailed) as err:
        create_venv(str(fake), tmp_path / "envs" / "c1")
    assert "could not create the environment" in str(err.value)
    assert "no venv module here" in err.value.log_tail
    assert not (tmp_path / "envs" / "c1").exists()


def test_resolve_python_names_the_key(tmp_path):
    assert resolve_python(None) == sys.executable
    with pytest.raises(UserError, match="engine.python: no executable interpreter"):
        resolve_python(str(tmp_path / "nope" / "python"))


def test_the_build_cache_is_keyed_on_the_interpreter(tmp_path):
    repo = tmp_path / "engine"
    shas = make_packaged_engine(repo, ["1.0.0"])
    ws = Workspace(repo, tmp_path / "cache")
    env = ws.environment(shas[0], sys.executable)
    argv = ["{python}", "-c", "import sys; print(sys.executable)"]
    first = ws.build(shas[0], [a.replace("{python}", env.python) for a in argv], {"PATH": os.environ["PATH"]},
                     python=env.python)
    again = ws.build(shas[0], [a.replace("{python}", env.python) for a in argv], {"PATH": os.environ["PATH"]},
                     python=env.python)
    other = ws.build(shas[0], [a.replace("{python}", env.python) for a in argv], {"PATH": os.environ["PATH"]},
                     python=sys.executable)
    assert (first.cached, again.cached, other.cached) == (False, True, False)
    assert first.log_path.read_text().strip() == env.python


def test_the_commits_editable_install_wins_over_the_same_package_in_the_base(venv_base, tmp_path):
    """SGLang's case: the base has the engine installed, each commit installs it editable."""
    make_packaged_engine(tmp_path / "old", ["0.9.0"])
    make_packaged_engine(tmp_path / "new", ["1.0.0"])
    base_python = str(venv_base / "bin" / "python")
    env = create_venv(base_python, tmp_path / "envs" / "c1")
    pip = ["-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    # the base gets a regular install (through a throwaway environment's pip, aimed at the base)
    proc = subprocess.run([env.python, *pip, "--prefix", str(venv_base), "./python"], cwd=tmp_path / "old",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    version = "import tinyengine; print(tinyengine.__version__)"
    assert _py(base_python, version).stdout.strip() == "0.9.0"
    proc = subprocess.run([env.python, *pip, "-e", "python"], cwd=tmp_path / "new", env=env.apply(os.environ),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _py(env.python, version).stdout.strip() == "1.0.0"
    assert _py(base_python, version).stdout.strip() == "0.9.0"


def _engine(tmp_path, engine_yaml: str):
    from bisect_harness.spec import parse_spec

    text = (f"version: 1\nengine:\n{engine_yaml}\nhypotheses:\n"
            "  - {id: h, baseline: {}, treatment: {}, metric: tok_s, expect: increase, min_effect: 10%}\n")
    return parse_spec(text, tmp_path / "hypotheses.yaml").engine


def test_environment_keys_default_validate_and_resolve(tmp_path):
    from bisect_harness.errors import SpecError

    built = _engine(tmp_path, "  repo: engine\n  launch: [x]\n  build: [make]")
    assert (built.environment, built.environment_mode, built.python) == (None, "venv", None)
    assert _engine(tmp_path, "  repo: engine\n  launch: [x]").environment_mode == "shared"
    shared = _engine(tmp_path, "  repo: engine\n  launch: [x]\n  build: [make]\n  environment: shared\n"
                               "  python: envs/base/bin/python")
    assert shared.environment_mode == "shared"
    assert shared.python == str(tmp_path / "envs" / "base" / "bin" / "python"), "relative to the file"
    assert _engine(tmp_path, "  launch: [x]\n  python: python3").python == "python3", "a name is found on PATH"
    with pytest.raises(SpecError, match=r"key 'engine.environment': must be one of venv, shared, got 'conda'"):
        _engine(tmp_path, "  repo: engine\n  launch: [x]\n  environment: conda")
    with pytest.raises(SpecError, match=r"engine.environment.*no repository"):
        _engine(tmp_path, "  launch: [x]\n  environment: venv")
    with pytest.raises(SpecError, match=r"engine.python.*expected the path"):
        _engine(tmp_path, "  launch: [x]\n  python: [a]")


def test_a_half_made_environment_is_made_again(tmp_path):
    venv = tmp_path / "envs" / "c1"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "junk").write_text("left by a run killed half-way\n")
    env = create_venv(sys.executable, venv)
    assert not (venv / "bin" / "junk").exists()
    assert _importable(env.python, "pip")
    assert sorted(p.name for p in venv.parent.iterdir()) == ["c1", "c1.log"], "no private folder left behind"
