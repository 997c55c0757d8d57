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


#: Test files that judge time or the host's quiet: they run alone, after the rest
#: (README's test command: ``-m "not serial"`` on two workers, then ``-m serial``).
#: On a 2-core host a sibling worker is a real neighbour: the contention check marks
#: every boot beside it busy (searches then drop those samples), and a neighbour
#: moves latencies, send lags and the noise floor that these files assert on.
SERIAL = frozenset({
    "test_contention_live.py",   # a burner beside a boot, and the quiet boot after it
    "test_busy_search.py",       # a bursty neighbour of its own
    "test_bisect_cli.py",        # searches count only quiet samples
    "test_explain_e2e.py",       # a search
    "test_explain_in_run.py",    # a search
    "test_releases.py",          # a bisection over releases
    "test_slurm_e2e.py",         # a bisection through Slurm
    "test_nightly_workflow.py",  # nights whose alert is bisected
    "test_calibration.py",       # the probe's spread
    "test_client.py",            # inter-token gaps of replayed streams
    "test_open_loop.py",         # send lags against scheduled times
    "test_capacity.py",          # a server's known capacity under an SLO
    "test_load_curve_real.py",   # llama-server's TTFT at two loads
    "test_llamacpp_real.py",     # a search on llama-server
    "test_slurm.py",             # a Ctrl-C timed against two running jobs and a queued one
    "test_sources_live.py",      # a measured effect at two boots a side
})

#: The workers' longest files, started first (``--dist loadfile --no-loadscope-reorder``
#: hands files out in the order collected; xdist's own order, the files with the most
#: tests first, left the two vLLM files to the end, a worker busy alone for minutes).
FIRST = ("test_vllm_real.py", "test_capacity_real.py", "test_cli_e2e.py", "test_postgres_ledger.py",
         "test_noise_prior.py", "test_record.py", "test_openai_engine.py", "test_html_report.py",
         "test_spec_limits.py", "test_hostile_servers.py", "test_secrets.py", "test_profile_capture.py")


def pytest_configure(config):
    """An xdist worker sets ``COLUMNS`` and ``LINES`` (80x24) for its own reports; every
    CLI the tests start would inherit them and lay its tables out for an 80-column
    terminal it does not have. Off a terminal, as these tests are, neither is set."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SERIAL:
            item.add_marker(pytest.mark.serial)
    items.sort(key=lambda item: FIRST.index(item.path.name) if item.path.name in FIRST else len(FIRST))
