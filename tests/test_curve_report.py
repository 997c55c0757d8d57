"""What the user sees of a load curve: the journal's block (the answer as stored, the
table of points, the plot), ``--json``'s curves, ``--at`` for ``harness bisect`` and
``harness explain`` (and their default point), and nightly's series per point.

The runs are real library calls on a real SQLite ledger; the boots are the mock
backend's (:class:`Curved`: each boot answers at every load point of its request,
each sample carrying its point's label, as ``backends.procedure`` does). Until the
spec reads ``sweep:``, a curve is made the way the reader will make it
(:func:`swept`): the hypothesis expanded into one per point, id ``<id>@<label>``,
``curve`` and ``point`` set. Where a test needs the curve's answer stored, it writes
``runs.summary["curves"]`` as the executor does (``CurveAnswer.to_json``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import textwrap
from pathlib import Path

import pytest

from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import SampleOutcome
from bisect_harness.decide.curve import PointVerdict, answer
from bisect_harness.errors import UserError
from bisect_harness.model import Expect, Outcome
from bisect_harness.plan.build import make_plan
from bisect_harness.record.ledger import Ledger
from bisect_harness.report import curve_view, journal
from bisect_harness.run.executor import Executor
from bisect_harness.spec import load_spec
from bisect_harness.workload import LoadPoint
from helpers import write_spec

ENGINE = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}
POINTS = tuple(LoadPoint.of(concurrency=c) for c in (1, 4, 16, 32))
#: treatment / baseline at each concurrency: drafting wins when the GPU idles, loses once batches fill
RATIOS = {1: 1.5, 4: 1.3, 16: 0.8, 32: 0.6}


def swept(spec, hid: str, points=POINTS):
    """``spec`` with hypothesis ``hid`` expanded into one hypothesis per point, as the
    spec's ``sweep:`` does: ids ``hid@<label>``, ``curve`` the id, ``point`` the point."""
    out = []
    for h in spec.hypotheses:
        if h.id != hid:
            out.append(h)
            continue
        out += [dataclasses.replace(h, id=f"{hid}@{p.label}", point=p, curve=hid) for p in points]
    return dataclasses.replace(spec, hypotheses=tuple(out), family_size=len(out))


class Curved:
    """The mock backend's handler: at each load point of the request, ``samples`` samples
    of ``tok_s``, ``100 * concurrency ** 0.5`` on the baseline and that times
    ``ratios[concurrency]`` where the treatment's flag ``spec`` is set, with seeded noise
    a function of the config and the boot's number among its config's boots."""

    def __init__(self, ratios=RATIOS, *, between: float = 0.02, name: str = "curved", slow_from=()):
        self.ratios, self.between, self.slow_from = ratios, between, set(slow_from)
        self.made: dict[str, int] = {}
        self.backend = MockBackend(self, name=name)

    def __call__(self, r):
        k = self.made.get(r.config_key, 0)
        self.made[r.config_key] = k + 1
        rng = random.Random(hashlib.sha256(f"{r.config_key}:{k}".encode()).digest())
        boot = rng.lognormvariate(0.0, self.between)
        out = []
        for p in r.benchmark.points:
            c = p.get("concurrency")
            level = 100.0 * c ** 0.5 * boot * (self.ratios[c] if dict(r.flags).get("spec") else 1.0)
            level *= 0.7 if r.commit in self.slow_from and c >= 16 else 1.0
            for _ in range(max(1, r.samples)):
                out.append(SampleOutcome(seq=len(out) + 1, metrics={"tok_s": level * rng.lognormvariate(0.0, 0.005)},
                                         requests=c, output_tokens=10, duration_s=0.1, point=p.label))
        return out


def curve_spec(tmp: Path, **extra):
    hyps = [{"id": "spec-wins", "statement": "Drafting makes decode at least 10% faster.", "baseline": {},
             "treatment": {"flags": {"spec": 1}}, "metric": "tok_s", "expect": "increase", "min_effect": "10%",
             **extra}]
    path = write_spec(tmp / "hypotheses.yaml", engine=ENGINE, hypotheses=hyps,
                      defaults={"boots_per_arm": 3, "max_boots_per_arm": 4, "samples_per_boot": 2,
                                "host_preflight_s": 0})
    return swept(load_spec(path), "spec-wins")


def run_curve(tmp: Path, spec=None, handler=None, *, db: Path | None = None):
    """``harness run`` of the swept file through the mock backend: (the ledger's path, run id)."""
    spec = spec or curve_spec(tmp)
    handler = handler or Curved()
    db = db or tmp / "run.db"
    with Ledger(f"sqlite:///{db}") as led:
        run = Executor(make_plan(spec), led, log_dir=tmp / "logs", calibrate=False, order_seed=3,
                       backend=handler.backend).execute()
        return db, run.id


def store_answers(db: Path, run_id: int) -> dict:
    """Store each curve's answer as the executor does (``runs.summary["curves"]``), made
    from the points' verdict rows by ``decide.curve.answer``; returns them by curve."""
    with Ledger(f"sqlite:///{db}") as led:
        run = led.run(run_id)
        made = {}
        for curve in curve_view.curves_of(run):
            rows = {h.hid: h for h in run.hypotheses}
            pts = [PointVerdict(p.label, p.hypothesis, Outcome(rows[p.hypothesis].verdict.outcome), p.ratio, p.ci)
                   for p in curve.points]
            made[curve.id] = answer(curve.id, curve.metric, Expect(curve.expect), pts)
        run.summary = {**(run.summary or {}), "curves": [a.to_json() for a in made.values()]}
        led.commit()
        return made


@pytest.fixture(scope="module")
def curve_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("curve")
    db, run_id = run_curve(tmp)
    return tmp, db, run_id


def render(db: Path, run_id: int, plots_dir: Path | None = None) -> str:
    with Ledger(f"sqlite:///{db}") as led:
        return journal.render(led, led.run(run_id), plots_dir=plots_dir)


def test_each_point_is_decided_on_its_own_samples(curve_run):
    _, db, run_id = curve_run
    with Ledger(f"sqlite:///{db}") as led:
        (curve,) = curve_view.curves_of(led.run(run_id))
    assert curve.id == "spec-wins" and curve.labels() == tuple(p.label for p in POINTS)
    assert [p.hypothesis for p in curve.points] == [f"spec-wins@concurrency={c}" for c in (1, 4, 16, 32)]
    assert [p.outcome for p in curve.points] == ["confirmed", "confirmed", "refuted", "refuted"]
    for p, c in zip(curve.points, (1, 4, 16, 32)):
        assert p.ratio == pytest.approx(RATIOS[c], rel=0.05)
        assert len(p.baseline) >= 3 and sum(p.baseline) / len(p.baseline) == pytest.approx(100 * c ** 0.5, rel=0.05)
