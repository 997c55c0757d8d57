"""The local executor: boots configs, measures, records, decides.

One boot at a time. Boots of the configs still in question are interleaved
(A B A B ...), round after round, so slow drift of the host lands on both sides;
the order inside each round is shuffled by a seeded generator (``order_seed``,
stored with every verdict; the order itself is the boots' ids in the ledger), so
no config always boots first. A round is a block: with ``defaults.analysis:
paired`` a hypothesis is judged on the per-round ratios of its two configs (the
i-th good boot of each config is round i). After each round every undecided
hypothesis is looked at again by the sequential test in ``stats`` and stops
asking for boots once decided or out of budget.

Everything measured goes to the ledger the moment it exists. A config that
cannot be built or booted is recorded with its log tail and its hypotheses end
inconclusive; the run goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import math
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import httpx

from . import (__version__, attach, benchtools, calibration, client, contention, engine_flags, engine_identity,
               host_state, liveness, presets, provenance, sources, stats)
from .checkout import Workspace, read_tail
from .errors import BootFailed, BuildFailed, ConfigFailure, FlagNotAccepted, HarnessError, InfrastructureError, UserError
from .ledger import Boot, Calibration, Config, HypothesisRow, Ledger, Run, SampleRow, VerdictRow, utcnow
from .model import Outcome
from .plan import LOOPBACK, Plan, PlannedConfig, PlannedHypothesis, make_config, series_key
from .server import ServerProcess, free_port
from .sources import SourceCollector


class Observer:
    """Progress callbacks; the CLI renders them, tests ignore them."""

    def run_started(self, run: Run, plan: Plan) -> None: ...
    def boot_started(self, config: PlannedConfig, attempt: int, samples: int) -> None: ...
    def sample_done(self, config: PlannedConfig, index: int, metrics: Mapping[str, float]) -> None: ...
    def boot_finished(self, config: PlannedConfig, boot: Boot) -> None: ...
    def verdict(self, hypothesis: PlannedHypothesis, verdict: VerdictRow) -> None: ...
    def message(self, text: str) -> None: ...


@dataclass
class ConfigState:
    row: Config
    planned: PlannedConfig
    failed: str | None = None
    boots: list[Boot] = field(default_factory=list)
    consecutive_failures: int = 0

    @property
    def good_boots(self) -> list[Boot]:
        return [b for b in self.boots if b.status == "ok"]


def host_fingerprint(host: Mapping) -> str:
    """What makes two boots comparable hosts: machine, boot, GPUs, driver."""
    keys = {k: host.get(k) for k in ("hostname", "boot_id", "kernel", "cpu_model")}
    gpus = host.get("gpus") or []
    keys["gpus"] = [(g.get("uuid"), g.get("driver_version")) for g in gpus if isinstance(g, Mapping)]
    return hashlib.sha256(json.dumps(keys, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Executor:
    """Runs a plan on this machine against a ledger."""

    def __init__(self, plan: Plan, ledger: Ledger, *, log_dir: Path, observer: Observer | None = None,
                 calibrate: bool = True, aa_check: bool = False, order_seed: int | None = None,
                 wait_quiet_s: float | None = None):
        self.plan = plan
        self.spec = plan.spec
        self.ledger = ledger
        self.log_dir = Path(log_dir)
        self.obs = observer or Observer()
        self.calibrate = calibrate
        self.aa_check = aa_check
        self.ws = Workspace(plan.repo, plan.cache_dir) if plan.repo is not None else None
        self.run: Run | None = None
        self.states: dict[str, ConfigState] = {}
        self.host: dict = {}
        self.host_fp: str | None = None
        self.underpowered: dict[str, str] = {}
        self.noise: dict[str, dict] = {}
        # The order inside each round; stored with verdicts, so a run's order can be replayed.
        self.order_seed = secrets.randbits(32) if order_seed is None else int(order_seed)
        self._order = random.Random(self.order_seed)
        self.wait_quiet_s = wait_quiet_s  # --wait-quiet: wait up to this long for a quiet host first
        self._busy_before_next = False    # host_check retry: the last boot was busy; wait before the next

    # ------------------------------------------------------------------ run

    def start_run(self, kind: str = "run") -> Run:
        spec = self.spec
        attach.api_key(spec.engine.api_key_env)  # an unset key variable stops the run before any boot
        self.host = provenance.collect_host().to_dict()
        self.host_fp = host_fingerprint(self.host)
        self.run = self.ledger.add(Run(
            kind=kind, spec_path=str(spec.path), spec_text=spec.text,
            spec_hash=hashlib.sha256(spec.text.encode()).hexdigest(), harness_version=__version__,
            host={**self.host, liveness.OWNER_KEY: liveness.owner_record()}))  # stale-row detection
        self.log_dir = self.log_dir / f"run-{self.run.id}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for pc in self.plan.configs:
            self.state_for(pc)
        self.preflight()
        return self.run

    def preflight(self) -> contention.Window | None:
        """Watch the host before the first boot; say so when it is busy (naming the
        busiest foreign processes), and with ``wait_quiet_s`` wait for a quiet window.
        The window is recorded as the run's ``preflight`` calibration row."""
        d = self.spec.defaults
        seconds = d.host_preflight_s
        if seconds <= 0 and not self.wait_quiet_s:
            return None
        seconds = seconds or 2.0
        t0 = time.monotonic()
        if self.wait_quiet_s:
            quiet, window = contention.wait_quiet(d.host_thresholds, timeout_s=self.wait_quiet_s, window_s=seconds,
                                                  say=self.obs.message)
        else:
            window = contention.sample_host(seconds)
        crossed = contention.judge(window, d.host_thresholds)
        waited = time.monotonic() - t0 if self.wait_quiet_s else 0.0
        if crossed:
            why = "; ".join(c.message for c in crossed)
            self.obs.message(f"host busy before the first boot ({why}); the boots' figures will say how busy "
                             f"each one was. Use --wait-quiet to wait for a quiet host, or defaults.host_check "
                             f"(now {d.host_check}) to act on busy boots.")
        elif self.wait_quiet_s:
            self.obs.message(f"host quiet after {waited:.0f} s")
        self.ledger.add(Calibration(run_id=self.run.id, phase="preflight", host_fingerprint=self.host_fp,
                                    host=self.host, result={"contention": window.to_dict(),
                                                            "crossed": [c.to_dict() for c in crossed],
                                                            "waited_s": round(waited, 2),
                                                            "thresholds": d.host_thresholds.to_dict()}))
        return window

    def state_for(self, pc: PlannedConfig) -> ConfigState:
        st = self.states.get(pc.key)
        if st is None:
            row = self.ledger.add(Config(run_id=self.run.id, key=pc.key, series=series_key(self.spec, pc.arm),
                                         label=pc.label, commit=pc.arm.commit,
                                         env=dict(pc.arm.env), flags=dict(pc.arm.flags),
                                         argv=self.plan.argv(pc, port="{port}", worktree=None)))
            st = self.states[pc.key] = ConfigState(row=row, planned=pc)
        return st

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

    def finish_run(self, status: str = "done", error: str | None = None) -> None:
        if self.run is None:
            return
        self.run.status = status
        self.run.error = error
        self.run.finished_at = utcnow()
        self.ledger.commit()

    @contextlib.contextmanager
    def recording(self, kind: str) -> Iterator[Run]:
        """Start a run of ``kind``; if the body raises, the run row says how it ended
        (``interrupted`` or ``failed``, with the error) before the error goes on. On
        success the caller finishes the run with its own status."""
        run = self.start_run(kind)
        try:
            yield run
        except (KeyboardInterrupt, SystemExit) as exc:
            why = "interrupted by the user" if isinstance(exc, KeyboardInterrupt) else f"stopped by a signal ({exc})"
            self.finish_run("interrupted", why)
            raise
        except Exception as exc:
            self.finish_run("failed", str(exc) if isinstance(exc, HarnessError) else f"{type(exc).__name__}: {exc}")
            raise

    def execute(self) -> Run:
        """The whole experiment: calibrate, boot rounds until decided, calibrate again."""
        with self.recording("run") as run:
            self.obs.run_started(run, self.plan)
            self.record_calibration("before")
            rows = self._hypothesis_rows()
            if self.spec.defaults.aa_check or self.aa_check:
                self._aa_check(rows)
            self._sequential(rows)
            self.record_calibration("after")
        self.finish_run("done")
        return run

    def _hypothesis_rows(self) -> dict[str, HypothesisRow]:
        rows = {}
        for h in self.plan.hypotheses:
            rows[h.id] = self.ledger.add(HypothesisRow(
                run_id=self.run.id, hid=h.id, statement=h.spec.statement, metric=h.metric.name,
                expect=h.spec.expect.value, min_effect=h.spec.min_effect,
                baseline_config_id=self.states[h.baseline.key].row.id,
                treatment_config_id=self.states[h.treatment.key].row.id,
                spec={"baseline": _arm_dict(h.spec.baseline), "treatment": _arm_dict(h.spec.treatment),
                      "matrix_point": dict(h.spec.matrix_point), "bisect": h.spec.bisect,
                      "is_aa": h.is_aa, "line": h.spec.line,
                      "metric_def": {"unit": h.metric.unit, "better": h.metric.better.value,
                                     "description": h.metric.description}}))
        return rows

    # ------------------------------------------------------------------ A/A power check

    def _aa_check(self, rows: Mapping[str, HypothesisRow]) -> None:
        """Boot each baseline config against an independent replica of itself, measure
        the noise, and refuse to claim effects smaller than the run can resolve."""
        d = self.spec.defaults
        design = self.design()
        alpha_each = self.alpha_each()
        groups: dict[tuple[str, str], list[PlannedHypothesis]] = {}
        for h in self.plan.hypotheses:
            if not h.is_aa:
                groups.setdefault((h.baseline.key, h.metric.name), []).append(h)
        for (key, metric), hyps in groups.items():
            base = self.states[key]
            replica = self.state_for(make_config(self.spec, base.planned.arm, replica=2))
            self.boot_round([base, replica], d.boots_per_arm)
            if base.failed or replica.failed:
                self.obs.message(f"A/A check of {base.planned.label}: could not be measured")
                continue
            a = self.ledger.boot_values(base.good_boots, metric).values
            b = self.ledger.boot_values(replica.good_boots, metric).values
            if len(a) < 2 or len(b) < 2:
                continue
            noise = stats.noise_floor([list(x) for x in a], [list(x) for x in b], design=design, alpha=alpha_each)
            sde = noise.smallest_detectable_effect
            self.noise[key] = {"metric": metric, "boot_mean_cv": noise.boot_mean_cv,
                               "smallest_detectable_effect": sde}
            self.obs.message(f"A/A check of {base.planned.label}: boot-to-boot CV {noise.boot_mean_cv:.2%} "
                             f"on {metric}; smallest effect this run can resolve: {sde:.2%}")
            for h in hyps:
                if h.spec.min_effect < sde:
                    self.underpowered[h.id] = (
                        f"min_effect {h.spec.min_effect:.1%} is below the smallest effect this run can resolve "
                        f"({sde:.1%} from an A/A check); raise min_effect or defaults.max_boots_per_arm")

    # ------------------------------------------------------------------ sequential rounds

    def design(self) -> stats.Design:
        d = self.spec.defaults
        return stats.Design(alpha=d.alpha, min_boots=d.boots_per_arm, max_boots=d.max_boots_per_arm,
                            analysis=d.analysis)

    def alpha_each(self) -> float:
        """Each hypothesis' alpha: Bonferroni over every hypothesis of the file, whatever --only kept."""
        return stats.adjust_alpha(self.spec.defaults.alpha, self.spec.multiplicity)

    def _sequential(self, rows: Mapping[str, HypothesisRow]) -> None:
        d = self.spec.defaults
        design = self.design()
        alpha_each = self.alpha_each()
        pending = []
        for h in self.plan.hypotheses:
            if h.id in self.underpowered:  # the power check refused it up front: no boots spent
                v = self.ledger.add(VerdictRow(hypothesis_id=rows[h.id].id, outcome=Outcome.INCONCLUSIVE.value,
                                               final=True, test="A/A power check", alpha=alpha_each,
                                               reason=self.underpowered[h.id],
                                               stats={"noise": self.noise.get(h.baseline.key),
                                                      "family_size": self.spec.multiplicity}))
                self.obs.verdict(h, v)
            else:
                pending.append(h)
        target = d.boots_per_arm
        while pending:
            needed: list[ConfigState] = []
            for h in pending:
                for pc in (h.baseline, h.treatment):
                    st = self.states[pc.key]
                    if st not in needed and st.failed is None:
                        needed.append(st)
            self.boot_round(needed, target)
            still = []
            for h in pending:
                verdict = self._look(h, rows[h.id], design, alpha_each, force_final=target >= d.max_boots_per_arm)
                if not verdict.final:
                    still.append(h)
            pending = still
            target += 1

    def boot_round(self, states: Sequence[ConfigState], target: int) -> None:
        """Boot each config up to ``target`` good boots, one boot each per pass (A B A B)."""
        retries = self.spec.defaults.boot_retries
        cap = self.spec.defaults.max_boots_per_arm + retries + 1
        while True:
            todo = [s for s in states if s.failed is None and len(s.good_boots) < target]
            if not todo:
                return
            self._order.shuffle(todo)  # a random order inside each round (seeded: order_seed)
            for st in todo:
                if st.failed is None and len(st.good_boots) < target:
                    self.boot(st)
                    if st.failed is None and st.consecutive_failures > retries:
                        st.failed = f"{st.consecutive_failures} boots in a row failed"
                    elif st.failed is None and len(st.boots) >= cap and len(st.good_boots) < target:
                        st.failed = (f"only {len(st.good_boots)} usable boots of {len(st.boots)} "
                                     "(the others failed or were excluded by a boot check)")
                    if st.failed and st.row.status == "pending":
                        st.row.status, st.row.failure = "boot_failed", st.failed
                        self.ledger.commit()

    def _look(self, h: PlannedHypothesis, row: HypothesisRow, design: stats.Design, alpha: float,
              *, force_final: bool) -> VerdictRow:
        verdict = self._judge(h, row, design, alpha, force_final=force_final)
        self.ledger.add(verdict)
        self.obs.verdict(h, verdict)
        return verdict

    def _judge(self, h: PlannedHypothesis, row: HypothesisRow, design: stats.Design, alpha: float,
               *, force_final: bool) -> VerdictRow:
        b, t = self.states[h.baseline.key], self.states[h.treatment.key]
        warnings = self._warnings(b, t)

        def undecided(reason: str, **ids) -> VerdictRow:
            return VerdictRow(hypothesis_id=row.id, outcome=Outcome.INCONCLUSIVE.value, final=True, test="none",
                              alpha=alpha, reason=reason, warnings=warnings,
                              stats={"family_size": self.spec.multiplicity}, **ids)

        failed = [s for s in (b, t) if s.failed]
        if failed:
            which = " and ".join(f"{'baseline' if s is b else 'treatment'} ({s.failed})" for s in failed)
            return undecided(f"could not be measured: {which}")
        bv = self.ledger.boot_values(b.good_boots, h.metric.name)
        tv = self.ledger.boot_values(t.good_boots, h.metric.name)
        if not bv.values or not tv.values:
            return undecided(f"metric {h.metric.name} has no values in {'baseline' if not bv.values else 'treatment'} "
                             "boots (see the boots' source problems)")
        ids = {"baseline_boot_ids": list(bv.boot_ids), "treatment_boot_ids": list(tv.boot_ids)}
        # Round of a boot: its place among its config's good boots (round i holds the i-th of each).
        rounds = tuple([i for i, x in enumerate(s.good_boots) if x.id in set(v.boot_ids)]
                       for s, v in ((b, bv), (t, tv)))
        try:
            res = stats.evaluate([list(v) for v in bv.values], [list(v) for v in tv.values],
                                 expect=h.spec.expect, min_effect=h.spec.min_effect, design=design, alpha=alpha,
                                 rounds=rounds)
        except ValueError as exc:  # e.g. a metric that is zero or constant: there is no ratio to test
            return undecided(f"metric {h.metric.name} cannot be compared: {exc}. Pick a metric with positive, "
                             "varying values (a rate, a latency, a count per sample)", **ids)
        return VerdictRow(
            hypothesis_id=row.id, outcome=res.outcome.value, final=res.final or force_final, ratio=res.ratio,
            ci_low=res.ci[0] if res.ci else None, ci_high=res.ci[1] if res.ci else None,
            p_value=res.p_value, test=res.test, alpha=alpha, reason=res.reason, warnings=warnings,
            stats=jsonable({**dataclasses.asdict(res), "family_size": self.spec.multiplicity,
                            "family_alpha": self.spec.defaults.alpha, "rounds": rounds,
                            "order_seed": self.order_seed}), **ids)

    def _warnings(self, b: ConfigState, t: ConfigState) -> list[str]:
        """Marked boots on either side, and every way the two sides' hosts differed."""
        out = []
        for side, st in (("baseline", b), ("treatment", t)):
            for bt in st.boots:
                if bt.marks:
                    out.append(f"{side} boot {bt.id}: {', '.join(bt.marks)}")
        for side, st in (("baseline", b), ("treatment", t)):
            mixed = engine_identity.mixed_versions(side, st.boots)
            if mixed:
                out.append(mixed)
        out += attach.verdict_warnings([b.planned, t.planned])  # attached: boots are sessions, not restarts
        for drift in host_drift(b.good_boots, t.good_boots):
            out.append(f"host drift: {drift.message}")
        thresholds = self.spec.defaults.host_thresholds
        out += host_state.contention_warnings({"baseline": b.boots, "treatment": t.boots}, thresholds)
        out += host_state.calibration_warnings(host_state.side_runs(b.boots, t.boots), thresholds)
        return out

    # ------------------------------------------------------------------ one boot

    def boot(self, st: ConfigState) -> Boot:
        """Build (once), boot, verify, warm up, sample, tear down. Never raises ConfigFailure."""
        pc = st.planned
        spec = self.spec
        samples = spec.defaults.samples_per_boot
        seq = len(st.boots) + 1
        self._wait_if_busy()
        self.obs.boot_started(pc, seq, samples)
        boot = Boot(run_id=self.run.id, config_id=st.row.id, config_key=pc.key, seq=seq,
                    host_fingerprint=self.host_fp)
        try:
            worktree, cenv = None, self.plan.shared_env()
            if pc.arm.commit is not None:
                worktree = self.ws.worktree(pc.arm.commit)
                if self.plan.per_commit_env:  # the commit's own interpreter: its build cannot reach another's
                    cenv = self.ws.environment(pc.arm.commit, self.plan.base_python)
                build = self.plan.build_argv(worktree, cenv.python)
                if build:
                    self.ws.build(pc.arm.commit, build, self.plan.boot_env(pc, cenv), python=cenv.python)
            boot.provenance = {**(boot.provenance or {}), "environment": cenv.to_dict()}
        except BuildFailed as exc:
            st.failed = str(exc)
            st.row.status, st.row.failure, st.row.log_tail = "build_failed", str(exc), exc.log_tail
            boot.status, boot.failure, boot.log_tail, boot.log_path = "failed", str(exc), exc.log_tail, exc.log_path
            boot.finished_at = utcnow()
            self.ledger.add(boot)
            st.boots.append(boot)
            self.obs.boot_finished(pc, boot)
            return boot
        source = self.plan.source  # launched here, or attached to a running server (attach.py)
        port = source.port(pc)
        argv = self.plan.argv(pc, port=port, worktree=worktree, python=cenv.python)
        boot.port, boot.argv = port, argv
        self.ledger.add(boot)
        st.boots.append(boot)
        log_path = self.log_dir / f"boot-{boot.id}.log"
        boot.log_path = str(log_path)
        preset = self.plan.preset
        try:
            endpoint = source.endpoint(pc, port)  # base_url and auth headers (never stored)
            base_url = endpoint.base_url
            bench = benchtools.sample_runner(spec.benchmark, endpoint, python=cenv.python,
                                             env=self.plan.boot_env(pc, cenv), cwd=self.plan.cwd(worktree, cenv.python),
                                             log_path=log_path)
            t0 = time.monotonic()
            with source.open(argv, env=self.plan.boot_env(pc, cenv), cwd=self.plan.cwd(worktree, cenv.python),
                               log_path=log_path,
                               base_url=base_url, health_path=spec.engine.health,
                               ready_timeout_s=spec.engine.ready_timeout_s,
                               health_request_timeout_s=preset.health_request_timeout_s) as server:
                boot.ready_s = server.ready_after_s if server.ready_after_s is not None else time.monotonic() - t0
                if preset.settle_s:
                    time.sleep(preset.settle_s)  # the engine's own warmup after its health check passes
                info = self._verify(boot, server, pc, base_url, headers=endpoint.headers)
                self.ledger.commit()
                if boot.status == "fatal":
                    raise UserError(boot.failure or "a boot check failed")
                bench.warmup()
                # sources whose `when` excludes this config are not collected (and not problems)
                wanted, skipped = sources.applicable(spec.engine.metrics, pc.arm.flags,
                                                     lambda f: presets.canonical_flag(f, preset))
                if skipped:
                    boot.provenance = {**boot.provenance, "sources_not_applicable": [s.name for s in skipped]}
                collector = SourceCollector(wanted, base_url, log_path, server_info=info,
                                            server_info_paths=spec.engine.server_info,
                                            metrics_path=preset.metrics_path, headers=endpoint.headers)
                with provenance.GpuSampler(interval_s=1.0) as sampler, \
                        contention.Monitor(server_pid=server.pid, interval_s=0.5) as monitor, \
                        bench.session():  # one HTTP client per boot, opened outside every sample window
                    for i in range(samples):
                        if i:
                            monitor.split()  # one contention window per sample, and one for the boot
                        collector.begin_sample()
                        detail = bench.sample(i)
                        result = detail.result
                        extra = collector.end_sample(detail.responses, result.duration_s)
                        metrics = jsonable({**dict(result.metrics), **extra})
                        self.ledger.add(SampleRow(boot_id=boot.id, seq=i + 1, metrics=metrics,
                                                  requests=result.requests, output_tokens=result.output_tokens,
                                                  duration_s=result.duration_s, errors=result.errors))
                        self.obs.sample_done(pc, i + 1, metrics)
                boot.provenance = {**boot.provenance, **bench.provenance()}
                boot.source_problems = list(collector.problems())
                if boot.source_problems:
                    boot.marks = [*boot.marks, "source_unmatched"]
                boot.provenance = {**boot.provenance, "gpu_sampling": sampler.summary().to_dict(),
                                   "host": provenance.collect_host(worktree, pc.arm.commit).to_dict()}
                self._host_check(boot, monitor)
                if boot.status == "running":
                    boot.status = "ok"
                boot.log_tail = server.log_tail(40)
            st.consecutive_failures = 0
            if boot.status == "fatal":
                raise InfrastructureError(boot.failure)
        except FlagNotAccepted as exc:  # the same argv fails the same way at this commit: not retried
            boot.status, boot.failure = "failed", str(exc)
            boot.log_tail = exc.log_tail or read_tail(log_path)
            boot.marks = [*(boot.marks or []), engine_flags.FLAG_NOT_ACCEPTED]
            notes = engine_flags.notes_for(exc.engine_message, preset)
            boot.provenance = {**(boot.provenance or {}), "flag_not_accepted": {
                "commit": pc.arm.commit, "engine_message": exc.engine_message, "notes": notes}}
            where = f"at commit {pc.arm.commit[:12]}" if pc.arm.commit else "by the installed server"
            st.failed = f"flag not accepted {where}: {exc.engine_message}" + "".join(f" ({n})" for n in notes)
            st.consecutive_failures += 1
        except (BootFailed, ConfigFailure) as exc:
            boot.status, boot.failure = "failed", str(exc)
            boot.log_tail = exc.log_tail or read_tail(log_path)
            st.consecutive_failures += 1
        except (httpx.HTTPError, RuntimeError) as exc:
            boot.status, boot.failure = "failed", f"benchmark failed: {type(exc).__name__}: {exc}"
            boot.log_tail = read_tail(log_path)
            st.consecutive_failures += 1
        except (KeyboardInterrupt, SystemExit):
            if boot.status == "running":  # its finished samples stay; the boot is not used by a verdict
                boot.status, boot.failure = "interrupted", "the harness was interrupted during this boot"
            boot.log_tail = read_tail(log_path)
            raise
        finally:
            boot.finished_at = utcnow()
            self.ledger.commit()
            self.obs.boot_finished(pc, boot)
        return boot

    def _host_check(self, boot: Boot, monitor: contention.Monitor) -> None:
        """Store the boot's contention figures; when they crossed a threshold, mark the
        boot ``host_busy`` and apply ``defaults.host_check`` (as ``_verify`` does for env)."""
        d = self.spec.defaults
        window = monitor.window()
        crossed = contention.judge(window, d.host_thresholds)
        boot.provenance = {**boot.provenance,
                           "contention": host_state.record(window, monitor.samples(), crossed, d.host_thresholds)}
        if not crossed:
            return
        boot.marks = [*boot.marks, host_state.HOST_BUSY]
        why = "; ".join(c.message for c in crossed)
        if d.host_check in ("exclude", "retry") and boot.status == "running":
            boot.status = "excluded"
            self._busy_before_next = d.host_check == "retry"
        elif d.host_check == "fatal":
            boot.status = "fatal"
            boot.failure = (f"host_busy: {why} (defaults.host_check is fatal: stop the other jobs on this host, "
                            "run with --wait-quiet, or set defaults.host_check: retry to re-boot busy boots)")

    def retries(self, boot: Boot) -> bool:
        """Whether ``boot`` was left out as busy under ``host_check: retry`` (so it is re-booted)."""
        return (self.spec.defaults.host_check == "retry" and boot.status == "excluded"
                and host_state.HOST_BUSY in (boot.marks or []))

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

    def _verify(self, boot: Boot, server: ServerProcess, pc: PlannedConfig, base_url: str,
                headers: Mapping[str, str] | None = None) -> dict | None:
        """Did the env reach every worker, did the flags take effect? Mark, exclude or stop."""
        d = self.spec.defaults
        info = fetch_server_info(base_url, self.spec.engine.server_info, headers=headers)
        boot.server_info = info
        reported = engine_identity.read_reported_version(base_url, info, headers=headers)  # which code ran
        boot.provenance = {**(boot.provenance or {}), "engine_version": reported.to_dict()}
        # An attached server has no process of ours (pid None) and no env of ours to check.
        env_rep = provenance.env_report(server.pid, pc.arm.env) if server.pid is not None else None
        preset = self.plan.preset
        keys = {f: presets.info_key(f, preset) for f in pc.arm.flags}
        checkable = {f: v for f, v in pc.arm.flags.items() if keys[f] is not None}
        flag_rep = provenance.flag_report(checkable, info, aliases={f: k for f, k in keys.items() if k},
                                          compare={f: presets.compare_mode(f, preset) for f in checkable})
        boot.env_report, boot.flag_report = env_rep.to_dict() if env_rep else None, flag_rep.to_dict()
        marks = []
        if env_rep is not None and not env_rep.ok:
            marks.append("env_missing")
        if not flag_rep.ok:
            marks.append("flag_mismatch")
        boot.marks = marks
        for mark, mode, what in (("env_missing", d.env_check, env_rep), ("flag_mismatch", d.flag_check, flag_rep)):
            if mark not in marks:
                continue
            if mode == "exclude":
                boot.status = "excluded"
            elif mode == "fatal":
                boot.status = "fatal"
                key = f"defaults.{mark.split('_')[0]}_check"
                boot.failure = (f"{mark}: {what.describe()} ({key} is fatal: make the engine pass it on, "
                                f"or set {key}: mark to measure and flag such boots)")
        return info


def _boot_host(boot: Boot):
    prov = boot.provenance or {}
    if "host" not in prov:
        return None, None
    host = provenance.HostInfo.from_dict(prov["host"])
    samples = provenance.SamplerSummary.from_dict(prov["gpu_sampling"]) if prov.get("gpu_sampling") else None
    return host, samples


def _boot_calibration(boot: Boot):
    result = boot.run.calibration("before") if boot.run is not None else None
    return calibration.Calibration.from_dict(result) if result else None


def host_drift(a_boots: Sequence[Boot], b_boots: Sequence[Boot]) -> list[calibration.Drift]:
    """What differed between the hosts of two sides (first and last boot of each,
    so a reboot or a driver change in the middle of a side shows too), including the
    calibration probes of the runs the boots belong to (sides from different runs)."""
    pairs = []
    if a_boots and b_boots:
        pairs = [(a_boots[0], b_boots[-1]), (a_boots[-1], b_boots[0])]
    seen, out = set(), []
    for x, y in pairs:
        (ha, sa), (hb, sb) = _boot_host(x), _boot_host(y)
        if ha is None or hb is None:
            continue
        cal_a, cal_b = (_boot_calibration(x), _boot_calibration(y)) if x.run_id != y.run_id else (None, None)
        for d in calibration.compare_hosts(ha, hb, cal_a, cal_b, samples_a=sa, samples_b=sb):
            if d.field not in seen:
                seen.add(d.field)
                out.append(d)
    return out


def jsonable(obj):
    """Dataclass dumps made safe for a JSON column: enums by value, NaN/inf as None."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "tolist"):
        return jsonable(obj.tolist())
    return obj


def fetch_server_info(base_url: str, paths: Sequence[str], headers: Mapping[str, str] | None = None) -> dict | None:
    """The first server-info endpoint that answers with a JSON object, or None."""
    for path in paths:
        try:
            r = httpx.get(base_url + path, timeout=10.0, headers=dict(headers or {}), trust_env=False)
            if r.status_code == 200:
                data = r.json()
                if isinstance(data, dict):
                    return data
        except (httpx.HTTPError, ValueError):
            continue
    return None


def _arm_dict(arm) -> dict:
    return {"commit": arm.commit, "env": dict(arm.env), "flags": dict(arm.flags)}
