"""Where is the step? The posterior of a noisy bisection over a linear list of commits.

The model is a single step change, or none. Between a known-good commit
``commits[0]`` and a known-bad commit ``commits[-1]`` either exactly one commit, the
*culprit* at index ``k`` (``1 <= k <= n-1``), moved the metric (every commit before
it on the good side, it and every commit after it on the bad side), or no commit
did (``k = none``: the endpoints' difference was noise). A boot's value (one float
per boot; the boot is the unit of replication) at host time ``t`` is modelled as

    x = mu_side + beta * t + s_side * e               e ~ N(0, 1), probability 1 - eps
    x = mu_side + beta * t + o + s_slow * e           the slow mode, probability eps
                                                      (likelihood="slow-mode", the default)
    x = mu_side + beta * t + s * e,   e ~ Student-t(4)     (likelihood="student-t")
    x = mu_side + s * e,              e ~ N(0, 1)          (likelihood="gaussian")

Host time is the order in which boots were observed (every boot of every commit
advances it), so ``beta`` is a linear drift of the host, learnt from commits that
are measured again later (the search's anchors). The *slow mode* is what real hosts
make: a boot that stalled 20% slow, a second mode of thread placement, a
neighbour's burst; it is shifted by ``o`` in the regression's own direction (at
least three noise sds), with its rate ``eps`` under a Beta(1, 19) prior, so one
slow boot is one unlikely draw of either side, not a reason to move the step.
Each side has its own noise sd ``s_side`` (shrunk towards the pooled one by three
pseudo-boots), since a regression often makes a config noisier as well as slower.

The posterior over ``k`` (and ``none``) uses the marginal likelihood of each split of
the observed boots into a good and a bad group. For ``gaussian`` without drift it is
exact (flat priors on the means, ``1/s^2`` on the scale, the step's sign restricted
to the expected direction):

    p(data | k)  ∝  (n_g n_b)^(-1/2) * SSE^(-(N-2)/2) * T_{N-2}(t_k)

Otherwise each split is fitted by EM (for ``student-t``, iteratively reweighted
least squares; Lange, Little & Taylor, JASA 1989), all splits at once, and the
marginal is its Laplace approximation. Comparing "a step at k" with "no step"
needs a proper prior on the step: half-Cauchy on the expected side with scale
``step_scale`` times the metric's level (10%; heavy-tailed, so a 40% regression is
not held against the step model); both models share flat priors on
the level and the drift, which cancel (the second noise sd costs the step model
``log(N) / 2``, as in BIC). The prior puts ``no_step_prior`` on ``none`` and
spreads the rest evenly over the commits.

Pure: :class:`StepModel` is made from the observations so far and answers once;
:class:`~bisect_harness.decide.bisect.search.BisectionSearch` makes one whenever its
observations changed.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import special, stats

from bisect_harness.decide.bisect.options import SearchOptions
from bisect_harness.model import Expect

__all__ = ["StepModel"]

#: degrees of freedom of the Student-t boot noise
NU = 4.0
#: the slow mode's rate has a Beta(1, EPS_PRIOR_B) prior (mean 5%)
EPS_PRIOR_B = 19.0
#: pseudo-boots of the pooled variance that each side's own variance is shrunk with
UNEQUAL_SHRINK = 3.0


class StepModel:
    """The marginal likelihood of each split of the observed boots into a good and a
    bad side, and of "no step", under ``options.likelihood`` (with the host's drift
    when ``options.drift``); :meth:`posterior` turns them into the posterior over
    the culprit.

    ``commits``: the range, good endpoint first; ``values[i]``: commit i's boot
    values; ``obs_i``, ``obs_x``: every boot's commit index and value in the order
    observed (host time).
    """

    def __init__(self, commits: Sequence[str], expect: Expect, options: SearchOptions,
                 values: Sequence[Sequence[float]], obs_i: Sequence[int], obs_x: Sequence[float]):
        self._commits, self._expect = commits, expect
        self._values, self._obs_i, self._obs_x = values, obs_i, obs_x
        self._likelihood, self._drift = options.likelihood, options.drift
        self._no_step_prior, self._step_scale = options.no_step_prior, options.step_scale
        self._unequal = options.unequal_variances

    def _fit(self):
        """Log marginal likelihood of each split of the observed commits, and of "no step".

        Returns ``(obs, loglik, split_stats, log_none)``: ``obs`` the observed commit
        indices in order; ``loglik[j]`` for "the first ``j`` observed commits are good"
        (entries 0 and ``len(obs)`` are -inf); ``split_stats`` (mean_g, mean_b, sd) per
        split in the data's units; ``log_none`` the marginal of "no step" on the same
        footing (-inf when ``no_step_prior`` is 0 or the fit is the exact Gaussian one).
        None when the endpoints lack boots or fewer than 4 boots exist.
        """
        n = len(self._commits)
        if not self._values[0] or not self._values[n - 1] or len(self._obs_x) < 4:
            return None
        obs = np.array([i for i in range(n) if self._values[i]], dtype=int)
        if self._likelihood == "gaussian" and not self._drift:
            return self._fit_gaussian(obs)
        if self._likelihood == "slow-mode":
            return self._fit_slow_mode(obs)
        return self._fit_robust(obs)

    def _fit_gaussian(self, obs):
        """The exact marginal under Gaussian noise, flat means, 1/s^2 on the scale."""
        allv = np.asarray(self._obs_x)
        total = allv.size
        center = float(allv.mean())
        scale = float(allv.std()) or (abs(center) if center != 0.0 else 1.0)
        cnt = np.array([len(self._values[i]) for i in obs], dtype=float)
        z = [(np.asarray(self._values[i]) - center) / scale for i in obs]
        s1 = np.array([v.sum() for v in z])
        s2 = np.array([(v * v).sum() for v in z])
        cn = np.concatenate([[0.0], np.cumsum(cnt)])
        c1 = np.concatenate([[0.0], np.cumsum(s1)])
        c2 = np.concatenate([[0.0], np.cumsum(s2)])
        m = obs.size
        j = np.arange(1, m)
        ng, nb = cn[j], cn[m] - cn[j]
        sg, sb = c1[j], c1[m] - c1[j]
        qg, qb = c2[j], c2[m] - c2[j]
        mg, mb = sg / ng, sb / nb
        # Tiny floor: noise-free data stays finite (the prior scale is 1e-6 of the spread).
        sse = np.maximum(qg - sg * mg, 0.0) + np.maximum(qb - sb * mb, 0.0) + 1e-12 * total
        df = total - 2
        se = np.sqrt(sse / df * (1.0 / ng + 1.0 / nb))
        t = self._expect.sign * (mb - mg) / se
        ll = -0.5 * np.log(ng * nb) - 0.5 * df * np.log(sse) + stats.t.logcdf(t, df)
        loglik = np.full(m + 1, -np.inf)
        loglik[1:m] = ll
        sd = np.sqrt(sse / df) * scale
        split_stats = np.full((m + 1, 3), np.nan)
        split_stats[1:m] = np.column_stack([center + mg * scale, center + mb * scale, sd])
        return obs, loglik, split_stats, -np.inf

    def _splits(self, obs):
        """The boots robustly standardised (median, MAD), host time standardised, and the
        split matrix: row j-1 marks the boots on the good side of split j (rank < j) for
        j = 1..m-1; the last row puts every boot in one group (no step)."""
        y_raw = np.asarray(self._obs_x)
        N = y_raw.size
        center = float(np.median(y_raw))
        scale = float(np.median(np.abs(y_raw - center))) * 1.4826 or float(y_raw.std()) \
            or (abs(center) if center != 0.0 else 1.0)
        y = (y_raw - center) / scale
        tt = np.arange(N, dtype=float)
        tt = (tt - tt.mean()) / (tt.std() or 1.0)
        m = obs.size
        rank = np.searchsorted(obs, np.asarray(self._obs_i))  # each boot's commit among the observed
        G = rank[None, :] < np.arange(1, m)[:, None]
        G = np.vstack([G, np.ones((1, N), dtype=bool)])
        return N, m, center, scale, y, tt, G

    def _fit_robust(self, obs):
        """Student-t (or Gaussian) errors with an optional linear drift: IRLS per split,
        all splits at once, then a Laplace approximation of each marginal."""
        N, m, center, scale, y, tt, G = self._splits(obs)
        S = G.shape[0]
        Bm = ~G
        nu = NU if self._likelihood == "student-t" else math.inf
        w = np.ones((S, N))
        s2 = np.full(S, float(np.var(y)) or 1.0)
        beta = np.zeros(S)
        for _ in range(30 if math.isfinite(nu) else 1):
            wg, wb = (w * G).sum(1), (w * Bm).sum(1)
            wb_safe = np.where(wb > 0, wb, 1.0)
            yg, yb = (w * G * y).sum(1) / wg, (w * Bm * y).sum(1) / wb_safe
            tg, tb = (w * G * tt).sum(1) / wg, (w * Bm * tt).sum(1) / wb_safe
            ymean = np.where(G, yg[:, None], yb[:, None])
            tmean = np.where(G, tg[:, None], tb[:, None])
            yc, tc = y[None, :] - ymean, tt[None, :] - tmean
            stt = (w * tc * tc).sum(1)
            if self._drift:
                beta = np.where(stt > 1e-9, (w * tc * yc).sum(1) / np.maximum(stt, 1e-9), 0.0)
            r = yc - beta[:, None] * tc
            s2_new = np.maximum((w * r * r).sum(1) / N, 1e-12)
            if math.isfinite(nu):
                w_new = (nu + 1.0) / (nu + r * r / s2_new[:, None])
            else:
                w_new = w
            converged = np.allclose(w_new, w, atol=1e-6) and np.allclose(s2_new, s2, rtol=1e-8)
            w, s2 = w_new, s2_new
            if converged:
                break
        s = np.sqrt(s2)
        if math.isfinite(nu):
            ll = (stats.t.logpdf(r / s[:, None], nu) - np.log(s)[:, None]).sum(1)
        else:
            ll = -0.5 * N * np.log(2 * math.pi * s2) - 0.5 * N
        wg, wb = (w * G).sum(1), (w * Bm).sum(1)
        log_det = np.log(wg) + np.log(np.maximum(wb, 1e-12)) - 2 * np.log(s2)
        if self._drift:
            log_det += np.log(np.maximum(stt, 1e-9)) - np.log(s2)
        # The step's size and its standard error (levels at host time 0).
        mg = yg - beta * tg
        mb = yb - beta * tb
        delta = mb - mg
        var_d = s2 * (1.0 / wg + 1.0 / np.maximum(wb, 1e-12)
                      + ((tb - tg) ** 2 / np.maximum(stt, 1e-9) if self._drift else 0.0))
        se = np.sqrt(var_d)
        tau = self._step_scale * (abs(center) if center != 0.0 else scale) / scale
        sign = self._expect.sign
        log_step = (ll[:-1] - 0.5 * log_det[:-1] + 0.5 * math.log(2 * math.pi)
                    + math.log(2.0) + stats.cauchy.logpdf(delta[:-1], 0.0, tau)
                    + stats.norm.logcdf(sign * delta[:-1] / se[:-1]))
        # No step: one level (and the drift); its determinant has one mean, not two.
        log_det0 = np.log(wg[-1]) - np.log(s2[-1]) + (np.log(max(stt[-1], 1e-9)) - np.log(s2[-1])
                                                      if self._drift else 0.0)
        log_none = float(ll[-1] - 0.5 * log_det0)
        loglik = np.full(m + 1, -np.inf)
        loglik[1:m] = log_step
        sd_boot = s[:-1] * (math.sqrt(nu / (nu - 2.0)) if math.isfinite(nu) else 1.0)
        split_stats = np.full((m + 1, 3), np.nan)
        split_stats[1:m] = np.column_stack([center + mg[:-1] * scale, center + mb[:-1] * scale,
                                            sd_boot * scale])
        return obs, loglik, split_stats, log_none

    def _fit_slow_mode(self, obs):
        """A boot is, with probability eps, in a *slow mode* shifted by o in the
        regression's direction (a stalled boot, a second mode, a neighbour's burst),
        else normal around its side's level; plus the drift. EM per split, all splits
        at once, then a Laplace approximation of each marginal.

        Long because the EM's steps share a dozen arrays per split (responsibilities,
        weights, levels, variances): as one loop over them it reads as the method it
        is, where functions would only pass them back and forth."""
        N, m, center, scale, y, tt, G = self._splits(obs)
        S = G.shape[0]
        Bm = ~G
        sign = float(self._expect.sign)
        drift = self._drift
        r = np.zeros((S, N))
        s2 = np.full(S, 0.25)
        s2g, s2b = s2.copy(), s2.copy()
        S2 = np.full((S, N), 0.25)
        s2k = np.full(S, 1.0)
        o = np.full(S, 4.0 * sign * 0.5)
        eps = np.full(S, 0.05)
        beta = np.zeros(S)
        for it in range(40):
            # M-step for the levels and the drift: weighted least squares on y minus the
            # slow offset, with weights from both components.
            om = (1.0 - r) / S2 + r / s2k[:, None]
            z = y[None, :] - (r / s2k[:, None]) * o[:, None] / om
            wg, wb = (om * G).sum(1), (om * Bm).sum(1)
            wb_safe = np.where(wb > 0, wb, 1.0)
            zg, zb = (om * G * z).sum(1) / wg, (om * Bm * z).sum(1) / wb_safe
            tg, tb = (om * G * tt).sum(1) / wg, (om * Bm * tt).sum(1) / wb_safe
            zc = z - np.where(G, zg[:, None], zb[:, None])
            tc = tt[None, :] - np.where(G, tg[:, None], tb[:, None])
            stt = (om * tc * tc).sum(1)
            if drift:
                beta = np.where(stt > 1e-9, (om * tc * zc).sum(1) / np.maximum(stt, 1e-9), 0.0)
            level = np.where(G, (zg - beta * tg)[:, None], (zb - beta * tb)[:, None])
            e = y[None, :] - level - beta[:, None] * tt[None, :]
            # E-step: responsibility of the slow mode.
            l1 = np.log1p(-eps)[:, None] + stats.norm.logpdf(e, 0.0, np.sqrt(S2))
            l2 = np.log(eps)[:, None] + stats.norm.logpdf(e, o[:, None], np.sqrt(s2k)[:, None])
            lse = np.logaddexp(l1, l2)
            r_new = np.exp(l2 - lse)
            # M-step for the noise: main and slow variances, the slow shift and rate.
            w1 = 1.0 - r_new
            s2 = np.maximum((w1 * e * e).sum(1) / np.maximum(w1.sum(1), 1e-9), 1e-6)
            if self._unequal:
                # Each side its own variance, shrunk towards the pooled one by
                # UNEQUAL_SHRINK pseudo-boots so that a side with two boots stays sane.
                k0 = UNEQUAL_SHRINK
                s2g = ((w1 * G * e * e).sum(1) + k0 * s2) / ((w1 * G).sum(1) + k0)
                s2b = ((w1 * Bm * e * e).sum(1) + k0 * s2) / ((w1 * Bm).sum(1) + k0)
                S2 = np.maximum(np.where(G, s2g[:, None], s2b[:, None]), 1e-6)
            else:
                S2 = np.broadcast_to(s2[:, None], (S, N))
            rs = r_new.sum(1)
            o_hat = np.where(rs > 1e-6, (r_new * e).sum(1) / np.maximum(rs, 1e-9), o)
            # The slow mode lies clearly on the slow side: at least 3 main sds away.
            o = sign * np.maximum(sign * o_hat, 3.0 * np.sqrt(s2))
            s2k = np.maximum((r_new * (e - o[:, None]) ** 2).sum(1) / np.maximum(rs, 1e-9), s2)
            s2k = np.where(rs > 1e-6, s2k, np.maximum(s2k, s2))
            # MAP under a Beta(1, EPS_PRIOR_B) prior: with few boots, calling many of
            # them "slow" is not free.
            eps = np.clip(rs / (N + EPS_PRIOR_B - 1.0), 0.005, 0.35)
            done = np.max(np.abs(r_new - r)) < 1e-5
            r = r_new
            if done and it > 2:
                break
        ll = lse.sum(1) + (EPS_PRIOR_B - 1.0) * np.log1p(-eps)
        om = (1.0 - r) / S2 + r / s2k[:, None]
        wg, wb = (om * G).sum(1), (om * Bm).sum(1)
        log_det = np.log(wg) + np.log(np.maximum(wb, 1e-12))
        if drift:
            log_det += np.log(np.maximum(stt, 1e-9))
        mg = zg - beta * tg
        mb = zb - beta * tb
        delta = mb - mg
        var_d = 1.0 / wg + 1.0 / np.maximum(wb, 1e-12) + (
            (tb - tg) ** 2 / np.maximum(stt, 1e-9) if drift else 0.0)
        se = np.sqrt(var_d)
        tau = self._step_scale * (abs(center) if center != 0.0 else scale) / scale
        log_step = (ll[:-1] - 0.5 * log_det[:-1] + 0.5 * math.log(2 * math.pi)
                    + math.log(2.0) + stats.cauchy.logpdf(delta[:-1], 0.0, tau)
                    + stats.norm.logcdf(sign * delta[:-1] / se[:-1]))
        if self._unequal:
            log_step = log_step - 0.5 * math.log(N)  # the second variance, against "no step" (BIC)
        log_det0 = math.log(wg[-1]) + (math.log(max(stt[-1], 1e-9)) if drift else 0.0)
        log_none = float(ll[-1] - 0.5 * log_det0)
        loglik = np.full(m + 1, -np.inf)
        loglik[1:m] = log_step
        split_stats = np.full((m + 1, 3), np.nan)
        split_stats[1:m] = np.column_stack([center + mg[:-1] * scale, center + mb[:-1] * scale,
                                            np.sqrt(s2[:-1]) * scale])
        return obs, loglik, split_stats, log_none

    def posterior(self):
        """Posterior over the culprit index (entry 0 is always 0), P(no step), split stats."""
        n = len(self._commits)
        fit = self._fit()
        if fit is None:
            p = np.full(n, (1.0 - self._no_step_prior) / (n - 1))
            p[0] = 0.0
            return p, self._no_step_prior, None, None
        obs, loglik, split_stats, log_none = fit
        k = np.arange(n)
        j_of_k = np.searchsorted(obs, k, side="left")  # observed commits strictly before k
        logp = loglik[j_of_k]
        logp[0] = -np.inf
        if self._no_step_prior > 0.0 and math.isfinite(log_none):
            logp = logp + math.log((1.0 - self._no_step_prior) / (n - 1))
            l0 = log_none + math.log(self._no_step_prior)
        else:
            l0 = -np.inf
        z = special.logsumexp(np.append(logp, l0))
        p = np.exp(logp - z)
        p[0] = 0.0
        return p, float(np.exp(l0 - z)), j_of_k, split_stats
