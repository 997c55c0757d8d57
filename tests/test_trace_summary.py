"""The trace reader: a real torch.profiler trace checked against torch's own
self times, a handmade trace checked figure by figure, and the caps."""

import gzip
import json
from pathlib import Path

import pytest

from bisect_harness.observe import trace_summary as ts_mod
from bisect_harness.observe.trace_summary import TraceRow, TraceSummary, TraceUnreadable, summarize_trace
from bisect_harness.errors import ConfigFailure

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "traces"


def _write(path, doc, *, gz=False, text=None):
    data = (text if text is not None else json.dumps(doc)).encode()
    if gz:
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------- a real trace

def test_real_cpu_trace_matches_torch_self_times(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with torch.profiler.record_function("decode_step"):
                model(x)
    plain = tmp_path / "trace.json"
    prof.export_chrome_trace(str(plain))
    packed = tmp_path / "trace.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))

    s = summarize_trace(packed, tokens=12, steps=3)
    assert s == summarize_trace(plain, tokens=12, steps=3)  # gzip or not, the same figures
    theirs = {e.key: e for e in prof.key_averages()}
    names = {r.name for r in s.ops}
    assert {"decode_step", "aten::addmm", "aten::linear", "aten::relu"} <= names
    for row in s.ops:  # torch sums the same events: the two agree within a float's nanosecond per event
        assert row.count == theirs[row.name].count, row.name
        assert row.ms * 1e3 == pytest.approx(theirs[row.name].self_cpu_time_total, abs=3e-3 * row.count), row.name
    assert s.ops[0].ms >= s.ops[-1].ms
    assert s.op_count == sum(e.count for e in theirs.values())
    # a CPU trace says nothing of launches: no CUDA runtime event at all
    assert not s.has_cuda and s.runtime_events == 0 and s.kernels == ()
    assert s.ms_per_token(s.ops[0]) == pytest.approx(s.ops[0].ms / 12)
    assert s.per_step(9) == 3.0 and not s.truncated and s.skipped == 0


def _covered_us(path) -> float:
    """Per thread, the time covered by the union of its host events: what the self
    times must add up to (each instant belongs to exactly one innermost event),
    computed here by merging intervals, not by nesting them."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    spans: dict = {}
    for ev in doc["traceEvents"]:
        if ev.get("ph") == "X" and ev.get("cat") in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver"):
            spans.setdefault((ev["pid"], ev["tid"]), []).append((ev["ts"], ev["ts"] + ev["dur"]))
    total = 0.0
    for iv in spans.values():
        iv.sort()
        lo, hi = iv[0]
        for a, b in iv[1:]:
            if a > hi:
                total, lo, hi = total + hi - lo, a, b
            else:
                hi = max(hi, b)
        total += hi - lo
    return total


def test_real_vllm_trace(tmp_path):
    """vLLM 0.32's own profiler output (tests/fixtures/traces/README.md)."""
    path = FIXTURES / "vllm-0.32-cpu-16tok.pt.trace.json.gz"
    s = summarize_trace(path, tokens=16)
    assert not s.truncated and s.skipped == 0 and not s.has_cuda
    # self times tile the threads: equal but for children that end a few ns past their parent (clipped)
    assert s.op_ms * 1e3 == pytest.approx(_covered_us(path), abs=0.5)
    steps = {r.name: r.count for r in s.ops if r.cat == "user_annotation" and r.name.startswith("execute_context")}
    assert steps["execute_context_0(0)_generation_1(1)"] == 15 and steps["execute_context_1(3)_generation_0(0)"] == 1
    assert "_C::onednn_mm" in [r.name for r in s.ops[:3]]
    assert s.op_names > len(s.ops) == ts_mod.TOP_ROWS and not s.complete("ops")


# --------------------------------------------------------------------------- a handmade trace

def X(name, cat, ts, dur, pid=1, tid=1, **args):
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


HANDMADE = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150000000000}],
    "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        # thread 1: a step whose children nest three deep
        X("step", "user_annotation", 0, 100),
        X("aten::linear", "cpu_op", 0, 60),               # starts with its parent: the longer is the parent
        X("aten::mm", "cpu_op", 5, 40),
        X("cudaLaunchKernel_ptsz", "cuda_runtime", 10, 8, cbid=211, correlation=1),
        X("aten::add", "cpu_op", 50, 15),                  # runs 5 us past its parent: clipped there
        X("cudaGraphLaunch", "cuda_runtime", 60, 10),      # starts where aten::linear ends: its sibling
        X("model.py(12): forward", "python_function", 72, 20),
        X("aten::mm", "cpu_op", 75, 10),
        X("cuLaunchKernel", "cuda_driver", 78, 2),
        X("cudaMemcpyAsync", "cuda_runtime", 95, 5),
        # thread 2, at the same times: never nested into thread 1
        X("aten::mm", "cpu_op", 0, 30, tid=2),
        X("aten::mm", "cpu_op", 40, "12", tid=2),          # a duration that is not a number: skipped
        # the device
        X("gemv", "kernel", 20, 30, pid=0, tid="stream 7"),
        X("gemv", "kernel", 60, 30, pid=0, tid="stream 7"),
        X("add_kernel", "kernel", 90, 5, pid=0, tid="stream 7"),
        X("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 100, 4, pid=0, tid="stream 7", bytes=4096),
        X("Memset (Device)", "gpu_memset", 110, 1, pid=0, tid="stream 7", bytes=512),
        X("step", "gpu_user_annotation", 20, 80, pid=0, tid="stream 7"),
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": 10, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 1, "pid": 0, "tid": "stream 7", "ts": 20, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        X("PyTorch Profiler (0)", "Trace", -5, 200, pid="Spans", tid="PyTorch Profiler"),
        {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 200},
    ],
    "traceName": "handmade.json",
}

# self times by hand (us): step 100-60-10-20-5 = 5; linear 60-40-10 (add clipped at 60) = 10;
# mm 40-8 + 10-2 + 30 = 70 over 3; add 15; the calls their own durations.
EXPECTED_OPS = [
    ("aten::mm", "cpu_op", 3, 0.070),
    ("aten::add", "cpu_op", 1, 0.015),
    ("aten::linear", "cpu_op", 1, 0.010),
    ("cudaGraphLaunch", "cuda_runtime", 1, 0.010),
    ("cudaLaunchKernel_ptsz", "cuda_runtime", 1, 0.008),
    ("cudaMemcpyAsync", "cuda_runtime", 1, 0.005),
    ("step", "user_annotation", 1, 0.005),
    ("cuLaunchKernel", "cuda_driver", 1, 0.002),
]


def test_handmade_trace_golden(tmp_path):
    s = summarize_trace(_write(tmp_path / "t.json.gz", HANDMADE, gz=True), tokens=4, steps=2)
    assert [(r.name, r.cat, r.count) for r in s.ops] == [e[:3] for e in EXPECTED_OPS]
    assert [r.ms for r in s.ops] == pytest.approx([e[3] for e in EXPECTED_OPS])
    assert s.op_ms == pytest.approx(0.125) and s.op_count == 10
    assert [(r.name, r.count) for r in s.kernels] == [("gemv", 2), ("add_kernel", 1)]
    assert [r.ms for r in s.kernels] == pytest.approx([0.060, 0.005])
    assert s.kernel_ms == pytest.approx(0.065) and s.kernel_count == 3
    assert (s.runtime_events, s.kernel_launches, s.graph_launches, s.copy_calls) == (4, 2, 1, 1)
    assert (s.copies, s.copy_bytes, s.memsets, s.memset_bytes) == (1, 4096, 1, 512)
    assert s.copy_ms == pytest.approx(0.004)
    assert s.span_ms == pytest.approx(0.100)  # host events only: not the profiler's own span
    assert s.skipped == 1 and "dur is not a number" in s.skipped_why and "aten::mm" in s.skipped_why
    assert s.events == len(HANDMADE["traceEvents"]) and not s.truncated and s.has_cuda
    assert s.ms_per_token(s.ops[0]) == pytest.approx(0.0175)
    assert s.per_step(s.graph_launches) == 0.5 and s.per_token(s.kernel_launches) == 0.5
    assert (s.op_names, s.kernel_names) == (8, 2) and s.complete("ops") and s.complete("kernels")
    short = summarize_trace(tmp_path / "t.json.gz", tokens=4, top=3)
    assert [r.name for r in short.ops] == ["aten::mm", "aten::add", "aten::linear"] and short.op_ms == s.op_ms
    assert not short.complete("ops") and short.complete("kernels")


def test_summary_round_trips_through_json(tmp_path):
    s = summarize_trace(_write(tmp_path / "t.json", HANDMADE), tokens=4, steps=None)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["schema"] == ts_mod.SUMMARY_SCHEMA and d["ops"][0] == {"name": "aten::mm", "cat": "cpu_op",
                                                                      "count": 3, "ms": pytest.approx(0.07)}
    back = TraceSummary.from_dict(d)
    assert back == s and isinstance(back.ops[0], TraceRow) and back.per_step(3) is None
    with pytest.raises(ValueError, match="layout 2"):
        TraceSummary.from_dict({**d, "schema": 2})


def test_tiny_chunks_read_the_same(tmp_path, monkeypatch):
    """Every value split at every place a chunk can end: numbers cut mid-digit
    are read whole, never as their first digits."""
    path = _write(tmp_path / "t.json", HANDMADE)
    whole = summarize_trace(path, tokens=4)
    monkeypatch.setattr(ts_mod, "_CHUNK", 3)
    assert summarize_trace(path, tokens=4) == whole
    gz = _write(tmp_path / "t.json.gz", HANDMADE, gz=True)
    assert summarize_trace(gz, tokens=4) == whole


def test_array_form_and_trailing_comma(tmp_path):
    events = json.dumps(HANDMADE["traceEvents"])
    s = summarize_trace(_write(tmp_path / "a.json", None, text=events[:-1] + ",\n]"), tokens=4)
    assert s.ops[0].name == "aten::mm" and s.op_count == 10 and not s.truncated


# --------------------------------------------------------------------------- caps and bad traces

def test_event_cap_truncates(tmp_path):
    s = summarize_trace(_write(tmp_path / "t.json", HANDMADE), tokens=4, max_events=4)
    assert s.truncated and "4 events" in s.truncated_why and s.events == 4
    # the three read: step 100-60, linear 60-40, mm (its child not read) 40
    assert [(r.name, r.ms) for r in s.ops] == [("aten::mm", 0.04), ("step", 0.04), ("aten::linear", 0.02)]


def test_byte_cap_truncates(tmp_path):
    path = _write(tmp_path / "t.json.gz", HANDMADE, gz=True)
    s = summarize_trace(path, tokens=4, max_bytes=900)
    assert s.truncated and "900 bytes" in s.truncated_why and 0 < s.events < len(HANDMADE["traceEvents"])


def test_a_cut_plain_trace_is_truncated_not_lost(tmp_path):
    text = json.dumps(HANDMADE)
    cut = text[:text.index('"name": "gemv"')].rstrip().rstrip("{").rstrip().rstrip(",")
    s = summarize_trace(_write(tmp_path / "t.json", None, text=cut), tokens=4)
    assert s.truncated and "ends inside traceEvents" in s.truncated_why
    assert s.kernels == () and s.ops[0].name == "aten::mm"


@pytest.mark.parametrize("text, fragment", [
    ("", "expected '{'"),
    ("not json", "expected '{'"),
    ('{"schemaVersion": 1, "traceName": "x"}', "no traceEvents"),
    ('{"traceEvents": {"a": 1}}', "not an array"),
    ('{"traceEvents": [{"ph": "X", "dur": 1} {"ph": "X"}]}', "expected ',' or ']' after traceEvents[0]"),
    ('{"traceEvents": [{"ph": "X", "dur": 1e}]}', "traceEvents[0] is not valid JSON"),
    ('{"deviceProperties": [1, 2', "the value of 'deviceProperties'"),
])
def test_unreadable_traces_say_why(tmp_path, text, fragment):
    with pytest.raises(TraceUnreadable, match=fragment.replace("[", r"\[").replace("]", r"\]")) as err:
        summarize_trace(_write(tmp_path / "t.json", None, text=text), tokens=4)
    assert isinstance(err.value, ConfigFailure) and err.value.reason and str(tmp_path) in str(err.value)


def test_other_unreadable_cases(tmp_path):
    path = _write(tmp_path / "t.json.gz", HANDMADE, gz=True)
    with pytest.raises(TraceUnreadable, match="larger than 50 bytes"):
        summarize_trace(path, tokens=4, max_event_bytes=50)
    with pytest.raises(TraceUnreadable, match="nothing to divide by"):
        summarize_trace(path, tokens=0)
    (tmp_path / "latin.json").write_bytes(b'{"traceEvents": [{"name": "caf\xe9"}]}')
    with pytest.raises(TraceUnreadable, match="not UTF-8"):
        summarize_trace(tmp_path / "latin.json", tokens=4)
    with pytest.raises(TraceUnreadable, match="cannot open it"):
        summarize_trace(tmp_path / "absent.json.gz", tokens=4)
    data = path.read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[: len(data) // 2])  # what was read stands, flagged
    cut = summarize_trace(tmp_path / "cut.json.gz", tokens=4)
    assert cut.truncated and "gzip stream ends early inside traceEvents" in cut.truncated_why and cut.events > 3
    (tmp_path / "bad.json.gz").write_bytes(data[:10] + bytes(b ^ 0x5A for b in data[10:40]) + data[40:])
    with pytest.raises(TraceUnreadable, match="gzip stream is corrupt"):
        summarize_trace(tmp_path / "bad.json.gz", tokens=4)


def test_a_step_count_of_zero_gives_no_per_step_figures(tmp_path):
    s = summarize_trace(_write(tmp_path / "t.json", HANDMADE), tokens=4, steps=0)
    assert s.steps is None and s.per_step(s.graph_launches) is None
