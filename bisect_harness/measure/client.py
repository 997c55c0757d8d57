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

Percentiles (``ttft_p50_ms`` ... ``e2e_p99_ms``) per sample, each with its
order-statistic interval (``ttft_p99_ms_lo`` / ``_hi``): ``measure.percentiles``.

How a sample's requests are sent (``measure.dispatch``): closed loop, ``concurrency``
workers each sending its next request as its last ends; or open loop
(``benchmark.request_rate``), each request at its seeded arrival time
(``measure.arrivals``), late or not, with its send lag recorded: ``achieved_rps``
(the rate the sends kept), ``send_lag_p99_ms``, and ``client_behind`` (1.0 where the
p99 lag was over ``benchmark.max_lag_ms``; the sample's :attr:`SampleDetail.behind`
says so to the boot, which is marked). A sample lasts ``requests_per_sample``
requests, or ``sample_seconds`` (open loop: the arrivals inside the window; closed
loop: no request is started after it). Under ``benchmark.slo`` a sample carries
``goodput_rps`` and ``slo_met`` (``measure.slo``); with ``benchmark.capacity`` a
sample is a capacity search (:func:`measure_capacity`, ``measure.capacity``).

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
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import httpx

from bisect_harness.errors import ConfigFailure, ServerReplyError
from bisect_harness.model import BenchmarkSpec
from bisect_harness.measure.apis import APIS as _APIS, get_api
from bisect_harness.measure.bodies import bounded_get
from bisect_harness.measure.deadline import deadline_client, require_deadline_client
from bisect_harness.measure import capacity as capacity_search
from bisect_harness.measure.arrivals import arrival_times, request_lengths
from bisect_harness.measure.dispatch import Dispatched, closed_loop, open_loop
from bisect_harness.measure.percentiles import percentile_metrics
from bisect_harness.measure.slo import check_slo, slo_metrics
from bisect_harness.measure.prompt_size import PromptSize
from bisect_harness.measure.prompts import request_prompt
from bisect_harness.measure.jobs import Draw, Job, RequestJob
from bisect_harness.measure.workloads import workload_jobs
from bisect_harness.measure.request import MAX_RETRIES, RequestRecord
from bisect_harness.boot import SampleOutcome

__all__ = [
    "ClientBehind", "SampleDetail", "SampleFailed", "boot_session", "measure_capacity", "measure_sample",
    "measure_sample_detail", "resolve_model", "warmup",
]

APIS = tuple(_APIS)  # benchmark.api: the names of ``apis.APIS``


class SampleFailed(ConfigFailure):
    """Every request of a sample (or of the warmup) failed: the server is not serving.

    Recoverable for the run like any :class:`ConfigFailure`: the config is
    recorded as unmeasured with the first error message.
    """


@dataclass(frozen=True)
class ClientBehind:
    """An open-loop sample whose client fell behind its schedule: the p99 of its sends'
    lags (ms) was over ``benchmark.max_lag_ms``, so the rate it was asked for is not the
    rate it sent. The boot is marked ``client_behind`` (``backends.checks``)."""

    lag_p99_ms: float
    max_lag_ms: float
    sends: int
    asked_rps: float
    achieved_rps: float

    def to_json(self) -> dict[str, float]:
        return {"lag_p99_ms": self.lag_p99_ms, "max_lag_ms": self.max_lag_ms, "sends": self.sends,
                "asked_rps": self.asked_rps, "achieved_rps": self.achieved_rps}


@dataclass(frozen=True)
class SampleDetail:
    """A sample's :class:`SampleOutcome` with the per-request records behind it; open
    loop, each job's send lag (seconds, in job order) and, where the client fell behind,
    :class:`ClientBehind`; for a capacity search, the search and its trials."""

    result: SampleOutcome
    requests: tuple[RequestRecord, ...]
    lags_s: tuple[float, ...] = ()
    behind: ClientBehind | None = None
    capacity: capacity_search.CapacitySearch | None = None

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


def _round(boot: int, boot_seq: int | None) -> int:
    """What seeds a sample's traffic (``arrivals``): the boot's number in its config, or
    where none is given its id."""
    return boot if boot_seq is None else boot_seq


def _request(bench: BenchmarkSpec, base_url: str, model: str | None, index: int,
             words: int | None = None, boot: int = 0, sample: int = 1,
             boot_seq: int | None = None) -> tuple[str, dict, int]:
    """The URL and body of request ``index`` of a sample, in ``bench.api``'s form (``apis``),
    and its most output tokens. Its prompt (:func:`request_prompt`) is ``words`` long
    (:class:`PromptSize`; None: ``prompt_tokens`` words), scaled to the request's own
    length where ``prompt_tokens_max`` draws one (``arrivals.request_lengths``, as its
    output length where ``output_tokens_max`` does)."""
    api = get_api(bench.api)
    prompt_tokens, output_tokens = request_lengths(bench, index, boot_seq=_round(boot, boot_seq), sample=sample)
    if prompt_tokens != bench.prompt_tokens:  # the words fitted to prompt_tokens, scaled to this one
        words = max(1, round((words if words is not None else bench.prompt_tokens) * prompt_tokens
                             / max(1, bench.prompt_tokens)))
    prompt = request_prompt(bench, index, words, boot=boot, sample=sample)
    body = api.payload(prompt=prompt, max_tokens=output_tokens,
                       temperature=bench.temperature, ignore_eos=bench.ignore_eos, model=model, seed=bench.seed)
    return base_url.rstrip("/") + api.path, body, output_tokens


def _jobs(bench: BenchmarkSpec, base_url: str, model: str | None, n: int, draw: Draw = Draw(), *,
          first: int = 0) -> list[Job]:
    """The ``n`` jobs of a sample (``jobs``) from request ``first`` on: one request each,
    request ``i``'s prompt its own; for a ``benchmark.workload``, its jobs (``workloads``: a
    dataset's conversations, shared prefixes, multi-turn sessions, each session one job of
    several requests). Job ``i`` is the same whatever ``n`` and ``first`` (a sample with a
    window takes them in blocks; a capacity search's trials take their own indices).
    ``draw`` says whose requests they are (``jobs.Draw``)."""
    words, boot, sample, boot_seq = draw.words, draw.boot, draw.sample, draw.boot_seq
    if bench.workload is not None:  # the workload's first + n jobs, from job ``first`` on
        return workload_jobs(bench, base_url, model, first + n, words, boot=boot, sample=sample,
                             boot_seq=boot_seq)[first:]
    api = get_api(bench.api)
    out: list[Job] = []
    for i in range(first, first + n):
        url, payload, most = _request(bench, base_url, model, i, words, boot, sample, boot_seq)
        out.append(RequestJob(url, payload, api, bench.request_timeout_s, most, bench.limits.stream_line_bytes))
    return out


#: Jobs built at a time for a closed-loop sample that lasts ``sample_seconds``.
_BLOCK = 64


def _run_batch(http: httpx.Client, base_url: str, bench: BenchmarkSpec, model: str | None,
               n: int | None, draw: Draw = Draw(), *, trial: int = 0) -> Dispatched:
    """Send a sample's jobs, open loop where ``bench.request_rate`` is set (at the times of
    ``arrivals.arrival_times``) and closed loop otherwise: ``n`` of them, or where ``n`` is
    None for ``bench.sample_seconds``. ``trial`` numbers a capacity search's trials, each
    with its own requests (from ``trial * n``) and arrival times."""
    first = trial * (n or 0)
    if bench.open_loop:
        times = arrival_times(bench, boot_seq=_round(draw.boot, draw.boot_seq), sample=draw.sample, trial=trial,
                              count=n, within_s=bench.sample_seconds if n is None else None)
        jobs = _jobs(bench, base_url, model, len(times), draw, first=first)
        return open_loop(http, jobs, times)
    if n is None:
        def stream():
            start = 0
            while True:
                yield from _jobs(bench, base_url, model, _BLOCK, draw, first=start)
                start += _BLOCK

        return closed_loop(http, stream(), max(1, bench.concurrency), until_s=bench.sample_seconds)
    jobs = _jobs(bench, base_url, model, n, draw, first=first)
    return closed_loop(http, jobs, max(1, min(bench.concurrency, n)))


def _connections(bench: BenchmarkSpec) -> int | None:
    """The connections a boot's client may hold: closed loop, as many as the most
    workers any of its points runs; open loop (at any point, or a capacity search), no
    cap, since a capped pool would hold a request back until another ended, a lag that
    the send times would not show."""
    benches = [bench, *(p.apply(bench) for p in bench.points)]
    if bench.capacity is not None or any(b.open_loop for b in benches):
        return None
    return max(1, *(b.concurrency for b in benches))


def _client(bench: BenchmarkSpec, headers: Mapping[str, str] | None = None) -> httpx.Client:
    conns = _connections(bench)
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
                          prompt: "PromptSize | None" = None, boot: int = 0, sample: int = 1,
                          boot_seq: int | None = None) -> SampleDetail:
    """Send a sample's streamed requests and measure them: ``bench.requests_per_sample``
    of them (or those of ``bench.sample_seconds``), ``bench.concurrency`` in flight, or
    open loop at ``bench.request_rate`` (module docstring). Their prompts are sample
    ``sample``'s of boot ``boot`` (:func:`request_prompt`): a boot numbers its samples
    so that no prefix cache serves one from another; their arrival times and lengths
    are those of sample ``sample`` of the config's ``boot_seq``-th boot (``arrivals``; None:
    of boot ``boot``), the same in both arms of a round. With ``bench.capacity`` the sample is a capacity
    search (:func:`measure_capacity`).

    ``result.metrics`` has the keys of ``model.CLIENT_METRICS`` that apply (those of the
    prompt, ``prompt_tokens``, ``cached_prompt_tokens`` and ``prompt_tokens_evaluated``,
    where the server reports them, means over the requests that did, and
    ``prefix_cache_hit_share``, the cached tokens over the prompt tokens of the requests
    whose server said both; those of open loop and of the SLO where the benchmark asks
    them): ``tok_s`` (output
    tokens of the successful requests / the sample's wall time), ``decode_tok_s``
    (their tokens after the first chunk / their first-to-last-chunk times), the means of
    ``ttft_ms``, ``itl_ms`` (weighted per token), ``tpot_ms`` and ``e2e_ms`` (NaN
    where no request had two tokens), their percentiles with their intervals, and
    ``achieved_rps``. ``result.requests`` counts the successful
    requests, ``result.errors`` the failed ones (HTTP error, disconnect, an error
    object in the stream, no output, a stream cut before its end; each after its
    retries, ``request.MAX_RETRIES``, counted in its record). Raises :class:`SampleFailed`
    when all fail, when one failed every try, or when more than
    :data:`MAX_FAILED_SHARE` of them failed.
    """
    if bench.capacity is not None:
        return measure_capacity(base_url, bench, client=client, headers=headers, prompt=prompt, boot=boot,
                                sample=sample, boot_seq=boot_seq)
    n = None if bench.sample_seconds is not None else bench.requests_per_sample
    sent = _batch(base_url, bench, n, client, headers,
                  Draw(boot, sample, boot_seq, prompt.words if prompt is not None else None))
    return _measured(base_url, bench, sent)


def _measured(base_url: str, bench: BenchmarkSpec, sent: Dispatched) -> SampleDetail:
    """A sample's figures from what its jobs gave (:func:`measure_sample_detail`)."""
    records, wall = list(sent.records), sent.wall_s
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
        "achieved_rps": _achieved_rps(sent.started_s),
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
    behind = None
    if bench.open_loop:
        lag = _p99_ms(sent.lags_s)
        metrics["send_lag_p99_ms"] = lag
        metrics["client_behind"] = float(lag > bench.max_lag_ms)
        if lag > bench.max_lag_ms:
            behind = ClientBehind(lag, bench.max_lag_ms, len(sent.lags_s), float(bench.request_rate),
                                  metrics["achieved_rps"])
    if bench.slo:
        metrics.update(slo_metrics(check_slo(records, bench.slo), wall))
    result = SampleOutcome(metrics=metrics, requests=len(ok), output_tokens=tokens, duration_s=wall,
                          errors=len(records) - len(ok))
    return SampleDetail(result=result, requests=tuple(records), lags_s=sent.lags_s, behind=behind)


def _achieved_rps(started_s: tuple[float, ...]) -> float:
    """The rate the sends kept: the gaps between the first and the last send, over the time
    between them ((n - 1) / span; NaN for fewer than two sends)."""
    if len(started_s) < 2:
        return math.nan
    span = max(started_s) - min(started_s)
    return (len(started_s) - 1) / span if span > 0 else math.inf


def _p99_ms(lags_s: tuple[float, ...]) -> float:
    """The p99 of the sends' lags in ms (linear interpolation, as every percentile here)."""
    import numpy as np

    return 1e3 * float(np.percentile(lags_s, 99)) if lags_s else math.nan


def measure_capacity(base_url: str, bench: BenchmarkSpec, *, client: httpx.Client | None = None,
                     headers: Mapping[str, str] | None = None, prompt: "PromptSize | None" = None, boot: int = 0,
                     sample: int = 1, boot_seq: int | None = None) -> SampleDetail:
    """One sample that is a capacity search (``measure.capacity``): the highest arrival
    rate at which every term of ``bench.slo`` held, each trial an open-loop sample of
    ``bench.capacity.trial_requests`` requests at the trial's rate (``bench.arrival``,
    its own requests and arrival times). The sample's metrics are ``capacity_rps`` (0
    where no rate held) and ``client_behind`` (1.0 where the search stopped because the
    client fell behind); :attr:`SampleDetail.capacity` holds the search, every trial with
    its rate, whether it held and its percentiles, and why it ended.

    A trial whose requests failed (:class:`SampleFailed`: an overloaded server refusing
    them) did not hold; where every trial failed so, the last failure is raised: the
    server is not serving.
    """
    cap = bench.capacity
    if cap is None or not bench.slo:
        raise ValueError("a capacity search needs benchmark.capacity and benchmark.slo (the SLO whose highest "
                         "rate it looks for)")
    words = prompt.words if prompt is not None else None
    own = client is None
    http = client or _client(bench, headers)
    measured: list[SampleDetail] = []
    failures: list[SampleFailed] = []
    try:
        model = _model_for(base_url, bench, http)

        def trial(rate: float) -> capacity_search.Trial:
            at = dataclasses.replace(bench, request_rate=rate, requests_per_sample=cap.trial_requests,
                                     sample_seconds=None)
            k = len(measured) + len(failures)
            try:
                detail = _measured(base_url, at, _run_batch(http, base_url, at, model, cap.trial_requests,
                                                            Draw(boot, sample, boot_seq, words), trial=k))
            except SampleFailed as e:
                failures.append(e)
                return capacity_search.Trial(rate, held=False, failure=str(e))
            measured.append(detail)
            check = check_slo(detail.requests, bench.slo)
            return capacity_search.Trial(rate, held=check.held is True,
                                         achieved_rps=detail.result.metrics["achieved_rps"],
                                         requests=detail.result.requests,
                                         percentiles={t.term.metric: t.value_ms for t in check.terms},
                                         behind=detail.behind is not None)

        found = capacity_search.search(cap, trial)
    finally:
        if own:
            http.close()
    if not measured:
        raise failures[-1]
    behind = next((d.behind for d in measured if d.behind is not None), None)
    metrics = {"capacity_rps": found.capacity_rps, "client_behind": float(found.stopped == "client_behind")}
    result = SampleOutcome(metrics=metrics, requests=sum(d.result.requests for d in measured),
                          output_tokens=sum(d.result.output_tokens for d in measured),
                          duration_s=math.fsum(d.result.duration_s for d in measured),
                          errors=sum(d.result.errors for d in measured))
    return SampleDetail(result=result, requests=tuple(r for d in measured for r in d.requests),
                        lags_s=tuple(lag for d in measured for lag in d.lags_s), behind=behind, capacity=found)


def _batch(base_url: str, bench: BenchmarkSpec, n: int | None, client: httpx.Client | None,
           headers: Mapping[str, str] | None = None, draw: Draw = Draw()) -> Dispatched:
    """A sample's requests as it sends them (:func:`_run_batch`), on ``client`` or a client of
    our own (sending ``headers``, e.g. an attached server's ``Authorization``, with each request)."""
    own = client is None
    if not own:
        require_deadline_client(client)
    http = client or _client(bench, headers)
    try:
        model = _model_for(base_url, bench, http)
        return _run_batch(http, base_url, bench, model, n, draw)
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
           sample: int = 0, boot_seq: int | None = None) -> int:
    """Send ``bench.warmup_requests`` requests like a sample's, closed loop, and discard them. Their
    prompts are sample ``sample``'s of ``boot`` (0, or below 0 for the warm-ups of a
    sweep's later points): as long as a sample's, shared with none (with
    ``benchmark.prompt_reuse``, the samples' own first prompts); their lengths and a
    dataset's draws those of the ``boot_seq``-th boot, as its samples' are.

    Returns how many failed; raises :class:`SampleFailed` when all of them did.
    """
    if bench.warmup_requests <= 0:
        return 0
    # closed loop at the benchmark's concurrency, whatever the point's arrivals: it warms the server
    closed = dataclasses.replace(bench, request_rate=None, sample_seconds=None)
    records = _batch(base_url, closed, bench.warmup_requests, client, headers,
                     Draw(boot, sample, boot_seq, prompt.words if prompt is not None else None)).records
    failed = sum(1 for r in records if not r.ok)
    if failed == len(records):
        raise _all_failed("warmup", base_url, records)
    return failed
