"""Shared fixtures: an isolated cache per test session, so nothing leaks into ~/.cache."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def harness_cache(tmp_path_factory):
    """Worktrees, builds and the demo repository live in a temp cache for the whole session."""
    path = tmp_path_factory.mktemp("harness-cache")
    old = os.environ.get("BISECT_HARNESS_CACHE")
    os.environ["BISECT_HARNESS_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("BISECT_HARNESS_CACHE", None)
    else:
        os.environ["BISECT_HARNESS_CACHE"] = old


from slurm_cluster import slurm_cluster  # noqa: E402,F401 - a real Slurm cluster, for the tests that ask
from postgres_server import ledger_url, postgres_server  # noqa: E402,F401 - a real PostgreSQL server, likewise
