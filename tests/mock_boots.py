"""The demo engine's planted history, answered by the mock backend: for the tests whose
point is the search or the orchestration (bisection, nightly's rule, an explanation
that hands its commit to a bisection), not the servers.

:class:`Planted` is the mock backend's handler: it boots nothing and answers each boot
request with samples of ``decode_ms`` (and ``tok_s``) that depend only on the request's
commit and on the boot's place among that config's boots, so a run is the same every
time. A commit at or after the history's regression decodes ``factor`` times slower; a
commit of ``broken`` fails its build. :func:`harness_here` runs the real ``harness``
command line in this process with such a handler lent as a backend of its own.

Each feature these tests drive also has an end-to-end test on real demo servers
(named in the tests that use this module).
"""

from __future__ import annotations

import hashlib
import io
import random
import subprocess
from pathlib import Path
from typing import Any, Iterable

import pytest

from bisect_harness.backends import BACKENDS
from bisect_harness.backends.mock import MockBackend, failed
from bisect_harness.boot import SampleOutcome


class BootDraws:
    """A random generator per boot that depends only on a salt, the request's config and
    the boot's place among that config's boots: the n-th boot of a config draws the same
    values whatever order a round booted its configs in (each run draws that order
    afresh), so a run's rounds, and so its looks, are the same every time."""

    def __init__(self):
        self.made: dict[str, int] = {}

    def rng(self, r, salt: object = "") -> random.Random:
        k = self.made.get(r.config_key, 0)
        self.made[r.config_key] = k + 1
        return random.Random(hashlib.sha256(f"{salt}:{r.config_key}:{k}".encode()).digest())


class Planted:
    """Answers boots as the demo history would, without its noise's surprises.

    ``slow_from``: the commits (full SHAs), or released versions, that decode ``factor`` times
    slower; ``broken``: those whose build fails (a config that cannot be measured, never retried);
    ``noise``: the boot-to-boot spread (lognormal sigma) and a tenth of it within a boot.
    """

    def __init__(self, *, slow_from: Iterable[str], factor: float = 1.9, broken: Iterable[str] = (),
                 noise: float = 0.03, level_ms: float = 10.0, name: str = "planted"):
        self.slow, self.broken = set(slow_from), set(broken)
        self.factor, self.noise, self.level_ms = factor, noise, level_ms
        self.draws = BootDraws()
        self.booted: list[str | None] = []
        self.backend = MockBackend(self, name=name)

    def __call__(self, r):
        # what is booted: the commit, or for a released build its version
        what = r.commit if r.release is None else r.release.version
        self.booted.append(what)
        if what in self.broken:
            return failed(f"build failed at {what[:12]} (exit 1): KeyError in build.py", config_status="build_failed")
        rng = self.draws.rng(r, what)
        level = self.level_ms * (self.factor if what in self.slow else 1.0) * rng.lognormvariate(0.0, self.noise)
        out = []
        for i in range(max(1, r.samples)):
            ms = level * rng.lognormvariate(0.0, self.noise / 10)
            out.append(SampleOutcome(seq=i + 1, metrics={"decode_ms": ms, "tok_s": 1000.0 / ms}, requests=1,
                                     output_tokens=32, duration_s=0.032 * ms))
        return out


def harness_in_process(*args: Any, cwd: Path, backend=None) -> subprocess.CompletedProcess:
    """The real ``harness ARGS`` run in this process in ``cwd`` (``cli.main``): its exit code,
    stdout and stderr as :func:`helpers.harness` gives them. With ``backend`` (a mock
    backend), that backend is lent under its name for the call only and ``--backend`` names it."""
    from bisect_harness import cli

    argv = [*map(str, args)]
    if backend is not None:
        BACKENDS.add(backend.as_kind())
        argv += ["--backend", backend.name]
    out, err = io.StringIO(), io.StringIO()
    try:
        with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit) as stop:
            mp.setenv("COLUMNS", "1000")  # a message is one line; nothing wraps it
            mp.setattr("bisect_harness.engines.server.install_signal_handlers", lambda: None)
            mp.chdir(cwd)
            mp.setattr("sys.stdout", out)
            mp.setattr("sys.stderr", err)
            cli.main(argv)
    finally:
        if backend is not None:
            BACKENDS.discard(backend.name)
    return subprocess.CompletedProcess(["harness", *argv], stop.value.code or 0, out.getvalue(), err.getvalue())


def harness_here(*args: Any, handler, cwd: Path) -> subprocess.CompletedProcess:
    """The real ``harness ARGS --backend NAME`` in this process, in ``cwd``, its boots answered by
    ``handler`` (a :class:`Planted`, or any handler with a ``backend``)."""
    return harness_in_process(*args, cwd=cwd, backend=handler.backend)
