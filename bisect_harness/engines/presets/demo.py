"""The demo preset: the built-in demo engine (a small torch model over HTTP).

Its repository, when the file names none, is the generated history with planted
regressions (:meth:`DemoPreset.default_repo`); it reports its forward passes and
its profiler as SGLang does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from bisect_harness.engines.presets.base import Preset, register_preset
from bisect_harness.observe.mechanisms import Counter, InfoField, LogLine, Mechanism, StartupLine, as_bool, positive


@dataclass(frozen=True)
class DemoPreset(Preset):
    """The built-in demo engine: with no ``engine.repo``, its generated git history
    (with planted regressions) in the cache is the repository."""

    has_default_repo: ClassVar[bool] = True

    def default_repo(self, cache_dir: Path) -> Path | None:
        from bisect_harness.demo import ensure_demo_repo

        return ensure_demo_repo(cache_dir)


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


def _positive(value) -> bool | None:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return None
