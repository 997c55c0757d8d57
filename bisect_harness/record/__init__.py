"""The ledger (SQLite through SQLAlchemy) and the journal rendered from it alone."""
