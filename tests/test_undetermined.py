"""A search that finds no step on a host that was mostly busy says "undetermined",
not "not-reproduced": the real search and scheduler over a real git history, the
boots from the mock backend (the seam), marked busy or not."""

from __future__ import annotations

import random
import subprocess

import pytest

from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import BootOutcome, SampleOutcome
from bisect_harness.spec import load_spec
from bisect_harness.model import Expect
from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.run.bisect_runner import SearchTarget, search_commits
from bisect_harness.run.scheduler import Scheduler
from bisect_harness.plan.build import Plan
from bisect_harness.record.ledger import Ledger

from helpers import write_spec


def flat_backend(busy: bool, seed: int = 7) -> MockBackend:
    """Every commit measures alike (no step anywhere): tok_s around 100 with 3% noise;
    each boot marked ``host_busy`` where ``busy`` says so."""
    rng = random.Random(seed)

    def answer(r):
        value = 100.0 * (1 + rng.gauss(0, 0.03))
        return BootOutcome(
            boot_id=r.boot_id, status="ok", marks=("host_busy",) if busy else (),
            samples=(SampleOutcome(seq=1, metrics={"tok_s": value}, requests=1, output_tokens=1,
                                   duration_s=0.1),))

    return MockBackend(answer, name="flat")


def _history(path):
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    shas = []
    for i in range(6):
        (path / "f.txt").write_text(f"{i}\n")
        subprocess.run(["git", "-C", str(path), "add", "f.txt"], check=True)
        subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                        "-m", f"c{i}"], check=True)
        shas.append(subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True, capture_output=True,
                                   text=True).stdout.strip())
    return shas


@pytest.mark.parametrize("busy, stopped", [(True, "undetermined"), (False, "not-reproduced")])
def test_no_step_on_a_busy_host_is_undetermined_and_on_a_quiet_one_not_reproduced(tmp_path, busy, stopped):
    repo = tmp_path / "engine"
    repo.mkdir()
    shas = _history(repo)
    spec = load_spec(write_spec(tmp_path / "h.yaml", engine={"preset": "openai", "repo": str(repo),
                                                            "launch": ["my-server", "--port", "{port}"]},
                                hypotheses=[{"id": "h", "baseline": {}, "treatment": {"flags": {"x": 1}},
                                             "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}],
                                defaults={"host_preflight_s": 0}))
    plan = Plan.for_engine(spec, tmp_path / "cache")
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        sched = Scheduler(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=flat_backend(busy))
        with sched.recording("bisect"):
            out = search_commits(sched, shas, SearchTarget("tok_s", Expect.DECREASE), SearchOptions(max_boots=60))
    assert out.stopped == stopped, out.to_json()
    if busy:
        u = out.undetermined
        assert u["would_have_stopped"] == "not-reproduced" and u["busy_boots"] == u["measured_boots"] == out.new_boots
        assert "--wait-quiet" in u["would_decide"]
    else:
        assert out.undetermined is None
