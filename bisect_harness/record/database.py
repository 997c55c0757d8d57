"""The database behind a ledger URL: which kind it is, how to reach it, how to show it.

A ledger is a SQLite file for one person or a PostgreSQL database for a team;
any other SQLAlchemy URL opens too, with no run lock (``runlock``). Three things
every reader of the URL needs are here, once:

- :func:`engine_url`: the URL SQLAlchemy connects with. ``postgresql://`` (and
  ``postgres://``, as many services print it) means psycopg 3, the driver the
  ``postgres`` extra installs; SQLAlchemy alone would pick psycopg2.
- :func:`shown`: the URL as messages and tables print it, its password replaced
  by ``***``. The password is also registered as a secret (:func:`register_password`),
  so no row the ledger stores and no message the CLI prints carries it, wherever it
  comes from (an error of the driver, another harness's command line).
- :func:`driver_missing`: the error that says which extra to install when the
  URL's driver is not there.

And what PostgreSQL needs that SQLite does not: the key of the lock a ledger's
schema is made under (:func:`schema_lock_key`), and the values its types cannot
hold, stored as near as they can be (:func:`no_nul_before_flush`, :func:`finite_json`).

    >>> shown("postgresql://team:s3cret@db.example:5432/perf")
    'postgresql+psycopg://team:***@db.example:5432/perf'
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from bisect_harness import secrets
from bisect_harness.errors import UserError

__all__ = ["SQLITE", "POSTGRES", "POSTGRES_EXTRA", "NUL_STAND_IN", "kind", "engine_url", "shown",
           "register_password", "driver_missing", "schema_lock_key", "no_nul_before_flush", "finite_json"]

SQLITE, POSTGRES = "sqlite", "postgresql"
#: What installs the PostgreSQL driver the ledger uses (psycopg 3).
POSTGRES_EXTRA = "bisect-harness[postgres]"
#: Driver names a bare PostgreSQL URL may carry, mapped to the one the extra installs.
_BARE = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}


def engine_url(url: str) -> URL:
    """``url`` parsed, a bare PostgreSQL scheme given psycopg 3 as its driver.
    Raises SQLAlchemy's ``ArgumentError`` for a string that is no URL."""
    if url.startswith("postgres://"):  # SQLAlchemy refuses this spelling; libpq and many services use it
        url = "postgresql://" + url[len("postgres://"):]
    parsed = make_url(url)
    return parsed.set(drivername=_BARE[parsed.drivername]) if parsed.drivername in _BARE else parsed


def kind(url: str) -> str | None:
    """``sqlite``, ``postgresql``, another backend's name, or None for no URL at all."""
    try:
        return engine_url(url).get_backend_name()
    except ArgumentError:
        return None


def shown(url: str) -> str:
    """``url`` as it may be printed: its password as ``***`` (a string that is no URL
    is shown with every registered secret masked)."""
    try:
        parsed = engine_url(url)
    except ArgumentError:
        return secrets.redact_text(url)
    if parsed.password is None:  # nothing to hide: as written (a rendering would %-escape a ``file:`` path)
        return url
    return parsed.render_as_string(hide_password=True)


def register_password(url: str) -> None:
    """Remember the URL's password (as written and as decoded) as a secret of this
    process (``secrets.register``): stored rows and printed messages mask it."""
    values = secrets.url_secret_values(url)
    try:
        password = engine_url(url).password
    except ArgumentError:
        password = None
    if password:
        values.add(str(password))
    secrets.register(values)


def driver_missing(url: str, exc: ImportError) -> UserError:
    """The refusal of a ledger whose database driver is not installed, naming the extra."""
    backend = kind(url)
    missing = exc.name or str(exc)
    if backend == POSTGRES:
        return UserError(f"the ledger {shown(url)} is a PostgreSQL database, but its driver ({missing}) is not "
                         f"installed: pip install '{POSTGRES_EXTRA}' (psycopg 3; postgresql:// URLs use it), "
                         f"or pass --ledger sqlite:///results.db for a ledger in a file")
    return UserError(f"the ledger {shown(url)} needs the database driver {missing}, which is not installed: "
                     f"install it, or pass --ledger sqlite:///results.db for a ledger in a file")


def schema_lock_key(schema: str) -> int:
    """The 64-bit key of the advisory lock a PostgreSQL ledger whose tables live in
    ``schema`` is created and upgraded under (one key, where a run's lock has two:
    the two never meet, ``runlock.advisory_key``)."""
    digest = hashlib.sha256(f"bisect-harness schema\0{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


#: What a NUL character of a text column becomes on PostgreSQL, whose text holds none.
NUL_STAND_IN = "\ufffd"


def no_nul_before_flush(session, _flush_context, _instances) -> None:
    """On PostgreSQL: a NUL in a text column (a server's log tail, a failure it
    printed) becomes U+FFFD, where the server would refuse the whole row. (JSON
    columns keep theirs: JSON writes it as an escape.)"""
    for obj in (*session.new, *session.dirty):
        for attr in inspect(obj).mapper.column_attrs:
            value = getattr(obj, attr.key, None)
            if isinstance(value, str) and "\x00" in value:
                setattr(obj, attr.key, value.replace("\x00", NUL_STAND_IN))


def finite_json(value: Any) -> str:
    """JSON text of a JSON column on PostgreSQL, whose json type has no NaN nor
    Infinity: such a number is stored as null there (SQLite keeps it as written)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
