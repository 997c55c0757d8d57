"""The llama.cpp preset (``llama-server``, ``--metrics`` where the build has it).

Read from llama.cpp as vendored in llama-cpp-python 0.3.36 and checked on the real
llama-server built from it: ``/health`` for readiness, ``/props`` for server info,
``/metrics`` with ``--metrics`` only, and the speculative-decoding evidence in the
comments below. ``/props`` answers for the model, its alias, the slots, the context
of one slot (``--ctx-size`` is the total over the slots:
:mod:`bisect_harness.observe.provenance.slot_context`), the endpoints switched on and
the default sampling settings; nothing of the draft model, the GPU layers, the
threads, the batch sizes or flash attention, which are listed as not reported.
"""

from __future__ import annotations

from bisect_harness.engines.presets.base import Preset, register_preset
from bisect_harness.observe.mechanisms import Counter, LogLine, Mechanism, StartupLine

#: The sampling flags ``/props`` reports under ``default_generation_settings.params``, by
#: the key there (tools/server/server-task.cpp task_params::to_json)
_SAMPLING = {"temp": "temperature", "top-k": "top_k", "top-p": "top_p", "min-p": "min_p",
             "top-nsigma": "top_n_sigma", "typical": "typical_p", "xtc-probability": "xtc_probability",
             "xtc-threshold": "xtc_threshold", "repeat-last-n": "repeat_last_n", "repeat-penalty": "repeat_penalty",
             "presence-penalty": "presence_penalty", "frequency-penalty": "frequency_penalty",
             "dry-multiplier": "dry_multiplier", "dry-base": "dry_base", "dry-allowed-length": "dry_allowed_length",
             "dry-penalty-last-n": "dry_penalty_last_n", "dynatemp-range": "dynatemp_range",
             "dynatemp-exp": "dynatemp_exponent", "mirostat": "mirostat", "mirostat-lr": "mirostat_eta",
             "mirostat-ent": "mirostat_tau", "adaptive-target": "adaptive_target", "adaptive-decay": "adaptive_decay",
             "ignore-eos": "ignore_eos"}
#: those of them llama.cpp holds as C floats
_SAMPLING_FLOATS = ("temp", "top-p", "min-p", "top-nsigma", "typical", "xtc-probability", "xtc-threshold",
                    "repeat-penalty", "presence-penalty", "frequency-penalty", "dry-multiplier", "dry-base",
                    "dynatemp-range", "dynatemp-exp", "mirostat-lr", "mirostat-ent", "adaptive-target",
                    "adaptive-decay")

_LLAMACPP = register_preset(Preset(
    name="llamacpp",
    # --metrics turns /metrics on: the spec-decode counters are the evidence that
    # drafting engaged, and llamacpp:tokens_predicted_total a server-side token count.
    launch=("llama-server", "--host", "{host}", "--port", "{port}", "--metrics"),
    # a 2023 `server` has no --metrics ("error: unknown argument: --metrics", exit 1): a boot
    # reads the build's --help first and launches without it there, saying so
    optional_flags=("--metrics",),
    health_path="/health",
    ready_timeout_s=600.0,
    # tools/server/server-context.cpp get_res_props: build_info, total_slots, model_path,
    # model_alias, endpoint_{slots,props,metrics}, default_generation_settings (n_ctx of a
    # slot; params: the sampling settings the flags set, from params.sampling)
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
             "t": "threads", "b": "batch-size", "ub": "ubatch-size", "a": "alias", "temperature": "temp",
             "typical-p": "typical", "top-n-sigma": "top-nsigma"},
    # Checked on the real llama-server (tests/fixtures/engines/llamacpp-0.3.36-props-*.json).
    # /props reports the sampling settings of params.sampling as C floats; its
    # "speculative.types" and "n_predict" are a request's defaults, never the launch's
    # --spec-type or -n, and are not read. A flag whose key a build's /props lacks (the
    # sampling settings sat at default_generation_settings' top level in 2024 builds) is
    # not reported, never a mismatch.
    info_keys={"model": "model_path", "alias": "model_alias", "parallel": "total_slots",
               "ctx-size": "default_generation_settings.n_ctx", "metrics": "endpoint_metrics",
               "slots": "endpoint_slots", "props": "endpoint_props",
               **{flag: f"default_generation_settings.params.{key}" for flag, key in _SAMPLING.items()}},
    info_compare={"ctx-size": "slot_context", "alias": "one_of",
                  **{flag: "float32" for flag in _SAMPLING_FLOATS}},
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
    description="llama.cpp: llama-server, with --metrics where the build's --help names it; readiness by "
                "/health, server info /props",
))
