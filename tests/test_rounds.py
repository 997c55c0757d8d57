"""Blocked rounds and the multiplicity family: the scheduler's side of a verdict.

The backend is the seam: the mock backend turns each boot request into an ok
outcome at once, so the round scheduler, the design and the family size run for
real against a real SQLite ledger, without servers.
"""

from __future__ import annotations

import pytest

from bisect_harness.backends.mock import MockBackend, failed
from bisect_harness.errors import SpecError
from bisect_harness.boot import BootOutcome
from bisect_harness.run.executor import Executor
from bisect_harness.record.ledger import Ledger
from bisect_harness.plan.build import make_plan
from bisect_harness.spec import load_spec

from helpers import write_spec

ENGINE = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}


def _spec(tmp_path, defaults=None, n=3):
    hyps = [{"id": f"h{i}", "baseline": {}, "treatment": {"flags": {"x": i}}, "metric": "tok_s",
             "expect": "increase", "min_effect": "5%"} for i in range(1, n + 1)]
    return write_spec(tmp_path / "h.yaml", engine=ENGINE, hypotheses=hyps, defaults=defaults)


def _executor(spec, tmp_path, led, slots: int = 1, **kw):
    order: list[str] = []  # each request's config, in order; every boot comes back ok

    def answer(r):
        order.append(r.config_key)
        return BootOutcome(boot_id=r.boot_id, status="ok")

    backend = MockBackend(answer, slots=slots, name="recording")
    ex = Executor(make_plan(spec), led, log_dir=tmp_path / "logs", calibrate=False, backend=backend, **kw)
    ex.start_run()
    ex.order = order
    ex.backend = backend
    return ex


def test_each_round_boots_every_config_once_in_a_seeded_random_order(tmp_path):
    spec = load_spec(_spec(tmp_path))
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        ex = _executor(spec, tmp_path, led, order_seed=1234)
        states = list(ex.states.values())
        assert len(states) == 4  # the shared baseline and three treatments
        ex.sched.boot_round(states, 8)
        rounds = [ex.order[i:i + 4] for i in range(0, len(ex.order), 4)]
        keys = sorted(s.planned.key for s in states)
        assert len(rounds) == 8 and all(sorted(r) == keys for r in rounds)
        assert len({tuple(r) for r in rounds}) > 1  # not one fixed order
        assert ex.order_seed == 1234
        again = _executor(spec, tmp_path, led, order_seed=1234)
        again.sched.boot_round(list(again.states.values()), 8)
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
    assert load_spec(_spec(tmp_path)).defaults.analysis == "robust"
    with pytest.raises(SpecError) as err:
        load_spec(_spec(tmp_path, defaults={"analysis": "blocked"}))
    msg = str(err.value)
    assert "defaults.analysis" in msg and "robust, paired, unpaired" in msg and "blocked" in msg


def test_a_round_runs_as_one_batch_when_the_backend_has_the_slots(tmp_path):
    """Two slots: each pass of a round is handed to the backend two boots at a time, and
    every config still gets exactly one boot per round."""
    spec = load_spec(_spec(tmp_path))
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        ex = _executor(spec, tmp_path, led, slots=2, order_seed=7)
        states = list(ex.states.values())
        ex.sched.boot_round(states, 3)
        assert [len(b) for b in ex.backend.batches] == [2, 2] * 3
        assert all(len(s.good_boots) == 3 for s in states)
        rounds = [ex.order[i:i + 4] for i in range(0, 12, 4)]
        assert all(len(set(r)) == 4 for r in rounds)


def scripted(scripts) -> MockBackend:
    """Each boot comes back as the next word of its config's script ("ok" or "fail"),
    an ok boot with one sample of tok_s; past the script, ok."""
    from bisect_harness.boot import SampleOutcome

    scripts = {k: list(v) for k, v in scripts.items()}

    def answer(r):
        script = scripts.get(r.label)
        word = script.pop(0) if script else "ok"
        if word == "fail":
            return failed("exited (scripted)")
        return [SampleOutcome(seq=1, metrics={"tok_s": 100.0}, requests=1, output_tokens=1, duration_s=0.1)]

    return MockBackend(answer, name="scripted")


def _scripted(tmp_path, led, script, retries=2):
    from bisect_harness.run.scheduler import Scheduler

    spec = load_spec(_spec(tmp_path, defaults={"boot_retries": retries, "host_preflight_s": 0}, n=1))
    plan = make_plan(spec)
    labels = [pc.label for pc in plan.configs]
    backend = scripted({labels[0]: script})
    sched = Scheduler(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=backend)
    sched.start_run()
    return sched, sched.state_for(plan.configs[0])


def test_measure_retries_a_failed_boot_before_it_counts(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        sched, st = _scripted(tmp_path, led, ["fail", "fail", "ok"])
        m, = sched.measure([st], 1, metric="tok_s")
        assert m.values == [100.0] and len(m.failed_ids) == 2 and m.unmeasurable is None
        assert st.failed is None


def test_measure_gives_up_on_a_config_whose_first_boots_all_fail(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        sched, st = _scripted(tmp_path, led, ["fail"] * 10)
        m, = sched.measure([st], 1, metric="tok_s")
        assert m.values == [] and len(m.failed_ids) == 3  # boot_retries 2: three tries
        assert m.unmeasurable and "3 boots in a row failed" in m.unmeasurable


def test_a_config_known_to_boot_survives_failures_in_a_row_and_the_budget_bounds_them(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'r.db'}") as led:
        sched, st = _scripted(tmp_path, led, ["ok"] + ["fail"] * 4 + ["ok"], retries=1)
        first, = sched.measure([st], 1, metric="tok_s")
        assert first.values == [100.0]
        short, = sched.measure([st], 1, metric="tok_s", budget=2)
        assert short.values == [] and short.unmeasurable is None and "budget" in short.short
        m, = sched.measure([st], 1, metric="tok_s")  # 4 in a row < 3 x (1 + 1): still measurable
        assert m.values == [100.0] and st.failed is None
