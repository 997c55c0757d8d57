"""The SGLang preset, and what SGLang serves (checked against its source).

SGLang (``python -m sglang.launch_server``): ``/health`` answers once the HTTP
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
"""

from __future__ import annotations

from typing import Mapping

from bisect_harness.engines.presets.base import Preset, register_preset
from bisect_harness.observe.mechanisms import (
    Counter, Gauge, InfoField, LogLine, Mechanism, StartupLine, positive, true_means_off, truthy, unless_text,
)


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


def _sglang_decode_graphs(value) -> bool:
    """Does a CUDA-graph flag's value ask SGLang for decode graphs? ``disabled`` as the
    decode backend (``--cuda-graph-backend-decode``, or ``decode.backend`` in
    ``--cuda-graph-config``) does not; any other value does."""
    if isinstance(value, Mapping):
        decode = value.get("decode")
        return not (isinstance(decode, Mapping) and str(decode.get("backend", "")).lower() == "disabled")
    return value is not False and str(value).strip().lower() != "disabled"
