"""A boot as a value, run by the local backend: one slot, two slots at once, interrupted.

Real demo-engine servers on 127.0.0.1, real git worktrees, a real SQLite ledger.
"""

from __future__ import annotations

import os
import pickle
import threading
import time

import psutil
import pytest

from bisect_harness.boot import BootOutcome, Sink
from bisect_harness.backends.local import LocalBackend, device_sets
from bisect_harness.backends.procedure import run_boot
from bisect_harness.errors import UserError
from bisect_harness.record.ledger import Ledger
from bisect_harness.plan.build import make_plan
from bisect_harness.run.scheduler import Scheduler
from bisect_harness.spec import load_spec
from helpers import SMALL_BENCH, write_spec

pytestmark = pytest.mark.slow


def _spec(tmp_path, hypotheses=None, defaults=None):
    hyps = hypotheses or [{"id": "h", "baseline": {"commit": "HEAD~2"}, "treatment": {"commit": "HEAD"},
                           "metric": "tok_s", "expect": "decrease", "min_effect": "5%"}]
    return load_spec(write_spec(tmp_path / "h.yaml", engine={"preset": "demo"}, benchmark=SMALL_BENCH,
                                hypotheses=hyps, defaults={"samples_per_boot": 1, "host_preflight_s": 0,
                                                           **(defaults or {})}))


class _Collect(Sink):
    def __init__(self):
        self.events = []
        self.threads = set()

    def started(self, request, port, argv, log_path):
        self.events.append(("started", request.boot_id))
        self.threads.add(threading.current_thread().name)

    def sample(self, request, sample):
        self.events.append(("sample", request.boot_id, sample.seq))

    def finished(self, request, outcome):
        self.events.append(("finished", request.boot_id, outcome))
        self.threads.add(threading.current_thread().name)


def test_a_boot_request_is_a_frozen_picklable_value_and_run_boot_returns_its_outcome(tmp_path):
    plan = make_plan(_spec(tmp_path))
    config = plan.configs[0]
    req = plan.boot_request(config, boot_id=1, seq=1, log_path=tmp_path / "boot-1.log")
    assert pickle.loads(pickle.dumps(req)) == req  # travels to a Slurm node as it is
    with pytest.raises(Exception):
        req.samples = 5  # frozen
    assert "{port}" in " ".join(req.argv)  # filled where the boot runs
    sink = _Collect()
    out = run_boot(req, sink)
    assert isinstance(out, BootOutcome) and out.status == "ok", (out.failure, out.log_tail)
    assert pickle.loads(pickle.dumps(out)) == out
    assert len(out.samples) == 1 and out.samples[0].metrics["tok_s"] > 0
    assert str(out.port) in out.argv and out.host_fingerprint
    assert out.evidence.host["hostname"] and out.evidence.environment["python"]
    assert [e[0] for e in sink.events] == ["started", "sample", "finished"]
    assert sink.events[-1][2].samples == ()  # the sample went once, as its event; run_boot returns it whole


def test_device_sets_split_the_cores_and_refuse_more_slots_than_cores():
    cpus = sorted(os.sched_getaffinity(0))
    sets = device_sets(2, cpus=[0, 1, 2, 3])
    assert [s.cpus for s in sets] == [(0, 1), (2, 3)]
    assert device_sets(1)[0].cpus is None  # one slot: the whole host, nothing pinned
    with pytest.raises(UserError, match="slots 3"):
        device_sets(3, cpus=[0, 1])
    assert len(cpus) >= 1


def test_gpus_per_boot_follow_the_tensor_parallel_degree_and_stay_disjoint(tmp_path):
    spec = _spec(tmp_path, hypotheses=[{"id": "h", "baseline": {"flags": {"tp": 2}},
                                        "treatment": {"flags": {"tp": 2, "attention-mode": "decode"}},
                                        "metric": "tok_s", "expect": "increase", "min_effect": "5%"}])
    plan = make_plan(spec)
    reqs = [plan.boot_request(c, boot_id=i, seq=1, log_path=tmp_path / f"b{i}.log")
            for i, c in enumerate(plan.configs)]
    assert [r.devices_needed for r in reqs] == [2, 2]
    backend = LocalBackend(2, gpus=[0, 1, 2, 3], cpus=[0, 1])
    assigned = backend.assign(reqs)
    gpus = [r.devices.gpus for r in assigned]
    assert sorted(gpus) == [(0, 1), (2, 3)]
    assert {r.devices.cpus for r in assigned} == {(0,), (1,)}
    small = LocalBackend(2, gpus=[0, 1, 2], cpus=[0, 1])
    assert small.batch_size(reqs) == 1  # 3 GPUs hold one tp-2 boot at a time
    with pytest.raises(UserError, match="needs 2 GPUs"):
        LocalBackend(2, gpus=[0], cpus=[0, 1]).batch_size(reqs)


def test_two_slots_boot_two_configs_at_once_on_disjoint_cores(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPU cores")
    spec = _spec(tmp_path, defaults={"boots_per_arm": 2, "max_boots_per_arm": 2})
    plan = make_plan(spec)
    backend = LocalBackend(2)
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        sched = Scheduler(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=backend, order_seed=3)
        with sched.recording("run"):
            states = list(sched.states.values())
            sched.boot_round(states, 2)
        sched.finish_run()
        boots = [b for st in states for b in st.boots]
        assert len(boots) == 4 and all(b.status == "ok" for b in boots), [(b.status, b.failure) for b in boots]
        by_round = {}
        for b in boots:
            by_round.setdefault(b.seq, []).append(b)
        for seq, pair in by_round.items():
            a, b = pair
            # the two boots of a round overlapped in time, each pinned to its own cores
            assert a.started_at < b.finished_at and b.started_at < a.finished_at
            da, db = a.evidence.devices, b.evidence.devices
            assert set(da["cpus"]).isdisjoint(db["cpus"])
            assert a.argv[:2] == ["taskset", "-c"]
        assert sched.run.host["backend"] == {"name": "local", "slots": 2,
                                             "device_sets": [s.to_dict() for s in backend.sets]}
        assert all(len(b.samples) == 1 for b in boots)


def test_an_interrupt_during_parallel_boots_stops_both_servers_and_keeps_the_rows(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPU cores")
    spec = _spec(tmp_path, defaults={"samples_per_boot": 50})
    plan = make_plan(spec)
    backend = LocalBackend(2)
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        sched = Scheduler(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=backend)
        states = []
        seen: list[int] = []

        class _Interrupting(type(sched.obs)):
            def sample_done(self, config, index, metrics):
                seen.append(index)
                if len(seen) == 2:
                    raise KeyboardInterrupt

        sched.obs = _Interrupting()
        with pytest.raises(KeyboardInterrupt):
            with sched.recording("run"):
                states = list(sched.states.values())
                sched.boot_many(states)
        assert sched.run.status == "interrupted"
        boots = [b for st in states for b in st.boots]
        assert len(boots) == 2 and {b.status for b in boots} == {"interrupted"}
        assert sum(len(b.samples) for b in boots) >= 1  # what was measured stays
        time.sleep(0.5)
        ports = {b.port for b in boots}
        listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == "LISTEN"}
        assert not (ports & listening)
