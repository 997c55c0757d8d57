"""Many configs against one control, with the control interleaved through time and
a robust pooled fit: the estimates behind explain's leave-out tests.

The design
----------
A *round* boots each config of a set once, in a random order, cut into chunks of
about ``sqrt(K)`` configs (``K`` configs in the round), with one boot of the control
before each chunk. So the control is booted ``sqrt(K)`` times a round, the allocation
that minimises the variance of many-to-one contrasts, and every config boot has a
control boot at most a chunk away on each side (the next round opens with one).

The analysis
------------
Every boot is one number, the log of its mean. A config boot is compared with the
control *where it ran*: the control's level at that position, interpolated linearly
between the nearest control boots before and after it (or the nearest one, at the
end), each control boot first replaced by the running median of three control
boots, so that one stalled control boot does not spoil the configs on both sides
of it. ``d = L_config - L_control(position)``. Whatever moves the host on a scale
longer than a chunk (drift, a neighbour that stays for several boots) cancels, as
in the harness's paired analysis.

Each config's contrast is a Huber M-estimate of the location of its ``d``'s (tuning
1.345), with the scale *pooled over every config of the block* (the median
absolute residual, iterated to convergence). Pooling is what lets a test decide at
its third round instead of its sixth: with ``N`` differences over ``K`` configs the
error has ``N - K`` degrees of freedom where a paired test has ``rounds - 1``, and
the t quantile at a small alpha falls steeply with them. It assumes the configs of
one block share one noise level: explain's blocks hold configs that each differ
from the control by one group of differences. The pooled robust scale is also what
makes a spoiled boot (a stalled boot; a burst that starts between a config boot and
its control) an outlier that is clipped even when a config has only three boots.

A contrast's variance is Huber's asymptotic one, ``s^2 * mean(psi^2) /
mean(psi')^2 / n_k`` with the mean of ``psi^2`` taken over ``N - K`` degrees of
freedom. On Gaussian noise with no outliers this is the pooled-variance t test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Contrast", "fit", "round_order", "HUBER_C"]

HUBER_C = 1.345


@dataclass(frozen=True)
class Contrast:
    """A config against the control: ``estimate`` the log ratio (config / control),
    ``se`` its standard error, ``df`` the pooled error's degrees of freedom, ``boots``
    how many boots of this config it rests on."""

    estimate: float
    se: float
    df: float
    boots: int


def round_order(configs: Sequence, control, rng) -> list:
    """One round: ``configs`` shuffled by ``rng`` (a ``random.Random``) and cut into
    chunks of about ``sqrt(K)``, the control before each chunk."""
    order = rng.sample(list(configs), len(configs))
    if not order:
        return [control]
    chunks = max(1, math.ceil(math.sqrt(len(order))))
    size = math.ceil(len(order) / chunks)
    out: list = []
    for i in range(0, len(order), size):
        out += [control] + order[i:i + size]
    return out


def _smoothed_control(seq: Sequence[tuple], control) -> dict:
    """The control's level at each of its boots: the median of that boot and its
    neighbours among the control's boots (a running median of three; at the ends, of
    the end boot, its neighbour and their linear extrapolation). A single spoiled
    control boot sits between two good ones and is replaced; a level shift that
    lasts two control boots or more (drift, a neighbour's burst) is kept."""
    pos = [i for i, (k, _) in enumerate(seq) if k == control]
    ys = [seq[i][1] for i in pos]
    out = {}
    for j, i in enumerate(pos):
        if len(ys) < 3:
            out[i] = ys[j]
        elif j == 0:
            out[i] = float(np.median([ys[0], ys[1], 2 * ys[1] - ys[2]]))
        elif j == len(ys) - 1:
            out[i] = float(np.median([ys[-1], ys[-2], 2 * ys[-2] - ys[-3]]))
        else:
            out[i] = float(np.median(ys[j - 1:j + 2]))
    return out


def _local_control(seq: Sequence[tuple], control) -> list[tuple]:
    """(config, d) for each config boot of ``seq`` ((config, log value) in boot order)."""
    level = _smoothed_control(seq, control)
    pos = sorted(level)
    out = []
    for i, (k, y) in enumerate(seq):
        if k == control:
            continue
        before = max((j for j in pos if j < i), default=None)
        after = min((j for j in pos if j > i), default=None)
        if before is None and after is None:
            continue
        if before is None or after is None:
            ref = level[before if after is None else after]
        else:
            w = (i - before) / (after - before)
            ref = (1 - w) * level[before] + w * level[after]
        out.append((k, y - ref))
    return out


def fit(seq: Sequence[tuple], control, *, min_boots: int = 3) -> dict:
    """Contrasts against ``control`` from ``seq``, the block's boots in the order they
    ran: ``(config, log boot mean)``. Returns ``{config: Contrast}`` for configs with
    at least ``min_boots`` boots; empty while the pooled error has fewer than 2
    degrees of freedom."""
    diffs = _local_control(seq, control)
    keys = sorted({k for k, _ in diffs}, key=str)
    if not keys:
        return {}
    idx = {k: i for i, k in enumerate(keys)}
    g = np.array([idx[k] for k, _ in diffs])
    d = np.array([v for _, v in diffs], dtype=float)
    n, p = d.size, len(keys)
    if n - p < 2:
        return {}
    counts = np.bincount(g, minlength=p).astype(float)
    mu = np.array([np.median(d[g == j]) for j in range(p)])
    small = math.sqrt(n / (n - p))
    s = 0.0
    for _ in range(100):
        r = d - mu[g]
        s = float(np.median(np.abs(r)) / 0.6745 * small)
        if not s > 0:
            s = float(np.sqrt(np.sum(r ** 2) / (n - p))) or 1e-12
        w = np.minimum(1.0, HUBER_C / np.maximum(np.abs(r) / s, 1e-300))
        new = np.bincount(g, weights=w * d, minlength=p) / np.bincount(g, weights=w, minlength=p)
        if np.max(np.abs(new - mu)) < 1e-12:
            mu = new
            break
        mu = new
    u = (d - mu[g]) / s
    psi = np.clip(u, -HUBER_C, HUBER_C)
    m = max(float(np.mean(np.abs(u) <= HUBER_C)), 0.5)  # a block of mostly clipped boots never shrinks
    var1 = s * s * float(np.sum(psi ** 2)) / (n - p) / (m * m)
    return {k: Contrast(float(mu[j]), float(math.sqrt(var1 / counts[j])), float(n - p), int(counts[j]))
            for k, j in idx.items() if counts[j] >= min_boots}
