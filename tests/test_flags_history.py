"""Flags across an engine's history, with real processes.

A tiny argparse server in a real git repository: its first commit takes
``--batch N``; its second splits it into ``--batch-decode`` and ``--batch-prefill``
(as SGLang 0.5.22 split ``--cuda-graph-max-bs``), so argparse refuses ``--batch``
there as ambiguous and exits 2. ``harness run --dry-run --check-flags`` says so
before any boot, and ``harness run`` records the boot as "flag not accepted at
this commit" with the engine's own message, never as a crash, and never retries it.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

import pytest

from bisect_harness.plan.flag_check import argparse_rejection, check_argv, help_options
from bisect_harness.errors import BootFailed, BootTimeout, FlagNotAccepted
from bisect_harness.engines.server import ServerProcess, free_port
from helpers import git, harness, last_json, query, write_spec

SERVER = '''"""A tiny OpenAI-compatible server whose flags change between commits."""

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = None


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def _json(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            time.sleep(HEALTH_DELAY_S)
            self._json({"ok": True})
        elif self.path == "/server_info":
            self._json(vars(ARGS))
        elif self.path == "/v1/models":
            self._json({"object": "list", "data": [{"id": "tiny", "object": "model"}]})
        else:
            self.send_response(404)
            self.end_headers()

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        n = int(req.get("max_tokens") or 8)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(n):
            time.sleep(0.002)
            chunk = {"object": "text_completion", "model": "tiny", "choices": [{"index": 0, "text": f" t{i}"}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\\n\\n")
        self.wfile.flush()
        self.close_connection = True


def main():
    global ARGS
    p = argparse.ArgumentParser(prog="server.py")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
FLAGS
    ARGS = p.parse_args()
    ThreadingHTTPServer((ARGS.host, ARGS.port), Handler).serve_forever()


HEALTH_DELAY_S = @DELAY@

if __name__ == "__main__":
    main()
'''

OLD_FLAGS = '    p.add_argument("--batch", type=int, default=1)\n'
NEW_FLAGS = ('    p.add_argument("--batch-decode", type=int, default=1)\n'
             '    p.add_argument("--batch-prefill", type=int, default=1)\n')


def server_source(flags: str, delay: float = 0.0) -> str:
    return SERVER.replace("FLAGS\n", flags).replace("@DELAY@", repr(delay))


@pytest.fixture
def engine(tmp_path):
    """A git repo: HEAD~1 takes --batch, HEAD takes --batch-decode/--batch-prefill."""
    repo = tmp_path / "engine"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for flags, msg in ((OLD_FLAGS, "server with --batch"), (NEW_FLAGS, "split --batch into decode and prefill")):
        (repo / "server.py").write_text(server_source(flags))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", msg)
    return repo


def spec_file(tmp_path):
    return write_spec(
        tmp_path / "hypotheses.yaml",
        engine={"preset": "openai", "repo": "engine", "launch": ["{python}", "server.py", "--host", "{host}",
                                                                 "--port", "{port}"],
                "health": "/health", "server_info": "/server_info", "ready_timeout_s": 60,
                "metrics": [{"name": "batch_seen", "from": "server_info", "field": "batch", "better": "higher",
                             "when": {"batch": True}},
                            {"name": "big_batch_only", "from": "server_info", "field": "batch", "better": "higher",
                             "when": {"batch": 64}}]},
        benchmark={"model": "tiny", "prompt_tokens": 8, "output_tokens": 8, "requests_per_sample": 2,
                   "warmup_requests": 1, "ignore_eos": False},
        defaults={"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 2, "boot_retries": 1},
        hypotheses=[{"id": "split-batch", "statement": "the split batch flags are at least 10% faster",
                     "baseline": {"commit": "HEAD~1", "flags": {"batch": 4}},
                     "treatment": {"commit": "HEAD", "flags": {"batch": 4}},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%"}])


AMBIGUOUS = "ambiguous option: --batch could match --batch-decode, --batch-prefill"


# --------------------------------------------------------------------------- the dry run's check


@pytest.mark.slow
def test_dry_run_check_flags_reports_the_refused_flag_per_commit(engine, tmp_path):
    spec = spec_file(tmp_path)
    proc = harness("run", spec, "--dry-run", "--check-flags", "--json", "--cache-dir", tmp_path / "cache",
                   cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "not accepted at some commit" in proc.stderr and "Traceback" not in proc.stderr
    plan = last_json(proc.stdout)
    assert plan["flags_refused"] is True and plan["flags_unchecked"] == []
    old_sha = git(engine, "rev-parse", "HEAD~1").strip()
    new_sha = git(engine, "rev-parse", "HEAD").strip()
    by_commit = {c["commit"]: c for c in plan["flag_check"]}
    assert set(by_commit) == {old_sha, new_sha}
    assert all(problems == [] for problems in by_commit[old_sha]["configs"].values())
    assert by_commit[old_sha]["error"] == "" and by_commit[old_sha]["options"] >= 3
    (problems,) = by_commit[new_sha]["configs"].values()
    assert problems == [{"option": "--batch", "status": "ambiguous",
                         "candidates": ["--batch-decode", "--batch-prefill"]}]
    assert by_commit[new_sha]["help_argv"][-1] == "--help"

    text = harness("run", spec, "--dry-run", "--check-flags", "--cache-dir", tmp_path / "cache", cwd=tmp_path,
                   timeout=120)
    assert text.returncode == 2
    assert f"{new_sha[:12]}: config 2: NOT ACCEPTED: --batch: ambiguous (could match --batch-decode, " \
           "--batch-prefill)" in text.stdout
    assert f"{old_sha[:12]}: every planned flag accepted" in text.stdout
    # nothing was booted: no ledger was written
    assert not (tmp_path / "results.db").exists()


@pytest.mark.slow
def test_check_flags_without_dry_run_is_refused(engine, tmp_path):
    proc = harness("run", spec_file(tmp_path), "--check-flags", "--cache-dir", tmp_path / "cache", cwd=tmp_path)
    assert proc.returncode == 2 and "--check-flags goes with --dry-run" in proc.stderr


# --------------------------------------------------------------------------- the boot


@pytest.mark.slow
def test_refused_flag_is_recorded_as_not_accepted_not_a_crash(engine, tmp_path):
    spec = spec_file(tmp_path)
    db = tmp_path / "r.db"
    proc = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir",
                   tmp_path / "exp", "--cache-dir", tmp_path / "cache", cwd=tmp_path, timeout=300)
    # the engine refused the flag at that commit: not measured, and bad input (exit 2)
    assert proc.returncode == 2, proc.stderr[-3000:]
    verdict = last_json(proc.stdout)["hypotheses"][0]
    new_sha = git(engine, "rev-parse", "HEAD").strip()
    assert verdict["verdict"] == "not measured"
    assert f"flag not accepted at commit {new_sha[:12]}: server.py: error: {AMBIGUOUS}" in verdict["reason"]
    assert any("flag_not_accepted" in w for w in verdict["warnings"])
    assert "flag not accepted at commit" in " ".join(proc.stderr.split())  # the verdict line, unwrapped

    rows = query(db, "SELECT c.`commit`, b.status, b.marks, b.failure, b.provenance, c.status "
                     "FROM boots b JOIN configs c ON c.id = b.config_id ORDER BY b.id")
    refused = [r for r in rows if r[0] == new_sha]
    assert len(refused) == 1, "a flag the commit refuses is not retried"
    _, status, marks, failure, prov, config_status = refused[0]
    assert status == "failed" and json.loads(marks) == ["flag_not_accepted"]
    assert failure.startswith("flag not accepted at this commit: server.py: error: " + AMBIGUOUS)
    assert json.loads(prov)["flag_not_accepted"]["engine_message"] == f"server.py: error: {AMBIGUOUS}"
    assert config_status == "boot_failed"
    kept = [r for r in rows if r[0] != new_sha]
    assert [r[1] for r in kept] == ["ok", "ok"]
    # a source whose `when` excludes the config is not collected and marks nothing
    assert all("source_unmatched" not in json.loads(r[2]) for r in kept)
    assert all(json.loads(r[4])["sources_not_applicable"] == ["big_batch_only"] for r in kept)
    samples = query(db, "SELECT s.metrics FROM samples s JOIN boots b ON b.id = s.boot_id")
    assert [json.loads(m)["batch_seen"] for (m,) in samples] == [4.0, 4.0]

    (journal,) = (tmp_path / "exp").glob("*-run*.md")
    text = journal.read_text()
    assert f"flag not accepted at this commit: `server.py: error: {AMBIGUOUS}`" in text
    assert "flag_not_accepted x1" in text


# --------------------------------------------------------------------------- ServerProcess, directly


def _launch(tmp_path, source: str, *args: str, **kw) -> ServerProcess:
    (tmp_path / "server.py").write_text(source)
    port = free_port()
    return ServerProcess([sys.executable, "server.py", "--port", str(port), *args], env={"PATH": "/usr/bin:/bin"},
                         cwd=tmp_path, log_path=tmp_path / "boot.log", base_url=f"http://127.0.0.1:{port}",
                         ready_timeout_s=kw.pop("ready_timeout_s", 30), **kw)


@pytest.mark.parametrize("args, message", [
    (("--batch", "4"), "server.py: error: " + AMBIGUOUS),
    (("--unknown", "1"), "server.py: error: unrecognized arguments: --unknown 1"),
])
def test_server_process_raises_flag_not_accepted_with_the_engines_message(tmp_path, args, message):
    with pytest.raises(FlagNotAccepted) as e:
        _launch(tmp_path, server_source(NEW_FLAGS), *args).start()
    assert e.value.engine_message == message
    assert str(e.value).startswith(f"flag not accepted at this commit: {message}")


def test_exit_2_without_argparse_refusal_is_a_plain_boot_failure(tmp_path):
    (tmp_path / "server.py").write_text("import sys\nprint('error: out of memory')\nsys.exit(2)\n")
    srv = ServerProcess([sys.executable, "server.py"], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path,
                        log_path=tmp_path / "boot.log", base_url="http://127.0.0.1:9", ready_timeout_s=30)
    with pytest.raises(BootFailed) as e:
        srv.start()
    assert not isinstance(e.value, FlagNotAccepted)
    assert "exited with code 2" in str(e.value)


def test_readiness_probe_uses_the_request_timeout(tmp_path):
    # /health answers after 5.5 s, as SGLang's /health_generate runs a generation first;
    # each probe used to be cut at 5 s, so such a server never became ready
    slow = server_source(OLD_FLAGS, delay=5.5)
    with _launch(tmp_path, slow, health_request_timeout_s=8.0, ready_timeout_s=30) as srv:
        assert srv.ready_after_s is not None and srv.ready_after_s >= 5.5
    with pytest.raises(BootTimeout):
        _launch(tmp_path, server_source(OLD_FLAGS, delay=1.0), health_request_timeout_s=0.5,
                ready_timeout_s=3).start()


# --------------------------------------------------------------------------- pure parts


def _help(*specs) -> str:
    p = argparse.ArgumentParser(prog="serve")
    for name, kw in specs:
        p.add_argument(name, **kw)
    return p.format_help()


def test_help_options_and_check_argv_on_real_argparse_help():
    text = _help(("--port", {}), ("--cuda-graph-max-bs-decode", {}), ("--cuda-graph-max-bs-prefill", {}),
                 ("--enforce-eager", {"action": argparse.BooleanOptionalAction}), ("--tp-size", {}))
    opts = help_options(text)
    assert {"--port", "--cuda-graph-max-bs-decode", "--enforce-eager", "--no-enforce-eager", "--help"} <= opts
    problems = check_argv(["python", "-m", "x", "--port", "1", "--cuda-graph-max-bs", "8", "--no-enforce-eager",
                           "--tp", "4", "--speculative-config", '{"a": 1}', "--port=2"], opts)
    assert [(p.option, p.status, p.candidates) for p in problems] == [
        ("--cuda-graph-max-bs", "ambiguous", ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill")),
        ("--tp", "abbreviation", ("--tp-size",)),
        ("--speculative-config", "not_accepted", ()),
    ]
    assert [p.refused for p in problems] == [True, False, True]
    # vLLM's --json-arg.key form is a key of a known option
    assert check_argv(["--speculative-config.method", "eagle3"], help_options("--speculative-config JSON")) == []


def test_argparse_rejection_reads_the_engines_error_line():
    log = textwrap.dedent("""\
        INFO starting
        usage: launch_server.py [-h] [--cuda-graph-max-bs-decode N]
        launch_server.py: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill
        """)
    assert argparse_rejection(log).startswith("launch_server.py: error: ambiguous option: --cuda-graph-max-bs")
    assert argparse_rejection("vllm serve: error: argument --dtype: invalid choice: 'bf17' (choose from auto)") \
        .endswith("invalid choice: 'bf17' (choose from auto)")
    assert argparse_rejection("RuntimeError: error: CUDA out of memory") is None
    assert argparse_rejection("") is None


HELP_WITNESS = '''import argparse, json, os, sys
p = argparse.ArgumentParser()
p.add_argument("--host")
p.add_argument("--port")
p.add_argument("--batch", type=int)
if any(a.startswith("--help") for a in sys.argv):  # vLLM's preset asks --help=all
    with open(os.environ["SEEN_FILE"], "a") as f:  # where and how the flag check ran this --help
        f.write(json.dumps({"cwd": os.getcwd(), "python": sys.executable, "arm": os.environ.get("ARM_VAR"),
                            "preset_env": os.environ.get("VLLM_SERVER_DEV_MODE")}) + "\\n")
    p.print_help()
    sys.exit(0)
p.parse_args()
'''


@pytest.mark.slow
def test_check_flags_runs_the_help_where_and_how_each_commit_boots(tmp_path):
    """The flag check takes each commit's worktree, environment, placeholders, working
    folder and process env from the boot request, through run_boot's own functions."""
    from pathlib import Path

    from bisect_harness.engines import recipe
    from bisect_harness.plan.flag_check import check_plan_flags
    from bisect_harness.spec import load_spec
    from bisect_harness.plan.build import make_plan

    repo = tmp_path / "engine"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for n in (1, 2):
        (repo / "server.py").write_text(HELP_WITNESS + f"# revision {n}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"revision {n}")
    seen = tmp_path / "seen.jsonl"
    spec = load_spec(write_spec(
        tmp_path / "hypotheses.yaml",
        engine={"preset": "vllm", "repo": "engine", "cwd": "{worktree}/sub",
                "build": ["{python}", "-c", "import os; os.makedirs('sub', exist_ok=True)"],
                "launch": ["{python}", "{worktree}/server.py", "--host", "{host}", "--port", "{port}"],
                "env": {"SEEN_FILE": str(seen)}},
        hypotheses=[{"id": "h", "baseline": {"commit": "HEAD~1", "env": {"ARM_VAR": "a"}, "flags": {"batch": 4}},
                     "treatment": {"commit": "HEAD", "env": {"ARM_VAR": "b"}, "flags": {"batch": 4}},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]))
    plan = make_plan(spec, cache_dir=tmp_path / "cache")
    report = check_plan_flags(plan, timeout_s=60)
    assert [r.error for r in report] == ["", ""] and all(r.options >= 3 for r in report)
    assert all(problems == () for r in report for problems in r.problems.values())
    lines = [json.loads(x) for x in seen.read_text().splitlines()]
    assert [x["arm"] for x in lines] == ["a", "b"] and {x["preset_env"] for x in lines} == {"1"}
    for c, got in zip(plan.configs, lines):
        req = plan.boot_request(c, boot_id=1, seq=1, log_path=tmp_path / "b.log")
        worktree, cenv = recipe.checkout(req)  # what run_boot gets for this boot (cached: the same)
        assert Path(got["cwd"]) == worktree / "sub" and got["python"] == cenv.python
        assert cenv.venv is not None  # each commit its own environment
    assert lines[0]["python"] != lines[1]["python"]


def test_engine_checkout_reaches_the_build_and_the_launch(tmp_path):
    """``engine.checkout: clone`` goes from the file through the plan's request to the
    folder each commit is built and run in; a build that needs ``.git`` as a folder
    fails in a worktree and runs in a clone."""
    from pathlib import Path

    from bisect_harness.plan.flag_check import check_plan_flags
    from bisect_harness.spec import load_spec
    from bisect_harness.plan.build import make_plan

    repo = tmp_path / "engine"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "server.py").write_text(HELP_WITNESS)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "server")
    seen = tmp_path / "seen.jsonl"

    def plan_for(mode):
        spec = load_spec(write_spec(
            tmp_path / f"{mode}.yaml",
            engine={"preset": "vllm", "repo": "engine", "checkout": mode, "environment": "shared",
                    "build": ["{python}", "-c", "import os, sys; sys.exit(0 if os.path.isdir('.git') else 4)"],
                    "launch": ["{python}", "{worktree}/server.py", "--host", "{host}", "--port", "{port}"],
                    "env": {"SEEN_FILE": str(seen)}},
            hypotheses=[{"id": "h", "baseline": {"commit": "HEAD"}, "treatment": {"commit": "HEAD", "flags": {"batch": 2}},
                         "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]))
        return make_plan(spec, cache_dir=tmp_path / "cache")

    plan = plan_for("worktree")
    # the config's launch template (the journal's) keeps {worktree}: each boot has its own folder
    assert "{worktree}/server.py" in plan.recipe(plan.configs[0]).argv
    (failed,) = {r.error for r in check_plan_flags(plan, timeout_s=60)}
    assert "build failed" in failed and "exit 4" in failed, failed
    assert [r.error for r in check_plan_flags(plan_for("clone"), timeout_s=60)] == [""]  # one commit
    cwds = {Path(json.loads(x)["cwd"]) for x in seen.read_text().splitlines()}
    sha = git(repo, "rev-parse", "HEAD").strip()
    assert [(p.parent.name, p.name) for p in cwds] == [("clones", sha)]
