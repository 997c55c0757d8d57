"""Benchmark: find one -5% tok/s commit among 256 under boot-to-boot noise.

Each trial draws a culprit position uniformly in 1..255 of a 256-commit range whose
good side runs at 100 tok/s and bad side at 95 tok/s. A boot's value is the mean of
3 samples: the boot draws its own level ``mu * (1 + 0.01 z)`` (between-boot CV 1%),
and each sample is ``level + mu * 0.02 z'`` (within-boot CV 2%), all z standard
normal. So one boot's value has a CV of sqrt(0.01^2 + 0.02^2 / 3) = 1.53%, and the
effect is 3.3 boot standard deviations.

Three searches run on the same trials (the same culprit, each with its own noise):

* ours: ``BisectionSearch`` with its defaults (confidence 0.95).
* pinpoint: after Chromium Pinpoint's exploration. Every probed commit gets 10
  attempts (boots); two commits compare DIFFERENT when min(Mann-Whitney U, KS)
  p <= 0.01, SAME when p > 0.1, else UNKNOWN, which adds 50% attempts to both
  sides (up to 100 each; still UNKNOWN at 100 counts as SAME). The endpoints must
  compare DIFFERENT; then the midpoint of the differing range is probed and
  compared with both neighbours, the search following the DIFFERENT side (both or
  neither: the side with the smaller p). Pinpoint's real SAME threshold is a table
  over effect size and attempt count; a fixed 0.1 is this benchmark's simplification.
* naive: one boot per commit, a commit is bad when its boot lies past the midpoint
  of the two endpoints' single boots, plain binary search.

A fourth case runs ours with the commit just before the culprit unbuildable (the
culprit then cannot be told from it) and reports whether the answer set holds the
culprit.

Run: ``python bench/bench_bisect.py [--trials 500] [--seed 0]``. The last line
printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy import stats

from bisect_harness.bisection import BisectionSearch, StopReason, run_search
from bisect_harness.model import Expect

N_COMMITS = 256
BASE = 100.0
CHANGE = -0.05
WITHIN_CV = 0.02
BETWEEN_CV = 0.01
SAMPLES_PER_BOOT = 3


class Range:
    """One trial's commit range: boots drawn from ``rng``; counts boots spent."""

    def __init__(self, culprit: int, rng: np.random.Generator, unbuildable=()):
        self.culprit, self.rng = culprit, rng
        self.unbuildable = set(unbuildable)
        self.boots = 0

    def measure_index(self, i: int, boots: int) -> np.ndarray:
        mu = BASE * (1 + CHANGE) if i >= self.culprit else BASE
        level = mu * (1 + BETWEEN_CV * self.rng.standard_normal(boots))
        samples = level[:, None] + mu * WITHIN_CV * self.rng.standard_normal((boots, SAMPLES_PER_BOOT))
        self.boots += boots
        return samples.mean(axis=1)

    def measure(self, sha: str, boots: int):
        i = int(sha)
        if i in self.unbuildable:
            return None
        return self.measure_index(i, boots).tolist()


def ours(rng_range: Range) -> tuple[int | None, tuple[int, ...], float, str]:
    search = BisectionSearch([str(i) for i in range(N_COMMITS)], expect=Expect.DECREASE)
    result = run_search(search, rng_range.measure)
    culprit = int(result.culprit) if result.culprit is not None else None
    return culprit, tuple(int(s) for s in result.candidate_set), result.probability, result.stopped.value


def pinpoint(rng_range: Range, *, attempts=10, max_attempts=100, low=0.01, high=0.1) -> int | None:
    values: dict[int, np.ndarray] = {}

    def ensure(i: int, k: int) -> None:
        have = values.get(i, np.empty(0))
        if have.size < k:
            values[i] = np.concatenate([have, rng_range.measure_index(i, k - have.size)])

    def p_value(i: int, j: int) -> float:
        a, b = values[i], values[j]
        mwu = stats.mannwhitneyu(a, b, alternative="two-sided").pvalue
        ks = stats.ks_2samp(a, b).pvalue
        return float(min(mwu, ks))

    def compare(i: int, j: int) -> tuple[str, float]:
        while True:
            p = p_value(i, j)
            if p <= low:
                return "different", p
            if p > high:
                return "same", p
            n = min(values[i].size, values[j].size)
            if n >= max_attempts:
                return "same", p
            grow = min(max_attempts, math.ceil(n * 1.5))
            ensure(i, grow)
            ensure(j, grow)

    lo, hi = 0, N_COMMITS - 1
    ensure(lo, attempts)
    ensure(hi, attempts)
    if compare(lo, hi)[0] != "different":
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ensure(mid, attempts)
        left, p_left = compare(lo, mid)
        right, p_right = compare(mid, hi)
        if left == "different" and right != "different":
            hi = mid
        elif right == "different" and left != "different":
            lo = mid
        elif p_left <= p_right:
            hi = mid
        else:
            lo = mid
    return hi


def naive(rng_range: Range) -> int:
    good = rng_range.measure_index(0, 1)[0]
    bad = rng_range.measure_index(N_COMMITS - 1, 1)[0]
    threshold = (good + bad) / 2
    lo, hi = 0, N_COMMITS - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        value = rng_range.measure_index(mid, 1)[0]
        is_bad = value < threshold if bad < good else value > threshold
        if is_bad:
            hi = mid
        else:
            lo = mid
    return hi


def summarise(found, truth, boots) -> dict:
    found = np.array([-1 if f is None else f for f in found])
    boots = np.asarray(boots, dtype=float)
    return {
        "top1_accuracy": float(np.mean(found == np.asarray(truth))),
        "mean_boots": float(boots.mean()),
        "p90_boots": float(np.percentile(boots, 90)),
        "max_boots": int(boots.max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--skip-trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    master = np.random.default_rng(args.seed)
    culprits = master.integers(1, N_COMMITS, size=args.trials)
    seeds = master.integers(0, 2**63 - 1, size=(args.trials, 3))
    out: dict = {"commits": N_COMMITS, "trials": args.trials, "change": CHANGE,
                 "within_boot_cv": WITHIN_CV, "between_boot_cv": BETWEEN_CV,
                 "samples_per_boot": SAMPLES_PER_BOOT, "seed": args.seed}
    timings = {}

    for name in ("ours", "pinpoint", "naive"):
        t0 = time.perf_counter()
        found, boots, extra = [], [], []
        for trial, culprit in enumerate(culprits):
            rr = Range(int(culprit), np.random.default_rng(seeds[trial, ("ours", "pinpoint", "naive").index(name)]))
            if name == "ours":
                c, _, prob, stopped = ours(rr)
                extra.append((prob, stopped))
            elif name == "pinpoint":
                c = pinpoint(rr)
            else:
                c = naive(rr)
            found.append(c)
            boots.append(rr.boots)
        out[name] = summarise(found, culprits, boots)
        if name == "ours":
            probs = np.array([p for p, _ in extra])
            out[name]["mean_reported_probability"] = float(probs.mean())
            out[name]["stopped"] = {s: sum(1 for _, x in extra if x == s) for s in sorted({x for _, x in extra})}
        timings[name] = round(time.perf_counter() - t0, 1)
        print(f"{name:9s} {json.dumps(out[name])}  ({timings[name]} s)", flush=True)

    # The commit right before the culprit does not build: the answer is a set.
    skip_rng = np.random.default_rng([args.seed, 1])
    contains, sizes, boots, exact = [], [], [], []
    for _ in range(args.skip_trials):
        culprit = int(skip_rng.integers(2, N_COMMITS))
        rr = Range(culprit, np.random.default_rng(skip_rng.integers(0, 2**63 - 1)), unbuildable={culprit - 1})
        c, candidate_set, _, stopped = ours(rr)
        contains.append(culprit in candidate_set)
        sizes.append(len(candidate_set))
        exact.append(stopped == StopReason.AMBIGUOUS_SKIPS.value and set(candidate_set) == {culprit - 1, culprit})
        boots.append(rr.boots)
    out["ours_unbuildable_before_culprit"] = {
        "trials": args.skip_trials,
        "set_contains_culprit": float(np.mean(contains)),
        "set_is_exactly_skipped_and_culprit": float(np.mean(exact)),
        "mean_set_size": float(np.mean(sizes)),
        "mean_boots": float(np.mean(boots)),
    }
    print(f"unbuildable-before-culprit {json.dumps(out['ours_unbuildable_before_culprit'])}", flush=True)

    ratio = out["ours"]["mean_boots"] / out["pinpoint"]["mean_boots"]
    out["boots_ratio_ours_to_pinpoint"] = ratio
    out["goal"] = {
        "ours_accuracy_at_least_0.95": out["ours"]["top1_accuracy"] >= 0.95,
        "ours_boots_at_most_0.4x_pinpoint": ratio <= 0.4,
        "pinpoint_accuracy_at_least_0.95": out["pinpoint"]["top1_accuracy"] >= 0.95,
        "pinpoint_at_least_as_accurate_as_ours": out["pinpoint"]["top1_accuracy"] >= out["ours"]["top1_accuracy"],
    }
    out["seconds"] = timings
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
