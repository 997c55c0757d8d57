"""The built-in demo engine: a small real torch model served over HTTP, in a
generated git history that holds known events (a decode regression, a commit
whose build fails, a commit after which workers no longer see ``DEMO_*``
variables). It lets the whole harness run on a laptop without a GPU.

>>> from bisect_harness.demo import ensure_demo_repo   # doctest: +SKIP
>>> repo = ensure_demo_repo()            # created once, then cached  # doctest: +SKIP

How the harness builds and launches it is the ``demo`` preset
(``bisect_harness.engines.presets.get_preset("demo")``).

Worker processes read ``DEMO_COMM_TUNING=1`` (one collective per tensor instead
of fixed-size buckets, none for a group of one): a real speed-up that stands in
for the collective library's tuning variables.
"""

from bisect_harness.demo.repo import (
    GENERATOR_VERSION, DemoHistory, create_demo_repo, ensure_demo_repo, read_demo_history,
)

__all__ = ["GENERATOR_VERSION", "DemoHistory", "create_demo_repo", "ensure_demo_repo", "read_demo_history"]
