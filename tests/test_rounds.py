"""Blocked rounds and the multiplicity family: the executor's side of a verdict.

The boot is the seam: a recording executor replaces ``Executor.boot`` (one boot of
one config) with a fake that succeeds at once, so the round scheduler, the design
and the family size run for real against a real SQLite ledger, without servers.
"""

from __future__ import annotations

import pytest

from bisect_harness.errors import SpecError
from bisect_harness.executor import Executor
from bisect_harness.ledger import Boot, Ledger
from bisect_harness.plan import make_plan
from bisect_harness.spec import load_spec

from helpers import write_spec

ENGINE = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}


def _spec(tmp_path, defaults=None, n=3):
    hyps = [{"id": f"h{i}", "baseline": {}, "treatment": {"flags": {"x": i}}, "metric": "tok_s",
             "expect": "increase", "min_effect": "5%"} for i in range(1, n + 1)]
    return write_spec(tmp_path / "h.yaml", engine=ENGINE, hypotheses=hyps, defaults=defaults)


class RecordingExecutor(Executor):
    """Boots nothing: each 'boot' is recorded in order and succeeds."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.order: list[str] = []

    def boot(self, st):
        self.order.append(st.planned.key)
        boot = Boot(run_id=self.run.id, config_id=st.row.id, config_key=st.planned.key, seq=len(st.boots) + 1,
                    status="ok")
        st.boots.append(boot)
        return boot


def _executor(spec, tmp_path, led, **kw):
    ex = RecordingExecutor(make_plan(spec), led, log_dir=tmp_path / "logs", calibrate=False, **kw)
    ex.start_run()
    return ex


def test_each_round_boots_every_config_once_in_a_seeded_random_order(tmp_path):
    spec = load_spec(_spec(tmp_path))
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        ex = _executor(spec, tmp_path, led, order_seed=1234)
        states = list(ex.states.values())
        assert len(states) == 4  # the shared baseline and three treatments
        ex.boot_round(states, 8)
        rounds = [ex.order[i:i + 4] for i in range(0, len(ex.order), 4)]
        keys = sorted(s.planned.key for s in states)
        assert len(rounds) == 8 and all(sorted(r) == keys for r in rounds)
        assert len({tuple(r) for r in rounds}) > 1  # not one fixed order
        assert ex.order_seed == 1234
        again = _executor(spec, tmp_path, led, order_seed=1234)
        again.boot_round(list(again.states.values()), 8)
        assert again.order == ex.order  # the seed replays the order
        other = _executor(spec, tmp_path, led)
        assert isinstance(other.order_seed, int) and 0 <= other.order_seed < 2 ** 32


def test_family_is_the_files_hypotheses_whatever_only_selects(tmp_path):
    spec = load_spec(_spec(tmp_path, defaults={"alpha": 0.06, "analysis": "paired"}))
    one = spec.select(["h2"])
    assert len(one.hypotheses) == 1 and one.multiplicity == 3 and spec.multiplicity == 3
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        ex = _executor(one, tmp_path, led)
        assert ex.alpha_each() == pytest.approx(0.02)
        d = ex.design()
        assert d.analysis == "paired" and d.alpha == 0.06


def test_analysis_key_defaults_and_errors(tmp_path):
    assert load_spec(_spec(tmp_path)).defaults.analysis == "unpaired"
    with pytest.raises(SpecError) as err:
        load_spec(_spec(tmp_path, defaults={"analysis": "blocked"}))
    msg = str(err.value)
    assert "defaults.analysis" in msg and "paired, unpaired" in msg and "blocked" in msg
