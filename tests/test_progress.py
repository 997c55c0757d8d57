"""Progress lines as a run prints them (``report.progress``): each config told apart by
what sets it apart from its hypothesis' other arm, and boots counted against a budget
that holds the boots booted again.

The runs are real (the hypothesis loop, a bisection over a real git history, a real
SQLite ledger); the boots come from the mock backend.
"""

from __future__ import annotations

import io
import re

from rich.console import Console

from bisect_harness.backends.mock import MockBackend, failed
from bisect_harness.model import Arm
from bisect_harness.plan.build import make_plan
from bisect_harness.record.ledger import Ledger
from bisect_harness.report.progress import LinesObserver, config_labels
from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.run.bisect_runner import BisectRequest, MeasureSetup, bisect_range
from bisect_harness.run.executor import Executor
from bisect_harness.spec import load_spec
from helpers import write_spec
from journal_scenarios import ENGINE, history

#: a baseline whose label alone runs past 60 characters: cut there, every arm read alike
LONG_ENV = {"LLAMA_ARG_CTX_SIZE": "8192", "LLAMA_ARG_THREADS": "16", "LLAMA_ARG_N_GPU_LAYERS": "99"}


def _lines(tmp_path, hypotheses, defaults, answer) -> list[str]:
    spec = load_spec(write_spec(tmp_path / "h.yaml", engine=ENGINE, hypotheses=hypotheses,
                                defaults={"samples_per_boot": 1, "host_preflight_s": 0, **defaults}))
    out = io.StringIO()
    obs = LinesObserver(Console(file=io.StringIO(), width=200), stream=out)
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        Executor(make_plan(spec), led, log_dir=tmp_path / "logs", calibrate=False, order_seed=1, observer=obs,
                 backend=MockBackend(answer)).execute()
    return [ln for ln in out.getvalue().splitlines() if ln.startswith("boot ")]


def _label(line: str) -> str:
    return re.match(r"boot \d+ \((.*), #\d+\): ", line).group(1)


def test_each_config_is_labelled_by_what_sets_it_apart_not_by_a_cut_prefix(tmp_path):
    """The baseline, ``-md`` alone and the working draft: cut at 60 characters they
    all printed the baseline's env; now each prints what it adds to (or lacks of) its
    hypothesis' other arm, and no two configs print the same label."""
    hyps = [{"id": "md-alone", "baseline": {"env": dict(LONG_ENV)},
             "treatment": {"env": dict(LONG_ENV), "flags": {"md": "draft.gguf"}},
             "metric": "tok_s", "expect": "increase", "min_effect": "10%"},
            {"id": "draft", "baseline": {"env": dict(LONG_ENV)},
             "treatment": {"env": {**LONG_ENV, "LLAMA_ARG_DRAFT_MAX": "8"}, "flags": {"md": "draft.gguf"}},
             "metric": "tok_s", "expect": "increase", "min_effect": "10%"}]
    lines = _lines(tmp_path, hyps, {"boots_per_arm": 2, "max_boots_per_arm": 2}, lambda r: [100.0 + r.boot_id])
    labels = {_label(ln) for ln in lines}
    assert labels == {"no --md", "+--md=draft.gguf", "+LLAMA_ARG_DRAFT_MAX=8 +--md=draft.gguf"}, lines
    plan = make_plan(load_spec(tmp_path / "h.yaml"))
    assert len(set(config_labels(plan).values())) == len(plan.configs) == 3


def test_labels_that_would_read_alike_keep_the_whole_config():
    """Two hypotheses whose treatments differ from their own baselines in the same way
    print the whole config for both, never one label for two configs."""
    from types import SimpleNamespace

    from bisect_harness.plan.build import PlannedConfig

    a, b = PlannedConfig("a", Arm("1" * 40)), PlannedConfig("b", Arm("1" * 40, flags={"md": "x"}))
    c, d = PlannedConfig("c", Arm("2" * 40)), PlannedConfig("d", Arm("2" * 40, flags={"md": "x"}))
    plan = SimpleNamespace(configs=(a, b, c, d), hypotheses=(SimpleNamespace(baseline=a, treatment=b),
                                                              SimpleNamespace(baseline=c, treatment=d)))
    assert config_labels(plan) == {"a": "1111111111", "b": "1111111111 --md=x", "c": "2222222222",
                                   "d": "2222222222 --md=x"}
    assert Arm("1" * 40, env={"P": "LL"}).describe_against(Arm("1" * 40, env={"P": "Simple", "Q": "1"})) == \
        "P=LL no Q"


def test_a_bisections_configs_read_as_their_commits(tmp_path):
    order = history(tmp_path / "engine", [f"change {i}" for i in range(6)])
    spec = load_spec(write_spec(tmp_path / "b.yaml", engine={**ENGINE, "repo": str(tmp_path / "engine")},
                                hypotheses=[{"id": "h", "baseline": {}, "treatment": {"env": LONG_ENV},
                                             "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}],
                                defaults={"samples_per_boot": 1, "host_preflight_s": 0}))
    out = io.StringIO()
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        bisect_range(spec, led, BisectRequest(order[0], order[-1], "tok_s", SearchOptions(max_boots=12)),
                     MeasureSetup(tmp_path / "logs", cache_dir=tmp_path / "cache",
                                  observer=LinesObserver(Console(file=io.StringIO()), budget=12, stream=out),
                                  backend=MockBackend(lambda r: [70.0 if order.index(r.commit) >= 3 else 100.0])))
    labels = {_label(ln) for ln in out.getvalue().splitlines() if ln.startswith("boot ")}
    assert labels and labels <= {sha[:10] for sha in order}, labels


def test_a_retried_boot_counts_against_a_budget_that_holds_the_retries(tmp_path):
    """A boot that failed is booted again: the line counted ``5/4 boots`` against a budget
    of ``max_boots_per_arm`` per config. The budget now holds each config's retries
    (``boot_retries + 1``), the count never passes it, and the line says what failed."""
    hyps = [{"id": "h", "baseline": {}, "treatment": {"flags": {"x": 1}}, "metric": "tok_s", "expect": "increase",
             "min_effect": "10%"}]
    seen = []

    def answer(r):
        seen.append(r.config_key)
        if not r.flags and seen.count(r.config_key) == 1:
            return failed("the server exited 1 (scripted)")
        return [150.0 if r.flags else 100.0]

    lines = _lines(tmp_path, hyps, {"boots_per_arm": 2, "max_boots_per_arm": 2, "boot_retries": 1}, answer)
    counts = [re.search(r"; (\d+)/(\d+) boots( \(1 failed\))?$", ln) for ln in lines]
    assert all(counts), lines
    assert [(int(m.group(1)), int(m.group(2))) for m in counts] == [(k, 8) for k in range(1, 6)], lines
    assert lines[-1].endswith("; 5/8 boots (1 failed)"), lines
