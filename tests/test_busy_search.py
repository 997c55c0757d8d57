"""A search on a host with a bursty neighbour counts each boot's quiet samples
(``defaults.search_samples: quiet``): a burst that covered a sample costs that sample,
a boot busy in every sample is booted again, and ``all`` counts every sample.

The boots are the mock backend's (``mock_boots.Planted``: the demo history's
regression), with a neighbour of the test's own: in a seeded share of the boots some
samples are slowed and carry a busy contention window, as the local backend records
one per sample. ``bench/bench_busy_bisect.py`` runs the same question on live demo
servers under a real bursty CPU burner.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3

import pytest

from bisect_harness.evidence import BootEvidence
from bisect_harness.backends.mock import MockBackend
from bisect_harness.boot import BootOutcome
from bisect_harness.evidence import BootEvidence
from bisect_harness.demo import create_demo_repo
from bisect_harness.observe import host_state
from bisect_harness.observe.contention import Thresholds
from mock_boots import Planted, harness_here

SPEC = """\
version: 1
engine:
  preset: demo
  repo: {repo}
  metrics:
    - {{name: decode_ms, from: log, pattern: 'decode cycle: (?P<value>[0-9.]+) ms/cyc', reduce: median,
       unit: ms, better: lower}}
benchmark: {{prompt_tokens: 16, output_tokens: 32, requests_per_sample: 1, warmup_requests: 1}}
defaults: {{samples_per_boot: 3, search_samples: {rule}, host_preflight_s: 0}}
hypotheses:
  - {{id: h, baseline: {{commit: HEAD}}, treatment: {{commit: HEAD}}, metric: decode_ms, expect: increase,
     min_effect: 5%}}
"""

QUIET = {"foreign_cpu_share": 0.01, "foreign_runnable_per_core": 0.0}
BUSY = {"foreign_cpu_share": 0.95, "foreign_runnable_per_core": 1.0}


class Bursty(Planted):
    """Planted boots, a neighbour's bursts on top: in 40% of the boots one or two samples
    are 1.6 times slower and their window busy; in 10% every sample is."""

    def __init__(self, *, busy_throughout: float = 0.1, **kw):
        super().__init__(**kw)
        self.backend = MockBackend(self, name="bursty")
        self.busy_throughout = busy_throughout  # the share of boots busy in every sample

    def __call__(self, r):
        samples = super().__call__(r)
        rng = random.Random(hashlib.sha256(f"burst:{len(self.booted)}".encode()).digest())
        u = rng.random()
        t = self.busy_throughout
        hit = set(range(len(samples))) if u < t else set(rng.sample(range(len(samples)), rng.choice((1, 2)))) \
            if u < t + 0.4 else set()
        out, windows = [], []
        for i, s in enumerate(samples):
            if i in hit:
                ms = s.metrics["decode_ms"] * 1.6
                s = type(s)(seq=s.seq, metrics={"decode_ms": ms, "tok_s": 1000.0 / ms}, requests=s.requests,
                            output_tokens=s.output_tokens, duration_s=s.duration_s * 1.6)
            out.append(s)
            windows.append(BUSY if i in hit else QUIET)
        crossed = [{"figure": "foreign_cpu_share", "value": 0.95, "limit": 0.25,
                    "message": "CPU used by other processes 95% > 25%"}] if hit else []
        record = {"window": {"seconds": 3.0, "cores": 2, "figures": BUSY if hit else QUIET, "sources": {}},
                  "samples": windows, "crossed": crossed, "thresholds": Thresholds().to_dict()}
        return BootOutcome(boot_id=r.boot_id, status="ok", samples=tuple(out), evidence=BootEvidence(contention=record),
                           marks=("host_busy",) if hit else ())


@pytest.fixture(scope="module")
def hist(tmp_path_factory):
    return create_demo_repo(tmp_path_factory.mktemp("busy-search") / "engine")


def _bisect(tmp_path, hist, rule: str, busy_throughout: float = 0.1):
    i_reg = hist.index(hist.events["regression"])
    good, bad = hist.shas[i_reg - 6], hist.shas[i_reg + 6]
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(repo=hist.path, rule=rule))
    bursty = Bursty(slow_from=hist.shas[i_reg:], factor=1.15, busy_throughout=busy_throughout)
    proc = harness_here("bisect", spec, "--good", good, "--bad", bad, "--json", "--metric", "decode_ms",
                        "--ledger", f"sqlite:///{tmp_path / 'r.db'}", "--journal-dir", tmp_path / "journal",
                        handler=bursty, cwd=tmp_path)
    db = sqlite3.connect(tmp_path / "r.db")
    try:
        probes = db.execute("select boot_ids, \"values\", note from bisect_probes where purpose != 'reused' "
                            "order by id").fetchall()
        boots = {i: (json.loads(prov), json.loads(marks)) for i, prov, marks in
                 db.execute("select id, provenance, marks from boots")}
        samples: dict[int, list[float]] = {}
        for boot_id, m in db.execute("select boot_id, metrics from samples order by boot_id, seq"):
            samples.setdefault(boot_id, []).append(json.loads(m)["decode_ms"])
    finally:
        db.close()
    return proc, json.loads(proc.stdout.strip().splitlines()[-1]), probes, boots, samples


def test_a_search_counts_the_quiet_samples_and_boots_a_boot_busy_throughout_again(hist, tmp_path):
    proc, out, probes, boots, samples = _bisect(tmp_path, hist, "quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["culprit"] == hist.events["regression"] and out["stopped"] == "confident", out
    seen_partial = seen_whole = False
    for boot_ids, values, note in probes:
        values = json.loads(values)
        quiet_means = []
        for b in json.loads(boot_ids):
            rec = boots[b][0]["contention"]
            mask = [w["foreign_cpu_share"] < 0.25 for w in rec["samples"]]
            kept = [x for x, q in zip(samples[b], mask) if q]
            seen_partial |= 0 < len(kept) < len(mask)
            seen_whole |= not kept
            if kept:
                quiet_means.append(sum(kept) / len(kept))
        # each boot's value is the mean of its quiet samples; a boot with none gave no value
        assert values == pytest.approx(quiet_means), (boot_ids, values, quiet_means)
        dropped = sum(len(samples[b]) - sum(w["foreign_cpu_share"] < 0.25 for w in boots[b][0]["contention"]["samples"])
                      for b in json.loads(boot_ids))
        assert (f"| {dropped} busy sample" in note) == (dropped > 0), note
    assert seen_partial and seen_whole  # the neighbour hit some samples of a boot, and whole boots


def test_all_counts_every_sample_of_a_busy_boot(hist, tmp_path):
    proc, out, probes, boots, samples = _bisect(tmp_path, hist, "all")
    assert proc.returncode in (0, 6), proc.stderr[-3000:]
    for boot_ids, values, note in probes:
        means = [sum(samples[b]) / len(samples[b]) for b in json.loads(boot_ids)]
        assert json.loads(values) == pytest.approx(means)
        assert "busy sample" not in note


def test_on_a_host_busy_all_the_time_a_boot_busy_throughout_counts_whole(hist, tmp_path):
    # Every boot busy in every sample: the bursts never pass. The first boots are booted again
    # (bursts usually pass); once 9 of the last 10 boots were busy throughout, such a boot counts
    # with all its samples, and the search names the culprit from them.
    proc, out, probes, boots, samples = _bisect(tmp_path, hist, "quiet", busy_throughout=1.0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["culprit"] == hist.events["regression"] and out["stopped"] == "confident", out
    said = [x for x in proc.stderr.splitlines() if "host busy all the time" in x]
    assert len(said) == 1 and "9 of the last 9 boots were busy in every sample" in said[0], said
    first = min(boots)
    assert f"from boot {first + 8} on" in said[0], "the ninth boot busy throughout makes the switch"
    seen_whole = False
    for boot_ids, values, note in probes:
        ids = json.loads(boot_ids)
        whole = [b for b in ids if b >= first + 8]  # the boots before it were left out and booted again
        assert json.loads(values) == pytest.approx([sum(samples[b]) / len(samples[b]) for b in whole]), note
        if whole:
            seen_whole = True
            assert (f"{', '.join(map(str, whole))} busy throughout, counted whole (host busy all the time)"
                    in note), note
    assert seen_whole


def test_bursts_that_pass_never_make_a_host_busy_all_the_time():
    from bisect_harness.run.busy_host import BusyHost

    host = BusyHost()
    for i in range(60):  # most boots busy throughout, but a quiet one every fifth: bursts pass
        assert host.observe(i, i % 5 != 0) is None
    assert not host.all_the_time
    for i in range(60, 70):
        host.observe(i, False)
    said = [host.observe(100 + i, True) for i in range(9)]
    assert said[:8] == [None] * 8 and said[8] and host.since == 108 and host.all_the_time
    assert host.observe(200, True) is None, "said once"
    with pytest.raises(ValueError, match="threshold must lie in 1..window"):
        BusyHost(window=3, threshold=4)


def test_quiet_samples_need_a_window_per_sample():
    class B:
        samples = [object(), object()]
        evidence = BootEvidence(contention={"window": {"cores": 2}, "samples": [QUIET, BUSY],
                                            "thresholds": Thresholds().to_dict()})

    assert host_state.quiet_samples(B) == (True, False)
    B.samples = [object()] * 3  # windows that do not line up with the samples: not judged per sample
    assert host_state.quiet_samples(B) is None
    B.evidence = BootEvidence()
    assert host_state.quiet_samples(B) is None



def test_a_search_samples_value_the_harness_does_not_know_names_the_key(tmp_path):
    from bisect_harness.errors import SpecError
    from bisect_harness.spec import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(repo=tmp_path, rule="quietest"))
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    assert "defaults.search_samples" in str(err.value) and "quiet, all" in str(err.value)
