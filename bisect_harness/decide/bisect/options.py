"""The settings of a bisection search, as one frozen value: :class:`SearchOptions`.

What each setting does is told where it acts: the model's (``likelihood``,
``drift``, ``no_step_prior``, ``step_scale``, ``unequal_variances``) in
:mod:`bisect_harness.decide.bisect.model`, the search's in
:mod:`bisect_harness.decide.bisect.search`.
"""

from __future__ import annotations

from dataclasses import dataclass

from bisect_harness.defaults import DEFAULT_CONFIDENCE, DEFAULT_VERIFY_ALPHA

__all__ = ["LIKELIHOODS", "SearchOptions"]

LIKELIHOODS = ("slow-mode", "student-t", "gaussian")


@dataclass(frozen=True)
class SearchOptions:
    """How a :class:`~bisect_harness.decide.bisect.search.BisectionSearch` searches.

    ``confidence``: the posterior mass that makes an answer (and ``1 -
    confidence`` the endpoint check's level). ``max_boots``: the search's boot
    budget. ``seed`` fixes the order inside paired rounds and breaks exact ties
    between probes, the same way on every run. The endpoint check takes
    ``initial_boots`` to ``max_endpoint_boots`` paired rounds; ``max_probe_boots``
    caps the boots of one probe. ``likelihood``: one of :data:`LIKELIHOODS`;
    ``drift``: learn a linear drift of the host (default: unless ``gaussian``);
    ``no_step_prior``: the prior mass of "no commit moved the metric";
    ``step_scale``: the scale of the step's half-Cauchy prior, relative to the
    metric's level; ``unequal_variances``: each side its own noise sd. ``verify``
    turns the head-to-head test on (``verify_alpha``, default
    :data:`~bisect_harness.defaults.DEFAULT_VERIFY_ALPHA`, shared by every
    head-to-head test of the search, up to ``max_verify_pairs`` rounds).
    ``anchor_every``: an anchor every so many probe rounds (0: none). ``width``:
    probes per round (parallel slots). ``min_effect``: the least relative change
    that counts (0.05 for 5%; None: any change): a paired test whose change is
    shown smaller ends ``below`` (the endpoint check: not reproduced; a
    head-to-head test: not passed).

    Checked when made; ``drift`` and ``verify_alpha`` hold their resolved values.
    """

    confidence: float = DEFAULT_CONFIDENCE
    max_boots: int = 200
    seed: int = 0
    initial_boots: int = 3
    max_endpoint_boots: int = 24
    max_probe_boots: int = 8
    likelihood: str = "slow-mode"
    drift: bool | None = None
    no_step_prior: float = 0.2
    step_scale: float = 0.1
    verify: bool = True
    verify_alpha: float | None = None
    max_verify_pairs: int = 24
    anchor_every: int = 2
    unequal_variances: bool = True
    width: int = 1
    min_effect: float | None = None

    def __post_init__(self):
        confidence, max_boots, initial_boots = self.confidence, self.max_boots, self.initial_boots
        max_endpoint_boots, max_probe_boots = self.max_endpoint_boots, self.max_probe_boots
        max_verify_pairs, anchor_every, likelihood = self.max_verify_pairs, self.anchor_every, self.likelihood
        no_step_prior, step_scale = self.no_step_prior, self.step_scale
        verify_alpha, width = self.verify_alpha, self.width
        if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
            raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")
        for name, value, low in (("max_boots", max_boots, 2), ("initial_boots", initial_boots, 2),
                                 ("max_endpoint_boots", max_endpoint_boots, 2),
                                 ("max_probe_boots", max_probe_boots, 1),
                                 ("max_verify_pairs", max_verify_pairs, 3),
                                 ("anchor_every", anchor_every, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if max_endpoint_boots < initial_boots:
            raise ValueError(f"max_endpoint_boots ({max_endpoint_boots}) must be >= "
                             f"initial_boots ({initial_boots})")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {', '.join(LIKELIHOODS)}, got {likelihood!r}")
        if not (0.0 <= no_step_prior < 1.0):
            raise ValueError(f"no_step_prior must lie in [0, 1), got {no_step_prior!r}")
        if not step_scale > 0.0:
            raise ValueError(f"step_scale must be > 0, got {step_scale!r}")
        verify_alpha = DEFAULT_VERIFY_ALPHA if verify_alpha is None else verify_alpha
        if not (0.0 < verify_alpha < 1.0):
            raise ValueError(f"verify_alpha must lie strictly between 0 and 1, got {verify_alpha!r}")
        min_effect = self.min_effect
        if min_effect is not None and not (isinstance(min_effect, (int, float)) and not isinstance(min_effect, bool)
                                           and 0.0 < min_effect < 1.0):
            raise ValueError(f"min_effect must be a relative change strictly between 0 and 1 (0.05 for 5%), "
                             f"or None, got {min_effect!r}")
        if not (isinstance(width, int) and width >= 1):
            raise ValueError(f"width must be a whole number of probes per round, at least 1, got {width!r}")
        resolved = dict(confidence=float(confidence), verify_alpha=float(verify_alpha),
                        drift=(likelihood != "gaussian") if self.drift is None else bool(self.drift),
                        no_step_prior=float(no_step_prior), step_scale=float(step_scale), verify=bool(self.verify),
                        unequal_variances=bool(self.unequal_variances),
                        min_effect=None if min_effect is None else float(min_effect))
        for name, value in resolved.items():
            object.__setattr__(self, name, value)
