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

The rooms: :mod:`~bisect_harness.engines.presets.base` (the :class:`Preset` type and
the registry), :mod:`~bisect_harness.engines.presets.flags` (YAML flags to argv,
placeholders, where server info reports a flag), and one module per engine, each
registering its preset when imported (this package imports them all):
:mod:`~bisect_harness.engines.presets.sglang`, :mod:`~bisect_harness.engines.presets.vllm`,
:mod:`~bisect_harness.engines.presets.openai`, :mod:`~bisect_harness.engines.presets.llamacpp`,
:mod:`~bisect_harness.engines.presets.demo`. A new engine is one more module here
and its import below.

What each engine really serves is checked against its sources (each engine's
module says what it read). Across them:

* SGLang and vLLM both rename their processes with ``setproctitle``, whose default writes the
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

from bisect_harness.engines.presets.base import COMPARE_MODES, PRESETS, Preset, get_preset, register_preset
from bisect_harness.engines.presets.flags import (
    canonical_flag, compare_mode, devices_needed, flag_note, flags_to_argv, info_key, launch_argv, render_argv,
    server_info_candidates,
)
# the helpers the plan, the boot and the flag check use beside the public face
from bisect_harness.engines.presets.flags import (  # noqa: F401
    LOOPBACK, OPTION_NAME, TP_FLAGS, notes_for, placeholder_values,
)

# Each engine's module registers its preset as it is imported, in this order.
from bisect_harness.engines.presets import sglang, vllm, openai, llamacpp  # noqa: F401  (registers)
from bisect_harness.engines.presets.demo import DemoPreset

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
