"""Operating characteristics of the verdict rule, by seeded simulation.

    python bench/bench_stats.py [--n-sim 20000] [--seed 0]

For two noise settings (between-boot CV / within-boot CV: 1%/2% and 3%/5%, three
samples per boot, the default Design: alpha 0.05, looks at 3..8 boots per arm,
Pocock-type spending) it reports:

* A/A false ``confirmed`` rate of our sequential rule (min_effect 0, the worst
  case, and 1%) against a naive t-test over pooled samples (8 boots, one look)
  and the same naive test applied at every look;
* power P(confirmed) for true effects of 1, 2, 3, 5% with min_effect set to half
  the true effect, with P(refuted) and the mean boots per arm at the verdict;
* cost: mean boots per arm of the sequential rule against the smallest fixed
  number of boots per arm (same test and rule, one look) whose power is at least
  the sequential rule's, less ``POWER_SLACK`` (0.005: near power 1 the two
  estimates differ only by simulation noise, and an exact match would pick an
  arbitrarily large n). ``cost_ratio_powered`` averages the cells whose
  sequential power is at least 0.8, the designs one would actually run.

The last printed line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisect_harness import stats as S  # noqa: E402
from bisect_harness.stats import Design  # noqa: E402

SETTINGS = {"between1_within2": (0.01, 0.02), "between3_within5": (0.03, 0.05)}
EFFECTS = (0.01, 0.02, 0.03, 0.05)
MAX_FIXED = 60
POWER_SLACK = 0.005


def fixed_n_matching(power: float, effect: float, between: float, within: float,
                     design: Design, n_sim: int, seed: int) -> tuple[int | None, float]:
    """Smallest fixed boots per arm whose power reaches ``power`` (and that power)."""
    lo_power = 0.0
    for n in range(2, MAX_FIXED + 1):
        fixed = Design(alpha=design.alpha, min_boots=n, max_boots=n,
                       samples_per_boot=design.samples_per_boot)
        r = S.simulate(effect, between_cv=between, within_cv=within, min_effect=effect / 2,
                       design=fixed, n_sim=n_sim, seed=seed)
        lo_power = r.confirmed
        if r.confirmed >= power - POWER_SLACK:
            return n, r.confirmed
    return None, lo_power


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-sim", type=int, default=20000, help="simulated experiments per cell")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    design = Design()
    t0 = time.perf_counter()
    out: dict = {"design": {"alpha": design.alpha, "min_boots": design.min_boots,
                            "max_boots": design.max_boots, "spending": design.spending,
                            "samples_per_boot": design.samples_per_boot},
                 "n_sim": args.n_sim, "seed": args.seed, "min_effect_rule": "half the true effect",
                 "settings": {}}
    for name, (between, within) in SETTINGS.items():
        res: dict = {"between_cv": between, "within_cv": within}
        aa0 = S.simulate(0.0, between_cv=between, within_cv=within, min_effect=0.0,
                         design=design, n_sim=args.n_sim, seed=args.seed)
        aa1 = S.simulate(0.0, between_cv=between, within_cv=within, min_effect=0.01,
                         design=design, n_sim=args.n_sim, seed=args.seed + 1)
        res["aa"] = {
            "ours_false_confirmed_min_effect_0": aa0.confirmed,
            "ours_false_confirmed_min_effect_1pct": aa1.confirmed,
            "ours_refuted_min_effect_1pct": aa1.refuted,
            "ours_mean_boots_min_effect_1pct": aa1.mean_boots,
            "naive_pooled_false_confirmed": aa0.naive_confirmed,
            "naive_pooled_peeking_false_confirmed": aa0.naive_peeking_confirmed,
        }
        print(f"[{name}] A/A false confirmed: ours {aa0.confirmed:.4f} (min_effect 0), "
              f"{aa1.confirmed:.4f} (min_effect 1%); naive pooled {aa0.naive_confirmed:.4f}, "
              f"naive pooled with peeking {aa0.naive_peeking_confirmed:.4f}")
        res["effects"] = {}
        for i, eff in enumerate(EFFECTS):
            seed = args.seed + 10 + i
            r = S.simulate(eff, between_cv=between, within_cv=within, min_effect=eff / 2,
                           design=design, n_sim=args.n_sim, seed=seed)
            n_fixed, fixed_power = fixed_n_matching(r.confirmed, eff, between, within, design,
                                                    args.n_sim, seed)
            ratio = (r.mean_boots / n_fixed) if n_fixed else None
            res["effects"][f"{eff:.2f}"] = {
                "power": r.confirmed, "refuted": r.refuted, "inconclusive": r.inconclusive,
                "mean_boots": r.mean_boots, "naive_pooled_power": r.naive_confirmed,
                "fixed_n_same_power": n_fixed, "fixed_n_power": fixed_power,
                "cost_ratio": ratio}
            print(f"[{name}] effect {eff:.0%} (min_effect {eff / 2:.1%}): P(confirmed) "
                  f"{r.confirmed:.3f}, P(refuted) {r.refuted:.3f}, mean boots/arm "
                  f"{r.mean_boots:.2f}; fixed n for the same power: {n_fixed} "
                  f"(power {fixed_power:.3f}); cost ratio "
                  f"{'n/a' if ratio is None else f'{ratio:.2f}'}")
        powered = [c["cost_ratio"] for c in res["effects"].values()
                   if c["power"] >= 0.8 and c["cost_ratio"] is not None]
        res["cost_ratio_powered"] = sum(powered) / len(powered) if powered else None
        shown = "n/a" if res["cost_ratio_powered"] is None else f"{res['cost_ratio_powered']:.2f}"
        print(f"[{name}] mean cost ratio over cells with power >= 0.8: {shown}")
        out["settings"][name] = res
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
