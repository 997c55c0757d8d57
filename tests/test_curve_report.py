"""What the user sees of a load curve: the journal's block (the answer as stored, the
table of points, the plot), ``--json``'s curves, ``--at`` for ``harness bisect`` and
``harness explain`` (and the point they look at without it), a run's ``bisect:
true`` on a curve, and nightly's series per point.

The runs are the real library calls on a real SQLite ledger (and, where commits are
searched, a real git history), each file's curve a hypothesis with a ``sweep:``; the
boots are the mock backend's (``curve_boots.Curved``: every boot answers at every
load point). Where a test needs the curve's answer stored, or not, it writes
``runs.summary["curves"]`` as the executor does (``CurveAnswer.to_json``), or takes it
out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from bisect_harness.cli.outputs import VERSIONS, output_schema
from bisect_harness.cli.summary import curve_lines, run_summary
from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.decide.curve import PointVerdict, answer
from bisect_harness.errors import UserError
from bisect_harness.model import Expect, Outcome
from bisect_harness.plan.build import make_plan
from bisect_harness.record.ledger import Bisection, Ledger
from bisect_harness.report import curve_view, journal
from bisect_harness.report.series import alerted_at, change_point_report, nightly_series, point_series, report_lines
from bisect_harness.run.bisect_runner import BisectRequest, MeasureSetup, bisect_range
from bisect_harness.run.executor import Executor
from bisect_harness.run.explain_runner import ExplainOptions, explain_file
from bisect_harness.run.nightly import NightlyOptions, run_nightly
from bisect_harness.spec import load_spec
from bisect_harness.workload import LoadPoint
from curve_boots import POINTS, Curved
from helpers import write_spec
from journal_scenarios import history

ENGINE = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}
DEFAULTS = {"boots_per_arm": 3, "max_boots_per_arm": 4, "samples_per_boot": 2, "host_preflight_s": 0}
SWEEP = {"concurrency": [1, 4, 16, 32]}
#: treatment / baseline at each concurrency: drafting wins while the GPU idles, loses once batches fill
RATIOS = {1: 1.5, 4: 1.3, 16: 0.8, 32: 0.6}
LABELS = tuple(p.label for p in POINTS)


def drafting(r, c: int) -> float:
    return RATIOS[c] if dict(r.flags).get("spec") else 1.0


def curve_spec(tmp: Path):
    hyps = [{"id": "spec-wins", "statement": "Drafting makes decode at least 10% faster.", "baseline": {},
             "treatment": {"flags": {"spec": 1}}, "metric": "tok_s", "expect": "increase", "min_effect": "10%",
             "sweep": SWEEP}]
    return load_spec(write_spec(tmp / "hypotheses.yaml", engine=ENGINE, hypotheses=hyps, defaults=DEFAULTS))


def run_curve(tmp: Path, spec, handler, db: Path) -> int:
    """``harness run`` of ``spec`` through the mock backend into ``db``: the run's id."""
    with Ledger(f"sqlite:///{db}") as led:
        return Executor(make_plan(spec), led, log_dir=tmp / "logs", calibrate=False, order_seed=3,
                        backend=handler.backend).execute().id


def store_answers(db: Path, run_id: int, words: str | None = None) -> dict:
    """Store each curve's answer as the executor does (``runs.summary["curves"]``), made
    from the points' verdict rows by ``decide.curve.answer`` (its words replaced by
    ``words`` where given); returns them by curve."""
    with Ledger(f"sqlite:///{db}") as led:
        run = led.run(run_id)
        made = {}
        for curve in curve_view.curves_of(run):
            pts = [PointVerdict(p.label, p.hypothesis, Outcome(p.outcome), p.ratio, p.ci) for p in curve.points]
            made[curve.id] = answer(curve.id, curve.metric, Expect(curve.expect), pts)
            if words is not None:
                made[curve.id] = dataclasses.replace(made[curve.id], words=words)
        run.summary = {**(run.summary or {}), "curves": [a.to_json() for a in made.values()]}
        led.commit()
        return made


def unstore_answers(db: Path, run_id: int) -> None:
    with Ledger(f"sqlite:///{db}") as led:
        run = led.run(run_id)
        run.summary = {k: v for k, v in (run.summary or {}).items() if k != "curves"}
        led.commit()


def read(db: Path, run_id: int, plots_dir: Path | None = None) -> tuple[str, dict, list]:
    """The run's journal (its plots into ``plots_dir``), ``--json`` object and curves."""
    with Ledger(f"sqlite:///{db}") as led:
        run = led.run(run_id)
        return journal.render(led, run, plots_dir=plots_dir), run_summary(run), curve_view.curves_of(run)


@pytest.fixture(scope="module")
def drafted(tmp_path_factory):
    """One run of the drafting curve: (its folder, ledger, run id)."""
    tmp = tmp_path_factory.mktemp("curve")
    db = tmp / "run.db"
    return tmp, db, run_curve(tmp, curve_spec(tmp), Curved(drafting), db)


# --------------------------------------------------------------------------- the run's curve


def test_each_point_is_decided_on_its_own_samples(drafted):
    _, db, run_id = drafted
    _, _, (curve,) = read(db, run_id)
    assert curve.id == "spec-wins" and curve.labels() == LABELS
    assert [p.hypothesis for p in curve.points] == [f"spec-wins@{label}" for label in LABELS]
    assert [p.outcome for p in curve.points] == ["confirmed", "confirmed", "refuted", "refuted"]
    for p, c in zip(curve.points, (1, 4, 16, 32)):
        assert p.ratio == pytest.approx(RATIOS[c], rel=0.05) and p.ci[0] < p.ratio < p.ci[1]
        assert len(p.baseline) == len(p.treatment) >= 3
        assert sum(p.baseline) / len(p.baseline) == pytest.approx(100 * c ** 0.5, rel=0.05)


def test_without_a_stored_answer_the_page_says_so_and_computes_none(drafted):
    tmp, db, run_id = drafted
    unstore_answers(db, run_id)
    text, out, _ = read(db, run_id)
    block = text[text.index("### Curve `spec-wins`"):text.index("### `spec-wins@concurrency=1`")]
    assert "**curve answer not recorded**" in block and "it crosses" not in text
    assert "- curve `spec-wins` (tok_s, increase >= 10%, 4 points): **curve answer not recorded**" in text
    assert "look at" not in block  # no stored answer, no point of largest effect claimed on the page
    (curve,) = out["curves"]
    assert curve["answer"] is None and curve["answer_note"] == "curve answer not recorded"
    with Ledger(f"sqlite:///{db}") as led:
        assert curve_lines(led.run(run_id)) == ["curve spec-wins (tok_s, 4 points): curve answer not recorded"]


def test_the_page_prints_the_answer_as_stored_never_one_of_its_own(drafted):
    tmp, db, run_id = drafted
    made = store_answers(db, run_id)["spec-wins"]
    assert made.shape == "crosses" and made.crossing == ("concurrency=4", "concurrency=16")
    text, out, _ = read(db, run_id, tmp / "plots")
    assert f"**{made.words}**" in text and made.words.endswith("it crosses between concurrency=4 and concurrency=16")
    assert "look at `concurrency=1` unless `--at` names another point" in text
    assert out["curves"][0]["answer"] == {"words": made.words, "shape": "crosses",
                                          "crossing": ["concurrency=4", "concurrency=16"], "largest": "concurrency=1"}
    # whatever the run stored is what is printed: the page reads it, it never answers again
    store_answers(db, run_id, words="tok_s as the executor stored it")
    text, out, _ = read(db, run_id)
    assert "**tok_s as the executor stored it**" in text and made.words not in text
    assert out["curves"][0]["answer"]["words"] == "tok_s as the executor stored it"


def test_the_table_holds_each_point_and_marks_where_the_verdict_changes(drafted):
    tmp, db, run_id = drafted
    text, _, (curve,) = read(db, run_id)
    rows = [line for line in text.splitlines() if line.startswith("| concurrency=")]
    assert [r.split(" | ")[0].strip("| ") for r in rows] == list(LABELS)
    for row, p in zip(rows, curve.points):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"`{p.hypothesis}`"
        assert cells[2] == f"{sum(p.baseline) / len(p.baseline):.2f} tok/s ({len(p.baseline)} boots)"
        assert cells[4].startswith(f"{p.ratio:.2f}x [")
    assert rows[2].endswith("| **refuted** (differs from the point before) |")
    assert rows[1].endswith("| confirmed |") and rows[3].endswith("| refuted |")
    # each point keeps its own section, its boots' values read at its point
    for label in LABELS:
        assert f"### `spec-wins@{label}`" in text
    section = text[text.index("### `spec-wins@concurrency=32`"):]
    first = next(line for line in section.splitlines() if line.startswith("| baseline |"))
    assert float(first.split("|")[5]) == pytest.approx(100 * 32 ** 0.5, rel=0.06)


def test_the_curve_plot_is_drawn_over_the_swept_axis(drafted):
    tmp, db, run_id = drafted
    text, _, (curve,) = read(db, run_id, tmp / "plots")
    name = next(line for line in text.splitlines() if line.startswith("![curve spec-wins")).split("(")[-1].rstrip(")")
    assert name.endswith("-curve-spec-wins.png") and (tmp / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    assert curve_view.axis_of(curve.points) == ("concurrency", (1.0, 4.0, 16.0, 32.0), True)


def _points(*settings) -> list:
    return [curve_view.CurvePoint(LoadPoint.of(**s).label, s, "h", 0, "confirmed", True, 1.0, None, (), ())
            for s in settings]


def test_the_axis_is_logarithmic_only_for_load_spanning_more_than_8x():
    assert curve_view.axis_of(_points({"concurrency": 2}, {"concurrency": 16})) == ("concurrency", (2.0, 16.0), False)
    assert curve_view.axis_of(_points({"request_rate": 0.5}, {"request_rate": 8})) == (
        "request_rate", (0.5, 8.0), True)
    assert curve_view.axis_of(_points({"prompt_tokens": 128}, {"prompt_tokens": 4096}))[2] is False
    two = _points({"concurrency": 1, "prompt_tokens": 8}, {"concurrency": 4, "prompt_tokens": 16})
    assert curve_view.axis_of(two) == (None, (None, None), False)  # two axes move: placed in order


def test_the_run_json_groups_the_points_by_curve_and_matches_its_schema(drafted):
    _, db, run_id = drafted
    validator = Draft202012Validator(output_schema("run"))
    for stored in (False, True):
        (store_answers if stored else unstore_answers)(db, run_id)
        _, out, (curve,) = read(db, run_id)
        validator.validate({"schema_version": VERSIONS["run"], **out})
        assert [(h["id"], h["curve"], h["point"]) for h in out["hypotheses"]] == [
            (f"spec-wins@{label}", "spec-wins", label) for label in LABELS]
        (got,) = out["curves"]
        assert [(p["label"], p["hypothesis"], p["verdict"]) for p in got["points"]] == [
            (p.label, p.hypothesis, p.outcome) for p in curve.points]
        assert [p["effect"] for p in got["points"]] == [p.ratio for p in curve.points]
        assert (got["answer"] is not None) is stored
    assert VERSIONS["run"] == 3
    with pytest.raises(Exception):
        validator.validate({"schema_version": 3, **{k: v for k, v in out.items() if k != "curves"}})


# --------------------------------------------------------------------------- where a search looks


def test_the_default_point_is_the_stored_largest_else_read_from_the_verdicts(drafted):
    _, db, run_id = drafted
    store_answers(db, run_id, words="as stored")
    with Ledger(f"sqlite:///{db}") as led:
        run = led.run(run_id)
        (curve,) = curve_view.curves_of(run)
        assert curve_view.default_point(curve) == "concurrency=1"
        run.summary = {**run.summary, "curves": [{**run.summary["curves"][0], "largest": "concurrency=4"}]}
        led.commit()
        (curve,) = curve_view.curves_of(run)
        assert curve_view.default_point(curve) == "concurrency=4"  # the stored answer is read, never second-guessed
        refuted = dataclasses.replace(curve, answer=None, points=tuple(
            dataclasses.replace(p, outcome="refuted") for p in curve.points))
        assert curve_view.default_point(dataclasses.replace(curve, answer=None)) == "concurrency=1"
        assert curve_view.default_point(refuted) is None
    unstore_answers(db, run_id)


def regressed_history(tmp: Path) -> list[str]:
    subjects = [f"engine: change {i}" for i in range(12)]
    subjects[7] = "scheduler: cap the batch at 8"
    return history(tmp / "engine", subjects)


def batch_cap(order):
    """From commit 7 on, decode at concurrency 16 is 20% slower and at 32 40% slower."""
    return lambda r, c: ({16: 0.8, 32: 0.6}.get(c, 1.0) if r.commit in order[7:] else 1.0)


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A curve over a commit range whose regression shows only from concurrency 16 up,
    run with ``bisect: true``: (folder, spec, commits, ledger, run id)."""
    tmp = tmp_path_factory.mktemp("capped")
    order = regressed_history(tmp)
    hyps = [{"id": "capped", "baseline": {"commit": order[0]}, "treatment": {"commit": order[-1]},
             "metric": "tok_s", "expect": "decrease", "min_effect": "10%", "bisect": True, "sweep": SWEEP}]
    spec = load_spec(write_spec(tmp / "capped.yaml", engine={**ENGINE, "repo": str(tmp / "engine")},
                                hypotheses=hyps, defaults=DEFAULTS))
    db = tmp / "capped.db"
    handler = Curved(batch_cap(order))
    with Ledger(f"sqlite:///{db}") as led:
        run = Executor(make_plan(spec, cache_dir=tmp / "cache"), led, log_dir=tmp / "logs", calibrate=False,
                       order_seed=3, backend=handler.backend).execute()
        return tmp, spec, order, db, run.id


def test_a_run_bisects_a_curve_once_at_the_point_of_its_largest_confirmed_effect(capped):
    tmp, spec, order, db, run_id = capped
    with Ledger(f"sqlite:///{db}") as led:
        run = led.run(run_id)
        (curve,) = curve_view.curves_of(run)
        assert [p.outcome == "confirmed" for p in curve.points] == [False, False, True, True]
        (bis,) = led.session.query(Bisection).filter_by(run_id=run_id).all()
        (row,) = [h for h in run.hypotheses if h.id == bis.hypothesis_id]
        assert row.hid == "capped@concurrency=32" and bis.result["point"] == "concurrency=32"
        assert bis.result["culprit"] == order[7]
        text = journal.render(led, run)
    assert f"on tok_s at concurrency=32" in text


def search(tmp, spec, order, db, at=None, max_boots=60):
    with Ledger(f"sqlite:///{db}") as led:
        return bisect_range(spec, led, BisectRequest(order[0], order[-1], "tok_s", SearchOptions(max_boots=max_boots),
                                                     at=at),
                            MeasureSetup(tmp / "logs", cache_dir=tmp / "cache",
                                         backend=Curved(batch_cap(order)).backend))[0]


def test_harness_bisect_looks_where_the_effect_is_largest_or_where_at_says(capped):
    tmp, spec, order, db, _ = capped
    found = search(tmp, spec, order, db)
    assert found.point == "concurrency=32" and found.culprit == order[7] and found.to_json()["point"] == found.point
    Draft202012Validator(output_schema("bisect")).validate({"schema_version": VERSIONS["bisect"],
                                                            **found.to_json()})
    at_16 = search(tmp, spec, order, db, at="concurrency=16")
    assert at_16.point == "concurrency=16" and at_16.culprit == order[7]
    # at concurrency 1 nothing moved: the same boots, read at that point, show no step
    at_1 = search(tmp, spec, order, db, at="concurrency=1")
    assert at_1.point == "concurrency=1" and at_1.culprit is None and at_1.stopped == "not-reproduced"


def test_an_unknown_point_is_refused_naming_the_points(capped, tmp_path):
    tmp, spec, order, db, _ = capped
    with pytest.raises(UserError, match="--at concurrency=8: no such load point in capped.yaml; its points: "
                                        "concurrency=1, concurrency=4, concurrency=16, concurrency=32"):
        search(tmp, spec, order, db, at="concurrency=8")
    # a file that sweeps nothing takes no --at
    one = load_spec(write_spec(tmp_path / "one.yaml", engine={**ENGINE, "repo": str(tmp / "engine")},
                               defaults=DEFAULTS, hypotheses=[{"id": "one", "baseline": {}, "treatment": {},
                                                               "metric": "tok_s", "expect": "decrease",
                                                               "min_effect": "10%"}]))
    with pytest.raises(UserError, match="one.yaml sweeps no load points.*drop --at"):
        search(tmp, one, order, db, at="concurrency=8")
    # no run recorded a confirmed point: nothing to default to
    with pytest.raises(UserError, match="no run of it in the ledger .* confirmed a point of a curve on "
                                        "tok_s: name the point to bisect at with --at"):
        search(tmp, spec, order, tmp_path / "empty.db")


def test_harness_explain_takes_a_curve_at_a_point(tmp_path):
    hyps = [{"id": "tuned", "baseline": {}, "treatment": {"env": {"A": "1", "B": "1"}}, "metric": "tok_s",
             "expect": "decrease", "min_effect": "10%", "sweep": SWEEP}]
    spec = load_spec(write_spec(tmp_path / "tuned.yaml", engine=ENGINE, hypotheses=hyps, defaults=DEFAULTS))
    a_caps = Curved(lambda r, c: {16: 0.8, 32: 0.6}.get(c, 1.0) if dict(r.arm_env).get("A") == "1" else 1.0)
    db = tmp_path / "explain.db"

    def explain(slow: str, at=None, fast="tuned.baseline"):
        with Ledger(f"sqlite:///{db}") as led:
            return explain_file(spec, led, fast, slow, ExplainOptions(alpha=0.01),
                                MeasureSetup(tmp_path / "logs", backend=a_caps.backend, order_seed=5), at=at)[0]

    out = explain("tuned.treatment", at="concurrency=32")
    assert out.record["point"] == "concurrency=32" and out.record["members"] == ["env:A"]
    Draft202012Validator(output_schema("explain")).validate({"schema_version": VERSIONS["explain"], "run_id": 1,
                                                             **out.record})
    assert explain("tuned.treatment", at="concurrency=1").record["slowdown"]["outcome"] != "confirmed"
    same = explain("tuned@concurrency=16.treatment", fast="tuned@concurrency=16.baseline")
    assert same.record["point"] == "concurrency=16" and same.record["members"] == ["env:A"]
    with pytest.raises(UserError, match="--at concurrency=8: no such point of curve tuned in tuned.yaml; its points: "
                                        "concurrency=1, concurrency=4, concurrency=16, concurrency=32"):
        explain("tuned.treatment", at="concurrency=8")
    with pytest.raises(UserError, match="curve tuned: no run of tuned.yaml in the ledger .* confirmed a point of it"):
        explain("tuned.treatment")
    with pytest.raises(UserError, match="tuned@concurrency=16 is the point concurrency=16 of curve tuned"):
        explain("tuned@concurrency=16.treatment", fast="tuned@concurrency=16.baseline", at="concurrency=32")
    with pytest.raises(UserError, match="read different load points"):
        explain("tuned@concurrency=16.treatment", fast="tuned@concurrency=32.baseline")
    # once a run has confirmed points, the curve's default is its largest effect
    run_curve(tmp_path, spec, a_caps, db)
    assert explain("tuned.treatment").record["point"] == "concurrency=32"


# --------------------------------------------------------------------------- nightly


def test_nightly_tracks_each_point_as_its_own_series_and_names_the_point(tmp_path):
    order = regressed_history(tmp_path)
    hyps = [{"id": "watch", "baseline": {}, "treatment": {}, "metric": "tok_s", "expect": "decrease",
             "min_effect": "10%", "sweep": SWEEP}]
    spec = load_spec(write_spec(tmp_path / "nightly.yaml", engine={**ENGINE, "repo": str(tmp_path / "engine")},
                                hypotheses=hyps, defaults=DEFAULTS))
    handler = Curved(batch_cap(order))
    db = tmp_path / "nights.db"

    def night(rev):
        with Ledger(f"sqlite:///{db}") as led:
            out, sched = run_nightly(spec, led, NightlyOptions(rev=rev, metric="tok_s", min_effect=0.1, max_boots=60,
                                                               calibrate=False),
                                     MeasureSetup(tmp_path / "logs", cache_dir=tmp_path / "cache",
                                                  backend=handler.backend))
            return out, sched.run.id

    for rev in order[:6]:
        out, _ = night(rev)
    assert out.status == "ok" and {p.status for p in out.points} == {"ok"}
    tonight, run_id = night(order[9])
    assert tonight.status == "regression" and tonight.alert and tonight.point == "concurrency=32"
    by_point = {p.point: p for p in tonight.points}
    assert [p.point for p in tonight.points] == list(LABELS)
    assert by_point["concurrency=1"].status == by_point["concurrency=4"].status == "ok"
    assert by_point["concurrency=32"].status == "regression"
    assert by_point["concurrency=32"].shift.ratio == pytest.approx(0.6, rel=0.05) == tonight.shift.ratio
    assert tonight.reason.startswith("at concurrency=32: ") and "alpha shared by 4 load points" in tonight.reason
    assert tonight.bisection.point == "concurrency=32" and tonight.bisection.culprit == order[7]
    with Ledger(f"sqlite:///{db}") as led:
        run = led.run(run_id)
        series = next(c.series for c in run.configs if c.series)
        assert by_point["concurrency=32"].series == point_series(series, "concurrency=32") == f"{series}@concurrency=32"
        # the alert named concurrency=32 (and maybe 16): the other points' series go on from before it
        assert alerted_at(run, "concurrency=32") and not alerted_at(run, "concurrency=1")
        at_32, at_1 = (nightly_series(led, series, "tok_s", up_to_run=run_id, point=label)
                       for label in ("concurrency=32", "concurrency=1"))
    assert [n.run_id for n in at_32[:7]] == [n.run_id for n in at_1[:7]]  # one boot measured both points
    assert [n.value / (100 * 32 ** 0.5) for n in at_32[:7]] == pytest.approx([1] * 6 + [0.6], rel=0.05)
    assert [n.value / 100 for n in at_1[:7]] == pytest.approx([1] * 7, rel=0.05)
    assert at_32[6].status == "alert" and at_1[6].status == "done"  # tonight alerted at 32, not at 1
    with Ledger(f"sqlite:///{db}") as led:
        text = journal.render(led, led.run(run_id))
    row = next(line for line in text.splitlines() if line.startswith("| concurrency=32 |"))
    assert row.startswith("| concurrency=32 | **regression** | 6 | 0.") and f"`{series}@concurrency=32`" in row
    json_out = {"schema_version": VERSIONS["nightly"], **tonight.to_json()}
    Draft202012Validator(output_schema("nightly")).validate(json_out)
    assert json_out["point"] == "concurrency=32" and [p["point"] for p in json_out["points"]] == list(LABELS)


def test_change_points_are_found_per_point_and_say_which(tmp_path):
    """Seven nights whose concurrency-32 series steps down after the fourth, with no
    search in between: the pass finds the step at 32, and none at 1."""
    order = regressed_history(tmp_path)
    hyps = [{"id": "watch", "baseline": {}, "treatment": {}, "metric": "tok_s", "expect": "decrease",
             "min_effect": "10%", "sweep": {"concurrency": [1, 32]}}]
    spec = load_spec(write_spec(tmp_path / "nightly.yaml", engine={**ENGINE, "repo": str(tmp_path / "engine")},
                                hypotheses=hyps, defaults=DEFAULTS))
    handler = Curved(batch_cap(order))
    db = tmp_path / "nights.db"
    with Ledger(f"sqlite:///{db}") as led:
        for rev in (*order[1:5], *order[8:11]):
            out, sched = run_nightly(spec, led, NightlyOptions(rev=rev, metric="tok_s", min_effect=0.1, bisect=False,
                                                               calibrate=False),
                                     MeasureSetup(tmp_path / "logs", cache_dir=tmp_path / "cache",
                                                  backend=handler.backend))
        report = change_point_report(led, sched.run, "tok_s", alpha=0.01, min_effect=0.1, window=7)
    assert report["nights"] == 7 and "note" not in report
    (step,) = report["points"]
    assert step["point"] == "concurrency=32" and step["series"].endswith("@concurrency=32")
    assert step["commit"] == order[8] and step["ratio"] == pytest.approx(0.6, rel=0.05)
    (line,) = report_lines(report)[1:]
    assert line.startswith(f"  at concurrency=32, from night run {step['run_id']} ")
