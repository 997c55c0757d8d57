"""A preset's own launch options against an old build: dropped with a note, or named.

The llamacpp preset's launch adds ``--metrics``; a 2023 llama.cpp ``server`` refuses
it (``error: unknown argument: --metrics``, exit 1). ``tests/old_llama_server.py``
stands in for that server (a real process on loopback, installed as
``llama-server`` on PATH): a boot reads its ``--help`` first and launches without
``--metrics``, saying so; where its help cannot be read, the boot's failure names
the preset's flag. The real llama-server (``BISECT_HARNESS_LLAMACPP``) names
``--metrics`` in its help and keeps it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bisect_harness.backends.procedure import run_boot
from bisect_harness.boot import Sink
from bisect_harness.engines.preset_flags import adapt_launch, refused_preset_flag
from bisect_harness.plan.build import make_plan
from bisect_harness.spec import load_spec
from helpers import harness, last_json, write_spec

HERE = Path(__file__).resolve().parent
REAL = Path(os.environ.get("BISECT_HARNESS_LLAMACPP", Path.home() / ".cache" / "bisect-harness" / "llamacpp"))


def install_old_server(folder: Path) -> Path:
    """``folder/llama-server``: the 2023 stand-in, runnable by name."""
    folder.mkdir(parents=True, exist_ok=True)
    exe = folder / "llama-server"
    exe.write_text(f"#!{sys.executable}\n" + (HERE / "old_llama_server.py").read_text())
    exe.chmod(0o755)
    return folder


def old_spec(tmp_path: Path, **engine) -> Path:
    return write_spec(
        tmp_path / "hypotheses.yaml",
        engine={"preset": "llamacpp", "ready_timeout_s": 30, "flags": {"model": "m.gguf", "threads": 1}, **engine},
        benchmark={"api": "llamacpp", "prompt_tokens": 8, "output_tokens": 4, "requests_per_sample": 1,
                   "warmup_requests": 0, "concurrency": 1},
        defaults={"samples_per_boot": 1},
        hypotheses=[{"id": "threads", "baseline": {}, "treatment": {"flags": {"threads": 2}},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%"}])


class Messages(Sink):
    def __init__(self):
        self.texts: list[str] = []

    def message(self, text: str) -> None:
        self.texts.append(text)


def boot_once(tmp_path: Path, spec_path: Path):
    plan = make_plan(load_spec(spec_path), cache_dir=tmp_path / "cache")
    req = plan.boot_request(plan.configs[0], boot_id=1, seq=1, log_path=tmp_path / "logs" / "boot.log")
    sink = Messages()
    return req, run_boot(req, sink), sink.texts


@pytest.fixture
def old_server(tmp_path, monkeypatch):
    bin_dir = install_old_server(tmp_path / "bin")
    args = tmp_path / "launches.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("OLD_SERVER_ARGS", str(args))
    return args


def test_an_old_build_without_metrics_boots_without_the_presets_flag_and_says_so(tmp_path, old_server):
    req, out, messages = boot_once(tmp_path, old_spec(tmp_path))
    assert req.preset_flags == ("--metrics",) and "--metrics" in req.argv  # planned as the preset writes it
    assert out.status == "ok", (out.failure, out.log_tail)
    assert "--metrics" not in out.argv and out.samples
    launched = [json.loads(line) for line in old_server.read_text().splitlines()]
    assert launched[-1][0:2] == ["--host", "127.0.0.1"] and "--metrics" not in launched[-1]
    assert "--help" in launched[0]  # the help was read first, without the preset's flag
    assert out.evidence.preset_flags["dropped"] == ["--metrics"]
    assert any("does not name the preset's --metrics: launched without it" in m for m in messages), messages


def test_an_old_build_whose_help_cannot_be_read_is_refused_in_plain_words(tmp_path, old_server, monkeypatch):
    monkeypatch.setenv("OLD_SERVER_HELP", "broken")
    _req, out, messages = boot_once(tmp_path, old_spec(tmp_path))
    assert out.status == "failed" and "flag_not_accepted" in out.marks
    assert "--metrics" in out.argv
    assert "this build refused its preset's flag --metrics" in out.config_failure, out.config_failure
    assert "error: unknown argument: --metrics" in out.config_failure
    assert any("kept unchecked" in m for m in messages), messages


def test_a_launch_the_file_writes_is_never_changed(tmp_path, old_server):
    """engine.launch written in the file: its --metrics is the user's, not dropped."""
    launch = ["llama-server", "--host", "{host}", "--port", "{port}", "--metrics"]
    req, out, _ = boot_once(tmp_path, old_spec(tmp_path, launch=launch))
    assert req.preset_flags == () and out.status == "failed"
    assert "error: unknown argument: --metrics" in out.config_failure
    assert "preset's flag" not in out.config_failure


def test_the_dry_run_says_what_the_preset_adds_and_what_a_build_drops(tmp_path, old_server):
    spec = old_spec(tmp_path)
    plain = harness("run", spec, "--dry-run", "--cache-dir", tmp_path / "cache", env=dict(os.environ))
    assert plain.returncode == 0, plain.stderr
    assert "llama-server with --metrics" not in plain.stdout
    assert "preset flags: --metrics (the preset's own: each boot reads the build's --help first" in plain.stdout
    checked = harness("run", spec, "--dry-run", "--check-flags", "--json", "--cache-dir", tmp_path / "cache",
                      env=dict(os.environ))
    assert checked.returncode == 0, checked.stderr
    obj = last_json(checked.stdout)
    assert [c["preset_flags_dropped"] for c in obj["flag_check"]] == [["--metrics"]]
    assert not obj["flags_refused"]
    text = harness("run", spec, "--dry-run", "--check-flags", "--cache-dir", tmp_path / "cache", env=dict(os.environ))
    assert "the preset's --metrics not in this build's --help: its boots launch without it" in text.stdout


def test_adapt_and_refusal_read_the_help_and_the_message(tmp_path, old_server):
    bin_dir = tmp_path / "bin"
    argv = [str(bin_dir / "llama-server"), "--port", "1", "--metrics"]
    got = adapt_launch(argv, ("--metrics",), [str(bin_dir / "llama-server"), "--help"], env=dict(os.environ),
                       cwd=tmp_path)
    assert got.argv == tuple(argv[:3]) and got.dropped == ("--metrics",) and got.checked
    assert refused_preset_flag("error: unknown argument: --metrics", ("--metrics",)) == "--metrics"
    assert refused_preset_flag("error: unknown argument: --verbose", ("--metrics",)) is None


@pytest.mark.slow
def test_the_real_llama_server_keeps_metrics(tmp_path, monkeypatch):
    server = REAL / "bin" / "llama-server"
    if not server.exists():
        if os.environ.get("BISECT_HARNESS_REQUIRE_REAL_ENGINES") == "1":
            pytest.fail(f"no llama-server at {server}")
        pytest.skip(f"no llama-server at {server}")
    from tinygguf import build_tiny_gguf

    model = build_tiny_gguf(tmp_path / "tiny.gguf", layers=4)
    monkeypatch.setenv("PATH", f"{server.parent}{os.pathsep}{os.environ['PATH']}")
    spec = write_spec(
        tmp_path / "hypotheses.yaml",
        engine={"preset": "llamacpp", "ready_timeout_s": 60,
                "flags": {"model": str(model), "ctx-size": 512, "threads": 1, "parallel": 1},
                "metrics": [{"name": "predicted", "from": "prometheus", "metric": "llamacpp:tokens_predicted_total",
                             "kind": "rate", "better": "higher"}]},
        benchmark={"api": "llamacpp", "prompt_tokens": 8, "output_tokens": 24, "requests_per_sample": 2,
                   "warmup_requests": 0, "ignore_eos": True},
        defaults={"samples_per_boot": 1},
        hypotheses=[{"id": "t", "baseline": {}, "treatment": {"flags": {"threads": 2}},
                     "metric": "tok_s", "expect": "increase", "min_effect": "10%"}])
    _req, out, messages = boot_once(tmp_path, spec)
    assert out.status == "ok", (out.failure, out.log_tail)
    assert "--metrics" in out.argv and out.evidence.preset_flags["kept"] == ["--metrics"]
    assert out.samples[0].metrics.get("predicted", 0) > 0  # /metrics answered: the flag took effect
    assert not messages
    # today's llama-server refuses an option it lacks in its own words, exit 1: a refusal, not a crash
    from bisect_harness.engines.server import ServerProcess, free_port
    from bisect_harness.errors import FlagNotAccepted

    port = free_port()
    with pytest.raises(FlagNotAccepted, match="error: invalid argument: --no-such-flag"):
        with ServerProcess([str(server), "--port", str(port), "--no-such-flag"], env=dict(os.environ), cwd=tmp_path,
                           log_path=tmp_path / "refused.log", base_url=f"http://127.0.0.1:{port}", ready_timeout_s=30):
            pass
