"""Flag checks and metric sources against payloads shaped as SGLang 0.5.23 and
vLLM 0.33.0 produce them (``fixtures/engines``; each file's header names the
source files it was read from).

Server info and ``/metrics`` are served over real HTTP on loopback; the streams
are replayed to the real client, whose responses feed the real collector.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_harness.engines import presets
from bisect_harness.measure.client import measure_sample_detail
from bisect_harness.model import BenchmarkSpec
from bisect_harness.observe.provenance import MATCHED, MISMATCHED, NOT_REPORTED, flag_report, values_match
from bisect_harness.measure.sources import SourceCollector, applicable, parse_source
from helpers import FakeServer

ENGINES = Path(__file__).parent / "fixtures" / "engines"


def load_json(name: str) -> dict:
    """A JSON fixture without its '#' header lines."""
    text = (ENGINES / name).read_text()
    return json.loads("\n".join(ln for ln in text.splitlines() if not ln.startswith("#")))


SGLANG_INFO = "sglang-0.5.23-server_info.json"
VLLM_INFO = "vllm-0.33.0-server_info.json"


def check(preset_name: str, flags: dict, info: dict):
    """The flag report exactly as the executor builds it for a boot."""
    preset = presets.get_preset(preset_name)
    keys = {f: presets.info_key(f, preset) for f in flags}
    checkable = {f: v for f, v in flags.items() if keys[f] is not None}
    return flag_report(checkable, info, aliases={f: k for f, k in keys.items() if k},
                       compare={f: presets.compare_mode(f, preset) for f in checkable})


# --------------------------------------------------------------------------- flag checks


def test_vllm_tp_mismatch_is_found_in_the_nested_config():
    rep = check("vllm", {"tp": 8}, load_json(VLLM_INFO))
    c = rep.check("tp")
    assert c.status == MISMATCHED and c.effective == 4
    assert c.key == "vllm_config.parallel_config.tensor_parallel_size"
    assert not rep.ok


def test_vllm_flags_match_with_dtype_spelling_and_speculative_subset():
    flags = {"model": "meta-llama/Llama-3.1-8B-Instruct", "tensor-parallel-size": 4, "dtype": "bfloat16",
             "max-model-len": 8192, "enable-prefix-caching": True,
             "speculative-config": {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                    "num_speculative_tokens": 2}}
    rep = check("vllm", flags, load_json(VLLM_INFO))
    assert [c.status for c in rep.checks] == [MATCHED] * len(flags), rep.describe()
    assert rep.check("dtype").effective == "torch.bfloat16"


def test_vllm_speculative_config_value_that_differs_is_a_mismatch():
    flags = {"dtype": "float16", "speculative-config": {"method": "eagle3", "num_speculative_tokens": 3}}
    rep = check("vllm", flags, load_json(VLLM_INFO))
    assert rep.check("dtype").status == MISMATCHED
    assert rep.check("speculative-config").status == MISMATCHED
    # a key the server does not report at all is not silently accepted either
    rep = check("vllm", {"speculative-config": {"method": "eagle3", "no_such_key": 1}}, load_json(VLLM_INFO))
    assert rep.check("speculative-config").status == MISMATCHED


def test_vllm_flag_outside_the_map_is_not_checked():
    rep = check("vllm", {"tp": 4, "swap-space": 4}, load_json(VLLM_INFO))
    assert [c.flag for c in rep.checks] == ["tp"]


def test_sglang_flags_against_0_5_23_server_info():
    flags = {"tp-size": 4, "dtype": "bf16", "cuda-graph-max-bs-decode": 8, "speculative-algorithm": "EAGLE3",
             "speculative-num-steps": 2, "enable-metrics": True, "mem-fraction-static": 0.85}
    rep = check("sglang", flags, load_json(SGLANG_INFO))
    assert [c.status for c in rep.checks] == [MATCHED] * len(flags), rep.describe()
    assert rep.check("cuda-graph-max-bs-decode").key == "cuda_graph_config.decode.max_bs"
    rep = check("sglang", {"tp": 8, "cuda-graph-max-bs-decode": 16}, load_json(SGLANG_INFO))
    assert [c.status for c in rep.checks] == [MISMATCHED, MISMATCHED]


def test_sglang_old_flag_name_is_not_reported_by_0_5_23():
    rep = check("sglang", {"cuda-graph-max-bs": 8}, load_json(SGLANG_INFO))
    assert rep.check("cuda-graph-max-bs").status == NOT_REPORTED
    assert "0.5.22" in presets.flag_note("--cuda-graph-max-bs", presets.get_preset("sglang"))


@pytest.mark.parametrize("a, b, mode, eq", [
    ("bfloat16", "torch.bfloat16", "dtype", True),
    ("bf16", "torch.bfloat16", "dtype", True),
    ("half", "torch.float16", "dtype", True),
    ("float16", "torch.bfloat16", "dtype", False),
    ({"a": 1}, {"a": 1, "b": 2}, "subset", True),
    ({"a": 1, "b": 3}, {"a": 1, "b": 2}, "subset", False),
    ({"a": {"x": 1}}, {"a": {"x": 1, "y": 2}}, "subset", True),
    ('{"a": 1}', {"a": 1, "b": 2}, "subset", True),
    ({"a": 1}, {"a": 1, "b": 2}, "equal", False),
])
def test_values_match_modes(a, b, mode, eq):
    assert values_match(a, b, mode) is eq


# --------------------------------------------------------------------------- served payloads


def engine_server(info_for, metrics_for) -> FakeServer:
    """Loopback HTTP serving /server_info and /metrics from fixtures; ``info_for(n)`` and
    ``metrics_for(n)`` get the read's number, so a payload can move as the server serves."""
    srv = FakeServer()
    srv.routes["/server_info"] = info_for
    srv.metrics = metrics_for
    return srv


def test_server_info_source_is_read_at_the_end_of_each_window():
    base = load_json(SGLANG_INFO)

    def info(n):  # the server's running accept length moves as it serves
        doc = json.loads(json.dumps(base))
        doc["internal_states"][0]["avg_spec_accept_length"] = 2.0 + 0.1 * n
        return doc

    srv = engine_server(info, lambda n: "")
    try:
        sources = [parse_source({"name": "accept_avg", "from": "server_info", "better": "higher",
                                 "field": "internal_states.0.avg_spec_accept_length"}, "m[0]"),
                   parse_source({"name": "graph_bs", "from": "server_info", "better": "higher",
                                 "field": "cuda_graph_config.decode.max_bs"}, "m[1]")]
        # as the executor does: server info fetched once before warmup (read 1) and the paths
        first = info(0)
        col = SourceCollector(sources, srv.url, None, server_info=first, server_info_paths=["/server_info"])
        values = []
        for _ in range(3):
            col.begin_sample()
            values.append(col.end_sample([], 1.0))
        assert [v["accept_avg"] for v in values] == pytest.approx([2.1, 2.2, 2.3])
        assert {v["graph_bs"] for v in values} == {8.0}
        assert col.problems() == []
    finally:
        srv.close()


def test_server_info_that_stops_answering_is_a_problem_not_a_stale_value():
    srv = engine_server(lambda n: load_json(SGLANG_INFO), lambda n: "")
    try:
        src = parse_source({"name": "accept_avg", "from": "server_info", "better": "higher",
                            "field": "internal_states.0.avg_spec_accept_length"}, "m[0]")
        col = SourceCollector([src], srv.url, None, server_info=load_json(SGLANG_INFO),
                              server_info_paths=["/no_such_info"])
        col.begin_sample()
        assert col.end_sample([], 1.0) == {}
        assert "no server-info path answered" in col.problems()[0]
    finally:
        srv.close()


def _metrics_text(name: str, scale: float) -> str:
    """The fixture's exposition with every counter sample scaled (a later scrape)."""
    out = []
    for line in (ENGINES / name).read_text().splitlines():
        if line.startswith("#") or "_total{" not in line:
            out.append(line)
            continue
        series, value = line.rsplit(" ", 1)
        out.append(f"{series} {float(value) * scale}")
    return "\n".join(out) + "\n"


def test_sglang_metrics_counters_and_gauges():
    srv = engine_server(lambda n: {}, lambda n: _metrics_text("sglang-0.5.23-metrics.txt", 1.0 + (n - 1)))
    try:
        sources = [parse_source(d, f"m[{i}]") for i, d in enumerate([
            {"name": "gen", "from": "prometheus", "metric": "sglang:generation_tokens_total", "kind": "delta",
             "better": "higher"},
            {"name": "gen_streamed", "from": "prometheus", "metric": "sglang:generation_tokens", "kind": "delta",
             "labels": {"is_streaming": "true"}, "better": "higher"},
            {"name": "verifies", "from": "prometheus", "metric": "sglang:spec_verify_calls", "kind": "delta",
             "better": "lower"},
            {"name": "accept_gauge", "from": "prometheus", "metric": "sglang:spec_accept_length", "kind": "gauge",
             "labels": {"tp_rank": "0"}, "better": "higher"},
        ])]
        col = SourceCollector(sources, srv.url, None)
        col.begin_sample()
        v = col.end_sample([], 1.0)
        # second scrape doubles every counter: delta = the first scrape's value
        assert v == {"gen": 3584.0, "gen_streamed": 3072.0, "verifies": 1487.0, "accept_gauge": 2.41}
        assert col.problems() == []
    finally:
        srv.close()


def test_vllm_metrics_counters_with_engine_label():
    srv = engine_server(lambda n: {}, lambda n: _metrics_text("vllm-0.33.0-metrics.txt", float(n)))
    try:
        sources = [parse_source(d, f"m[{i}]") for i, d in enumerate([
            {"name": "gen", "from": "prometheus", "metric": "vllm:generation_tokens", "kind": "delta",
             "labels": {"engine": "0"}, "better": "higher"},
            {"name": "accepted", "from": "prometheus", "metric": "vllm:spec_decode_num_accepted_tokens",
             "kind": "delta", "better": "higher"},
            {"name": "drafts", "from": "prometheus", "metric": "vllm:spec_decode_num_drafts", "kind": "delta",
             "better": "higher"},
        ])]
        col = SourceCollector(sources, srv.url, None)
        col.begin_sample()
        assert col.end_sample([], 1.0) == {"gen": 4096.0, "accepted": 2496.0, "drafts": 1600.0}
        assert col.problems() == []
    finally:
        srv.close()


def test_sglang_metrics_fixture_is_what_its_generator_writes(tmp_path):
    """The fixture comes from prometheus_client (make_sglang_metrics.py), not from hand edits."""
    import subprocess
    import sys

    out = tmp_path / "metrics.txt"
    subprocess.run([sys.executable, str(ENGINES / "make_sglang_metrics.py"), "--out", str(out)], check=True,
                   capture_output=True, timeout=60)
    assert out.read_text() == (ENGINES / "sglang-0.5.23-metrics.txt").read_text()


def test_sglang_example_prometheus_sources_read_the_0_5_23_metrics():
    """Every /metrics source of the SGLang example finds its series in SGLang 0.5.23's body."""
    import yaml

    example = Path(__file__).resolve().parents[1] / "experiments" / "sglang-eagle3" / "hypotheses.yaml"
    entries = [d for d in yaml.safe_load(example.read_text())["engine"]["metrics"] if d["from"] == "prometheus"]
    assert entries, "the SGLang example declares no /metrics source"
    srv = engine_server(lambda n: {}, lambda n: _metrics_text("sglang-0.5.23-metrics.txt", float(n)))
    try:
        sources = [parse_source(d, f"m[{i}]") for i, d in enumerate(entries)]
        col = SourceCollector(sources, srv.url, None)
        col.begin_sample()
        v = col.end_sample([], 1.0)
        assert col.problems() == []
        assert set(v) == {d["name"] for d in entries}
        assert all(x > 0 for x in v.values())
    finally:
        srv.close()


def test_sglang_metrics_histograms_have_the_source_buckets():
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families((ENGINES / "sglang-0.5.23-metrics.txt").read_text())}
    assert fams["sglang:time_to_first_token_seconds"].type == "histogram"
    itl = [s.labels["le"] for s in fams["sglang:inter_token_latency_seconds"].samples if s.name.endswith("_bucket")]
    assert itl[:3] == ["0.002", "0.004", "0.006"] and itl[-2:] == ["8.0", "+Inf"] and len(itl) == 24
    assert fams["sglang:generation_tokens"].type == "counter"
    assert not any(s.name.endswith("_created") for f in fams.values() for s in f.samples)  # multiprocess mode


# --------------------------------------------------------------------------- streams, through the real client


@pytest.fixture
def engines_streams(monkeypatch):
    import test_client

    monkeypatch.setattr(test_client, "FIXTURES", ENGINES)
    return test_client


def test_sglang_generate_stream_gives_accept_length(engines_streams):
    with engines_streams.Replay("sglang-0.5.23-generate-eagle3.sse") as replay:
        bench = BenchmarkSpec(api="generate", model="m", prompt_tokens=8, output_tokens=6, requests_per_sample=2,
                              concurrency=1, warmup_requests=0)
        detail = measure_sample_detail(replay.base_url, bench)
        assert detail.result.output_tokens == 12
        sources = [parse_source({"name": "accept_len", "from": "response", "field": "accept_length",
                                 "better": "higher"}, "m[0]"),
                   parse_source({"name": "accept_rate", "from": "response", "field": "spec_accept_rate",
                                 "better": "higher"}, "m[1]")]
        col = SourceCollector(sources, replay.base_url, None)
        col.begin_sample()
        v = col.end_sample(detail.responses, detail.result.duration_s)
        assert v == {"accept_len": pytest.approx(2.0), "accept_rate": pytest.approx(0.5)}
        assert col.problems() == []


def test_vllm_completions_stream_counts_the_servers_tokens(engines_streams):
    with engines_streams.Replay("vllm-0.33.0-completions-spec.sse") as replay:
        bench = BenchmarkSpec(api="completions", model="m", prompt_tokens=8, output_tokens=6, requests_per_sample=2,
                              concurrency=1, warmup_requests=0)
        detail = measure_sample_detail(replay.base_url, bench)
        assert detail.result.output_tokens == 12  # from usage.completion_tokens of the final chunk
        # vLLM reports no spec_verify_ct per request: accept_length is a problem, never a guess
        src = parse_source({"name": "accept_len", "from": "response", "field": "accept_length",
                            "better": "higher"}, "m[0]")
        col = SourceCollector([src], replay.base_url, None)
        col.begin_sample()
        assert col.end_sample(detail.responses, detail.result.duration_s) == {}
        assert "spec_verify_ct" in col.problems()[0]


def test_vllm_final_chunk_spec_decode_figures_through_the_real_client(engines_streams):
    """vLLM 0.33 puts per-request spec-decode figures in the final usage chunk
    (metrics.speculative_decoding); ``chunk: last`` reads them."""
    with engines_streams.Replay("vllm-0.33.0-completions-spec.sse") as replay:
        bench = BenchmarkSpec(api="completions", model="m", prompt_tokens=8, output_tokens=6, requests_per_sample=3,
                              concurrency=1, warmup_requests=0)
        detail = measure_sample_detail(replay.base_url, bench)
        assert len(detail.last_chunks) == 3 and detail.last_chunks[0]["choices"] == []
        sources = [parse_source(d, f"m[{i}]") for i, d in enumerate([
            {"name": "accept_len", "from": "response", "chunk": "last", "better": "higher",
             "field": "metrics.speculative_decoding.mean_acceptance_length"},
            {"name": "draft_rate", "from": "response", "chunk": "last", "better": "higher",
             "field": "metrics.speculative_decoding.draft_acceptance_rate"},
            {"name": "accepted", "from": "response", "chunk": "last", "better": "higher",
             "field": "metrics.speculative_decoding.num_accepted_draft_tokens"},
            # the merged fields do not hold the chunk's metrics: today's default is unchanged
            {"name": "merged", "from": "response", "better": "higher",
             "field": "metrics.speculative_decoding.mean_acceptance_length"},
        ])]
        col = SourceCollector(sources, replay.base_url, None)
        col.begin_sample()
        v = col.end_sample(detail.responses, detail.result.duration_s, detail.last_chunks)
        assert v == {"accept_len": 2.0, "draft_rate": 0.5, "accepted": 3.0}
        probs = col.problems()
        assert len(probs) == 1 and "response source 'merged'" in probs[0] and "missing in 3" in probs[0]


def test_last_chunk_source_averages_over_requests_and_reports_the_missing(engines_streams):
    src = parse_source({"name": "acc", "from": "response", "chunk": "last", "better": "higher",
                        "field": "metrics.speculative_decoding.mean_acceptance_length"}, "m[0]")
    with engines_streams.Replay("sglang-0.5.23-generate-eagle3.sse") as replay:
        # SGLang's last /generate chunk has no such field: a problem naming it, never a zero
        bench = BenchmarkSpec(api="generate", model="m", prompt_tokens=8, output_tokens=6, requests_per_sample=2,
                              concurrency=1, warmup_requests=0)
        detail = measure_sample_detail(replay.base_url, bench)
        col = SourceCollector([src], replay.base_url, None)
        col.begin_sample()
        assert col.end_sample(detail.responses, 1.0, detail.last_chunks) == {}
        assert "missing in 2 and not numeric in 0 of 2 last chunks" in col.problems()[0]
    chunk = lambda x: {"choices": [], "metrics": {"speculative_decoding": {"mean_acceptance_length": x}}}
    col = SourceCollector([src], "http://127.0.0.1:9", None)
    col.begin_sample()
    assert col.end_sample([{}, {}, {}], 1.0, [chunk(2.0), chunk(3.0), {"choices": []}]) == {"acc": 2.5}
    assert "missing in 1 and not numeric in 0 of 3" in col.problems()[0]
    assert "last chunk" in src.describe()


@pytest.mark.parametrize("entry,key,words", [
    ({"chunk": "first", "field": "usage.completion_tokens"}, "m[0].chunk", "unknown chunk 'first'; one of: merged, last"),
    ({"chunk": ["last"], "field": "usage.completion_tokens"}, "m[0].chunk", "unknown chunk"),
    ({"chunk": "last", "field": "accept_length"}, "m[0].field", "derived"),
    ({"chunk": "last"}, "m[0].field", "missing 'field'"),
])
def test_response_chunk_option_errors_name_the_key(entry, key, words):
    from bisect_harness.errors import SpecError

    with pytest.raises(SpecError) as exc:
        parse_source({"name": "x", "from": "response", "better": "higher", **entry}, "m[0]")
    assert exc.value.key == key and words in str(exc.value)


def test_merged_response_source_repr_is_unchanged_by_the_chunk_option():
    """plan.engine_fingerprint hashes the sources' repr: a merged source keeps its
    old repr (configs keep their keys), a last-chunk source has its own."""
    d = {"name": "a", "from": "response", "field": "spec_accept_rate", "better": "higher"}
    merged, explicit = parse_source(d, "m"), parse_source({**d, "chunk": "merged"}, "m")
    last = parse_source({**d, "chunk": "last"}, "m")
    assert repr(merged) == repr(explicit) and repr(merged).startswith("ResponseSource(") and "chunk" not in repr(merged)
    assert repr(last).startswith("LastChunkSource(") and repr(last) != repr(merged)


# --------------------------------------------------------------------------- sources that apply to some configs


def test_when_selects_the_configs_a_source_applies_to():
    preset = presets.get_preset("sglang")
    canon = lambda f: presets.canonical_flag(f, preset)  # noqa: E731
    accept = parse_source({"name": "accept_len", "from": "response", "field": "accept_length", "better": "higher",
                           "when": {"speculative-algorithm": True}}, "m[0]")
    eagle_only = parse_source({"name": "eagle_steps", "from": "server_info", "field": "speculative_num_steps",
                               "better": "higher", "when": {"speculative_algorithm": "EAGLE3", "tp": 4}}, "m[1]")
    plain = parse_source({"name": "gen", "from": "prometheus", "metric": "sglang:generation_tokens_total",
                          "better": "higher"}, "m[2]")
    baseline = {"model-path": "/m", "tp-size": 4}
    treatment = {**baseline, "speculative-algorithm": "EAGLE3"}
    ngram = {**baseline, "speculative-algorithm": "NGRAM", "tp-size": 4}
    assert applicable([accept, eagle_only, plain], baseline, canon) == ((plain,), (accept, eagle_only))
    assert applicable([accept, eagle_only, plain], treatment, canon) == ((accept, eagle_only, plain), ())
    assert applicable([accept, eagle_only, plain], ngram, canon) == ((accept, plain), (eagle_only,))
    off = parse_source({"name": "plain_only", "from": "response", "field": "x", "better": "higher",
                        "when": {"speculative-algorithm": False}}, "m[3]")
    assert off.applies(baseline, canon) and not off.applies(treatment, canon)


@pytest.mark.parametrize("when", [[], {}, "speculative-algorithm", {"x": [1, 2]}])
def test_when_must_map_flags_to_values(when):
    from bisect_harness.errors import SpecError

    with pytest.raises(SpecError) as e:
        parse_source({"name": "a", "from": "response", "field": "x", "better": "higher", "when": when}, "m[0]")
    assert e.value.key == "m[0].when"


def test_hypothesis_on_a_metric_its_arm_cannot_have_is_refused_up_front(tmp_path):
    from bisect_harness.errors import SpecError
    from bisect_harness.spec import load_spec
    from helpers import write_spec

    accept = {"name": "accept_len", "from": "response", "field": "accept_length", "better": "higher",
              "when": {"speculative-algorithm": True}}
    eagle = {"speculative-algorithm": "EAGLE3", "speculative-num-steps": 1}

    def spec(baseline_flags):
        return write_spec(tmp_path / "h.yaml", engine={"preset": "sglang", "flags": {"model-path": "/m"},
                                                       "metrics": [accept]},
                          hypotheses=[{"id": "steps", "baseline": {"flags": baseline_flags},
                                       "treatment": {"flags": {**eagle, "speculative-num-steps": 2}},
                                       "metric": "accept_len", "expect": "increase", "min_effect": "5%"}])

    assert load_spec(spec(eagle)).hypotheses[0].metric == "accept_len"
    with pytest.raises(SpecError) as e:
        load_spec(spec({}))
    assert "baseline arm does not match" in str(e.value) and "accept_len" in str(e.value)
