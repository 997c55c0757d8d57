"""The Slurm backend against a real Slurm cluster started on this host (munged,
slurmctld and two slurmd; see ``slurm_cluster.py``), booting the real demo engine.

Nothing is faked: jobs go through sbatch, run under slurmstepd, are cancelled with
scancel, and their outcomes come back through submitit's result files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bisect_harness.boot import BootOutcome, Sink
from bisect_harness.boot.slurm import SlurmBackend, SlurmOptions
from bisect_harness.errors import SpecError

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------- options (no cluster)


def test_options_from_a_backend_section():
    o = SlurmOptions.from_mapping({"kind": "slurm", "partition": "gpu", "gpus_per_boot": 8, "cpus_per_boot": 16,
                                   "time_limit_min": 30, "nodes": 4,
                                   "sbatch": {"account": "perf", "exclusive": True, "qos": "high",
                                              "reservation": False}})
    assert (o.partition, o.gpus_per_boot, o.cpus_per_boot, o.time_limit_min, o.nodes) == ("gpu", 8, 16, 30, 4)
    assert dict(o.sbatch) == {"account": "perf", "exclusive": True, "qos": "high"}  # false: left out
    assert o.python == sys.executable and o.same_node is True
    assert SlurmOptions.from_mapping(None) == SlurmOptions()


@pytest.mark.parametrize("section, key, words", [
    ({"nodes": 0}, "backend.nodes", ">= 1"),
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
