"""Many configs against one control, the control interleaved through time, a robust
pooled fit: the estimates behind explain's leave-out and side tests.

The design
----------
A *round* boots each config of a set once, in a random order, cut into chunks of
about ``sqrt(K)`` configs (``K`` configs in the round), with one boot of the control
before each chunk. So the control is booted about ``sqrt(K)`` times a round, the
allocation that minimises the variance of many-to-one contrasts, and every config
boot runs near a control boot.

The model
---------
Every boot is one number, the log of its mean. The boots are cut into *host
blocks* (:func:`segments`): each holds two control boots and the configs booted
from the first of them to the next block, about ``2 sqrt(K) + 2`` boots. The model
is the two-way layout of an incomplete block design::

    L = block level + config effect + e        (the control's effect is 0)

so whatever moves the host on the scale of a block or slower (drift, a neighbour
that stays a while) cancels, as rounds do in the harness's paired analysis. Control
and config boots are fitted alike, so noise that is not symmetric (a second, slower
mode of boots) biases both sides the same way and cancels in the contrast.

The fit is Huber's M-estimate (tuning 1.345; iteratively reweighted least squares
from the least-squares start, the scale re-estimated from the median absolute
residual at each step), with the noise *pooled over every config of the block*.
Pooling is what lets a test decide at its third round instead of its sixth: the
error has ``N - p`` degrees of freedom (``N`` boots, ``p`` block levels and
effects) where a paired test has ``rounds - 1``, and the t quantile at a small
alpha falls steeply with them. It assumes the configs of one block share one noise
level: explain's blocks hold configs that differ from the control by few
differences. A stalled boot is an outlier of the model and is down-weighted.

A block whose two control boots disagree far beyond the others (:func:`unsettled`:
a neighbour's burst began or ended inside it) holds no single host level, so it is
left out of the fit, every boot of it.

A contrast's variance is Huber's asymptotic one, ``s^2 * mean(psi^2) /
mean(psi')^2 * (X'X)^-1`` with the mean of ``psi^2`` taken over ``N - p`` degrees of
freedom. On Gaussian noise with no outliers this is close to the least-squares t
test. ``python bench/bench_blocks.py`` measures its p-values on null contrasts (8
configs, 4 rounds, 2000 blocks). On Gaussian noise one-sided p <= 0.05 / 0.01 /
0.001 came out at 0.062 / 0.016 / 0.0024: a little above the nominal rates
(``docs/design.md`` says why Huber's small-sample factor, which halves that, was not
taken). The larger gap is off the model, in one tail. On a host whose bad boots
are all slow (two modes, stalls, bursts) "slower" passes p <= 0.001 8 to 21 times
too often (4 to 5 times on the drifting host) while "faster" stays within the
Gaussian excess, at most 3 times. The number of slow boots among a config's few
is a small discrete count, and no normal tail describes it (a one-term Edgeworth
correction for the estimate's skew was tried and moved the rate by less than a
tenth). So :mod:`explain` reads "a group matters" (the faster tail) off these
p-values, and takes its claims in the slower tail (a difference of the opposite
sign, an interaction) from paired tests of fresh boots. The side block's own
verdicts in that tail (each member alone, the minimal set against fast) are shown
as what they are, a block's tests; they only choose which pairs are tested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Contrast", "fit", "round_order", "segments", "unsettled", "HUBER_C"]

HUBER_C = 1.345


def _huber_weights(u: np.ndarray) -> np.ndarray:
    return np.minimum(1.0, HUBER_C / np.maximum(np.abs(u), 1e-300))


@dataclass(frozen=True)
class Contrast:
    """A config against the control: ``estimate`` the log ratio (config / control),
    ``se`` its standard error, ``df`` the pooled error's degrees of freedom, ``boots``
    how many boots of this config it rests on, ``segments_left_out`` how many host
    blocks of the whole fit were left out as unsettled (:func:`unsettled`)."""

    estimate: float
    se: float
    df: float
    boots: int
    segments_left_out: int = 0


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


def segments(seq: Sequence[tuple], control) -> list[int]:
    """The host-state block of each boot of ``seq``: a new block starts at every
    second control boot, so each block holds two control boots (the last may hold
    one) and the configs booted between them, about ``2 sqrt(K) + 2`` boots."""
    out, seen, seg = [], 0, -1
    for k, _ in seq:
        if k == control:
            if seen % 2 == 0:
                seg += 1
            seen += 1
        out.append(max(seg, 0))
    return out


UNSETTLED_Z = 4.0


def unsettled(seq: Sequence[tuple], control, seg: Sequence[int]) -> set:
    """Host blocks whose two control boots disagree far beyond the rest: the host
    changed inside the block (a neighbour's burst began or ended between them), so
    no level holds for the whole block, and its configs' boots would be read against
    the wrong one. A block is unsettled when its control difference is more than
    ``UNSETTLED_Z`` robust standard deviations from their median (the standard
    deviation read off the lower quartile of the absolute deviations, which holds
    while up to three quarters of the blocks are unsettled); judged only with 4
    blocks or more."""
    ctrl: dict = {}
    for (k, v), b in zip(seq, seg):
        if k == control:
            ctrl.setdefault(b, []).append(v)
    deltas = {b: v[1] - v[0] for b, v in ctrl.items() if len(v) == 2}
    if len(deltas) < 4:
        return set()
    arr = np.array(list(deltas.values()))
    med = float(np.median(arr))
    # The lower quartile of the absolute deviations, not their median: a host with a
    # neighbour coming and going can leave half of the blocks unsettled.
    sd = float(np.quantile(np.abs(arr - med), 0.25)) / 0.3186
    if not sd > 0:
        return set()
    return {b for b, dl in deltas.items() if abs(dl - med) > UNSETTLED_Z * sd}


def fit(seq: Sequence[tuple], control, *, min_boots: int = 3) -> dict:
    """Contrasts against ``control`` from ``seq``, the block's boots in the order they
    ran: ``(config, log boot mean)``. Returns ``{config: Contrast}`` for configs with
    at least ``min_boots`` boots; empty while the error has fewer than 2 degrees of
    freedom."""
    seg = segments(seq, control)
    bad = unsettled(seq, control, seg)
    if bad:
        keep = [i for i, b in enumerate(seg) if b not in bad]
        seq = [seq[i] for i in keep]
        seg = [seg[i] for i in keep]
        renum = {b: j for j, b in enumerate(sorted(set(seg)))}
        seg = [renum[b] for b in seg]
    keys = sorted({k for k, _ in seq if k != control}, key=str)
    if not keys:
        return {}
    nseg = max(seg) + 1
    col = {k: nseg + i for i, k in enumerate(keys)}
    X = np.zeros((len(seq), nseg + len(keys)))
    y = np.array([v for _, v in seq], dtype=float)
    for i, ((k, _), b) in enumerate(zip(seq, seg)):
        X[i, b] = 1.0
        if k != control:
            X[i, col[k]] = 1.0
    n = len(seq)
    p = int(np.linalg.matrix_rank(X))
    if n - p < 2:
        return {}
    small = math.sqrt(n / (n - p))
    beta = np.linalg.lstsq(X, y, rcond=None)[0]
    s = 0.0
    for _ in range(200):  # Huber (convex at a given scale: no local answers to land in)
        r = y - X @ beta
        s = float(np.median(np.abs(r)) / 0.6745 * small)
        if not s > 0:
            s = float(np.sqrt(np.sum(r ** 2) / (n - p))) or 1e-12
        sw = np.sqrt(_huber_weights(r / s))
        new = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)[0]
        if np.max(np.abs(new - beta)) < 1e-12:
            beta = new
            break
        beta = new
    u = (y - X @ beta) / s
    psi = np.clip(u, -HUBER_C, HUBER_C)
    m = max(float(np.mean(np.abs(u) <= HUBER_C)), 0.5)  # a block of mostly clipped boots never shrinks
    cov = s * s * float(np.sum(psi ** 2)) / (n - p) / (m * m) * np.linalg.pinv(X.T @ X)
    counts = {k: sum(1 for kk, _ in seq if kk == k) for k in keys}
    return {k: Contrast(float(beta[col[k]]), float(math.sqrt(max(cov[col[k], col[k]], 0.0))), float(n - p),
                        counts[k], len(bad)) for k in keys if counts[k] >= min_boots}
