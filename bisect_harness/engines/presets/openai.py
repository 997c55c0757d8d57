"""The ``openai`` preset: any OpenAI-compatible server, launched as ``engine.launch`` says.

It knows no flag spellings and no server info: a hypotheses file gives the launch
argv, and the health path where the server has no ``/health``.
"""

from __future__ import annotations

from bisect_harness.engines.presets.base import Preset, register_preset

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
