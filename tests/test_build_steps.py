"""A build of several steps (``engine.build`` as a list of argvs), with real git and processes.

Configure-then-build (``cmake -B build``, then ``cmake --build build``) needs no
``sh -c``: each step is an argv run in order in the commit's checkout, its exit
checked, the first that fails named with the log. One argv keeps working and keeps
its cache key. The dry run shows the checkout, the steps and the launch; a commit
that does not build fails ``--dry-run --check-flags`` (exit 2) with its log's path and
last error lines. Builds share a compiler cache across checkouts: ``CCACHE_BASEDIR``
is the checkout's folder unless the user set it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest

from bisect_harness.engines.checkout import BUILD_ENV, Workspace, build_key
from bisect_harness.errors import BuildFailed, SpecError
from bisect_harness.spec import load_spec, parse_spec
from helpers import git, harness, last_json, write_spec

PY = sys.executable
CONFIGURE = [PY, "-c", "import pathlib; pathlib.Path('build').mkdir(); pathlib.Path('build/config').write_text('ok')"]
# the second step needs the first's output: run in order, in one checkout
COMPILE = [PY, "-c", "import pathlib, sys; c = pathlib.Path('build/config').read_text(); "
                     "v = pathlib.Path('VERSION').read_text().strip(); "
                     "v == 'broken' and sys.exit(print('src/main.c:3:5: error: expected ; before }', "
                     "file=sys.stderr) or 5); pathlib.Path('build/server.py').write_text(pathlib.Path('server.py').read_text())"]

SERVER = '''import argparse, sys
p = argparse.ArgumentParser()
p.add_argument("--host")
p.add_argument("--port")
p.add_argument("--batch", type=int)
p.parse_args()
'''


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "engine"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "server.py").write_text(SERVER)
    for v in ("1", "broken"):
        (repo / "VERSION").write_text(v + "\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"version {v}")
    return repo


# --------------------------------------------------------------------------- the spec


def _engine(build) -> str:
    return ("version: 1\nengine:\n  preset: openai\n  launch: [srv, --port, '{port}']\n"
            f"  build: {json.dumps(build)}\nhypotheses:\n"
            "  - {id: h, baseline: {}, treatment: {env: {X: '1'}}, metric: tok_s, expect: increase, min_effect: 0.1}\n")


def test_a_build_is_one_argv_or_a_list_of_argvs(tmp_path):
    steps = parse_spec(_engine([["cmake", "-B", "build"], "cmake --build build -j"]), tmp_path / "h.yaml").engine.build
    assert steps == (("cmake", "-B", "build"), ("cmake", "--build", "build", "-j"))
    assert parse_spec(_engine(["make", "-j2"]), tmp_path / "h.yaml").engine.build == (("make", "-j2"),)
    assert parse_spec(_engine("make -j2"), tmp_path / "h.yaml").engine.build == (("make", "-j2"),)
    with pytest.raises(SpecError, match=r"engine\.build\[1\]"):
        parse_spec(_engine([["cmake", "-B", "build"], 3]), tmp_path / "h.yaml")
    with pytest.raises(SpecError, match=r"engine\.build\[0\]"):
        parse_spec(_engine([[], ["make"]]), tmp_path / "h.yaml")


def test_the_schema_takes_a_build_of_steps():
    import jsonschema

    from bisect_harness.spec.schema import hypotheses_schema

    engine = hypotheses_schema()["properties"]["engine"]["properties"]["build"]
    for ok in (["make", "-j2"], "make -j2", [["cmake", "-B", "b"], ["cmake", "--build", "b"]]):
        jsonschema.validate(ok, engine)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], engine)


def test_one_step_keeps_the_config_keys_and_several_steps_key_each_step(tmp_path):
    from bisect_harness.plan.build import engine_fingerprint

    def key(build):
        return engine_fingerprint(parse_spec(_engine(build), tmp_path / "h.yaml"))

    assert key(["make", "-j2"]) == key([["make", "-j2"]])  # the same one step: the keys ledgers hold
    assert key([["cmake", "-B", "b"], ["make"]]) != key([["cmake", "-B", "b"], ["make", "-j2"]])


# --------------------------------------------------------------------------- the build runner


def test_steps_run_in_order_and_the_failing_step_is_named_with_its_log(repo, tmp_path):
    ws = Workspace(repo, tmp_path / "cache")
    good, broken = ws.resolve("HEAD~1"), ws.resolve("HEAD")
    env = dict(os.environ)
    result = ws.build(good, [CONFIGURE, COMPILE], env)
    assert result.ok and (ws.worktree(good) / "build" / "server.py").exists()
    log = result.log_path.read_text()
    assert "== build step 1 of 2:" in log and "== build step 2 of 2:" in log
    marker = json.loads(result.log_path.with_suffix(".json").read_text())
    assert [s["code"] for s in marker["steps"]] == [0, 0]
    with pytest.raises(BuildFailed) as err:
        ws.build(broken, [CONFIGURE, COMPILE], env)
    message = str(err.value)
    assert f"build failed at {broken[:12]} (step 2 of 2, exit 5)" in message, message
    assert f"log: {err.value.log_path}" in message
    assert "error: expected ; before }" in err.value.log_tail
    with pytest.raises(BuildFailed, match=r"cached; step 2 of 2, exit 5"):  # remembered, not run again
        ws.build(broken, [CONFIGURE, COMPILE], env)


def test_the_build_key_holds_every_step_and_one_argv_keeps_its_old_key(repo, tmp_path):
    ws = Workspace(repo, tmp_path / "cache")
    sha = ws.resolve("HEAD~1")
    counter = tmp_path / "runs.txt"
    count = [PY, "-c", "import sys; open(sys.argv[1], 'a').write('x')", str(counter)]
    env = {"PATH": os.environ["PATH"]}
    assert not ws.build(sha, [count, [PY, "-c", "pass"]], env).cached
    assert ws.build(sha, [count, [PY, "-c", "pass"]], env).cached
    assert not ws.build(sha, [count, [PY, "-c", "pass", "again"]], env).cached  # only the second step changed
    assert counter.read_text() == "xx"
    # one argv: the key every cache already holds (interpreter, argv, the build's variables)
    old = hashlib.sha256(json.dumps([PY, list(count), [[n, env.get(n)] for n in sorted(BUILD_ENV)]]).encode())
    assert build_key(PY, count, env) == build_key(PY, [count], env) == old.hexdigest()[:12]


def test_builds_set_ccache_basedir_to_their_checkout_unless_the_user_did(repo, tmp_path):
    ws = Workspace(repo, tmp_path / "cache")
    sha = ws.resolve("HEAD~1")
    seen = tmp_path / "basedir.txt"
    step = [PY, "-c", "import os, sys; open(sys.argv[1], 'w').write(os.environ.get('CCACHE_BASEDIR', '-'))", str(seen)]
    env = {k: v for k, v in os.environ.items() if k != "CCACHE_BASEDIR"}
    ws.build(sha, [step], env, mode="tree")
    assert seen.read_text() == str(ws.checkout(sha, "tree"))
    ws.build(sha, [step], {**env, "CCACHE_BASEDIR": "/opt/src"}, mode="clone")
    assert seen.read_text() == "/opt/src"


# --------------------------------------------------------------------------- the dry run and its flag check


def _spec(tmp_path, repo, **extra):
    return write_spec(
        tmp_path / "hypotheses.yaml",
        engine={"preset": "vllm", "repo": str(repo), "checkout": "clone", "environment": "shared",
                "build": [CONFIGURE, COMPILE],
                "launch": ["{python}", "{worktree}/build/server.py", "--host", "{host}", "--port", "{port}"],
                **extra},
        hypotheses=[{"id": "h", "baseline": {"commit": "HEAD~1"}, "treatment": {"commit": "HEAD", "flags": {"batch": 2}},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%"}])


def test_the_dry_run_shows_checkout_build_steps_and_launch(repo, tmp_path):
    out = harness("run", _spec(tmp_path, repo), "--dry-run", "--cache-dir", tmp_path / "cache")
    assert out.returncode == 0, out.stderr
    assert "checkout: clone (a full clone" in out.stdout
    assert "  build 1/2: " in out.stdout and "  build 2/2: " in out.stdout and "(once per commit, cached)" in out.stdout
    assert "{worktree}/build/server.py' --host 127.0.0.1 --port '{port}'" in out.stdout
    obj = last_json(harness("run", _spec(tmp_path, repo), "--dry-run", "--json",
                            "--cache-dir", tmp_path / "cache").stdout)
    config = obj["configs"][0]
    assert config["checkout"] == "clone" and [s[0] for s in config["build"]] == [PY, PY] and len(config["build"]) == 2


def test_check_flags_on_a_commit_that_does_not_build_exits_2_with_its_log(repo, tmp_path):
    out = harness("run", _spec(tmp_path, repo), "--dry-run", "--check-flags", "--cache-dir", tmp_path / "cache",
                  env={**os.environ, "COLUMNS": "1000"})  # the error's lines as printed, unwrapped
    assert out.returncode == 2, (out.stdout, out.stderr)
    broken = git(repo, "rev-parse", "HEAD").strip()
    assert f"build failed at {broken[:12]} (step 2 of 2, exit 5)" in out.stderr
    assert "build log: " in out.stderr and ".log" in out.stderr
    assert "| src/main.c:3:5: error: expected ; before }" in out.stderr
    assert "| src/main.c:3:5: error: expected ; before }" in out.stdout  # the plan's own report says it too
    log = out.stderr.split("build log: ", 1)[1].split(";", 1)[0]
    assert os.path.exists(log)


def test_a_two_step_build_runs_before_the_flag_check_of_a_commit_that_builds(repo, tmp_path):
    from bisect_harness.plan.build import make_plan
    from bisect_harness.plan.flag_check import check_plan_flags

    spec = load_spec(_spec(tmp_path, repo))
    plan = make_plan(spec, cache_dir=tmp_path / "cache")
    good, broken = check_plan_flags(plan, timeout_s=60)
    assert good.error == "" and good.options >= 3 and not good.refused
    assert broken.build_log and broken.build_errors[-1].startswith("src/main.c:3:5: error")
    assert not any(line.startswith("== build step") for line in broken.build_errors)  # the harness's headers


def test_the_real_history_bench_plans_a_two_step_build_without_a_shell(repo, tmp_path):
    """bench/bench_real_history.py writes its spec with configure-then-build as two argvs
    (no ``sh -c``); its --dry-run is the harness's own plan of that spec."""
    import subprocess
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "bench" / "bench_real_history.py"
    proc = subprocess.run([sys.executable, str(bench), "--repo", str(repo), "--good", "HEAD~1", "--bad", "HEAD",
                           "--culprit", "", "--dry-run"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(bench.parents[1])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads(proc.stdout.strip().splitlines()[-1])
    (config, _) = plan["configs"]
    assert config["checkout"] == "clone"
    assert [step[:2] for step in config["build"]] == [["cmake", "-B"], ["cmake", "--build"]]
    assert not any(a in ("sh", "bash", "-c") for step in config["build"] for a in step)
    assert config["argv"][0] == "{worktree}/build/bin/llama-server" and "--metrics" in config["argv"]
