"""How often the block fit behind explain claims an effect where there is none, on each host.

    python bench/bench_blocks.py [--trials 2000] [--rounds 4,8] [--models stationary,bimodal] [--keep-unsettled]

Each trial is one block as explain runs it: 8 configs with no effect at all against
one control, booted in ``blocks.round_order``'s rounds on a host of ``bench/noise.py``
(its clock runs across the block, so drift and bursts hit it as they would). Every
config's contrast is a null one; ``false_rate`` is the share of them whose one-sided
p-value (``c.estimate / c.se`` on ``c.df`` degrees of freedom, the slower direction)
is at most 0.05, 0.01 and 0.001, ``false_rate_faster`` the same in the faster
direction (on a host whose bad boots are all slow the two tails differ). A ninth
config, 5% slower, gives ``power`` at p <= 0.001 alongside (a fit that is
calibrated only by being blind is no better).

``--keep-unsettled`` fits every host block, the unsettled ones too
(``blocks.unsettled`` is skipped): the filter's own share of the slower tail. It
drops a block when its two control boots disagree, so a control boot in a slow mode
takes its block out while a config's never does, and the configs kept run slower than
the controls kept.

The nominal rate is the p threshold itself; the search's thresholds are smaller
still (Bonferroni over groups and looks), where the tail matters most. The last
printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
from scipy import special

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from noise import MODELS, Host  # noqa: E402

from bisect_harness.decide import blocks  # noqa: E402

LEVELS = (0.05, 0.01, 0.001)
NULL_CONFIGS = 8
SLOWER = 0.95


def run(trials: int, rounds_list, models, seed: int) -> dict:
    out: dict = {}
    for model in models:
        for rounds in rounds_list:
            rng = np.random.default_rng([seed, rounds, MODELS.index(model)])
            order = random.Random(seed * 1000 + rounds)
            slower = {a: 0 for a in LEVELS}
            faster = {a: 0 for a in LEVELS}
            power = nulls = fits = 0
            for _ in range(trials):
                host = Host(model, rng)
                seq = []
                configs = list(range(NULL_CONFIGS)) + ["slower"]
                for _ in range(rounds):
                    for k in blocks.round_order(configs, "ctrl", order):
                        mu = 100.0 * (SLOWER if k == "slower" else 1.0)
                        seq.append((k, math.log(float(host.boot(mu).mean()))))
                fitted = blocks.fit(seq, "ctrl")
                fits += 1
                for k, c in fitted.items():
                    p_slower = float(special.stdtr(c.df, c.estimate / c.se))  # slower: a negative estimate
                    if k == "slower":
                        power += p_slower <= 0.001
                        continue
                    nulls += 1
                    for a in LEVELS:
                        slower[a] += p_slower <= a
                        faster[a] += 1 - p_slower <= a
            cell = {"false_rate": {str(a): slower[a] / max(nulls, 1) for a in LEVELS},
                    "false_rate_faster": {str(a): faster[a] / max(nulls, 1) for a in LEVELS},
                    "power_at_0.001": power / max(fits, 1), "null_contrasts": nulls}
            out.setdefault(model, {})[str(rounds)] = cell
            print(f"{model:>16} rounds={rounds}: claimed slower at p <= .05/.01/.001 "
                  + "/".join(f"{cell['false_rate'][str(a)]:.4f}" for a in LEVELS)
                  + ", faster " + "/".join(f"{cell['false_rate_faster'][str(a)]:.4f}" for a in LEVELS)
                  + f"; power {cell['power_at_0.001']:.2f} ({nulls} null contrasts)", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", default="4,8")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--keep-unsettled", action="store_true",
                    help="fit every host block, unsettled ones too (the filter's share of the slower tail)")
    a = ap.parse_args()
    if a.keep_unsettled:
        blocks.UNSETTLED_Z = math.inf  # no block's control difference is that far out
    t0 = time.time()
    res = run(a.trials, [int(r) for r in a.rounds.split(",")], [m.strip() for m in a.models.split(",") if m.strip()],
              a.seed)
    print(json.dumps({"trials": a.trials, "seed": a.seed, "null_configs": NULL_CONFIGS, "models": res,
                      "unsettled_filter": not a.keep_unsettled,
                      "seconds": round(time.time() - t0, 1)}, sort_keys=True))


if __name__ == "__main__":
    main()
