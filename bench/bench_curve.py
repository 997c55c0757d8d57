"""A load curve's statistics: its points' familywise error and power, and its price.

    python bench/bench_curve.py [--quick] [--n-sim 600] [--workers 2] [--models stationary,bursts]
                                [--shared 0,0.5,1] [--parts errors,pricing]

A curve of ``POINTS`` (5) load points: one hypothesis asked at each (``sweep:``,
expanded into one hypothesis per point, ``id@concurrency=c``), the file holding it
alone, so a family of 5 and a first level of ``alpha/5`` (0.01) per point. The runs
are made as the executor makes them: each round boots the baseline and the
treatment once, in a random order, on one simulated host (``noise.Host.boot_points``:
every boot measures every point, its host state shared by the points and a fraction
``shared`` of its Gaussian between-boot variance common to them, the rest each
point's own); after each round from ``boots_per_arm`` on, each point not yet final
is judged by ``decide.verdict.judge`` on that point's samples with the rules the
executor builds from the shipped ``spec.Defaults`` (final at the budget); once every
point is final, the points are judged together by ``decide.multiplicity.step_down``,
each asked at a recycled level through ``decide.verdict.rejudge``, as the executor's
``_curve`` does. The only difference from the executor's calls is ``interval=False``
(the robust analysis' interval is an inversion of its test that the outcome does
not use). Every noise model of ``noise.ALL_MODELS`` (the models and the shapes fitted
from the real boots of ``shared/noise/boots.csv``) and every ``--shared`` fraction.

JSON keys (stable), ``errors.<model>.<shared>``:

* ``null``: no change at any point, the claim "decrease by at least 0" (min_effect
  0: the worst case, as bench_stats' A/A): ``fw_false_confirmed`` (any point
  confirmed, after the step-down; goal <= alpha + 0.01), ``fw_se``,
  ``bonferroni_fw`` (any point confirmed at its first level), ``mean_boots``.
* ``one_2E``: a slowdown of 2E (6%) at the middle point, none elsewhere, the claim
  "decrease by at least E" (3%): ``power`` (P(confirmed at that point), after the
  step-down; goal >= 0.9), ``power_first_level``, ``fw_false_confirmed_others``
  (any other point confirmed), ``mean_boots``.
* ``one_real``: the same slowdown, the claim "decrease by at least 0" at every point:
  the step-down's own check, since the real point frees its share for the four
  with no change (``fw_false_confirmed_others``: any of them confirmed, goal <=
  alpha + 0.01; ``bonferroni_fw_others`` without the step-down).
* ``several``: slowdowns of (0, 1.5E, 1.5E, 2E, 2E), claim E: per point
  ``confirmed`` after the step-down and ``confirmed_first_level`` (Bonferroni
  alone): the power the step-down adds where several points move.

``error_goals``: whether every model and shared fraction meets each goal, and where
one misses, the figure and its binomial standard error.

``pricing`` (``--parts pricing``): node time to the curve's verdicts against one point
on the same hypothesis (boots shared: one boot measures every point), under the
cost models of bench_stats (``small_gpu``: a boot 10 s, a sample 3 s;
``large_node``: 900 s, 20 s), a boot of the curve costing ``boot_s + POINTS * m *
sample_s`` with ``m`` samples at each point. ``m`` is chosen per round by
``decide.allocation`` from the rounds so far, as the executor does, under three
rules (``SAMPLE_RULES``): ``as_one_point`` (a sample priced as one sample, at least
``samples_per_boot`` at each point: what the executor did before curves),
``per_point`` (a sample at every point priced as ``POINTS`` samples,
``allocation.for_points``, at least ``samples_per_boot`` at each point) and
``shipped`` (priced so, at least ``samples_per_boot`` spread over the points,
``allocation.fewest_per_point``: 1 at each of 5; what the executor does now). The one point is the shipped rule
alone in its file (alpha 0.05) and, beside it, at the curve's first level (alpha/5:
the same question with the same error per point, so the ratio prices sharing the
boots alone). ``pricing.<model>.<cost>`` holds ``one_point``, ``one_point_same_level``,
``curve.<rule>`` (per truth: ``node_s``, ``mean_boots``, ``mean_samples_per_point``,
``confirmed``) and ``ratio.<rule>`` / ``ratio_same_level.<rule>`` per truth (0, E,
2E at every point; ``2E_one``: 2E at the middle point only, against one point at
2E). ``pricing_goals``: where the curve's node time is at most twice the one
point's.

``--quick``: 80 runs a cell, the ``POINTS_SHARED`` fraction only, and pricing at 40
runs a cell (a few minutes on 2 cores); the full bench (``--n-sim``, every fraction
of ``--shared``) is for a machine with more cores (``--workers``). The last printed
line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from noise import ALL_MODELS, POINTS_SHARED, Host  # noqa: E402

from bisect_harness.boot import BootRecord, SampleOutcome  # noqa: E402
from bisect_harness.decide import allocation  # noqa: E402
from bisect_harness.decide.design import Design  # noqa: E402
from bisect_harness.decide.multiplicity import step_down  # noqa: E402
from bisect_harness.decide.verdict import Question, Rules, Side, judge, looks_used, rejudge  # noqa: E402
from bisect_harness.model import Expect, Outcome  # noqa: E402
from bisect_harness.spec import Defaults  # noqa: E402

POINTS = 5
LABELS = tuple(f"concurrency={c}" for c in (1, 2, 4, 8, 16))
E = 0.03
POWER_GOAL = 0.9
METRIC = "tok_s"
COSTS = {"small_gpu": allocation.CostModel(10.0, 3.0), "large_node": allocation.CostModel(900.0, 20.0)}
#: the scenarios of ``errors``: (true change at each point, claimed min_effect)
SCENARIOS = {"null": ((0.0,) * POINTS, 0.0), "one_2E": ((0.0, 0.0, -2 * E, 0.0, 0.0), E),
             "one_real": ((0.0, 0.0, -2 * E, 0.0, 0.0), 0.0),
             "several": ((0.0, -1.5 * E, -1.5 * E, -2 * E, -2 * E), E)}
#: the truths the pricing compares: the change at every point of the curve, and the one point's
TRUTHS = {"0E": ((0.0,) * POINTS, 0.0), "1E": ((-E,) * POINTS, -E), "2E": ((-2 * E,) * POINTS, -2 * E),
          "2E_one": ((0.0, 0.0, -2 * E, 0.0, 0.0), -2 * E)}
#: how a curve's boots choose their samples at each point: (a sample priced at every point,
#: the fewest at each point); ``shipped`` is the executor's (``allocation.fewest_per_point``)
SAMPLE_RULES = {"as_one_point": (False, Defaults().samples_per_boot), "per_point": (True, Defaults().samples_per_boot),
                "shipped": (True, allocation.fewest_per_point(Defaults().samples_per_boot, POINTS))}
QUICK = {"n_sim": 16, "n_price": 6, "price_models": ("stationary", "bursts", "h200_quiet")}


@dataclasses.dataclass(frozen=True)
class Curve:
    """One simulated curve's answers: per point its first-level and final outcome
    (``Outcome``), boots per arm, and the samples per point of each round."""

    first: tuple[Outcome, ...]
    final: tuple[Outcome, ...]
    boots: int
    samples: tuple[int, ...]


def rules_for(points: int, alpha: float | None = None) -> Rules:
    """The rules the executor builds from the shipped defaults for a file of ``points``
    hypotheses (``plan.build.verdict_rules``), at the family's ``alpha`` if given."""
    d = Defaults()
    return Rules(design=Design(alpha=alpha or d.alpha, min_boots=d.boots_per_arm, max_boots=d.max_boots_per_arm,
                               analysis=d.analysis), family_size=points)


def record(boot_id: int, values: list[np.ndarray], labels) -> BootRecord:
    """A boot as the verdict reads it: its samples of ``METRIC``, each with its point."""
    return BootRecord(id=boot_id, run_id=1, status="ok", samples=tuple(
        SampleOutcome(metrics={METRIC: float(v)}, requests=1, output_tokens=1, duration_s=1.0, point=label)
        for label, vs in zip(labels, values) for v in vs))


def samples_rule(rule: str | None, cost: allocation.CostModel | None, pairs_by_point, points: int) -> int:
    """Samples at each point for the next round: the shipped count without a cost model,
    else ``decide.allocation``'s choice from the rounds so far (pooled over the points,
    as the executor pools its hypotheses of one metric) under ``rule`` (a key of
    ``SAMPLE_RULES``): a sample priced as one sample or as one at every point
    (``allocation.for_points``), and the fewest samples at each point."""
    d = Defaults()
    if cost is None:
        return d.samples_per_boot
    at_every_point, fewest = SAMPLE_RULES[rule]
    priced = allocation.for_points(cost, points) if at_every_point else cost
    pairs = [p for ps in pairs_by_point for p in ps]
    comps = allocation.round_components(pairs) if pairs else None
    return allocation.samples_per_boot(priced, comps, min_samples=fewest, max_samples=d.max_samples_per_boot)


def curve_run(model: str, effects, min_effect: float, seed, shared: float, *, rules: Rules,
              cost: allocation.CostModel | None = None, rule: str | None = None) -> Curve:
    """One curve run as the executor makes it (see the module): rounds until every point
    is final, then the step-down. The claim at every point: a decrease of at least
    ``min_effect``; the truth: ``effects`` (relative changes of the treatment)."""
    rng = np.random.default_rng(seed)
    host = Host(model, rng)
    labels = LABELS[:len(effects)]
    base: list[BootRecord] = []
    treat: list[BootRecord] = []
    raw: dict[str, list[list[np.ndarray]]] = {"a": [], "b": []}
    questions = {p: Question(METRIC, Expect.DECREASE, min_effect, point=p) for p in labels}
    final: dict[str, object] = {}
    d = rules.design
    used = []
    m = samples_rule(rule, cost, [], len(labels))
    for k in range(1, d.max_boots + 1):
        used.append(m)
        for arm in (("a", "b") if rng.random() < 0.5 else ("b", "a")):
            levels = [100.0 * (1.0 + (e if arm == "b" else 0.0)) for e in effects]
            values = host.boot_points(levels, arm=arm, samples=m, shared=shared)
            raw[arm].append(values)
            (base if arm == "a" else treat).append(record(len(base) + len(treat) + 1, values, labels))
        if k < d.min_boots:
            continue
        sides = (Side("baseline", tuple(base)), Side("treatment", tuple(treat)))
        for p in labels:
            if p not in final:
                v = judge(dataclasses.replace(rules, interval=False), *sides, questions[p], force_final=k >= d.max_boots)
                if v.final:
                    final[p] = v
        if len(final) == len(labels):
            break
        pairs = [list(zip([b[i] for b in raw["a"]], [t[i] for t in raw["b"]])) for i in range(len(labels))]
        m = samples_rule(rule, cost, pairs, len(labels))
    sides = (Side("baseline", tuple(base)), Side("treatment", tuple(treat)))
    first_level = rules.alpha_each

    def confirms(p: str, level: float) -> bool:
        v = final[p]
        if level == first_level:
            return v.outcome is Outcome.CONFIRMED
        upto = (looks_used(sides[0], v.baseline_boot_ids), looks_used(sides[1], v.treatment_boot_ids))
        return rejudge(dataclasses.replace(rules.at(level), interval=False), *sides, questions[p], upto=upto) is not None

    sd = step_down(labels, first_level, confirms)
    firsts = tuple(final[p].outcome for p in labels)
    finals = tuple(Outcome.CONFIRMED if p in sd.confirmed else final[p].outcome for p in labels)
    return Curve(firsts, finals, len(base), tuple(used))


def errors_cell(model: str, scenario: str, shared: float, n_sim: int, seed: int) -> dict:
    """One scenario's figures on ``n_sim`` curve runs (see the module's ``errors``)."""
    effects, min_effect = SCENARIOS[scenario]
    rules = rules_for(POINTS)
    runs = [curve_run(model, effects, min_effect, [seed, i], shared, rules=rules) for i in range(n_sim)]
    conf = np.array([[o is Outcome.CONFIRMED for o in r.final] for r in runs])
    first = np.array([[o is Outcome.CONFIRMED for o in r.first] for r in runs])
    null = np.array([e == 0.0 for e in effects])
    out = {"n_sim": n_sim, "mean_boots": float(np.mean([r.boots for r in runs]))}
    if scenario == "null":
        fw = float(conf.any(axis=1).mean())
        out.update(fw_false_confirmed=fw, fw_se=math.sqrt(max(fw * (1 - fw), 1e-12) / n_sim),
                   bonferroni_fw=float(first.any(axis=1).mean()))
    elif scenario in ("one_2E", "one_real"):
        j = int(np.flatnonzero(~null)[0])
        out.update(power=float(conf[:, j].mean()), power_first_level=float(first[:, j].mean()),
                   fw_false_confirmed_others=float(conf[:, null].any(axis=1).mean()),
                   bonferroni_fw_others=float(first[:, null].any(axis=1).mean()))
    else:
        out.update(confirmed=[float(x) for x in conf.mean(axis=0)],
                   confirmed_first_level=[float(x) for x in first.mean(axis=0)],
                   fw_false_confirmed_null=float(conf[:, null].any(axis=1).mean()))
    return out


def errors_job(model: str, shared: float, scenario: str, n_sim: int, seed: int) -> dict:
    """One cell of ``errors``, seeded by its model and scenario (the same paths at every
    shared fraction's seed stream)."""
    return errors_cell(model, scenario, shared, n_sim, 1000 * ALL_MODELS.index(model) + seed
                       + 10 * list(SCENARIOS).index(scenario))


def error_goals(errors: dict, alpha: float) -> dict:
    """The bench's goals over every model and shared fraction, and where a figure misses
    one: ``[model, shared, figure, its binomial standard error]`` (the goals compare the
    figure itself; the error says how far chance alone moves it)."""
    misses: dict = {"null": [], "one_2E_power": [], "one_real": []}

    def missed(key, model, s, cell, figure):
        misses[key].append([model, s, figure, math.sqrt(max(figure * (1 - figure), 1e-12) / cell["n_sim"])])

    for model, by_shared in errors.items():
        for s, cells in by_shared.items():
            if cells["null"]["fw_false_confirmed"] > alpha + 0.01:
                missed("null", model, s, cells["null"], cells["null"]["fw_false_confirmed"])
            if cells["one_2E"]["power"] < POWER_GOAL:
                missed("one_2E_power", model, s, cells["one_2E"], cells["one_2E"]["power"])
            if cells["one_real"]["fw_false_confirmed_others"] > alpha + 0.01:
                missed("one_real", model, s, cells["one_real"], cells["one_real"]["fw_false_confirmed_others"])
    return {"fw_goal_met": not misses["null"] and not misses["one_real"],
            "power_goal_met": not misses["one_2E_power"], "missed": misses}


def pricing_job(model: str, name: str, n_sim: int, seed: int) -> dict:
    """The pricing figures of one noise model under one cost model (see the module's ``pricing``)."""
    base = 1000 * ALL_MODELS.index(model) + seed + 7
    alpha, cost, c = Defaults().alpha, COSTS[name], list(COSTS).index(name)
    res: dict = {"one_point": {}, "one_point_same_level": {}, "curve": {r: {} for r in SAMPLE_RULES}}
    for j, (truth, (effects, one)) in enumerate(TRUTHS.items()):
        seeds = [[base, c, j, i] for i in range(n_sim)]
        cells = {key: [curve_run(model, (one,), E, s, POINTS_SHARED, rules=rules, cost=cost, rule="as_one_point")
                       for s in seeds]
                 for key, rules in (("one_point", rules_for(1)),
                                    ("one_point_same_level", rules_for(1, alpha / POINTS)))}
        for r in SAMPLE_RULES:
            cells[r] = [curve_run(model, effects, E, s, POINTS_SHARED, rules=rules_for(POINTS), cost=cost, rule=r)
                        for s in seeds]
        for key, runs in cells.items():
            points = len(runs[0].final)
            into = res["curve"][key] if key in SAMPLE_RULES else res[key]
            into[truth] = {
                "node_s": float(np.mean([sum(cost.boot(points * m) for m in r.samples) * 2 for r in runs])),
                "mean_boots": float(np.mean([r.boots for r in runs])),
                "mean_samples_per_point": float(np.mean([np.mean(r.samples) for r in runs])),
                "confirmed": [float(np.mean([r.final[i] is Outcome.CONFIRMED for r in runs])) for i in range(points)]}
    res["ratio"] = {r: {t: res["curve"][r][t]["node_s"] / res["one_point"][t]["node_s"] for t in TRUTHS}
                    for r in SAMPLE_RULES}
    res["ratio_same_level"] = {r: {t: res["curve"][r][t]["node_s"] / res["one_point_same_level"][t]["node_s"]
                                   for t in TRUTHS} for r in SAMPLE_RULES}
    return res


def pricing_goals(pricing: dict) -> dict:
    """Where a curve's node time is at most twice one point's, per sample rule and comparison."""
    out = {}
    for key in ("ratio", "ratio_same_level"):
        for r in SAMPLE_RULES:
            worst = max((v, m, c, t) for m, by_cost in pricing.items() for c, res in by_cost.items()
                        for t, v in res[key][r].items())
            out[f"{key}.{r}"] = {"met": worst[0] <= 2.0, "worst": list(worst)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK['n_sim']} runs a cell, one shared fraction; pricing at {QUICK['n_price']} runs a "
                    f"cell on {', '.join(QUICK['price_models'])}")
    ap.add_argument("--n-sim", type=int, default=400, help="curve runs per cell of errors")
    ap.add_argument("--n-price", type=int, default=60, help="curve runs per cell of pricing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=",".join(ALL_MODELS), help="comma-separated noise models")
    ap.add_argument("--shared", default=f"{POINTS_SHARED:g}", help="comma-separated fractions of the between-boot "
                    "variance common to a boot's points (e.g. 0,0.5,1)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated scenarios of errors")
    ap.add_argument("--parts", default="errors,pricing", help="errors, pricing or both")
    ap.add_argument("--workers", type=int, default=2, help="processes, one cell each")
    ap.add_argument("--out", default=None, help="also write the JSON object to this file")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in ALL_MODELS:
            ap.error(f"--models: unknown noise model {m!r}; one of {', '.join(ALL_MODELS)}")
    scenarios = [x for x in args.scenarios.split(",") if x]
    for x in scenarios:
        if x not in SCENARIOS:
            ap.error(f"--scenarios: unknown scenario {x!r}; one of {', '.join(SCENARIOS)}")
    shareds = (POINTS_SHARED,) if args.quick else tuple(float(x) for x in args.shared.split(","))
    n_sim, n_price = (QUICK["n_sim"], QUICK["n_price"]) if args.quick else (args.n_sim, args.n_price)
    price_models = [m for m in models if m in QUICK["price_models"]] if args.quick else models
    parts = set(args.parts.split(","))
    alpha = Defaults().alpha
    t0 = time.perf_counter()
    out: dict = {"points": POINTS, "labels": list(LABELS), "claim_E": E, "alpha": alpha,
                 "first_level": rules_for(POINTS).alpha_each, "n_sim": n_sim, "n_price": n_price, "seed": args.seed,
                 "shared": list(shareds), "quick": args.quick,
                 "costs": {k: [c.boot_s, c.sample_s] for k, c in COSTS.items()},
                 "sample_rules": {k: {"priced_at_every_point": a, "fewest_per_point": b}
                                  for k, (a, b) in SAMPLE_RULES.items()}}
    jobs = []
    if "errors" in parts:
        jobs += [(errors_job, (m, s, x, n_sim, args.seed)) for m in models for s in shareds for x in scenarios]
    if "pricing" in parts:
        jobs += [(pricing_job, (m, c, n_price, args.seed)) for m in price_models for c in COSTS]
    with multiprocessing.Pool(max(1, args.workers)) as pool:
        results = pool.starmap(_call, jobs)
    for (f, a), res in zip(jobs, results):
        if f is errors_job:
            out.setdefault("errors", {}).setdefault(a[0], {}).setdefault(f"{a[1]:g}", {})[a[2]] = res
        else:
            out.setdefault("pricing", {}).setdefault(a[0], {})[a[1]] = res
    for model, by_shared in out.get("errors", {}).items():
        for s, c in by_shared.items():
            said = []
            if "null" in c:
                said.append(f"null: any confirmed {c['null']['fw_false_confirmed']:.3f} (+-{c['null']['fw_se']:.3f})")
            if "one_2E" in c:
                said.append(f"2E at one point: P(confirmed) {c['one_2E']['power']:.3f} (first level "
                            f"{c['one_2E']['power_first_level']:.3f}), others confirmed "
                            f"{c['one_2E']['fw_false_confirmed_others']:.3f}")
            if "one_real" in c:
                said.append(f"min_effect 0: others confirmed {c['one_real']['fw_false_confirmed_others']:.3f} "
                            f"(Bonferroni {c['one_real']['bonferroni_fw_others']:.3f})")
            if "several" in c:
                pairs = zip(c["several"]["confirmed"], c["several"]["confirmed_first_level"])
                said.append("several, confirmed step-down/first level: " + " ".join(f"{a:.2f}/{b:.2f}" for a, b in pairs))
            print(f"[{model:16s} shared {s:>3s}] " + "; ".join(said), flush=True)
    if "errors" in out and {"null", "one_2E", "one_real"} <= set(scenarios):
        out["error_goals"] = error_goals(out["errors"], alpha)
    for model, by_cost in out.get("pricing", {}).items():
        for c, res in by_cost.items():
            print(f"[{model:16s} {c:10s}] curve/one point (same level): " + "; ".join(
                f"{r} " + " ".join(f"{t} {res['ratio'][r][t]:.2f} ({res['ratio_same_level'][r][t]:.2f})"
                                   for t in TRUTHS) for r in SAMPLE_RULES), flush=True)
    if "pricing" in out:
        out["pricing_goals"] = pricing_goals(out["pricing"])
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(out, sort_keys=True))
    print(json.dumps(out, sort_keys=True))
    return 0


def _call(f, args):
    return f(*args)


if __name__ == "__main__":
    sys.exit(main())
