"""The preset's settle pause (SGLang: 5 s after the readiness probe first passes) is
for a server the harness just launched; an attached server (``engine.base_url``) is
already running and warm, so its boots take no pause. Against a real demo server on
loopback, booted through ``run_boot`` as the local backend does.
"""

from __future__ import annotations

import dataclasses

import pytest

from bisect_harness.boot import Sink
from bisect_harness.backends.procedure import run_boot
from bisect_harness.engines.presets import get_preset
from bisect_harness.spec import load_spec
from bisect_harness.plan.build import make_plan
from helpers import SMALL_BENCH, write_spec
from test_demo_engine import boot, worktree

pytestmark = pytest.mark.slow

HYPS = [{"id": "a-a", "baseline": {}, "treatment": {}, "metric": "tok_s", "expect": "increase",
         "min_effect": "50%"}]
DEFAULTS = {"samples_per_boot": 1, "host_preflight_s": 0}


class _Quiet(Sink):
    def started(self, request, port, argv, log_path):
        pass

    def sample(self, request, sample):
        pass

    def finished(self, request, outcome):
        pass


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    """A demo engine someone else started: built and running before the harness looks."""
    from bisect_harness.demo import create_demo_repo

    root = tmp_path_factory.mktemp("settle")
    hist = create_demo_repo(root / "engine")
    with boot(worktree(hist, hist.head, root), "--device", "cpu") as server:
        yield server


def _request(tmp_path, engine):
    spec = load_spec(write_spec(tmp_path / "h.yaml", engine=engine, benchmark=SMALL_BENCH, defaults=DEFAULTS,
                                hypotheses=HYPS))
    plan = make_plan(spec)
    return plan.boot_request(plan.configs[0], boot_id=1, seq=1, log_path=tmp_path / "boot-1.log")


def test_an_attached_server_takes_no_settle_pause(tmp_path, demo_server):
    sglang = get_preset("sglang")
    assert sglang.settle_s >= 1  # the pause this test is about
    # SGLang's preset (settle 5 s) attached to a running server: its paths, not its pause
    req = _request(tmp_path, {"preset": "sglang", "base_url": demo_server.base, "health": "/health",
                              "server_info": ["/server_info"]})
    assert req.endpoint == demo_server.base and req.settle_s == 0.0
    out = run_boot(req, _Quiet())
    assert out.status == "ok", (out.failure, out.log_tail)
    assert len(out.samples) == 1 and out.samples[0].metrics["tok_s"] > 0
    assert out.evidence.settle_s is None  # no pause was spent

    # The recording can tell: the same attached boot asked to settle records the pause it spent.
    paused = run_boot(dataclasses.replace(req, boot_id=2, log_path=str(tmp_path / "boot-2.log"), settle_s=0.4),
                      _Quiet())
    assert paused.status == "ok", (paused.failure, paused.log_tail)
    assert paused.evidence.settle_s >= 0.4


def test_a_launched_server_keeps_its_presets_settle_pause(tmp_path):
    req = _request(tmp_path, {"preset": "sglang", "launch": ["{python}", "-m", "sglang.launch_server",
                                                            "--port", "{port}"]})
    assert req.endpoint is None and req.settle_s == get_preset("sglang").settle_s
