"""The Slurm backend against a real Slurm cluster started on this host (munged,
slurmctld and two slurmd; see ``slurm_cluster.py``), booting the real demo engine.

Nothing is faked: jobs go through sbatch, run under slurmstepd, are cancelled with
scancel, and their outcomes come back through submitit's result files.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from bisect_harness.boot import BootOutcome, Sink
from bisect_harness.backends.slurm import SlurmBackend, SlurmOptions
from bisect_harness.errors import SpecError

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------- options (no cluster)


def test_options_from_a_backend_section():
    o = SlurmOptions.from_mapping({"kind": "slurm", "partition": "gpu", "gpus_per_boot": 8, "cpus_per_boot": 16,
                                   "time_limit_min": 30,
                                   "sbatch": {"account": "perf", "exclusive": True, "qos": "high",
                                              "reservation": False}})
    assert (o.partition, o.gpus_per_boot, o.cpus_per_boot, o.time_limit_min) == ("gpu", 8, 16, 30)
    assert dict(o.sbatch) == {"account": "perf", "exclusive": True, "qos": "high"}  # false: left out
    assert o.python == sys.executable and o.same_node is True
    assert SlurmOptions.from_mapping(None) == SlurmOptions()


@pytest.mark.parametrize("section, key, words", [
    ({"cpus_per_boot": 0}, "backend.cpus_per_boot", ">= 1"),
    ({"gpus_per_boot": "eight"}, "backend.gpus_per_boot", "whole number"),
    ({"time_limit_min": True}, "backend.time_limit_min", "whole number"),
    ({"partiton": "gpu"}, "backend.partiton", "unknown key"),
    ({"partition": "gpu; rm -rf /"}, "backend.partition", "partition name"),
    ({"sbatch": ["--qos=high"]}, "backend.sbatch", "mapping"),
    ({"sbatch": {"--qos": "high"}}, "backend.sbatch.--qos", "without dashes"),
    ({"sbatch": {"comment": "a\n#SBATCH --wrap=x"}}, "backend.sbatch.comment", "single-line"),
    ({"sbatch": {"output": "x.log"}}, "backend.sbatch.output", "set by the harness"),
    ({"kind": "local"}, "backend.kind", "kind: slurm"),
    ({"same_node": "yes"}, "backend.same_node", "true or false"),
])
def test_bad_options_name_the_key(section, key, words):
    with pytest.raises(SpecError) as err:
        SlurmOptions.from_mapping(section, "backend")
    assert err.value.key == key and words in str(err.value)


# --------------------------------------------------------------------------- the cluster


def test_a_submitit_job_runs_on_a_node_of_the_cluster(slurm_cluster, tmp_path):
    import submitit

    ex = submitit.SlurmExecutor(folder=tmp_path / "jobs" / "%j")
    ex.update_parameters(time=5, additional_parameters={"no_requeue": True})
    # a function the node can import by name (a test module's own is not on the node's path)
    jobs = [ex.submit(os.getenv, "SLURM_JOB_ID"), ex.submit(os.getenv, "SLURMD_NODENAME")]
    job_id, node = (j.result() for j in jobs)
    assert job_id == jobs[0].job_id
    assert node in slurm_cluster.node_names


# --------------------------------------------------------------------------- real demo boots


def _demo_requests(tmp_path, *, n: int = 2, samples: int = 1, engine: dict | None = None) -> list:
    """Boot requests for ``n`` configs of the demo engine at HEAD (two arms: plain and
    with DEMO_COMM_TUNING), made by the plan as the scheduler makes them."""
    from bisect_harness.plan.build import make_plan
    from bisect_harness.spec import load_spec

    from helpers import write_spec

    hyps = [{"id": "comm", "baseline": {"commit": "HEAD"},
             "treatment": {"commit": "HEAD", "env": {"DEMO_COMM_TUNING": "1"}},
             "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]
    path = write_spec(tmp_path / "h.yaml", engine=engine or {"preset": "demo"}, hypotheses=hyps,
                      benchmark={"prompt_tokens": 8, "output_tokens": 8, "requests_per_sample": 2,
                                 "warmup_requests": 1},
                      defaults={"samples_per_boot": samples, "boots_per_arm": 2, "max_boots_per_arm": 2})
    plan = make_plan(load_spec(path))
    configs = list(plan.configs)
    return [plan.boot_request(configs[i % len(configs)], boot_id=i + 1, seq=i // len(configs) + 1,
                              log_path=tmp_path / "logs" / f"boot-{i + 1}.log") for i in range(n)]


class Recording(Sink):
    def __init__(self):
        self.outcomes: dict[int, BootOutcome] = {}
        self.samples: dict[int, list] = {}
        self.messages: list[str] = []

    def sample(self, request, sample):
        assert request.boot_id not in self.outcomes, "a boot's samples come before its outcome"
        self.samples.setdefault(request.boot_id, []).append(sample)

    def finished(self, request, outcome):
        assert request.boot_id not in self.outcomes, "one outcome per request"
        assert outcome.samples == (), "the samples travel once, as sample events"
        self.outcomes[request.boot_id] = outcome

    def message(self, text):
        self.messages.append(text)


def test_two_demo_boots_run_as_slurm_jobs_on_two_nodes(slurm_cluster, tmp_path):
    requests = _demo_requests(tmp_path, n=2)
    sink = Recording()
    # a job takes a whole node (both its CPUs), so the two boots run at once on the two nodes
    backend = SlurmBackend(SlurmOptions(cpus_per_boot=2, time_limit_min=5, poll_s=0.2), slots=2,
                           folder=tmp_path / "jobs")
    backend.run(requests, sink)
    assert sorted(sink.outcomes) == [1, 2]
    print({i: o.evidence.slurm for i, o in sink.outcomes.items()})
    for r in requests:
        out = sink.outcomes[r.boot_id]
        assert out.status == "ok", (out.failure, out.log_tail)
        samples = sink.samples[r.boot_id]  # handed back once each, before the outcome
        assert len(samples) == 1 and samples[0].metrics["tok_s"] > 0 and samples[0].seq == 1
        slurm = out.evidence.slurm
        assert slurm["node"] in slurm_cluster.node_names and slurm["state"] in ("COMPLETED", "COMPLETING")
        assert out.evidence.devices["node"] == slurm["node"]
        assert 0 < slurm["queued_s"] < slurm["total_s"] and slurm["boot_s"] > 0
        assert out.host_fingerprint  # the node folded into the host's
    assert len({o.evidence.slurm["job_id"] for o in sink.outcomes.values()}) == 2
    assert {o.evidence.slurm["node"] for o in sink.outcomes.values()} == set(slurm_cluster.node_names)
    assert len({o.host_fingerprint for o in sink.outcomes.values()}) == 2
    assert slurm_cluster.jobs_after() == []


def _job_processes(job_ids) -> list[str]:
    """Live processes that belong to one of these Slurm jobs (by their SLURM_JOB_ID)."""
    import psutil

    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.environ().get("SLURM_JOB_ID") in job_ids:
                out.append(f"pid {proc.pid} {' '.join(proc.cmdline())[:160]}")
        except (psutil.Error, OSError):
            continue
    return out


def _running(cluster, requests, n: int):
    """Wait until ``n`` jobs run and their boots have started logging; their ids."""
    from helpers import wait_for

    def ready():
        out = cluster.run("squeue", "--noheader", "--states=RUNNING", "--format=%i")
        ids = out.stdout.split()
        logs = [r.log_path for r in requests if os.path.exists(r.log_path) and os.path.getsize(r.log_path)]
        return ids if len(ids) >= n and len(logs) >= n else None

    return wait_for(ready, timeout=120, interval=0.2, what=f"{n} running jobs with booting servers")


def test_a_job_cancelled_while_booting_is_a_failed_boot_naming_its_slurm_state(slurm_cluster, tmp_path):
    # many samples: the boot is still measuring when it is cancelled
    [request] = _demo_requests(tmp_path, n=1, samples=400)
    sink = Recording()
    backend = SlurmBackend(SlurmOptions(time_limit_min=5, poll_s=0.2), folder=tmp_path / "jobs")
    cancelled: list[str] = []

    def cancel_when_running():
        ids = _running(slurm_cluster, [request], 1)
        cancelled.extend(ids)
        slurm_cluster.run("scancel", *ids)

    t = threading.Thread(target=cancel_when_running)
    t.start()
    backend.run([request], sink)
    t.join()
    out = sink.outcomes[request.boot_id]
    assert out.status == "failed" and out.config_failure is None  # re-booted by the scheduler, not a broken config
    assert f"Slurm job {cancelled[0]}" in out.failure and "CANCELLED" in out.failure, out.failure
    assert out.evidence.slurm["state"] == "CANCELLED" and out.evidence.slurm["job_id"] == cancelled[0]
    assert slurm_cluster.active_jobs() == [] and _job_processes(cancelled) == []


def test_an_interrupt_cancels_every_queued_and_running_job(slurm_cluster, tmp_path):
    # three boots, two nodes that each hold one: two jobs run, the third waits in the queue
    requests = _demo_requests(tmp_path, n=3, samples=400)
    sink = Recording()
    backend = SlurmBackend(SlurmOptions(cpus_per_boot=2, time_limit_min=5, poll_s=0.2), slots=3,
                           folder=tmp_path / "jobs")
    seen: list[str] = []

    def interrupt_when_running():
        seen.extend(_running(slurm_cluster, requests, 2))
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, on the thread running the backend

    t = threading.Thread(target=interrupt_when_running)
    t.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        backend.run(requests, sink)
    t.join()
    assert time.monotonic() - started < 120
    assert sorted(sink.outcomes) == [1, 2, 3]
    assert {o.status for o in sink.outcomes.values()} == {"interrupted"}
    job_ids = [o.evidence.slurm["job_id"] for o in sink.outcomes.values()]
    assert set(seen) < set(job_ids) and all("cancelled" in o.failure for o in sink.outcomes.values())
    assert slurm_cluster.active_jobs() == []  # nothing left queued or running
    from helpers import wait_for
    wait_for(lambda: not _job_processes(job_ids), timeout=15, what="the cancelled jobs' processes to end")


def test_one_slot_keeps_every_boot_on_the_first_boots_node_until_that_node_is_gone(slurm_cluster, tmp_path):
    r1, r2, r3 = _demo_requests(tmp_path, n=3)
    sink = Recording()
    backend = SlurmBackend(SlurmOptions(cpus_per_boot=2, time_limit_min=5, poll_s=0.2), slots=1,
                           folder=tmp_path / "jobs")
    backend.run([r1], sink)
    first = sink.outcomes[1].evidence.slurm["node"]
    assert backend.node == first
    other = next(n for n in slurm_cluster.node_names if n != first)
    # the first node is busy for a while and the other is free: the boot waits for the first
    blocker = slurm_cluster.run("sbatch", "--parsable", f"--nodelist={first}", "--cpus-per-task=2",
                                "--output=/dev/null", "--wrap=sleep 4")
    assert blocker.returncode == 0, blocker.stderr
    backend.run([r2], sink)
    out = sink.outcomes[2]
    assert out.status == "ok" and out.evidence.slurm["node"] == first, (out.failure, out.evidence)
    # the first node is drained: the pinned job cannot start there, and goes where Slurm sends it
    drain = slurm_cluster.run("scontrol", "update", f"nodename={first}", "state=drain", "reason=bisect-harness test")
    assert drain.returncode == 0, drain.stderr
    try:
        backend.run([r3], sink)
    finally:
        slurm_cluster.run("scontrol", "update", f"nodename={first}", "state=resume")
    assert sink.outcomes[3].status == "ok" and sink.outcomes[3].evidence.slurm["node"] == other
    assert any(f"cannot start on {first}" in m for m in sink.messages), sink.messages
    assert backend.node == other
