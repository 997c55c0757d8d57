"""One streamed request: sent, read chunk by chunk as untrusted input within a total
deadline (``measure.deadline``), timed, and sent again where it produced nothing
(:data:`MAX_RETRIES`): the server said "try again", never took it, answered 200 with
no output, or ended the stream before its stop event (``Api.ends``). What each time
means is in ``measure.client``'s docstring; a request's record is a
:class:`RequestRecord`, a failed one's with its reason, never an exception."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Mapping

import httpx

from bisect_harness.measure.apis import Api, StreamError
from bisect_harness.measure.bodies import UnreadableBody, decoded, read_some
from bisect_harness.measure.deadline import stream_within
from bisect_harness.measure.sse import MAX_SSE_LINE, SSEDecoder, SSELineTooLong

__all__ = ["MAX_REPLY_CHARS", "MAX_RETRIES", "Reading", "RequestRecord", "run_request"]


@dataclass(frozen=True)
class RequestRecord:
    """What one streamed request measured. Times are seconds; None where undefined
    (a failed request, or ITL/TPOT of a one-token answer)."""

    ok: bool
    error: str | None
    start_s: float                  # when it was sent, from the start of the sample
    ttft_s: float | None
    e2e_s: float | None
    itl_s: float | None             # per-token mean over this request
    tpot_s: float | None
    output_tokens: int              # the server's count where sent, else counted_tokens
    counted_tokens: int             # counted from the stream's chunks alone
    chunks: int                     # chunks that carried output
    decode_s: float = 0.0           # first -> last output chunk (ITL numerator)
    decode_tokens: int = 0          # tokens after the first chunk (ITL denominator)
    usage: Mapping[str, Any] | None = None
    meta_info: Mapping[str, Any] | None = None
    token_gaps_s: tuple[float, ...] = ()  # per-token ITL values (module docstring: percentiles)
    last_chunk: Mapping[str, Any] | None = None  # the stream's last JSON object (``from: response, chunk: last``)
    # time.perf_counter() when it was sent, the clock of every time above (on Linux the
    # host's CLOCK_MONOTONIC): its first chunk came at sent_at + ttft_s, its last at
    # that + decode_s, comparable with a server's own stamps on the same host. 0.0 on
    # a failed request.
    sent_at: float = 0.0
    # the server's count was below the chunks that carried text (each carries a token at
    # least): not believed, ``output_tokens`` is the counted figure, and the boot is marked
    usage_mismatch: str | None = None
    retries: int = 0                # times it was sent again: a try that produced nothing (:data:`MAX_RETRIES`)
    prompt_tokens: int | None = None  # the prompt's length as the server counted it (usage), where it said
    retry_reason: str | None = None  # the first such answer
    # of the prompt, the tokens the server took from its prefix cache and those it computed,
    # where it said (``Api.cached_tokens``, ``Api.evaluated_tokens``)
    cached_tokens: int | None = None
    evaluated_tokens: int | None = None
    server_tokens: int | None = None  # the server's own count of the output tokens, where it sent one
    # the output's text, kept only where asked (a session's turns carry it into the next turn):
    # its first MAX_REPLY_CHARS characters; None where not kept
    text: str | None = None

    def response_fields(self) -> dict[str, Any]:
        """Per-response fields for ``from: response`` metric sources.

        SGLang's ``meta_info`` as sent, plus ``completion_tokens`` and, where
        ``spec_verify_ct`` is present and positive, ``spec_accept_length`` =
        completion_tokens / spec_verify_ct (unless the server sent it itself).
        """
        out: dict[str, Any] = dict(self.meta_info or {})
        if self.usage:
            for key, value in self.usage.items():
                out.setdefault(key, value)
        out.setdefault("completion_tokens", self.output_tokens)
        verify = out.get("spec_verify_ct")
        if "spec_accept_length" not in out and isinstance(verify, (int, float)) and verify > 0:
            out["spec_accept_length"] = out["completion_tokens"] / verify
        return out


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err if err is not None else obj)


class _Stream:
    """Per-request parse state: output chunk times and token counts, written by the
    request's :class:`~bisect_harness.measure.apis.Api` as it reads each object.

    Everything in a chunk is untrusted: a field of the wrong shape or a token count that
    cannot be true ends the request as failed with the reason (:class:`StreamError`),
    never a crash and never a number believed."""

    __slots__ = ("api", "most", "times", "ks", "usage", "meta", "prev_text", "prev_ct", "server_count", "done",
                 "last", "text", "text_chars")

    def __init__(self, api: Api, most: int | None = None, keep_text: bool = False) -> None:
        self.api = api
        self.most = most  # the request's max tokens: no true count exceeds it
        self.times: list[float] = []
        self.ks: list[int | None] = []
        self.usage: dict | None = None
        self.meta: dict | None = None
        self.prev_text = ""
        self.prev_ct = 0
        self.server_count: int | None = None
        self.done = False
        self.last: dict | None = None
        self.text: list[str] | None = [] if keep_text else None  # the output's text, where kept
        self.text_chars = 0

    def handle(self, event: str | None, data: bytes, now: float) -> None:
        if data[:6] == b"[DONE]":
            self.done = True  # the OpenAI end of stream: every kind takes it as the end
            return
        if not data.strip():
            return
        try:
            obj = json.loads(data)
        except ValueError as e:
            raise StreamError(f"undecodable chunk {data[:200]!r}: {e}") from None
        if event == "error":
            raise StreamError(f"server sent an error event: {_error_text(obj)}")
        if not isinstance(obj, dict):
            return
        if obj.get("error") is not None or obj.get("object") == "error":
            raise StreamError(f"server error in stream: {_error_text(obj)}")
        self.last = obj
        self.api.read(self, obj, now)
        if self.api.ends(obj):
            self.done = True

    def output(self, now: float, k: int | None) -> None:
        """A chunk carried output: ``k`` tokens (None: not known from this chunk)."""
        self.times.append(now)
        self.ks.append(k)

    def said(self, text: str, *, whole: bool = False) -> None:
        """More of the output's text (``whole``: all of it so far), kept where asked, up to
        :data:`MAX_REPLY_CHARS` characters in all."""
        if self.text is None:
            return
        if whole:
            self.text.clear()
            self.text_chars = 0
        room = MAX_REPLY_CHARS - self.text_chars
        if room > 0 and text:
            self.text.append(text[:room])
            self.text_chars += min(len(text), room)

    def count(self, value: Any, where: str) -> int | None:
        """The server's running count of output tokens, checked: the tokens since its
        last count, or None where it sent none; a :class:`StreamError` where the count
        cannot be true (not a whole number, below the count it sent before, or above the
        ``most`` tokens the request allowed)."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise StreamError(f"{where} is {value!r}, not a whole number of tokens")
        if value < self.prev_ct:
            raise StreamError(f"{where} went down from {self.prev_ct} to {value}")
        if self.most is not None and value > self.most:
            raise StreamError(f"{where} is {value}, more than the {self.most} tokens the request allowed")
        k, self.prev_ct, self.server_count = value - self.prev_ct, value, value
        return k

    def server_tokens(self) -> int | None:
        """The server's own count of the request's output tokens (checked as it came)."""
        return self.server_count


def _failed(start: float, error: str) -> RequestRecord:
    return RequestRecord(ok=False, error=error, start_s=start, ttft_s=None, e2e_s=None, itl_s=None,
                         tpot_s=None, output_tokens=0, counted_tokens=0, chunks=0)


#: The most of a request's output text kept (``RequestRecord.text``), in characters: a reply
#: of a few thousand tokens fits many times over; a server that sends more is not kept whole.
MAX_REPLY_CHARS = 1 << 20

#: Transport errors before any response: the request was not taken and may be sent again.
_NOT_TAKEN = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError)

#: Times a request that produced nothing is sent again within its sample, after a short
#: pause: the server answered "try again" (``Api.retryable``: 429, 503, llama.cpp's "slot
#: unavailable"), never took it (a connection closed before any answer), answered 200
#: with no output (an empty stream: llama.cpp's server of late 2023 did so to a request
#: that came as the previous one ended), or ended the stream before its stop event (cut
#: short). Every retry is counted in the request's record and the boot's provenance; a
#: request whose every try failed fails its sample (``measure.client``).
MAX_RETRIES = 3


@dataclass(frozen=True)
class Reading:
    """How a request's stream is read: at most ``max_line`` bytes a line
    (``limits.stream_line_bytes``), and whether the output's text is kept in the record
    (``RequestRecord.text``: a session's turns carry it into the next)."""

    max_line: int = MAX_SSE_LINE
    keep_text: bool = False


def run_request(http: httpx.Client, url: str, payload: dict, api: Api, timeout_s: float, most: int,
                sample_t0: float, reading: Reading = Reading()) -> RequestRecord:
    """Send one request (again where it produced nothing, :data:`MAX_RETRIES`) and read its
    stream as ``reading`` says."""
    retries, why = 0, None
    while True:
        rec, again = _send(http, url, payload, api, timeout_s, most, sample_t0, reading)
        if again is None or retries >= MAX_RETRIES:
            return dataclasses.replace(rec, retries=retries, retry_reason=why) if retries else rec
        retries += 1
        why = why or again
        time.sleep(min(0.05 * 2 ** retries, 1.0))


def _send(http: httpx.Client, url: str, payload: dict, api: Api, timeout_s: float, most: int,
          sample_t0: float, reading: Reading) -> tuple[RequestRecord, str | None]:
    """One try of a request: its record, and why to send it again (None: do not)."""
    st = _Stream(api, most, reading.keep_text)  # ``most``: the request's max tokens (``benchmark.output_tokens``)
    dec = SSEDecoder(reading.max_line)  # ``limits.stream_line_bytes``
    t0 = time.perf_counter()
    start = t0 - sample_t0
    head = b""  # the body's first bytes: what a server that streamed nothing said instead
    answered = False
    try:
        with stream_within(http, "POST", url, timeout_s, json=payload) as r:  # timeout_s in all
            answered = True
            if r.status_code != 200:
                body = read_some(r, 500).decode("utf-8", "replace")  # an error page, however long
                again = f"HTTP {r.status_code}: {body[:120]}" if api.retryable(r.status_code, body) else None
                return _failed(start, f"HTTP {r.status_code} from {url}: {body}"), again
            handle = st.handle
            for raw in decoded(r, 1 << 20):  # a compressed stream inflated a MiB at a time
                now = time.perf_counter()
                if len(head) < 512:
                    head += raw[:512 - len(head)]
                for event, data in dec.feed(raw):
                    handle(event, data, now)
                if now - t0 > timeout_s:
                    return _failed(start, f"request exceeded request_timeout_s={timeout_s:g}"), None
            now = time.perf_counter()
            for event, data in dec.close():
                handle(event, data, now)
    except httpx.HTTPError as e:
        # A kept-alive connection the server closed as the request went out (an idle
        # timeout, a cap on requests per connection: cpp-httplib's, say) ends before any
        # answer: the server never took the request, so it is sent again on a fresh
        # connection, like urllib3 and browsers do, and counted as a retry. A stream the
        # server cut (a chunked body never finished) ended before its stop event: the same.
        again = None
        if isinstance(e, _NOT_TAKEN):
            again = (f"{type(e).__name__} before any response: {e}" if not answered
                     else f"stream cut before its stop event ({api.end}): {type(e).__name__}: {e}")
        return _failed(start, f"{type(e).__name__} on {url}: {e}"), again
    except (StreamError, SSELineTooLong, UnreadableBody) as e:
        return _failed(start, str(e)), None
    t_end = time.perf_counter()
    if not st.times:  # a 200 that produced nothing: asked again (llama.cpp's "slot unavailable" is one)
        said = head.decode("utf-8", "replace")
        again = f"HTTP 200 without output: {said[:120]}" if said.strip() else "an empty HTTP 200 stream"
        return _failed(start, f"stream from {url} ended without any output" + (f": {said[:200]}" if said else "")), again
    if not st.done:  # output, then the stream ended before the server said it was done
        return _failed(start, f"stream from {url} ended before its stop event ({api.end}) after "
                              f"{len(st.times)} chunks of output"), f"stream ended before its stop event ({api.end})"

    times, ks = st.times, st.ks
    counted = sum(1 if k is None else k for k in ks)
    server = st.server_tokens()
    tokens = server if server is not None else counted
    mismatch = None
    if server is not None and server < len(times):  # fewer tokens than text chunks cannot be true
        mismatch = f"the server counted {server} output tokens for {len(times)} chunks of text"
        tokens = max(counted, len(times))
    if all(k is not None for k in ks):
        after_first = sum(ks[1:])
    else:  # token split unknown: the first chunk is one token, the rest came after it
        after_first = tokens - 1
    ttft = times[0] - t0
    e2e = t_end - t0
    decode_s = times[-1] - times[0]
    has_itl = len(times) > 1 and after_first > 0
    return RequestRecord(
        ok=True, error=None, start_s=start, ttft_s=ttft, e2e_s=e2e,
        itl_s=decode_s / after_first if has_itl else None,
        tpot_s=(e2e - ttft) / (tokens - 1) if tokens > 1 else None,
        output_tokens=tokens, counted_tokens=counted, chunks=len(times),
        decode_s=decode_s if has_itl else 0.0, decode_tokens=after_first if has_itl else 0,
        usage=st.usage, meta_info=st.meta, last_chunk=st.last,
        token_gaps_s=_token_gaps(times, ks, after_first) if has_itl else (), sent_at=t0,
        usage_mismatch=mismatch, server_tokens=server, text="".join(st.text) if st.text is not None else None,
        **_prompt_counts(api, st)), None


def _prompt_counts(api: Api, st: "_Stream") -> dict[str, int | None]:
    """The prompt's tokens as the server counted them: all, from its cache, computed. A
    cached or computed count above the whole prompt's cannot be true: not believed."""
    total, cached, computed = api.prompt_tokens(st), api.cached_tokens(st), api.evaluated_tokens(st)
    if total is not None:
        cached = cached if cached is None or cached <= total else None
        computed = computed if computed is None or computed <= total else None
    return {"prompt_tokens": total, "cached_tokens": cached, "evaluated_tokens": computed}


def _token_gaps(times: list[float], ks: list[int | None], after_first: int) -> tuple[float, ...]:
    """One ITL value per output token after the first (``measure.percentiles``)."""
    if all(k is not None for k in ks):
        out: list[float] = []
        pending = 0.0
        for i in range(1, len(times)):
            pending += times[i] - times[i - 1]
            k = ks[i]
            if k > 0:
                out.extend([pending / k] * k)
                pending = 0.0
        return tuple(out)
    per_gap = after_first / (len(times) - 1)  # tokens per gap, spread evenly
    return tuple((times[i] - times[i - 1]) / per_gap for i in range(1, len(times)))
