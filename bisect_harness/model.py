"""Plain value types shared by every layer: metrics, arms, benchmarks, outcomes.

These are frozen dataclasses: a measurement, once made, is never edited.
"""

from __future__ import annotations

import datetime as _dt
import enum
import math
import hashlib
import json
from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from bisect_harness.secrets import redact_env
from bisect_harness.workload import Capacity, LoadPoint, SloTerm, Workload

FlagValue = Union[str, int, float, bool, list, dict, None]


class Better(str, enum.Enum):
    """Which way a metric improves. Decided per metric, never from its name."""

    HIGHER = "higher"
    LOWER = "lower"


class Expect(str, enum.Enum):
    """The direction a hypothesis claims the treatment moves the metric's value."""

    INCREASE = "increase"
    DECREASE = "decrease"

    @property
    def sign(self) -> int:
        return 1 if self is Expect.INCREASE else -1


class Outcome(str, enum.Enum):
    """The three outcomes of a hypothesis; see ``stats`` for what each promises."""

    CONFIRMED = "confirmed"
    REFUTED = "refuted"
    INCONCLUSIVE = "inconclusive"


#: The test of an inconclusive verdict row whose side never booted (no good boot:
#: every launch failed, or the commit never built): shown as "not measured".
NOT_MEASURED = "not measured"


def shown_outcome(verdict) -> str:
    """What a verdict table shows: the outcome, or "not measured" for a side that never booted."""
    if verdict is None:
        return "not decided"
    return NOT_MEASURED if verdict.test == NOT_MEASURED else verdict.outcome


def shown_apart(a: float, b: float, digits: int = 2, most: int = 8) -> tuple[str, str]:
    """``a`` and ``b`` as text (``g`` format) with the fewest significant digits, at
    least ``digits``, that tell them apart when they differ: a comparison printed
    with them reads as it was decided (``p=0.00196 <= 0.002``, never ``0.002 <=
    0.002``). Rounding keeps order, so the two texts never compare the wrong way."""
    a, b = float(a), float(b)
    for d in range(digits, most + 1):
        ta, tb = f"{a:.{d}g}", f"{b:.{d}g}"
        if ta != tb or a == b:
            return ta, tb
    return repr(a), repr(b)


def reused_from(runs: Sequence[int], this_run: int | None) -> str:
    """Where a search's reused boots were measured, in words: this run's own rounds (a
    bisection inside ``harness run`` reuses the hypothesis loop's boots), earlier runs, or both."""
    here = this_run is not None and this_run in runs
    earlier = [r for r in runs if r != this_run]
    words = [f"of this run's rounds (run {this_run})"] if here else []
    if earlier:
        words.append(f"of earlier run{'s' if len(earlier) > 1 else ''} ({', '.join(map(str, earlier))})")
    return " and ".join(words)


@dataclass(frozen=True)
class Metric:
    """A named quantity with a unit and a direction."""

    name: str
    unit: str
    better: Better
    description: str = ""

    @property
    def worse(self) -> Expect:
        """The direction a regression moves this metric's value (tok/s: decrease)."""
        return Expect.DECREASE if self.better is Better.HIGHER else Expect.INCREASE


#: Metrics every benchmark sample carries (from the streaming client).
CLIENT_METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("tok_s", "tok/s", Better.HIGHER,
               "end-to-end output tokens per second: the sample's output tokens over its wall time, from "
               "the first request sent to the last stream's end (prefill, TTFT and HTTP included)"),
        Metric("decode_tok_s", "tok/s", Better.HIGHER,
               "decode tokens per second: tokens after each stream's first chunk over the time from its first "
               "to its last output chunk, summed over the sample's requests (1000 / itl_ms)"),
        Metric("ttft_ms", "ms", Better.LOWER, "mean time to first token"),
        Metric("itl_ms", "ms", Better.LOWER, "mean inter-token latency (per token, not per chunk)"),
        Metric("tpot_ms", "ms", Better.LOWER, "mean time per output token after the first"),
        Metric("e2e_ms", "ms", Better.LOWER, "mean end-to-end request latency"),
    )
}


#: Percentiles of the client's per-request timings, one value per sample (see
#: ``percentiles.percentile_metrics`` and docs/hypotheses-format.md for the exact definitions),
#: each with the ends of its distribution-free 95% interval (``_lo``, ``_hi``: NaN where the
#: sample has too few values for that end, e.g. a p99's upper end below 368 requests).
PERCENTILES = (50, 90, 99)
CLIENT_METRICS.update({
    m.name: m
    for what, label in (("ttft", "time to first token, per request"),
                        ("itl", "inter-token latency, per output token after the first"),
                        ("tpot", "time per output token after the first, per request"),
                        ("e2e", "end-to-end latency, request sent to the stream's end, per request"))
    for q in PERCENTILES
    for m in (Metric(f"{what}_p{q}_ms", "ms", Better.LOWER, f"p{q} of the {label}, over a sample's requests"),
              Metric(f"{what}_p{q}_ms_lo", "ms", Better.LOWER,
                     f"lower end of the 95% order-statistic interval of {what}_p{q}_ms in a sample (the "
                     f"order statistic below which the true p{q} lies with probability at most 2.5%; NaN where "
                     "the sample is too small)"),
              Metric(f"{what}_p{q}_ms_hi", "ms", Better.LOWER,
                     f"upper end of the 95% order-statistic interval of {what}_p{q}_ms in a sample (the "
                     f"order statistic above which the true p{q} lies with probability at most 2.5%; NaN where "
                     "the sample is too small)"))
})


#: How the sample's requests left (``client``, ``dispatch``): every sample has
#: ``achieved_rps``; an open-loop sample (``benchmark.request_rate``) also the metrics of
#: :data:`OPEN_LOOP_METRICS`.
CLIENT_METRICS.update({
    m.name: m
    for m in (
        Metric("achieved_rps", "req/s", Better.HIGHER,
               "the rate the sample's requests were sent at: the sends after the first over the time from the "
               "first send to the last ((n - 1) / span); open loop, set beside the asked request_rate to see "
               "that the client kept up; closed loop, the request throughput the workers reached"),
        Metric("send_lag_p99_ms", "ms", Better.LOWER,
               "open loop: p99 of how late each request left after its scheduled arrival time (the client's "
               "own delay, not the server's); above benchmark.max_lag_ms the sample is marked client_behind"),
        Metric("client_behind", "flag", Better.LOWER,
               "open loop: 1.0 where the sample's send_lag_p99_ms was over benchmark.max_lag_ms (the client "
               "did not send at the asked rate; the boot is marked client_behind), else 0.0"),
    )
})

#: The metrics only an open-loop sample carries.
OPEN_LOOP_METRICS = ("send_lag_p99_ms", "client_behind")

#: Latency under an SLO (``benchmark.slo``; ``measure.slo``, ``measure.capacity``).
CLIENT_METRICS.update({
    m.name: m
    for m in (
        Metric("goodput_rps", "req/s", Better.HIGHER,
               "requests a second that met every term of benchmark.slo, each by its own value (its TTFT, "
               "TPOT, mean ITL or end-to-end latency at most the term's limit), over the sample's wall time"),
        Metric("slo_met", "flag", Better.HIGHER,
               "1.0 where every percentile term of benchmark.slo held in the sample, 0.0 where one did not, "
               "NaN where one could not be judged (no request had its value)"),
        Metric("capacity_rps", "req/s", Better.HIGHER,
               "the highest arrival rate at which every term of benchmark.slo held, found in the boot by a "
               "bracketing search of open-loop trials (benchmark.capacity); 0 where no rate tried held"),
    )
})

#: The metrics only a sample under ``benchmark.slo`` carries (a capacity search's carries
#: ``capacity_rps`` and ``client_behind`` alone).
SLO_METRICS = ("goodput_rps", "slo_met")
CAPACITY_METRICS = ("capacity_rps",)


#: The prompt as the server counted it, per sample (a mean over the requests whose stream
#: said; absent where none did): ``client.measure_sample_detail``.
CLIENT_METRICS.update({
    m.name: m
    for m in (
        Metric("prompt_tokens", "tokens", Better.LOWER, "mean prompt length, as the server counted it"),
        Metric("cached_prompt_tokens", "tokens", Better.HIGHER,
               "mean of the prompt's tokens the server took from its prefix cache (llama.cpp timings.cache_n, "
               "SGLang meta_info.cached_tokens, OpenAI usage.prompt_tokens_details.cached_tokens), where it said"),
        Metric("prompt_tokens_evaluated", "tokens", Better.LOWER,
               "mean of the prompt's tokens the server computed, not cached (llama.cpp timings.prompt_n), "
               "where it said"),
        Metric("prefix_cache_hit_share", "", Better.HIGHER,
               "the share of the prompt tokens the server took from its prefix cache: the sum of the cached "
               "tokens over the sum of the prompt tokens, over the requests whose server said both "
               "(llama.cpp timings.cache_n, SGLang meta_info.cached_tokens, OpenAI "
               "usage.prompt_tokens_details.cached_tokens)"),
    )
})


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Arm:
    """One side of a comparison: what to boot. ``commit`` is a resolved sha or None
    (an engine with no repository, e.g. an installed server)."""

    commit: str | None
    env: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, FlagValue] = field(default_factory=dict)
    label: str = ""
    endpoint: str | None = None  # an attached server's base URL (engine.base_url); None: launched
    release: str | None = None   # a version of engine.releases (an installed build), instead of a commit

    def key(self) -> str:
        """Stable identity of the config: equal arms share boots."""
        fields = {"commit": self.commit, "env": dict(self.env), "flags": dict(self.flags)}
        if self.endpoint is not None:  # only when attached: launched configs keep their keys
            fields["endpoint"] = self.endpoint
        if self.release is not None:  # only for releases: commits keep their keys
            fields["release"] = self.release
        payload = _canonical(fields)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def setting_differences(self, other: "Arm") -> list[tuple[str, str]]:
        """``(kind, key)`` of every env variable (``env``) and flag (``flag``) whose value
        differs from ``other``'s, set on one side only included; sorted by kind, then key."""
        out = []
        for kind, a, b in (("env", self.env, other.env), ("flag", self.flags, other.flags)):
            out += [(kind, k) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) or (k in a) != (k in b)]
        return out

    def _source(self) -> str:
        return (f"release {self.release}" if self.release is not None
                else self.commit[:10] if self.commit else (self.endpoint or "(installed)"))

    def describe(self) -> str:
        parts = [self._source()]
        # a label is stored and printed: secret values masked
        parts += [f"{k}={v}" for k, v in sorted(redact_env(self.env).items())]
        parts += [f"--{k}={v}" for k, v in sorted(redact_env(self.flags).items())]
        return " ".join(parts)

    def describe_against(self, other: "Arm") -> str:
        """What sets this arm apart from ``other``, as a short label: its commit (or
        release, or endpoint) where that differs, then each env variable and flag whose
        value differs, ``+`` before a setting ``other`` lacks and ``no`` before one only
        ``other`` has (``+--md=draft.gguf``, ``NCCL_PROTO=LL``, ``no NCCL_ALGO``). Arms
        equal but for their commit read as the commit; equal arms as :meth:`describe`."""
        parts = [self._source()] if self._source() != other._source() else []
        env, flags = redact_env(self.env), redact_env(self.flags)
        for kind, key in self.setting_differences(other):
            mine, theirs, name = (env, other.env, key) if kind == "env" else (flags, other.flags, f"--{key}")
            if key not in mine:
                parts.append(f"no {name}")
            else:
                parts.append(("" if key in theirs else "+") + f"{name}={mine[key]}")
        return " ".join(parts) or self.describe()


@dataclass(frozen=True)
class Limits:
    """How much the harness reads from a server, and keeps of what it writes (the
    spec's top-level ``limits:``). Every default fits a real vLLM or SGLang by far
    (their ``/metrics`` and server info are tens of KiB); a server past one is
    recorded as such (a source problem, a failed request, a capped log), never
    believed in part and never allowed the harness's memory or disk.

    A run's limits decide what is refused, not what is measured: they are no part
    of a config's identity."""

    body_bytes: int = 4 << 20          # a body read whole: /metrics, server info, an error page
    stream_line_bytes: int = 16 << 20  # one line of a response's event stream
    log_head_bytes: int = 32 << 20     # of a boot log: the first bytes kept ...
    log_tail_bytes: int = 32 << 20     # ... and the last; the middle is dropped and counted
    profile_trace_bytes: int = 50 << 20  # a profiled sample's raw trace, kept beside the log up to this


@dataclass(frozen=True)
class BenchmarkSpec:
    """How one sample is measured against a ready server.

    ``api`` is the server's streaming API (``boot.apis``): ``completions`` (OpenAI
    ``/v1/completions``), ``chat``, ``generate`` (SGLang), ``llamacpp`` (llama.cpp's
    native ``/completion``) or ``tgi`` (``/generate_stream``).
    """

    api: str = "completions"
    model: str | None = None
    prompt_tokens: int = 64
    output_tokens: int = 64
    concurrency: int = 1
    requests_per_sample: int = 4
    warmup_requests: int = 2
    temperature: float = 0.0
    ignore_eos: bool = True
    request_timeout_s: float = 300.0
    seed: int = 0
    # False: every request's prompt is unique across the samples and boots of a config (a
    # seeded tag first, ``prompts.request_prompt``), so no prefix cache serves a later sample;
    # True: every sample sends the same prompts, for measuring the cache itself
    prompt_reuse: bool = False
    tool: str | None = None  # the engine's own client (benchtools: vllm-bench-serve | sglang-bench-serving)
    tool_args: tuple[str, ...] = ()  # more options for the tool, after ours (e.g. --tokenizer PATH)
    limits: Limits = Limits()  # from the spec's top-level ``limits:``; not part of a config's identity
    # --- the workload (``workload``): open loop, lengths, how long a sample lasts, the SLO
    request_rate: float | None = None  # requests a second, open loop; None: closed loop at ``concurrency``
    arrival: str = "poisson"           # workload.ARRIVALS: how open-loop requests are spaced (seeded)
    burstiness: float = 1.0            # the gamma law's shape (``arrival: gamma``); 1 is Poisson
    prompt_tokens_max: int | None = None  # a seeded length per request in [prompt_tokens, this]
    output_tokens_max: int | None = None  # a seeded length per request in [output_tokens, this]
    sample_seconds: float | None = None   # a sample lasts this long (requests sent until then); None: by count
    workload: Workload = None          # a dataset file or a generator (shared prefixes, multi-turn sessions)
    slo: tuple[SloTerm, ...] = ()      # limits on latency percentiles: goodput_rps and capacity_rps
    capacity: Capacity | None = None   # the bracketing search behind capacity_rps
    max_lag_ms: float = 50.0  # open loop: a sample whose p99 send lag exceeds this is marked client-bound
    # the points every boot measures, set by the plan from the sweeps of the config's hypotheses;
    # () is the one point the keys above describe
    points: tuple[LoadPoint, ...] = ()

    @property
    def open_loop(self) -> bool:
        """Whether requests are sent at arrival times (``request_rate``) rather than as
        ``concurrency`` workers finish."""
        return self.request_rate is not None


def utcnow() -> _dt.datetime:
    """Now, in UTC, without a zone (how the ledger stores every time): the one clock
    of the harness, for the controller and the boots alike."""
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None)


def jsonable(obj):
    """``obj`` made safe for a JSON column or ``--json``: enums by value, mappings with
    string keys, tuples as lists, NaN and infinities as None, numpy values by their
    ``tolist()``, anything else JSON cannot hold as its ``str``. The one JSON
    cleaner of the harness."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if hasattr(obj, "tolist"):
        return jsonable(obj.tolist())
    return str(obj)
