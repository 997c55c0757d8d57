"""One definition per number: each metric's definition, and the journal's line for it."""

from __future__ import annotations

from bisect_harness.report import journal
from bisect_harness.record.ledger import Bisection, Config, HypothesisRow, Ledger, Run
from bisect_harness.spec.metric_defs import definition_line, lookup_metric
from bisect_harness.model import CLIENT_METRICS
from bisect_harness.measure.sources import parse_source

SPEC_TEXT = """\
version: 1
engine:
  preset: demo
  metrics:
    - {name: gen_tok_rate, from: prometheus, metric: demo_generation_tokens_total, kind: rate, unit: tok/s,
       better: higher}
    - {name: engine_decode_tok_s, from: response, field: engine_timing.decode_tok_s, unit: tok/s,
       better: higher, description: the engine's own decode rate}
hypotheses: []
"""


def test_client_throughputs_have_distinct_names_and_definitions():
    e2e, decode = CLIENT_METRICS["tok_s"], CLIENT_METRICS["decode_tok_s"]
    assert "TTFT" in e2e.description and "first request sent" in e2e.description
    assert "first to its last output chunk" in decode.description and "itl_ms" in decode.description
    assert e2e.unit == decode.unit == "tok/s"
    descriptions = [m.description for m in CLIENT_METRICS.values()]
    assert len(set(descriptions)) == len(descriptions)


def test_a_counter_rate_says_its_window():
    src = parse_source({"name": "r", "from": "prometheus", "metric": "c_total", "kind": "rate", "better": "higher"},
                       "k")
    assert src.metric.description.startswith("c_total from /metrics: its increase between the scrapes")
    assert "per second between them" in src.metric.description
    gauge = parse_source({"name": "g", "from": "prometheus", "metric": "q", "kind": "gauge", "better": "lower"}, "k")
    assert "scraped just after each sample window" in gauge.metric.description


def test_definitions_come_from_the_client_or_the_runs_own_file():
    assert lookup_metric("tok_s", "") is CLIENT_METRICS["tok_s"]
    assert "per second between them" in lookup_metric("gen_tok_rate", SPEC_TEXT).description
    assert definition_line("engine_decode_tok_s", None, SPEC_TEXT) == (
        "`engine_decode_tok_s` (tok/s, higher is better): the engine's own decode rate")
    assert definition_line("missing", None, SPEC_TEXT).startswith("`missing`: no definition recorded")
    assert lookup_metric("gen_tok_rate", "engine: [unclosed") is None


def test_a_stored_definition_wins_over_a_fresh_lookup():
    stored = {"unit": "tok/s", "better": "higher", "description": "as measured then"}
    assert definition_line("tok_s", stored, "") == "`tok_s` (tok/s, higher is better): as measured then"


def test_journal_prints_each_hypothesis_metric_with_its_definition(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = led.add(Run(spec_path="h.yaml", spec_text=SPEC_TEXT, spec_hash="h", harness_version="x"))
        a = led.add(Config(run_id=run.id, key="a", label="HEAD"))
        b = led.add(Config(run_id=run.id, key="b", label="HEAD --disable-cuda-graph"))
        common = dict(run_id=run.id, expect="decrease", min_effect=0.2, baseline_config_id=a.id,
                      treatment_config_id=b.id)
        led.add(HypothesisRow(hid="recorded", metric="decode_tok_s", spec={"metric_def": {
            "unit": "tok/s", "better": "higher", "description": "recorded with the hypothesis"}}, **common))
        led.add(HypothesisRow(hid="older-row", metric="gen_tok_rate", spec={}, **common))
        text = journal.render(led, run)
    assert "- metric: `decode_tok_s` (tok/s, higher is better): recorded with the hypothesis\n" in text
    line = next(x for x in text.splitlines() if x.startswith("- metric: `gen_tok_rate`"))
    assert "(tok/s, higher is better): demo_generation_tokens_total from /metrics" in line


def test_journal_prints_the_bisection_metric_with_its_definition(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = led.add(Run(kind="bisect", spec_path="h.yaml", spec_text=SPEC_TEXT, spec_hash="h",
                          harness_version="x"))
        led.add(Bisection(run_id=run.id, good="a" * 40, bad="b" * 40, metric="gen_tok_rate", status="done",
                          result={}))
        text = journal.render(led, run)
    section = text.split("## Bisection 1:", 1)[1]
    facts = section.split("\n\n")[2].splitlines()  # under the heading and the search's answer
    assert facts[-1].startswith("- metric: `gen_tok_rate` (tok/s, higher is better): demo_generation_tokens_total "
                                "from /metrics"), section


DERIVED_TEXT = """\
version: 1
engine:
  preset: demo
  metrics:
    - {name: accepted, from: prometheus, metric: "vllm:spec_decode_num_accepted_tokens", better: higher}
    - {name: drafts, from: prometheus, metric: "vllm:spec_decode_num_drafts", better: higher}
    - {name: acceptance_length, from: derived, ratio: [accepted, drafts], offset: 1, unit: tok/draft,
       better: higher}
hypotheses: []
"""


def test_a_derived_metric_is_defined_with_its_inputs(tmp_path):
    line = definition_line("acceptance_length", None, DERIVED_TEXT)
    assert line == ("`acceptance_length` (tok/draft, higher is better): 1 + accepted / drafts, from each sample "
                    "window's values of those sources; where accepted: vllm:spec_decode_num_accepted_tokens from "
                    "/metrics: its increase between the scrapes just before and just after each sample window; "
                    "drafts: vllm:spec_decode_num_drafts from /metrics: its increase between the scrapes just "
                    "before and just after each sample window")
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        run = led.add(Run(spec_path="h.yaml", spec_text=DERIVED_TEXT, spec_hash="h", harness_version="x"))
        a = led.add(Config(run_id=run.id, key="a", label="HEAD"))
        b = led.add(Config(run_id=run.id, key="b", label="HEAD --speculative"))
        led.add(HypothesisRow(hid="acc", metric="acceptance_length", spec={}, run_id=run.id, expect="increase",
                              min_effect=0.1, baseline_config_id=a.id, treatment_config_id=b.id))
        text = journal.render(led, run)
    assert f"- metric: {line}\n" in text
    # a file whose derived metric names an undeclared one still defines the others
    broken = DERIVED_TEXT.replace("[accepted, drafts]", "[accepted, nowhere]")
    assert lookup_metric("accepted", broken).unit == "" and "1 + accepted / nowhere" in \
        lookup_metric("acceptance_length", broken).description
