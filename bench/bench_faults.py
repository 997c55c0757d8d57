"""Benchmark: bisections and explain searches under boot faults, through the harness's own loops.

Every other bisection bench drives the pure search; this one drives
``harness bisect`` as it runs (``bisect_runner.bisect_range``: the scheduler's one
measuring call, its failure policy, the ledger, the search) over a real git
history of ``COMMITS`` commits, with one fake at the seam: the mock backend,
whose boots draw their tok/s from ``bench/noise.py``'s host models and fail the
way real engines fail. Scenarios (each on every noise model):

* ``fail0`` / ``fail5`` / ``fail10`` / ``fail20``: each boot fails at random with
  that probability (a server that exits before it is ready: out of memory, a port
  in use, an NCCL timeout), whatever its commit;
* ``unbuildable_parent``: the culprit's parent does not build (a recipe failure,
  never retried); the right answer is the set {parent, culprit}, or the culprit;
* ``endpoint_flaky``: the good endpoint's first two boots fail, then it boots.

The culprit is a ``CHANGE`` step (tok/s drops) at a uniform position in
2..COMMITS-1. Per model and scenario: ``top1`` (the culprit named, or for
``unbuildable_parent`` a verified set that holds it), ``confident_wrong`` (a
culprit or a verified set that misses it), ``stopped`` (each stop reason's
share), ``mean_boots`` (every boot booted, failed ones too), ``not_ended``
(searches that hit the trial's boot guard instead of ending) and ``seconds``.
``goals`` checks the issue's: at 10% failures top-1 at least 90% of the
no-failure figure, ``endpoint-unmeasurable`` at most 2%, confident-wrong at most
1%, every search ends.

**Explain searches** (``--parts explain``) drive ``harness explain`` as it runs
(``explain_runner.explain_file``: the scheduler's one measuring call, its failure
policy, the ledger, ``analysis.explain``) between two arms that differ in six ways
(``EXPLAIN_DIFFS``: three env variables, two flags, the commit), one of them, drawn
at random per trial, the planted cause (``EXPLAIN_CAUSE``: 12% slower when set to
its slow value; min_effect 5%); a commit cause is also bisected, as the command
does. The same kind of fake at the seam draws each boot from the host model
(under ``unequal_variance`` the configs holding more than half of the differences
are the noisy ones, as in ``bench_explain.py``). Scenarios: ``fail0`` /
``fail10`` / ``fail20`` (boots failing at random) and ``refused_flag`` (the fast
commit refuses ``--new-path``, a flag of the slow arm: every configuration that
sets it on the fast commit is a recipe failure, so leaving the commit out cannot
be measured). Per model and scenario: ``exact`` (a confident set equal to the
planted one, nothing else claimed), ``found`` (the planted cause claimed, nothing
else, though other differences may be left undecided), ``confident_wrong`` (a claim of an inert
difference, as a member, an opposite sign or an interaction, or a confident set
without the cause), ``stopped`` (each stop reason's share, ``aborted`` where the
search raised instead of ending, ``not-ended`` where it hit a backstop: more than
``EXPLAIN_GUARD`` boots, or ``EXPLAIN_IDLE_CALLS`` measuring calls in a row that
booted nothing), ``mean_boots`` (every boot, failed ones and the bisection's too).

Run: ``python bench/bench_faults.py [--trials 30] [--explain-trials 6] [--seed 0]
[--models a,b] [--scenarios a,b] [--explain-scenarios a,b] [--parts bisect,explain]``
(``--parts explain`` at the default runs in about four minutes on two busy cores).
The last line printed is one JSON object with every figure.
To compare two versions of the harness, run it under each one's tree
(``PYTHONPATH=that/tree``): the backend seam is the same (trees with
``backends.mock``; an older tree runs this file as that tree has it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from noise import MODELS, Host  # noqa: E402

from bisect_harness.backends.mock import MockBackend, failed  # noqa: E402
from bisect_harness.boot import BootOutcome, SampleOutcome  # noqa: E402
from bisect_harness.errors import HarnessError  # noqa: E402
from bisect_harness.spec import load_spec  # noqa: E402
from bisect_harness.run import scheduler as _scheduler  # noqa: E402
from bisect_harness.decide.bisect.options import SearchOptions  # noqa: E402
from bisect_harness.run.bisect_runner import BisectRequest, MeasureSetup, bisect_range  # noqa: E402
from bisect_harness.run.explain_runner import ExplainOptions, explain_file  # noqa: E402
from bisect_harness.record.ledger import Ledger  # noqa: E402

COMMITS = 32
BASE = 100.0
CHANGE = -0.08
BUDGET = 150          # the CLI's default --max-boots
CONFIDENCE = 0.95
SCENARIOS = ("fail0", "fail5", "fail10", "fail20", "unbuildable_parent", "endpoint_flaky")
#: a backstop far above the budget: a search that books this many boots did not end
GUARD = 4 * BUDGET


def _ok(samples) -> BootOutcome:
    return BootOutcome(boot_id=0, status="ok", samples=tuple(
        SampleOutcome(seq=k + 1, metrics={"tok_s": float(v)}, requests=1, output_tokens=16, duration_s=0.1)
        for k, v in enumerate(samples)))


class Faults:
    """The mock backend's handler (``self.backend``): boots nothing, each request becomes
    an outcome drawn from a noisy host with faults."""

    def __init__(self, host: Host, shas: list[str], culprit: int, scenario: str, rng: np.random.Generator):
        self.host, self.rng, self.scenario = host, rng, scenario
        self.index = {sha: i for i, sha in enumerate(shas)}
        self.culprit = culprit
        self.fail_p = float(scenario[4:]) / 100 if scenario.startswith("fail") else 0.0
        self.booted: dict[int, int] = {}
        self.total = 0
        self.backend = MockBackend(self, name="faults")

    def __call__(self, r) -> BootOutcome:
        i = self.index[r.commit]
        self.total += 1
        if self.total > GUARD:
            raise RuntimeError(f"the search booted {GUARD} boots with a budget of {BUDGET}: it does not end")
        seen = self.booted[i] = self.booted.get(i, 0) + 1
        if self.scenario == "unbuildable_parent" and i == self.culprit - 1:
            return failed("build failed (injected)", config_status="build_failed")
        if self.scenario == "endpoint_flaky" and i == 0 and seen <= 2:
            return failed("server exited before ready (injected)")
        if self.rng.random() < self.fail_p:
            return failed("server exited before ready (injected)")
        bad = i >= self.culprit
        return _ok(self.host.boot(BASE * (1 + CHANGE) if bad else BASE, noisy=bad))


def make_history(root: Path) -> list[str]:
    """A real git repository of COMMITS commits (oldest first)."""
    repo = root / "engine"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
    for i in range(COMMITS):
        (repo / "VERSION").write_text(f"{i}\n")
        subprocess.run(["git", "-C", str(repo), "add", "VERSION"], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", f"commit {i}"], check=True, env=env)
    out = subprocess.run(["git", "-C", str(repo), "rev-list", "--reverse", "HEAD"], check=True, env=env,
                         capture_output=True, text=True).stdout.split()
    return out


def write_spec(root: Path) -> Path:
    doc = {"version": 1,
           "engine": {"repo": str(root / "engine"), "preset": "openai", "launch": ["never-launched", "{port}"]},
           "defaults": {"host_preflight_s": 0, "samples_per_boot": 3},
           "hypotheses": [{"id": "h", "baseline": {}, "treatment": {"env": {"X": "1"}}, "metric": "tok_s",
                           "expect": "decrease", "min_effect": "5%"}]}
    path = root / "hypotheses.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def trial(root: Path, spec, shas: list[str], model: str, scenario: str, seed) -> dict:
    rng = np.random.default_rng(seed)
    culprit = int(rng.integers(2, COMMITS))
    faults = Faults(Host(model, np.random.default_rng(rng.integers(2**63))), shas, culprit, scenario, rng)
    db = root / f"t-{rng.integers(2**62)}.db"
    with Ledger(f"sqlite:///{db}") as led:
        try:
            request = BisectRequest(shas[0], shas[-1], "tok_s", SearchOptions(confidence=CONFIDENCE, max_boots=BUDGET),
                                    first_parent=True)
            out, _ = bisect_range(spec, led, request,
                                  MeasureSetup(root / "logs", cache_dir=root / "cache", backend=faults.backend))
        except RuntimeError as exc:
            return {"ended": False, "stopped": "not-ended", "right": False, "wrong": False,
                    "boots": faults.total, "why": str(exc)}
    db.unlink(missing_ok=True)
    truth = shas[culprit]
    cset = list(out.candidate_set)
    answered = out.stopped in ("confident", "ambiguous-skips")
    named = [out.culprit] if out.culprit else (cset if out.stopped == "ambiguous-skips" else [])
    right = answered and truth in named and (len(named) == 1 or scenario == "unbuildable_parent")
    return {"ended": True, "stopped": out.stopped, "right": bool(right),
            "wrong": bool(answered and truth not in named), "boots": faults.total}


# --- explain searches ---------------------------------------------------------------

#: the differences between the two arms of the explain spec: (name, kind, key, fast, slow);
#: None is "not set on that side". The commit is the last of the history against the one before.
EXPLAIN_DIFFS = (("env:EXPLAIN_A", "env", "EXPLAIN_A", "1", "2"),
                 ("env:EXPLAIN_B", "env", "EXPLAIN_B", None, "on"),
                 ("env:EXPLAIN_C", "env", "EXPLAIN_C", "on", None),
                 ("flag:batch-size", "flag", "batch-size", 8, 16),
                 ("flag:new-path", "flag", "new-path", None, "true"),
                 ("commit", "commit", None, None, None))
EXPLAIN_CAUSE = 0.12      # the planted cause: 12% slower when set to its slow value
EXPLAIN_MIN_EFFECT = 0.05
EXPLAIN_ALPHA = 0.01      # the CLI's default --alpha
EXPLAIN_SCENARIOS = ("fail0", "fail10", "fail20", "refused_flag")
#: backstops: a search that books this many boots, or asks the measuring call this many
#: times in a row without a boot, did not end (the paired tests cap at 8 boots a side and
#: the blocks at 16 rounds: a search of 6 differences books a few hundred at most)
EXPLAIN_GUARD = 3000
EXPLAIN_IDLE_CALLS = 200


class NotEnded(Exception):
    """A search hit one of the bench's backstops."""


class Explained:
    """The mock backend's handler (``self.backend``): boots nothing. A config's level is
    BASE, or BASE * (1 - EXPLAIN_CAUSE) when the planted cause is at its slow value;
    boots draw from a noisy host and fail at random. ``refused_flag``: the fast commit
    refuses ``--new-path`` (a flag the slow commit added): every config that sets it on
    the fast commit is a recipe failure."""

    def __init__(self, host: Host, fast_sha: str, slow_sha: str, cause: str, scenario: str,
                 rng: np.random.Generator):
        self.host, self.rng, self.scenario, self.cause = host, rng, scenario, cause
        self.fast_sha, self.slow_sha = fast_sha, slow_sha
        self.fail_p = float(scenario[4:]) / 100 if scenario.startswith("fail") else 0.0
        self.total = 0
        self.backend = MockBackend(self, name="faults")

    def _slow_values(self, r) -> set:
        """The differences this request sets to their slow values."""
        env, flags, out = dict(r.arm_env), dict(r.flags), set()
        for name, kind, key, _fast, slow in EXPLAIN_DIFFS:
            if kind == "commit":
                here = r.commit == self.slow_sha
            else:
                src = env if kind == "env" else flags
                here = (key in src and str(src[key]) == str(slow)) if slow is not None else key not in src
            if here:
                out.add(name)
        return out

    def __call__(self, r) -> BootOutcome:
        self.total += 1
        if self.total > EXPLAIN_GUARD:
            raise NotEnded(f"booted {EXPLAIN_GUARD} boots")
        slow = self._slow_values(r)
        if self.scenario == "refused_flag" and r.commit == self.fast_sha and "flag:new-path" in slow:
            return failed("engine refused --new-path (injected: the fast commit has no such flag)",
                          config_status="boot_failed")
        if self.rng.random() < self.fail_p:
            return failed("server exited before ready (injected)")
        mu = BASE * (1 - EXPLAIN_CAUSE) if self.cause in slow else BASE
        return _ok(self.host.boot(mu, noisy=len(slow) > len(EXPLAIN_DIFFS) / 2))


def write_explain_spec(root: Path, fast_sha: str, slow_sha: str) -> Path:
    arms = {"baseline": {"commit": fast_sha, "env": {}, "flags": {}},
            "treatment": {"commit": slow_sha, "env": {}, "flags": {}}}
    for _name, kind, key, fast, slow in EXPLAIN_DIFFS:
        if kind == "commit":
            continue
        for side, v in (("baseline", fast), ("treatment", slow)):
            if v is not None:
                arms[side]["env" if kind == "env" else "flags"][key] = v
    doc = {"version": 1,
           "engine": {"repo": str(root / "engine"), "preset": "openai", "launch": ["never-launched", "{port}"]},
           "defaults": {"host_preflight_s": 0, "samples_per_boot": 3},
           "hypotheses": [{"id": "x", **arms, "metric": "tok_s", "expect": "decrease",
                           "min_effect": f"{EXPLAIN_MIN_EFFECT:.0%}"}]}
    path = root / "explain.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class _Guarded:
    """Counts the measuring calls of a search that boot nothing, in a row; past
    EXPLAIN_IDLE_CALLS the search is looping without booting. The call itself is the
    harness's own (this only watches it)."""

    def __init__(self, explained: Explained):
        self.explained, self.idle, self.real = explained, 0, _scheduler.Scheduler.measure

    def __enter__(self):
        real, guard = self.real, self

        def measure(sched, *a, **k):
            before = guard.explained.total
            out = real(sched, *a, **k)
            guard.idle = 0 if guard.explained.total > before else guard.idle + 1
            if guard.idle > EXPLAIN_IDLE_CALLS:
                raise NotEnded(f"{EXPLAIN_IDLE_CALLS} measuring calls in a row booted nothing")
            return out
        _scheduler.Scheduler.measure = measure
        return self

    def __exit__(self, *exc):
        _scheduler.Scheduler.measure = self.real
        return False


def explain_trial(root: Path, spec, fast_sha: str, slow_sha: str, model: str, scenario: str, seed) -> dict:
    rng = np.random.default_rng(seed)
    cause = EXPLAIN_DIFFS[int(rng.integers(len(EXPLAIN_DIFFS)))][0]
    explained = Explained(Host(model, np.random.default_rng(rng.integers(2**63))), fast_sha, slow_sha,
                             cause, scenario, rng)
    db = root / f"x-{rng.integers(2**62)}.db"
    with Ledger(f"sqlite:///{db}") as led, _Guarded(explained):
        try:
            # order_seed: a seeded search
            setup = MeasureSetup(root / "logs", cache_dir=root / "cache", backend=explained.backend,
                                 order_seed=int(rng.integers(2**31)))
            out, _ = explain_file(spec, led, "x.baseline", "x.treatment", ExplainOptions(alpha=EXPLAIN_ALPHA), setup)
        except NotEnded as exc:
            return {"ended": False, "stopped": "not-ended", "exact": False, "found": False, "wrong": False,
                    "boots": explained.total, "cause": cause, "why": str(exc)}
        except HarnessError as exc:  # the search gave up on the whole explain
            return {"ended": True, "stopped": "aborted", "exact": False, "found": False, "wrong": False,
                    "boots": explained.total, "cause": cause, "why": str(exc)}
    db.unlink(missing_ok=True)
    e = out.explanation
    claims = set(e.members) | set(e.opposite) | {d for p in e.interactions for d in p}
    exact = e.confident and set(e.members) == {cause} and claims == {cause}
    found = set(e.members) == {cause} and claims == {cause}  # claimed, maybe not as the whole set
    wrong = bool(claims - {cause}) or (e.confident and cause not in e.members)
    stopped = out.record.get("stopped") or ("explained" if e.confident else "no-slowdown"
                                            if e.slowdown.outcome != "confirmed" else "undecided")
    return {"ended": True, "stopped": stopped, "exact": bool(exact), "found": bool(found), "wrong": bool(wrong),
            "boots": explained.total, "cause": cause, "bisected": "bisection" in out.record}


def run_explain(root: Path, shas: list[str], models, scenarios, trials: int, seed: int) -> dict:
    spec = load_spec(write_explain_spec(root, shas[-2], shas[-1]))
    results: dict = {}
    for model in models:
        for scenario in scenarios:
            t0 = time.perf_counter()
            seeds = np.random.default_rng([seed, 1000 + MODELS.index(model), EXPLAIN_SCENARIOS.index(scenario)]
                                          ).integers(0, 2**63 - 1, size=trials)
            rows = [explain_trial(root, spec, shas[-2], shas[-1], model, scenario, int(s)) for s in seeds]
            stopped: dict[str, int] = {}
            for r in rows:
                stopped[r["stopped"]] = stopped.get(r["stopped"], 0) + 1
            cell = {"exact": float(np.mean([r["exact"] for r in rows])),
                    "found": float(np.mean([r["found"] for r in rows])),
                    "confident_wrong": float(np.mean([r["wrong"] for r in rows])),
                    "stopped": {k: v / len(rows) for k, v in sorted(stopped.items())},
                    "mean_boots": float(np.mean([r["boots"] for r in rows])),
                    "not_ended": sum(not r["ended"] for r in rows),
                    "why_not_ended": sorted({r["why"] for r in rows if not r["ended"]}),
                    "aborted": sorted({r["why"][:160] for r in rows if r["stopped"] == "aborted"}),
                    "seconds": round(time.perf_counter() - t0, 1)}
            results.setdefault(model, {})[scenario] = cell
            print(f"explain {model:17s} {scenario:13s} exact {cell['exact']:.2f} found {cell['found']:.2f} "
                  f"wrong {cell['confident_wrong']:.3f} "
                  f"boots {cell['mean_boots']:.0f} stopped {cell['stopped']}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30, help="bisections per model and scenario")
    parser.add_argument("--explain-trials", type=int, default=6, help="explain searches per model and scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="bisection scenarios")
    parser.add_argument("--explain-scenarios", default=",".join(EXPLAIN_SCENARIOS))
    parser.add_argument("--parts", default="bisect,explain", help="bisect, explain or both")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    scenarios = [s for s in args.scenarios.split(",") if s]
    x_scenarios = [s for s in args.explain_scenarios.split(",") if s]
    parts = [p for p in args.parts.split(",") if p]
    for m in models:
        if m not in MODELS:
            parser.error(f"--models: unknown noise model {m!r}; one of {', '.join(MODELS)}")
    for s in scenarios:
        if s not in SCENARIOS:
            parser.error(f"--scenarios: unknown scenario {s!r}; one of {', '.join(SCENARIOS)}")
    for s in x_scenarios:
        if s not in EXPLAIN_SCENARIOS:
            parser.error(f"--explain-scenarios: unknown scenario {s!r}; one of {', '.join(EXPLAIN_SCENARIOS)}")
    for p in parts:
        if p not in ("bisect", "explain"):
            parser.error(f"--parts: unknown part {p!r}; bisect, explain or both")
    t_all = time.perf_counter()
    results: dict = {}
    explained: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shas = make_history(root)
        spec = load_spec(write_spec(root))
        for model in models if "bisect" in parts else ():
            for scenario in scenarios:
                t0 = time.perf_counter()
                seeds = np.random.default_rng([args.seed, MODELS.index(model), SCENARIOS.index(scenario)]
                                              ).integers(0, 2**63 - 1, size=args.trials)
                rows = [trial(root, spec, shas, model, scenario, int(s)) for s in seeds]
                stopped: dict[str, int] = {}
                for r in rows:
                    stopped[r["stopped"]] = stopped.get(r["stopped"], 0) + 1
                cell = {"top1": float(np.mean([r["right"] for r in rows])),
                        "confident_wrong": float(np.mean([r["wrong"] for r in rows])),
                        "stopped": {k: v / len(rows) for k, v in sorted(stopped.items())},
                        "mean_boots": float(np.mean([r["boots"] for r in rows])),
                        "not_ended": sum(not r["ended"] for r in rows),
                        "seconds": round(time.perf_counter() - t0, 1)}
                results.setdefault(model, {})[scenario] = cell
                print(f"{model:17s} {scenario:19s} top1 {cell['top1']:.2f} wrong {cell['confident_wrong']:.3f} "
                      f"boots {cell['mean_boots']:.0f} stopped {cell['stopped']}", flush=True)
        if "explain" in parts:
            explained = run_explain(root, shas, models, x_scenarios, args.explain_trials, args.seed)
    goals = {}
    for model, cells in results.items():
        if "fail0" in cells and "fail10" in cells:
            goals[f"{model}_fail10_top1_at_least_0.9_of_fail0"] = cells["fail10"]["top1"] >= 0.9 * cells["fail0"]["top1"]
        if "fail10" in cells:
            goals[f"{model}_fail10_endpoint_unmeasurable_at_most_0.02"] = \
                cells["fail10"]["stopped"].get("endpoint-unmeasurable", 0.0) <= 0.02
    if results:
        goals["confident_wrong_at_most_0.01"] = all(c["confident_wrong"] <= 0.01 for m in results.values()
                                                    for c in m.values())
        goals["every_search_ends"] = all(c["not_ended"] == 0 for m in results.values() for c in m.values())
    if explained:
        cells = [c for m in explained.values() for c in m.values()]
        goals["explain_confident_wrong_at_most_0.01"] = all(c["confident_wrong"] <= 0.01 for c in cells)
        goals["explain_every_search_ends"] = all(c["not_ended"] == 0 for c in cells)
        goals["explain_no_search_aborted"] = all("aborted" not in c["stopped"] for c in cells)
    print(json.dumps({"commits": COMMITS, "change": CHANGE, "budget": BUDGET, "confidence": CONFIDENCE,
                      "trials": args.trials, "seed": args.seed, "results": results,
                      "explain": {"differences": [d[0] for d in EXPLAIN_DIFFS], "cause_effect": -EXPLAIN_CAUSE,
                                  "min_effect": EXPLAIN_MIN_EFFECT, "alpha": EXPLAIN_ALPHA,
                                  "trials": args.explain_trials, "results": explained},
                      "goals": goals, "seconds": round(time.perf_counter() - t_all, 1)}))


if __name__ == "__main__":
    main()
