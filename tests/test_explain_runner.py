"""The explain driver's pure parts: arm names, the differences of two arms, and the
configuration of a subset of them."""

from __future__ import annotations

import textwrap

import pytest

from bisect_harness.backends.mock import MockBackend, failed
from bisect_harness.boot import SampleOutcome
from bisect_harness.errors import UserError
from bisect_harness.spec import parse_spec
from bisect_harness.model import Arm
from bisect_harness.run.explain_runner import arm_with, differences, parse_arm

FAST = Arm(commit="a" * 40, env={"NCCL_NVLS_ENABLE": "0", "X": "1"}, flags={"tp": 8, "mode": "prefill"})
SLOW = Arm(commit="b" * 40, env={"NCCL_NVLS_ENABLE": "0", "NCCL_PROTO": "LL"},
           flags={"tp": 8, "mode": "decode", "speculative-algorithm": "EAGLE3"})


def test_differences_are_env_flags_then_the_commit():
    d = differences(FAST, SLOW)
    assert [(x.name, x.fast, x.slow) for x in d] == [
        ("env:NCCL_PROTO", None, "LL"), ("env:X", "1", None), ("flag:mode", "prefill", "decode"),
        ("flag:speculative-algorithm", None, "EAGLE3"), ("commit", "a" * 40, "b" * 40)]
    assert differences(FAST, FAST) == []


def test_arm_with_a_subset():
    d = differences(FAST, SLOW)
    assert arm_with(FAST, SLOW, d, frozenset()).key() == FAST.key()
    assert arm_with(FAST, SLOW, d, frozenset(x.name for x in d)).key() == SLOW.key()
    a = arm_with(FAST, SLOW, d, frozenset({"env:X", "flag:mode"}))
    assert a.commit == FAST.commit and dict(a.env) == {"NCCL_NVLS_ENABLE": "0"}
    assert dict(a.flags) == {"tp": 8, "mode": "decode"}
    assert arm_with(FAST, SLOW, d, frozenset({"commit"})).commit == SLOW.commit


def test_parse_arm(tmp_path):
    spec = parse_spec(textwrap.dedent("""\
        version: 1
        engine: {preset: demo}
        hypotheses:
          - {id: h1, baseline: {commit: HEAD}, treatment: {commit: HEAD}, metric: tok_s, expect: decrease,
             min_effect: 5%}
        """), tmp_path / "hypotheses.yaml")
    assert parse_arm("h1.baseline", spec, option="--fast") == ("h1", "baseline")
    with pytest.raises(UserError, match="HID.baseline or HID.treatment"):
        parse_arm("h1.base", spec, option="--fast")
    with pytest.raises(UserError, match="no hypothesis 'h2'.*known: h1"):
        parse_arm("h2.treatment", spec, option="--slow")


class Faulty:
    """The mock backend's handler (``self.backend``): boots nothing. A config's tok/s is
    100, 80 with A=1 (seeded 1% noise); every fourth boot fails (a transient failure,
    retried); the slow config without A is refused (a recipe failure: never retried)."""

    def __init__(self):
        import numpy as np

        self.rng, self.booted, self.refused = np.random.default_rng(0), 0, 0
        self.backend = MockBackend(self, name="faulty")

    def __call__(self, r):
        self.booted += 1
        env = dict(r.arm_env)
        if env.get("B") == "1" and env.get("C") == "1" and "A" not in env:
            self.refused += 1
            return failed("refused (scripted)", config_status="boot_failed")
        if self.booted % 4 == 0:
            return failed("exited (scripted)")
        mu = 80.0 if env.get("A") == "1" else 100.0
        return tuple(SampleOutcome(seq=k + 1, metrics={"tok_s": float(mu * (1 + 0.01 * self.rng.standard_normal()))},
                                   requests=1, output_tokens=1, duration_s=0.1) for k in range(3))


def test_a_config_that_cannot_be_measured_is_stepped_over_not_the_end_of_the_search(tmp_path):
    from bisect_harness.spec import load_spec
    from bisect_harness.run.bisect_runner import MeasureSetup
    from bisect_harness.run.explain_runner import ExplainOptions, explain_file
    from bisect_harness.record.ledger import Ledger

    path = tmp_path / "h.yaml"
    path.write_text(textwrap.dedent("""\
        version: 1
        engine: {preset: openai, launch: [my-server, --port, "{port}"]}
        defaults: {host_preflight_s: 0, samples_per_boot: 3}
        hypotheses:
          - {id: h, baseline: {}, treatment: {env: {A: "1", B: "1", C: "1"}}, metric: tok_s,
             expect: decrease, min_effect: 5%}
        """))
    faulty = Faulty()
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as led:
        out, sched = explain_file(load_spec(path), led, "h.baseline", "h.treatment", ExplainOptions(alpha=0.01),
                                  MeasureSetup(tmp_path / "logs", backend=faulty.backend, order_seed=1))
        rec = out.record
        assert rec["stopped"] == "config-unmeasurable" and rec["undecided"] == ["env:A"]
        assert rec["members"] == [] and not rec["confident"]
        assert [u["config"] for u in rec["unmeasurable"]] == [["env:B", "env:C"]]
        assert "refused (scripted)" in rec["unmeasurable"][0]["reason"]
        assert faulty.refused == 1  # a recipe failure is never booted again
        assert sched.run.status == "done" and sched.run.summary["explain"][0]["stopped"] == "config-unmeasurable"
        t = next(t for t in rec["tests"] if t["treatment"] == ["env:B", "env:C"])
        assert t["outcome"] == "inconclusive" and "refused (scripted)" in t["reason"]
        from bisect_harness.report.explain_view import views

        notes = views(sched.run.summary)[0]["notes"]
        assert any(n.startswith("stepped over: slow without `env:A` could not be measured (") for n in notes)
        assert any(n.startswith("stopped: `config-unmeasurable`: a configuration") for n in notes)
