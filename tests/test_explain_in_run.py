"""``explain: true`` inside ``harness run``, with the commit as the difference.

The slow arm is the commit after the demo's regression commit; the fast arm is the
commit before the regression. The run must confirm the hypothesis, explain it in the
same run, name the commit, and hand the commit range to the bisection, which must
name the regression commit. The hand-offs (the run's rounds to the explanation, the
commit to the bisection) are the point here, so the real ``harness run`` runs in this
process with its boots answered by the mock backend (``mock_boots.Planted``: the demo
history's 1.9x regression, 3% noise). On real servers: the explanation's search, an
interacting pair, is ``test_explain_e2e``'s on the demo engine; ``explain: true`` inside
a run is ``test_llamacpp_real``'s on llama.cpp; a bisection is ``test_bisect_cli``'s.
(The search's logic, an inert difference beside a cause included, is ``test_explain.py``'s,
on a fake measure.)
"""

from __future__ import annotations

import json

import pytest

from bisect_harness.demo import create_demo_repo
from helpers import last_json, query, write_spec
from mock_boots import Planted, harness_here

# The engine's own decode time per cycle (median per sample): the regression shows in it,
# and it is steadier than the client's tok/s.
DECODE_MS = {"name": "decode_ms", "from": "log", "pattern": r"decode cycle: (?P<value>[0-9.]+) ms/cyc",
             "reduce": "median", "unit": "ms", "better": "lower"}


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain-run")
    hist = create_demo_repo(root / "engine")
    i_reg = hist.index(hist.events["regression"])
    fast, slow = hist.shas[i_reg - 1], hist.shas[i_reg + 1]
    spec = write_spec(
        root / "hypotheses.yaml", engine={"preset": "demo", "repo": str(hist.path), "metrics": [DECODE_MS]},
        benchmark={"prompt_tokens": 16, "output_tokens": 32, "requests_per_sample": 1, "warmup_requests": 1},
        # A budget past 8 boots a side gives the robust rule its sign-flip looks: on CI's busy host a
        # 6-boot budget once left the slowdown undecided at alpha 0.01 (all six rounds slower, 1.19x to
        # 3.5x, the one burst-hit round widening the paired t's interval to 0.76x..3.72x). The t looks
        # (3 to 5 boots a side) still come first, so a clear slowdown stops there.
        defaults={"samples_per_boot": 1, "boots_per_arm": 3, "max_boots_per_arm": 12},
        hypotheses=[{"id": "tuned", "statement": "The tuned build decodes at least 10% slower; explain it.",
                     "baseline": {"commit": fast},
                     "treatment": {"commit": slow},
                     "metric": "decode_ms", "expect": "increase", "min_effect": "10%", "explain": True}])
    db = root / "r.db"
    proc = harness_here("run", spec, "--ledger", f"sqlite:///{db}", "--journal-dir", root / "exp", "--json",
                        handler=Planted(slow_from=hist.shas[i_reg:]), cwd=root)
    return {"proc": proc, "db": db, "hist": hist, "root": root}


def test_the_commit_is_named_and_bisected(ran):
    proc = ran["proc"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = last_json(proc.stdout)
    (summary,), = query(ran["db"], "SELECT summary FROM runs WHERE id = ?", (out["run_id"],))
    record, = json.loads(summary)["explain"]
    assert record["slowdown"]["outcome"] == "confirmed"
    assert [d["name"] for d in record["differences"]] == ["commit"]
    assert record["members"] == ["commit"], record["members"]
    assert record["interactions"] == [] and record["stopped"] == "explained"
    bis = record["bisection"]
    assert bis["culprit"] == ran["hist"].events["regression"], bis
    (status, result), = query(ran["db"], "SELECT status, result FROM bisections WHERE id = ?", (bis["id"],))
    assert json.loads(result)["culprit"] == ran["hist"].events["regression"], status
    # --json says it too: the explanation, with its own bisection (no bisect: true search of its own)
    (h,) = out["hypotheses"]
    assert h["explanation"]["members"] == ["commit"] and h["explanation"]["stopped"] == "explained"
    assert h["explanation"]["bisection"]["culprit"] == ran["hist"].events["regression"]
    assert "bisection" not in h
    # The run's rounds open the explanation's slowdown test: it does not boot again what the
    # run has just shown (each pair is one round of the verdict: baseline, then treatment).
    (b_ids, t_ids), = query(ran["db"], "SELECT baseline_boot_ids, treatment_boot_ids FROM verdicts WHERE final = 1")
    given = record["run_rounds"]
    assert given == [list(p) for p in zip(json.loads(b_ids), json.loads(t_ids))]
    first = record["tests"][0]
    assert first["purpose"] == "slowdown"
    assert first["baseline_boot_ids"][:len(given)] == [f for f, _ in given]
    assert first["treatment_boot_ids"][:len(given)] == [sl for _, sl in given]


def test_the_journal_shows_the_explanation_and_the_bisection(ran):
    assert ran["proc"].returncode == 0, ran["proc"].stderr[-4000:]
    text = "\n".join(p.read_text() for p in (ran["root"] / "exp").rglob("*.md"))
    assert "## Explanation: tuned.baseline (fast) vs tuned.treatment (slow)" in text
    assert "the commit is a member: bisection" in text
    assert "the slowdown test began with the run's " in text
    assert ran["hist"].events["regression"][:12] in text
