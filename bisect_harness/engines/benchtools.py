"""How a boot's samples are measured: our streaming client, or the engine's own.

``benchmark.tool`` names the engine's own benchmark client; without it the
harness's client (``client``) measures. Each tool is a registered class that
says how to find it, how the benchmark's keys map to its options, and how its
JSON result becomes one sample::

    runner = sample_runner(spec.benchmark, endpoint, python=..., env=..., log_path=...)
    runner.warmup()
    detail = runner.sample(0)           # a client.SampleDetail
    runner.provenance()                 # {"bench_tool": {...raw results...}} for the boot

The option names and result keys below were read from the released sources:
vLLM 0.33.0 (wheel ``vllm-0.33.0``, ``vllm/benchmarks/serve.py`` ``add_cli_args``
and ``main_async``, ``vllm/benchmarks/datasets/datasets.py``
``add_dataset_parser``, ``vllm/benchmarks/lib/endpoint_request_func.py`` for
``OPENAI_API_KEY``) and SGLang 0.5.23 (wheel ``sglang-0.5.23``,
``sglang/bench_serving.py``, which re-exports ``sglang/benchmark/serving.py``:
``cli_main`` for the options, ``benchmark()`` for the JSONL result line,
``get_auth_headers`` for ``OPENAI_API_KEY``).

Each tool run is one sample: ``requests_per_sample`` prompts of
``prompt_tokens`` random tokens (drawn from a seed of the sample's own,
:func:`tool_seed`, so no prefix cache serves one sample from another), ``output_tokens`` each, ``concurrency`` in
flight, all sent at once (request rate inf). It runs in a process group of its
own with a deadline, its argv built without a shell, the API key (attach mode)
passed in its environment as ``OPENAI_API_KEY``, never on its command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

from bisect_harness.measure import client, prompt_size
from bisect_harness.measure.client import SampleFailed as SampleToolError
from bisect_harness.errors import UserError
from bisect_harness.model import BenchmarkSpec
from bisect_harness.workload import LoadPoint
from bisect_harness.boot import SampleOutcome
from bisect_harness.secrets import redact_argv, redact_text

__all__ = ["BenchTool", "TOOLS", "get_tool", "Endpoint", "sample_runner", "ClientRunner", "ToolRunner", "tool_seed"]


@dataclass(frozen=True)
class Endpoint:
    """Where a boot's server answers, and the headers every request carries.

    ``headers`` may hold an API key: it is never stored, logged or shown
    (``repr`` names only the header names)."""

    base_url: str
    host: str | None = None      # set for a server the harness launched
    port: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    api_key: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"Endpoint({self.base_url!r}, headers={sorted(self.headers)})"


#: Registered tools by their ``benchmark.tool`` name.
TOOLS: dict[str, type["BenchTool"]] = {}


class BenchTool:
    """One engine's own benchmark client. Subclasses register by ``name``."""

    name: ClassVar[str] = ""
    install_hint: ClassVar[str] = ""
    #: our metric name -> the key of the tool's result JSON
    keys: ClassVar[Mapping[str, str]] = {}
    #: the benchmark's workload keys (``spec.workloads.KEYS``) its argv carries; the spec refuses a
    #: file or a sweep point that sets another (both tools send ``--request-rate inf``: closed loop)
    workload_keys: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            TOOLS[cls.name] = cls

    # -- what a subclass says

    def command(self, python: str) -> list[str]:
        raise NotImplementedError

    def options(self, bench: BenchmarkSpec, endpoint: Endpoint, result: Path, warmups: int) -> list[str]:
        raise NotImplementedError

    def read(self, result: Path) -> dict:
        """The tool's result object from its file."""
        return json.loads(result.read_text())

    def check_spec(self, bench: BenchmarkSpec) -> str | None:
        """A reason this benchmark cannot be run by the tool, or None."""
        return None

    # -- shared

    def find(self, python: str, env: Mapping[str, str]) -> None:
        """Raise UserError naming ``benchmark.tool`` when the tool is not installed."""
        exe = self.command(python)[0]
        if shutil.which(exe, path=env.get("PATH")) is None:
            raise UserError(f"benchmark.tool: {self.name} runs `{' '.join(self.command('python'))}`, and "
                            f"`{exe}` is not on the boot's PATH. {self.install_hint}")

    def argv(self, bench: BenchmarkSpec, endpoint: Endpoint, python: str, result: Path, warmups: int) -> list[str]:
        # benchmark.tool_args go last: for an option that takes one value, argparse keeps the last.
        return [*self.command(python), *self.options(bench, endpoint, result, warmups), *bench.tool_args]

    def metrics(self, result: Mapping) -> dict[str, float]:
        """Our metric names from the tool's result keys; a missing key is an error."""
        out = {}
        missing = [k for k in self.keys.values() if k not in result]
        if missing:
            raise SampleToolError(f"benchmark.tool {self.name}: its result lacks {', '.join(missing)} "
                                  "(a different version of the tool?)")
        for ours, theirs in self.keys.items():
            value = result[theirs]
            out[ours] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
        return out


def _where(endpoint: Endpoint) -> list[str]:
    if endpoint.host is not None and endpoint.port is not None:
        return ["--host", endpoint.host, "--port", str(endpoint.port)]
    return ["--base-url", endpoint.base_url]


def _percentile_keys(style: str) -> dict[str, str]:
    """Our ``ttft_p50_ms`` ... from the tools' names: vLLM writes ``p50_ttft_ms``
    (with ``--metric-percentiles 50,90,99``), SGLang ``median_ttft_ms``/``p90_``/``p99_``."""
    out = {}
    for what in ("ttft", "itl", "tpot"):
        out[f"{what}_ms"] = f"mean_{what}_ms"
        out[f"{what}_p50_ms"] = f"p50_{what}_ms" if style == "vllm" else f"median_{what}_ms"
        out[f"{what}_p90_ms"] = f"p90_{what}_ms"
        out[f"{what}_p99_ms"] = f"p99_{what}_ms"
    return out


class VllmBenchServe(BenchTool):
    """``vllm bench serve`` (vllm/benchmarks/serve.py, vLLM 0.33.0)."""

    name = "vllm-bench-serve"
    install_hint = ("Install vLLM into the environment the server runs in (engine.python, or the commit's "
                    "build), so that `vllm bench serve` works there.")
    keys = {"tok_s": "output_throughput", "e2e_ms": "mean_e2el_ms", **_percentile_keys("vllm")}

    def command(self, python: str) -> list[str]:
        return ["vllm", "bench", "serve"]

    def check_spec(self, bench: BenchmarkSpec) -> str | None:
        if bench.api != "completions":
            return ("vllm-bench-serve sends OpenAI completions (--backend openai); set benchmark.api: "
                    "completions, or use sglang-bench-serving for SGLang's /generate")
        return None

    def options(self, bench, endpoint, result, warmups):
        argv = ["--backend", "openai", "--endpoint", "/v1/completions", *_where(endpoint),
                "--dataset-name", "random",
                "--random-input-len", str(bench.prompt_tokens), "--random-output-len", str(bench.output_tokens),
                "--random-range-ratio", "0.0",  # vLLM: 0 keeps every length fixed
                "--num-prompts", str(bench.requests_per_sample), "--max-concurrency", str(bench.concurrency),
                "--request-rate", "inf", "--num-warmups", str(warmups), "--seed", str(bench.seed),
                "--temperature", repr(float(bench.temperature)),
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name,
                "--disable-tqdm"]
        if bench.ignore_eos:
            argv.append("--ignore-eos")
        if bench.model is not None:
            argv += ["--model", bench.model]
        return argv


class SglangBenchServing(BenchTool):
    """``python -m sglang.bench_serving`` (sglang/benchmark/serving.py, SGLang 0.5.23)."""

    name = "sglang-bench-serving"
    install_hint = ("Install SGLang into the environment the server runs in (engine.python, or the commit's "
                    "build), so that `python -m sglang.bench_serving` works there.")
    keys = {"tok_s": "output_throughput", "e2e_ms": "mean_e2e_latency_ms", **_percentile_keys("sglang")}

    def command(self, python: str) -> list[str]:
        return [python, "-m", "sglang.bench_serving"]

    def find(self, python: str, env: Mapping[str, str]) -> None:
        probe = [python, "-c", "import importlib.util, sys; "
                 "sys.exit(0 if importlib.util.find_spec('sglang.bench_serving') else 3)"]
        try:
            rc = subprocess.run(probe, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, timeout=120, start_new_session=True).returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            rc, why = 1, f" ({type(exc).__name__})"
        else:
            why = ""
        if rc != 0:
            raise UserError(f"benchmark.tool: {self.name} runs `{python} -m sglang.bench_serving`, and that "
                            f"interpreter cannot import sglang.bench_serving{why}. {self.install_hint}")

    def options(self, bench, endpoint, result, warmups):
        argv = ["--backend", "sglang" if bench.api == "generate" else "sglang-oai", *_where(endpoint),
                "--dataset-name", "random-ids",  # random token ids: no dataset download
                "--random-input-len", str(bench.prompt_tokens), "--random-output-len", str(bench.output_tokens),
                "--random-range-ratio", "1.0",  # SGLang: lengths drawn from [len * ratio, len]; 1 keeps them fixed
                "--num-prompts", str(bench.requests_per_sample), "--max-concurrency", str(bench.concurrency),
                "--request-rate", "inf", "--warmup-requests", str(warmups), "--seed", str(bench.seed),
                "--temperature", repr(float(bench.temperature)),
                "--ready-check-timeout-sec", "0",  # the harness has checked readiness already
                "--output-file", str(result), "--disable-tqdm"]
        if not bench.ignore_eos:
            argv.append("--disable-ignore-eos")
        if bench.model is not None:
            argv += ["--model", bench.model]
        return argv

    def read(self, result: Path) -> dict:
        # SGLang appends one JSON line per run to --output-file: the last line is this run.
        lines = [ln for ln in result.read_text().splitlines() if ln.strip()]
        if not lines:
            raise ValueError("the file is empty")
        return json.loads(lines[-1])


def get_tool(name: str) -> BenchTool:
    try:
        return TOOLS[name]()
    except KeyError:
        raise UserError(f"benchmark.tool: unknown tool {name!r}; known: {', '.join(sorted(TOOLS))}") from None


# --------------------------------------------------------------------------- runners


class ClientRunner:
    """The harness's own streaming client (``client``). ``boot`` numbers the boot's
    prompts (``prompts.request_prompt``): unique to each boot, sample and request;
    ``boot_seq``, the boot's number in its config, seeds its arrival times, lengths and a
    dataset's draws (``arrivals``, ``workloads``; None: the boot's id), so the k-th boots of
    two arms see the same traffic. A benchmark with
    ``capacity`` makes each sample a capacity search (``client.measure_capacity``),
    whose trials the boot's provenance keeps (:meth:`provenance`)."""

    def __init__(self, bench: BenchmarkSpec, endpoint: Endpoint, boot: int = 0, boot_seq: int | None = None):
        self.bench, self.endpoint, self.boot, self.boot_seq = bench, endpoint, boot, boot_seq
        self._http = None
        self.prompt: prompt_size.PromptSize | None = None  # sized once a boot, before its warm-up
        self._sized: dict[int, prompt_size.PromptSize] = {}  # per prompt length asked: a sweep's points
        self.searches: dict[str, dict] = {}  # the capacity searches, by the sample's number in the boot

    def _at(self, point: LoadPoint | None) -> BenchmarkSpec:
        return point.apply(self.bench) if point is not None else self.bench

    def _prompt_for(self, http, bench: BenchmarkSpec) -> prompt_size.PromptSize:
        """The prompts' size at ``bench.prompt_tokens``, fitted once a boot per length."""
        if bench.prompt_tokens not in self._sized:
            self._sized[bench.prompt_tokens] = prompt_size.size_prompts(http, self.endpoint.base_url, bench,
                                                                         boot=self.boot)
        if bench.prompt_tokens == self.bench.prompt_tokens or self.prompt is None:
            self.prompt = self._sized[bench.prompt_tokens]
        return self._sized[bench.prompt_tokens]

    def warmup(self, point: LoadPoint | None = None, nth: int = 0) -> None:
        """Size the prompts (the server's tokenizer), then warm up with prompts that long,
        at ``point`` (the ``nth`` point of the boot's order: each warm-up's prompts its own)."""
        url = self.endpoint.base_url
        if self._http is not None:  # a later point's warm-up, inside the boot's session
            bench = self._at(point)
            client.warmup(url, bench, client=self._http, prompt=self._prompt_for(self._http, bench), boot=self.boot,
                          sample=-nth, boot_seq=self.boot_seq)
            return
        with client.boot_session(url, self.bench, headers=self.endpoint.headers) as (http, bench):
            self.bench = bench
            at = self._at(point)
            client.warmup(url, at, client=http, prompt=self._prompt_for(http, at), boot=self.boot, sample=-nth,
                          boot_seq=self.boot_seq)

    @contextlib.contextmanager
    def session(self):
        """One HTTP client and the resolved model for the boot's samples (``client.boot_session``),
        so no sample window holds the client's setup."""
        with client.boot_session(self.endpoint.base_url, self.bench, headers=self.endpoint.headers) as (http, bench):
            self._http, self.bench = http, bench
            if self.prompt is None:
                self._prompt_for(http, bench)
            try:
                yield self
            finally:
                self._http = None

    def sample(self, index: int, point: LoadPoint | None = None) -> client.SampleDetail:
        """Sample ``index`` (from 0, numbered across the boot's points) at ``point``."""
        bench = self._at(point)
        detail = client.measure_sample_detail(self.endpoint.base_url, bench, client=self._http,
                                              headers=self.endpoint.headers,
                                              prompt=self._prompt_for(self._http, bench) if self._http else self.prompt,
                                              boot=self.boot, sample=index + 1, boot_seq=self.boot_seq)
        if detail.capacity is not None:
            self.searches[str(index + 1)] = {"point": point.label if point is not None else None,
                                             **detail.capacity.to_json()}
        return detail

    def provenance(self) -> dict:
        """How long the prompts were (``prompt_size.PromptSize``: tokens, or words where the
        server cannot count them), and whether each sample's were its own; each capacity
        search's trials (``capacity``: by the sample's number in the boot)."""
        out: dict = {"prompt": self.prompt.to_dict()} if self.prompt is not None else {}
        if self.searches:
            out["capacity"] = {"samples": dict(self.searches)}
        return out


def tool_seed(bench: BenchmarkSpec, boot: int, sample: int) -> int:
    """The ``--seed`` of a tool's run: its random prompts differ in every sample and boot
    (no prefix cache serves one from another), unless ``benchmark.prompt_reuse``."""
    if bench.prompt_reuse:
        return bench.seed
    key = f"{bench.seed}:{boot}:{sample}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little") >> 1  # a positive int32


_SCALARS = (int, float, str, bool, type(None))


class ToolRunner:
    """Runs ``tool`` once per sample against ``endpoint`` and reads its result file."""

    def __init__(self, tool: BenchTool, bench: BenchmarkSpec, endpoint: Endpoint, *, python: str,
                 env: Mapping[str, str], cwd: Path, log_path: Path, boot: int = 0):
        self.tool, self.bench, self.endpoint, self.boot = tool, bench, endpoint, boot
        self.python, self.cwd = python, Path(cwd)
        self.env = dict(env)
        if endpoint.api_key is not None:
            self.env["OPENAI_API_KEY"] = endpoint.api_key  # both tools read it (module docstring)
        self.log_path = Path(log_path).with_suffix(".tool.log")
        self.results_dir = Path(log_path).with_suffix(".tool-results")
        self.runs: list[dict] = []
        self._warmups = bench.warmup_requests

    def warmup(self, point: LoadPoint | None = None, nth: int = 0) -> None:
        """The tool warms up inside each point's first run (vLLM --num-warmups, SGLang --warmup-requests)."""
        self._warmups = self.bench.warmup_requests

    @contextlib.contextmanager
    def session(self):
        """Each sample is a run of the tool, which makes its own client."""
        yield self

    def deadline_s(self) -> float:
        waves = math.ceil((self.bench.requests_per_sample + self._warmups) / max(1, self.bench.concurrency))
        return 300.0 + self.bench.request_timeout_s * waves

    def sample(self, index: int, point: LoadPoint | None = None) -> client.SampleDetail:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        suffix = ".jsonl" if isinstance(self.tool, SglangBenchServing) else ".json"
        result = self.results_dir / f"sample-{index + 1}{suffix}"
        result.unlink(missing_ok=True)
        at = point.apply(self.bench) if point is not None else self.bench
        bench = dataclasses.replace(at, seed=tool_seed(self.bench, self.boot, index + 1))
        argv = self.tool.argv(bench, self.endpoint, self.python, result, self._warmups)
        self._warmups = 0  # later samples of the boot are warm
        rc, wall = run_owned(argv, env=self.env, cwd=self.cwd, log_path=self.log_path, timeout_s=self.deadline_s())
        tail = _log_tail(self.log_path)
        if rc is None:
            raise SampleToolError(f"benchmark.tool {self.tool.name} ran past its deadline of "
                                  f"{self.deadline_s():.0f} s and was stopped; log: {self.log_path}", log_tail=tail,
                                  log_path=str(self.log_path))
        if rc != 0:
            raise SampleToolError(f"benchmark.tool {self.tool.name} exited with code {rc} (command: "
                                  f"{' '.join(argv)}); log: {self.log_path}\n{tail}", log_tail=tail,
                                  log_path=str(self.log_path))
        try:
            data = self.tool.read(result)
        except (OSError, ValueError) as exc:
            raise SampleToolError(f"benchmark.tool {self.tool.name} exited 0 but its result {result} cannot be "
                                  f"read: {exc}; log: {self.log_path}", log_tail=tail,
                                  log_path=str(self.log_path)) from None
        if not isinstance(data, Mapping):
            raise SampleToolError(f"benchmark.tool {self.tool.name}: result {result} is not a JSON object")
        metrics = self.tool.metrics(data)
        completed = int(data.get("completed") or 0)
        if completed <= 0:
            raise SampleToolError(f"benchmark.tool {self.tool.name} completed no request; log: {self.log_path}\n"
                                  f"{tail}", log_tail=tail, log_path=str(self.log_path))
        duration = float(data.get("duration") or wall)
        failed = data.get("failed")
        errors = int(failed) if isinstance(failed, int) else max(0, self.bench.requests_per_sample - completed)
        self.runs.append({"sample": index + 1, "argv": argv, "exit_code": rc, "wall_s": round(wall, 3),
                          "result_file": str(result),
                          "result": {k: v for k, v in data.items() if isinstance(v, _SCALARS)}})
        res = SampleOutcome(metrics=metrics, requests=completed, output_tokens=int(data.get("total_output_tokens") or 0),
                           duration_s=duration, errors=errors)
        return client.SampleDetail(result=res, requests=())

    def provenance(self) -> dict:
        return {"bench_tool": {"tool": self.tool.name, "log": str(self.log_path), "runs": self.runs}}


_FOUND: set[tuple] = set()


def sample_runner(bench: BenchmarkSpec, endpoint: Endpoint, *, python: str, env: Mapping[str, str], cwd: Path,
                  log_path: Path, boot: int = 0, boot_seq: int | None = None):
    """The runner for this benchmark: the tool's (checked to be installed) or our client.
    ``boot`` (the boot's ledger id) keeps its prompts apart from every other boot's;
    ``boot_seq`` (its number in its config) seeds our client's arrival times and lengths."""
    if bench.tool is None:
        return ClientRunner(bench, endpoint, boot, boot_seq)
    tool = get_tool(bench.tool)
    found = (tool.name, python, env.get("PATH"), env.get("PYTHONPATH"))
    if found not in _FOUND:  # once per interpreter and PATH, not per boot
        tool.find(python, env)
        _FOUND.add(found)
    return ToolRunner(tool, bench, endpoint, python=python, env=env, cwd=cwd, log_path=log_path, boot=boot)


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --------------------------------------------------------------------------- an owned subprocess


def run_owned(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path,
              timeout_s: float, grace_s: float = 5.0) -> tuple[int | None, float]:
    """Run ``argv`` (no shell) under a supervisor (``supervisor``: a process group of its own,
    every descendant owned), output appended to ``log_path``; at ``timeout_s`` (or on
    any exception, Ctrl-C included, or the harness's death) the whole tree gets SIGTERM,
    then SIGKILL. Returns (exit code or None on timeout, seconds)."""
    import time

    from bisect_harness.process import supervised

    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "ab") as log:  # written by us: no secrets in it
        log.write(redact_text(f"$ {' '.join(redact_argv(argv))}\n").encode())
        log.flush()
        try:
            rc = supervised.run(argv, env=env, cwd=cwd, stdout=log, timeout_s=timeout_s, grace_s=grace_s)
        except supervised.LaunchError as exc:
            raise SampleToolError(f"could not start {argv[0]!r}: {exc}") from exc
    return rc, time.monotonic() - t0

