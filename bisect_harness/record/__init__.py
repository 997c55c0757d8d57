"""Storage: the ledger (SQLite through SQLAlchemy, one row per run, config, boot, sample and
look), the run lock, the liveness of a run's rows, and export."""
