"""Streaming benchmark client: tok/s, TTFT, inter-token latency against a ready server.

Two request shapes, chosen by ``BenchmarkSpec.api``:

- ``"completions"``: OpenAI ``POST /v1/completions`` with ``stream: true`` and
  ``stream_options: {include_usage: true}`` (vLLM, SGLang, any compatible server);
- ``"generate"``: SGLang's native ``POST /generate`` with ``stream: true``, whose
  ``text`` is cumulative and whose ``meta_info`` carries ``completion_tokens``
  (and ``spec_verify_ct`` under speculative decoding).

Timing, per request (all from one monotonic clock, stamped at each network read):

- TTFT: request sent -> first chunk that carries output;
- ITL, per *token*: the time between the first and the last output chunk divided
  by the tokens that arrived after the first chunk. A chunk carrying k tokens
  (speculative decoding) thus contributes its gap split over k tokens; ITL is
  never inflated by multi-token chunks. Token counts per chunk come from
  ``meta_info.completion_tokens`` or per-chunk ``usage`` where the server sends
  them; otherwise the first chunk is taken as one token and the rest of the
  server's total as arriving after it;
- TPOT: ``(e2e - ttft) / (tokens - 1)``;
- e2e: request sent -> end of the stream.

Per sample: ``tok_s`` is end-to-end (the output tokens over the sample's wall
time, prefill and TTFT included); ``decode_tok_s`` is decode alone (the tokens
after each first chunk over the first-to-last-chunk times, 1000 / ``itl_ms``).
docs/hypotheses-format.md ("What each number means") sets them beside the
server's counter rate and the engine's in-process timing.

Percentiles (``ttft_p50_ms`` ... ``tpot_p99_ms``, :func:`percentile_metrics`), per
sample, by linear interpolation between order statistics (numpy's default, as
``vllm bench serve`` and SGLang's ``bench_serving`` compute theirs):

- TTFT and TPOT: over the sample's successful requests, one value each (TPOT only
  for requests with two tokens or more);
- ITL: over every output token after each request's first, pooled over the
  sample's requests: a chunk carrying k tokens gives k values of its gap / k (a
  chunk that carries no token adds its gap to the next one that does), so their
  mean is ``itl_ms``; where the server does not say how many tokens a chunk
  carries, each gap gives one value, gap / ((tokens - 1) / (chunks - 1)).

Output tokens are the server's own count (final ``usage.completion_tokens`` or
``meta_info.completion_tokens``) where it sends one, else the count of chunks.

Example::

    bench = BenchmarkSpec(api="completions", output_tokens=128, concurrency=4)
    warmup("http://127.0.0.1:30000", bench)
    result = measure_sample("http://127.0.0.1:30000", bench)
    result.metrics["tok_s"], result.metrics["itl_ms"]
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import httpx

from bisect_harness.errors import ConfigFailure
from bisect_harness.model import BenchmarkSpec
from bisect_harness.measure.bodies import UnreadableBody, decoded, read_some
from bisect_harness.measure.apis import APIS as _APIS, Api, StreamError, get_api, shape as _shape
from bisect_harness.boot import SampleOutcome

__all__ = [
    "RequestRecord", "SampleDetail", "SampleFailed", "SSEDecoder", "SSELineTooLong", "boot_session", "measure_sample",
    "measure_sample_detail", "percentile_metrics", "request_prompt", "resolve_model", "reuse_text", "synthetic_prompt",
    "warmup",
]

APIS = tuple(_APIS)  # benchmark.api: the names of ``apis.APIS``


class SampleFailed(ConfigFailure):
    """Every request of a sample (or of the warmup) failed: the server is not serving.

    Recoverable for the run like any :class:`ConfigFailure`: the config is
    recorded as unmeasured with the first error message.
    """


# --------------------------------------------------------------------------- SSE

#: The longest line an event stream may send: a real chunk is a few KB (a few MB with
#: log-probabilities); past this the request fails instead of taking the memory.
MAX_SSE_LINE = BenchmarkSpec().limits.stream_line_bytes


class SSELineTooLong(ValueError):
    """An event-stream line went past the decoder's ``max_line``."""


class SSEDecoder:
    """Incremental decoder of a ``text/event-stream`` body.

    Feed it bytes as they arrive; it returns the complete events as
    ``(event_type, data)`` pairs (``event_type`` is None unless an ``event:``
    field was sent; ``data`` joins multi-line data with ``\\n``). Handles lines
    split across reads, ``\\r\\n`` and ``\\r`` line ends, comments and keepalives
    (``: ping``), and a last event not followed by a blank line (:meth:`close`).
    """

    __slots__ = ("_parts", "_pending", "_data", "_event", "max_line")

    def __init__(self, max_line: int | None = None) -> None:
        self._parts: list[bytes] = []  # the unfinished line, as it arrived (joined once it ends)
        self._pending = 0
        self._data: list[bytes] = []
        self._event: bytes | None = None
        self.max_line = MAX_SSE_LINE if max_line is None else max_line

    @property
    def _buf(self) -> bytes:
        return b"".join(self._parts)

    def feed(self, chunk: bytes) -> list[tuple[str | None, bytes]]:
        held = self._parts and self._parts[-1].endswith(b"\r")
        if not held and b"\n" not in chunk and b"\r" not in chunk:
            # the line goes on: keep the piece, copy nothing (a long line costs its length, once)
            if chunk:
                self._parts.append(chunk)
                self._pending += len(chunk)
                self._check_line()
            return []
        buf = self._buf + chunk if self._parts else chunk
        held_cr = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # maybe the first half of "\r\n": wait for the next read
                buf, held_cr = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        rest = lines.pop() + held_cr
        self._parts = [rest] if rest else []
        self._pending = len(rest)
        self._check_line()
        out: list[tuple[str | None, bytes]] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append((self._event.decode() if self._event else None,
                                data[0] if len(data) == 1 else b"\n".join(data)))
                    data.clear()
                self._event = None
            elif line[0] == 58:  # ':' comment / keepalive
                continue
            else:
                name, sep, value = line.partition(b":")
                if sep and value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    self._event = value
                # id:, retry: and unknown fields carry nothing we measure
        return out

    def _check_line(self) -> None:
        if self._pending > self.max_line:
            size = self._pending
            self._parts, self._pending = [], 0
            raise SSELineTooLong(f"a line of the event stream went past {self.max_line:,} bytes "
                                 f"({size:,} without a line end); stopped reading")

    def close(self) -> list[tuple[str | None, bytes]]:
        """Flush at end of stream: a trailing line and an event without its blank line."""
        out = self.feed(b"\n") if self._buf.rstrip(b"\r") else []
        out += self.feed(b"\n") if self._data else []
        self._parts, self._pending = [], 0
        return out


# --------------------------------------------------------------------------- records

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
    retries: int = 0                # times it was sent again: the server said "try again" or never took it
    prompt_tokens: int | None = None  # the prompt's length as the server counted it (usage), where it said
    retry_reason: str | None = None  # the first such answer
    # of the prompt, the tokens the server took from its prefix cache and those it computed,
    # where it said (``Api.cached_tokens``, ``Api.evaluated_tokens``)
    cached_tokens: int | None = None
    evaluated_tokens: int | None = None

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


@dataclass(frozen=True)
class SampleDetail:
    """A sample's :class:`SampleOutcome` with the per-request records behind it."""

    result: SampleOutcome
    requests: tuple[RequestRecord, ...]

    @property
    def responses(self) -> list[dict[str, Any]]:
        """:meth:`RequestRecord.response_fields` of each successful request, in order."""
        return [r.response_fields() for r in self.requests if r.ok]

    @property
    def last_chunks(self) -> list[Mapping[str, Any]]:
        """The last JSON chunk of each successful request's stream (``{}`` where none), in
        the order of :attr:`responses`."""
        return [r.last_chunk or {} for r in self.requests if r.ok]


# --------------------------------------------------------------------------- prompts

_WORDS = (
    "the of and to in is was for on that with as by at from his her they this which "
    "be or had are not but were one all an their has been have there who more when "
    "will would can if no out so what up its about into than them only other new some "
    "time could these two may then first any like now my over such our man me even most "
    "made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make "
    "world still own see men work long get here between both life being under never day "
    "same another know while last might us great old year off come since against go "
    "came right used take three river city music garden window paper light water stone"
).split()


def synthetic_prompt(n_words: int, seed: int, index: int = 0) -> str:
    """About ``n_words`` common English words (roughly one token each), fixed by
    ``(seed, index)``: the body of request ``index``'s prompt (:func:`request_prompt`)."""
    rng = random.Random(f"{seed}:{index}")
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, n_words)))


#: The words of a prompt's tag (:func:`request_prompt`): 32 of the commonest English
#: words, each one token in the usual vocabularies (SentencePiece and byte-level BPE
#: alike, with a leading space or without), and each three letters, so that a
#: tokenizer that falls back on bytes counts every tag alike too; none starts with
#: "a", which a small vocabulary holding the article merges with the letters after it.
_TAG_WORDS = ("the big for end but not you far few can had her was one our out day get has him his how man new "
              "now old see two way who its let").split()
#: words in a tag at most: 32**6, about a billion tags
_TAG_MAX = 6


def _tag_length(words: int) -> int:
    """How many of a prompt's ``words`` are its tag: at most :data:`_TAG_MAX`, at most
    half the prompt; fixed by the prompt's length alone, so every prompt of a boot has it."""
    return min(_TAG_MAX, max(1, words // 2))


def request_prompt(bench: BenchmarkSpec, index: int, words: int | None = None, *, boot: int = 0,
                   sample: int = 1) -> str:
    """The prompt of request ``index`` of sample ``sample`` (0: the warm-up) of boot ``boot``,
    ``words`` words long (None: ``prompt_tokens`` words).

    Each prompt starts with a tag, a few words drawn from a hash of ``(seed, boot, sample,
    index)``, and goes on with request ``index``'s body (:func:`synthetic_prompt`) in an
    order drawn from the same hash. No two prompts of a config share a prefix beyond a
    chance word or two (1 in 32 share the first word), so no prefix cache (llama-server's
    prompt cache, SGLang's radix cache, vLLM's prefix caching) serves a later sample or
    boot, and a chunk cache (llama.cpp's ``--cache-reuse``) finds the body's chunks
    reordered. Request ``index``'s prompt has the same words in every sample and boot
    (the tag's aside, which are all three letters), so the same length in tokens
    wherever a tokenizer splits on spaces or counts bytes.

    With ``benchmark.prompt_reuse: true`` every sample and boot sends the same prompts
    (the tag and the body's order depend on ``index`` alone), so a prefix cache serves
    them: for measuring the cache itself.
    """
    n = max(1, words if words is not None else bench.prompt_tokens)
    k = _tag_length(n)
    key = f"{bench.seed}:reuse:{index}" if bench.prompt_reuse else f"{bench.seed}:{boot}:{sample}:{index}"
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    tag = []
    for _ in range(k):  # the hash's low bits first: the first word varies fastest
        h, digit = divmod(h, len(_TAG_WORDS))
        tag.append(_TAG_WORDS[digit])
    body = synthetic_prompt(n - k, bench.seed, index).split() if n > k else []
    if not bench.prompt_reuse:
        random.Random(key).shuffle(body)
    return " ".join(tag + body)


# --------------------------------------------------------------------------- requests

def resolve_model(base_url: str, client: httpx.Client | None = None, timeout_s: float = 30.0) -> str:
    """The first model id listed by ``GET /v1/models``."""
    own = client is None
    http = client or httpx.Client(trust_env=False)
    url = base_url.rstrip("/") + "/v1/models"
    try:
        r = http.get(url, timeout=timeout_s)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise SampleFailed(f"could not read the model name from {url}: {e!r}. Set benchmark.model "
                           "in the hypotheses file to skip this lookup.") from e
    finally:
        if own:
            http.close()


def _request(bench: BenchmarkSpec, base_url: str, model: str | None, index: int,
             words: int | None = None, boot: int = 0, sample: int = 1) -> tuple[str, dict]:
    """The URL and body of request ``index`` of a sample, in ``bench.api``'s form (``apis``);
    its prompt (:func:`request_prompt`) ``words`` long (:class:`PromptSize`; None:
    ``prompt_tokens`` words)."""
    api = get_api(bench.api)
    prompt = request_prompt(bench, index, words, boot=boot, sample=sample)
    body = api.payload(prompt=prompt, max_tokens=bench.output_tokens,
                       temperature=bench.temperature, ignore_eos=bench.ignore_eos, model=model, seed=bench.seed)
    return base_url.rstrip("/") + api.path, body


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
                 "last")

    def __init__(self, api: Api, most: int | None = None) -> None:
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

    def handle(self, event: str | None, data: bytes, now: float) -> None:
        if data[:6] == b"[DONE]":
            self.done = True
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

    def output(self, now: float, k: int | None) -> None:
        """A chunk carried output: ``k`` tokens (None: not known from this chunk)."""
        self.times.append(now)
        self.ks.append(k)

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


#: Transport errors before any response: the request was not taken and may be sent again.
_NOT_TAKEN = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError)

#: Times a request that the server answered with "try again" (``Api.retryable``: 429,
#: 503, llama.cpp's "slot unavailable") or that was never taken (a connection closed
#: before any answer) is sent again within its sample, after a short pause; every retry
#: is counted in the request's record and the boot's provenance.
MAX_RETRIES = 3


def _run_request(http: httpx.Client, url: str, payload: dict, api: Api, timeout_s: float, most: int,
                 sample_t0: float, max_line: int = MAX_SSE_LINE) -> RequestRecord:
    retries, why = 0, None
    while True:
        rec, again = _send(http, url, payload, api, timeout_s, most, sample_t0, max_line)
        if again is None or retries >= MAX_RETRIES:
            return dataclasses.replace(rec, retries=retries, retry_reason=why) if retries else rec
        retries += 1
        why = why or again
        time.sleep(min(0.05 * 2 ** retries, 1.0))


def _send(http: httpx.Client, url: str, payload: dict, api: Api, timeout_s: float, most: int,
          sample_t0: float, max_line: int = MAX_SSE_LINE) -> tuple[RequestRecord, str | None]:
    """One try of a request: its record, and why to send it again (None: do not)."""
    st = _Stream(api, most)  # ``most``: the request's max tokens (``benchmark.output_tokens``)
    dec = SSEDecoder(max_line)  # ``limits.stream_line_bytes``
    t0 = time.perf_counter()
    start = t0 - sample_t0
    head = b""  # the body's first bytes: what a server that streamed nothing said instead
    answered = False
    try:
        with http.stream("POST", url, json=payload, timeout=timeout_s) as r:
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
        # connection, like urllib3 and browsers do, and counted as a retry.
        again = (f"{type(e).__name__} before any response: {e}"
                 if not answered and isinstance(e, _NOT_TAKEN) else None)
        return _failed(start, f"{type(e).__name__} on {url}: {e}"), again
    except (StreamError, SSELineTooLong, UnreadableBody) as e:
        return _failed(start, str(e)), None
    t_end = time.perf_counter()
    if not st.times:
        said = head.decode("utf-8", "replace")
        again = f"HTTP 200 without output: {said[:120]}" if api.retryable(200, said) else None
        return _failed(start, f"stream from {url} ended without any output" + (f": {said[:200]}" if said else "")), again

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
        usage_mismatch=mismatch, **_prompt_counts(api, st)), None


def _prompt_counts(api: Api, st: "_Stream") -> dict[str, int | None]:
    """The prompt's tokens as the server counted them: all, from its cache, computed. A
    cached or computed count above the whole prompt's cannot be true: not believed."""
    total, cached, computed = api.prompt_tokens(st), api.cached_tokens(st), api.evaluated_tokens(st)
    if total is not None:
        cached = cached if cached is None or cached <= total else None
        computed = computed if computed is None or computed <= total else None
    return {"prompt_tokens": total, "cached_tokens": cached, "evaluated_tokens": computed}


def _token_gaps(times: list[float], ks: list[int | None], after_first: int) -> tuple[float, ...]:
    """One ITL value per output token after the first (see the module docstring)."""
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


def percentile_metrics(ok: list[RequestRecord]) -> dict[str, float]:
    """p50/p90/p99 of TTFT, ITL and TPOT over a sample's successful requests, in ms
    (``model.PERCENTILES``; NaN where no request has the value)."""
    import numpy as np

    from bisect_harness.model import PERCENTILES

    pools = {"ttft": [r.ttft_s for r in ok if r.ttft_s is not None],
             "itl": [g for r in ok for g in r.token_gaps_s],
             "tpot": [r.tpot_s for r in ok if r.tpot_s is not None]}
    out = {}
    for what, values in pools.items():
        qs = np.percentile(values, PERCENTILES) if values else [math.nan] * len(PERCENTILES)
        for q, v in zip(PERCENTILES, qs):
            out[f"{what}_p{q}_ms"] = 1e3 * float(v)
    return out


def _run_batch(http: httpx.Client, base_url: str, bench: BenchmarkSpec, model: str | None,
               n: int, words: int | None = None, boot: int = 0, sample: int = 1) -> tuple[list[RequestRecord], float]:
    api = get_api(bench.api)
    reqs = [_request(bench, base_url, model, i, words, boot, sample) for i in range(n)]
    results: list[RequestRecord | None] = [None] * n
    indices: Iterator[int] = iter(range(n))
    lock = threading.Lock()
    sample_t0 = time.perf_counter()

    def worker() -> None:
        while True:
            with lock:
                i = next(indices, None)
            if i is None:
                return
            url, payload = reqs[i]
            results[i] = _run_request(http, url, payload, api, bench.request_timeout_s, bench.output_tokens,
                                      sample_t0, bench.limits.stream_line_bytes)

    workers = max(1, min(bench.concurrency, n))
    if workers == 1:
        worker()
    else:
        threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{k}") for k in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - sample_t0
    return [r for r in results if r is not None], wall


def _client(bench: BenchmarkSpec, headers: Mapping[str, str] | None = None) -> httpx.Client:
    conns = max(1, bench.concurrency)
    return httpx.Client(
        # identity: a compressed stream is held back by the server's compressor (and a bomb
        # would be decoded in memory); the measured bytes are the server's own
        trust_env=False, headers={"Accept-Encoding": "identity", **dict(headers or {})},
        timeout=httpx.Timeout(bench.request_timeout_s, connect=30.0),
        limits=httpx.Limits(max_connections=conns, max_keepalive_connections=conns))


def _model_for(base_url: str, bench: BenchmarkSpec, http: httpx.Client) -> str | None:
    if not get_api(bench.api).needs_model:
        return bench.model
    return bench.model if bench.model is not None else resolve_model(base_url, http)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _all_failed(what: str, base_url: str, records: list[RequestRecord]) -> SampleFailed:
    first = records[0].error if records else "no request was sent"
    return SampleFailed(f"all {len(records)} {what} requests to {base_url} failed; first error: {first}. "
                        "Check that the server is up and that benchmark.api matches it.")


def measure_sample_detail(base_url: str, bench: BenchmarkSpec, *,
                          client: httpx.Client | None = None,
                          headers: Mapping[str, str] | None = None,
                          prompt: "PromptSize | None" = None, boot: int = 0, sample: int = 1) -> SampleDetail:
    """Send ``bench.requests_per_sample`` streamed requests, ``bench.concurrency`` in
    flight, and measure them. See the module docstring for what is measured. Their
    prompts are sample ``sample``'s of boot ``boot`` (:func:`request_prompt`): a boot
    numbers its samples so that no prefix cache serves one from another.

    ``result.metrics`` has the keys of ``model.CLIENT_METRICS`` (those of the prompt,
    ``prompt_tokens``, ``cached_prompt_tokens`` and ``prompt_tokens_evaluated``, where the
    server reports them, means over the requests that did): ``tok_s`` (output
    tokens of the successful requests / the sample's wall time), ``decode_tok_s``
    (their tokens after the first chunk / their first-to-last-chunk times), and the means of
    ``ttft_ms``, ``itl_ms`` (weighted per token), ``tpot_ms`` and ``e2e_ms`` (NaN
    where no request had two tokens). ``result.requests`` counts the successful
    requests, ``result.errors`` the failed ones (HTTP error, disconnect, an error
    object in the stream, no output). Raises :class:`SampleFailed` when all fail.
    """
    records, wall = _batch(base_url, bench, bench.requests_per_sample, client, headers,
                           prompt.words if prompt is not None else None, boot, sample)
    ok = [r for r in records if r.ok]
    if not ok:
        raise _all_failed("benchmark", base_url, records)
    tokens = sum(r.output_tokens for r in ok)
    decode_tokens = sum(r.decode_tokens for r in ok)
    decode_s = math.fsum(r.decode_s for r in ok)
    metrics = {
        "tok_s": tokens / wall,
        "decode_tok_s": decode_tokens / decode_s if decode_tokens and decode_s > 0 else math.nan,
        "ttft_ms": 1e3 * _mean([r.ttft_s for r in ok]),
        "itl_ms": 1e3 * sum(r.decode_s for r in ok) / decode_tokens if decode_tokens else math.nan,
        "tpot_ms": 1e3 * _mean([r.tpot_s for r in ok if r.tpot_s is not None]),
        "e2e_ms": 1e3 * _mean([r.e2e_s for r in ok]),
    }
    metrics.update(percentile_metrics(ok))
    for name, field in (("prompt_tokens", "prompt_tokens"), ("cached_prompt_tokens", "cached_tokens"),
                        ("prompt_tokens_evaluated", "evaluated_tokens")):
        # the prompts' real length, the share a prefix cache served and the rest, as the server counted
        counted = [getattr(r, field) for r in ok if getattr(r, field) is not None]
        if counted:
            metrics[name] = _mean(counted)
    result = SampleOutcome(metrics=metrics, requests=len(ok), output_tokens=tokens, duration_s=wall,
                          errors=len(records) - len(ok))
    return SampleDetail(result=result, requests=tuple(records))


def _batch(base_url: str, bench: BenchmarkSpec, n: int, client: httpx.Client | None,
           headers: Mapping[str, str] | None = None, words: int | None = None, boot: int = 0, sample: int = 1):
    """``n`` requests as a sample sends them, on ``client`` or a client of our own
    (sending ``headers``, e.g. an attached server's ``Authorization``, with each request)."""
    own = client is None
    http = client or _client(bench, headers)
    try:
        model = _model_for(base_url, bench, http)
        return _run_batch(http, base_url, bench, model, n, words, boot, sample)
    finally:
        if own:
            http.close()


def measure_sample(base_url: str, bench: BenchmarkSpec, *,
                   client: httpx.Client | None = None, headers: Mapping[str, str] | None = None) -> SampleOutcome:
    """:func:`measure_sample_detail` without the per-request records."""
    return measure_sample_detail(base_url, bench, client=client, headers=headers).result


# --------------------------------------------------------------------------- prompt length


@dataclass(frozen=True)
class PromptSize:
    """How long a boot's prompts are. ``benchmark.prompt_tokens`` asks for tokens; the
    prompts are words, so where the server can count tokens (its ``/tokenize``) the word
    count is fitted to the asked tokens (``unit: tokens``); where it cannot, the prompt
    has ``prompt_tokens`` *words* and says so (``unit: words``). Each request's real
    count, where the server reports it, is the sample's ``prompt_tokens`` metric.
    ``unique``: each sample's prompts are its own (:func:`request_prompt`); ``spread``:
    how far the server's counts of the first request's prompt in other samples and
    boots were from ``tokens`` (0: alike; None: not counted)."""

    asked: int
    words: int
    unit: str                 # "tokens" | "words"
    tokens: int | None = None  # the server's count of the first prompt at ``words``
    via: str | None = None     # the endpoint that counted
    unique: bool = True
    spread: int | None = None

    def to_dict(self) -> dict:
        return {"asked": self.asked, "words": self.words, "unit": self.unit, "tokens": self.tokens, "via": self.via,
                "unique": self.unique, "spread": self.spread}

    def describe(self) -> str:
        if self.unit == "tokens":
            text = (f"prompts of {self.tokens} tokens ({self.words} words), {self.asked} asked, counted by the "
                    f"server's {self.via}")
        else:
            text = (f"prompts of {self.words} words ({self.asked} prompt_tokens asked): the server has no tokenizer "
                    f"endpoint, so the count is in words (about one token each in English)")
        return text + "; " + reuse_text(self.unique, self.spread)


def reuse_text(unique: bool, spread: int | None) -> str:
    """How a boot's prompts differ between samples, in words (the journal says it too)."""
    if not unique:
        return "the same prompts every sample and boot (benchmark.prompt_reuse: a prefix cache serves them)"
    alike = ("" if spread is None else ", as long in tokens in every sample" if spread == 0
             else f", their lengths in tokens up to {spread} apart between samples")
    return f"each request's prompt its own in every sample and boot (a seeded tag first){alike}"


#: Tokenizer endpoints tried, in order: (path, body builder, count reader). vLLM and
#: SGLang answer ``{"count": n, "tokens": [...]}`` to ``prompt``, llama.cpp
#: ``{"tokens": [...]}`` to ``content``, TGI a list of tokens to ``inputs``.
_TOKENIZERS = (
    ("/tokenize", lambda text, model: {"model": model, "prompt": text},
     lambda r: r.get("count", len(r.get("tokens") or [])) if isinstance(r, dict) and ("count" in r or "tokens" in r)
     else None),
    ("/tokenize", lambda text, model: {"content": text},
     lambda r: len(r["tokens"]) if isinstance(r, dict) and isinstance(r.get("tokens"), list) else None),
    ("/tokenize", lambda text, model: {"inputs": text}, lambda r: len(r) if isinstance(r, list) else None),
)


def _token_counter(http: httpx.Client, base_url: str, model: str | None, probe: str):
    """A function text -> the server's token count, and its name; (None, None) where
    no tokenizer endpoint answers."""
    for path, body, read in _TOKENIZERS:
        def count(text: str, path=path, body=body, read=read) -> int | None:
            try:
                # Connection: close: a server that answers an unknown route without
                # reading the body (as Python's http.server handlers often do) would leave
                # that body in a kept-alive connection, to be read as the start of the
                # next request -- the boot's first benchmark request
                r = http.post(base_url.rstrip("/") + path, json=body(text, model), timeout=10.0,
                              headers={"Connection": "close"})
                if r.status_code != 200:
                    return None
                n = read(r.json())
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                return None
            return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

        if count(probe) is not None:
            return count, f"POST {path} ({', '.join(body('', model))})"
    return None, None


def size_prompts(http: httpx.Client, base_url: str, bench: BenchmarkSpec, *, boot: int = 0) -> PromptSize:
    """Fit the prompts' word count to ``bench.prompt_tokens`` tokens with the server's
    tokenizer (a few counts of the first prompt), or keep words where it has none; then
    count the first request's prompt as the warm-up, another sample and another boot
    send it, to say whether they are as long (``PromptSize.spread``)."""
    asked = bench.prompt_tokens
    unique = not bench.prompt_reuse

    def first(words: int, b: int = boot, sample: int = 1) -> str:
        return request_prompt(bench, 0, words, boot=b, sample=sample)

    count, via = _token_counter(http, base_url, bench.model, first(asked))
    if count is None:
        return PromptSize(asked, asked, "words", unique=unique)
    best: tuple[int, int, int] | None = None  # (distance, words, tokens)
    words = asked
    for _ in range(5):
        n = count(first(words))
        if n is None:
            break
        if best is None or abs(n - asked) < best[0]:
            best = (abs(n - asked), words, n)
        if n == asked:
            break
        nxt = max(1, round(words * asked / n))
        if nxt == words:
            nxt = words + (1 if n < asked else -1)
        if nxt < 1:
            break
        words = nxt
    if best is None:
        return PromptSize(asked, asked, "words", unique=unique)
    spread = None
    if unique:
        others = [count(first(best[1], b, sample)) for b, sample in ((boot, 0), (boot, 2), (boot + 1, 1))]
        if all(n is not None for n in others):
            spread = max(abs(n - best[2]) for n in others)
    return PromptSize(asked, best[1], "tokens", best[2], via, unique, spread if unique else 0)


@contextlib.contextmanager
def boot_session(base_url: str, bench: BenchmarkSpec, *, headers: Mapping[str, str] | None = None
                 ) -> Iterator[tuple[httpx.Client, BenchmarkSpec]]:
    """One HTTP client and the resolved model name for every sample of a boot.

    Made once, before the first sample window opens, so no window holds the
    client's setup or a ``GET /v1/models``: a counter scraped around the window
    (``from: prometheus``, ``kind: rate``) then spans the same requests as
    ``tok_s``, not those plus the setup::

        with boot_session(base_url, bench) as (http, bench):
            measure_sample_detail(base_url, bench, client=http)
    """
    http = _client(bench, headers)
    try:
        yield http, dataclasses.replace(bench, model=_model_for(base_url, bench, http))
    finally:
        http.close()


def warmup(base_url: str, bench: BenchmarkSpec, *, client: httpx.Client | None = None,
           headers: Mapping[str, str] | None = None, prompt: "PromptSize | None" = None, boot: int = 0) -> int:
    """Send ``bench.warmup_requests`` requests like a sample's and discard them. Their
    prompts are sample 0's of ``boot``: as long as a sample's, shared with none (with
    ``benchmark.prompt_reuse``, the samples' own first prompts).

    Returns how many failed; raises :class:`SampleFailed` when all of them did.
    """
    if bench.warmup_requests <= 0:
        return 0
    records, _ = _batch(base_url, bench, bench.warmup_requests, client, headers,
                        prompt.words if prompt is not None else None, boot, 0)
    failed = sum(1 for r in records if not r.ok)
    if failed == len(records):
        raise _all_failed("warmup", base_url, records)
    return failed
