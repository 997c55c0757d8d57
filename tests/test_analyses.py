"""The analyses are kinds: one module each, registered by name, and one class is all
a new analysis takes (the spec, the schema, evaluate and the simulations find it)."""

from __future__ import annotations

import importlib
import math
import pkgutil

import numpy as np
import pytest
from scipy import stats as st

from bisect_harness.decide import analyses
from bisect_harness.decide.analyses.base import Analysis, Arms, Estimate
from bisect_harness.decide.analyses.unpaired import Unpaired
from bisect_harness.decide.design import ANALYSES, Design
from bisect_harness.decide.evaluate import boots_to_decide, evaluate
from bisect_harness.decide.power import noise_floor
from bisect_harness.decide.simulate import _draw, _run_paths
from bisect_harness.errors import SpecError
from bisect_harness.model import Expect, Outcome
from bisect_harness.spec import load_spec
from bisect_harness.spec.schema import hypotheses_schema

from helpers import write_spec


def test_each_module_of_the_folder_is_one_registered_analysis_listed_default_first():
    assert ANALYSES.names() == ("robust", "paired", "unpaired")
    modules = {m.name for m in pkgutil.iter_modules(analyses.__path__)} - {"base"}
    defined = {type(kind).__module__.rpartition(".")[2] for kind in ANALYSES.values()}
    assert defined == modules
    for name, kind in ANALYSES.items():
        assert isinstance(kind, Analysis) and kind.name == name
        assert importlib.import_module(type(kind).__module__).__doc__


class Pooled(Unpaired):
    """Student's two-sample t-test on log boot means, the variance pooled (equal
    variances assumed): a new analysis in one class, for these tests."""

    name = "pooled-for-test"
    listed = 9
    null_ratios = (1.0,)

    @staticmethod
    def null_t(rng, n, kmax, idx, k, ratio=1.0):
        x = rng.standard_normal((2, n, kmax))
        x[1] *= math.sqrt(ratio)
        m = np.cumsum(x, axis=2)[:, :, idx] / k
        v = (np.cumsum(x * x, axis=2)[:, :, idx] - k * m * m) / (k - 1)
        t = (m[1] - m[0]) / np.sqrt((v[0] + v[1]) / 2 * (2 / k))
        return t, np.broadcast_to(2 * k - 2, t.shape)

    def standard_error(self, arms: Arms, est: Estimate) -> tuple[float, float]:
        (vb, vt), (kb, kt) = arms.var, arms.boots
        pooled = ((kb - 1) * vb + (kt - 1) * vt) / (kb + kt - 2)
        return math.sqrt(pooled * (1 / kb + 1 / kt)), float(kb + kt - 2)

    def test_name(self, design, alpha, k, span):
        return f"one-sided Student t-test on log boot means (pooled), {design.spending} alpha spending {span}"

    def path_statistics(self, logs, looks):
        k = looks.astype(float)
        m = np.cumsum(logs, axis=2)[:, :, looks - 1] / k
        v = np.maximum(np.cumsum(logs * logs, axis=2)[:, :, looks - 1] - k * m * m, 0.0) / (k - 1)
        return m[1] - m[0], np.sqrt((v[0] + v[1]) / 2 * (2 / k)), np.broadcast_to(2 * k - 2, k.shape)


@pytest.fixture
def pooled():
    kind = ANALYSES.add(Pooled())
    try:
        yield kind
    finally:
        ANALYSES.discard(kind.name)


def _boots(rng, mean, n):
    return [list(mean * (1 + 0.01 * rng.standard_normal()) * (1 + 0.02 * rng.standard_normal(3))) for _ in range(n)]


def test_a_new_analysis_is_one_class_and_evaluate_tests_with_it(pooled):
    assert ANALYSES.names()[-1] == pooled.name and Design(analysis=pooled.name).analysis == pooled.name
    rng = np.random.default_rng(7)
    base, treat = _boots(rng, 100, 5), _boots(rng, 103, 5)
    v = evaluate(base, treat, expect=Expect.INCREASE, min_effect=0.01, design=Design(analysis=pooled.name))
    lb, lt = np.log([np.mean(b) for b in base]), np.log([np.mean(b) for b in treat])
    assert v.p_value == pytest.approx(st.ttest_ind(lt, lb, equal_var=True, alternative="greater").pvalue, rel=1e-10)
    assert v.analysis == pooled.name and "Student" in v.test and v.n_pairs is None
    assert "about" in boots_to_decide(0.0, 0.05, 0.05, 0.01, "+5.0%", pooled.name)
    assert noise_floor(base, design=Design(analysis=pooled.name)).smallest_detectable_effect > 0


def test_a_new_analysis_is_simulated_exactly_as_evaluate_decides(pooled):
    d = Design(analysis=pooled.name)
    samples = _draw(np.random.default_rng(18), 40, 0.02, 0.01, 0.02, d.max_boots, d.samples_per_boot)
    outcomes, boots, _ = _run_paths(samples, Expect.INCREASE, 0.01, d, 0.05)
    code = {Outcome.CONFIRMED: 1, Outcome.REFUTED: -1, Outcome.INCONCLUSIVE: 0}
    for i in range(samples.shape[1]):
        for k in d.looks:
            v = evaluate(samples[0, i, :k], samples[1, i, :k], expect=Expect.INCREASE, min_effect=0.01, design=d)
            if v.final:
                break
        assert (code[v.outcome], k) == (outcomes[i], boots[i])


def test_the_spec_and_the_schema_read_the_analyses_from_the_registry(pooled, tmp_path):
    engine = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}
    hyps = [{"id": "h", "baseline": {}, "treatment": {"flags": {"x": 1}}, "metric": "tok_s",
             "expect": "increase", "min_effect": "5%"}]
    spec = load_spec(write_spec(tmp_path / "h.yaml", engine=engine, hypotheses=hyps,
                                defaults={"analysis": pooled.name}))
    assert spec.defaults.analysis == pooled.name
    assert pooled.name in str(hypotheses_schema())
    ANALYSES.discard(pooled.name)
    with pytest.raises(SpecError, match="robust, paired, unpaired"):
        load_spec(tmp_path / "h.yaml")
