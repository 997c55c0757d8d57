"""The ledger: every run, config, boot, sample, verdict and bisection, append-only.

A SQLite file (the default, ``sqlite:///results.db``) for one person, a PostgreSQL
database (``postgresql://user@host/db``, with the ``postgres`` extra) for a team;
any other SQLAlchemy URL opens too, without run locks (``record.database``,
``record.runlock``). Each sample is committed the moment it is measured, so a
killed run loses nothing already measured, and a later run (or a resumed
bisection) can reuse it. Several harnesses write one ledger at once: each row is
its own transaction, and a run is held by one harness (``runlock``).

The schema carries a version number in ``meta``; a database written by a newer
harness is refused rather than misread. Migrations (:data:`MIGRATIONS`) are plain
``ALTER TABLE ... ADD COLUMN`` statements that both databases run, in the one
transaction that reads the version: SQLite takes its write lock first and
PostgreSQL a transaction-level advisory lock, so processes opening one ledger at
once create or upgrade it once, and a migration cut short leaves it as it was.
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from sqlalchemy import (JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, create_engine,
                        event, insert, inspect, select, text, update)
from sqlalchemy.engine import make_url
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, aliased, mapped_column, relationship

from bisect_harness.boot import BootRecord, BootValues, CalibrationRecord, RunRecord, SampleOutcome
from bisect_harness.evidence import (BootEvidence, BootStatus, Finding, HarnessProcess, RunHost, VerdictStats,
                                     findings_from_json, findings_to_json)
from bisect_harness.errors import InfrastructureError, UserError
from bisect_harness.model import utcnow
from bisect_harness.secrets import redact_row
from bisect_harness.observe import host_state
from bisect_harness.record import database, legacy, liveness, runlock

if TYPE_CHECKING:  # only read: the ledger need not load the statistics to open
    from bisect_harness.decide.verdict import Verdict

SCHEMA_VERSION = 5
#: Seconds a SQLite connection waits for another process's write before giving up.
BUSY_TIMEOUT_S = 60.0

#: Forward migrations, applied in order to an older ledger on open. Each only adds;
#: nothing recorded is ever rewritten or dropped.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("ALTER TABLE configs ADD COLUMN series VARCHAR(64)",  # nightly series: the config without its commit
        "ALTER TABLE runs ADD COLUMN summary JSON"),           # kind-specific result (nightly)
    3: ("ALTER TABLE bisect_probes ADD COLUMN purpose VARCHAR(16)",  # probe, anchor, endpoints, verify, reused
        "ALTER TABLE bisect_probes ADD COLUMN boot_ids JSON"),      # every boot the step booted, failed ones too
    4: ("ALTER TABLE verdicts ADD COLUMN findings JSON",),  # typed findings (evidence.Finding); NULL: read the warnings
    5: ("ALTER TABLE samples ADD COLUMN point VARCHAR(200)",),  # the load point (workload.LoadPoint.label); NULL: the one
}


class Base(DeclarativeBase):
    type_annotation_map = {dict: JSON, list: JSON, Any: JSON}


class Meta(Base):
    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), default="run")  # run | bisect
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[_dt.datetime | None] = mapped_column(DateTime, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="running")  # running|done|alert|failed|interrupted
    spec_path: Mapped[str] = mapped_column(Text)
    spec_text: Mapped[str] = mapped_column(Text)
    spec_hash: Mapped[str] = mapped_column(String(64))
    harness_version: Mapped[str] = mapped_column(String(32))
    host: Mapped[dict] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    summary: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # kind-specific result (nightly)
    configs: Mapped[list["Config"]] = relationship(back_populates="run")
    hypotheses: Mapped[list["HypothesisRow"]] = relationship(back_populates="run", order_by="HypothesisRow.id")
    calibrations: Mapped[list["Calibration"]] = relationship(order_by="Calibration.id", viewonly=True)

    def calibration(self, phase: str = "before") -> dict | None:
        """The run's calibration probe result of ``phase``, when it ran and succeeded."""
        for cal in self.calibrations:
            if cal.phase == phase and cal.result and "error" not in cal.result:
                return cal.result
        return None


class Config(Base):
    """One distinct server boot recipe within a run; ``key`` identifies it across runs."""

    __tablename__ = "configs"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    key: Mapped[str] = mapped_column(String(64), index=True)
    series: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)  # the key without the commit
    label: Mapped[str] = mapped_column(Text, default="")
    commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    env: Mapped[dict] = mapped_column(JSON, default=dict)
    flags: Mapped[dict] = mapped_column(JSON, default=dict)
    argv: Mapped[list] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | ok | build_failed | boot_failed
    failure: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    run: Mapped[Run] = relationship(back_populates="configs")
    boots: Mapped[list["Boot"]] = relationship(back_populates="config", order_by="Boot.id")


class Boot(Base):
    """One start of the server for one config: the unit of replication."""

    __tablename__ = "boots"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    config_id: Mapped[int] = mapped_column(ForeignKey("configs.id"), index=True)
    config_key: Mapped[str] = mapped_column(String(64), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    finished_at: Mapped[_dt.datetime | None] = mapped_column(DateTime, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="running")  # running | ok | failed | excluded
    failure: Mapped[str | None] = mapped_column(Text, nullable=True)
    ready_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    argv: Mapped[list] = mapped_column(JSON, default=list)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    log_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    host_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    provenance: Mapped[dict] = mapped_column(JSON, default=dict)
    env_report: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    flag_report: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    server_info: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    marks: Mapped[list] = mapped_column(JSON, default=list)  # env_missing, flag_mismatch, source_unmatched, ...
    source_problems: Mapped[list] = mapped_column(JSON, default=list)
    config: Mapped[Config] = relationship(back_populates="boots")
    run: Mapped[Run] = relationship()
    samples: Mapped[list["SampleRow"]] = relationship(back_populates="boot", order_by="SampleRow.seq")

    @property
    def evidence(self) -> BootEvidence:
        """What the boot recorded of its host, devices and engine, typed (``provenance``)."""
        return BootEvidence.from_json(self.provenance)


class SampleRow(Base):
    __tablename__ = "samples"
    id: Mapped[int] = mapped_column(primary_key=True)
    boot_id: Mapped[int] = mapped_column(ForeignKey("boots.id"), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    metrics: Mapped[dict] = mapped_column(JSON)
    requests: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    duration_s: Mapped[float] = mapped_column(Float)
    errors: Mapped[int] = mapped_column(Integer, default=0)
    #: the load point the sample measured (``workload.LoadPoint.label``); NULL: the benchmark's one point
    point: Mapped[str | None] = mapped_column(String(200), nullable=True)
    boot: Mapped[Boot] = relationship(back_populates="samples")


class HypothesisRow(Base):
    __tablename__ = "hypotheses"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    hid: Mapped[str] = mapped_column(Text)
    statement: Mapped[str] = mapped_column(Text, default="")
    metric: Mapped[str] = mapped_column(String(64))
    expect: Mapped[str] = mapped_column(String(16))
    min_effect: Mapped[float] = mapped_column(Float)
    baseline_config_id: Mapped[int] = mapped_column(ForeignKey("configs.id"))
    treatment_config_id: Mapped[int] = mapped_column(ForeignKey("configs.id"))
    spec: Mapped[dict] = mapped_column(JSON, default=dict)
    run: Mapped[Run] = relationship(back_populates="hypotheses")
    baseline: Mapped[Config] = relationship(foreign_keys=[baseline_config_id])
    treatment: Mapped[Config] = relationship(foreign_keys=[treatment_config_id])
    verdicts: Mapped[list["VerdictRow"]] = relationship(back_populates="hypothesis", order_by="VerdictRow.id")

    @property
    def verdict(self) -> "VerdictRow | None":
        """The latest verdict (earlier ones are the sequential looks)."""
        return self.verdicts[-1] if self.verdicts else None


class VerdictRow(Base):
    """One look at a hypothesis; the last one of a hypothesis is its verdict."""

    __tablename__ = "verdicts"
    id: Mapped[int] = mapped_column(primary_key=True)
    hypothesis_id: Mapped[int] = mapped_column(ForeignKey("hypotheses.id"), index=True)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    outcome: Mapped[str] = mapped_column(String(16))
    final: Mapped[bool] = mapped_column(Boolean)
    ratio: Mapped[float | None] = mapped_column(Float, nullable=True)
    ci_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    ci_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    p_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    test: Mapped[str] = mapped_column(Text, default="")
    alpha: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    baseline_boot_ids: Mapped[list] = mapped_column(JSON, default=list)
    treatment_boot_ids: Mapped[list] = mapped_column(JSON, default=list)
    warnings: Mapped[list] = mapped_column(JSON, default=list)  # the findings' sentences, for older readers
    findings: Mapped[list | None] = mapped_column(JSON, nullable=True)  # evidence.Finding.to_json each; NULL before schema 4
    stats: Mapped[dict] = mapped_column(JSON, default=dict)
    hypothesis: Mapped[HypothesisRow] = relationship(back_populates="verdicts")

    @property
    def found(self) -> tuple[Finding, ...]:
        """What the verdict found about its boots, typed; a row written before findings
        were stored is read from its sentences (``record.legacy``)."""
        if self.findings is not None:
            return findings_from_json(self.findings)
        return legacy.findings_of_sentences(self.warnings)

    @property
    def figures(self) -> VerdictStats:
        """The verdict's statistics, typed (``stats``)."""
        return VerdictStats.from_json(self.stats)


class Calibration(Base):
    __tablename__ = "calibrations"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    phase: Mapped[str] = mapped_column(String(16))  # before | after
    host_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    host: Mapped[dict] = mapped_column(JSON, default=dict)
    result: Mapped[dict] = mapped_column(JSON, default=dict)


class Bisection(Base):
    __tablename__ = "bisections"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    hypothesis_id: Mapped[int | None] = mapped_column(ForeignKey("hypotheses.id"), nullable=True)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    good: Mapped[str] = mapped_column(String(64))
    bad: Mapped[str] = mapped_column(String(64))
    metric: Mapped[str] = mapped_column(String(64))
    commits: Mapped[list] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(16), default="running")
    result: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    probes: Mapped[list["Probe"]] = relationship(back_populates="bisection", order_by="Probe.id")

    @property
    def found(self) -> tuple[Finding, ...]:
        """What the search found about its boots, typed (``result["findings"]``); a result
        written before findings were stored is read from its sentences (``result["warnings"]``,
        through ``record.legacy``), as :attr:`VerdictRow.found` reads a verdict's."""
        result = self.result if isinstance(self.result, dict) else {}
        if result.get("findings") is not None:
            return findings_from_json(result["findings"])
        return legacy.findings_of_sentences(result.get("warnings"))


class Probe(Base):
    __tablename__ = "bisect_probes"
    id: Mapped[int] = mapped_column(primary_key=True)
    bisection_id: Mapped[int] = mapped_column(ForeignKey("bisections.id"), index=True)
    created_at: Mapped[_dt.datetime] = mapped_column(DateTime, default=utcnow)
    commit: Mapped[str] = mapped_column(String(64))
    boots_requested: Mapped[int] = mapped_column(Integer)
    values: Mapped[list] = mapped_column(JSON, default=list)
    reused: Mapped[int] = mapped_column(Integer, default=0)
    skipped: Mapped[bool] = mapped_column(Boolean, default=False)
    note: Mapped[str] = mapped_column(Text, default="")
    #: what the step was for: ``probe``, ``anchor``, ``endpoints`` or ``verify`` (a side
    #: of a paired round), ``reused`` (boots from the ledger fed to the posterior only)
    purpose: Mapped[str | None] = mapped_column(String(16), nullable=True)
    #: every boot this step booted (usable, failed, left out), in order
    boot_ids: Mapped[list | None] = mapped_column(JSON, nullable=True)
    bisection: Mapped[Bisection] = relationship(back_populates="probes")


def verdict_row(hypothesis_id: int, verdict: Verdict) -> VerdictRow:
    """The row that stores ``verdict`` (``decide.verdict.Verdict``) as a look at the
    hypothesis of row ``hypothesis_id``: its answer in the columns, its findings typed
    (``findings``) and as their sentences (``warnings``, for older readers), its
    figures as ``VerdictStats.to_json`` (``stats``, which a later run's noise prior
    reads back through :meth:`VerdictRow.figures`)."""
    ci = verdict.ci
    return VerdictRow(hypothesis_id=hypothesis_id, outcome=verdict.outcome.value, final=bool(verdict.final),
                      ratio=verdict.ratio, ci_low=ci[0] if ci else None, ci_high=ci[1] if ci else None,
                      p_value=verdict.p_value, test=verdict.test, alpha=verdict.alpha, reason=verdict.reason,
                      baseline_boot_ids=list(verdict.baseline_boot_ids),
                      treatment_boot_ids=list(verdict.treatment_boot_ids),
                      warnings=list(verdict.warnings), findings=findings_to_json(verdict.findings),
                      stats=verdict.stats.to_json())


def boot_records(boots: Iterable[Boot]) -> list[BootRecord]:
    """The boots as the frozen records the verdict and host drift read (``boot.BootRecord``):
    each with its samples and its run's calibration probes (one record per run)."""
    runs: dict[int, RunRecord] = {}
    out = []
    for b in boots:
        run = b.run
        if run is not None and run.id not in runs:
            runs[run.id] = RunRecord(run.id, tuple(CalibrationRecord(c.phase, c.result) for c in run.calibrations))
        out.append(BootRecord(
            id=b.id, run_id=b.run_id, status=b.status, failure=b.failure, argv=tuple(b.argv or ()),
            evidence=b.evidence, env_report=b.env_report, flag_report=b.flag_report,
            marks=tuple(b.marks or ()), run=runs.get(run.id) if run is not None else None,
            quiet=host_state.quiet_samples(b),
            samples=tuple(SampleOutcome(metrics=s.metrics, requests=s.requests, output_tokens=s.output_tokens,
                                        duration_s=s.duration_s, errors=s.errors, seq=s.seq, point=s.point)
                          for s in b.samples)))
    return out


class Ledger:
    """Thin session owner over the database. Methods commit before they return."""

    def __init__(self, url: str = "sqlite:///results.db"):
        self.url = url
        database.register_password(url)  # never stored nor printed (``secrets``)
        #: the URL as messages print it: its password as ``***``
        self.shown = database.shown(url)
        try:
            target = database.engine_url(url)
            backend = target.get_backend_name()
            # An explicit busy timeout: a second harness waits for the first one's write
            # instead of failing with "database is locked". PostgreSQL's json has no NaN.
            options = ({"connect_args": {"timeout": BUSY_TIMEOUT_S}} if backend == database.SQLITE else
                       {"json_serializer": database.finite_json} if backend == database.POSTGRES else {})
            self.engine: Engine = create_engine(target, future=True, **options)
            if self.engine.dialect.name == "sqlite":
                event.listen(self.engine, "connect", _sqlite_pragmas)
            _while_locked(self._init_schema, self.engine)
        except ImportError as exc:  # the URL's database driver is not installed
            raise database.driver_missing(url, exc) from None
        except SQLAlchemyError as exc:
            if _refused_write(exc):  # the ledger is there, but the machine refuses to write it
                raise _write_error(self.shown, exc, opening=True) from None
            raise UserError(f"cannot open the ledger {self.shown!r}: {exc.__class__.__name__}: {exc}. "
                            "Pass --ledger with a valid SQLAlchemy URL, e.g. sqlite:///results.db") from None
        self.session = Session(self.engine, expire_on_commit=False)
        event.listen(self.session, "before_flush", _redact_before_flush)  # secrets never stored (secrets.py)
        if self.engine.dialect.name == database.POSTGRES:
            event.listen(self.session, "before_flush", database.no_nul_before_flush)
        try:
            self._mark_stale()
        except SQLAlchemyError as exc:
            self.session.rollback()
            raise _write_error(self.shown, exc) from None

    def _mark_stale(self) -> list[int]:
        """Mark ``interrupted`` the running runs (and their running boots) whose owning
        harness process is gone (``liveness``), or whose run lock was left behind free
        (``runlock``: its holder went without recording the end, on any host); returns
        the run ids marked. Commits when it marks anything."""
        marked = []
        running = self.session.scalars(select(Run).where(Run.status == "running")).all()
        # on PostgreSQL the locks are asked on the session's own connection
        asked = self.session.connection() if running and self.engine.dialect.name == database.POSTGRES else None
        for run in running:
            owner = RunHost.from_json(run.host).owner or HarnessProcess()
            if liveness.owner_gone(owner.to_json()):
                why = liveness.STALE_REASON.format(pid=owner.pid, hostname=owner.hostname)
            elif runlock.left_free(self.url, run.id, asked):
                why = liveness.LEFT_REASON.format(pid=_or_unknown(owner.pid), hostname=_or_unknown(owner.hostname))
            else:
                continue
            run.status, run.error, run.finished_at = "interrupted", why, utcnow()
            for boot in self.session.scalars(select(Boot).where(Boot.run_id == run.id,
                                                                Boot.status == BootStatus.RUNNING.value)).all():
                boot.status, boot.failure, boot.finished_at = BootStatus.INTERRUPTED.value, why, utcnow()
            marked.append(run.id)
        if marked:
            self.session.commit()
        return marked

    def _init_schema(self) -> None:
        """Create or upgrade the schema in one transaction, the version read before
        anything is written. The transaction first takes a lock that other openers of
        the ledger wait on: SQLite's write lock (``BEGIN IMMEDIATE``), PostgreSQL's
        transaction-level advisory lock of the ledger's schema (``database.schema_lock_key``),
        so processes opening one new ledger at once create it once, and a migration
        killed half-way leaves the ledger as it was (both databases roll back DDL)."""
        with self.engine.connect() as conn:
            if self.engine.dialect.name == database.SQLITE:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            elif self.engine.dialect.name == database.POSTGRES:
                schema = conn.execute(text("SELECT current_schema()")).scalar() or ""
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": database.schema_lock_key(schema)})
            version = None
            if inspect(conn).has_table("meta"):
                row = conn.execute(select(Meta.value).where(Meta.key == "schema_version")).first()
                version = int(row[0]) if row is not None else None
            if version is not None and version > SCHEMA_VERSION:
                conn.rollback()
                raise UserError(f"the ledger {self.shown} has schema version {version}, newer than this harness "
                                f"understands ({SCHEMA_VERSION}); upgrade bisect-harness or use another --ledger")
            existed = set(inspect(conn).get_table_names())
            Base.metadata.create_all(conn)  # a table new since the ledger's version comes whole
            if version is None:
                conn.execute(insert(Meta).values(key="schema_version", value=str(SCHEMA_VERSION)))
            elif version < SCHEMA_VERSION:
                try:
                    for target in range(version + 1, SCHEMA_VERSION + 1):
                        for statement in MIGRATIONS.get(target, ()):
                            words = statement.split()
                            if words[:2] == ["ALTER", "TABLE"] and words[2] not in existed:
                                continue  # made whole by create_all above
                            conn.exec_driver_sql(statement)
                    conn.execute(update(Meta).where(Meta.key == "schema_version").values(value=str(SCHEMA_VERSION)))
                except SQLAlchemyError as exc:
                    conn.rollback()
                    raise InfrastructureError(
                        f"could not upgrade the ledger {self.shown} from schema version {version} to "
                        f"{SCHEMA_VERSION}: {_said(exc)}; the ledger was left as it was; back it up and retry, "
                        "or use another --ledger") from None
            conn.commit()

    def close(self) -> None:
        self.session.close()
        self.engine.dispose()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ writes

    def add(self, obj):
        """Add and commit one row at once: nothing measured waits for the end of a run."""
        try:
            self.session.add(obj)
            self.session.commit()
        except SQLAlchemyError as exc:
            self.session.rollback()
            raise _write_error(self.shown, exc) from None
        return obj

    def add_run(self, run: Run) -> tuple[Run, runlock.RunLock]:
        """Add a new run row held by this process (``runlock``): the lock is taken
        before the row is committed, so no other process ever sees it unheld."""
        lock = runlock.RunLock()
        try:
            self.session.add(run)
            self.session.flush()  # the id, not yet visible to anyone else
            lock = runlock.hold(self.url, run.id)
            self.session.commit()
        except SQLAlchemyError as exc:
            self.session.rollback()
            lock.release()
            raise _write_error(self.shown, exc) from None
        except BaseException:
            self.session.rollback()
            lock.release()
            raise
        return run, lock

    def commit(self) -> None:
        try:
            self.session.commit()
        except SQLAlchemyError as exc:
            self.session.rollback()
            raise _write_error(self.shown, exc) from None

    # ------------------------------------------------------------------ reads

    def run(self, run_id: int) -> Run:
        run = self.session.get(Run, run_id)
        if run is None:
            raise UserError(f"no run {run_id} in {self.shown}; `harness ledger list` shows the runs")
        return run

    def runs(self, limit: int = 50) -> Sequence[Run]:
        return self.session.scalars(select(Run).order_by(Run.id.desc()).limit(limit)).all()

    def latest_run(self) -> Run:
        run = self.session.scalars(select(Run).order_by(Run.id.desc()).limit(1)).first()
        if run is None:
            raise UserError(f"the ledger {self.shown} holds no runs yet; start one with `harness run FILE`")
        return run

    def boot_values(self, boots: Iterable[Boot], metric: str, *, quiet: bool = False,
                    point: str | None = None) -> BootValues:
        """The sample values of ``metric`` (at load point ``point``) per usable (``ok``) boot;
        boots without any are left out. ``quiet``: only the samples whose own contention
        window crossed no threshold (``BootRecord.values``, the one reduction of a boot's samples)."""
        return BootValues.of(boot_records(boots), metric, quiet=quiet, point=point)

    def looks(self, row: HypothesisRow) -> Sequence[VerdictRow]:
        """Every look stored for the hypothesis of ``row``, in order (read afresh: the
        row's ``verdicts`` holds what was loaded with it)."""
        return self.session.scalars(select(VerdictRow).where(VerdictRow.hypothesis_id == row.id)
                                    .order_by(VerdictRow.id)).all()

    def reusable_boots(self, config_key: str, host_fingerprint: str | None) -> Sequence[Boot]:
        """Finished boots of the same config on the same host (any earlier run)."""
        q = select(Boot).where(Boot.config_key == config_key, Boot.status == "ok")
        if host_fingerprint is not None:
            q = q.where(Boot.host_fingerprint == host_fingerprint)
        return self.session.scalars(q.order_by(Boot.id)).all()

    def earlier_round_ratios(self, baseline_key: str, treatment_key: str, metric: str,
                             host_fingerprint: str | None, *,
                             before_run: int) -> list[list[tuple[float, int, tuple[int, int]]]]:
        """What earlier runs (before ``before_run``) saw of the same two configs compared
        on ``metric`` on this host: per hypothesis, newest first, its final verdict's
        rounds in order, each as (log ratio, the most samples either of its boots held,
        (baseline boot id, treatment boot id)). Only verdicts whose every boot ran on a
        host of ``host_fingerprint`` count (none without one)."""
        if host_fingerprint is None:
            return []
        b_cfg, t_cfg = aliased(Config), aliased(Config)
        q = (select(HypothesisRow).join(b_cfg, b_cfg.id == HypothesisRow.baseline_config_id)
             .join(t_cfg, t_cfg.id == HypothesisRow.treatment_config_id)
             .where(b_cfg.key == baseline_key, t_cfg.key == treatment_key, HypothesisRow.metric == metric,
                    HypothesisRow.run_id < before_run)
             .order_by(HypothesisRow.id.desc()))
        out = []
        for h in self.session.scalars(q).all():
            v = h.verdict
            st = v.figures if v is not None and v.final else VerdictStats()
            ratios, samples, labels = st.round_log_ratios, st.round_samples, st.rounds
            if not ratios or not samples or not labels or len(samples) != len(ratios):
                continue
            by_round = [dict(zip(side, ids)) for side, ids in zip(labels, (v.baseline_boot_ids, v.treatment_boot_ids))]
            common = sorted(set(by_round[0]) & set(by_round[1]))
            if len(common) != len(ratios):
                continue
            pairs = [(int(by_round[0][r]), int(by_round[1][r])) for r in common]
            ids = [i for pair in pairs for i in pair]
            hosts = set(self.session.scalars(select(Boot.host_fingerprint).where(Boot.id.in_(ids))).all())
            if hosts == {host_fingerprint}:
                out.append([(float(x), int(m), pair) for x, m, pair in zip(ratios, samples, pairs)])
        return out

    def nightly_history(self, series: str, *, before_run: int) -> list[tuple[Run, str, list[Boot]]]:
        """Earlier nightly runs of one series, oldest first: (run, commit, ok boots), one
        entry a night. A night's own config is the first of the series its run made: an
        alert's bisection measures older commits in the same run, and its configs carry
        the series too (the config without its commit), but they are steps of a search,
        not nights."""
        q = (select(Config).join(Run, Run.id == Config.run_id)
             .where(Config.series == series, Run.kind == "nightly", Run.id < before_run)
             .order_by(Run.id, Config.id))
        out, seen = [], set()
        for cfg in self.session.scalars(q).all():
            if cfg.run_id in seen:
                continue
            seen.add(cfg.run_id)
            ok = [b for b in cfg.boots if b.status == "ok"]
            if ok:
                out.append((cfg.run, cfg.commit, ok))
        return out


def _or_unknown(value) -> object:
    """A figure of a run's holder as its message says it: ``?`` where it was not recorded."""
    return "?" if value is None else value


def _redact_before_flush(session, _flush_context, _instances) -> None:
    for obj in (*session.new, *session.dirty):
        redact_row(obj)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")  # before WAL: switching takes a lock
    _while_locked(lambda: cur.execute("PRAGMA journal_mode=WAL"))
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def require_existing(url: str) -> str:
    """``url`` when it names a ledger that exists; a read-only command must not make an
    empty one where the user mistyped the path. Raises ``UserError`` naming --ledger."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not db.startswith("file:") and not os.path.isfile(db):
            raise UserError(f"no ledger at {url} ({os.path.abspath(db)} does not exist); pass --ledger with the "
                            "ledger a run wrote, e.g. --ledger sqlite:///results.db in the folder you ran from")
    return url


#: What SQLite says when the machine refuses a write, and what to do about it.
_REFUSALS = (
    ("readonly database", "is read-only", "make the ledger file and its folder writable, or pass --ledger with "
                                          "a writable ledger"),
    ("read-only file system", "is read-only", "make the ledger file and its folder writable, or pass --ledger "
                                              "with a writable ledger"),
    ("database or disk is full", "is on a full disk", "free space on the ledger's disk"),
    ("no space left", "is on a full disk", "free space on the ledger's disk"),
    ("disk quota exceeded", "is over its disk quota", "free space on the ledger's disk"),
    ("disk i/o error", "could not be written (disk I/O error)", "check the ledger's disk (full, read-only, or "
                                                               "failing)"),
)


def _refused_write(exc: BaseException) -> bool:
    text = str(getattr(exc, "orig", None) or exc).lower()
    return any(key in text for key, _what, _fix in _REFUSALS)


def _said(exc: BaseException) -> str:
    """The first line of what the database said (not SQLAlchemy's statement and link)."""
    return (str(getattr(exc, "orig", None) or exc).strip() or type(exc).__name__).splitlines()[0]


def _write_error(url: str, exc: BaseException, *, opening: bool = False) -> InfrastructureError:
    """One line for a write the ledger refused: what, where, what to do (exit 3)."""
    said = _said(exc)
    low = said.lower()
    for key, what, fix in _REFUSALS:
        if key in low:
            then = ("; then run again" if opening else
                    "; then run again (`harness run FILE --resume` continues an interrupted run)")
            return InfrastructureError(f"the ledger {url} {what} ({said}): {fix}{then}")
    return InfrastructureError(f"could not write to the ledger {url}: {said}")


def _is_locked(exc: BaseException) -> bool:
    return "database is locked" in str(exc) or "database table is locked" in str(exc)


def _while_locked(fn, engine: Engine | None = None):
    """``fn()``, tried again while SQLite answers "database is locked" where it does not
    wait on the busy timeout (switching a new file to WAL, or a lock taken while another
    process recovers it), up to ``BUSY_TIMEOUT_S``."""
    import random
    import sqlite3
    import time

    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return fn()
        except (SQLAlchemyError, sqlite3.OperationalError) as exc:
            if not _is_locked(exc) or time.monotonic() > deadline:
                raise
            if engine is not None:
                engine.dispose()
            time.sleep(0.02 + random.random() * 0.08)
