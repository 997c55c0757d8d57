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

Percentiles (``ttft_p50_ms`` ... ``tpot_p99_ms``) per sample: ``measure.percentiles``.

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
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import httpx

from bisect_harness.errors import ConfigFailure, ServerReplyError
from bisect_harness.model import BenchmarkSpec
from bisect_harness.measure.apis import APIS as _APIS, get_api
from bisect_harness.measure.bodies import bounded_get
from bisect_harness.measure.deadline import deadline_client, require_deadline_client
from bisect_harness.measure.percentiles import percentile_metrics
from bisect_harness.measure.prompt_size import PromptSize
from bisect_harness.measure.prompts import request_prompt
from bisect_harness.measure.jobs import Job, RequestJob
from bisect_harness.measure.workloads import workload_jobs
from bisect_harness.measure.request import MAX_RETRIES, RequestRecord
from bisect_harness.boot import SampleOutcome

__all__ = [
    "SampleDetail", "SampleFailed", "boot_session", "measure_sample", "measure_sample_detail", "resolve_model",
    "warmup",
]

APIS = tuple(_APIS)  # benchmark.api: the names of ``apis.APIS``


class SampleFailed(ConfigFailure):
    """Every request of a sample (or of the warmup) failed: the server is not serving.

    Recoverable for the run like any :class:`ConfigFailure`: the config is
    recorded as unmeasured with the first error message.
    """


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


# --------------------------------------------------------------------------- requests

def resolve_model(base_url: str, client: httpx.Client | None = None, timeout_s: float = 30.0) -> str:
    """The first model id listed by ``GET /v1/models``."""
    own = client is None
    http = client or deadline_client()
    url = base_url.rstrip("/") + "/v1/models"
    try:
        r = bounded_get(http, url, timeout_s)  # timeout_s in all, however slowly it comes
        if r.status_code != 200:
            raise ValueError(f"HTTP {r.status_code}: {r.text[:200]}")
        return r.json()["data"][0]["id"]
    except (httpx.HTTPError, ServerReplyError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as e:
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


def _jobs(bench: BenchmarkSpec, base_url: str, model: str | None, n: int, words: int | None = None,
          boot: int = 0, sample: int = 1) -> list[Job]:
    """The ``n`` jobs of a sample (``jobs``): one request each, request ``i``'s prompt its own;
    for a ``benchmark.workload``, its jobs (``workloads``: a dataset's conversations, shared
    prefixes, multi-turn sessions, each session one job of several requests)."""
    if bench.workload is not None:
        return workload_jobs(bench, base_url, model, n, words, boot=boot, sample=sample)
    api = get_api(bench.api)
    out: list[Job] = []
    for i in range(n):
        url, payload = _request(bench, base_url, model, i, words, boot, sample)
        out.append(RequestJob(url, payload, api, bench.request_timeout_s, bench.output_tokens,
                              bench.limits.stream_line_bytes))
    return out


def _run_batch(http: httpx.Client, base_url: str, bench: BenchmarkSpec, model: str | None,
               n: int, words: int | None = None, boot: int = 0, sample: int = 1) -> tuple[list[RequestRecord], float]:
    jobs = _jobs(bench, base_url, model, n, words, boot, sample)
    # a job per request, or a session of several: as many jobs as there are
    results: list[list[RequestRecord] | None] = [None] * len(jobs)
    indices: Iterator[int] = iter(range(len(jobs)))
    lock = threading.Lock()
    sample_t0 = time.perf_counter()

    def worker() -> None:
        while True:
            with lock:
                i = next(indices, None)
            if i is None:
                return
            results[i] = jobs[i].run(http, sample_t0)

    workers = max(1, min(bench.concurrency, len(jobs)))
    if workers == 1:
        worker()
    else:
        threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{k}") for k in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    wall = time.perf_counter() - sample_t0
    return [r for rs in results if rs is not None for r in rs], wall


def _client(bench: BenchmarkSpec, headers: Mapping[str, str] | None = None) -> httpx.Client:
    conns = max(1, bench.concurrency)
    return deadline_client(
        # identity: a compressed stream is held back by the server's compressor (and a bomb
        # would be decoded in memory); the measured bytes are the server's own
        headers={"Accept-Encoding": "identity", **dict(headers or {})},
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


#: The most of a sample's requests that may fail (after their retries) for its figures to
#: stand: past it the sample, and so its boot, fails.
MAX_FAILED_SHARE = 0.5


def _keeps_failing(base_url: str, records: list[RequestRecord]) -> SampleFailed | None:
    """A sample whose requests keep failing (one failed every try, or more than
    :data:`MAX_FAILED_SHARE` of them failed) is a failure of its boot, not a quieter number."""
    failed = [r for r in records if not r.ok]
    spent = [r for r in failed if r.retries >= MAX_RETRIES]
    if spent:
        r = spent[0]
        return SampleFailed(f"a request to {base_url} failed all {r.retries + 1} tries (first: {r.retry_reason}; "
                            f"last: {r.error}); {len(failed)} of the sample's {len(records)} requests failed. "
                            "The server does not answer requests as asked: see its log.")
    if failed and len(failed) > MAX_FAILED_SHARE * len(records):
        return SampleFailed(f"{len(failed)} of the sample's {len(records)} requests to {base_url} failed "
                            f"(more than {MAX_FAILED_SHARE:.0%}); first error: {failed[0].error}. A sample's "
                            "figures do not stand on the few that passed.")
    return None


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
    server reports them, means over the requests that did, and ``prefix_cache_hit_share``,
    the cached tokens over the prompt tokens of the requests whose server said both): ``tok_s`` (output
    tokens of the successful requests / the sample's wall time), ``decode_tok_s``
    (their tokens after the first chunk / their first-to-last-chunk times), and the means of
    ``ttft_ms``, ``itl_ms`` (weighted per token), ``tpot_ms`` and ``e2e_ms`` (NaN
    where no request had two tokens). ``result.requests`` counts the successful
    requests, ``result.errors`` the failed ones (HTTP error, disconnect, an error
    object in the stream, no output, a stream cut before its end; each after its
    retries, ``request.MAX_RETRIES``, counted in its record). Raises :class:`SampleFailed`
    when all fail, when one failed every try, or when more than
    :data:`MAX_FAILED_SHARE` of them failed.
    """
    records, wall = _batch(base_url, bench, bench.requests_per_sample, client, headers,
                           prompt.words if prompt is not None else None, boot, sample)
    ok = [r for r in records if r.ok]
    if not ok:
        raise _all_failed("benchmark", base_url, records)
    failing = _keeps_failing(base_url, records)
    if failing is not None:
        raise failing
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
    both = [(r.cached_tokens, r.prompt_tokens) for r in ok if r.cached_tokens is not None and r.prompt_tokens]
    if both:  # of the prompt tokens, the share the server's prefix cache served (where it said both)
        metrics["prefix_cache_hit_share"] = sum(c for c, _ in both) / sum(p for _, p in both)
    result = SampleOutcome(metrics=metrics, requests=len(ok), output_tokens=tokens, duration_s=wall,
                          errors=len(records) - len(ok))
    return SampleDetail(result=result, requests=tuple(records))


def _batch(base_url: str, bench: BenchmarkSpec, n: int, client: httpx.Client | None,
           headers: Mapping[str, str] | None = None, words: int | None = None, boot: int = 0, sample: int = 1):
    """``n`` requests as a sample sends them, on ``client`` or a client of our own
    (sending ``headers``, e.g. an attached server's ``Authorization``, with each request)."""
    own = client is None
    if not own:
        require_deadline_client(client)
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
           headers: Mapping[str, str] | None = None, prompt: "PromptSize | None" = None, boot: int = 0,
           sample: int = 0) -> int:
    """Send ``bench.warmup_requests`` requests like a sample's and discard them. Their
    prompts are sample ``sample``'s of ``boot`` (0, or below 0 for the warm-ups of a
    sweep's later points): as long as a sample's, shared with none (with
    ``benchmark.prompt_reuse``, the samples' own first prompts).

    Returns how many failed; raises :class:`SampleFailed` when all of them did.
    """
    if bench.warmup_requests <= 0:
        return 0
    records, _ = _batch(base_url, bench, bench.warmup_requests, client, headers,
                        prompt.words if prompt is not None else None, boot, sample)
    failed = sum(1 for r in records if not r.ok)
    if failed == len(records):
        raise _all_failed("warmup", base_url, records)
    return failed
