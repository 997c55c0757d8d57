"""What the installed vLLM itself writes as mechanism evidence, printed as one JSON
object; run with the vLLM venv's python (``tests/test_mechanism_window.py`` does).

* ``before`` / ``after``: ``/metrics`` bodies from vLLM's own ``SpecDecodingProm``
  (vllm/v1/spec_decode/metrics.py) before and after a window of drafts;
* ``spec_log``: the line its ``SpecDecodingLogging`` prints for that window;
* ``graph_table``: the table its ``CUDAGraphLogging`` (vllm/compilation/cuda_graph.py,
  ``--cudagraph-metrics``) prints for a window of FULL and NONE passes, and
  ``eager_table`` for one of NONE passes alone.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace


def main() -> None:
    import prometheus_client

    from vllm.compilation.cuda_graph import CUDAGraphLogging, CUDAGraphStat
    from vllm.config import CUDAGraphMode
    from vllm.v1.spec_decode.metrics import SpecDecodingLogging, SpecDecodingProm, SpecDecodingStats

    registry = prometheus_client.CollectorRegistry()

    class _Counter(prometheus_client.Counter):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, registry=registry, **kwargs)

    class _Prom(SpecDecodingProm):
        _counter_cls = _Counter

    prom = _Prom(SimpleNamespace(num_speculative_tokens=3), ["model_name", "engine"], {0: ["tiny", "0"]})
    logging_ = SpecDecodingLogging()

    def window(drafts: int, accepted_each: int) -> None:
        stats = SpecDecodingStats.new(3)
        for _ in range(drafts):
            stats.observe_draft(3, accepted_each)
        prom.observe(stats, 0)
        logging_.observe(stats)

    window(10, 1)  # the warm-up, before the window
    before = prometheus_client.generate_latest(registry).decode()
    logging_.reset()
    window(40, 2)  # the measured window
    after = prometheus_client.generate_latest(registry).decode()
    lines: list[str] = []
    logging_.log(log_fn=lambda fmt, *args: lines.append(fmt % args))

    def table(modes) -> str:
        graphs = CUDAGraphLogging(CUDAGraphMode.FULL_AND_PIECEWISE, [1, 2, 4, 8])
        for mode in modes:
            graphs.observe(CUDAGraphStat(3, 4, 1, str(mode)))
        return graphs.generate_metric_table()

    json.dump({"before": before, "after": after, "spec_log": lines[0],
               "graph_table": table([CUDAGraphMode.FULL] * 5 + [CUDAGraphMode.NONE]),
               "eager_table": table([CUDAGraphMode.NONE] * 3)}, sys.stdout)


if __name__ == "__main__":
    main()
