"""Take up an interrupted ``harness run`` again: ``harness run FILE --resume [RUN]``.

A run that was killed (SIGKILL, a lost node, a closed session, a tool that
failed) keeps every boot and sample it recorded. Resuming continues the *same*
run row, so ``harness journal RUN`` shows one experiment:

- the run is found (the newest ``interrupted`` or ``failed`` run of the same
  file, or the one named) and refused when its spec text's hash, its configs'
  keys or its hypotheses differ from what the file plans now;
- a recorded boot counts (feeds verdicts, counts against the budget) when it
  ended (``ok``, ``failed``, ``excluded``) on a host with this host's
  fingerprint; ``ok`` boots of another host are kept but not counted, and boots
  cut short by the interruption keep their samples but never feed a verdict;
- hypotheses already decided keep their verdicts; the others continue at the
  sequential look after the last one recorded; the A/A check boots only what it
  lacks;
- one harness controls a run at a time: the run is held (``record/runlock``) and
  claimed in one conditional UPDATE before anything is booted; a run another
  live harness holds is refused naming that harness's pid and host, and a
  run it finished meanwhile is refused as finished;
- each resume appends a record to ``runs.host["resumed"]`` (when, what the run
  was, which boots counted and which did not, the order stream: an
  ``evidence.ResumeRecord``) from which the journal's sentences are made.

``runs.host`` is read and written as an ``evidence.RunHost`` only.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from sqlalchemy import select, update

from bisect_harness.errors import UserError
from bisect_harness.evidence import BootStatus, HarnessProcess, ResumeRecord, RunHost, RunOptions
from bisect_harness.plan.build import make_config
from bisect_harness.record.ledger import Boot, Config, HypothesisRow, Ledger, Run, VerdictRow
from bisect_harness.report.resumed import RESUMED_KEY, journal_lines, resumes, run_line
from bisect_harness.record import liveness, runlock

__all__ = ["RESUMABLE", "RESUMED_KEY", "OPTIONS_KEY", "find_run", "check_plan", "split_boots", "looks_done",
           "record_options", "take_up", "claim", "Resumption", "resumes", "journal_lines", "run_line", "order_stream"]

#: Run statuses a resume takes up; ``done`` runs are finished, ``running`` ones owned.
RESUMABLE = ("interrupted", "failed")
#: ``runs.host`` key of what a run was started with beyond its file (A/A check, hypotheses kept, --profile).
OPTIONS_KEY = RunHost.KEYS["options"]
#: Boot statuses of boots that ended; they count when their host matches.
ENDED = (BootStatus.OK, BootStatus.FAILED, BootStatus.EXCLUDED)


def spec_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def find_run(ledger: Ledger, spec, run_id: int | None) -> Run:
    """The run ``--resume`` continues: ``run_id``, or the newest interrupted or failed
    ``harness run`` of this file (same path, or same text). Raises ``UserError``
    saying what to do when there is none, it finished, it still runs, or the file
    changed since."""
    want = spec_hash(spec.text)
    if run_id is not None:
        run = ledger.run(run_id)
        if run.kind != "run":
            raise UserError(f"run {run.id} is a `harness {run.kind}` run; --resume continues `harness run` runs "
                            f"(`harness {run.kind}` reuses the boots its earlier runs recorded by itself)")
        if run.status == "running":
            raise _still_running(run)
        if run.status not in RESUMABLE:
            raise UserError(f"run {run.id} finished ({run.status}); there is nothing to resume. "
                            f"`harness journal {run.id}` shows it; start a new run without --resume")
    else:
        here = _resolved(spec.path)
        run = None
        for r in ledger.session.scalars(select(Run).where(Run.kind == "run",
                                                          Run.status.in_((*RESUMABLE, "running")))
                                        .order_by(Run.id.desc())).all():
            if _resolved(r.spec_path) == here or r.spec_hash == want:
                if r.status == "running":  # the newest run of the file is another harness's now
                    raise _still_running(r)
                run = r
                break
        if run is None:
            raise UserError(f"no interrupted or failed run of {spec.path} in the ledger {ledger.url} to resume; "
                            f"`harness ledger list` shows the runs (pass --resume RUN to pick one), or start "
                            f"a new run without --resume")
    if run.spec_hash != want:
        raise UserError(f"run {run.id} was started from {run.spec_path} with sha256 {run.spec_hash[:12]}, but "
                        f"{spec.path} now has sha256 {want[:12]}: a resumed run must measure what it started. "
                        f"Restore the file as it was (its text is under 'Hypotheses as written' in "
                        f"`harness journal {run.id}`), or start a new run without --resume")
    return run


def _still_running(run: Run) -> UserError:
    """The refusal of a run that a harness still runs, naming that harness."""
    owner = RunHost.from_json(run.host).owner
    return runlock.RunHeld(run.id, owner.to_json() if owner is not None else {})


def _resolved(path) -> Path | None:
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError, TypeError):
        return None


def check_plan(run: Run, plan, *, aa_check: bool = False) -> None:
    """Refuse a resume whose plan no longer matches the run: the run's configs must be
    the planned ones (or their A/A replicas) and every planned config must have its
    row (a revision such as ``HEAD`` that now names another commit, or a changed
    engine, gives another key), the hypotheses kept (``--only``) must be the
    run's, and ``--aa-check`` is refused for a run started without one (whether
    the run had one comes from the run, not from the resuming command)."""
    recorded = options(run)
    if aa_check and recorded.aa_check is False:
        raise UserError(f"run {run.id} was started without an A/A check; a resume continues the run as it was "
                        "started (an A/A check now would come after its looks): drop --aa-check")
    ids = sorted(h.id for h in plan.hypotheses)
    recorded = sorted(h.hid for h in run.hypotheses) or sorted(recorded.hypotheses or ids)
    if ids != recorded:
        raise UserError(f"run {run.id} holds hypotheses {', '.join(recorded)}; this command selects "
                        f"{', '.join(ids) or 'none'}. Pass the same --only as the interrupted run")
    rows = {c.key: c for c in run.configs}
    planned = {pc.key: pc for pc in plan.configs}
    replicas = {make_config(plan.spec, h.baseline.arm, replica=2).key for h in plan.hypotheses}  # A/A check
    why = ("a revision now names another commit, or the engine changed since; resuming would compare boots "
           "of different code. Start a new run without --resume")
    for key, row in rows.items():
        if key not in planned and key not in replicas:
            raise UserError(f"run {run.id}'s config {row.label} (key {key}) is not planned by the file now: {why}")
    for pc in plan.configs:
        # Configs are all made before the hypotheses' rows; a run stopped before those may lack some.
        if pc.key not in rows and run.hypotheses:
            raise UserError(f"config {pc.label} (key {pc.key}) is not one of run {run.id}'s configs: {why}")


def split_boots(row: Config, host_fingerprint: str | None) -> tuple[list[Boot], list[Boot]]:
    """A config's recorded boots as (counted, not counted). Counted: ended (ok, failed,
    excluded) on a host with this fingerprint. Not counted: cut short (interrupted,
    running) or ended on another host."""
    counted, other = [], []
    for boot in row.boots:
        if boot.status in ENDED and boot.host_fingerprint == host_fingerprint:
            counted.append(boot)
        else:
            other.append(boot)
    return counted, other


def order_stream(seed: int, n: int) -> str:
    """The seed of the round order after the ``n``-th resume: re-derived from the run's
    seed (the position of the first generator is not recorded; this one is)."""
    return f"{seed}:resume:{n}"


def record_options(ledger: Ledger, run: Run, *, aa_check: bool, hypotheses: Sequence[str],
                   profile: bool = False) -> None:
    """Keep what the run was started with beyond its file, for a later resume (``--profile``
    too: a resume profiles the arms the run profiled, whether or not it is passed again)."""
    chosen = RunOptions(aa_check=bool(aa_check), hypotheses=tuple(hypotheses), profile=bool(profile))
    run.host = RunHost.from_json(run.host).with_(options=chosen).to_json()
    ledger.commit()


def options(run: Run) -> RunOptions:
    """What ``run`` was started with beyond its file (every field None where it recorded none)."""
    return RunHost.from_json(run.host).options or RunOptions()


def earlier_order_seed(ledger: Ledger, run: Run) -> int | None:
    """The run's order seed: as recorded with the run, else from any of its verdicts."""
    seed = RunHost.from_json(run.host).order_seed
    if seed is not None:
        return seed
    q = (select(VerdictRow).join(HypothesisRow, HypothesisRow.id == VerdictRow.hypothesis_id)
         .where(HypothesisRow.run_id == run.id))
    for v in ledger.session.scalars(q).all():
        if v.figures.order_seed is not None:
            return int(v.figures.order_seed)
    return None


def looks_done(ledger: Ledger, rows: Mapping[str, HypothesisRow]) -> dict[str, tuple[VerdictRow | None, int]]:
    """Per hypothesis id: (its final verdict or None, how many non-final looks were recorded)."""
    out = {}
    for hid, row in rows.items():
        vs = ledger.session.scalars(select(VerdictRow).where(VerdictRow.hypothesis_id == row.id)
                                    .order_by(VerdictRow.id)).all()
        final = next((v for v in vs if v.final), None)
        out[hid] = (final, sum(1 for v in vs if not v.final))
    return out


@dataclass(frozen=True)
class Resumption:
    """What a resume reads of the interrupted run, once, before anything is booted:
    the order seed it used, each config row with its boots split into counted and
    not counted on this host (:func:`split_boots`), and the resume record appended."""

    order_seed: int
    configs: Mapping[str, tuple[Config, list[Boot], list[Boot]]]
    record: ResumeRecord
    lock: runlock.RunLock


def take_up(ledger: Ledger, run: Run, *, host_fingerprint: str | None, hostname: str | None, order_seed: int,
            backend: dict) -> Resumption:
    """Hold the interrupted ``run`` (:func:`claim`), read it once and set it running
    again under this process (:func:`begin`). ``order_seed`` is used only where the
    run recorded none. The lock comes back held; the caller lets go at the run's end."""
    previous = (run.status, run.error)
    lock = claim(ledger, run)
    try:
        return _take_up(ledger, run, host_fingerprint=host_fingerprint, hostname=hostname, order_seed=order_seed,
                        backend=backend, lock=lock, previous=previous)
    except BaseException:
        lock.release(ended=False)  # claimed but not taken up: the next open marks it interrupted again
        raise


def claim(ledger: Ledger, run: Run) -> runlock.RunLock:
    """Hold ``run`` for this process and mark it ``running`` in one conditional UPDATE
    (from ``interrupted`` or ``failed`` only), committed at once. Refused (``UserError``,
    exit 2) when another live harness holds it, naming its pid and host, or when it
    ended or was taken up since :func:`find_run` read it."""
    lock = runlock.hold(ledger.url, run.id)  # RunHeld names the holder
    try:
        claimed = ledger.session.execute(
            update(Run).where(Run.id == run.id, Run.status.in_(RESUMABLE))
            .values(status="running", host=_held_by_me(RunHost.from_json(run.host)).to_json())
            .execution_options(synchronize_session=False)).rowcount
        ledger.commit()
        ledger.session.refresh(run)
        if claimed != 1:
            if run.status == "running":
                raise _still_running(run)
            raise UserError(f"run {run.id} ended ({run.status}) while this resume was starting; there is nothing "
                            f"to resume. `harness journal {run.id}` shows it")
    except BaseException:
        lock.release(ended=False)
        raise
    return lock


def _take_up(ledger: Ledger, run: Run, *, host_fingerprint: str | None, hostname: str | None, order_seed: int,
             backend: dict, lock: runlock.RunLock, previous: tuple[str, str | None]) -> Resumption:
    seed = earlier_order_seed(ledger, run)
    seed = order_seed if seed is None else seed
    configs = {}
    for row in {c.key: c for c in run.configs}.values():
        configs[row.key] = (row, *split_boots(row, host_fingerprint))
    rec = begin(run, host_fingerprint=host_fingerprint, hostname=hostname,
                counted=[b for _row, counted, _other in configs.values() for b in counted],
                not_counted=[b for _row, _counted, other in configs.values() for b in other],
                order_seed=seed, backend=backend, previous=previous)
    ledger.commit()
    return Resumption(order_seed=seed, configs=configs, record=rec, lock=lock)


def _held_by_me(host: RunHost) -> RunHost:
    """``host`` with this process as the run's holder (``liveness.owner_record``)."""
    return host.with_(owner=HarnessProcess.from_json(liveness.owner_record()))


def begin(run: Run, *, host_fingerprint: str | None, hostname: str | None, counted: Iterable[Boot],
          not_counted: Iterable[Boot], order_seed: int, backend: dict,
          previous: tuple[str, str | None] | None = None) -> ResumeRecord:
    """Set the run running again under this process and append its resume record.
    ``previous``: the run's status and error before it was claimed (default: as read)."""
    counted, not_counted = list(counted), list(not_counted)
    host = RunHost.from_json(run.host)
    status, error = previous or (run.status, run.error)
    rec = ResumeRecord(
        at=_dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds"),
        previous_status=status, previous_error=error, host_fingerprint=host_fingerprint, hostname=hostname,
        counted_boot_ids=tuple(sorted(b.id for b in counted)),
        counted_ok_boot_ids=tuple(sorted(b.id for b in counted if b.status == BootStatus.OK)),
        other_host_boot_ids=tuple(sorted(b.id for b in not_counted if b.status in ENDED)),
        other_host_ok_boot_ids=tuple(sorted(b.id for b in not_counted if b.status == BootStatus.OK)),
        cut_short_boot_ids=tuple(sorted(b.id for b in not_counted if b.status not in ENDED)),
        order_stream=order_stream(order_seed, len(host.resumed) + 1))
    run.host = _held_by_me(host).with_(backend=backend, resumed=(*host.resumed, rec)).to_json()
    run.status, run.error, run.finished_at = "running", None, None
    return rec
