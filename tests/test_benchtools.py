"""``benchmark.tool``: the engine's own benchmark client as the boot's samples.

Neither vLLM nor SGLang installs here, so ``bench_tool_standin.py`` stands in for
``vllm bench serve`` (vLLM 0.33.0, vllm/benchmarks/serve.py) and
``python -m sglang.bench_serving`` (SGLang 0.5.23, sglang/benchmark/serving.py): it
takes the same options (argparse: an option they lack exits 2), sends real requests
and writes a result with their key names. Runs go against a real demo boot and a
real server that wants a bearer token.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from bench_tool_standin import _sglang_parser, _vllm_parser, standin_bin
from bisect_harness.engines import benchtools
from bisect_harness.engines.benchtools import Endpoint, get_tool, run_owned, sample_runner
from bisect_harness.measure.client import SampleFailed
from bisect_harness.errors import SpecError, UserError
from bisect_harness.model import BenchmarkSpec
from bisect_harness.spec import parse_spec
from helpers import SMALL_BENCH, harness, last_json, query, write_spec

BENCH = BenchmarkSpec(prompt_tokens=8, output_tokens=12, requests_per_sample=3, concurrency=2, warmup_requests=1,
                      seed=5, temperature=0.0, ignore_eos=True)


def test_argv_uses_the_tools_own_options():
    where = Endpoint("http://127.0.0.1:30000", host="127.0.0.1", port=30000)
    result = Path("/r/sample-1.json")
    v = _vllm_parser().parse_args(get_tool("vllm-bench-serve").options(BENCH, where, result, 1))
    assert (v.host, v.port, v.backend, v.endpoint, v.dataset_name) == ("127.0.0.1", 30000, "openai",
                                                                        "/v1/completions", "random")
    assert (v.random_input_len, v.random_output_len, v.random_range_ratio) == (8, 12, "0.0")
    assert (v.num_prompts, v.max_concurrency, v.num_warmups, v.seed, v.ignore_eos) == (3, 2, 1, 5, True)
    assert (v.save_result, v.result_dir, v.result_filename) == (True, "/r", "sample-1.json")
    assert v.metric_percentiles == "50,90,99" and v.request_rate == float("inf")
    s = _sglang_parser().parse_args(get_tool("sglang-bench-serving").options(
        BenchmarkSpec(api="generate", ignore_eos=False, model="m"), Endpoint("https://h.example/x"), result, 0))
    assert (s.backend, s.base_url, s.dataset_name, s.random_range_ratio) == ("sglang", "https://h.example/x",
                                                                             "random-ids", 1.0)
    assert (s.output_file, s.disable_ignore_eos, s.model, s.warmup_requests) == (str(result), True, "m", 0)
    assert get_tool("sglang-bench-serving").command("/env/bin/python") == ["/env/bin/python", "-m",
                                                                          "sglang.bench_serving"]
    # benchmark.tool_args come last, so they win over ours for one-value options
    bench = BenchmarkSpec(tool="vllm-bench-serve", tool_args=("--tokenizer", "/models/tok", "--dataset-name",
                                                              "sharegpt"))
    argv = get_tool("vllm-bench-serve").argv(bench, where, "python", result, 0)
    v = _vllm_parser().parse_args(argv[3:])
    assert argv[-4:] == ["--tokenizer", "/models/tok", "--dataset-name", "sharegpt"]
    assert (v.tokenizer, v.dataset_name) == ("/models/tok", "sharegpt")


def test_result_keys_become_our_metrics():
    keys = {"output_throughput": 100.0, "mean_e2el_ms": 900.0}
    for what in ("ttft", "itl", "tpot"):
        keys.update({f"mean_{what}_ms": 1.0, f"p50_{what}_ms": 2.0, f"p90_{what}_ms": 3.0, f"p99_{what}_ms": 4.0})
    m = get_tool("vllm-bench-serve").metrics(keys)
    assert m["tok_s"] == 100.0 and m["ttft_p50_ms"] == 2.0 and m["itl_p99_ms"] == 4.0 and m["e2e_ms"] == 900.0
    with pytest.raises(SampleFailed, match="p50_ttft_ms"):
        get_tool("vllm-bench-serve").metrics({k: v for k, v in keys.items() if k != "p50_ttft_ms"})
    sg = {k.replace("p50_", "median_").replace("mean_e2el_ms", "mean_e2e_latency_ms"): v for k, v in keys.items()}
    assert get_tool("sglang-bench-serving").metrics(sg)["ttft_p50_ms"] == 2.0


def test_a_real_sglang_bench_serving_result_is_read():
    # Written by the real `python -m sglang.bench_serving` of the released wheel sglang-0.5.23
    # (sglang/benchmark/serving.py, benchmark(): one JSON line appended per run to --output-file),
    # run by bench/bench_engine_tools.py with the harness's argv against the demo engine: two runs
    # appended to one file. The last line is the run; every mapped key is there, in ms and tok/s.
    fixture = Path(__file__).parent / "fixtures" / "engines" / "sglang-0.5.23-bench_serving.jsonl"
    tool = get_tool("sglang-bench-serving")
    lines = [json.loads(ln) for ln in fixture.read_text().splitlines()]
    data = tool.read(fixture)
    assert len(lines) == 2 and data == lines[-1] and data != lines[0]
    m = tool.metrics(data)
    assert set(m) == set(tool.keys) and all(isinstance(v, float) and v == v for v in m.values())
    assert m["tok_s"] == data["output_throughput"] == pytest.approx(data["total_output_tokens"] / data["duration"])
    assert m["ttft_p50_ms"] == data["median_ttft_ms"] and m["itl_p99_ms"] == data["p99_itl_ms"]
    assert m["e2e_ms"] == data["mean_e2e_latency_ms"]
    # in ms (not s): a demo boot's TTFT lies between 1 ms and 10 s; a token's time is below a request's
    assert 1.0 < m["ttft_ms"] < 10_000 and m["ttft_ms"] <= m["ttft_p99_ms"] and m["tpot_ms"] < m["e2e_ms"]
    assert (data["backend"], data["dataset_name"], data["random_range_ratio"]) == ("sglang", "random-ids", 1.0)
    assert data["completed"] == 8 and "failed" not in data  # ToolRunner counts errors as requests - completed


def test_spec_checks_the_tool(tmp_path):
    def parse(bench, metrics="[]"):
        return parse_spec(textwrap.dedent(f"""\
            engine: {{launch: [srv], metrics: {metrics}}}
            benchmark: {bench}
            hypotheses: [{{id: h, baseline: {{}}, treatment: {{}}, metric: ttft_p50_ms, expect: decrease,
                          min_effect: 10%}}]
            """), tmp_path / "h.yaml")

    assert parse("{tool: vllm-bench-serve}").benchmark.tool == "vllm-bench-serve"
    assert parse("{tool: vllm-bench-serve, tool_args: '--tokenizer /m/t'}").benchmark.tool_args == (
        "--tokenizer", "/m/t")
    for bench, key, words in (("{tool: vllm-bench}", "benchmark.tool", "known: sglang-bench-serving"),
                              ("{tool: vllm-bench-serve, api: generate}", "benchmark.tool", "api: completions"),
                              ("{tool_args: [--x]}", "benchmark.tool_args", "no benchmark.tool")):
        with pytest.raises(SpecError) as e:
            parse(bench)
        assert e.value.key == key and words in str(e.value)
    with pytest.raises(SpecError) as e:
        parse("{tool: sglang-bench-serving}", "[{name: al, from: response, field: accept_length, better: higher}]")
    assert e.value.key == "engine.metrics[0]" and "benchmark.tool" in str(e.value)


def test_a_missing_tool_names_benchmark_tool(tmp_path):
    env = {"PATH": str(tmp_path)}
    with pytest.raises(UserError) as e:
        sample_runner(BenchmarkSpec(tool="vllm-bench-serve"), Endpoint("http://x"), python=sys.executable, env=env,
                      cwd=tmp_path, log_path=tmp_path / "b.log")
    assert "benchmark.tool: vllm-bench-serve" in str(e.value) and "Install vLLM" in str(e.value)
    with pytest.raises(UserError) as e:
        sample_runner(BenchmarkSpec(tool="sglang-bench-serving"), Endpoint("http://x"), python=sys.executable,
                      env={**os.environ, "PYTHONPATH": ""}, cwd=tmp_path, log_path=tmp_path / "b.log")
    assert "sglang.bench_serving" in str(e.value) and "Install SGLang" in str(e.value)


def test_a_tool_past_its_deadline_is_killed_with_its_children(tmp_path):
    marker = f"bench-deadline-{os.getpid()}-{time.time_ns()}"
    code = ("import subprocess, sys, time; "
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}']); time.sleep(120)")
    t0 = time.monotonic()
    rc, wall = run_owned([sys.executable, "-c", code, marker], env=dict(os.environ), cwd=tmp_path,
                         log_path=tmp_path / "t.log", timeout_s=2.0, grace_s=1.0)
    assert rc is None and 2.0 <= wall < 20 and time.monotonic() - t0 < 20
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]
    assert not left


def test_a_tool_dies_with_a_harness_killed_by_sigkill(tmp_path):
    import signal
    import subprocess

    from helpers import wait_for

    marker = f"bench-orphan-{os.getpid()}-{time.time_ns()}"
    tool = ("import subprocess, sys, time; "
            f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}']); time.sleep(120)")
    script = tmp_path / "harness_like.py"
    script.write_text(textwrap.dedent(f"""\
        import os, sys
        from pathlib import Path
        from bisect_harness.engines.benchtools import run_owned
        run_owned([sys.executable, "-c", {tool!r}, {marker!r}], env=dict(os.environ), cwd=Path({str(tmp_path)!r}),
                  log_path=Path({str(tmp_path / "t.log")!r}), timeout_s=300)
        """))
    parent = subprocess.Popen([sys.executable, str(script)], start_new_session=True, env=dict(os.environ))

    def tools():
        return [p for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])]

    try:
        wait_for(lambda: len(tools()) == 2, timeout=30, what="the tool and its child")
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    wait_for(lambda: not tools(), timeout=30, what="the supervisor to end the tool's tree")


@pytest.mark.slow
def test_sglang_tool_against_a_server_that_wants_a_key(tmp_path):
    from test_attach import KEY, AuthServer

    _, site = standin_bin(tmp_path / "standin")
    server = AuthServer(tmp_path, 2.0, "auth")
    try:
        headers = {"Authorization": f"Bearer {KEY}"}
        endpoint = Endpoint(server.url, headers=headers, api_key=KEY)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
        runner = sample_runner(BenchmarkSpec(tool="sglang-bench-serving", model="auth-model", prompt_tokens=4,
                                             output_tokens=10, requests_per_sample=3, concurrency=3,
                                             warmup_requests=2, ignore_eos=False),
                               endpoint, python=sys.executable, env=env, cwd=tmp_path, log_path=tmp_path / "b.log")
        details = [runner.sample(i) for i in range(2)]
        assert server.counts()["auth_engine_refused_total"] == 0
        assert server.counts()["auth_engine_requests_total"] >= 2 + 3 + 3  # warmup on the first run only
    finally:
        server.stop()
    runs = runner.provenance()["bench_tool"]["runs"]
    for d, run in zip(details, runs):
        raw = run["result"]
        assert d.result.metrics["tok_s"] == raw["output_throughput"]
        assert d.result.metrics["ttft_p50_ms"] == raw["median_ttft_ms"]
        assert d.result.metrics["itl_p99_ms"] == raw["p99_itl_ms"]
        assert (d.result.requests, d.result.output_tokens) == (3, 30)
        assert (raw["random_input_len"], raw["random_output_len"], raw["max_concurrency"]) == (4, 10, 3)
        assert all(KEY not in a for a in run["argv"])  # the key travels in the tool's env only
    assert "--warmup-requests" in runs[0]["argv"] and runs[0]["argv"][runs[0]["argv"].index("--warmup-requests") + 1] == "2"
    assert runs[1]["argv"][runs[1]["argv"].index("--warmup-requests") + 1] == "0"
    # each run draws its random prompts from a seed of its own: no prefix cache serves the second
    seeds = [run["argv"][run["argv"].index("--seed") + 1] for run in runs]
    assert len(set(seeds)) == 2, seeds


def test_a_tools_seed_is_its_samples_own_unless_prompts_are_reused():
    from bisect_harness.engines.benchtools import tool_seed

    bench = BenchmarkSpec(tool="vllm-bench-serve", seed=3)
    seeds = {tool_seed(bench, boot, sample) for boot in (1, 2) for sample in (1, 2, 3)}
    assert len(seeds) == 6 and all(0 <= s < 2 ** 31 for s in seeds)
    assert tool_seed(bench, 1, 1) == tool_seed(bench, 1, 1)
    reused = BenchmarkSpec(tool="vllm-bench-serve", seed=3, prompt_reuse=True)
    assert {tool_seed(reused, boot, sample) for boot in (1, 2) for sample in (1, 2)} == {3}


@pytest.mark.slow
def test_vllm_tool_measures_real_demo_boots(tmp_path):
    bin_dir, _ = standin_bin(tmp_path / "standin")
    spec = write_spec(
        tmp_path / "hypotheses.yaml", engine={"preset": "demo"},
        benchmark={**SMALL_BENCH, "tool": "vllm-bench-serve", "requests_per_sample": 3, "concurrency": 1},
        defaults={"samples_per_boot": 2, "boots_per_arm": 2, "max_boots_per_arm": 2, "host_preflight_s": 0},
        hypotheses=[{"id": "a-a", "baseline": {}, "treatment": {}, "metric": "ttft_p50_ms", "expect": "decrease",
                     "min_effect": "30%"}])
    db = tmp_path / "r.db"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = harness("run", spec, "--json", "--no-calibration", "--ledger", f"sqlite:///{db}",
                   "--journal-dir", tmp_path / "exp", cwd=tmp_path, env=env, timeout=540)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (h,) = last_json(proc.stdout)["hypotheses"]
    assert h["boots"] == {"baseline": 2, "treatment": 2} and h["verdict"] in ("confirmed", "refuted", "inconclusive")
    boots = query(db, "SELECT id, port, provenance FROM boots WHERE status = 'ok' ORDER BY id")
    assert len(boots) == 4
    for boot_id, port, prov in boots:
        runs = json.loads(prov)["bench_tool"]["runs"]
        assert [r["sample"] for r in runs] == [1, 2]
        argv = runs[0]["argv"]
        assert argv[:3] == ["vllm", "bench", "serve"] and argv[argv.index("--port") + 1] == str(port)
        samples = query(db, "SELECT metrics, requests, output_tokens FROM samples WHERE boot_id = ? ORDER BY seq",
                        (boot_id,))
        for (metrics, requests, tokens), run in zip(samples, runs):
            m, raw = json.loads(metrics), run["result"]
            assert m["tok_s"] == raw["output_throughput"] and m["ttft_p90_ms"] == raw["p90_ttft_ms"]
            assert m["tpot_ms"] == raw["mean_tpot_ms"] and m["e2e_ms"] == raw["mean_e2el_ms"]
            assert raw["num_prompts"] == 3 and raw["completed"] == requests == 3
            assert tokens == raw["total_output_tokens"] == 3 * SMALL_BENCH["output_tokens"]


@pytest.mark.slow
def test_missing_tool_stops_the_run_naming_the_key(tmp_path):
    spec = write_spec(
        tmp_path / "hypotheses.yaml", engine={"preset": "openai", "base_url": "http://127.0.0.1:9"},
        benchmark={"tool": "vllm-bench-serve"}, defaults={"host_preflight_s": 0},
        hypotheses=[{"id": "a-a", "baseline": {}, "treatment": {}, "metric": "tok_s", "expect": "increase",
                     "min_effect": "20%"}])
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}
    proc = harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{tmp_path / 'r.db'}",
                   "--journal-dir", tmp_path / "exp", cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "benchmark.tool: vllm-bench-serve" in proc.stderr and "Install vLLM" in proc.stderr
    assert benchtools.TOOLS["vllm-bench-serve"].name == "vllm-bench-serve"
