"""The package's layers run one way: in its imports, and in the calls a run makes.

``docs/design.md`` draws the package as layers (:data:`LAYERS`, lowest first: the
shared vocabulary, demo, process, measure and observe, engines, decide, backends,
spec, plan, record, report, run, cli), each using only those below it. Two checks
hold the code to that picture:

* the imports, read from the source (module level and inside functions): no import
  cycle between modules, and no import of a layer above (:data:`UP_IMPORTS` is empty:
  deciding reads values, the boots as the frozen records ``record.ledger.boot_records``
  makes of the rows and the rules ``plan.build.verdict_rules`` reads from the spec,
  never the ledger or the spec itself);
* the calls, traced while the harness runs (``sys.setprofile``): a run of
  ``harness run`` whose hypotheses go on to a bisection and an explanation, and a
  ``harness bisect``, through the mock backend (boots nothing: its values depend on the
  commit and the flags), and one real boot of the demo engine through the local
  backend. A call from a module into one of a layer above is a callback: the searches
  are stepped by their drivers (``BisectionSearch.next_round``,
  ``ExplainSearch.next_config``) and the backends hand their events back to the
  scheduler that records them, rather than calling up into them, so the only calls
  up are the ones named in :data:`UP_CALLS`, each with why it is there.
"""

from __future__ import annotations

import ast
import json
import random
import sys
import threading
from collections import defaultdict
from pathlib import Path

import pytest

import bisect_harness
from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import SampleOutcome
from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.spec import load_spec
from bisect_harness.run.bisect_runner import BisectRequest, MeasureSetup, bisect_range
from bisect_harness.run.executor import Executor
from bisect_harness.run.nightly import NightlyOptions, run_nightly
from bisect_harness.plan.build import make_plan
from bisect_harness.report import journal
from bisect_harness.record.ledger import Ledger
from helpers import SMALL_BENCH, git, query, write_spec

PACKAGE = Path(bisect_harness.__file__).parent

#: the layers, lowest first (design.md's picture, read upwards)
LAYERS = [{"model", "secrets", "errors", "places", "defaults", "kinds", "__init__", "boot", "evidence",
           "workload"}, {"demo"}, {"process"},
          {"measure"}, {"observe"}, {"engines"}, {"decide"}, {"backends"}, {"spec"}, {"plan"}, {"record"},
          {"report"}, {"run"}, {"cli"}]

#: imports of a layer above, (importing module, imported module): why each may stay
UP_IMPORTS: dict[tuple[str, str], str] = {}

#: calls into a module of a layer above, (calling module, called module): why each may stay
UP_CALLS: dict[tuple[str, str], str] = {}


def _module(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return "/".join(rel.parts[:-1]) if rel.name == "__init__" and len(rel.parts) > 1 else "/".join(rel.parts)


def _rank(module: str) -> int:
    top = module.split("/")[0]
    return next(i for i, layer in enumerate(LAYERS) if top in layer)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in sorted(PACKAGE.rglob("*.py")) if "demo/engine" not in p.as_posix()}


def _imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (relative and absolute, at any depth)."""
    mods = _modules()
    out: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition("/")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # from . / from .. : up from the importing module's package
                    parts = [p for p in package.split("/") if p]
                    target = parts[:len(parts) - (node.level - 1)] + (node.module.split(".") if node.module else [])
                elif node.module and node.module.split(".")[0] == "bisect_harness":
                    target = node.module.split(".")[1:]
                else:
                    continue
                names = [target + [a.name] for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "bisect_harness"]
            else:
                continue
            for parts in names:
                while parts and "/".join(parts) not in mods:
                    parts = parts[:-1]
                found = "/".join(parts) if parts else "__init__"
                if found != mod and found in mods:
                    out[mod].add(found)
    return out


def test_the_house_has_no_module_over_700_lines_and_no_room_over_a_fifth_of_the_package():
    """A module does one job and a room holds one concern: the shape design.md draws."""
    lines = {p: len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {str(p.relative_to(PACKAGE)): n for p, n in lines.items() if n > 700}
    assert not long, f"modules over 700 lines: {long}"
    rooms: dict[str, int] = defaultdict(int)
    for p, n in lines.items():
        rooms[p.relative_to(PACKAGE).parts[0]] += n
    total = sum(rooms.values())
    big = {room: f"{n / total:.0%}" for room, n in rooms.items() if n > 0.2 * total}
    assert not big, f"rooms over 20% of the package's {total} lines: {big}"


def test_no_module_imports_a_layer_above_it_or_itself_in_a_cycle():
    graph = _imports()
    assert sum(len(v) for v in graph.values()) > 200  # the reader found the package's imports
    up = {(a, b) for a, targets in graph.items() for b in targets if _rank(b) > _rank(a)}
    assert up <= set(UP_IMPORTS), f"imports of a layer above, not in UP_IMPORTS: {sorted(up - set(UP_IMPORTS))}"
    # No cycle: every module can be placed after all it imports.
    placed: set[str] = set()
    left = set(_modules())
    while left:
        ready = {m for m in left if graph.get(m, set()) <= placed}
        assert ready, f"import cycle among: {sorted(left)}"
        placed |= ready
        left -= ready


# ------------------------------------------------------------------ the calls, traced


def _ours(filename: str) -> bool:
    """Code of one of the package's modules (not a test's, a library's or a compiled template's)."""
    return filename.startswith(str(PACKAGE)) and filename.endswith(".py")


#: ``boot.deliver`` (and its dispatch) call only what their caller handed them, the
#: backend's events and the caller's sink: a call out of them is their caller's (the
#: scheduler steps its backend's events into its own recorder through them)
_RELAYS = {(str(PACKAGE / "boot.py"), "deliver"), (str(PACKAGE / "boot.py"), "_dispatch")}


def _relays(code) -> bool:
    return (code.co_filename, code.co_name) in _RELAYS


class _Calls:
    """Every call from one module of the package into another, while active."""

    def __init__(self):
        self.seen: dict[tuple[str, str], str] = {}
        self.lock = threading.Lock()

    def _hook(self, frame, event, arg):
        if event != "call":
            return
        callee = frame.f_code.co_filename
        if not _ours(callee):
            return
        caller = frame.f_back
        while caller is not None and (not _ours(caller.f_code.co_filename) or _relays(caller.f_code)):
            # through the standard library, a template, a test's own code or boot.deliver
            caller = caller.f_back
        if caller is None or caller.f_code.co_filename == callee:
            return
        pair = (_module(Path(caller.f_code.co_filename)), _module(Path(callee)))
        with self.lock:
            self.seen.setdefault(pair, f"{caller.f_code.co_qualname} -> {frame.f_code.co_qualname}")

    def __enter__(self):
        threading.setprofile(self._hook)
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        threading.setprofile(None)

    def up(self) -> dict[tuple[str, str], str]:
        return {pair: where for pair, where in self.seen.items() if _rank(pair[1]) > _rank(pair[0])}


def commit_backend(order: list[str], culprit: int) -> MockBackend:
    """Boots nothing: each request comes back ok, its tok_s lower from commit ``culprit``
    on and with flag ``slow`` set, drawn with a seeded spread."""
    rng = random.Random(5)

    def answer(r):
        level = 100.0 * (0.7 if order.index(r.commit) >= culprit else 1.0)
        level *= 0.8 if dict(r.flags).get("slow") else 1.0
        return tuple(SampleOutcome(seq=i + 1, metrics={"tok_s": level * rng.lognormvariate(0.0, 0.01)},
                                   requests=1, output_tokens=10, duration_s=0.1) for i in range(2))

    return MockBackend(answer, name="commits")


def _repo(path: Path, n: int) -> list[str]:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    for i in range(n):
        (path / "f.txt").write_text(f"{i}\n")
        git(path, "add", "f.txt")
        git(path, "commit", "-q", "-m", f"c{i}")
    return git(path, "rev-list", "--reverse", "HEAD").split()


def test_a_run_its_searches_and_a_bisection_call_up_only_through_the_named_seams(tmp_path):
    order = _repo(tmp_path / "engine", 8)
    spec = load_spec(write_spec(
        tmp_path / "h.yaml", engine={"preset": "openai", "launch": ["my-server", "--port", "{port}"],
                                     "repo": str(tmp_path / "engine")},
        defaults={"boots_per_arm": 2, "max_boots_per_arm": 6, "samples_per_boot": 2, "host_preflight_s": 0},
        hypotheses=[
            {"id": "commit", "baseline": {"commit": order[0]}, "treatment": {"commit": order[-1]},
             "metric": "tok_s", "expect": "decrease", "min_effect": "10%", "bisect": True},
            {"id": "both", "baseline": {"commit": order[0]},
             "treatment": {"commit": order[-1], "flags": {"slow": 1}, "env": {"INERT": "1"}},
             "metric": "tok_s", "expect": "decrease", "min_effect": "10%", "explain": True}]))
    plan = make_plan(spec, cache_dir=tmp_path / "cache")
    with _Calls() as calls, Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        Executor(plan, led, log_dir=tmp_path / "logs", calibrate=False, order_seed=3,
                 backend=commit_backend(order, culprit=5)).execute()
        bisect_range(spec, led, BisectRequest(order[0], order[-1], "tok_s", SearchOptions(max_boots=60)),
                     MeasureSetup(tmp_path / "logs", cache_dir=tmp_path / "cache",
                                  backend=commit_backend(order, culprit=5)))
        nights = commit_backend(order, culprit=5)
        for rev in (order[1], order[2], order[3], order[-1]):  # three quiet nights, then the slow one
            run_nightly(spec, led, NightlyOptions(rev=rev, metric="tok_s", min_effect=0.1, window=2, calibrate=False),
                        MeasureSetup(tmp_path / "logs", cache_dir=tmp_path / "cache", backend=nights))
        for run in led.runs():
            journal.write(led, run, tmp_path / "journal")
    # The commands went where the test means them to: every search ran and found the culprit.
    assert [r for (r,) in query(tmp_path / "r.db", "SELECT status FROM runs")] == ["done"] * 5 + ["alert"]
    culprits = [json.loads(r)["culprit"] for (r,) in query(tmp_path / "r.db", "SELECT result FROM bisections")]
    # bisect: true, the explanation's, harness bisect's, the slow night's
    assert len(culprits) == 4 and set(culprits) == {order[5]}
    layers_seen = {m.split("/")[0] for pair in calls.seen for m in pair}
    assert {"run", "record", "report", "decide", "plan", "spec", "backends", "engines", "measure"} <= layers_seen
    up = calls.up()
    assert set(up) <= set(UP_CALLS), f"calls up a layer, not in UP_CALLS: " + "; ".join(
        f"{a} -> {b} ({up[(a, b)]})" for a, b in sorted(set(up) - set(UP_CALLS)))


@pytest.mark.slow
def test_a_real_boot_is_handed_back_to_the_scheduler_and_calls_nothing_up(tmp_path):
    from bisect_harness.backends.local import LocalBackend
    from bisect_harness.run.scheduler import Scheduler

    spec = load_spec(write_spec(tmp_path / "h.yaml", engine={"preset": "demo"}, benchmark=SMALL_BENCH,
                                hypotheses=[{"id": "h", "baseline": {"commit": "HEAD~1"},
                                             "treatment": {"commit": "HEAD"}, "metric": "tok_s",
                                             "expect": "decrease", "min_effect": "5%"}],
                                # the seams are the point here, not the host: the tracer itself keeps
                                # one core busy, and a sample the host check finds busy still counts
                                defaults={"samples_per_boot": 1, "host_preflight_s": 0, "search_samples": "all"}))
    plan = make_plan(spec, cache_dir=tmp_path / "cache")
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        sched = Scheduler(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=LocalBackend())
        with _Calls() as calls, sched.recording("run", finish="done"):
            m, = sched.measure([sched.state_for(plan.configs[0])], 1, metric="tok_s")
    assert m.values, m
    up = calls.up()
    # the seam was crossed, and seen: the scheduler steps the backend, the backend the boot procedure
    assert {("run/scheduler", "backends/local"), ("backends/local", "backends/procedure")} <= set(calls.seen)
    assert set(up) <= set(UP_CALLS), f"calls up a layer, not in UP_CALLS: " + "; ".join(
        f"{a} -> {b} ({up[(a, b)]})" for a, b in sorted(set(up) - set(UP_CALLS)))
