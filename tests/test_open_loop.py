"""Open loop: requests sent at seeded arrival times, late or not, against real servers on
loopback; seeded lengths that both arms of a round share; samples that last a window;
percentiles with their order-statistic intervals; goodput under an SLO.

The Replay server of ``test_client`` streams a recorded vLLM answer with known delays,
so a request's duration is known and the overlap of an open-loop sample is checkable.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from bisect_harness.measure import arrivals
from bisect_harness.measure.client import _jobs, measure_sample_detail
from bisect_harness.measure.jobs import Draw
from bisect_harness.measure.deadline import deadline_client
from bisect_harness.measure.dispatch import open_loop
from bisect_harness.measure.percentiles import percentile_metrics, quantile_interval, quantile_ranks
from bisect_harness.measure.slo import check_slo, slo_metrics
from bisect_harness.model import OPEN_LOOP_METRICS, SLO_METRICS
from bisect_harness.workload import SloTerm
from test_client import Replay, _record, spec

# --------------------------------------------------------------------------- arrivals


def test_arrival_times_are_the_rounds_and_samples_own_and_both_arms_see_the_same():
    bench = spec(request_rate=5.0)
    a = arrivals.arrival_times(bench, boot_seq=3, sample=2, count=50)
    # the two arms of round 3 are two boots (two ledger ids) with the same boot_seq: the same times
    assert arrivals.arrival_times(dataclasses.replace(bench, model="other"), boot_seq=3, sample=2, count=50) == a
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    assert arrivals.arrival_times(bench, boot_seq=4, sample=2, count=50) != a  # another round
    assert arrivals.arrival_times(bench, boot_seq=3, sample=3, count=50) != a  # another sample
    assert arrivals.arrival_times(bench, boot_seq=3, sample=2, trial=1, count=50) != a  # a search's next trial
    assert arrivals.arrival_times(dataclasses.replace(bench, seed=1), boot_seq=3, sample=2, count=50) != a
    # the first n of a longer draw: the same whatever the count
    assert arrivals.arrival_times(bench, boot_seq=3, sample=2, count=700)[:50] == a


def test_arrival_gaps_follow_the_law_asked():
    from scipy import stats

    rate = 8.0
    times = arrivals.arrival_times(spec(request_rate=rate, arrival="poisson"), count=4001)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 0.001
    # gamma of shape k: mean 1/r, coefficient of variation 1/sqrt(k)
    for k in (0.25, 4.0):
        t = arrivals.arrival_times(spec(request_rate=rate, arrival="gamma", burstiness=k), count=4001)
        g = [b - a for a, b in zip(t, t[1:])]
        assert stats.kstest(g, "gamma", args=(k, 0, 1 / (rate * k))).pvalue > 0.001
        assert statistics.mean(g) == pytest.approx(1 / rate, rel=0.1)
        assert statistics.pstdev(g) / statistics.mean(g) == pytest.approx(1 / math.sqrt(k), rel=0.1)
    assert arrivals.arrival_times(spec(request_rate=4.0, arrival="constant"), count=4) == (0.0, 0.25, 0.5, 0.75)


def test_a_window_takes_the_arrivals_inside_it():
    bench = spec(request_rate=20.0)
    inside = arrivals.arrival_times(bench, within_s=3.0)
    longer = arrivals.arrival_times(bench, count=len(inside) + 1)
    assert inside == longer[:-1] and inside[-1] < 3.0 <= longer[-1]
    assert arrivals.arrival_times(spec(request_rate=8.0, arrival="constant"), within_s=0.5) == (0.0, 0.125, 0.25,
                                                                                                 0.375)


@pytest.mark.parametrize("changes, key", [({"request_rate": 0.0}, "request_rate"),
                                          ({"request_rate": math.inf}, "request_rate"),
                                          ({"arrival": "bursty"}, "arrival"),
                                          ({"arrival": "gamma", "burstiness": 0.0}, "burstiness")])
def test_an_arrival_process_that_cannot_be_drawn_names_its_key(changes, key):
    with pytest.raises(ValueError, match=f"benchmark.{key}"):
        arrivals.arrival_times(spec(**{"request_rate": 1.0, **changes}), count=3)


def test_lengths_are_drawn_in_their_range_per_request_the_same_in_both_arms():
    bench = spec(prompt_tokens=10, prompt_tokens_max=40, output_tokens=4, output_tokens_max=12)

    def drawn(boot, boot_seq, sample=1):
        jobs = _jobs(bench, "http://x", "m", 200, Draw(boot, sample, boot_seq))
        return [(len(j.payload["prompt"].split()), j.payload["max_tokens"], j.most) for j in jobs]

    arm_a, arm_b = drawn(boot=11, boot_seq=2), drawn(boot=12, boot_seq=2)
    assert arm_a == arm_b  # two boots of round 2: their prompts' tags differ, their lengths do not
    words, outs, most = zip(*arm_a)
    assert min(words) == 10 and max(words) == 40 and min(outs) == 4 and max(outs) == 12
    assert outs == most  # the request's own cap on the tokens it may count
    assert drawn(boot=11, boot_seq=3) != arm_a and drawn(boot=11, boot_seq=2, sample=2) != arm_a
    # a fixed length where no range is set, as before
    fixed = _jobs(spec(prompt_tokens=10, output_tokens=4), "http://x", "m", 5)
    assert {(len(j.payload["prompt"].split()), j.payload["max_tokens"]) for j in fixed} == {(10, 4)}
    with pytest.raises(ValueError, match="benchmark.output_tokens_max is 3, below output_tokens"):
        arrivals.request_lengths(spec(output_tokens=4, output_tokens_max=3), 0)


# --------------------------------------------------------------------------- live open loop


def test_open_loop_sends_on_schedule_while_earlier_requests_still_stream():
    # each request takes about 0.15 + 7 * 0.05 = 0.5 s; 12 of them at 10 a second overlap ~5 deep
    bench = spec(request_rate=10.0, arrival="constant", requests_per_sample=12)
    with Replay("vllm_completions.sse", first_delay=0.15, delay=0.05) as srv, deadline_client() as http:
        detail = measure_sample_detail(srv.base_url, bench, client=http)
    m, reqs = detail.result.metrics, detail.requests
    assert detail.result.requests == 12 and len(detail.lags_s) == 12
    starts = sorted(r.start_s for r in reqs)
    for k, start in enumerate(starts):  # each left at its time, never before it
        assert k * 0.1 <= start < k * 0.1 + 0.05, starts
    ends = sorted(r.start_s + r.e2e_s for r in reqs)
    assert sum(1 for s in starts if s < ends[0]) >= 4  # four sent before the first had ended: open loop
    assert m["achieved_rps"] == pytest.approx(10.0, rel=0.05)
    assert 0.0 < m["send_lag_p99_ms"] < bench.max_lag_ms and m["client_behind"] == 0.0 and detail.behind is None
    assert set(OPEN_LOOP_METRICS) <= set(m)
    assert 1.1 + 0.5 <= detail.result.duration_s < 1.1 + 0.5 + 1.0


def test_a_client_that_cannot_keep_up_is_marked_behind_never_counted_as_the_rate():
    # 200 requests due within 4 ms: no client starts 200 streams that fast
    bench = spec(request_rate=50_000.0, arrival="constant", requests_per_sample=200, max_lag_ms=2.0)
    with Replay("vllm_completions.sse") as srv, deadline_client() as http:
        srv.server.request_queue_size = 256
        detail = measure_sample_detail(srv.base_url, bench, client=http)
    m = detail.result.metrics
    assert m["client_behind"] == 1.0 and m["send_lag_p99_ms"] > 2.0
    assert m["achieved_rps"] < 50_000.0 / 2
    behind = detail.behind
    assert behind is not None and behind.lag_p99_ms == m["send_lag_p99_ms"] and behind.sends == 200
    assert behind.to_json()["asked_rps"] == 50_000.0 and behind.max_lag_ms == 2.0


def test_a_window_ends_an_open_loop_sample_at_its_last_arrival_and_a_closed_loop_one_at_its_clock():
    with Replay("vllm_completions.sse", first_delay=0.05, delay=0.02) as srv, deadline_client() as http:
        opened = measure_sample_detail(srv.base_url, spec(request_rate=8.0, arrival="constant", sample_seconds=0.5,
                                                          requests_per_sample=99), client=http)
        closed = measure_sample_detail(srv.base_url, spec(concurrency=2, sample_seconds=0.6, requests_per_sample=1),
                                       client=http)
    assert opened.result.requests == 4  # the arrivals at 0, 0.125, 0.25 and 0.375 s
    # two workers of ~0.19 s requests for 0.6 s: each starts 3 or 4, none after the window
    assert 6 <= closed.result.requests <= 8
    assert max(r.start_s for r in closed.requests) < 0.6 <= closed.result.duration_s
    assert "send_lag_p99_ms" not in closed.result.metrics and closed.result.metrics["achieved_rps"] > 0


def test_open_loop_dispatch_runs_any_job_and_raises_what_a_job_raised():
    class Boom:
        def run(self, http, sample_t0):
            raise RuntimeError("a bug in a job")

    class Quiet:
        def run(self, http, sample_t0):
            return []

    done = open_loop(None, [Quiet(), Quiet()], [0.0, 0.01])
    assert len(done.lags_s) == 2 and done.records == ()
    with pytest.raises(RuntimeError, match="a bug in a job"):
        open_loop(None, [Quiet(), Boom(), Quiet()], [0.0, 0.0, 0.01])


# --------------------------------------------------------------------------- percentile intervals


def _brute_force_ranks(n, q, confidence=0.95):
    """The interval's ranks by trying every rank against scipy's binomial law."""
    import numpy as np
    from scipy.stats import binom

    tail = (1 - confidence) / 2
    ranks = np.arange(1, n + 1)
    lows = ranks[binom.cdf(ranks - 1, n, q) <= tail]  # P(X(k) above the quantile) = P(B <= k - 1)
    highs = ranks[binom.sf(ranks - 1, n, q) <= tail]  # P(X(k) below it) = P(B >= k)
    return (int(lows.max()) if lows.size else None), (int(highs.min()) if highs.size else None)


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_order_statistic_ranks_match_a_brute_force_binomial_search(q):
    for n in [*range(1, 80), 100, 250, 366, 367, 368, 500, 1000, 4321, 50_000]:
        assert quantile_ranks(n, q) == _brute_force_ranks(n, q), n


def test_a_p99_of_fewer_than_368_requests_has_no_upper_end():
    assert quantile_ranks(367, 0.99)[1] is None and quantile_ranks(368, 0.99)[1] == 368
    assert quantile_ranks(5, 0.5) == (None, None) and quantile_ranks(6, 0.5) == (1, 6)
    lo, hi = quantile_interval([float(i) for i in range(100)], 0.99)
    # the 97th smallest of 100: P(Binomial(100, 0.99) <= 96) = 0.018 <= 0.025 < P(... <= 97)
    assert lo == 96.0 and math.isnan(hi)


def test_the_interval_holds_the_true_quantile_as_often_as_it_says():
    import numpy as np

    rng = np.random.default_rng(7)
    n, q, trials = 60, 0.9, 4000
    truth = -math.log(1 - q)  # the p90 of the unit exponential
    held = 0
    for _ in range(trials):
        lo, hi = quantile_interval(rng.exponential(size=n).tolist(), q)
        held += lo <= truth <= hi
    # at least 95% by construction (the ranks are discrete: here about 96.5%)
    assert held / trials >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / trials)


def test_every_percentile_has_its_interval_and_e2e_its_percentiles():
    recs = [_record(0.01 * (i + 1), [0.001] * 3, 4) for i in range(400)]
    m = percentile_metrics(recs)
    for what in ("ttft", "itl", "tpot", "e2e"):
        for q in (50, 90, 99):
            name = f"{what}_p{q}_ms"
            assert m[f"{name}_lo"] <= m[name] <= m[f"{name}_hi"], name
    assert m["e2e_p50_ms"] == pytest.approx(1e3 * (0.01 * 200.5 + 0.003))
    few = percentile_metrics(recs[:50])
    assert math.isnan(few["ttft_p99_ms_hi"]) and not math.isnan(few["ttft_p99_ms_lo"])


# --------------------------------------------------------------------------- SLO


def test_goodput_counts_the_requests_that_met_every_term_and_slo_met_the_percentiles():
    # TTFT 10..100 ms; TPOT 5 ms except the last two requests (50 ms)
    recs = [_record(0.01 * (i + 1), [0.005] * 4, 5) for i in range(8)]
    recs += [_record(0.09, [0.05] * 4, 5), _record(0.10, [0.05] * 4, 5)]
    terms = (SloTerm("ttft_p50_ms", 60.0), SloTerm("tpot_p90_ms", 20.0))
    check = check_slo(recs, terms)
    # good: TTFT <= 60 and TPOT <= 20 -> the first six
    assert check.good == 6
    assert [t.held for t in check.terms] == [True, False]  # TTFT p50 55 ms; TPOT p90 50 ms
    m = slo_metrics(check, wall_s=2.0)
    assert m == {"goodput_rps": 3.0, "slo_met": 0.0}
    assert set(m) == set(SLO_METRICS)
    held = check_slo(recs, (SloTerm("ttft_p50_ms", 60.0),))
    assert held.held is True and slo_metrics(held, 2.0)["slo_met"] == 1.0


def test_an_slo_term_no_request_could_be_judged_by_is_not_a_pass():
    one_token = [_record(0.01, [], 1)]
    check = check_slo(one_token, (SloTerm("tpot_p99_ms", 50.0),))
    assert check.held is None and math.isnan(slo_metrics(check, 1.0)["slo_met"])
    assert check.good == 1  # a request without a TPOT is not held against the term
    with pytest.raises(ValueError, match="slo: tok_s_p99_ms <= 5 is not a latency percentile"):
        check_slo(one_token, (SloTerm("tok_s_p99_ms", 5.0),))


def test_a_sample_under_an_slo_carries_goodput_and_slo_met():
    bench = spec(requests_per_sample=4, slo=(SloTerm("ttft_p90_ms", 5000.0), SloTerm("e2e_p50_ms", 1.0)))
    with Replay("vllm_completions.sse", first_delay=0.02, delay=0.01) as srv:
        m = measure_sample_detail(srv.base_url, bench).result.metrics
    assert m["slo_met"] == 0.0 and m["goodput_rps"] == 0.0  # no request ends within 1 ms
    assert "send_lag_p99_ms" not in m  # closed loop


# --------------------------------------------------------------------------- in a boot


def demo_boot_request(tmp_path, **bench):
    """The request of one boot of the demo engine (2 samples) with ``bench`` laid over the
    small benchmark: what the plan would hand the backend for such a spec."""
    from bisect_harness.plan.build import make_plan
    from bisect_harness.spec import load_spec
    from helpers import SMALL_BENCH, write_spec

    spec_ = load_spec(write_spec(tmp_path / "h.yaml", engine={"preset": "demo"}, benchmark=SMALL_BENCH,
                                 hypotheses=[{"id": "h", "baseline": {"commit": "HEAD"},
                                              "treatment": {"commit": "HEAD", "env": {"DEMO_X": "1"}},
                                              "metric": "tok_s", "expect": "decrease", "min_effect": "5%"}],
                                 defaults={"samples_per_boot": 2, "host_preflight_s": 0}))
    plan = make_plan(spec_)
    req = plan.boot_request(plan.configs[0], boot_id=7, seq=3, log_path=tmp_path / "boot-7.log")
    return dataclasses.replace(req, benchmark=dataclasses.replace(req.benchmark, **bench))


@pytest.mark.slow
def test_a_boot_marks_the_open_loop_samples_whose_client_fell_behind(tmp_path):
    from bisect_harness.backends.procedure import run_boot

    # a limit of 0 ms: every send is late by some microseconds, so every sample is behind
    req = demo_boot_request(tmp_path, request_rate=4.0, requests_per_sample=4, max_lag_ms=0.0,
                            output_tokens=8, output_tokens_max=16)
    out = run_boot(req)
    assert out.status == "ok", (out.failure, out.log_tail)
    assert "client_behind" in out.marks
    behind = out.evidence.client_behind["samples"]
    assert set(behind) == {"1", "2"} and all(s["max_lag_ms"] == 0.0 and s["sends"] == 4 for s in behind.values())
    for s in out.samples:
        assert s.metrics["client_behind"] == 1.0 and s.metrics["send_lag_p99_ms"] > 0.0
        assert behind[str(s.seq)]["lag_p99_ms"] == s.metrics["send_lag_p99_ms"]
        assert 8 * 4 <= s.output_tokens <= 16 * 4  # the seeded lengths, as the demo engine counted them
