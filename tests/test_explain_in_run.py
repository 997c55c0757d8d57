"""``explain: true`` inside ``harness run``, with the commit among the causes.

The slow arm is three commits past the demo's regression commit and sets the demo's
planted interaction (``--attention-mode decode`` with ``NCCL_PROTO=Simple``) and an
inert collective variable; the fast arm is the commit before the regression, plain.
So four differences, three of them causes: the commit range (the regression), and the
interacting pair. The run must confirm the hypothesis, explain it in the same run,
name exactly those three with the pair as an interaction, and hand the commit range
to the bisection, which must name the regression commit.
"""

from __future__ import annotations

import json

import pytest

from bisect_harness.demo import create_demo_repo
from helpers import harness, last_json, query, write_spec

pytestmark = pytest.mark.slow

# The engine's own decode time per cycle (median per sample): the regression and the
# doubled decode steps both show in it, and it is steadier than the client's tok/s.
DECODE_MS = {"name": "decode_ms", "from": "log", "pattern": r"decode cycle: (?P<value>[0-9.]+) ms/cyc",
             "reduce": "median", "unit": "ms", "better": "lower"}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain-run")
    hist = create_demo_repo(root / "engine")
    i_reg = hist.index(hist.events["regression"])
    fast, slow = hist.shas[i_reg - 1], hist.shas[i_reg + 3]
    spec = write_spec(
        root / "hypotheses.yaml", engine={"preset": "demo", "repo": str(hist.path), "metrics": [DECODE_MS]},
        benchmark={"prompt_tokens": 16, "output_tokens": 32, "requests_per_sample": 2, "warmup_requests": 1},
        defaults={"samples_per_boot": 1, "boots_per_arm": 3, "max_boots_per_arm": 6},
        hypotheses=[{"id": "tuned", "statement": "The tuned build decodes at least 10% slower; explain it.",
                     "baseline": {"commit": fast},
                     "treatment": {"commit": slow, "env": {"NCCL_PROTO": "Simple", "NCCL_DEBUG": "WARN"},
                                   "flags": {"attention-mode": "decode"}},
                     "metric": "decode_ms", "expect": "increase", "min_effect": "10%", "explain": True}])
    db = root / "r.db"
    proc = harness("run", spec, "--ledger", f"sqlite:///{db}", "--journal-dir", root / "exp", "--json",
                   cwd=root, timeout=1500)
    return {"proc": proc, "db": db, "hist": hist, "root": root}


def test_the_commit_and_the_pair_are_named_and_the_commit_is_bisected(ran):
    proc = ran["proc"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json(proc.stdout)
    (summary,), = query(ran["db"], "SELECT summary FROM runs WHERE id = ?", (out["run_id"],))
    record, = json.loads(summary)["explain"]
    assert record["slowdown"]["outcome"] == "confirmed"
    assert set(record["members"]) == {"commit", "env:NCCL_PROTO", "flag:attention-mode"}, record["members"]
    # Each member of the pair alone is never claimed slower; when both alone tests
    # decided (refuted), the pair is the interaction. (On a loaded host they can run out
    # of budget undecided: then no interaction is claimed, and none may be.)
    alone = {t["treatment"][0]: t["outcome"] for t in record["tests"] if t["purpose"] == "alone vs fast"}
    assert alone["env:NCCL_PROTO"] != "confirmed" and alone["flag:attention-mode"] != "confirmed", alone
    assert alone["commit"] == "confirmed", alone
    pair = {"env:NCCL_PROTO", "flag:attention-mode"}
    if alone["env:NCCL_PROTO"] == alone["flag:attention-mode"] == "refuted":
        assert [set(p) for p in record["interactions"]] == [pair]
    else:
        assert record["interactions"] == []
    # The inert variable is never claimed either way (on a loaded host its test may end
    # undecided: that claims nothing).
    assert "env:NCCL_DEBUG" not in record["members"] + record["opposite"]
    bis = record["bisection"]
    assert bis["culprit"] == ran["hist"].events["regression"], bis
    (status, result), = query(ran["db"], "SELECT status, result FROM bisections WHERE id = ?", (bis["id"],))
    assert json.loads(result)["culprit"] == ran["hist"].events["regression"], status


def test_the_journal_shows_the_explanation_and_the_bisection(ran):
    assert ran["proc"].returncode == 0, ran["proc"].stderr[-4000:]
    text = "\n".join(p.read_text() for p in (ran["root"] / "exp").rglob("*.md"))
    assert "## Explanation: tuned.baseline (fast) vs tuned.treatment (slow)" in text
    assert "the commit is a member: bisection" in text
    assert ran["hist"].events["regression"][:12] in text
