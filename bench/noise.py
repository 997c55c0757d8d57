"""Noise that real hosts make, for the benches: one model per way a host misleads.

A bench that draws its noise from the distribution its method assumes proves little.
Each model here draws one *boot* (its per-sample values) of a config whose true level
is ``mu`` (a higher-is-better rate such as tok/s), at a point in time. Time is the
host's boot counter: every boot of every config advances it, so drift and bursts
act across configs the way they do on a real host (whole rounds move together).

Models (keys are stable; benches report under them):

* ``stationary``: Gaussian, equal variance, independent, stationary (the textbook).
  A boot draws its level ``mu (1 + between_cv z)``; each sample adds
  ``mu within_cv z'``.
* ``unequal_variance``: as stationary, but boots of the arm named ``"b"`` (or, for a
  commit range, commits at or after the culprit) have ``UNEQUAL_FACTOR`` times the
  between-boot CV (1% vs 6% by default: the ratio measured in the A/A report).
* ``heavy_tail``: 5% of boots run 20% slow (a stalled boot: thread placement, a
  page-cache miss, a neighbour's burst that lasts one boot).
* ``bimodal``: 20% of boots land in a second mode 8% slow (llama.cpp's two-mode
  boots in ``boots.csv``: about 46 and 60 tok/s).
* ``drift``: a linear drift of -0.1% per boot of host time (a host that warms, or
  gets quieter, during the search), which stops at -30% (after 300 boots: a long
  search would otherwise drive the level below zero).
* ``bursts``: an on/off neighbour (a two-state Markov chain over host time, mean
  burst 6 boots, on a quarter of the time); boots inside a burst run 25% slow with
  a CV of 8%, as the busy-host trace in ``boots.csv`` does (400-950 tok/s).
* ``autocorrelated``: the host's level wanders: an AR(1) process over host time
  (``AR_PHI`` 0.8 from one boot to the next, a stationary CV of ``AR_CV`` 2%), so
  consecutive boots share most of their host effect whatever config they boot (a
  neighbour's load, a thermal state, a page cache that outlive one boot).
* ``host_step``: the host turns ``STEP_SLOW`` (6%) slower at one moment of the run,
  drawn uniformly in boots ``STEP_AT`` (10..40: inside a search of about 45 boots),
  and stays so (a reboot into other clocks, a neighbour that moved in, a driver
  update between two boots).

Fitted shapes (``FITTED``): Gaussian boots with the within-boot and between-boot CVs
that the real boots of ``shared/noise/boots.csv`` show (one-way random-effects
method of moments on log tok/s, per config, then the configs of one shape pooled):

* ``h200_quiet``: ``llama-server`` on one H200 at its defaults, flash attention off,
  or an env var it never reads: within 2.3%, between 0.65% (most noise inside a boot).
* ``h200_graphs_off``: the same with CUDA graphs off: within 3.8%, between 4.0% (its
  boots land in two modes; here as their spread).
* ``cpu_quiet``: the CPU engine on a quiet host: within 2.3%, between 3.2%.

A busy CPU host (within 4-21%, between 15-34%) is left out: no rule resolves a 6%
change there in 20 boots a side, and the harness's answer to it is
``host_check: retry``, not a test.

``no culprit`` and the culprit's position are scenarios of the benches, not noise.

Load points (``Host.boot_points``): a boot that measures several points of a curve
(``sweep:``) gives them one host: the model's state for the boot (a mode, a stall,
a burst, the drift, the AR level, the step) is every point's, and of its Gaussian
between-boot part a fraction ``shared`` of the variance is common to the boot's
points (``POINTS_SHARED`` by default) and the rest each point's own (a boot whose
placement slows batch 32 more than batch 1). ``boots.csv`` holds one point per boot,
so the split is a model's choice, not a fit: the curve bench runs several.

Usage::

    host = Host("bimodal", np.random.default_rng(0))
    samples = host.boot(100.0, arm="a")      # ndarray of SAMPLES_PER_BOOT values
    host.boot_means(100.0, 5, arm="b")       # five boot means
"""

from __future__ import annotations

import math

import numpy as np

MODELS = ("stationary", "unequal_variance", "heavy_tail", "bimodal", "drift", "bursts", "autocorrelated",
          "host_step")
#: Shapes fitted from real boots: name -> (within-boot CV, between-boot CV).
FITTED = {"h200_quiet": (0.023, 0.0065), "h200_graphs_off": (0.038, 0.040), "cpu_quiet": (0.023, 0.032)}
ALL_MODELS = MODELS + tuple(FITTED)

WITHIN_CV = 0.02
BETWEEN_CV = 0.01
SAMPLES_PER_BOOT = 3
UNEQUAL_FACTOR = 6.0
TAIL_P, TAIL_SLOW = 0.05, 0.20
BIMODAL_P, BIMODAL_SLOW = 0.20, 0.08
DRIFT_PER_BOOT, DRIFT_FLOOR = -0.001, 0.70
BURST_MEAN_LEN, BURST_ON_FRACTION, BURST_SLOW, BURST_CV = 6.0, 0.25, 0.25, 0.08
AR_PHI, AR_CV = 0.8, 0.02
STEP_SLOW, STEP_AT = 0.06, (10, 40)
POINTS_SHARED = 0.5


class Host:
    """One simulated host for one trial: a noise model, a random stream, a clock."""

    def __init__(self, model: str, rng: np.random.Generator, *, within_cv: float = WITHIN_CV,
                 between_cv: float = BETWEEN_CV, samples_per_boot: int = SAMPLES_PER_BOOT):
        if model not in ALL_MODELS:
            raise ValueError(f"unknown noise model {model!r}; one of {', '.join(ALL_MODELS)}")
        if model in FITTED:  # Gaussian boots of the fitted components
            within_cv, between_cv = FITTED[model]
        self.model, self.rng = model, rng
        self.within_cv, self.between_cv, self.samples_per_boot = within_cv, between_cv, samples_per_boot
        self.t = 0  # boots so far, all configs together
        self._burst = False
        self._ar = AR_CV * rng.standard_normal() if model == "autocorrelated" else 0.0
        self._step_at = int(rng.integers(STEP_AT[0], STEP_AT[1] + 1)) if model == "host_step" else None

    def _advance_burst(self) -> bool:
        # Two-state chain with mean on-length BURST_MEAN_LEN and stationary on-fraction.
        p_off = 1.0 / BURST_MEAN_LEN
        p_on = p_off * BURST_ON_FRACTION / (1.0 - BURST_ON_FRACTION)
        if self.t == 0:
            self._burst = bool(self.rng.random() < BURST_ON_FRACTION)
        elif self._burst:
            self._burst = not (self.rng.random() < p_off)
        else:
            self._burst = bool(self.rng.random() < p_on)
        return self._burst

    def between(self, *, noisy_arm: bool) -> float:
        """The Gaussian between-boot CV of a boot (larger on the noisy arm under ``unequal_variance``)."""
        return self.between_cv * (UNEQUAL_FACTOR if (self.model == "unequal_variance" and noisy_arm) else 1.0)

    def factor(self, *, noisy_arm: bool, between_scale: float = 1.0) -> float:
        """The multiplicative host effect on one boot's level (1.0 is a quiet boot);
        ``between_scale`` scales its Gaussian between-boot part (``boot_points``)."""
        m, rng = self.model, self.rng
        f = 1.0 + between_scale * self.between(noisy_arm=noisy_arm) * rng.standard_normal()
        if m == "heavy_tail" and rng.random() < TAIL_P:
            f *= 1.0 - TAIL_SLOW
        elif m == "bimodal" and rng.random() < BIMODAL_P:
            f *= 1.0 - BIMODAL_SLOW
        elif m == "drift":
            f *= max(DRIFT_FLOOR, 1.0 + DRIFT_PER_BOOT * self.t)
        elif m == "bursts" and self._advance_burst():
            f *= 1.0 - BURST_SLOW + BURST_CV * rng.standard_normal()
        elif m == "autocorrelated":
            if self.t > 0:
                self._ar = AR_PHI * self._ar + AR_CV * math.sqrt(1.0 - AR_PHI ** 2) * rng.standard_normal()
            f *= 1.0 + self._ar
        elif m == "host_step" and self.t >= self._step_at:
            f *= 1.0 - STEP_SLOW
        return f

    def boot(self, mu: float, *, arm: str = "a", noisy: bool | None = None, samples: int | None = None) -> np.ndarray:
        """One boot of a config at true level ``mu``: its samples (``samples`` of them,
        else ``samples_per_boot``). ``noisy`` overrides which side gets the larger
        variance under ``unequal_variance`` (default: arm "b")."""
        level = mu * self.factor(noisy_arm=(arm == "b") if noisy is None else noisy)
        self.t += 1
        return level + mu * self.within_cv * self.rng.standard_normal(samples or self.samples_per_boot)

    def boot_points(self, mus, *, arm: str = "a", noisy: bool | None = None, samples: int | None = None,
                    shared: float = POINTS_SHARED) -> list[np.ndarray]:
        """One boot that measures several load points, the true level of each in ``mus``:
        each point's samples (``samples`` of them, else ``samples_per_boot``). The boot's
        host state is every point's; ``shared`` of its Gaussian between-boot variance is
        common to the points, the rest each point's own (see the module)."""
        if not 0.0 <= shared <= 1.0:
            raise ValueError(f"shared must be a fraction in [0, 1], got {shared!r}")
        noisy_arm = (arm == "b") if noisy is None else noisy
        f = self.factor(noisy_arm=noisy_arm, between_scale=math.sqrt(shared))
        own = self.between(noisy_arm=noisy_arm) * math.sqrt(1.0 - shared)
        self.t += 1
        n = samples or self.samples_per_boot
        return [mu * f * (1.0 + own * self.rng.standard_normal()) + mu * self.within_cv * self.rng.standard_normal(n)
                for mu in mus]

    def boot_means(self, mu: float, n: int, *, arm: str = "a", noisy: bool | None = None) -> np.ndarray:
        return np.array([self.boot(mu, arm=arm, noisy=noisy).mean() for _ in range(n)])
