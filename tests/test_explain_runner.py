"""The explain driver's pure parts: arm names, the differences of two arms, and the
configuration of a subset of them."""

from __future__ import annotations

import textwrap

import pytest

from bisect_harness.errors import UserError
from bisect_harness.input.spec import parse_spec
from bisect_harness.model import Arm
from bisect_harness.orchestrate.explain_runner import arm_with, differences, parse_arm

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
