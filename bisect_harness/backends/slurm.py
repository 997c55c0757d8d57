"""Boots as Slurm jobs, through submitit: one job per boot request.

The controller (the machine running ``harness``) submits each request as a batch
job whose Python function is :func:`node_boot`: on the node it names its device
set after the node (``SLURMD_NODENAME``), calls
:func:`bisect_harness.backends.procedure.run_boot` there, and returns the frozen outcome
through submitit's result file. The controller polls the jobs, hands each
outcome back to its caller (its samples first, one ``Sampled`` event each, then its
``Finished``: ``boot.handed_back``) (the ledger is written on the controller only, never on a
node) and keeps at most ``slots`` jobs in the queue at once::

    backend = SlurmBackend(SlurmOptions(partition="gpu", gpus_per_boot=8), slots=4)
    backend.run(requests, sink)      # or: for event in backend.events(requests): ...

The cache folder (worktrees, per-commit environments), the log folder and the
jobs folder must be on a filesystem the nodes share with the controller.

A job that ends without an outcome (cancelled, preempted, timed out, its node
died) is a ``failed`` boot naming the job id and its Slurm state, with the tail
of the job's stderr; the scheduler re-boots it within its budget. A job cancelled
while its boot was running also comes back failed, never as a config failure (a
build cut short is not a broken commit). An interrupt (Ctrl-C, SIGTERM) cancels
every job still queued or running, reports each as ``interrupted`` and
propagates.

Slurm's own cost per boot is kept in ``outcome.evidence.slurm``: the job id,
node and final state, ``queued_s`` (submission on the controller to the boot
function starting on the node: scheduling, job launch, interpreter start),
``boot_s`` (the boot itself on the node), ``returned_s`` (the boot's end to the
controller seeing its outcome) and ``total_s``. Queued and returned times compare
the controller's clock with the node's: on a cluster they are as good as the
nodes' clock synchronisation.

Job states come from the controller daemon (``squeue``, which keeps finished jobs
for ``MinJobAge``), then from ``sacct`` where the cluster keeps accounting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from bisect_harness.backends import BACKENDS, Backend, BackendKind
from bisect_harness.errors import InfrastructureError, SpecError
from bisect_harness.boot import BootOutcome, BootRequest, DeviceSet, Event, Finished, Message, handed_back
from bisect_harness.evidence import BootEvidence, BootStatus

__all__ = ["SlurmOptions", "SlurmBackend", "node_boot", "node_fingerprint"]

# states a job leaves the queue in (squeue/sacct long names)
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL",
         "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"}
# ended by Slurm rather than by the boot: the boot's own failure, if any, is not the config's
CUT_SHORT = {"CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
             "REVOKED"}
# a pending job that cannot start where it was pinned
UNREACHABLE_REASONS = ("ReqNodeNotAvail", "NodeDown", "BadConstraints", "PartitionNodeLimit")
_SBATCH_KEY = re.compile(r"^[a-z][a-z0-9_-]*$")


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SlurmOptions:
    """The ``backend:`` section of hypotheses.yaml for ``kind: slurm`` (its ``slots``,
    how many jobs may be queued or running at once, belongs to the backend).

    ``same_node`` (on by default) pins every job to the node the first boot ran on
    when there is one slot, so both arms of every comparison boot on one node.
    ``sbatch`` holds any other sbatch
    option (``account``, ``qos``, ``constraint``, ``exclusive: true``...), passed
    to submitit as ``additional_parameters``."""

    partition: str | None = None
    gpus_per_boot: int = 0
    cpus_per_boot: int = 1
    mem_gb: float | None = None
    time_limit_min: int = 60
    same_node: bool = True
    sbatch: tuple[tuple[str, Any], ...] = ()
    python: str = field(default_factory=lambda: sys.executable)
    poll_s: float = 0.5

    KEYS = ("kind", "partition", "gpus_per_boot", "cpus_per_boot", "mem_gb", "time_limit_min", "same_node",
            "sbatch", "python", "poll_s")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any] | None, where: str = "backend") -> "SlurmOptions":
        """Validate a ``backend:`` mapping; errors name the key and what is allowed."""
        d = dict(d or {})
        unknown = sorted(set(d) - set(cls.KEYS))
        if unknown:
            raise SpecError(f"unknown key(s) {', '.join(unknown)}; a Slurm backend takes "
                            + ", ".join(k for k in cls.KEYS), key=f"{where}.{unknown[0]}")
        if d.get("kind", "slurm") != "slurm":
            raise SpecError(f"kind is {d['kind']!r}; these options are for kind: slurm", key=f"{where}.kind")

        def integer(key: str, default: int, least: int) -> int:
            v = d.get(key, default)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise SpecError(f"must be a whole number >= {least}, got {v!r}", key=f"{where}.{key}")
            return v

        def number(key: str, default: float | None, least: float) -> float | None:
            v = d.get(key, default)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < least:
                raise SpecError(f"must be a number >= {least}, got {v!r}", key=f"{where}.{key}")
            return float(v)

        partition = d.get("partition")
        if partition is not None and (not isinstance(partition, str) or not re.fullmatch(r"[\w.,-]+", partition)):
            raise SpecError(f"must be a Slurm partition name (letters, digits, '_', '-', '.', ','), got {partition!r}",
                            key=f"{where}.partition")
        same_node = d.get("same_node", True)
        if not isinstance(same_node, bool):
            raise SpecError(f"must be true or false, got {same_node!r}", key=f"{where}.same_node")
        python = d.get("python", sys.executable)
        if not isinstance(python, str) or not python.strip() or "\n" in python:
            raise SpecError(f"must be the path of a Python interpreter on the nodes, got {python!r}",
                            key=f"{where}.python")
        extra = d.get("sbatch") or {}
        if not isinstance(extra, Mapping):
            raise SpecError("must be a mapping of sbatch options to values (e.g. account: myteam, exclusive: true)",
                            key=f"{where}.sbatch")
        pairs = []
        for k, v in extra.items():
            key = str(k)
            if not _SBATCH_KEY.match(key):
                raise SpecError("an sbatch option is a long option name without dashes, like 'qos' or "
                                "'gres_flags'", key=f"{where}.sbatch.{key}")
            if key in ("output", "error", "wrap", "array", "parsable"):
                raise SpecError(f"sbatch option {key!r} is set by the harness and cannot be overridden",
                                key=f"{where}.sbatch.{key}")
            if not isinstance(v, (str, int, float, bool)) or (isinstance(v, str) and ("\n" in v or "\0" in v)):
                raise SpecError(f"must be a single-line string, a number or true, got {v!r}",
                                key=f"{where}.sbatch.{key}")
            if v is False:
                continue  # an option switched off: leave it out
            pairs.append((key, v))
        return cls(partition=partition, gpus_per_boot=integer("gpus_per_boot", 0, 0),
                   cpus_per_boot=integer("cpus_per_boot", 1, 1), mem_gb=number("mem_gb", None, 0.001),
                   time_limit_min=integer("time_limit_min", 60, 1),
                   same_node=same_node, sbatch=tuple(sorted(pairs)), python=python,
                   poll_s=number("poll_s", 0.5, 0.05))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["sbatch"] = dict(self.sbatch)
        return d


# --------------------------------------------------------------------------- on the node


def node_boot(request: BootRequest, submitted_at: float) -> BootOutcome:
    """Run one boot on the Slurm node this job landed on (submitit calls this there).

    The device set is named after the node; GPUs and CPUs are the ones Slurm gave
    the job (``CUDA_VISIBLE_DEVICES``, the process's CPU affinity). The outcome comes
    back whole, with its samples (``run_boot``), and the job's times in
    ``evidence.slurm``."""
    from bisect_harness.backends.procedure import run_boot

    started = time.time()
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    job_id = os.environ.get("SLURM_JOB_ID")
    slot = request.devices.slot if request.devices is not None else 0
    request = request.with_devices(DeviceSet(slot=slot, gpus=_job_gpus(), cpus=_job_cpus(), node=node))
    outcome = run_boot(request)
    ended = time.time()
    slurm = {"job_id": job_id, "node": node, "submitted_at": submitted_at, "started_at": started,
             "ended_at": ended, "queued_s": round(started - submitted_at, 3), "boot_s": round(ended - started, 3)}
    return dataclasses.replace(outcome, evidence=outcome.evidence.with_(slurm=slurm),
                               host_fingerprint=node_fingerprint(outcome.host_fingerprint, node))


def node_fingerprint(host_fingerprint: str | None, node: str) -> str:
    """The host fingerprint with the Slurm node folded in: boots on two nodes are never
    the same host, even where several nodes share one machine."""
    return hashlib.sha256(f"{host_fingerprint}|slurm-node:{node}".encode()).hexdigest()[:16]


def _job_gpus() -> tuple[int, ...] | None:
    value = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if parts and all(p.isdigit() for p in parts):
        return tuple(int(p) for p in parts)
    return None


def _job_cpus() -> tuple[int, ...] | None:
    """The CPUs Slurm bound the job to, or None where it may use them all (nothing to pin)."""
    try:
        cpus = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return None
    return cpus if len(cpus) < (os.cpu_count() or 0) else None


# --------------------------------------------------------------------------- on the controller


@dataclass
class _Job:
    request: BootRequest
    job: Any                  # submitit.slurm.slurm.SlurmJob
    submitted_at: float
    slot: int
    pinned: str | None
    state: str = "PENDING"
    node: str | None = None
    reason: str | None = None
    missing_since: float | None = None  # when squeue first stopped listing it


class SlurmBackend(Backend):
    """Boot requests as Slurm jobs, at most ``slots`` queued or running at once (see the
    module doc). ``folder`` holds submitit's job files (pickles, batch scripts, logs);
    by default ``slurm-jobs`` beside each boot's log."""

    name = "slurm"

    def __init__(self, options: SlurmOptions | None = None, *, slots: int = 1,
                 folder: str | os.PathLike | None = None):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.options = options or SlurmOptions()
        self.slots = slots
        self._live: dict[str, _Job] = {}
        self.folder = Path(folder) if folder is not None else None
        self.node: str | None = None  # the node every job is pinned to (same_node with one slot)
        missing = [tool for tool in ("sbatch", "squeue", "scancel", "srun") if shutil.which(tool) is None]
        if missing:
            raise InfrastructureError(
                f"the Slurm backend needs {', '.join(missing)} on PATH: run the harness on a login node of "
                "the cluster (with SLURM_CONF set if the cluster's config is not in the default place), or "
                "use --backend local")

    def record(self) -> dict:
        """What the run records about its backend (``runs.host``)."""
        return {"name": self.name, "slots": self.slots, "options": self.options.to_dict(), "node": self.node}

    def close(self) -> None:
        """Cancel any job still in flight (``run`` cancels its own when interrupted)."""
        if self._live:
            self._cancel(self._live)

    # -- submission --------------------------------------------------------------

    def _folder_for(self, request: BootRequest) -> Path:
        return self.folder if self.folder is not None else Path(request.log_path).parent / "slurm-jobs"

    def _make_executor(self, folder: Path):
        import submitit

        # submitit writes the interpreter into the job's batch script: quote it
        return submitit.SlurmExecutor(folder=folder / "%j", python=shlex.quote(self.options.python),
                                      max_num_timeout=0)

    def _submit(self, request: BootRequest, slot: int) -> _Job:
        o = self.options
        folder = self._folder_for(request)
        folder.mkdir(parents=True, exist_ok=True)
        ex = self._make_executor(folder)
        extra: dict[str, Any] = {"no_requeue": True}  # a preempted boot is re-booted by the scheduler, not Slurm
        pinned = self.node if (o.same_node and self.slots == 1) else None
        if pinned:
            extra["nodelist"] = pinned
        extra.update(dict(o.sbatch))
        params: dict[str, Any] = {
            "job_name": f"bh-{request.boot_id}-{_safe(request.label)}"[:120],
            "time": o.time_limit_min, "nodes": 1, "ntasks_per_node": 1, "cpus_per_task": o.cpus_per_boot,
            "additional_parameters": extra,
            # the boot's own signal handling is the harness's; submitit's USR2 checkpointing is not used
            "signal_delay_s": 30,
        }
        if o.partition:
            params["partition"] = o.partition
        if o.gpus_per_boot:
            params["gpus_per_node"] = o.gpus_per_boot
        if o.mem_gb is not None:
            params["mem"] = f"{int(o.mem_gb * 1024)}MB"
        ex.update_parameters(**params)
        request = request.with_devices(DeviceSet(slot=slot, node=None))
        submitted = time.time()
        try:
            job = ex.submit(node_boot, request, submitted)
        except Exception as exc:  # submitit wraps sbatch's failure: say which and what to do
            raise InfrastructureError(f"sbatch refused boot {request.boot_id} ({request.label}): {exc}\n"
                                      "check the backend options (partition, gpus_per_boot, sbatch) against "
                                      "`sinfo` and `scontrol show partition`") from exc
        return _Job(request=request, job=job, submitted_at=submitted, slot=slot, pinned=pinned)

    # -- the loop ------------------------------------------------------------------

    def events(self, requests: Sequence[BootRequest]) -> Iterator[Event]:
        pending = list(requests)
        live = self._live
        try:
            while pending or live:
                free = sorted(set(range(self.slots)) - {j.slot for j in live.values()})
                while pending and free:
                    j = self._submit(pending.pop(0), free.pop(0))
                    live[j.job.job_id] = j
                    yield Message(f"boot {j.request.boot_id} ({j.request.label}): Slurm job {j.job.job_id}"
                                  + (f" pinned to {j.pinned}" if j.pinned else ""))
                self._poll(live)
                for job_id in list(live):
                    j = live[job_id]
                    outcome = self._outcome_if_done(j)
                    if outcome is None:
                        if j.state == "PENDING" and j.pinned and j.reason and \
                                any(r in j.reason for r in UNREACHABLE_REASONS) and not _node_usable(j.pinned):
                            # the pinned node is gone: unpin and let Slurm choose
                            yield Message(f"Slurm job {job_id} cannot start on {j.pinned} ({j.reason}); "
                                          "resubmitting without pinning the node")
                            self.node = None
                            j.job.cancel(check=False)
                            del live[job_id]
                            pending.insert(0, j.request)
                        continue
                    del live[job_id]
                    if outcome.ok and self.options.same_node and self.node is None:
                        self.node = j.node
                    yield from handed_back(j.request, outcome)  # its samples, once, then its end
                if live:
                    time.sleep(self.options.poll_s)
        except BaseException as exc:
            cut = self._cancel(live)
            if not isinstance(exc, GeneratorExit):  # else the caller let go: nothing can be handed back
                for request, outcome in cut:
                    yield Finished(request, outcome)
            raise

    def _cancel(self, live: dict[str, _Job]) -> list[tuple[BootRequest, BootOutcome]]:
        """Cancel every job still queued or running; each one's request and ``interrupted`` outcome."""
        from bisect_harness.model import utcnow

        for j in live.values():
            try:
                j.job.cancel(check=False)
            except Exception:  # noqa: BLE001 - cancel the others whatever one scancel says
                continue
        deadline = time.monotonic() + 15
        while live and time.monotonic() < deadline:  # until Slurm has taken them out of the queue
            states = _squeue(list(live))
            if states is not None and all(states.get(i, ("CANCELLED",))[0] in ENDED for i in live):
                break
            time.sleep(0.2)
        cut = []
        for job_id, j in live.items():
            out = BootOutcome(boot_id=j.request.boot_id, status=BootStatus.INTERRUPTED,
                              failure=f"the harness was interrupted; Slurm job {job_id} was cancelled",
                              log_tail=_tail(j.job), log_path=j.request.log_path,
                              evidence=BootEvidence(slurm=self._slurm_record(j, "CANCELLED")),
                              finished_at=utcnow())
            cut.append((j.request, out))
        live.clear()
        return cut

    # -- states and outcomes ----------------------------------------------------------

    def _poll(self, live: dict[str, _Job]) -> None:
        if not live:
            return
        states = _squeue(list(live))
        if states is None:
            return  # the controller did not answer: nothing learnt, nothing concluded
        now = time.monotonic()
        for job_id, j in live.items():
            if job_id in states:
                j.state, node, j.reason = states[job_id]
                j.node = node or j.node
                j.missing_since = None
            elif j.missing_since is None:
                j.missing_since = now
        lost = [i for i, j in live.items() if j.missing_since is not None and now - j.missing_since > 2
                and not j.job.paths.result_pickle.exists()]
        if lost:  # aged out of the controller's memory: ask accounting, where there is some
            for job_id, (state, node) in _sacct(lost).items():
                live[job_id].state, live[job_id].node = state, node or live[job_id].node

    def _outcome_if_done(self, j: _Job) -> BootOutcome | None:
        seen = time.time()
        if j.job.paths.result_pickle.exists():
            try:
                outcome = j.job.result()
            except Exception as exc:  # noqa: BLE001 - node_boot raised: the boot failed, with its trace
                return self._failed(j, f"the boot function raised on the node: {str(exc)[:2000]}")
            if not isinstance(outcome, BootOutcome):
                return self._failed(j, f"the job returned {type(outcome).__name__}, not a boot outcome")
            if not outcome.ok:
                self._settle(j)  # was it Slurm that stopped the boot? its final state says
            # node_boot's record of the job (every key it writes; none where the node wrote none)
            slurm = dict(outcome.evidence.slurm or {"node": None, "ended_at": seen})
            j.node = slurm["node"] or j.node
            state = j.state if j.state in ENDED else "COMPLETED"
            slurm.update(state=state, returned_s=round(seen - slurm["ended_at"], 3),
                         total_s=round(seen - j.submitted_at, 3))
            evidence = outcome.evidence.with_(slurm=slurm)
            if state in CUT_SHORT and not outcome.ok:
                # the boot failed because Slurm stopped it: a failed boot to re-run, never the config's fault
                return dataclasses.replace(
                    outcome, status=BootStatus.FAILED, evidence=evidence, config_failure=None, config_status=None,
                    failure=f"Slurm job {j.job.job_id} {state} on {j.node or '?'} during the boot"
                            + (f" ({outcome.failure})" if outcome.failure else ""))
            return dataclasses.replace(outcome, evidence=evidence)
        if j.state in ENDED:
            return self._failed(j, f"Slurm job {j.job.job_id} ended {j.state} on {j.node or 'no node'} "
                                   "before the boot reported"
                                + (f" (reason: {j.reason})" if j.reason and j.reason != "None" else ""))
        if j.missing_since is not None and time.monotonic() - j.missing_since > 30:
            return self._failed(j, f"Slurm job {j.job.job_id} is no longer known to the controller and left "
                                   "no outcome")
        return None

    def _settle(self, j: _Job, timeout_s: float = 10.0) -> None:
        """Wait (briefly: the boot has returned, the job is ending) for the job's final state."""
        deadline = time.monotonic() + timeout_s
        while j.state not in ENDED and time.monotonic() < deadline:
            state = (_squeue([j.job.job_id]) or {}).get(j.job.job_id)
            if state is not None:
                j.state, j.node, j.reason = state[0], state[1] or j.node, state[2]
            if j.state not in ENDED:
                time.sleep(0.2)

    def _slurm_record(self, j: _Job, state: str) -> dict:
        return {"job_id": j.job.job_id, "node": j.node, "state": state, "queued_s": None,
                "total_s": round(time.time() - j.submitted_at, 3)}

    def _failed(self, j: _Job, failure: str) -> BootOutcome:
        from bisect_harness.model import utcnow

        devices = DeviceSet(slot=j.slot, node=j.node).to_dict()
        return BootOutcome(boot_id=j.request.boot_id, status=BootStatus.FAILED, failure=failure,
                           log_tail=_tail(j.job), log_path=j.request.log_path,
                           evidence=BootEvidence(slurm=self._slurm_record(j, j.state), devices=devices),
                           finished_at=utcnow())


def _safe(label: str) -> str:
    return re.sub(r"[^\w.-]+", "_", label)


def _tail(job, lines: int = 40) -> str | None:
    """The last lines of the job's stderr (submitit's log), or None before it exists."""
    try:
        text = job.paths.stderr.read_text(errors="replace")
    except OSError:
        return None
    return "\n".join(text.splitlines()[-lines:]) or None


def _node_usable(node: str) -> bool:
    """Whether ``node`` can still run jobs (not down, drained, failing or gone); a
    controller that does not answer leaves it usable."""
    try:
        out = subprocess.run(["sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return True
    if out.returncode != 0:
        return "Invalid node name" not in out.stderr
    states = out.stdout.split()
    bad = ("down", "drain", "fail", "maint", "reboot", "unknown", "future", "power")
    return bool(states) and not all(any(b in st.lower() for b in bad) or st.endswith("*") for st in states)


def _squeue(job_ids: Sequence[str]) -> dict[str, tuple[str, str | None, str | None]] | None:
    """``{job id: (state, node, reason)}`` for the jobs the controller still holds; None
    when the controller did not answer."""
    if not job_ids:
        return {}
    try:
        out = subprocess.run(["squeue", "--noheader", "--states=all", "--jobs=" + ",".join(job_ids),
                              "--format=%i|%T|%N|%r"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        # every id unknown (aged out of the controller's memory) is an answer; anything else is not
        return {} if "Invalid job id" in out.stderr else None
    states = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] in job_ids:
            states[parts[0]] = (parts[1], parts[2] or None, parts[3] or None)
    return states


def _sacct(job_ids: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    """Final states from accounting, ``{}`` where the cluster keeps none."""
    try:
        out = subprocess.run(["sacct", "--noheader", "--parsable2", "--format=JobID,State,NodeList",
                              "--jobs=" + ",".join(job_ids)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states = {}
    for line in out.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] in job_ids:
            states[parts[0]] = (parts[1].split()[0], parts[2] or None)  # "CANCELLED by 0" -> CANCELLED
    return states


def _check(options: Mapping[str, Any], where: str) -> None:
    SlurmOptions.from_mapping(options, where)


def _make(options: Mapping[str, Any], *, slots: int, log_dir: Path) -> SlurmBackend:
    return SlurmBackend(SlurmOptions.from_mapping(options, "backend"), slots=slots, folder=log_dir / "slurm")


BACKENDS.add(BackendKind(name="slurm", summary="jobs on a cluster; see docs/slurm.md", check=_check, make=_make))
