import dataclasses
import pickle
import time
from typing import ClassVar

import pytest

from bisect_harness.measure import sources as sources_mod
from bisect_harness.errors import SpecError
from bisect_harness.model import Better, Metric
from bisect_harness.measure.sources import (
    DerivedSource, LogSource, MetricSource, PrometheusSource, ResponseSource, ServerInfoSource, SourceCollector,
    applicable, parse_source, register_source, resolve_derived, source_kinds,
)
from bisect_harness.measure.values import lookup
from helpers import FakeServer


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def counters(gen_rank0, gen_rank1, usage):
    return f"""# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{{model_name="k2",tp_rank="0"}} {gen_rank0}
sglang:generation_tokens_total{{model_name="k2",tp_rank="1"}} {gen_rank1}
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="k2"}} {usage}
"""


# --------------------------------------------------------------------------- parsing


def test_parse_each_kind():
    p = parse_source({"name": "gen", "from": "prometheus", "metric": "sglang:generation_tokens_total",
                      "kind": "rate", "labels": {"tp_rank": 0}, "better": "higher"}, "k")
    assert isinstance(p, PrometheusSource) and p.kind == "rate" and p.labels == {"tp_rank": "0"}
    assert p.metric.unit == "1/s" and p.metric.better is Better.HIGHER
    log = parse_source({"name": "verify_ms", "from": "log", "pattern": r"verify: (?P<value>[\d.]+) ms",
                        "unit": "ms", "better": "lower", "reduce": "median"}, "k")
    assert isinstance(log, LogSource) and log.metric.unit == "ms" and log.metric.better is Better.LOWER
    info = parse_source({"name": "bs", "from": "server_info", "field": "cuda_graph_max_bs", "better": "higher"}, "k")
    assert isinstance(info, ServerInfoSource)
    acc = parse_source({"name": "acc", "from": "response", "field": "accept_length", "better": "higher"}, "k")
    assert isinstance(acc, ResponseSource) and acc.metric.unit == "tok/verify"


@pytest.mark.parametrize("entry, key, fragment", [
    ({"name": "x", "from": "stdout", "better": "higher"}, "m.from", "unknown source 'stdout'"),
    ({"name": "x", "from": "log", "better": "lower"}, "m.pattern", "missing 'pattern'"),
    ({"name": "x", "from": "log", "pattern": r"verify: ([\d.]+)", "better": "lower"}, "m.pattern",
     "named group 'value'"),
    ({"name": "x", "from": "log", "pattern": r"(?P<value>[\d.+", "better": "lower"}, "m.pattern",
     "invalid regular expression"),
    ({"name": "x", "from": "prometheus", "metric": "m", "kind": "avg", "better": "lower"}, "m.kind",
     "unknown kind 'avg'"),
    ({"name": "x", "from": "log", "pattern": "(?P<value>1)", "reduce": "p99", "better": "lower"}, "m.reduce",
     "unknown reduce"),
    ({"name": "x", "from": "response", "field": "f", "better": "faster"}, "m.better", "'higher' or 'lower'"),
    ({"name": "x", "from": "response", "field": "f"}, "m.better", "'higher' or 'lower'"),
    ({"name": "x", "from": "response", "better": "higher"}, "m.field", "missing 'field'"),
    ({"name": "x", "from": "response", "field": "f", "better": "higher", "pattern": "p"}, "m.pattern",
     "unknown key"),
    ({"name": "two words", "from": "response", "field": "f", "better": "higher"}, "m.name", "no spaces"),
    ({"name": "x", "from": "prometheus", "metric": "m", "labels": ["a"], "better": "higher"}, "m.labels",
     "'labels'"),
    ("verify_ms", "m", "must be a mapping"),
])
def test_parse_errors_name_the_key(entry, key, fragment):
    with pytest.raises(SpecError) as exc:
        parse_source(entry, "m")
    assert exc.value.key == key
    assert fragment in str(exc.value)


def test_lookup():
    d = {"meta_info": {"spec_verify_ct": 3}, "choices": [{"text": "a"}], "a.b": 1}
    assert lookup(d, "meta_info.spec_verify_ct") == 3
    assert lookup(d, "choices.0.text") == "a"
    assert lookup(d, "a.b") == 1
    with pytest.raises(KeyError):
        lookup(d, "meta_info.nope")


# --------------------------------------------------------------------------- collecting


def test_prometheus_delta_rate_gauge_with_labels(server):
    srcs = [parse_source({"name": "gen_all", "from": "prometheus", "metric": "sglang:generation_tokens_total",
                          "kind": "delta", "better": "higher"}, "a"),
            parse_source({"name": "gen_r0", "from": "prometheus", "metric": "sglang:generation_tokens_total",
                          "kind": "delta", "labels": {"tp_rank": "0"}, "better": "higher"}, "b"),
            parse_source({"name": "gen_rate", "from": "prometheus", "metric": "sglang:generation_tokens",
                          "kind": "rate", "labels": {"tp_rank": "0"}, "better": "higher"}, "c"),
            parse_source({"name": "usage", "from": "prometheus", "metric": "sglang:token_usage",
                          "kind": "gauge", "better": "lower"}, "d")]
    c = SourceCollector(srcs, server.url, None)
    server.metrics = counters(100, 100, 0.1)
    c.begin_sample()
    server.metrics = counters(160, 140, 0.25)
    time.sleep(0.2)
    out = c.end_sample([], 0.2)
    assert out["gen_all"] == 100.0       # summed over both label sets
    assert out["gen_r0"] == 60.0          # only tp_rank 0
    assert 60.0 / 5.0 < out["gen_rate"] < 60.0 / 0.2   # per second of the scrape window (>= 0.2 s)
    assert out["usage"] == 0.25
    assert c.problems() == []


def test_prometheus_absent_metric_and_failed_scrape_are_problems(server):
    src = parse_source({"name": "spec", "from": "prometheus", "metric": "sglang:spec_accept_length",
                        "kind": "gauge", "better": "higher"}, "a")
    c = SourceCollector([src], server.url, None)
    server.metrics = counters(1, 1, 0.1)
    c.begin_sample()
    assert c.end_sample([], 1.0) == {}
    probs = c.problems()
    assert len(probs) == 1 and "sglang:spec_accept_length" in probs[0] and "absent" in probs[0]

    c2 = SourceCollector([src], server.url + "/nothing-here", None)
    c2.begin_sample()
    assert c2.end_sample([], 1.0) == {}
    assert "HTTP 404" in c2.problems()[0]


def test_prometheus_counter_reset_is_a_problem(server):
    src = parse_source({"name": "g", "from": "prometheus", "metric": "sglang:generation_tokens_total",
                        "better": "higher"}, "a")
    c = SourceCollector([src], server.url, None)
    server.metrics = counters(500, 0, 0)
    c.begin_sample()
    server.metrics = counters(5, 0, 0)
    assert c.end_sample([], 1.0) == {}
    assert "went down" in c.problems()[0]


def test_server_info_field_with_fallback_paths(server):
    server.routes["/get_server_info"] = {"cuda_graph_max_bs": 8, "disable_cuda_graph": False,
                                         "speculative_algorithm": "EAGLE3", "nested": {"x": "2.5"}}
    srcs = [parse_source({"name": "bs", "from": "server_info", "field": "cuda_graph_max_bs", "better": "higher"}, "a"),
            parse_source({"name": "nx", "from": "server_info", "field": "nested.x", "better": "higher"}, "b"),
            parse_source({"name": "off", "from": "server_info", "field": "disable_cuda_graph", "better": "lower"}, "c"),
            parse_source({"name": "algo", "from": "server_info", "field": "speculative_algorithm",
                          "better": "lower"}, "d"),
            parse_source({"name": "gone", "from": "server_info", "field": "nope", "better": "lower"}, "e")]
    c = SourceCollector(srcs, server.url, None, server_info_paths=["/server_info", "/get_server_info"])
    c.begin_sample()
    out = c.end_sample([], 1.0)
    assert out == {"bs": 8.0, "nx": 2.5, "off": 0.0}
    probs = c.problems()
    assert len(probs) == 2
    assert any("'speculative_algorithm' is not numeric" in p for p in probs)
    assert any("'nope' is not in the server info" in p for p in probs)


def test_server_info_unreachable_is_a_problem(server):
    src = parse_source({"name": "bs", "from": "server_info", "field": "x", "better": "higher"}, "a")
    c = SourceCollector([src], server.url, None, server_info_paths=["/server_info"])
    c.begin_sample()
    assert c.end_sample([], 1.0) == {}
    assert "/server_info: HTTP 404" in c.problems()[0]


def test_response_fields_and_accept_length():
    srcs = [parse_source({"name": "acc", "from": "response", "field": "accept_length", "better": "higher"}, "a"),
            parse_source({"name": "vct", "from": "response", "field": "spec_verify_ct", "better": "lower"}, "b"),
            parse_source({"name": "ct", "from": "response", "field": "usage.completion_tokens", "better": "higher"},
                         "c")]
    c = SourceCollector(srcs, "http://127.0.0.1:9", None)
    responses = [{"meta_info": {"completion_tokens": 100, "spec_verify_ct": 40}, "usage": {"completion_tokens": 100}},
                 {"meta_info": {"completion_tokens": 60, "spec_verify_ct": 40}, "usage": {"completion_tokens": 60}}]
    c.begin_sample()
    out = c.end_sample(responses, 1.0)
    assert out["acc"] == pytest.approx(160 / 80)   # tokens per verify cycle over the sample
    assert out["vct"] == 40.0                      # found under meta_info
    assert out["ct"] == 80.0                       # mean over requests
    assert c.problems() == []


def test_response_missing_fields_are_problems():
    srcs = [parse_source({"name": "acc", "from": "response", "field": "accept_length", "better": "higher"}, "a"),
            parse_source({"name": "lat", "from": "response", "field": "meta_info.e2e_latency", "better": "lower"}, "b")]
    c = SourceCollector(srcs, "http://127.0.0.1:9", None)
    c.begin_sample()
    out = c.end_sample([{"usage": {"completion_tokens": 10}}, {"meta_info": {"e2e_latency": 2.0}}], 1.0)
    assert out == {"lat": 2.0}
    probs = " | ".join(c.problems())
    assert "lack spec_verify_ct" in probs
    assert "missing in 1 and not numeric in 0 of 2" in probs

    c2 = SourceCollector(srcs[:1], "http://127.0.0.1:9", None)
    c2.begin_sample()
    assert c2.end_sample([{"meta_info": {"completion_tokens": 10, "spec_verify_ct": 0}}], 1.0) == {}
    assert "speculative decoding did not run" in c2.problems()[0]


@pytest.mark.parametrize("preset, says, never", [
    ("llamacpp", "llama.cpp's last object has timings.draft_n", "per-request-spec-decode-metrics"),
    ("vllm", "--per-request-spec-decode-metrics", "llama.cpp"),
    ("openai", "", "per-request-spec-decode-metrics"),
])
def test_a_missing_field_is_explained_by_the_engine_that_ran(server, preset, says, never):
    """A llama.cpp boot that never drafted has no ``timings.draft_n`` in its last chunk
    (server_slot_stats::to_json writes it only when the slot drafted): its problem speaks
    of llama.cpp, never of vLLM's flag; a vLLM boot's gives vLLM's advice; a preset with
    no word says nothing more. A /metrics that does not answer likewise."""
    from bisect_harness.engines.presets import get_preset

    notes = get_preset(preset).source_notes
    draft = parse_source({"name": "drafted", "from": "response", "chunk": "last", "field": "timings.draft_n",
                          "better": "higher"}, "a")
    c = SourceCollector([draft], server.url, None, notes=notes)
    c.begin_sample()
    last = {"stop": True, "timings": {"predicted_n": 8, "cache_n": 0, "prompt_n": 17}}
    assert c.end_sample([{}], 1.0, [last]) == {}
    (problem,) = c.problems()
    assert "missing in 1" in problem and says in problem and never not in problem, problem

    rate = parse_source({"name": "r", "from": "prometheus", "metric": "x_total", "kind": "rate",
                         "better": "higher"}, "b")
    c = SourceCollector([rate], server.url + "/nothing-here", None, notes=notes)
    c.begin_sample()
    c.end_sample([], 1.0)
    (problem,) = c.problems()
    assert "HTTP 404" in problem and ("SGLang" not in problem) and (
        ("--metrics" in problem) == (preset == "llamacpp")), problem


def test_log_source_reads_only_new_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("Target verify: 99.00 ms/cyc\n")   # before the window: ignored
    pattern = r"Target verify: (?P<value>[0-9.]+) ms/cyc"
    srcs = [parse_source({"name": "v_mean", "from": "log", "pattern": pattern, "better": "lower"}, "a"),
            parse_source({"name": "v_med", "from": "log", "pattern": pattern, "reduce": "median",
                          "better": "lower"}, "b"),
            parse_source({"name": "v_last", "from": "log", "pattern": pattern, "reduce": "last",
                          "better": "lower"}, "c"),
            parse_source({"name": "v_n", "from": "log", "pattern": pattern, "reduce": "count",
                          "better": "higher"}, "d")]
    c = SourceCollector(srcs, "http://127.0.0.1:9", log)
    c.begin_sample()
    with open(log, "a") as f:
        f.write("INFO Decode batch. accept len: 2.10\nTarget verify: 29.00 ms/cyc\nTarget verify: 30.00 ms/cyc\n"
                "Target verify: 35.00 ms/cyc\nTarget verify: 31.")   # a partial line is left for later
    out = c.end_sample([], 1.0)
    assert out == {"v_mean": pytest.approx(94 / 3), "v_med": 30.0, "v_last": 35.0, "v_n": 3.0}
    c.begin_sample()
    with open(log, "a") as f:
        f.write("00 ms/cyc\n")
    out = c.end_sample([], 1.0)
    # begin_sample marks the end of the file: the half-written line straddling it is not counted.
    assert out["v_n"] == 0.0
    assert "v_mean" not in out
    assert any("v_mean" in p and "matched" in p for p in c.problems())


def test_log_pattern_that_never_matches_is_reported(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("")
    srcs = [parse_source({"name": "n", "from": "log", "pattern": r"nothing (?P<value>\d+)", "reduce": "count",
                          "better": "higher"}, "a"),
            parse_source({"name": "m", "from": "log", "pattern": r"nothing (?P<value>\d+)", "better": "higher"}, "b")]
    c = SourceCollector(srcs, "http://127.0.0.1:9", log)
    for _ in range(2):
        c.begin_sample()
        log.write_text(log.read_text() + "Decode batch. gen throughput (token/s): 82.00\n")
        assert c.end_sample([], 1.0) == {"n": 0.0}
    probs = c.problems()
    assert len(probs) == 2
    assert any("'m'" in p and "2 problem(s) over 2 sample(s)" in p for p in probs)
    assert any("'n'" in p and "matched no log line in 2 sample(s)" in p for p in probs)


def test_missing_log_file_is_a_problem(tmp_path):
    src = parse_source({"name": "m", "from": "log", "pattern": r"(?P<value>\d+)", "better": "higher"}, "b")
    c = SourceCollector([src], "http://127.0.0.1:9", tmp_path / "absent.log")
    c.begin_sample()
    assert c.end_sample([], 1.0) == {}
    assert "cannot read log" in c.problems()[0]


def test_end_without_begin_is_a_bug():
    c = SourceCollector([], "http://127.0.0.1:9", None)
    with pytest.raises(RuntimeError):
        c.end_sample([], 1.0)


# --------------------------------------------------------------------------- the registry of kinds

ONE_OF_EACH = [
    {"name": "gen", "from": "prometheus", "metric": "sglang:generation_tokens_total", "kind": "rate",
     "labels": {"tp_rank": 0}, "better": "higher", "when": {"speculative-algorithm": True}},
    {"name": "bs", "from": "server_info", "field": "cuda_graph_max_bs", "better": "higher"},
    {"name": "acc", "from": "response", "field": "accept_length", "better": "higher"},
    {"name": "verify_ms", "from": "log", "pattern": r"verify: (?P<value>[\d.]+) ms", "reduce": "median",
     "unit": "ms", "better": "lower"},
]


def test_every_kind_is_registered_and_an_unknown_or_missing_one_is_an_error():
    assert source_kinds() == ("prometheus", "server_info", "response", "log", "derived")
    for entry in ({"name": "x", "from": "stdout", "better": "higher"}, {"name": "x", "better": "higher"},
                  {"name": "x", "from": ["log"], "better": "higher"}):
        with pytest.raises(SpecError) as exc:
            parse_source(entry, "engine.metrics[3]")
        assert exc.value.key == "engine.metrics[3].from"
        assert "prometheus, server_info, response, log, derived" in str(exc.value)
    with pytest.raises(SpecError, match="missing 'from'"):
        parse_source({"name": "x", "better": "higher"}, "m")


def test_each_kind_describes_itself_in_one_line():
    lines = [parse_source(d, f"m[{i}]").describe() for i, d in enumerate(ONE_OF_EACH)]
    assert lines == [
        "prometheus source 'gen': increase per second of sglang:generation_tokens_total{tp_rank=0} in /metrics "
        "over each sample window [1/s], higher is better, only where speculative-algorithm=True",
        "server_info source 'bs': field cuda_graph_max_bs of the server info, read at the end of each sample "
        "window, higher is better",
        "response source 'acc': completion tokens per verify cycle (sum of completion_tokens over sum of "
        "spec_verify_ct) of each sample window's responses [tok/verify], higher is better",
        "log source 'verify_ms': median 'value' of the server log's new lines matching "
        "/verify: (?P<value>[\\d.]+) ms/ in each sample window [ms], lower is better",
    ]


def test_sources_pickle_and_keep_the_repr_the_engine_fingerprint_hashes():
    """Sources travel inside a frozen boot request to another host (pickled), and
    plan.engine_fingerprint hashes their repr: neither may change with the registry."""
    for i, d in enumerate(ONE_OF_EACH):
        s = parse_source(d, f"m[{i}]")
        back = pickle.loads(pickle.dumps(s))
        assert back == s and type(back) is type(s) and back.when == s.when
        assert repr(back) == repr(s)
    assert repr(parse_source(ONE_OF_EACH[1], "m")) == (
        "ServerInfoSource(metric=Metric(name='bs', unit='', better=<Better.HIGHER: 'higher'>, "
        "description='server info field cuda_graph_max_bs'), field='cuda_graph_max_bs')")


@dataclasses.dataclass(frozen=True)
class _WindowLength(MetricSource):
    """A kind defined outside the module: the window's length, to show a kind needs
    only its class."""

    scale: float = 1.0
    kind_name: ClassVar[str] = "window_length_for_test"
    keys: ClassVar[tuple[str, ...]] = ("scale",)

    @classmethod
    def from_entry(cls, d, key, name, better, description):
        scale = d.get("scale", 1.0)
        if not isinstance(scale, (int, float)) or scale <= 0:
            raise SpecError(f"'scale' must be a positive number, got {scale!r}", key=f"{key}.scale")
        return cls(metric=Metric(name, "s", better, description or "window length"), scale=float(scale))

    def how(self) -> str:
        return f"the window's length times {self.scale}"

    def collect(self, window):
        return window.seconds * self.scale


def test_a_new_kind_registers_parses_describes_and_collects():
    with pytest.raises(SpecError):
        parse_source({"name": "w", "from": "window_length_for_test", "better": "lower"}, "m")
    register_source(_WindowLength)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_source(dataclasses.make_dataclass("Other", [], bases=(_WindowLength,), frozen=True))
        src = parse_source({"name": "w", "from": "window_length_for_test", "scale": 2, "better": "lower"}, "m")
        assert isinstance(src, _WindowLength) and src.describe() == (
            "window_length_for_test source 'w': the window's length times 2.0 [s], lower is better")
        with pytest.raises(SpecError) as exc:
            parse_source({"name": "w", "from": "window_length_for_test", "scale": -1, "better": "lower"}, "m")
        assert exc.value.key == "m.scale"
        with pytest.raises(SpecError, match="unknown key"):
            parse_source({"name": "w", "from": "window_length_for_test", "field": "x", "better": "lower"}, "m")
        c = SourceCollector([src], "http://127.0.0.1:9", None)
        c.begin_sample()
        time.sleep(0.05)
        out = c.end_sample([], 9.0)
        assert 0.1 <= out["w"] < 2.0 and c.problems() == []
    finally:
        sources_mod.SOURCE_KINDS.discard("window_length_for_test")
    assert "window_length_for_test" not in source_kinds()


# --------------------------------------------------------------------------- bodies read with bounds


class _Hostile:
    """Loopback server whose /metrics is over the cap (plain or a gzip bomb) and whose
    server info is over the cap too."""

    def __init__(self):
        import gzip
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from bisect_harness.measure.bodies import MAX_BODY_BYTES

        plain = b"# a comment line that goes on\n" * (MAX_BODY_BYTES // 30 + 10)
        bomb = gzip.compress(b"\n" * (MAX_BODY_BYTES * 8), compresslevel=9)
        self.sizes = {"plain": len(plain), "bomb": len(bomb)}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body, extra = (bomb, {"Content-Encoding": "gzip"}) if self.path == "/bomb" else (plain, {})
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:  # the client stopped reading at its cap
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("path", ["/metrics", "/bomb"])
def test_a_metrics_body_past_the_cap_is_a_problem_not_the_harness_memory(path):
    from bisect_harness.measure.sources import SourceCollector, parse_source

    srv = _Hostile()
    try:
        src = parse_source({"name": "gen", "from": "prometheus", "metric": "x_total", "kind": "rate",
                            "better": "higher"}, "m[0]")
        collector = SourceCollector([src], srv.base_url, None, metrics_path=path, timeout_s=20)
        samples, problem = collector._scrape()
        assert samples is None and "went past 4,194,304 bytes" in problem, problem
        from bisect_harness.backends.procedure import fetch_server_info

        info = fetch_server_info(srv.base_url, [path])
        assert info is None
    finally:
        srv.close()
    assert srv.sizes["bomb"] < 100_000  # a small body that would decode to 32 MiB


# --------------------------------------------------------------------------- derived metrics


def vllm_counters(accepted, drafts):
    """vLLM's two speculative-decoding counters as its /metrics writes them
    (vllm/v1/spec_decode/metrics.py: Counter "vllm:spec_decode_num_accepted_tokens" and
    "vllm:spec_decode_num_drafts", one series per engine)."""
    return f"""# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
"""


def test_vllm_acceptance_length_from_two_counters_per_window(server):
    # read 1 and 2 frame the first window, 3 and 4 the second (no drafts in it)
    server.metrics = lambda n: vllm_counters(*{1: (100, 50), 2: (190, 80), 3: (190, 80), 4: (190, 80)}[n])
    entries = [  # the derived one first: collected after its inputs all the same
        {"name": "acceptance_length", "from": "derived", "ratio": ["accepted", "drafts"], "offset": 1,
         "unit": "tok/draft", "better": "higher"},
        {"name": "accepted", "from": "prometheus", "metric": "vllm:spec_decode_num_accepted_tokens",
         "better": "higher"},
        {"name": "drafts", "from": "prometheus", "metric": "vllm:spec_decode_num_drafts", "better": "higher"},
    ]
    srcs = resolve_derived([parse_source(e, f"engine.metrics[{i}]") for i, e in enumerate(entries)])
    c = SourceCollector(srcs, server.url, None)
    c.begin_sample()
    assert c.end_sample([], 1.0) == {"acceptance_length": 4.0, "accepted": 90.0, "drafts": 30.0}  # 1 + 90 / 30
    c.begin_sample()
    assert c.end_sample([], 1.0) == {"accepted": 0.0, "drafts": 0.0}  # 0 / 0: a miss, never inf or nan
    (problem,) = c.problems()
    assert problem == ("derived source 'acceptance_length': 1 problem(s) over 2 sample(s): drafts is 0 in this "
                       "window: accepted / drafts is undefined")


def test_difference_scale_and_a_derived_input(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("")
    entries = [
        {"name": "verify_s", "from": "log", "pattern": r"verify took (?P<value>[\d.]+) s", "reduce": "sum",
         "unit": "s", "better": "lower"},
        {"name": "passes", "from": "log", "pattern": r"verify pass (?P<value>\d+)", "reduce": "count",
         "better": "higher"},
        {"name": "decode_ms", "from": "log", "pattern": r"decode step (?P<value>[\d.]+) ms", "unit": "ms",
         "better": "lower"},
        {"name": "extra_ms", "from": "derived", "difference": ["verify_ms_per_cycle", "decode_ms"], "unit": "ms",
         "better": "lower", "description": "what a verify cycle costs above a decode step"},
        {"name": "verify_ms_per_cycle", "from": "derived", "ratio": ["verify_s", "passes"], "scale": 1000,
         "unit": "ms", "better": "lower"},
    ]
    srcs = resolve_derived([parse_source(e, f"engine.metrics[{i}]") for i, e in enumerate(entries)])
    c = SourceCollector(srcs, "http://127.0.0.1:9", log)
    c.begin_sample()
    with log.open("a") as f:
        f.write("verify pass 1\nverify took 0.030 s\nverify pass 2\nverify took 0.028 s\ndecode step 12.0 ms\n")
    out = c.end_sample([], 1.0)
    assert out["verify_ms_per_cycle"] == pytest.approx(29.0) and out["extra_ms"] == pytest.approx(17.0)
    assert list(out) == ["verify_s", "passes", "decode_ms", "extra_ms", "verify_ms_per_cycle"]  # as declared
    c.begin_sample()
    with log.open("a") as f:
        f.write("verify pass 3\nverify took 0.031 s\n")  # no decode line: its input is missing
    out = c.end_sample([], 1.0)
    assert out["verify_ms_per_cycle"] == pytest.approx(31.0) and "extra_ms" not in out
    probs = c.problems()
    assert any(p.startswith("derived source 'extra_ms'") and "input 'decode_ms' gave no value in this window" in p
               for p in probs), probs
    by = {s.name: s for s in srcs}
    assert by["verify_ms_per_cycle"].describe() == (
        "derived source 'verify_ms_per_cycle': verify_s / passes x 1000, from each sample window's values of "
        "those sources [ms], lower is better")
    assert by["extra_ms"].how() == "verify_ms_per_cycle - decode_ms, from each sample window's values of those sources"
    # the definition says what each input is, down to the sources that read the server
    assert by["extra_ms"].metric.description == (
        "what a verify cycle costs above a decode step: verify_ms_per_cycle - decode_ms, from each sample window's "
        "values of those sources; where verify_ms_per_cycle: verify_s / passes x 1000, from each sample window's "
        "values of those sources; where verify_s: log lines matching 'verify took (?P<value>[\\\\d.]+) s' (sum); "
        "passes: log lines matching 'verify pass (?P<value>\\\\d+)' (count); decode_ms: log lines matching "
        "'decode step (?P<value>[\\\\d.]+) ms' (mean)")


@pytest.mark.parametrize("entry, key, fragment", [
    ({"ratio": ["a", "b"], "difference": ["a", "b"]}, "m.difference", "got both ratio and difference"),
    ({}, "m.ratio", "exactly one of 'ratio: [a, b]'"),
    ({"ratio": "a/b"}, "m.ratio", "must name two metrics"),
    ({"ratio": ["a", "b", "c"]}, "m.ratio", "must name two metrics"),
    ({"ratio": ["a", "a"]}, "m.ratio", "names 'a' twice"),
    ({"ratio": ["x", "b"]}, "m.ratio", "cannot be derived from itself"),
    ({"ratio": ["a", "b"], "scale": 0}, "m.scale", "'scale' of 0"),
    ({"ratio": ["a", "b"], "scale": "1000"}, "m.scale", "must be a number"),
    ({"ratio": ["a", "b"], "offset": float("inf")}, "m.offset", "must be a number"),
    ({"ratio": ["a", "b"], "field": "f"}, "m.field", "unknown key"),
])
def test_derived_parse_errors_name_the_key(entry, key, fragment):
    with pytest.raises(SpecError) as exc:
        parse_source({"name": "x", "from": "derived", "better": "lower", **entry}, "m")
    assert exc.value.key == key and fragment in str(exc.value)


def test_derived_names_are_checked_against_the_declared_sources():
    def load(*entries):
        return resolve_derived([parse_source(e, f"engine.metrics[{i}]") for i, e in enumerate(entries)])

    a = {"name": "a", "from": "log", "pattern": "(?P<value>1)", "better": "lower"}
    with pytest.raises(SpecError) as exc:
        load(a, {"name": "r", "from": "derived", "ratio": ["a", "tok_s"], "better": "lower"})
    assert exc.value.key == "engine.metrics[1].ratio" and "names 'tok_s', which is not a metric" in str(exc.value)
    assert "client's own metrics, like tok_s, are not among them" in str(exc.value)
    with pytest.raises(SpecError) as exc:
        load(a, {"name": "p", "from": "derived", "ratio": ["a", "q"], "better": "lower"},
             {"name": "q", "from": "derived", "difference": ["p", "a"], "better": "lower"})
    assert exc.value.key == "engine.metrics[1].ratio" and "a cycle: p -> q -> p" in str(exc.value)


def test_a_derived_metric_applies_only_where_its_inputs_are_collected():
    entries = [{"name": "verify_ms", "from": "log", "pattern": "(?P<value>1)", "better": "lower",
                "when": {"speculative-algorithm": True}},
               {"name": "steps", "from": "log", "pattern": "(?P<value>1)", "reduce": "count", "better": "lower"},
               {"name": "per_step", "from": "derived", "ratio": ["verify_ms", "steps"], "better": "lower"},
               {"name": "per_per", "from": "derived", "ratio": ["per_step", "steps"], "better": "lower"}]
    srcs = resolve_derived([parse_source(e, f"m[{i}]") for i, e in enumerate(entries)])
    yes, no = applicable(srcs, {"speculative-algorithm": "EAGLE3"})
    assert [s.name for s in yes] == ["verify_ms", "steps", "per_step", "per_per"] and no == ()
    yes, no = applicable(srcs, {})
    assert [s.name for s in yes] == ["steps"] and [s.name for s in no] == ["verify_ms", "per_step", "per_per"]
    assert isinstance(srcs[2], DerivedSource) and pickle.loads(pickle.dumps(srcs[2])) == srcs[2]
