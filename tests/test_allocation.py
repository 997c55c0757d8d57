"""Where node time goes (``decide.allocation``) and how a run spends it: samples per
boot from the rounds' variance components and a cost model, and each verdict's cost.

The components are checked against boots drawn with known components; the choice
against the two-stage optimum; the run against the real ``harness run`` in this
process, its boots answered by the mock backend with samples whose spread is known.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bisect_harness.boot import SampleOutcome
from bisect_harness.backends.mock import MockBackend
from bisect_harness.decide import allocation
from bisect_harness.decide.allocation import CostModel, Components, round_components, samples_per_boot
from bisect_harness.errors import SpecError
from bisect_harness.spec import load_spec

_ENGINE = {"preset": "demo"}
_HYP = [{"id": "h", "statement": "s", "baseline": {}, "treatment": {"env": {"X": "1"}}, "metric": "tok_s",
         "expect": "decrease", "min_effect": "5%"}]
from helpers import last_json, query, write_spec
from mock_boots import BootDraws, harness_here


def _rounds(rng, n, m, within, between, effect=0.0):
    out = []
    for _ in range(n):
        pair = []
        for mu in (1.0, 1.0 + effect):
            level = 100.0 * mu * math.exp(between * rng.standard_normal())
            pair.append(list(level * np.exp(within * rng.standard_normal(m))))
        out.append(tuple(pair))
    return out


def test_components_recover_what_made_the_boots():
    rng = np.random.default_rng(1)
    c = round_components(_rounds(rng, 4000, 4, within=0.03, between=0.01))
    assert math.sqrt(c.var_within) == pytest.approx(0.03, rel=0.03)
    assert math.sqrt(c.var_between) == pytest.approx(0.01, rel=0.1)
    assert c.df_between == 4000 and c.df_within == 4000 * 2 * 3


def test_components_do_not_change_when_a_round_swaps_its_arms():
    # The next round's samples must not depend on which arm came out ahead: the rounds'
    # ratios stay symmetric about zero under no change.
    rng = np.random.default_rng(2)
    rounds = _rounds(rng, 6, 3, within=0.02, between=0.01, effect=0.05)
    swapped = [(b, a) if i % 2 else (a, b) for i, (a, b) in enumerate(rounds)]
    assert round_components(rounds) == round_components(swapped)


def test_an_effect_only_raises_the_between_part():
    rng = np.random.default_rng(3)
    same = round_components(_rounds(np.random.default_rng(3), 200, 3, 0.02, 0.01))
    moved = round_components(_rounds(rng, 200, 3, 0.02, 0.01, effect=0.10))
    assert moved.var_between > same.var_between and moved.var_within == pytest.approx(same.var_within)


def test_dear_boots_that_agree_take_more_samples_cheap_ones_fewer():
    agree = Components(var_within=0.03 ** 2, df_within=30, var_between=0.005 ** 2, df_between=5)
    differ = Components(var_within=0.01 ** 2, df_within=30, var_between=0.03 ** 2, df_between=5)
    large, small = CostModel(900.0, 20.0), CostModel(10.0, 3.0)
    # sqrt(45 * 36) = 40 -> the most; sqrt(3.33 * 36) = 11
    assert samples_per_boot(large, agree, min_samples=3, max_samples=16) == 16
    assert samples_per_boot(small, agree, min_samples=3, max_samples=16) == 11
    # boots that disagree: more boots, the fewest samples
    assert samples_per_boot(large, differ, min_samples=3, max_samples=16) == 3
    # a fixed count stays fixed
    assert samples_per_boot(large, agree, min_samples=5, max_samples=5) == 5


def test_before_two_rounds_a_stated_cost_takes_the_parts_as_equal():
    one = Components(var_within=0.0004, df_within=4, var_between=None, df_between=1)
    assert samples_per_boot(CostModel(900.0, 20.0), one, min_samples=2, max_samples=16) == 7  # sqrt(45)
    assert samples_per_boot(CostModel(900.0, 20.0), None, min_samples=2, max_samples=16) == 7
    assert samples_per_boot(CostModel(2.0, 1.0), None, min_samples=2, max_samples=16) == 2


def test_measured_cost_reads_what_boots_took_beside_their_samples():
    cost = allocation.measured_cost([(12.0, 2.0, 4), (11.0, 1.0, 2), (300.0, 2.0, 4), (0.0, 0.0, 0)])
    assert cost.source == "measured"
    assert cost.sample_s == pytest.approx(0.5) and cost.boot_s == pytest.approx(10.0)  # the build's boot is not typical
    assert allocation.measured_cost([(0.0, 0.0, 0)]) is None
    assert allocation.node_time(CostModel(900.0, 20.0), [3, 3, 16]) == pytest.approx(3 * 900 + 22 * 20)


@pytest.mark.parametrize("defaults, key, words", [
    ({"samples_per_boot": 8, "max_samples_per_boot": 4}, "defaults.max_samples_per_boot", "below samples_per_boot"),
    ({"boot_cost_s": 900}, "defaults.boot_cost_s", "sample_cost_s"),
    ({"boot_cost_s": 900, "sample_cost_s": 0}, "defaults.sample_cost_s", "positive"),
])
def test_bad_cost_and_sample_keys_are_named(tmp_path, defaults, key, words):
    spec = write_spec(tmp_path / "h.yaml", engine=_ENGINE, hypotheses=_HYP, defaults=defaults)
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert key in str(err.value) and words in str(err.value)


def test_more_first_samples_than_the_default_most_keep_their_count(tmp_path):
    d = load_spec(write_spec(tmp_path / "h.yaml", engine=_ENGINE, hypotheses=_HYP, defaults={"samples_per_boot": 20})).defaults
    assert d.max_samples_per_boot == 20
    d = load_spec(write_spec(tmp_path / "g.yaml", engine=_ENGINE, hypotheses=_HYP, defaults={"samples_per_boot": 2})).defaults
    assert d.max_samples_per_boot == 16 and d.boot_cost_s is None


class _QuietBoots:
    """Boots whose samples spread 3% and whose levels barely move (0.2%): the boots agree,
    so on a node whose boots are dear a later round should take many samples."""

    def __init__(self):
        self.samples: list[tuple[str, int]] = []
        self.backend = MockBackend(self, name="quiet-boots")
        self.draws = BootDraws()  # a run's rounds the same every time, whatever its boot order

    def __call__(self, r):
        self.samples.append((r.config_key, r.samples))
        rng = self.draws.rng(r, 7)
        level = 100.0 * math.exp(0.002 * rng.gauss(0, 1))
        return [SampleOutcome(seq=i + 1, metrics={"tok_s": level * math.exp(0.03 * rng.gauss(0, 1))},
                              requests=1, output_tokens=32, duration_s=0.3) for i in range(r.samples)]


def test_a_run_spends_a_dear_nodes_time_on_samples_and_says_what_each_verdict_cost(tmp_path):
    handler = _QuietBoots()
    spec = write_spec(
        tmp_path / "h.yaml", engine={"preset": "demo"},
        defaults={"samples_per_boot": 2, "max_samples_per_boot": 12, "boots_per_arm": 3, "max_boots_per_arm": 6,
                  "boot_cost_s": 900, "sample_cost_s": 20},
        hypotheses=[{"id": "inert", "statement": "an env var the engine never reads slows it by 1%",
                     "baseline": {}, "treatment": {"env": {"NEVER_READ": "1"}},
                     "metric": "tok_s", "expect": "decrease", "min_effect": "1%"}])
    db = tmp_path / "r.db"
    proc = harness_here("run", spec, "--ledger", f"sqlite:///{db}", "--journal-dir", tmp_path / "j", "--json",
                        handler=handler, cwd=tmp_path)
    out = last_json(proc.stdout)
    counts = [n for _, n in handler.samples]
    # the first three rounds: the choice for equal parts from the stated costs, sqrt(900/20) = 7
    assert counts[:6] == [7] * 6, counts
    # later rounds: the boots agree (0.2% against 3%), so the most samples
    assert counts[6:] and set(counts[6:]) == {12}, counts
    assert "samples per boot" in proc.stderr
    (h,) = out["hypotheses"]
    cost = h["cost"]
    n_boots = cost["boots"]["baseline"] + cost["boots"]["treatment"]
    assert n_boots == len(counts) and cost["samples"] == sum(counts)
    assert cost["model"] == {"boot_s": 900.0, "sample_s": 20.0, "source": "stated"}
    assert cost["samples_chosen"] is True
    (stats,), = query(db, "SELECT stats FROM verdicts WHERE final = 1")
    assert '"cost"' in stats


def test_the_journal_says_the_prices_chose_samples_only_where_they_did():
    from bisect_harness.report.journal import cost_line

    cost = {"boots": {"baseline": 3, "treatment": 3}, "samples": 18, "node_s": 41.0,
            "model": {"boot_s": 5.0, "sample_s": 0.5, "source": "measured"}}
    chosen = cost_line({**cost, "samples_chosen": True})
    fixed = cost_line({**cost, "samples_chosen": False})
    assert "3 + 3 boots" in chosen and "18 samples" in chosen and "41.0 s of node time" in chosen
    assert "chose their samples per boot" in chosen and "fixed count" not in chosen
    assert "chose" not in fixed and "the file's fixed count of samples" in fixed
    assert cost_line(None) is None

