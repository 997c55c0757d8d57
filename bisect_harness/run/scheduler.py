"""The scheduler of boots: runs, config states, the one measuring call, recording.

``harness run`` (the hypothesis loop in ``executor``), ``harness bisect``,
``harness explain`` and ``harness nightly`` all boot through one
:class:`Scheduler`, and all of them through one call, :meth:`Scheduler.measure`:

    sched = Scheduler(plan, ledger, log_dir=..., backend=LocalBackend(slots=2))
    with sched.recording("run"):                    # the run row; interrupted/failed on the way out
        st = sched.state_for(config)                 # a config row, made once per run
        m, = sched.measure([st], 3, metric="tok_s")  # 3 more usable boots: values, boot ids, failures
        sched.measure([st_a, st_b], 1, budget=10)    # one usable boot each, at once where slots allow
    sched.finish_run("done")

The plan hands the scheduler each config's recipe once, when its state is made
(``plan.recipe``: series, launch, the boot request less the boot's id); a boot
goes out as that frozen request (``BootRequest.for_boot``) to the backend and
comes back as a frozen outcome; the scheduler alone writes the ledger: the boot
row before the boot starts (its id names the log), each sample the moment the
backend hands it back, the outcome when it ends. The backend hands back events
and ``boot.deliver`` hands each to the scheduler's recorder (a ``boot.Sink``) the
moment it comes: nothing below calls up into it.

The failure policy, decided here once for every command (``docs/design.md``):

* A boot that **fails** is booted again before it counts against its config.
  A config is **unmeasurable** when its recipe fails (the build, a refused flag:
  the same recipe fails the same way, so it is never retried), when its first
  ``boot_retries + 1`` boots all fail, or, once it has booted ok (so it is known
  to boot), when ``MEASURED_FAILURES_IN_A_ROW * (boot_retries + 1)`` boots in a
  row fail. A transient failure of a measured config (out of memory, a port in
  use, an NCCL timeout) therefore never ends a search.
* A boot **left out** by a boot check (a busy host under ``host_check: retry``,
  env that did not reach the workers under ``env_check: exclude``) is booted
  again, up to as many extra boots as were asked for in the call.
* One call books at most ``budget`` boots (failed and left-out ones included),
  so a caller's budget bounds every loop; a config of the hypothesis loop that
  cannot reach its usable boots within ``cap`` boots is unmeasurable.
* Every call returns one :class:`Measurement` per config asked for: the boot
  means of the metric, the boot ids, what failed, what was left out, and why
  the config is unmeasurable if it is. Callers decide from that alone.
"""

from __future__ import annotations

import dataclasses

import contextlib
import hashlib
import random
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from bisect_harness import __version__
from bisect_harness.engines import attach
from bisect_harness.decide import allocation
from bisect_harness.observe import calibration, contention, provenance
from bisect_harness.observe import host_state
from bisect_harness.record import liveness, runlock
from bisect_harness.run import resume
from bisect_harness.run.busy_host import BusyHost
from bisect_harness.run.preflight import Preflight
from bisect_harness.backends import Backend
from bisect_harness.boot import BootOutcome, BootRequest, BootValues, SampleOutcome, Sink, deliver
from bisect_harness.backends.local import LocalBackend
from bisect_harness.backends.procedure import this_host
from bisect_harness.errors import HarnessError, InfrastructureError, UserError
from bisect_harness.evidence import BootStatus, HarnessProcess, ResumeRecord, RunHost
from bisect_harness.record.ledger import Boot, Calibration, Config, Ledger, Run, SampleRow, boot_records, utcnow
from bisect_harness.model import Arm
from bisect_harness.plan.build import ConfigRecipe, Plan, PlannedConfig

__all__ = ["Observer", "ConfigState", "Measurement", "Scheduler", "MEASURED_FAILURES_IN_A_ROW", "PROFILE_ATTEMPTS"]

#: a config of ``profile: true`` stops asking for its profile after this many profiles failed
PROFILE_ATTEMPTS = 2

#: a config that has booted ok is unmeasurable only after this many times
#: ``boot_retries + 1`` failed boots in a row (at 10% random failures and one
#: retry, six in a row happen once in a million tries)
MEASURED_FAILURES_IN_A_ROW = 3


class Observer:
    """Progress callbacks; the CLI renders them, tests ignore them."""

    def run_started(self, run: Run, plan: Plan) -> None: ...
    def boot_started(self, config: PlannedConfig, attempt: int, samples: int) -> None: ...
    def sample_done(self, config: PlannedConfig, index: int, metrics: Mapping[str, float]) -> None: ...
    def boot_finished(self, config: PlannedConfig, boot: Boot) -> None: ...
    def verdict(self, hypothesis, verdict) -> None: ...
    def message(self, text: str) -> None: ...
    def search_step(self, text: str) -> None: ...  # a search's state after a step (progress, not a record)
    # boots from here on count against ``budget``; its configs are told apart from ``reference`` (an Arm)
    def search_started(self, name: str, budget: int | None, reference: Arm | None = None) -> None: ...


@dataclass
class ConfigState:
    row: Config
    planned: PlannedConfig
    recipe: ConfigRecipe
    failed: str | None = None
    boots: list[Boot] = field(default_factory=list)
    consecutive_failures: int = 0
    # --resume: boots recorded before the interruption that do not count (cut short, or
    # another host); kept for the journal and the numbering, never for a verdict or the cap.
    not_counted: list[Boot] = field(default_factory=list)

    @property
    def good_boots(self) -> list[Boot]:
        return [b for b in self.boots if b.status == BootStatus.OK]

    @property
    def wants_profile(self) -> bool:
        """Whether this config's next boot takes the profiled sample: its recipe asks for
        one (``profile: true``, ``--profile``) and none of its boots has it yet. A boot
        records its profile in ``evidence.profile``; the config has it once an ok
        boot's profile was taken or a boot found the engine has no profiler, or after
        :data:`PROFILE_ATTEMPTS` failed profiles. A profiled boot that failed (or was left
        out) before its profile records none: the next boot is profiled. Read from the
        boots themselves, so a resumed run goes on where the interrupted one was."""
        if not self.recipe.profile:
            return False
        failed = 0
        for boot in [*self.boots, *self.not_counted]:
            state = boot.evidence.profile_state
            if state == "no_profiler" or (state == "taken" and boot.status == BootStatus.OK):
                return False
            failed += state == "failed"
        return failed < PROFILE_ATTEMPTS

    def failures_allowed(self, boot_retries: int) -> int:
        """Failed boots in a row that make this config unmeasurable (the policy above)."""
        tries = boot_retries + 1
        return tries * MEASURED_FAILURES_IN_A_ROW if self.good_boots else tries


@dataclass
class Measurement:
    """What one :meth:`Scheduler.measure` call got for one config.

    ``values`` holds one float per usable boot of this call (the mean of its
    samples of ``metric``), in boot order, beside its ``boot_ids``; ``failed_ids``
    and ``left_out_ids`` are this call's boots that failed or that a boot check
    left out; ``unmeasurable`` says why the config cannot be measured (after its
    retries), else None; ``short`` is set when the call stopped below the
    asked-for boots for another reason (its budget, or its spare boots spent).
    ``samples`` holds each usable boot's samples behind its value (a search's: its quiet
    ones, ``defaults.search_samples``; ``busy_samples`` counts those left out, and
    ``whole_busy_ids`` names the boots busy throughout that counted whole because the
    host is busy all the time, :mod:`~bisect_harness.run.busy_host`)."""

    key: str
    asked: int
    values: list[float] = field(default_factory=list)
    samples: list[tuple[float, ...]] = field(default_factory=list)
    boot_ids: list[int] = field(default_factory=list)
    failed_ids: list[int] = field(default_factory=list)
    left_out_ids: list[int] = field(default_factory=list)
    unmeasurable: str | None = None
    short: str | None = None
    busy_samples: int = 0  # samples of this call's ok boots left out as busy (search_samples: quiet)
    whole_busy_ids: list[int] = field(default_factory=list)  # boots busy throughout counted whole (busy_host)

    @property
    def booted(self) -> int:
        """Boots this call booted for this config (usable, failed and left out)."""
        return len(self.boot_ids) + len(self.failed_ids) + len(self.left_out_ids)

    @property
    def usable(self) -> int:
        return len(self.boot_ids)


class Scheduler:
    """Boots configs of a plan through a backend and records everything in a ledger."""

    def __init__(self, plan: Plan, ledger: Ledger, *, log_dir: Path, observer: Observer | None = None,
                 calibrate: bool = True, order_seed: int | None = None, wait_quiet_s: float | None = None,
                 backend: Backend | None = None):
        self.plan = plan
        self.spec = plan.spec
        self.ledger = ledger
        self.log_dir = Path(log_dir)
        self.obs = observer or Observer()
        self.calibrate = calibrate
        self.backend: Backend = backend or LocalBackend()
        self.ws = plan.ws
        self.run: Run | None = None
        self.states: dict[str, ConfigState] = {}
        self.host: dict = {}
        self.host_fp: str | None = None
        # The order inside each round; stored with verdicts, so a run's order can be replayed.
        self.order_seed = secrets.randbits(32) if order_seed is None else int(order_seed)
        self._order = random.Random(self.order_seed)
        self.wait_quiet_s = wait_quiet_s  # --wait-quiet: wait up to this long for a quiet host first
        # --resume: the interrupted run's config rows by key, with their boots (counted, not counted here)
        self.earlier_configs: dict[str, tuple[Config, list[Boot], list[Boot]]] = {}
        self.resumed = False
        self._resume_record: ResumeRecord | None = None
        self.lock = runlock.RunLock()  # held from the run's row to its end (``runlock``)
        self._busy_before_next = False    # host_check retry: the last boot was busy; wait before the next
        self.busy_host = BusyHost()       # a host busy all the time: a search stops booting again (busy_host)
        # the host watched at the run's start (run.preflight): begun when the run opens
        self.preflight = Preflight(self.spec.defaults, wait_quiet_s, self.obs.message, self._add_preflight)
        # samples each boot takes from now on: the hypothesis loop sets it round by round
        # (decide.allocation); None: defaults.samples_per_boot
        self.samples_per_boot: int | None = None

    # ------------------------------------------------------------------ the run

    def _take_host(self) -> None:
        """Before a run's first row: the engine's key variable is set (an unset one stops
        the run before any boot), and this host's description and fingerprint."""
        attach.api_key(self.spec.engine.api_key_env)
        host, self.host_fp = this_host()
        self.host = dict(host)
        #: this host's name, as its description says it (``HostInfo.hostname``)
        self.host_name: str | None = provenance.HostInfo.from_dict(host).hostname if host else None

    def start_run(self, kind: str = "run") -> Run:
        """Write a new run row, held by this process (``runlock``), and open it."""
        self._claim(kind)
        self._open()
        return self.run

    def continue_run(self, run: Run) -> Run:
        """Take up the interrupted ``run`` again in the same row (``harness run --resume``):
        its config rows with the boots that count on this host (``resume.split_boots``),
        the order seed it used (the round order continues on a stream derived from it),
        and a resume record in ``runs.host``. The caller has checked the run fits the plan
        (``resume.check_plan``)."""
        self._claim("run", run)
        self._open()
        return run

    def _claim(self, kind: str, earlier: Run | None = None) -> None:
        """The run row, held by this process until :meth:`finish_run`: a new one, or the
        interrupted ``earlier`` taken up (refused, naming the holder, when another live
        harness holds it). Nothing is booted or written beyond the row."""
        spec = self.spec
        self._take_host()
        if earlier is None:
            host = RunHost(machine=self.host, owner=HarnessProcess.from_json(liveness.owner_record()),
                           backend=self.backend_record(), order_seed=self.order_seed)
            self.run, self.lock = self.ledger.add_run(Run(
                kind=kind, spec_path=str(spec.path), spec_text=spec.text,
                spec_hash=hashlib.sha256(spec.text.encode()).hexdigest(), harness_version=__version__,
                host=host.to_json()))
            return
        taken = resume.take_up(self.ledger, earlier, host_fingerprint=self.host_fp,
                               hostname=self.host_name, order_seed=self.order_seed,
                               backend=self.backend_record())
        self.run, self.resumed, self.lock = earlier, True, taken.lock
        self.order_seed = taken.order_seed
        # Replica configs of an A/A check are adopted when the check asks for them; their boots count alike.
        self.earlier_configs = dict(taken.configs)
        self._order = random.Random(taken.record.order_stream)
        self._resume_record = taken.record

    def _open(self) -> None:
        """After the row is held: the run's log folder, a state per planned config, the
        preflight window. A failure here ends the run (``recording``)."""
        self.log_dir = self.log_dir / f"run-{self.run.id}"
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InfrastructureError(
                f"cannot make the log folder {self.log_dir}: {exc.strerror or exc}; the journal folder must be a "
                "writable folder with free space (pass --journal-dir with one)") from None
        for pc in self.plan.configs:
            self.state_for(pc)
        if self.resumed:
            rec = self._resume_record
            self.ledger.commit()
            self.obs.message(f"resuming run {self.run.id} ({rec.previous_status}): "
                             f"{len(rec.counted_ok_boot_ids)} ok boots from before count, "
                             f"{len(rec.other_host_ok_boot_ids)} ran on another host and do not, "
                             f"{len(rec.cut_short_boot_ids)} were cut short")
        self.preflight.begin()

    def _add_preflight(self, result: dict) -> None:
        self.ledger.add(Calibration(run_id=self.run.id, phase="preflight", host_fingerprint=self.host_fp,
                                    host=self.host, result=result))

    def backend_record(self) -> dict:
        """Which backend booted this run's boots, and how many at once (``runs.host``)."""
        record = {"name": getattr(self.backend, "name", type(self.backend).__name__),
                  "slots": getattr(self.backend, "slots", 1)}
        sets = getattr(self.backend, "sets", None)
        if sets:
            record["device_sets"] = [s.to_dict() for s in sets]
        own = getattr(self.backend, "record", None)  # a backend's own description (Slurm: options, node)
        if callable(own):
            record.update(own())
        return record

    def finish_run(self, status: str = "done", error: str | None = None) -> None:
        """Record the run's end and let go of it. Where the ledger refuses the write, the
        run's lock is left behind free, so the next open marks the row ``interrupted``
        (``runlock``), and the error says so."""
        if self.run is None:
            return
        ended = False
        try:
            self.preflight.end(cut_short=status != "done")  # a run that ended before its first batch did
            self.run.status = status
            self.run.error = error
            self.run.finished_at = utcnow()
            self.ledger.commit()
            ended = True
        except InfrastructureError as exc:
            then = (f"`harness run FILE --resume {self.run.id}` continues it" if self.run.kind == "run" else
                    f"`harness {self.run.kind}` run again reuses its boots")
            raise InfrastructureError(
                f"{exc}. Run {self.run.id} could not be marked {status}; the next harness to open the ledger marks "
                f"it interrupted, and {then}") from None
        finally:
            self.lock.release(ended=ended)
        if self.resumed:  # rows read before the resume hold lists of boots and looks that grew since
            self.ledger.session.expire_all()

    @contextlib.contextmanager
    def recording(self, kind: str, resume: Run | None = None, *, calibrated: bool = False,
                  finish: str | None = None) -> Iterator[Run]:
        """Start a run of ``kind`` (or continue ``resume``); if the body raises, the run
        row says how it ended (``interrupted`` or ``failed``, with the error) before the
        error goes on. On success the run is finished with status ``finish``, or, without
        one, by the caller with its own status. ``calibrated``: the observer is told the
        run started and the calibration probe runs before the body (phase ``before``, or
        ``resume``) and after it. The run is held by this process from its row to its
        end (``runlock``): a run another live harness holds is refused before anything
        is written."""
        self._claim(kind, resume)
        try:
            self._open()
            run = self.run
            if calibrated:
                self.obs.run_started(run, self.plan)
                self.record_calibration("before" if resume is None else "resume")
            yield run
            if calibrated:
                self.record_calibration("after")
        except (KeyboardInterrupt, SystemExit) as exc:
            why = "interrupted by the user" if isinstance(exc, KeyboardInterrupt) else f"stopped by a signal ({exc})"
            self._finish_failed("interrupted", why, exc)
            raise
        except Exception as exc:
            self._finish_failed("failed", str(exc) if isinstance(exc, HarnessError) else
                                f"{type(exc).__name__}: {exc}", exc)
            raise
        if finish is not None:
            self.finish_run(finish)

    def _finish_failed(self, status: str, why: str, exc: BaseException) -> None:
        """Record how the run ended after ``exc``. When the ledger refuses that write too,
        a harness error goes on as one error saying both (exit 3); any other ``exc`` (an
        interrupt, a bug) goes on as it was."""
        try:
            self.finish_run(status, why)
        except InfrastructureError as second:
            if isinstance(exc, HarnessError):
                first = str(exc)
                said = str(second)
                raise InfrastructureError(said if said.startswith(first) else f"{first}; {said}") from None

    def record_calibration(self, phase: str) -> dict | None:
        if not self.calibrate:
            return None
        try:
            cal = calibration.calibrate(seconds_budget=2.0).to_dict()
        except Exception as exc:  # a probe that fails must not lose the run; record why
            cal = {"error": f"{type(exc).__name__}: {exc}"}
        limit = self.spec.defaults.host_thresholds.calibration_spread
        noisy = host_state.calibration_spreads(cal, limit)
        cal["judged"] = {"spread_limit": limit, "noisy": noisy}
        for sentence in noisy:
            self.obs.message(f"calibration ({phase}): {sentence}")
        self.ledger.add(Calibration(run_id=self.run.id, phase=phase, host_fingerprint=self.host_fp,
                                    host=self.host, result=cal))
        return cal

    # ------------------------------------------------------------------ configs

    def cost_model(self) -> allocation.CostModel | None:
        """What a boot and a sample cost: as the file states them, else measured from
        this run's finished boots (None before one finished with a sample)."""
        d = self.spec.defaults
        if d.boot_cost_s is not None and d.sample_cost_s is not None:
            return allocation.CostModel(d.boot_cost_s, d.sample_cost_s, "stated")
        return allocation.measured_cost([boot_seconds(b) for st in self.states.values() for b in st.boots])

    def state_for(self, pc: PlannedConfig) -> ConfigState:
        st = self.states.get(pc.key)
        if st is not None:
            return st
        recipe = self.plan.recipe(pc)  # the one time the scheduler asks the plan about this config
        if pc.key in self.earlier_configs:  # --resume: the interrupted run's row, its boots split once
            row, counted, not_counted = self.earlier_configs.pop(pc.key)
            failed = (row.failure or row.status) if row.status not in ("pending", "ok") else None
            st = self.states[pc.key] = ConfigState(row=row, planned=pc, recipe=recipe, boots=counted,
                                                   not_counted=not_counted, failed=failed)
            for boot in reversed(counted):  # failures in a row at the end carry over to the retry limit
                if boot.status != BootStatus.FAILED:
                    break
                st.consecutive_failures += 1
        else:
            row = self.ledger.add(Config(run_id=self.run.id, key=pc.key, series=recipe.series,
                                         label=pc.label, commit=pc.arm.commit,
                                         env=dict(pc.arm.env), flags=dict(pc.arm.flags), argv=list(recipe.argv)))
            st = self.states[pc.key] = ConfigState(row=row, planned=pc, recipe=recipe)
        return st

    def retries(self, boot: Boot) -> bool:
        """Whether ``boot`` was left out as busy under ``host_check: retry`` (so it is re-booted)."""
        return (self.spec.defaults.host_check == "retry" and boot.status == BootStatus.EXCLUDED
                and contention.HOST_BUSY in (boot.marks or []))

    # ------------------------------------------------------------------ boots

    def measure(self, states: Sequence[ConfigState], n: int | Sequence[int] = 1, *, metric: str | None = None,
                budget: int | None = None, shuffle: bool = False, cap: int | None = None,
                point: str | None = None) -> list[Measurement]:
        """Boot each config until it has ``n`` more usable boots (``n`` may be one per
        config), under the failure policy of this module; the one loop of boots that
        every command uses.

        One boot of each config per pass, in the order given (``shuffle``: a seeded
        random order per pass, ``order_seed``), a pass's boots at once where the
        backend has slots. ``metric`` names the metric whose boot means fill
        ``values`` (a usable boot without it is left out), read at load point
        ``point`` (its label; None: the benchmark's one point). ``budget`` caps the boots
        of this call; ``cap`` caps a config's boots in the run (the hypothesis
        loop's ``max_boots_per_arm + boot_retries + 1``): a config that reaches it
        short of its usable boots is unmeasurable. Never raises for a failed boot;
        raises the error of a check set to ``fatal`` once every boot in flight has
        reported."""
        want = [int(n)] * len(states) if isinstance(n, int) else [int(x) for x in n]
        if len(want) != len(states):
            raise ValueError(f"measure: {len(states)} configs but {len(want)} boot counts")
        out = [Measurement(st.planned.key, w) for st, w in zip(states, want)]
        booked = 0
        while True:
            todo: list[int] = []
            for k, (st, m) in enumerate(zip(states, out)):
                if st.failed is not None:
                    m.unmeasurable = m.unmeasurable or st.failed
                    continue
                if m.usable >= want[k]:
                    continue
                if cap is not None and len(st.boots) >= cap:
                    self._fail(st, f"only {len(st.good_boots)} usable boots of {len(st.boots)} "
                                   "(the others failed or were excluded by a boot check)")
                    m.unmeasurable = st.failed
                    continue
                if len(m.left_out_ids) > want[k]:  # a left-out boot is booted again, as many extra as asked
                    m.short = f"{len(m.left_out_ids)} boots left out by a boot check"
                    continue
                if any(states[j] is st for j in todo):
                    continue  # one boot of a config per pass, even when it is asked for twice
                todo.append(k)
            if budget is not None:
                todo = todo[:max(0, budget - booked)]
            if not todo:
                break
            if shuffle:
                self._order.shuffle(todo)  # a random order inside each pass (seeded: order_seed)
            slots = max(1, self.backend.slots)
            for start in range(0, len(todo), slots):
                batch = [k for k in todo[start:start + slots] if states[k].failed is None]
                if not batch:
                    continue
                self._wait_if_busy()
                for k, boot in zip(batch, self._run_batch([states[k] for k in batch])):
                    booked += 1
                    self._count(out[k], boot, metric, point)
        for k, m in enumerate(out):
            if m.usable < want[k] and m.unmeasurable is None and m.short is None:
                m.short = f"the call's budget of {budget} boots was spent"
        return out

    def _count(self, m: Measurement, boot: Boot, metric: str | None, point: str | None = None) -> None:
        """File one finished boot under its measurement (its values of ``metric`` at ``point``)."""
        if boot.status == BootStatus.OK:
            if metric is None:
                m.boot_ids.append(boot.id)
                return
            values = self._values(m, boot, metric, point)
            if values:
                m.boot_ids.append(boot.id)
                m.values.append(BootValues((boot.id,), (values,)).means()[0])
                m.samples.append(values)
                return
            m.left_out_ids.append(boot.id)  # ok, yet no (quiet) sample of the metric: not usable
        elif boot.status == BootStatus.FAILED:
            m.failed_ids.append(boot.id)
        else:
            m.left_out_ids.append(boot.id)

    def _values(self, m: Measurement, boot: Boot, metric: str, point: str | None = None) -> tuple[float, ...]:
        """The values of ``metric`` at load point ``point`` an ok boot gives a search
        (``BootRecord.values``, the one reduction): its quiet samples
        (``defaults.search_samples``), so a burst that covered
        a sample costs that sample, and only a boot busy throughout is booted again, unless
        the host is busy all the time (``busy_host``): then such a boot counts whole. The
        samples left out as busy are counted on ``m``."""
        (record,) = boot_records([boot])
        if self.spec.defaults.search_samples != "quiet":
            return record.values(metric, point=point)
        values = record.values(metric, quiet=True, point=point)
        busy = len(record.values(metric, point=point)) - len(values)
        if busy or values:
            if said := self.busy_host.observe(boot.id, not values):
                self.obs.message(said)
            if not values and self.busy_host.all_the_time:
                values, busy = record.values(metric, point=point), 0
                m.whole_busy_ids.append(boot.id)
        m.busy_samples += busy
        return values

    def boot_round(self, states: Sequence[ConfigState], target: int) -> list[Measurement]:
        """Boot each config up to ``target`` usable boots in all (the hypothesis loop's
        rounds), in a seeded random order per pass, within the run's cap per config."""
        d = self.spec.defaults
        return self.measure(states, [max(0, target - len(st.good_boots)) for st in states], shuffle=True,
                            cap=d.boots_per_config)

    def boot(self, st: ConfigState) -> Boot:
        """One boot of one config (build once, boot, verify, sample, tear down)."""
        return self.boot_many([st])[0]

    def boot_many(self, states: Sequence[ConfigState]) -> list[Boot]:
        """One boot of each state (a state may appear more than once), ``backend.slots``
        at a time, in the order given, whatever becomes of them (no retries: that
        is :meth:`measure`'s). A state marked failed on the way is not booted again."""
        out: list[Boot] = []
        pending = [s for s in states]
        while pending:
            batch, pending = pending[:max(1, self.backend.slots)], pending[max(1, self.backend.slots):]
            batch = [s for s in batch if s.failed is None]
            if not batch:
                continue
            self._wait_if_busy()
            out += self._run_batch(batch)
        return out

    def _run_batch(self, batch: Sequence[ConfigState]) -> list[Boot]:
        """Boot one batch at once: a row and a request per state, every event recorded the
        moment the backend hands it back (``boot.deliver`` drives the recorder; an
        exception of the recorder, an interrupt, goes back into the boots)."""
        self.preflight.start()
        recorder = _Recorder(self)
        requests = [self._request(st, recorder) for st in batch]
        self.ledger.commit()
        try:
            deliver(self.backend.events(requests), recorder)
        finally:
            recorder.close_unreported()  # boots that never reported (never started) say so
            self.ledger.commit()
        self.preflight.end()  # its window ran beside this batch, the run's first
        recorder.raise_fatal()
        return [recorder.boots[r.boot_id][0] for r in requests]

    def _request(self, st: ConfigState, recorder: "_Recorder") -> BootRequest:
        """The next boot of ``st``: its row (numbered after every boot the config has, counted
        or not), its log, and its request, expected by ``recorder``."""
        pc = st.planned
        seq = len(st.boots) + len(st.not_counted) + 1
        profile = st.wants_profile  # asked before this boot's row joins the config's boots
        samples = self.samples_per_boot or self.spec.defaults.samples_per_boot
        self.obs.boot_started(pc, seq, samples)
        boot = self.ledger.add(Boot(run_id=self.run.id, config_id=st.row.id, config_key=pc.key, seq=seq,
                                    host_fingerprint=self.host_fp))
        st.boots.append(boot)
        log_path = self.log_dir / f"boot-{boot.id}.log"
        boot.log_path = str(log_path)
        req = st.recipe.request.for_boot(boot_id=boot.id, seq=seq, log_path=log_path)
        if req.samples != samples:
            req = dataclasses.replace(req, samples=samples)
        if profile:
            req = req.profiled()
        recorder.expect(req, boot, st)
        return req

    def _fail(self, st: ConfigState, why: str, status: str = "boot_failed") -> None:
        st.failed = st.failed or why
        if st.row.status == "pending":
            st.row.status, st.row.failure = status, st.failed
        self.ledger.commit()

    def _wait_if_busy(self) -> None:
        """host_check retry: before the boot after a busy one, wait for a quiet host
        (up to ``defaults.host_wait_s``); the re-boot itself comes later in the round."""
        if not self._busy_before_next:
            return
        self._busy_before_next = False
        d = self.spec.defaults
        if d.host_wait_s <= 0:
            return
        quiet, window = contention.wait_quiet(d.host_thresholds, timeout_s=d.host_wait_s,
                                              window_s=max(1.0, d.host_preflight_s), say=self.obs.message)
        if not quiet:
            self.obs.message(f"host still busy after {d.host_wait_s:.0f} s; booting anyway "
                             f"({contention.summary_line(window)})")


def boot_seconds(boot) -> tuple[float, float, int]:
    """One boot as the cost model reads it: (node seconds from its row to its end,
    seconds of its samples together, samples taken); (0, 0, 0) while it runs."""
    if boot.finished_at is None or boot.started_at is None:
        return 0.0, 0.0, 0
    samples = list(boot.samples or ())
    return (max(0.0, (boot.finished_at - boot.started_at).total_seconds()),
            float(sum(s.duration_s or 0.0 for s in samples)), len(samples))


class _Recorder(Sink):
    """A backend's events, written to the ledger on the scheduler's thread as
    ``boot.deliver`` hands them over: each sample the moment it comes (every backend
    hands each sample back once, as a ``Sampled`` event), the outcome at the end."""

    def __init__(self, sched: Scheduler):
        self.sched = sched
        self.ledger = sched.ledger
        self.boots: dict[int, tuple[Boot, ConfigState]] = {}
        self.reported: set[int] = set()
        self.fatal: list[BootOutcome] = []

    def expect(self, req: BootRequest, boot: Boot, st: ConfigState) -> None:
        self.boots[req.boot_id] = (boot, st)

    def message(self, text: str) -> None:
        self.sched.obs.message(text)

    def started(self, req: BootRequest, port, argv, log_path) -> None:
        boot, _ = self.boots[req.boot_id]
        boot.port, boot.argv, boot.log_path = port, list(argv), log_path
        self.ledger.commit()

    def sample(self, req: BootRequest, s: SampleOutcome) -> None:
        boot, st = self.boots[req.boot_id]
        self.ledger.add(SampleRow(boot_id=boot.id, seq=s.seq, metrics=dict(s.metrics), requests=s.requests,
                                  output_tokens=s.output_tokens, duration_s=s.duration_s, errors=s.errors,
                                  point=s.point))
        self.sched.obs.sample_done(st.planned, s.seq, dict(s.metrics))

    def finished(self, req: BootRequest, out: BootOutcome) -> None:
        boot, st = self.boots[req.boot_id]
        self.reported.add(req.boot_id)
        boot.status, boot.failure = out.status.value, out.failure
        boot.log_tail, boot.log_path = out.log_tail, out.log_path or boot.log_path
        if out.port is not None:
            boot.port = out.port
        if out.argv:
            boot.argv = list(out.argv)
        boot.ready_s = out.ready_s
        boot.host_fingerprint = out.host_fingerprint or boot.host_fingerprint
        boot.provenance = out.evidence.to_json()
        boot.env_report = dict(out.env_report) if out.env_report is not None else None
        boot.flag_report = dict(out.flag_report) if out.flag_report is not None else None
        boot.server_info = dict(out.server_info) if out.server_info is not None else None
        boot.marks, boot.source_problems = list(out.marks), list(out.source_problems)
        boot.finished_at = out.finished_at or utcnow()
        if out.status is BootStatus.OK:
            st.consecutive_failures = 0
        elif out.status is BootStatus.FAILED:
            st.consecutive_failures += 1
        if out.busy:
            self.sched._busy_before_next = True
        if out.config_failure:  # the same recipe fails the same way at this commit: not retried
            st.failed = st.failed or out.config_failure
            st.row.status, st.row.failure = out.config_status or "boot_failed", st.failed
            if out.config_status == "build_failed":
                st.row.log_tail = out.log_tail
        elif st.failed is None and st.consecutive_failures >= st.failures_allowed(self.sched.spec.defaults.boot_retries):
            self.sched._fail(st, f"{st.consecutive_failures} boots in a row failed")
        if out.fatal:
            self.fatal.append(out)
        self.ledger.commit()
        self.sched.obs.boot_finished(st.planned, boot)

    def close_unreported(self) -> None:
        for boot_id, (boot, st) in self.boots.items():
            if boot_id not in self.reported and boot.status == BootStatus.RUNNING:
                boot.status, boot.failure = BootStatus.INTERRUPTED.value, "the run stopped before this boot started"
                boot.finished_at = utcnow()

    def raise_fatal(self) -> None:
        for out in self.fatal:
            if out.fatal == "infrastructure":
                raise InfrastructureError(out.failure)
            raise UserError(out.failure or "a boot check failed")
