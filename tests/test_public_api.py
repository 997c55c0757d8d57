"""The package's public face is what it means to export (and the CLI's help is stable)."""

from __future__ import annotations

import subprocess
import sys

import os

import pytest

import bisect_harness


def test_all_is_exactly_the_public_names():
    for name in bisect_harness.__all__:
        assert getattr(bisect_harness, name).__module__.startswith("bisect_harness.")
    loaded = {name for name in vars(bisect_harness) if not name.startswith("_")}
    modules = {name for name, value in vars(bisect_harness).items() if type(value).__name__ == "module"}
    assert loaded - modules == set(bisect_harness.__all__)
    with pytest.raises(AttributeError):
        bisect_harness.not_a_name


def test_cli_lists_its_commands():
    out = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "100"}, check=True).stdout
    for command in ("run", "bisect", "doctor", "journal", "demo", "ledger"):
        assert f" {command} " in out, out


def test_version_of_the_package_matches_its_metadata():
    from importlib.metadata import version

    assert bisect_harness.__version__ == version("bisect-harness")
