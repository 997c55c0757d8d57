"""The readers of the load curve's keys: ``benchmark:``'s workload keys, ``sweep:``
(the file's and a hypothesis'), ``slo:`` and ``capacity:``, and the rule that sizes
a sample for the percentile it claims.

The words are ``bisect_harness.workload``'s (LoadPoint, SloTerm, Capacity, the
workload sources); here they are read from the file and checked against each other,
every error naming the key and its line (``spec.reader``) and saying what to write.

Sizing: a ``q``-th percentile of fewer than ``workload.requests_for_percentile(q)``
requests is the sample's largest value, not a tail (a p99 needs 100). A hypothesis
or mechanism on a percentile metric, and every SLO term behind ``goodput_rps`` and
``capacity_rps``, is refused where its samples (at each of its points) are smaller,
with the number needed and what to write.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from bisect_harness.errors import DatasetError, SpecError
# how a dataset's conversations are replayed: the client's own modes
from bisect_harness.measure.datasets import DATASET_MODES, read_dataset
from bisect_harness.model import CLIENT_METRICS, BenchmarkSpec
from bisect_harness.spec.reader import MAX_COUNT, MAX_SECONDS, MAX_SWEEP_POINTS, _Reader, _typename
from bisect_harness.workload import (ARRIVALS, POINT_KEYS, SWEEP_AXES, Capacity, Dataset, LoadPoint, MultiTurn,
                                     SharedPrefix, SloTerm, requests_for_percentile)

__all__ = ["KEYS", "DATASET_MODES", "GOODPUT", "CAPACITY", "WORKLOAD_SOURCES", "percentile_of", "read_workload",
           "read_sweep", "check_benchmark", "check_points_and_sizes", "is_slo_metric", "slo_named",
           "tool_cannot"]

#: ``benchmark:`` keys of the workload, read here (each a field of ``BenchmarkSpec`` but
#: ``sweep``, which expands the hypotheses)
KEYS = ("request_rate", "arrival", "burstiness", "prompt_tokens_max", "output_tokens_max", "sample_seconds",
        "max_lag_ms", "workload", "slo", "capacity", "sweep")
#: ``workload:``'s one key: the source of the prompts, and its own keys
WORKLOAD_SOURCES: dict[str, type] = {"dataset": Dataset, "shared_prefix": SharedPrefix, "multi_turn": MultiTurn}
#: the two metrics an SLO gives: they need ``slo:`` (and capacity its search, ``capacity:``)
GOODPUT, CAPACITY = "goodput_rps", "capacity_rps"

#: keys whose value is a count (a positive integer) where a point sets them
_COUNTS = ("concurrency", "prompt_tokens", "output_tokens", "prompt_tokens_max", "output_tokens_max")
_LENGTHS = ("prompt_tokens", "output_tokens", "prompt_tokens_max", "output_tokens_max")
_PERCENTILE_RE = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)*?_p(?P<q>\d+(?:\.\d+)?)_(?:(?:lo|hi)_)?ms(?:_(?:lo|hi))?$")
_MAX_MS = MAX_SECONDS * 1000.0


def percentile_of(metric: str) -> float | None:
    """The percentile a client metric claims (``ttft_p99_ms`` -> 99.0; its interval
    bounds too), None for another metric. Only the client's metrics (``CLIENT_METRICS``)
    are percentiles over a sample's requests; a declared source's name says nothing."""
    got = _PERCENTILE_RE.match(metric) if metric in CLIENT_METRICS else None
    if got is None:
        return None
    q = float(got.group("q"))
    return q if 0.0 < q < 100.0 else None


# --------------------------------------------------------------------------- benchmark: the workload keys


def read_workload(r: _Reader, b: Mapping[str, Any], spec_dir: Path) -> dict[str, Any]:
    """The ``BenchmarkSpec`` fields of ``benchmark:``'s workload keys that ``b`` writes
    (``sweep`` is read by :func:`read_sweep`)."""
    out: dict[str, Any] = {}
    if "request_rate" in b:
        out["request_rate"] = r.number(b["request_rate"], "benchmark.request_rate", "requests a second",
                                       maximum=MAX_COUNT, positive=True)
    if "arrival" in b:
        out["arrival"] = _arrival(r, b["arrival"], "benchmark.arrival")
    if "burstiness" in b:
        out["burstiness"] = r.number(b["burstiness"], "benchmark.burstiness", "the gamma law's shape",
                                     maximum=MAX_COUNT, positive=True)
    for name in ("prompt_tokens_max", "output_tokens_max"):
        if name in b:
            out[name] = r.positive_int(b[name], f"benchmark.{name}")
    if "sample_seconds" in b:
        out["sample_seconds"] = r.number(b["sample_seconds"], "benchmark.sample_seconds", "a number of seconds",
                                         positive=True)
    if "max_lag_ms" in b:
        out["max_lag_ms"] = r.number(b["max_lag_ms"], "benchmark.max_lag_ms", "milliseconds", maximum=_MAX_MS,
                                     positive=True)
    if b.get("workload") is not None:
        out["workload"] = _workload(r, b["workload"], spec_dir)
    if b.get("slo") is not None:
        out["slo"] = _slo(r, b["slo"])
    if "capacity" in b:
        capacity = _capacity(r, b["capacity"])
        if capacity is not None:
            out["capacity"] = capacity
    return out


def _arrival(r: _Reader, value, path: str) -> str:
    if value not in ARRIVALS:
        raise r.doc.error(path, f"must be one of {', '.join(ARRIVALS)}, got {value!r}: poisson (exponential gaps), "
                          "gamma (gaps of a gamma law whose shape is burstiness), constant (evenly spaced)")
    return value


def _workload(r: _Reader, value, spec_dir: Path):
    """``workload:``: exactly one of ``dataset``, ``shared_prefix``, ``multi_turn``."""
    m = r.mapping(value, "benchmark.workload", tuple(WORKLOAD_SOURCES))
    if len(m) != 1:
        raise r.doc.error("benchmark.workload", f"name exactly one source of prompts ({', '.join(WORKLOAD_SOURCES)}), "
                          f"got {len(m)}" + (f": {', '.join(m)}" if m else ""))
    (kind, body), = m.items()
    path = f"benchmark.workload.{kind}"
    keys = tuple(f.name for f in fields(WORKLOAD_SOURCES[kind]))
    required = tuple(f.name for f in fields(WORKLOAD_SOURCES[kind]) if f.default is MISSING)
    given = r.mapping(body, path, keys, required=required)
    if kind == "dataset":
        return _dataset(r, given, path, spec_dir)
    if kind == "shared_prefix":
        return SharedPrefix(**{k: r.positive_int(given[k], f"{path}.{k}") for k in keys})
    think = r.number(given.get("think_s", MultiTurn.think_s), f"{path}.think_s", "a number of seconds")
    return MultiTurn(turns=r.positive_int(given["turns"], f"{path}.turns", maximum=MAX_COUNT), think_s=think)


def _dataset(r: _Reader, d: Mapping[str, Any], path: str, spec_dir: Path) -> Dataset:
    file = r.typed(d["path"], f"{path}.path", (str,), "the path of a JSON or JSONL file of conversations")
    if "\0" in file or not file.strip():
        raise r.doc.error(f"{path}.path", "expected the path of a JSON or JSONL file of conversations")
    where = (spec_dir / Path(file).expanduser()).resolve()
    if not where.is_file():
        raise r.doc.error(f"{path}.path", f"no such file: {where} (a path is relative to the hypotheses file's "
                          "folder); point it at a ShareGPT-style JSON or JSONL file of conversations")
    mode = d.get("mode", Dataset.mode)
    if mode not in DATASET_MODES:
        raise r.doc.error(f"{path}.mode", f"must be one of {', '.join(DATASET_MODES)}, got {mode!r}: first_turn "
                          "(each conversation's first user turn) or conversation (replayed turn by turn)")
    lengths = {k: r.positive_int(d[k], f"{path}.{k}") for k in ("min_prompt_tokens", "max_prompt_tokens",
                                                                "max_output_tokens") if k in d}
    low = lengths.get("min_prompt_tokens", Dataset.min_prompt_tokens)
    if lengths.get("max_prompt_tokens", low) < low:
        raise r.doc.error(f"{path}.max_prompt_tokens", f"{lengths['max_prompt_tokens']} is below min_prompt_tokens "
                          f"({low}): no conversation could pass; raise it or lower min_prompt_tokens")
    try:  # read and checked now, so a malformed file stops the run before its first boot
        read_dataset(str(where))
    except DatasetError as exc:
        raise r.doc.error(f"{path}.path", str(exc)) from None
    return Dataset(path=str(where), mode=mode, **lengths)


def _slo(r: _Reader, value) -> tuple[SloTerm, ...]:
    """``slo: {ttft_p99_ms: 500, tpot_p99_ms: 50}``: percentile metrics of the client, each
    over a latency every request has, at most a number of milliseconds."""
    r.typed(value, "benchmark.slo", (dict,), "a mapping of percentile metric to its limit in ms, e.g. "
            "{ttft_p99_ms: 500, tpot_p99_ms: 50}")
    if not value:
        raise r.doc.error("benchmark.slo", "an empty SLO: name at least one limit, e.g. {ttft_p99_ms: 500}, or "
                          "remove the key")
    allowed = [name for name in CLIENT_METRICS if is_slo_metric(name)]
    out = []
    for name, limit in value.items():
        path = f"benchmark.slo.{name}"
        if not is_slo_metric(name):
            raise r.doc.error(path, f"an SLO bounds a percentile of a latency every request has; known: "
                              f"{', '.join(allowed)}")
        out.append(SloTerm(metric=name, limit=r.number(limit, path, "a limit in milliseconds", maximum=_MAX_MS,
                                                       positive=True)))
    return tuple(out)


def is_slo_metric(name: str) -> bool:
    """Whether an SLO may bound ``name``: an exact percentile metric of the client
    (``ttft_p99_ms``, no interval bound) whose per-request quantity (``ttft_ms``) is a
    client metric too, so a request can meet it on its own (goodput)."""
    q = percentile_of(name)
    if q is None or not re.fullmatch(r"[a-z0-9_]+_p\d+(?:\.\d+)?_ms", name):
        return False
    return SloTerm(name, 1.0).per_request in CLIENT_METRICS


def _capacity(r: _Reader, value) -> Capacity | None:
    """``capacity: true`` (the defaults), ``false`` (none), or the search's keys."""
    if isinstance(value, bool):
        return Capacity() if value else None
    keys = tuple(f.name for f in fields(Capacity))
    m = r.mapping(value, "benchmark.capacity", keys)
    kwargs: dict[str, Any] = {}
    if "start_rps" in m:
        kwargs["start_rps"] = r.number(m["start_rps"], "benchmark.capacity.start_rps", "requests a second",
                                       maximum=MAX_COUNT, positive=True)
    if "tolerance" in m:
        t = r.number(m["tolerance"], "benchmark.capacity.tolerance", "a share of the bracket's low end", positive=True)
        if t >= 1:
            raise r.doc.error("benchmark.capacity.tolerance", f"must be a share below 1 (0.1: within 10%), got {t:g}")
        kwargs["tolerance"] = t
    if "trial_requests" in m:
        kwargs["trial_requests"] = r.positive_int(m["trial_requests"], "benchmark.capacity.trial_requests")
    if "max_trials" in m:
        kwargs["max_trials"] = r.positive_int(m["max_trials"], "benchmark.capacity.max_trials", minimum=2,
                                              maximum=1000)
    return Capacity(**kwargs)


def check_benchmark(r: _Reader, bench: BenchmarkSpec, written: Iterable[str]) -> None:
    """The workload keys checked against each other (``written``: the keys the file sets)."""
    written = set(written)
    if "burstiness" in written and bench.arrival != "gamma":
        raise r.doc.error("benchmark.burstiness", f"burstiness is the shape of gamma arrivals, and arrival is "
                          f"{bench.arrival!r}; add arrival: gamma, or remove burstiness")
    if "sample_seconds" in written and "requests_per_sample" in written:
        raise r.doc.error("benchmark.sample_seconds", "a sample lasts requests_per_sample requests or sample_seconds "
                          "seconds, not both; remove one")
    if bench.capacity is not None and not bench.slo:
        raise r.doc.error("benchmark.capacity", "capacity is the highest rate whose SLO holds, and there is no "
                          "SLO; add benchmark.slo, e.g. {ttft_p99_ms: 500}")
    if isinstance(bench.workload, Dataset):
        for name in ("prompt_tokens_max", "output_tokens_max"):
            if name in written:
                raise r.doc.error(f"benchmark.{name}", "the dataset gives each request its lengths; bound them with "
                                  "workload.dataset.max_prompt_tokens or max_output_tokens, and remove this key")
    _lengths_fit(r, bench, "benchmark", lambda name: f"benchmark.{name}")


def _lengths_fit(r: _Reader, bench: BenchmarkSpec, where: str, key) -> None:
    for low, high in (("prompt_tokens", "prompt_tokens_max"), ("output_tokens", "output_tokens_max")):
        top = getattr(bench, high)
        if top is not None and top < getattr(bench, low):
            raise r.doc.error(key(high), f"{where}: {high} ({top}) is below {low} ({getattr(bench, low)}); a "
                              f"request's length is drawn from [{low}, {high}]: raise it, or lower {low}")


# --------------------------------------------------------------------------- sweep:


def read_sweep(r: _Reader, value, path: str, bench: BenchmarkSpec) -> tuple[LoadPoint, ...]:
    """``sweep:`` as points, in the sweep's order: ``{axis: [v1, v2, ...]}`` (an axis of
    :data:`workload.SWEEP_AXES`, its values ascending; several axes: their product, the
    first axis outermost) or a list of mappings of :data:`workload.POINT_KEYS`. Each value
    is checked like its benchmark key, each point against the benchmark it changes."""
    if isinstance(value, dict):
        points = _axes(r, value, path)
    elif isinstance(value, list):
        points = _listed(r, value, path)
    else:
        raise r.doc.error(path, f"expected a mapping of an axis to its values ({{concurrency: [1, 4, 16]}}) or a "
                          f"list of points ([{{concurrency: 1}}, {{request_rate: 8}}]), got {_typename(value)}")
    seen: dict[str, int] = {}
    for i, point in enumerate(points):
        if point.label in seen:
            raise r.doc.error(path, f"the point {point.label} is listed twice (points {seen[point.label] + 1} and "
                              f"{i + 1}); each point once")
        seen[point.label] = i
        _point_fits(r, bench, point, path)
    return tuple(points)


def _axes(r: _Reader, value: dict, path: str) -> list[LoadPoint]:
    if not value:
        raise r.doc.error(path, "an empty sweep: name an axis and its values, e.g. {concurrency: [1, 4, 16]}")
    axes = []
    for axis, values in value.items():
        where = f"{path}.{axis}"
        if axis not in SWEEP_AXES:
            hint = " (a list of points may set it: [{...}, {...}])" if axis in POINT_KEYS else ""
            raise r.doc.error(where, f"not an axis of a sweep{hint}; axes: {', '.join(SWEEP_AXES)}")
        if not isinstance(values, list) or not values:
            raise r.doc.error(where, f"expected a non-empty list of values, e.g. {axis}: [1, 4, 16]")
        read = [_value(r, axis, v, f"{where}[{i}]") for i, v in enumerate(values)]
        for i in range(1, len(read)):
            if read[i] in read[:i]:
                raise r.doc.error(f"{where}[{i}]", f"{axis} {read[i]:g} is listed twice; each value once")
            if read[i] < read[i - 1]:
                raise r.doc.error(f"{where}[{i}]", f"write the values ascending (the curve's words read its points "
                                  f"in order): {sorted(read)}")
        axes.append([(axis, v) for v in read])
    count = math.prod(len(a) for a in axes)  # before expanding, as a matrix is
    if count > MAX_SWEEP_POINTS:
        raise r.doc.error(path, f"this sweep has {count} points (" + " x ".join(str(len(a)) for a in axes)
                          + f"), above the cap of {MAX_SWEEP_POINTS}; fewer values (see docs/hypotheses-format.md, "
                          "Limits)")
    return [LoadPoint.of(**dict(p)) for p in itertools.product(*axes)]


def _listed(r: _Reader, value: list, path: str) -> list[LoadPoint]:
    if not value:
        raise r.doc.error(path, "an empty sweep: list at least one point, e.g. [{concurrency: 1}, {concurrency: 8}]")
    if len(value) > MAX_SWEEP_POINTS:
        raise r.doc.error(path, f"this sweep has {len(value)} points, above the cap of {MAX_SWEEP_POINTS}; fewer "
                          "points (see docs/hypotheses-format.md, Limits)")
    out = []
    for i, raw in enumerate(value):
        where = f"{path}[{i}]"
        m = r.mapping(raw, where, POINT_KEYS)
        if not m:
            raise r.doc.error(where, f"an empty point: set at least one of {', '.join(POINT_KEYS)}")
        out.append(LoadPoint.of(**{k: _value(r, k, v, f"{where}.{k}") for k, v in m.items()}))
    return out


def _value(r: _Reader, key: str, v, path: str):
    """A point's value, checked as its benchmark key is."""
    if key in _COUNTS:
        return r.positive_int(v, path)
    if key == "arrival":
        return _arrival(r, v, path)
    what = "requests a second" if key == "request_rate" else "the gamma law's shape"
    return r.number(v, path, what, maximum=MAX_COUNT, positive=True)


def _point_fits(r: _Reader, bench: BenchmarkSpec, point: LoadPoint, path: str) -> None:
    """``point`` applied to ``bench``: the same rules as the benchmark's own keys, and
    what ``benchmark.tool`` can carry."""
    at = point.apply(bench)
    sets = dict(point.settings)
    if "burstiness" in sets and at.arrival != "gamma":
        raise r.doc.error(path, f"the point {point.label} sets burstiness, the shape of gamma arrivals, and its "
                          f"arrival is {at.arrival!r}; add arrival: gamma to the point or to benchmark")
    if isinstance(bench.workload, Dataset):
        lengths = [k for k in sets if k in _LENGTHS]
        if lengths:
            raise r.doc.error(path, f"the point {point.label} sets {', '.join(lengths)}, and the dataset "
                              "(benchmark.workload.dataset) gives each request its lengths; sweep another axis")
    _lengths_fit(r, at, f"the point {point.label}", lambda name: path)
    if bench.tool is not None:
        cannot = tool_cannot(bench.tool, at)
        if cannot:
            raise r.doc.error(path, f"the point {point.label} sets {cannot}, which benchmark.tool ({bench.tool}) "
                              "cannot carry; sweep what it can, or measure with the harness's client (remove "
                              "benchmark.tool)")


def tool_cannot(tool: str, bench: BenchmarkSpec) -> str | None:
    """The first workload key ``bench`` sets (away from its default) that ``tool``'s argv
    does not carry (``BenchTool.workload_keys``: an open-loop rate, a dataset, an SLO
    need the tool to map them), or None."""
    from bisect_harness.engines import benchtools

    carried = benchtools.TOOLS[tool].workload_keys
    defaults = {f.name: f.default for f in fields(BenchmarkSpec)}
    for name in KEYS:
        if name in defaults and name != "max_lag_ms" and getattr(bench, name) != defaults[name] \
                and name not in carried:
            return name
    return None


# --------------------------------------------------------------------------- the points against the hypotheses


def check_points_and_sizes(r: _Reader, bench: BenchmarkSpec, hyps, paths: Mapping[str, str],
                           written: Iterable[str]) -> None:
    """What the expanded hypotheses ask of the benchmark: one point each where any has
    one (every boot measures the file's points, and no other), ``slo:`` for goodput and
    capacity, arrivals that some point sends, and samples sized for each percentile.
    ``paths``: each hypothesis id's key path (``hypotheses[2]``)."""
    written = set(written)
    swept = [h for h in hyps if h.point is not None]
    if swept:
        for h in hyps:
            if h.point is None:
                raise r.doc.error(paths[h.id], f"hypothesis {h.id} has no sweep, and the sweep of "
                                  f"{swept[0].curve} makes every boot measure its points only: the benchmark's own "
                                  "point is not among them. Give this hypothesis a sweep of its own (e.g. sweep: [{concurrency: "
                                  f"{bench.concurrency}}}]), or write the sweep once as benchmark.sweep")
    open_somewhere = bench.open_loop or bench.capacity is not None or any(
        h.point.apply(bench).open_loop for h in swept)
    for name in ("arrival", "burstiness"):
        if name in written and not open_somewhere:
            raise r.doc.error(f"benchmark.{name}", f"{name} shapes open-loop arrivals, and every point is closed "
                              "loop; add benchmark.request_rate (or a sweep over request_rate), or remove it")
    for h in hyps:
        at = h.point.apply(bench) if h.point is not None else bench
        where = paths[h.id]
        for metric, key in ((h.metric, f"{where}.metric"),
                            *((m.metric, f"{where}.mechanism[{j}].metric") for j, m in enumerate(h.mechanism))):
            if metric in (GOODPUT, CAPACITY):
                _slo_metric_fits(r, at, h, metric, key)
            q = percentile_of(metric)
            if q is not None:
                _sized(r, at, h, f"{metric}, a p{q:g}", requests_for_percentile(q))


def slo_named(r: _Reader, metric, key: str, bench: BenchmarkSpec) -> None:
    """``goodput_rps`` and ``capacity_rps`` (by name: whatever ``CLIENT_METRICS`` holds
    today) need ``slo:``, and capacity its search (``capacity:``)."""
    if metric not in (GOODPUT, CAPACITY):
        return
    if not bench.slo:
        raise r.doc.error(key, f"{metric} counts the requests that meet an SLO, and there is none; add "
                          "benchmark.slo, e.g. {ttft_p99_ms: 500, tpot_p99_ms: 50}")
    if metric == CAPACITY and bench.capacity is None:
        raise r.doc.error(key, f"{metric} is found by a search inside each boot; add benchmark.capacity: true "
                          "(or its keys: start_rps, tolerance, trial_requests, max_trials)")


def _slo_metric_fits(r: _Reader, at: BenchmarkSpec, h, metric: str, key: str) -> None:
    """A goodput or capacity hypothesis (``slo_named`` passed): samples sized for every SLO term."""
    if metric == CAPACITY:
        if h.point is not None and h.point.get("request_rate") is not None:
            raise r.doc.error(key, f"{metric} searches the arrival rate itself, and the point {h.point.label} sets "
                              "one; sweep another axis for this hypothesis")
        for term in at.slo:
            need = requests_for_percentile(term.percentile)
            if at.capacity.trial_requests < need:
                raise r.doc.error("benchmark.capacity.trial_requests",
                                  f"hypothesis {h.id}: each capacity trial is a sample of "
                                  f"{at.capacity.trial_requests} requests, and the SLO term {term.describe()} (a "
                                  f"p{term.percentile:g}) needs at least {need}: write capacity: {{trial_requests: "
                                  f"{need}}}")
        return
    for term in at.slo:
        _sized(r, at, h, f"{metric} under the SLO term {term.describe()} (a p{term.percentile:g})",
               requests_for_percentile(term.percentile))


def _sized(r: _Reader, at: BenchmarkSpec, h, what: str, need: int) -> None:
    """Refuse a sample of ``at`` that holds fewer than ``need`` requests (or cannot say)."""
    point = f" at {h.point.label}" if h.point is not None else ""

    def error(key: str, message: str) -> SpecError:
        line = r.doc.line(key) if key in r.doc.lines else h.line
        return SpecError(message, key=key, line=line, file=r.doc.file)

    if at.sample_seconds is None:
        if at.requests_per_sample < need:
            raise error("benchmark.requests_per_sample",
                        f"hypothesis {h.id} asks {what}, which needs at least {need} requests a sample (from fewer "
                        f"it is the sample's largest value), and a sample is {at.requests_per_sample} requests; "
                        f"write benchmark.requests_per_sample: {need}")
        return
    if not at.open_loop:
        raise error("benchmark.sample_seconds",
                    f"hypothesis {h.id} asks {what}, which needs at least {need} requests a sample, and a "
                    f"closed-loop sample of {at.sample_seconds:g} s{point} sends as many as the server finishes, "
                    f"a count not known before; write benchmark.requests_per_sample: {need} instead of "
                    "sample_seconds, or make it open loop with request_rate x sample_seconds >= "
                    f"{need}")
    sent = at.request_rate * at.sample_seconds
    if sent < need:
        seconds = math.ceil(need / at.request_rate * 1000) / 1000
        raise error("benchmark.sample_seconds",
                    f"hypothesis {h.id} asks {what}, which needs at least {need} requests a sample, and "
                    f"{at.request_rate:g} req/s for {at.sample_seconds:g} s{point} sends about {sent:g}; write "
                    f"benchmark.sample_seconds: {seconds:g} (or more)")

