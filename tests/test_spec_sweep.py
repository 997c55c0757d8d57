"""The load curve in hypotheses.yaml: sweeps, the workload keys, the SLO, capacity,
samples sized for their percentiles, and what the dry run says of them.

Each rule is checked on both sides: a file that keeps it loads into the frozen
values the rest of the harness reads (``BenchmarkSpec`` fields, one ``HypothesisSpec``
per point with its ``curve`` and ``point``), and one that breaks it is refused with
an error that names the key and says what to write.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bisect_harness.errors import SpecError
from bisect_harness.model import CLIENT_METRICS
from bisect_harness.plan.dryrun import describe_plan
from bisect_harness.spec import parse_spec, reader
from bisect_harness.workload import Capacity, Dataset, LoadPoint, MultiTurn, SharedPrefix, SloTerm

ROOT = Path(__file__).resolve().parents[1]

BASE = {
    "version": 1,
    "engine": {"preset": "openai", "launch": ["my-server", "--port", "{port}"]},
    "benchmark": {"output_tokens": 32},
    "defaults": {"boots_per_arm": 2, "max_boots_per_arm": 4},
    "hypotheses": [{"id": "spec-wins", "baseline": {}, "treatment": {"flags": {"speculative-num-steps": 2}},
                    "metric": "tok_s", "expect": "increase", "min_effect": "10%"}],
}

#: a dataset file of one usable conversation (``measure.datasets``)
CONVERSATION = json.dumps([{"conversations": [{"from": "human", "value": "What is the capital of France?"},
                                             {"from": "gpt", "value": "Paris."}]}])


def doc(bench: dict | None = None, **hyp) -> dict:
    """BASE with ``bench`` merged into ``benchmark`` and ``hyp`` into its one hypothesis."""
    out = copy.deepcopy(BASE)
    out["benchmark"].update(bench or {})
    out["hypotheses"][0].update(hyp)
    return out


def load(d: dict, tmp_path: Path):
    return parse_spec(yaml.safe_dump(d, sort_keys=False), tmp_path / "hypotheses.yaml")


def refused(d: dict, tmp_path: Path) -> SpecError:
    with pytest.raises(SpecError) as info:
        load(d, tmp_path)
    return info.value


# --------------------------------------------------------------------------- sweeps


def test_the_files_sweep_expands_every_hypothesis_into_its_points_in_order(tmp_path):
    spec = load(doc({"sweep": {"concurrency": [1, 4, 16]}}), tmp_path)
    assert [h.id for h in spec.hypotheses] == [
        "spec-wins@concurrency=1", "spec-wins@concurrency=4", "spec-wins@concurrency=16"]
    assert {h.curve for h in spec.hypotheses} == {"spec-wins"}
    assert [h.point for h in spec.hypotheses] == [LoadPoint.of(concurrency=c) for c in (1, 4, 16)]
    assert [h.point_label for h in spec.hypotheses] == ["concurrency=1", "concurrency=4", "concurrency=16"]
    assert [p.label for p in spec.points] == ["concurrency=1", "concurrency=4", "concurrency=16"]
    # the points share the arms, so their configs (and boots) are one pair
    assert all((h.baseline, h.treatment) == (spec.hypotheses[0].baseline, spec.hypotheses[0].treatment)
               for h in spec.hypotheses)
    assert spec.multiplicity == 3  # each point is a hypothesis of the family


def test_a_matrix_expands_first_and_each_matrix_point_is_a_curve(tmp_path):
    spec = load(doc(matrix={"flags.speculative-num-steps": [1, 2]}, sweep={"request_rate": [2, 8.5]}), tmp_path)
    assert [h.id for h in spec.hypotheses] == [
        "spec-wins[speculative-num-steps=1]@request_rate=2", "spec-wins[speculative-num-steps=1]@request_rate=8.5",
        "spec-wins[speculative-num-steps=2]@request_rate=2", "spec-wins[speculative-num-steps=2]@request_rate=8.5"]
    assert [h.curve for h in spec.hypotheses[::2]] == ["spec-wins[speculative-num-steps=1]",
                                                       "spec-wins[speculative-num-steps=2]"]
    assert spec.hypotheses[3].point.apply(spec.benchmark).request_rate == 8.5
    assert spec.hypotheses[3].treatment.flags == {"speculative-num-steps": 2}


def test_two_axes_are_their_product_first_axis_outermost(tmp_path):
    spec = load(doc(sweep={"concurrency": [1, 8], "prompt_tokens": [128, 1024]}), tmp_path)
    assert [h.point_label for h in spec.hypotheses] == [
        "concurrency=1,prompt_tokens=128", "concurrency=1,prompt_tokens=1024",
        "concurrency=8,prompt_tokens=128", "concurrency=8,prompt_tokens=1024"]


def test_a_list_of_points_keeps_its_order_and_a_hypothesis_sweep_replaces_the_files(tmp_path):
    d = doc({"sweep": {"concurrency": [1, 4]}},
            sweep=[{"request_rate": 8, "prompt_tokens": 512}, {"concurrency": 2}, {"request_rate": 1, "arrival": "constant"}])
    d["hypotheses"].append({**BASE["hypotheses"][0], "id": "other"})
    spec = load(d, tmp_path)
    assert [h.id for h in spec.hypotheses] == [
        "spec-wins@request_rate=8,prompt_tokens=512", "spec-wins@concurrency=2",
        "spec-wins@request_rate=1,arrival=constant", "other@concurrency=1", "other@concurrency=4"]
    at = spec.hypotheses[0].point.apply(spec.benchmark)
    assert at.open_loop and at.request_rate == 8.0 and at.prompt_tokens == 512
    assert not spec.hypotheses[1].point.apply(spec.benchmark).open_loop
    assert [p.label for p in spec.points] == ["request_rate=8,prompt_tokens=512", "concurrency=2",
                                              "request_rate=1,arrival=constant", "concurrency=1", "concurrency=4"]


def test_only_takes_a_curve_a_point_or_the_id_as_written(tmp_path):
    spec = load(doc(matrix={"flags.speculative-num-steps": [1, 2]}, sweep={"concurrency": [1, 4]}), tmp_path)
    assert len(spec.select(["spec-wins"]).hypotheses) == 4
    curve = spec.select(["spec-wins[speculative-num-steps=2]"])
    assert [h.id for h in curve.hypotheses] == ["spec-wins[speculative-num-steps=2]@concurrency=1",
                                                "spec-wins[speculative-num-steps=2]@concurrency=4"]
    one = spec.select(["spec-wins[speculative-num-steps=1]@concurrency=4"])
    assert [h.id for h in one.hypotheses] == ["spec-wins[speculative-num-steps=1]@concurrency=4"]
    # the family and the points measured stay the file's, whatever --only keeps
    assert one.multiplicity == 4 and [p.label for p in one.points] == ["concurrency=1", "concurrency=4"]
    with pytest.raises(SpecError, match="no such hypothesis"):
        spec.select(["spec-wins@concurrency=16"])


def test_points_count_toward_the_cap_on_hypotheses(tmp_path):
    d = doc(matrix={"flags.x": list(range(200))}, sweep={"concurrency": [1, 2, 3, 4, 5, 6]})
    err = refused(d, tmp_path)
    assert err.key == "hypotheses[0].matrix" and f"more than {reader.MAX_HYPOTHESES} hypotheses" in err.message
    assert "sweeps" in err.message


@pytest.mark.parametrize("sweep, key, words", [
    ({"concurency": [1, 2]}, "hypotheses[0].sweep.concurency", "axes: concurrency, request_rate"),
    ({"burstiness": [1, 2]}, "hypotheses[0].sweep.burstiness", "a list of points may set it"),
    ({}, "hypotheses[0].sweep", "empty sweep"),
    ([], "hypotheses[0].sweep", "empty sweep"),
    ("concurrency", "hypotheses[0].sweep", "expected a mapping of an axis"),
    ({"concurrency": 4}, "hypotheses[0].sweep.concurrency", "non-empty list"),
    ({"concurrency": [1, 0]}, "hypotheses[0].sweep.concurrency[1]", ">= 1"),
    ({"concurrency": [1, 2.5]}, "hypotheses[0].sweep.concurrency[1]", "integer"),
    ({"concurrency": [1, True]}, "hypotheses[0].sweep.concurrency[1]", "boolean"),
    ({"concurrency": [1, 4, 4]}, "hypotheses[0].sweep.concurrency[2]", "listed twice"),
    ({"concurrency": [4, 1]}, "hypotheses[0].sweep.concurrency[1]", "ascending"),
    ({"request_rate": [0, 1]}, "hypotheses[0].sweep.request_rate[0]", "positive"),
    ({"request_rate": [1, float("inf")]}, "hypotheses[0].sweep.request_rate[1]", "finite"),
    ({"concurrency": list(range(1, 9)), "prompt_tokens": [16, 32, 64, 128, 256]}, "hypotheses[0].sweep",
     "40 points (8 x 5), above the cap of 32"),
    ([{"concurrency": 1}, {"concurrency": 1}], "hypotheses[0].sweep", "concurrency=1 is listed twice"),
    ([{"request_rate": 2}, {"request_rate": 2.0}], "hypotheses[0].sweep", "request_rate=2 is listed twice"),
    ([{"concurrency": 1}, {}], "hypotheses[0].sweep[1]", "empty point"),
    ([{"concurrency": 1}, {"requests_per_sample": 9}], "hypotheses[0].sweep[1].requests_per_sample",
     "unknown key"),
    ([{"arrival": "bursty"}], "hypotheses[0].sweep[0].arrival", "poisson, gamma, constant"),
    ([{"request_rate": 4, "burstiness": 0.5}], "hypotheses[0].sweep", "add arrival: gamma"),
    ([{"prompt_tokens": 4096}], "hypotheses[0].sweep", "prompt_tokens_max (1024) is below prompt_tokens (4096)"),
    ([{"concurrency": c} for c in range(1, 34)], "hypotheses[0].sweep", "33 points, above the cap of 32"),
])
def test_a_bad_sweep_names_its_key(tmp_path, sweep, key, words):
    err = refused(doc({"prompt_tokens_max": 1024}, sweep=sweep), tmp_path)
    assert err.key == key and words in err.message, (err.key, err.message)
    assert err.line is not None


def test_a_gamma_point_may_set_its_burstiness(tmp_path):
    spec = load(doc(sweep=[{"request_rate": 4, "arrival": "gamma", "burstiness": 0.5}]), tmp_path)
    at = spec.hypotheses[0].point.apply(spec.benchmark)
    assert (at.arrival, at.burstiness, at.request_rate) == ("gamma", 0.5, 4.0)


def test_a_hypothesis_without_a_point_beside_one_with_points_is_refused(tmp_path):
    d = doc(sweep={"concurrency": [1, 4]})
    d["hypotheses"].append({**BASE["hypotheses"][0], "id": "plain"})
    err = refused(d, tmp_path)
    assert err.key == "hypotheses[1]" and "plain has no sweep" in err.message
    assert "sweep: [{concurrency: 1}]" in err.message and "benchmark.sweep" in err.message
    d["hypotheses"][1]["sweep"] = [{"concurrency": 1}]
    assert [p.label for p in load(d, tmp_path).points] == ["concurrency=1", "concurrency=4"]


def test_a_tool_that_cannot_do_open_loop_refuses_a_rate_point(tmp_path):
    ok = load(doc({"tool": "vllm-bench-serve"}, sweep={"concurrency": [1, 8]}), tmp_path)
    assert len(ok.hypotheses) == 2
    err = refused(doc({"tool": "vllm-bench-serve"}, sweep=[{"concurrency": 1}, {"request_rate": 4}]), tmp_path)
    assert err.key == "hypotheses[0].sweep"
    assert "request_rate=4 sets request_rate, which benchmark.tool (vllm-bench-serve) cannot carry" in err.message
    err = refused(doc({"tool": "sglang-bench-serving", "sweep": [{"prompt_tokens": 8, "prompt_tokens_max": 16}]}),
                  tmp_path)
    assert err.key == "benchmark.sweep" and "sets prompt_tokens_max" in err.message


# --------------------------------------------------------------------------- benchmark's workload keys


def test_the_workload_keys_fill_the_benchmarks_fields(tmp_path):
    spec = load(doc({"request_rate": 2.5, "arrival": "gamma", "burstiness": 0.25, "prompt_tokens_max": 128,
                     "output_tokens_max": 64, "sample_seconds": 40, "max_lag_ms": 20,
                     "slo": {"ttft_p99_ms": 500, "tpot_p90_ms": 50.5}, "capacity": True}), tmp_path)
    b = spec.benchmark
    assert (b.request_rate, b.arrival, b.burstiness, b.open_loop) == (2.5, "gamma", 0.25, True)
    assert (b.prompt_tokens_max, b.output_tokens_max, b.sample_seconds, b.max_lag_ms) == (128, 64, 40.0, 20.0)
    assert b.workload is None and b.slo == (SloTerm("ttft_p99_ms", 500.0), SloTerm("tpot_p90_ms", 50.5))
    assert b.capacity == Capacity()
    assert b.points == ()  # the plan's to fill


def test_a_dataset_path_is_read_from_the_files_folder(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "chats.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, '
                                                   '{"role": "assistant", "content": "hello"}]}\n')
    spec = load(doc({"workload": {"dataset": {"path": "data/chats.jsonl", "mode": "conversation",
                                              "max_prompt_tokens": 900}}}), tmp_path)
    assert spec.benchmark.workload == Dataset(path=str((tmp_path / "data" / "chats.jsonl").resolve()),
                                              mode="conversation", max_prompt_tokens=900)
    err = refused(doc({"workload": {"dataset": {"path": "data"}}}), tmp_path)  # a folder is no file
    assert err.key == "benchmark.workload.dataset.path" and "relative to the hypotheses file's folder" in err.message
    err = refused(doc({"workload": {"dataset": {"path": "data/chats.jsonl", "mode": "all"}}}), tmp_path)
    assert err.key == "benchmark.workload.dataset.mode" and "first_turn, conversation" in err.message
    # the file is read when the spec is: a malformed one stops the run before its first boot
    (tmp_path / "data" / "bad.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n[1]\n')
    err = refused(doc({"workload": {"dataset": {"path": "data/bad.jsonl"}}}), tmp_path)
    assert err.key == "benchmark.workload.dataset.path" and "bad.jsonl line 2: the entry is list" in err.message


def test_generators_and_a_capacity_search_of_its_own(tmp_path):
    prefix = load(doc({"workload": {"shared_prefix": {"groups": 8, "prefix_tokens": 1024, "suffixes": 16}}}),
                  tmp_path).benchmark
    assert prefix.workload == SharedPrefix(groups=8, prefix_tokens=1024, suffixes=16)
    turns = load(doc({"workload": {"multi_turn": {"turns": 4, "think_s": 1.5}}}), tmp_path).benchmark
    assert turns.workload == MultiTurn(turns=4, think_s=1.5)
    searched = load(doc({"slo": {"ttft_p90_ms": 300},
                         "capacity": {"start_rps": 4, "tolerance": 0.05, "trial_requests": 200, "max_trials": 20}}),
                    tmp_path).benchmark
    assert searched.capacity == Capacity(start_rps=4.0, tolerance=0.05, trial_requests=200, max_trials=20)
    assert load(doc({"capacity": False}), tmp_path).benchmark.capacity is None


@pytest.mark.parametrize("bench, key, words", [
    ({"request_rate": 0}, "benchmark.request_rate", "positive"),
    ({"request_rate": "fast"}, "benchmark.request_rate", "requests a second"),
    ({"request_rate": 2, "arrival": "bursty"}, "benchmark.arrival", "poisson, gamma, constant"),
    ({"request_rate": 2, "burstiness": 0.5}, "benchmark.burstiness", "add arrival: gamma"),
    ({"request_rate": 2, "arrival": "poisson", "burstiness": 1}, "benchmark.burstiness", "add arrival: gamma"),
    ({"arrival": "gamma"}, "benchmark.arrival", "every point is closed loop"),
    ({"prompt_tokens": 64, "prompt_tokens_max": 32}, "benchmark.prompt_tokens_max", "below prompt_tokens (64)"),
    ({"output_tokens_max": 0}, "benchmark.output_tokens_max", ">= 1"),
    ({"sample_seconds": 0}, "benchmark.sample_seconds", "positive"),
    ({"sample_seconds": 1e9}, "benchmark.sample_seconds", "must be <= 604800"),
    ({"sample_seconds": 10, "requests_per_sample": 8}, "benchmark.sample_seconds", "not both"),
    ({"max_lag_ms": -1}, "benchmark.max_lag_ms", "positive"),
    ({"workload": {}}, "benchmark.workload", "exactly one source"),
    ({"workload": {"multi_turn": {"turns": 2}, "shared_prefix": {"groups": 1, "prefix_tokens": 8, "suffixes": 2}}},
     "benchmark.workload", "got 2: multi_turn, shared_prefix"),
    ({"workload": {"sharegpt": {}}}, "benchmark.workload.sharegpt", "Allowed here: dataset, shared_prefix"),
    ({"workload": {"shared_prefix": {"groups": 8, "prefix_tokens": 16}}}, "benchmark.workload.shared_prefix",
     "missing required key 'suffixes'"),
    ({"workload": {"multi_turn": {"turns": 0}}}, "benchmark.workload.multi_turn.turns", ">= 1"),
    ({"workload": {"dataset": {"path": "nowhere.json"}}}, "benchmark.workload.dataset.path", "no such file"),
    ({"workload": {"dataset": {"mode": "first_turn"}}}, "benchmark.workload.dataset", "missing required key 'path'"),
    ({"slo": {"tok_s": 100}}, "benchmark.slo.tok_s", "known: ttft_p50_ms"),
    ({"slo": {"ttft_ms": 100}}, "benchmark.slo.ttft_ms", "a percentile of a latency"),
    ({"slo": {"ttft_p99_ms": 0}}, "benchmark.slo.ttft_p99_ms", "positive"),
    ({"slo": {}}, "benchmark.slo", "empty SLO"),
    ({"slo": [500]}, "benchmark.slo", "a mapping of percentile metric"),
    ({"capacity": True}, "benchmark.capacity", "add benchmark.slo"),
    ({"slo": {"ttft_p99_ms": 500}, "capacity": {"tolerance": 1}}, "benchmark.capacity.tolerance", "below 1"),
    ({"slo": {"ttft_p99_ms": 500}, "capacity": {"max_trials": 1}}, "benchmark.capacity.max_trials", ">= 2"),
    ({"slo": {"ttft_p99_ms": 500}, "capacity": {"steps": 3}}, "benchmark.capacity.steps", "unknown key"),
    ({"tool": "vllm-bench-serve", "request_rate": 4}, "benchmark.request_rate", "cannot carry request_rate"),
    ({"tool": "vllm-bench-serve", "slo": {"ttft_p99_ms": 500}}, "benchmark.slo", "cannot carry slo"),
    ({"tool": "sglang-bench-serving", "workload": {"multi_turn": {"turns": 2}}}, "benchmark.workload",
     "cannot carry workload"),
])
def test_a_bad_workload_key_names_itself(tmp_path, bench, key, words):
    err = refused(doc(bench), tmp_path)
    assert err.key == key and words in err.message, (err.key, err.message)


def test_a_dataset_gives_the_lengths(tmp_path):
    (tmp_path / "d.json").write_text(CONVERSATION)
    data = {"workload": {"dataset": {"path": "d.json"}}}
    err = refused(doc({**data, "prompt_tokens_max": 256}), tmp_path)
    assert err.key == "benchmark.prompt_tokens_max" and "workload.dataset.max_prompt_tokens" in err.message
    err = refused(doc(data, sweep={"prompt_tokens": [64, 128]}), tmp_path)
    assert err.key == "hypotheses[0].sweep" and "the dataset" in err.message
    err = refused(doc({"workload": {"dataset": {"path": "d.json", "min_prompt_tokens": 64,
                                                "max_prompt_tokens": 32}}}), tmp_path)
    assert err.key == "benchmark.workload.dataset.max_prompt_tokens"
    assert load(doc(data, sweep={"concurrency": [1, 2]}), tmp_path).benchmark.workload.mode == "first_turn"


# --------------------------------------------------------------------------- sizing, goodput and capacity


def test_a_percentile_needs_the_requests_it_claims(tmp_path):
    err = refused(doc(metric="ttft_p99_ms", expect="decrease"), tmp_path)
    assert err.key == "benchmark.requests_per_sample"
    assert "needs at least 100 requests a sample" in err.message and "a sample is 4 requests" in err.message
    assert "write benchmark.requests_per_sample: 100" in err.message
    written = yaml.safe_dump(doc(metric="ttft_p99_ms", expect="decrease"), sort_keys=False).splitlines()
    assert err.line == written.index("- id: spec-wins") + 1  # the hypothesis' line: the key is not written
    assert load(doc({"requests_per_sample": 100}, metric="ttft_p99_ms", expect="decrease"), tmp_path)
    err = refused(doc({"requests_per_sample": 9}, metric="itl_p90_ms", expect="decrease"), tmp_path)
    assert err.line == 10 and "needs at least 10 requests" in err.message  # the line of the key written
    assert load(doc({"requests_per_sample": 2}, metric="tpot_p50_ms", expect="decrease"), tmp_path)


def test_a_mechanism_on_a_percentile_is_sized_too(tmp_path):
    err = refused(doc(mechanism=[{"metric": "ttft_p90_ms", "expect": "decrease"}]), tmp_path)
    assert err.key == "benchmark.requests_per_sample" and "ttft_p90_ms, a p90" in err.message
    assert "write benchmark.requests_per_sample: 10" in err.message


def test_seconds_long_samples_are_sized_by_rate_or_refused_closed_loop(tmp_path):
    p99 = {"metric": "ttft_p99_ms", "expect": "decrease"}
    err = refused(doc({"sample_seconds": 30}, **p99), tmp_path)
    assert err.key == "benchmark.sample_seconds" and "closed-loop sample of 30 s" in err.message
    assert "needs at least 100" in err.message and "requests_per_sample: 100" in err.message
    err = refused(doc({"sample_seconds": 30, "request_rate": 2}, **p99), tmp_path)
    assert "2 req/s for 30 s sends about 60" in err.message and "sample_seconds: 50" in err.message
    assert load(doc({"sample_seconds": 50, "request_rate": 2}, **p99), tmp_path)
    # per point: the slowest rate decides, and the error names the point
    err = refused(doc({"sample_seconds": 10}, sweep={"request_rate": [5, 10, 20]}, **p99), tmp_path)
    assert "at request_rate=5" in err.message and "sample_seconds: 20" in err.message
    assert len(load(doc({"sample_seconds": 20}, sweep={"request_rate": [5, 10, 20]}, **p99), tmp_path).hypotheses) == 3
    err = refused(doc({"sample_seconds": 20}, sweep=[{"request_rate": 5}, {"concurrency": 64}], **p99), tmp_path)
    assert "closed-loop sample of 20 s at concurrency=64" in err.message


@pytest.mark.parametrize("metric", ["goodput_rps", "capacity_rps"])
def test_goodput_and_capacity_need_an_slo_by_name(tmp_path, metric):
    err = refused(doc(metric=metric), tmp_path)
    assert err.key == "hypotheses[0].metric" and "add benchmark.slo" in err.message
    err = refused(doc(mechanism=[{"metric": metric, "expect": "increase"}]), tmp_path)
    assert err.key == "hypotheses[0].mechanism[0].metric"
    if metric == "capacity_rps":
        err = refused(doc({"slo": {"ttft_p99_ms": 500}}, metric=metric), tmp_path)
        assert err.key == "hypotheses[0].metric" and "add benchmark.capacity: true" in err.message


@pytest.mark.skipif("goodput_rps" not in CLIENT_METRICS, reason="goodput_rps is not a client metric yet")
def test_goodput_is_sized_for_every_slo_term(tmp_path):
    slo = {"slo": {"ttft_p90_ms": 500, "tpot_p99_ms": 50}}
    err = refused(doc({**slo, "requests_per_sample": 10}, metric="goodput_rps"), tmp_path)
    assert "tpot_p99_ms <= 50" in err.message and "requests_per_sample: 100" in err.message
    assert load(doc({**slo, "requests_per_sample": 100}, metric="goodput_rps"), tmp_path)


@pytest.mark.skipif("capacity_rps" not in CLIENT_METRICS, reason="capacity_rps is not a client metric yet")
def test_capacity_trials_are_sized_for_every_slo_term(tmp_path):
    bench = {"slo": {"ttft_p99_ms": 500}, "capacity": {"trial_requests": 50}}
    err = refused(doc(bench, metric="capacity_rps"), tmp_path)
    assert err.key == "benchmark.capacity.trial_requests" and "trial_requests: 100" in err.message
    bench["capacity"] = True
    assert load(doc(bench, metric="capacity_rps"), tmp_path)
    err = refused(doc(bench, metric="capacity_rps", sweep={"request_rate": [1, 2]}), tmp_path)
    assert "searches the arrival rate itself" in err.message


# --------------------------------------------------------------------------- the schema, the doc, the dry run


def doc_example() -> str:
    text = (ROOT / "docs" / "hypotheses-format.md").read_text()
    got = re.search(r"<!-- example: load curve -->\n```yaml\n(.*?)```", text, re.S)
    assert got, "the format doc lost its load-curve example"
    return got.group(1)


def test_the_docs_example_parses_and_the_schema_takes_it(tmp_path):
    import jsonschema

    from bisect_harness.spec.schema import hypotheses_schema

    text = doc_example()
    spec = parse_spec(text, tmp_path / "hypotheses.yaml")
    assert [h.id for h in spec.hypotheses][:4] == [f"spec-wins@concurrency={c}" for c in (1, 4, 16, 32)]
    assert len(spec.hypotheses) == 9 and spec.multiplicity == 9
    assert [p.label for p in spec.points] == ["concurrency=1", "concurrency=4", "concurrency=16", "concurrency=32",
                                              "request_rate=2", "request_rate=8",
                                              "request_rate=8,prompt_tokens=1024", "concurrency=8"]
    assert spec.benchmark.slo == (SloTerm("ttft_p99_ms", 500.0), SloTerm("tpot_p99_ms", 50.0))
    schema = hypotheses_schema()
    jsonschema.validate(yaml.safe_load(text), schema)
    bad = yaml.safe_load(text)
    bad["benchmark"]["sweep"] = {"concurrency": ["one"]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad["benchmark"]["sweep"] = [{"concurrency": 1, "requests_per_sample": 9}]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_the_schema_names_the_workload_keys_from_the_loader():
    from bisect_harness.spec import sections, workloads
    from bisect_harness.spec.schema import hypotheses_schema
    from bisect_harness.workload import ARRIVALS, POINT_KEYS, SWEEP_AXES

    schema = hypotheses_schema()
    bench = schema["properties"]["benchmark"]["properties"]
    assert set(bench) == set(sections._BENCH) and set(workloads.KEYS) <= set(bench)
    assert bench["arrival"]["enum"] == list(ARRIVALS)
    axes, listed = bench["sweep"]["oneOf"]
    assert list(axes["properties"]) == list(SWEEP_AXES) and list(listed["items"]["properties"]) == list(POINT_KEYS)
    assert listed["maxItems"] == reader.MAX_SWEEP_POINTS
    assert set(bench["workload"]["properties"]) == set(workloads.WORKLOAD_SOURCES)
    assert bench["workload"]["properties"]["shared_prefix"]["required"] == ["groups", "prefix_tokens", "suffixes"]
    assert "ttft_p99_ms" in bench["slo"]["propertyNames"]["enum"] and "tok_s" not in bench["slo"]["propertyNames"]["enum"]
    assert schema["$defs"]["hypothesis"]["properties"]["sweep"] == bench["sweep"]


def test_the_dry_run_says_what_each_point_asks_and_each_curve(tmp_path):
    d = doc({"requests_per_sample": 100, "slo": {"ttft_p99_ms": 500}, "capacity": True,
             "workload": {"shared_prefix": {"groups": 4, "prefix_tokens": 256, "suffixes": 8}}},
            metric="ttft_p99_ms", expect="decrease",
            sweep=[{"concurrency": 4}, {"request_rate": 2.5, "arrival": "gamma", "burstiness": 0.5}])
    d["defaults"].update({"samples_per_boot": 3, "max_samples_per_boot": 5})
    spec = load(d, tmp_path)
    text, obj = describe_plan(spec, cache_dir=tmp_path / "cache")
    assert "load points: every boot measures these 2, in an order drawn per boot, a warm-up at each:" in text
    assert ("  concurrency=4: closed loop at concurrency 4, prompts of 64 tokens, outputs of 32 tokens, 100 requests "
            "a sample, shared prefixes: 4 groups of 256 tokens, each with 8 suffixes") in text
    assert "  request_rate=2.5,arrival=gamma,burstiness=0.5: open loop at 2.5 req/s, gamma (burstiness 0.5) " in text
    assert "    per boot: 3 to 5 samples x 100 requests = 300 to 500 requests (and 2 warm-up requests)" in text
    assert "SLO: ttft_p99_ms <= 500" in text
    assert "capacity: the highest rate whose SLO holds, searched in each boot from 1 req/s to within 10%" in text
    assert "curves (a verdict per point, one answer per curve):\n  spec-wins: concurrency=4, request_rate=2.5," in text
    assert [p["label"] for p in obj["points"]] == ["concurrency=4", "request_rate=2.5,arrival=gamma,burstiness=0.5"]
    assert obj["points"][1]["open_loop"] and obj["points"][1]["requests_per_boot"] == {"min": 300, "max": 500}
    assert obj["curves"] == [{"curve": "spec-wins", "points": ["concurrency=4", "request_rate=2.5,arrival=gamma,"
                                                               "burstiness=0.5"],
                              "hypotheses": [h.id for h in spec.hypotheses]}]
    assert [(h["point"], h["curve"]) for h in obj["hypotheses"]] == [("concurrency=4", "spec-wins"), (
        "request_rate=2.5,arrival=gamma,burstiness=0.5", "spec-wins")]
    assert obj["slo"] == [{"metric": "ttft_p99_ms", "limit": 500.0}] and obj["capacity"]["trial_requests"] == 100


def test_the_dry_run_of_one_point_prices_seconds_long_samples(tmp_path):
    (tmp_path / "chats.json").write_text(CONVERSATION)
    spec = load(doc({"request_rate": 4, "sample_seconds": 30,
                     "workload": {"dataset": {"path": "chats.json", "max_prompt_tokens": 512}}}), tmp_path)
    text, obj = describe_plan(spec, cache_dir=tmp_path / "cache")
    assert (f"load point: open loop at 4 req/s, poisson arrivals, lengths from the dataset, 30 s a sample, prompts "
            f"from the dataset {tmp_path.resolve() / 'chats.json'} (first user turns; min prompt tokens 4, "
            "max prompt tokens 512)") in text
    assert "  per boot: 3 to 16 samples x about 120 requests = about 360 to 1,920 requests" in text
    assert obj["points"][0]["label"] is None and obj["curves"] == [] and "curves (" not in text
    closed = load(doc({"sample_seconds": 30}), tmp_path)
    text, obj = describe_plan(closed, cache_dir=tmp_path / "cache")
    assert "  per boot: 3 to 16 samples x 30 s = 90 to 480 s of requests (and 2 warm-up requests)" in text
    assert obj["points"][0]["seconds_per_boot"] == {"min": 90.0, "max": 480.0}


def test_the_cli_dry_run_prints_the_curve(tmp_path):
    path = tmp_path / "hypotheses.yaml"
    path.write_text(yaml.safe_dump(doc({"sweep": {"concurrency": [1, 8]}}), sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "run", str(path), "--dry-run", "--json",
                           "--only", "spec-wins@concurrency=8"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [h["id"] for h in obj["hypotheses"]] == ["spec-wins@concurrency=8"]
    assert [p["label"] for p in obj["points"]] == ["concurrency=1", "concurrency=8"]  # every boot still measures both
