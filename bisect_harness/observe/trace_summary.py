"""A torch-profiler trace, summed per generated token.

The engines' profilers (SGLang's ``/start_profile``, vLLM's torch profiler, the
demo engine's ``torch.profiler``) all write Kineto's Chrome-trace JSON, usually
gzipped: ``{"schemaVersion": 1, ..., "traceEvents": [{...}, ...], ...}``. A trace
of a few seconds on a GPU holds millions of events and hundreds of megabytes,
so it is read as a stream, one event at a time, with caps::

    summary = summarize_trace("rank0.pt.trace.json.gz", tokens=512, steps=128)
    summary.ms_per_token(summary.ops[0])     # 0.41: aten::mm's self time per token
    summary.per_step(summary.graph_launches)  # 1.0: one CUDA graph launch a step
    summary.to_dict()                         # what the ledger keeps

What is counted, by the trace's own categories (Kineto's ``ActivityType`` names,
``libkineto/src/ActivityType.cpp``):

* **operators**: complete events (``"ph": "X"``) of ``cpu_op``, ``user_annotation``
  and the host-side CUDA calls (``cuda_runtime``, ``cuda_driver``), by *self
  time*: an event's duration minus the part its direct children on the same
  thread (``pid``, ``tid``) cover. Nesting is found by time: per thread the
  events are ordered by start (the longer first on a tie) and each one's parent
  is the innermost open event it starts inside; a child that runs past its
  parent's end (clock rounding) counts only up to that end, so no self time is
  negative. ``python_function`` events (``with_stack``) take part in the nesting
  but are not listed.
* **kernels**: ``kernel`` events on the device timeline, by duration (kernels do
  not nest).
* **launches**: host calls named ``cudaLaunchKernel``, ``cudaLaunchKernelExC``,
  ``cuLaunchKernel``, ``cuLaunchKernelEx``, the cooperative launches and their
  HIP twins (kernel launches), ``cudaGraphLaunch`` / ``cuGraphLaunch`` /
  ``hipGraphLaunch`` (graph launches), ``cudaMemcpy*`` / ``cuMemcpy*`` /
  ``hipMemcpy*`` (copy calls); Kineto names the per-thread-stream variants with a
  ``_ptsz`` / ``_ptds`` suffix (``libkineto/src/cupti_strings.cpp``), read as the
  plain call.
* **copies**: ``gpu_memcpy`` and ``gpu_memset`` events, with ``args.bytes``
  where the trace gives it (Kineto's ``CuptiActivity.cpp`` does).

A trace without any CUDA runtime event (a CPU run) has nothing to say about
launches: ``runtime_events == 0`` says so, and a reader must not read its zero
launches as "no launches". Times in a Chrome trace are microseconds (``ts``,
``dur``); the summary keeps milliseconds.

Bounds (keyword arguments, defaults below): the decompressed bytes read and the
events read; past either the reading stops and the summary says ``truncated``
with why. One event (or one top-level value) larger than ``max_event_bytes``, a
file that is not a gzip or JSON trace, or one without a ``traceEvents`` array is
:class:`TraceUnreadable` with the reason; so is a trace with nothing to divide
by (``tokens`` < 1). An event that is not a well-formed complete event (a
duration that is not a finite number, say) is skipped and counted in
``skipped``, with the first reason in ``skipped_why``: never silently.
"""

from __future__ import annotations

import codecs
import json
import math
import re
import zlib
from array import array
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from bisect_harness.errors import ConfigFailure

__all__ = [
    "MAX_EVENT_BYTES", "MAX_TRACE_BYTES", "MAX_TRACE_EVENTS", "SUMMARY_SCHEMA", "TOP_ROWS",
    "TraceRow", "TraceSummary", "TraceUnreadable", "summarize_trace",
]

#: Decompressed bytes read from one trace before reading stops (``truncated``).
MAX_TRACE_BYTES = 4 << 30
#: Trace events read before reading stops (``truncated``); the host events are kept
#: (three numbers each) until the end, to find their nesting. One million events of
#: which half on the host: 9 s and 46 MiB over the interpreter on a busy 2-core VM.
MAX_TRACE_EVENTS = 3_000_000
#: The largest single event or top-level value: past it the trace is unreadable.
MAX_EVENT_BYTES = 1 << 20
#: Rows kept per table (operators, kernels); the totals count every row.
TOP_ROWS = 25
#: Names longer than this are cut (C++ kernel names run to kilobytes).
MAX_NAME = 240
#: Distinct names kept apart; later new names are summed in one row.
MAX_NAMES = 50_000
#: The version of :meth:`TraceSummary.to_dict`'s layout; :meth:`from_dict` refuses newer.
SUMMARY_SCHEMA = 1

_CHUNK = 1 << 16
_OTHER_NAMES = f"(names past the first {MAX_NAMES})"

# Category spellings: Kineto's (lower case) and the older torch 1.8-era ones.
_OP_CATS = {"cpu_op": "cpu_op", "operator": "cpu_op", "user_annotation": "user_annotation",
            "cuda_runtime": "cuda_runtime", "runtime": "cuda_runtime", "cuda_driver": "cuda_driver"}
_NESTING_ONLY = {"python_function"}
_KERNEL_CATS = {"kernel"}
_MEMCPY_CATS = {"gpu_memcpy", "memcpy"}
_MEMSET_CATS = {"gpu_memset", "memset"}
_RUNTIME = {"cuda_runtime", "cuda_driver"}

_KERNEL_LAUNCHES = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernelMultiDevice", "cuLaunchKernel", "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel", "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel", "hipLaunchCooperativeKernel",
})
_GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
_COPY_CALL = re.compile(r"(cuda|cu|hip)Memcpy")
_CALL_SUFFIX = re.compile(r"(_ptsz|_ptds|_v\d+)+$")


class TraceUnreadable(ConfigFailure):
    """A profile trace that cannot be read: not gzip or JSON, no ``traceEvents``,
    an event past the size cap, nothing to divide by. ``reason`` says which.

    Recoverable like any :class:`ConfigFailure`, and narrower: the boot's
    samples stand; only its profile is recorded as failed, with the reason.
    """

    def __init__(self, reason: str, *, path: str | Path | None = None):
        self.reason = reason
        self.path = str(path) if path is not None else None
        super().__init__(f"profile trace {path}: {reason}" if path is not None else f"profile trace: {reason}")


@dataclass(frozen=True)
class TraceRow:
    """One operator or kernel name, summed over the trace.

    ``ms``: self time for an operator, duration for a kernel, in milliseconds
    over the whole trace; ``cat``: the trace's category (``cpu_op``,
    ``user_annotation``, ``cuda_runtime``, ``cuda_driver``, ``kernel``).
    """

    name: str
    cat: str
    count: int
    ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cat": self.cat, "count": self.count, "ms": self.ms}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TraceRow":
        return cls(name=str(d["name"]), cat=str(d["cat"]), count=int(d["count"]), ms=float(d["ms"]))


@dataclass(frozen=True)
class TraceSummary:
    """What one profiled sample's trace says, as totals over the trace.

    Per-token and per-step figures are the totals divided by ``tokens`` (the
    tokens the profiled requests generated) and ``steps`` (engine steps in the
    profile, where known): :meth:`ms_per_token`, :meth:`per_token`,
    :meth:`per_step`. ``ops`` and ``kernels`` are the top rows by time; the
    ``*_ms`` and ``*_count`` totals include every row.
    """

    tokens: int
    steps: int | None
    events: int                     # trace events read
    span_ms: float                  # first host event's start to the last one's end
    ops: tuple[TraceRow, ...]       # top operators by self time
    op_ms: float                    # every operator's self time
    op_count: int
    kernels: tuple[TraceRow, ...]   # top kernels by duration
    kernel_ms: float
    kernel_count: int
    runtime_events: int             # CUDA runtime/driver calls seen; 0: nothing to say of launches
    kernel_launches: int
    graph_launches: int
    copy_calls: int                 # cudaMemcpy* / cuMemcpy* / hipMemcpy* host calls
    copies: int                     # gpu_memcpy events
    copy_bytes: int
    copy_ms: float
    memsets: int                    # gpu_memset events
    memset_bytes: int
    truncated: bool = False
    truncated_why: str = ""
    skipped: int = 0
    skipped_why: str = ""
    op_names: int | None = None     # distinct operator names in the trace (``ops`` holds the top ones)
    kernel_names: int | None = None

    def complete(self, table: str) -> bool:
        """Whether ``ops`` / ``kernels`` lists every name of the trace, so a name
        not listed took no time (else it may sit below the cut)."""
        rows, names = (self.ops, self.op_names) if table == "ops" else (self.kernels, self.kernel_names)
        return names is not None and names <= len(rows)

    # ------------------------------------------------------------------ figures
    def per_token(self, value: float) -> float:
        return value / self.tokens

    def ms_per_token(self, row: TraceRow) -> float:
        return row.ms / self.tokens

    def per_step(self, value: float) -> float | None:
        """``value`` per engine step, or None where the steps are not known."""
        return value / self.steps if self.steps else None

    @property
    def has_cuda(self) -> bool:
        """Whether the trace saw CUDA at all (runtime calls or device events):
        without it, zero launches are not evidence of none."""
        return bool(self.runtime_events or self.kernel_count or self.copies or self.memsets)

    # ------------------------------------------------------------------ storage
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": SUMMARY_SCHEMA}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = [r.to_dict() for r in v] if f.name in ("ops", "kernels") else v
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TraceSummary":
        """The summary :meth:`to_dict` wrote; a newer layout is refused (ValueError)."""
        schema = d.get("schema", SUMMARY_SCHEMA)
        if not isinstance(schema, int) or schema > SUMMARY_SCHEMA:
            raise ValueError(f"a trace summary of layout {schema!r}; this harness reads up to {SUMMARY_SCHEMA}")
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.name in ("ops", "kernels"):
                v = tuple(TraceRow.from_dict(r) for r in v)
            kw[f.name] = v
        return cls(**kw)


# --------------------------------------------------------------------------- reading

class _Text:
    """The decompressed text of a trace file, pulled a chunk at a time, counting
    bytes against ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes = path, max_bytes
        self.f = open(path, "rb")
        head = self.f.read(2)
        self.f.seek(0)
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS) if head == b"\x1f\x8b" else None
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.read_bytes = 0
        self.eof = False
        self.capped = False
        self.cut = False

    def close(self) -> None:
        self.f.close()

    def more(self) -> str:
        """The next piece of text ('' at the end, or once ``max_bytes`` is reached)."""
        while not self.eof:
            room = self.max_bytes - self.read_bytes
            if room <= 0:
                self.eof, self.capped = True, True
                return ""
            if self.z is None:
                data = self.f.read(min(_CHUNK, room))
                if not data:
                    self.eof = True
                    return self._decode(b"", final=True)
            else:
                data = self.z.unconsumed_tail
                if not data:
                    data = self.f.read(_CHUNK)
                    if not data:
                        self.eof = True
                        self.cut = not self.z.eof  # the gzip stream ends early: still being written, or cut
                        return "" if self.cut else self._decode(b"", final=True)
                try:
                    data = self.z.decompress(data, min(_CHUNK, room))
                except zlib.error as exc:
                    raise TraceUnreadable(f"the gzip stream is corrupt: {exc}", path=self.path) from exc
            self.read_bytes += len(data)
            text = self._decode(data)
            if text:
                return text
        return ""

    def _decode(self, data: bytes, final: bool = False) -> str:
        try:
            return self.utf8.decode(data, final=final)
        except UnicodeDecodeError as exc:
            raise TraceUnreadable(f"not UTF-8 text near byte {self.read_bytes - len(data) + exc.start}",
                                  path=self.path) from exc


class _Cut(Exception):
    """The text ended (the file, or the byte cap) inside a value."""


class _Stream:
    """An incremental reader of one JSON document: values are decoded one at a
    time with the standard decoder from a buffer that holds at most about one
    value (``max_value`` characters) plus a chunk."""

    _decoder = json.JSONDecoder()
    _WS = " \t\n\r"

    def __init__(self, text: _Text, max_value: int):
        self.text, self.max_value = text, max_value
        self.buf, self.pos = "", 0
        self.ended_early = False
        self.seen_events = False

    def _fill(self) -> bool:
        piece = self.text.more()
        if not piece:
            return False
        if self.pos > _CHUNK:
            self.buf, self.pos = self.buf[self.pos:], 0
        self.buf += piece
        return True

    def peek(self) -> str:
        """The next non-blank character ('' at the end of the text)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in self._WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._fill():
                return ""

    def take(self, ch: str, where: str) -> None:
        got = self.peek()
        if got != ch:
            raise TraceUnreadable(f"expected {ch!r} {where}, found {got or 'the end of the file'!r}",
                                  path=self.text.path)
        self.pos += 1

    def value(self, where: str) -> Any:
        """The next JSON value. A number or literal that ends exactly at the end of
        the buffer may go on in the next chunk, so it is decoded again with more."""
        self.peek()
        while True:
            try:
                val, end = self._decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if len(self.buf) - self.pos > self.max_value:
                    raise TraceUnreadable(f"{where} is larger than {self.max_value} bytes", path=self.text.path)
                if self._fill():
                    continue
                if (self.text.capped or self.text.cut or exc.pos >= len(self.buf.rstrip())
                        or exc.msg.startswith("Unterminated string")):
                    raise _Cut(where) from exc  # the text ran out inside the value, not a malformed one
                raise TraceUnreadable(f"{where} is not valid JSON ({exc.msg})", path=self.text.path) from exc
            if end == len(self.buf) and self._fill():
                continue
            if end - self.pos > self.max_value:
                raise TraceUnreadable(f"{where} is larger than {self.max_value} bytes", path=self.text.path)
            self.pos = end
            return val


def _events(s: _Stream, path: Path) -> Iterator[Any]:
    """The elements of the trace's ``traceEvents`` array, in file order (or of the
    top-level array, the Trace Event Format's other form). A trailing comma
    before ``]`` is accepted, as Chrome's viewer accepts it; a file that ends
    inside the array ends the events and sets ``s.ended_early``."""
    if s.peek() == "[":
        yield from _array(s, path)
        return
    s.take("{", "at the start of the trace")
    seen = False
    try:
        yield from _members(s, path)
    except _Cut as cut:
        if not s.seen_events:
            raise TraceUnreadable(f"the file ends inside {cut}, before any traceEvents", path=path) from None
        # past the events: a key the summary does not read (traceName, say) is what was lost


def _members(s: _Stream, path: Path) -> Iterator[Any]:
    seen = False
    while True:
        ch = s.peek()
        if ch == "}":
            break
        if ch == "":
            if seen:
                s.ended_early = True
                return
            raise TraceUnreadable("the file ends inside the trace object, before any traceEvents", path=path)
        key = s.value("a key of the trace object")
        if not isinstance(key, str):
            raise TraceUnreadable("a key of the trace object is not a string", path=path)
        s.take(":", f"after the key {key!r}")
        if key == "traceEvents" and not seen:
            seen = s.seen_events = True
            if s.peek() != "[":
                raise TraceUnreadable("traceEvents is not an array", path=path)
            yield from _array(s, path)
            if s.ended_early:
                return
        else:
            s.value(f"the value of {key!r}")  # read and dropped, within the same cap
        ch = s.peek()
        if ch == ",":
            s.pos += 1
        elif ch == "" and seen:
            s.ended_early = True
            return
        elif ch != "}":
            raise TraceUnreadable(f"expected ',' or '}}' after the value of {key!r}, found {ch or 'the end'!r}",
                                  path=path)
    if not seen:
        raise TraceUnreadable("the trace has no traceEvents array", path=path)


def _array(s: _Stream, path: Path) -> Iterator[Any]:
    s.take("[", "at the start of traceEvents")
    i = 0
    while True:
        ch = s.peek()
        if ch == "]":
            s.pos += 1
            return
        if ch == "":
            s.ended_early = True
            return
        try:
            ev = s.value(f"traceEvents[{i}]")
        except _Cut:
            s.ended_early = True
            return
        yield ev
        i += 1
        ch = s.peek()
        if ch == ",":
            s.pos += 1
        elif ch == "]":
            s.pos += 1
            return
        elif ch == "":
            s.ended_early = True
            return
        else:
            raise TraceUnreadable(f"expected ',' or ']' after traceEvents[{i - 1}], found {ch!r}", path=path)


# --------------------------------------------------------------------------- summing

@dataclass
class _Thread:
    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    key: array = field(default_factory=lambda: array("l"))


def _call_name(name: str) -> str:
    return _CALL_SUFFIX.sub("", name)


def _bytes_of(ev: Mapping[str, Any]) -> int:
    args = ev.get("args")
    b = args.get("bytes") if isinstance(args, dict) else None
    return int(b) if isinstance(b, (int, float)) and not isinstance(b, bool) and b >= 0 and math.isfinite(b) else 0


def summarize_trace(path: str | Path, *, tokens: int, steps: int | None = None,
                    max_bytes: int = MAX_TRACE_BYTES, max_events: int = MAX_TRACE_EVENTS,
                    max_event_bytes: int = MAX_EVENT_BYTES, top: int = TOP_ROWS) -> TraceSummary:
    """Read a Chrome-trace JSON (gzipped or plain) and sum it; see the module doc.

    ``tokens``: the tokens generated while the profiler ran (the divisor of every
    per-token figure); ``steps``: the engine steps in that time, where known.
    Raises :class:`TraceUnreadable`.
    """
    path = Path(path)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise TraceUnreadable(f"the profiled requests generated {tokens!r} tokens: nothing to divide by", path=path)
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        steps = None  # an unknown or empty step count gives no per-step figures, never a division by zero
    try:
        text = _Text(path, max_bytes)
    except OSError as exc:
        raise TraceUnreadable(f"cannot open it: {exc.strerror or exc}", path=path) from exc

    names: dict[tuple[str, str], int] = {}   # (cat, name) -> key
    threads: dict[tuple[Any, Any], _Thread] = {}
    kernels: dict[int, list] = {}            # key -> [count, us]
    n = 0
    truncated_why = ""
    skipped, skipped_why = 0, ""
    runtime_events = kernel_launches = graph_launches = copy_calls = 0
    copies = copy_bytes = memsets = memset_bytes = 0
    copy_us = 0.0
    lo, hi = math.inf, -math.inf

    def key_of(cat: str, name: str) -> int:
        k = names.get((cat, name))
        if k is None:
            if len(names) >= MAX_NAMES and name != _OTHER_NAMES:
                return key_of(cat, _OTHER_NAMES)  # one row per category holds the rest
            k = names[(cat, name)] = len(names)
        return k

    stream = _Stream(text, max_event_bytes)
    try:
        for ev in _events(stream, path):
            if n >= max_events:
                truncated_why = f"stopped after {max_events} events (the cap)"
                break
            n += 1
            if not isinstance(ev, dict):
                skipped += 1
                skipped_why = skipped_why or f"event {n - 1} is not an object"
                continue
            if ev.get("ph") != "X":
                continue  # metadata, instant, flow and counter events carry no durations to sum
            raw_cat = ev.get("cat")
            cat = raw_cat.lower() if isinstance(raw_cat, str) else ""
            op_cat = _OP_CATS.get(cat)
            is_kernel, is_copy, is_set = cat in _KERNEL_CATS, cat in _MEMCPY_CATS, cat in _MEMSET_CATS
            if not (op_cat or is_kernel or is_copy or is_set or cat in _NESTING_ONLY):
                continue  # e.g. the profiler's own "Trace" span
            ts, dur, name = ev.get("ts"), ev.get("dur"), ev.get("name")
            bad = ("its ts is not a number" if not _finite(ts) else
                   "its dur is not a number >= 0" if not _finite(dur) or dur < 0 else
                   "it has no name" if not isinstance(name, str) else "")
            if bad:
                skipped += 1
                skipped_why = skipped_why or f"a {cat} event ({ev.get('name')!r}): {bad}"
                continue
            name = name if len(name) <= MAX_NAME else name[:MAX_NAME - 1] + "…"
            ts, dur = float(ts), float(dur)
            if is_kernel:
                slot = kernels.setdefault(key_of("kernel", name), [0, 0.0])
                slot[0] += 1
                slot[1] += dur
                continue
            if is_copy or is_set:
                if is_copy:
                    copies += 1
                    copy_bytes += _bytes_of(ev)
                    copy_us += dur
                else:
                    memsets += 1
                    memset_bytes += _bytes_of(ev)
                continue
            pid, tid = ev.get("pid"), ev.get("tid")
            if isinstance(pid, (dict, list)) or isinstance(tid, (dict, list)):
                skipped += 1
                skipped_why = skipped_why or f"a {cat} event ({name!r}): its pid or tid is not a plain value"
                continue
            if op_cat in _RUNTIME:
                runtime_events += 1
                call = _call_name(name)
                if call in _KERNEL_LAUNCHES:
                    kernel_launches += 1
                elif call in _GRAPH_LAUNCHES:
                    graph_launches += 1
                elif _COPY_CALL.match(call):
                    copy_calls += 1
            th = threads.get((pid, tid))
            if th is None:
                th = threads[(pid, tid)] = _Thread()
            th.ts.append(ts)
            th.dur.append(dur)
            th.key.append(key_of(op_cat, name) if op_cat else -1)
            lo, hi = min(lo, ts), max(hi, ts + dur)
        if truncated_why:
            pass
        elif text.capped:
            truncated_why = f"stopped after {max_bytes} bytes of trace (the cap)"
        elif stream.ended_early:
            truncated_why = ("the gzip stream ends early" if text.cut else "the file ends") + \
                " inside traceEvents (cut, or still being written)"
        elif text.cut:
            truncated_why = "the gzip stream ends early (cut, or still being written)"
    finally:
        text.close()

    # self time per (cat, name): each host thread's events nested by time
    op_count_by = np.zeros(len(names), dtype=np.int64)
    op_us_by = np.zeros(len(names), dtype=np.float64)
    for th in threads.values():
        ts = np.frombuffer(th.ts, dtype=np.float64)
        dur = np.frombuffer(th.dur, dtype=np.float64)
        keys = np.frombuffer(th.key, dtype=np.int64 if th.key.itemsize == 8 else np.int32)
        selfs = _self_times(ts, dur)
        listed = keys >= 0
        np.add.at(op_us_by, keys[listed], selfs[listed])
        np.add.at(op_count_by, keys[listed], 1)

    by_key = {k: cn for cn, k in names.items()}
    op_rows = [TraceRow(name=by_key[k][1], cat=by_key[k][0], count=int(op_count_by[k]), ms=float(op_us_by[k]) / 1e3)
               for k in np.nonzero(op_count_by)[0]]
    kernel_rows = [TraceRow(name=by_key[k][1], cat="kernel", count=c, ms=us / 1e3) for k, (c, us) in kernels.items()]
    op_rows.sort(key=lambda r: (-r.ms, r.name))
    kernel_rows.sort(key=lambda r: (-r.ms, r.name))
    return TraceSummary(
        tokens=tokens, steps=steps, events=n,
        span_ms=(hi - lo) / 1e3 if hi >= lo else 0.0,
        ops=tuple(op_rows[:top]), op_ms=float(op_us_by.sum()) / 1e3, op_count=int(op_count_by.sum()),
        kernels=tuple(kernel_rows[:top]), kernel_ms=float(sum(r.ms for r in kernel_rows)),
        kernel_count=sum(r.count for r in kernel_rows),
        runtime_events=runtime_events, kernel_launches=kernel_launches, graph_launches=graph_launches,
        copy_calls=copy_calls, copies=copies, copy_bytes=copy_bytes, copy_ms=copy_us / 1e3,
        memsets=memsets, memset_bytes=memset_bytes,
        truncated=bool(truncated_why), truncated_why=truncated_why, skipped=skipped, skipped_why=skipped_why,
        op_names=len(op_rows), kernel_names=len(kernel_rows),
    )


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _self_times(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Each event's duration minus the time its direct children cover.

    Events of one thread, in any order. Ordered by start, the longer first on a
    tie (so a parent precedes the child that starts with it); an event's parent
    is the innermost open event it starts before the end of. A child that runs
    past its parent's end (clock rounding) is clipped there, both as time taken
    from the parent (so self time is never negative) and as a holder of later
    events (they nest in the parent's parent, as in the profiler's own tree); an
    event that starts exactly where the open one ends is its sibling.
    """
    order = np.lexsort((-dur, ts))
    child = np.zeros(len(ts), dtype=np.float64)
    stack: list[int] = []
    # plain arrays, not lists: 8 bytes an event instead of a Python float each
    ts_l, close = array("d", ts.tobytes()), array("d", (ts + dur).tobytes())  # close: where it stops holding children
    for i in order.tolist():
        t = ts_l[i]
        while stack and t >= close[stack[-1]]:
            stack.pop()
        if stack:
            p = stack[-1]
            close[i] = min(close[i], close[p])  # an overrunning child closes with its parent
            child[p] += close[i] - t
        stack.append(i)
    return np.maximum(dur - child, 0.0)
