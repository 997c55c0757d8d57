"""Deterministic runs whose journals the golden files pin (``test_journal_golden.py``).

Each scenario drives the real commands' library calls (the hypothesis loop, a
bisection, an explanation) on a real SQLite ledger and, where commits are
searched, a real git history with fixed dates (so its commit ids are the same on
every machine); only the boots are a stand-in: the mock backend, whose answers are
a function of the config and the boot's place among that config's boots, seeded
by a hash (never by the order the scheduler happened to boot in). Each returns the
journal as ``report.journal.render`` writes it, with what differs from one machine
or day to the next taken out by :func:`normalize` (dates, temp paths, the host, the
harness version), and the ledger it was rendered from, so a test can hold the
journal's sentences to the rows.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bisect_harness.backends.mock import MockBackend, failed
from bisect_harness.boot import BootOutcome, SampleOutcome
from bisect_harness.evidence import BootEvidence
from bisect_harness.observe.contention import Thresholds, Window, judge, record
from bisect_harness.plan.build import make_plan
from bisect_harness.record.ledger import Ledger
from bisect_harness.report import journal
from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.run.bisect_runner import BisectRequest, MeasureSetup, bisect_range
from bisect_harness.run.executor import Executor
from bisect_harness.run.explain_runner import ExplainOptions, explain_file
from bisect_harness.spec import load_spec
from helpers import write_spec

ENGINE = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}
FIXED_DATE = "2024-03-01T12:00:00+00:00"


def _rng(*parts) -> random.Random:
    return random.Random(hashlib.sha256(":".join(map(str, parts)).encode()).digest())


def _samples(level: float, rng: random.Random, n: int = 2, within: float = 0.01) -> tuple[SampleOutcome, ...]:
    return tuple(SampleOutcome(seq=i + 1, metrics={"tok_s": round(level * rng.lognormvariate(0.0, within), 4)},
                               requests=1, output_tokens=10, duration_s=0.1) for i in range(n))


class Seeded:
    """The mock backend's handler: a boot's tok/s is ``level(request)`` times a seeded
    draw of boot-to-boot noise (``between``), the draw a function of the config and the
    boot's number among its config's boots; ``mark(request, k)`` gives the marks (and
    the fields of its evidence) of boot ``k`` of a config, ``fail(request, k)`` whether it fails."""

    def __init__(self, level, *, between: float = 0.02, mark=None, fail=None):
        self.level, self.between, self.mark, self.fail = level, between, mark, fail
        self.made: dict[str, int] = {}
        self.backend = MockBackend(self, name="seeded")

    def __call__(self, r):
        k = self.made.get(r.config_key, 0)
        self.made[r.config_key] = k + 1
        if self.fail is not None and self.fail(r, k):
            return failed("the server exited 1 (scripted)")
        rng = _rng(r.config_key, k)
        level = self.level(r) * rng.lognormvariate(0.0, self.between)
        marks, provenance = self.mark(r, k) if self.mark is not None else ((), {})
        return BootOutcome(boot_id=r.boot_id, status="ok", marks=tuple(marks), evidence=BootEvidence(**provenance),
                           samples=_samples(level, rng))


def history(path: Path, subjects: list[str]) -> list[str]:
    """A real git repository at ``path`` with one commit per subject, oldest first, at a
    fixed date and author: the same commit ids wherever it is made."""
    path.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_AUTHOR_NAME="dev",
               GIT_AUTHOR_EMAIL="dev@example.invalid", GIT_COMMITTER_NAME="dev",
               GIT_COMMITTER_EMAIL="dev@example.invalid", GIT_AUTHOR_DATE=FIXED_DATE, GIT_COMMITTER_DATE=FIXED_DATE)

    def git(*args):
        return subprocess.run(["git", *args], cwd=path, env=env, check=True, capture_output=True, text=True).stdout

    git("init", "-q", "-b", "main")
    for i, subject in enumerate(subjects):
        (path / "engine.txt").write_text(f"{i}: {subject}\n")
        git("add", "engine.txt")
        git("commit", "-q", "-m", subject)
    return git("rev-list", "--reverse", "HEAD").split()


def busy_record(rng: random.Random) -> dict:
    """A boot's contention record (``provenance["contention"]``) on a host where other
    jobs ran: foreign CPU and CPU pressure above their thresholds, the busiest
    processes outside the server's tree named, as the monitor stores them."""
    share = round(0.6 + 0.35 * rng.random(), 3)
    window = Window(seconds=12.0, cores=2,
                    figures={"foreign_cpu": round(2 * share, 3), "foreign_cpu_share": share,
                             "foreign_runnable_per_core": round(0.4 + rng.random(), 3),
                             "cpu_pressure": round(0.85 + 0.14 * rng.random(), 3), "io_pressure": 0.01,
                             "memory_pressure": 0.0, "steal": 0.0},
                    sources={"pressure": {"available": True}, "foreign_cpu": {"available": True}},
                    details={"top_foreign": [
                        {"name": "cc1plus", "command": "cc1plus -O2 -c kernels.cpp -o kernels.o", "pid": 4100 + i,
                         "cores": round(0.5 + 0.3 * rng.random(), 2)} for i in range(3)]})
    thresholds = Thresholds()
    return record(window, [window], judge(window, thresholds), thresholds)


def normalize(text: str, tmp: Path) -> str:
    """What differs between machines and days, replaced by a placeholder."""
    text = text.replace(str(tmp), "<tmp>")
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC( to \d\d:\d\d:\d\d)?", "<date>", text)
    text = re.sub(r"(?m)^- \*\*host\*\*: .*$", "- **host**: <host>", text)
    text = re.sub(r"bisect-harness \S+", "bisect-harness <version>", text)
    text = re.sub(r"\(sha256 [0-9a-f]{12}\)", "(sha256 <spec hash>)", text)
    text = re.sub(r"\d{4}-\d\d-\d\d-", "<day>-", text)
    # what boots took on this machine: a verdict's measured node time and a boot's price
    text = re.sub(r"samples, [0-9.]+ s of node time", "samples, <s> s of node time", text)
    text = re.sub(r"a boot costs [0-9.]+ s beside", "a boot costs <s> s beside", text)
    return text


@dataclass(frozen=True)
class Rendered:
    """A scenario's journal (normalized) and the ledger it was rendered from."""

    text: str
    db: Path


def _render(db: Path, tmp: Path) -> Rendered:
    with Ledger(f"sqlite:///{db}") as led:
        (run,) = led.runs()
        return Rendered(normalize(journal.render(led, run), tmp), db)


def verdicts_run(tmp: Path) -> Rendered:
    """``harness run`` of three hypotheses: one confirmed (1.5x), one refuted (no effect),
    one inconclusive (a 6% effect against a 10% claim at a wide spread); a few boots
    marked, one failed and booted again."""
    hyps = [
        {"id": "faster", "statement": "--x 1 makes decode at least 20% faster.", "baseline": {},
         "treatment": {"flags": {"x": 1}}, "metric": "tok_s", "expect": "increase", "min_effect": "20%"},
        {"id": "inert", "statement": "INERT=1 makes decode at least 20% faster.", "baseline": {},
         "treatment": {"env": {"INERT": "1"}}, "metric": "tok_s", "expect": "increase", "min_effect": "20%"},
        {"id": "borderline", "baseline": {}, "treatment": {"flags": {"y": 1}}, "metric": "tok_s",
         "expect": "increase", "min_effect": "10%"}]
    spec = load_spec(write_spec(tmp / "hypotheses.yaml", engine=ENGINE, hypotheses=hyps,
                                defaults={"boots_per_arm": 3, "max_boots_per_arm": 5, "samples_per_boot": 2,
                                          "host_preflight_s": 0}))
    plan = make_plan(spec)

    def level(r):
        flags = dict(r.flags)
        return 150.0 if flags.get("x") else 106.0 if flags.get("y") else 100.0

    def mark(r, k):
        return (("usage_mismatch",) if dict(r.flags).get("y") and k % 2 else ()), {}

    seeded = Seeded(level, between=0.02, mark=mark,
                    fail=lambda r, k: not r.flags and not r.arm_env and k == 1)
    wide = Seeded(level, between=0.09, mark=mark)  # the borderline claim's arms: a wide spread between boots
    backend = MockBackend(lambda r: (wide if dict(r.flags).get("y") else seeded)(r), name="seeded")
    db = tmp / "run.db"
    with Ledger(f"sqlite:///{db}") as led:
        Executor(plan, led, log_dir=tmp / "logs", calibrate=False, order_seed=11, backend=backend).execute()
    return _render(db, tmp)


def busy_bisection(tmp: Path) -> Rendered:
    """``harness bisect`` over 16 commits, the step at the 11th, on a host where other
    jobs ran: most boots marked ``host_busy`` with their figures."""
    subjects = [f"engine: change {i}" for i in range(16)]
    subjects[11] = "decode: copy the KV cache on every step"
    order = history(tmp / "engine", subjects)
    spec = load_spec(write_spec(tmp / "bisect.yaml", engine={**ENGINE, "repo": str(tmp / "engine")},
                                hypotheses=[{"id": "h", "baseline": {}, "treatment": {}, "metric": "tok_s",
                                             "expect": "decrease", "min_effect": "10%"}],
                                defaults={"samples_per_boot": 2, "host_preflight_s": 0}))

    def mark(r, k):
        rng = _rng("busy", r.config_key, k)
        if rng.random() < 0.9:
            return ("host_busy",), {"contention": busy_record(rng)}
        return (), {}

    seeded = Seeded(lambda r: 80.0 if order.index(r.commit) >= 11 else 100.0, between=0.05, mark=mark)
    db = tmp / "bisect.db"
    with Ledger(f"sqlite:///{db}") as led:
        bisect_range(spec, led, BisectRequest(order[0], order[-1], "tok_s", SearchOptions(max_boots=60)),
                     MeasureSetup(tmp / "logs", cache_dir=tmp / "cache", backend=seeded.backend))
    return _render(db, tmp)


def explanation(tmp: Path) -> Rendered:
    """``harness explain``: the slow arm differs by three env vars; A and B together
    make it 25% slower, each alone or C changes nothing."""
    spec = load_spec(write_spec(tmp / "explain.yaml", engine=ENGINE,
                                hypotheses=[{"id": "tuned", "baseline": {},
                                             "treatment": {"env": {"A": "1", "B": "1", "C": "1"}},
                                             "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}],
                                defaults={"boots_per_arm": 3, "max_boots_per_arm": 6, "samples_per_boot": 2,
                                          "host_preflight_s": 0}))

    def level(r):
        env = dict(r.arm_env)
        return 75.0 if env.get("A") == "1" and env.get("B") == "1" else 100.0

    db = tmp / "explain.db"
    with Ledger(f"sqlite:///{db}") as led:
        explain_file(spec, led, "tuned.baseline", "tuned.treatment", ExplainOptions(alpha=0.01),
                     MeasureSetup(tmp / "logs", backend=Seeded(level, between=0.02).backend, order_seed=5))
    return _render(db, tmp)


SCENARIOS = {"verdicts": verdicts_run, "busy-bisection": busy_bisection, "explanation": explanation}
