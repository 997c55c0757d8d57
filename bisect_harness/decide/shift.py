"""Nightly's rule: did the newest night move against the nights before it?

Each night is one value, the median of its log boot means, and the newest is
compared with the last ``window`` nights by a one-sided prediction t-test, whose
decision is the kernel's rule (:mod:`bisect_harness.decide.kernel`); see
:func:`detect_shift` for the model and ``bench/bench_stats.py`` (``nightly``) for
its false-alert rate when nights differ. ``run/nightly`` drives it through
``decide/verdict``'s ``NightRule``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from bisect_harness.decide.kernel import _pct, decide
from bisect_harness.decide.ttest import _check_boots
from bisect_harness.model import Expect, Outcome, shown_apart

__all__ = ["Shift", "detect_shift"]


@dataclass(frozen=True)
class Shift:
    """Did the newest night move against the nights before it?

    Each night is one value, the median of its log boot means; the reference is
    the last ``window`` nights' values. ``regressed`` is True when a one-sided
    prediction t-test in the *worse* direction rejects "tonight is another night
    like those" at ``alpha`` and the estimated change is at least ``min_effect``;
    ``ratio`` is tonight over the reference (geometric means), ``ci`` its two-sided
    ``1 - 2*alpha`` prediction interval. ``df`` is ``n_reference_nights - 1``.
    """

    regressed: bool
    ratio: float
    ci: tuple[float, float]
    p_value: float
    n_reference_boots: int
    n_new_boots: int
    reason: str
    n_reference_nights: int = 0
    df: float = 0.0


def detect_shift(history: Sequence[Sequence[Sequence[float]]], newest: Sequence[Sequence[float]], *,
                 worse: Expect, min_effect: float = 0.05, alpha: float = 0.01, window: int = 7) -> Shift:
    """Compare the newest night with the last ``window`` nights, each night one value.

    ``history`` is oldest first; each night is a sequence of boots, each a sequence
    of samples. ``worse`` is the direction a regression moves the metric's value
    (tok/s: ``Expect.DECREASE``). Model: a night's value ``y_j = mu + nu_j + e_j``,
    the median of its log boot means (the mean for one or two boots: a single
    stalled boot, 3x slow on a busy host, must not move a night of three boots),
    with a night-to-night term ``nu_j`` (a host,
    a driver, a dataset cache that changes between nights) as well as the boots'
    own noise ``e_j``; boots of one night share ``nu_j``, so pooling boots across
    nights as if independent (as this function once did) understates the noise
    and alerts falsely whenever nights differ (8.7-11.2% at alpha 0.01 with a
    night-to-night CV of 2%). The test is the prediction t-test of the new value
    against ``n`` earlier nights: ``t = (y_new - mean(y)) / (s_y sqrt(1 + 1/n))``
    with ``n - 1`` degrees of freedom. When tonight has as many boots as the
    earlier nights the values are exchangeable under "no change", whatever the
    night and boot variances; with normal values the test is then exact (medians
    of normal boot means are nearly normal; ``bench/bench_stats.py`` measures the
    false-alert rate, ``nightly``). It needs at least two earlier
    nights, and with few nights it is weak (df 1 or 2): that is the price of not
    knowing how much nights differ. A step change is the model: the window should
    hold only nights after the last accepted change, which the caller ensures by
    starting the history after the last alert it acted on.
    """
    if not (0.0 < alpha < 0.5):
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha!r}")
    if not (0.0 <= min_effect < 1.0):
        raise ValueError(f"min_effect must be in [0, 1), got {min_effect!r}")
    if int(window) != window or window < 2:
        raise ValueError(f"window must be an integer >= 2 (nights), got {window!r}")
    nights = [_check_boots(night, f"history night {i}", positive=True)
              for i, night in enumerate(list(history)[-window:]) if len(night)]
    new = _check_boots(newest, "newest night", positive=True)
    if len(nights) < 2:
        raise ValueError(f"detect_shift needs at least 2 earlier nights with boots (the spread between "
                         f"nights is the noise), got {len(nights)}")
    values = np.array([np.median(np.log([b.mean() for b in night])) for night in nights])
    y_new = float(np.median(np.log([b.mean() for b in new])))
    n = values.size
    df = float(n - 1)
    diff = y_new - float(values.mean())
    se = float(values.std(ddof=1)) * math.sqrt(1.0 + 1.0 / n)
    if not se > 0:
        raise ValueError("detect_shift: every earlier night has exactly the same value; the metric shows "
                         "no variation at all, check that it is really measured")
    verdict = decide(diff, se, df, expect=worse, min_effect=min_effect, level=alpha)
    p, ci, ratio = verdict.p_value, verdict.ci, math.exp(diff)
    regressed = verdict.outcome is Outcome.CONFIRMED
    ref_boots = sum(len(night) for night in nights)
    p_text, alpha_text = shown_apart(p, alpha)  # the digits that tell p from alpha
    if regressed:
        reason = (f"Regression: {ratio:.4f}x of the last {n} nights (each night one value, {ref_boots} boots), "
                  f"prediction interval {ci[0]:.4f}x..{ci[1]:.4f}x, p={p_text} <= {alpha_text}")
    elif p <= alpha:
        reason = f"A change of {_pct(ratio - 1)} is shown (p={p:.2g}) but is below {min_effect:.0%}"
    else:
        reason = (f"No regression: {ratio:.4f}x of the last {n} nights, prediction interval "
                  f"{ci[0]:.4f}x..{ci[1]:.4f}x, p={p_text} > {alpha_text}")
    return Shift(regressed, ratio, ci, p, ref_boots, len(new), reason, n, df)
