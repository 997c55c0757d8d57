"""Boots and samples out of the ledger's JSON columns, as flat tables (CSV or Parquet).

Two tables, one row per boot and one per sample, each sample row naming its boot,
so a notebook (pandas, polars, DuckDB) joins them without reading JSON. Every
metric a sample recorded becomes a column ``metric.<name>``; a sample that lacks
one leaves it empty. Nothing is computed here: the values are the ledger's.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence

from sqlalchemy import select

from bisect_harness.errors import UserError
from bisect_harness.record.ledger import Boot, Config, Ledger, SampleRow

__all__ = ["FORMATS", "boot_rows", "sample_rows", "export"]

FORMATS = ("csv", "parquet")

BOOT_COLUMNS = ("run_id", "boot_id", "config_id", "config_key", "config_label", "commit", "seq", "status",
                "started_at", "finished_at", "ready_s", "host_fingerprint", "marks", "failure", "argv")
SAMPLE_COLUMNS = ("run_id", "boot_id", "sample_id", "seq", "created_at", "requests", "output_tokens", "duration_s",
                  "errors")


def _iso(t) -> str | None:
    return t.isoformat() if t is not None else None


def boot_rows(ledger: Ledger, run_ids: Sequence[int] | None = None) -> list[dict]:
    q = select(Boot, Config).join(Config, Config.id == Boot.config_id).order_by(Boot.id)
    if run_ids:
        q = q.where(Boot.run_id.in_(list(run_ids)))
    out = []
    for boot, cfg in ledger.session.execute(q).all():
        out.append({"run_id": boot.run_id, "boot_id": boot.id, "config_id": cfg.id, "config_key": cfg.key,
                    "config_label": cfg.label, "commit": cfg.commit, "seq": boot.seq, "status": boot.status,
                    "started_at": _iso(boot.started_at), "finished_at": _iso(boot.finished_at),
                    "ready_s": boot.ready_s, "host_fingerprint": boot.host_fingerprint,
                    "marks": ";".join(boot.marks or []), "failure": boot.failure,
                    "argv": json.dumps(list(boot.argv or []))})
    return out


def sample_rows(ledger: Ledger, run_ids: Sequence[int] | None = None) -> tuple[list[dict], list[str]]:
    """The sample rows and their column names (the fixed ones, then ``metric.<name>`` sorted)."""
    q = select(SampleRow, Boot.run_id).join(Boot, Boot.id == SampleRow.boot_id).order_by(SampleRow.id)
    if run_ids:
        q = q.where(Boot.run_id.in_(list(run_ids)))
    rows, names = [], set()
    for s, run_id in ledger.session.execute(q).all():
        row = {"run_id": run_id, "boot_id": s.boot_id, "sample_id": s.id, "seq": s.seq,
               "created_at": _iso(s.created_at), "requests": s.requests, "output_tokens": s.output_tokens,
               "duration_s": s.duration_s, "errors": s.errors}
        for k, v in (s.metrics or {}).items():
            names.add(k)
            row[f"metric.{k}"] = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
        rows.append(row)
    columns = [*SAMPLE_COLUMNS, *(f"metric.{n}" for n in sorted(names))]
    return rows, columns


def export(ledger: Ledger, out_dir: Path, fmt: str, run_ids: Sequence[int] | None = None) -> dict[str, Path]:
    """Write ``boots.<fmt>`` and ``samples.<fmt>`` into ``out_dir``; their paths by table."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r} is not known; use one of {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    boots = boot_rows(ledger, run_ids)
    samples, sample_cols = sample_rows(ledger, run_ids)
    tables = {"boots": (boots, list(BOOT_COLUMNS)), "samples": (samples, sample_cols)}
    paths = {}
    for name, (rows, cols) in tables.items():
        path = out_dir / f"{name}.{fmt}"
        if fmt == "csv":
            with path.open("w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=cols, extrasaction="raise")
                w.writeheader()
                for r in rows:
                    w.writerow({c: r.get(c) for c in cols})
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({c: [r.get(c) for r in rows] for c in cols}), path)
        paths[name] = path
    return paths
