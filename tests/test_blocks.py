"""The many-to-one block fit behind explain: its error rate on its own model, and what
real hosts do to it (a stalled control boot, drift, a burst inside a host block)."""

import math
import random

import numpy as np
import pytest
from scipy import special

from bisect_harness.decide import blocks

CTRL = "ctrl"


def run_block(levels: dict, rounds: int, rng: np.random.Generator, *, sd=0.015, host=None, seed=0):
    """Boots of one block in the order blocks.round_order gives: (config, log mean)."""
    order_rng = random.Random(seed)
    seq, t = [], 0
    for _ in range(rounds):
        for k in blocks.round_order(sorted(levels), CTRL, order_rng):
            base = 0.0 if k == CTRL else levels[k]
            seq.append((k, math.log(100) + base + (host(t) if host else 0.0) + sd * rng.standard_normal()))
            t += 1
    return seq


def test_round_order_boots_each_config_once_and_the_control_about_sqrt_k_times():
    for k in (1, 2, 5, 8, 16, 33):
        order = blocks.round_order(list(range(k)), CTRL, random.Random(k))
        assert sorted(x for x in order if x != CTRL) == list(range(k))
        assert order[0] == CTRL and order.count(CTRL) == math.ceil(math.sqrt(k))


def test_null_false_claims_stay_at_the_nominal_rate():
    """Gaussian noise, no effect anywhere: a one-sided test at 5% rejects about 5% of
    contrasts (its own model: the pooled t test it reduces to)."""
    rng = np.random.default_rng(0)
    rejected = total = 0
    for sim in range(300):
        fitted = blocks.fit(run_block({f"c{i}": 0.0 for i in range(6)}, 4, rng, seed=sim), CTRL)
        for c in fitted.values():
            rejected += special.stdtr(c.df, -c.estimate / c.se) <= 0.05
            total += 1
    assert 0.03 <= rejected / total <= 0.075


def test_effect_estimated_and_decided():
    rng = np.random.default_rng(1)
    fitted = blocks.fit(run_block({"slow": math.log(0.9), "same": 0.0}, 4, rng), CTRL)
    assert math.exp(fitted["slow"].estimate) == pytest.approx(0.9, abs=0.02)
    assert abs(fitted["same"].estimate) < 0.02
    assert fitted["slow"].estimate / fitted["slow"].se < -5


def test_drift_cancels():
    """A host that slows 0.3% a boot, 40% over the block: the contrasts stay unbiased."""
    rng = np.random.default_rng(2)
    fitted = blocks.fit(run_block({f"c{i}": 0.0 for i in range(8)}, 6, rng, host=lambda t: -0.003 * t), CTRL)
    assert max(abs(c.estimate) for c in fitted.values()) < 0.02


def test_a_stalled_control_boot_does_not_make_an_effect():
    rng = np.random.default_rng(3)
    seq = run_block({f"c{i}": 0.0 for i in range(8)}, 4, rng)
    i = [j for j, (k, _) in enumerate(seq) if k == CTRL][5]
    seq[i] = (CTRL, seq[i][1] + math.log(0.75))  # one control boot runs 25% slow
    fitted = blocks.fit(seq, CTRL)
    assert max(abs(c.estimate) for c in fitted.values()) < 0.03


def test_a_burst_inside_a_host_block_leaves_it_out():
    """A neighbour starts between a block's two control boots and stays: that block has
    no single level, and it is left out, every boot of it. (Here the Huber fit alone
    would keep this one block's pull small; the check matters when several boots of
    one config fall into such blocks, which the bench's bursts model makes happen.)"""
    rng = np.random.default_rng(4)
    seq = run_block({f"c{i}": 0.0 for i in range(8)}, 5, rng)
    seg = blocks.segments(seq, CTRL)
    ctrl_pos = [j for j, (k, _) in enumerate(seq) if k == CTRL]
    start = ctrl_pos[5] + 1  # block 2 holds control boots 4 and 5: the burst starts after 5
    seq = [(k, v + (math.log(0.75) if j >= start else 0.0)) for j, (k, v) in enumerate(seq)]
    assert blocks.unsettled(seq, CTRL, seg) == set()  # both of block 2's control boots were before it
    start = ctrl_pos[4] + 1  # now between block 2's two control boots
    seq2 = [(k, v + (math.log(0.75) if j >= start else 0.0))
            for j, (k, v) in enumerate(run_block({f"c{i}": 0.0 for i in range(8)}, 5, np.random.default_rng(4)))]
    assert blocks.unsettled(seq2, CTRL, seg) == {seg[ctrl_pos[4]]}
    fitted = blocks.fit(seq2, CTRL)
    assert all(c.segments_left_out == 1 for c in fitted.values())
    assert max(abs(c.estimate) for c in fitted.values()) < 0.03


def test_too_few_boots_say_nothing():
    rng = np.random.default_rng(5)
    assert blocks.fit(run_block({"a": 0.0}, 1, rng), CTRL) == {}
    with_two = blocks.fit(run_block({"a": 0.0, "b": 0.0}, 2, rng), CTRL, min_boots=3)
    assert with_two == {}
