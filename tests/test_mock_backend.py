"""The mock backend (``backends.mock``) and the seam it stands at.

A handler's answer becomes a boot as the scheduler sees it; each sample reaches a
real SQLite ledger the moment it is handed back, before its boot ends; an
exception on the caller's side goes back into the boots where the event came out;
and the mock is a backend kind like the others, made from a file's ``backend:``
section, which is what adding a backend takes.
"""

from __future__ import annotations

import pytest
import yaml

from bisect_harness.backends import BACKENDS, make_backend
from bisect_harness.backends.mock import MockBackend, failed
from bisect_harness.boot import BootOutcome, Finished, SampleOutcome, Sampled, Sink, deliver
from bisect_harness.errors import SpecError, UserError
from bisect_harness.kinds import Registry
from bisect_harness.plan.build import make_plan
from bisect_harness.record.ledger import Ledger
from bisect_harness.run.scheduler import Scheduler
from bisect_harness.spec import load_spec
from helpers import query

ENGINE = {"preset": "openai", "launch": ["my-server", "--port", "{port}"]}
HYPOTHESES = [{"id": "h", "baseline": {}, "treatment": {"flags": {"x": 1}}, "metric": "tok_s",
               "expect": "increase", "min_effect": "5%"}]


def _plan(tmp_path, backend=None):
    doc = {"version": 1, "engine": ENGINE, "defaults": {"host_preflight_s": 0}, "hypotheses": HYPOTHESES,
           **({"backend": backend} if backend is not None else {})}
    (tmp_path / "h.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return make_plan(load_spec(tmp_path / "h.yaml"))


def _requests(tmp_path, n=1):
    plan = _plan(tmp_path)
    return [plan.boot_request(plan.configs[i % len(plan.configs)], boot_id=10 + i, seq=1,
                              log_path=tmp_path / f"boot-{i}.log") for i in range(n)]


class _Collect(Sink):
    def __init__(self, raise_on_sample: BaseException | None = None):
        self.events: list[tuple] = []
        self.samples: dict[int, list] = {}
        self.raise_on_sample = raise_on_sample

    def sample(self, request, sample):
        self.events.append(("sample", request.boot_id, sample.seq, dict(sample.metrics)))
        self.samples.setdefault(request.boot_id, []).append(sample)
        if self.raise_on_sample is not None:
            raise self.raise_on_sample

    def finished(self, request, outcome):
        self.events.append(("finished", request.boot_id, outcome))


def test_each_answer_becomes_a_boot_its_samples_handed_back_before_its_outcome(tmp_path):
    reqs = _requests(tmp_path, 4)
    answers = iter([
        [100.0, {"tok_s": 101.0, "ttft_ms": 9.0}],                       # values: an ok boot
        BootOutcome(boot_id=0, status="ok", marks=("host_busy",),       # an outcome: its boot_id is the request's
                    samples=(SampleOutcome(metrics={"tok_s": 5.0}, requests=2, output_tokens=3, duration_s=1.0),)),
        failed("the server exited 1"),                                   # a failed boot, retried
        failed("flag refused", config_status="boot_failed"),             # the config's own failure
    ])
    backend = MockBackend(lambda r: next(answers), slots=2)
    sink = _Collect()
    backend.run(reqs[:2], sink)
    backend.run(reqs[2:], sink)
    assert [e[:3] if e[0] == "sample" else e[:2] for e in sink.events] == [
        ("sample", 10, 1), ("sample", 10, 2), ("finished", 10), ("sample", 11, 1), ("finished", 11), ("finished", 12),
        ("finished", 13)]
    assert sink.events[1][3] == {"tok_s": 101.0, "ttft_ms": 9.0}
    first, second, third, fourth = (e[2] for e in sink.events if e[0] == "finished")
    # the samples travel once, as sample events; the outcome after them carries none
    assert [e[3]["tok_s"] for e in sink.events if e[:2] == ("sample", 10)] == [100.0, 101.0]
    assert first.ok and first.samples == () and second.samples == ()
    assert second.boot_id == 11 and second.marks == ("host_busy",)
    assert sink.samples[11][0].seq == 1 and sink.samples[11][0].requests == 2
    assert third.status == "failed" and third.config_failure is None
    assert fourth.config_failure == "flag refused" and fourth.config_status == "boot_failed"
    assert backend.requests == reqs and [len(b) for b in backend.batches] == [2, 2]


def test_each_sample_is_in_the_ledger_before_its_boot_ends_and_an_interrupt_mid_boot_keeps_it(tmp_path):
    db = tmp_path / "r.db"
    seen: list = []

    def answer(r):  # a generator: one sample, then the run is stopped mid-boot
        yield 42.0
        seen.append(query(db, "SELECT seq, json_extract(metrics, '$.tok_s') FROM samples"))
        raise KeyboardInterrupt

    plan = _plan(tmp_path)
    with Ledger(f"sqlite:///{db}") as led:
        sched = Scheduler(plan, led, log_dir=tmp_path / "logs", calibrate=False, backend=MockBackend(answer))
        with pytest.raises(KeyboardInterrupt), sched.recording("run"):
            sched.boot(sched.state_for(plan.configs[0]))
    assert seen == [[(1, 42.0)]]  # committed while the boot was still running, seen from another connection
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]
    assert query(db, "SELECT b.status, COUNT(s.id) FROM boots b JOIN samples s ON s.boot_id = b.id") == \
        [("interrupted", 1)]


def test_an_exception_of_the_caller_goes_back_into_the_boot_where_its_event_came_out(tmp_path):
    (req,) = _requests(tmp_path)
    heard: list[str] = []

    def boot():
        try:
            yield Sampled(req, SampleOutcome(metrics={"tok_s": 1.0}, requests=1, output_tokens=1, duration_s=0.1))
        except KeyboardInterrupt:
            heard.append("interrupted at its sample")
            yield Finished(req, BootOutcome(boot_id=req.boot_id, status="interrupted"))
            raise
        heard.append("went on")  # never: the interrupt reached the boot

    sink = _Collect(raise_on_sample=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        deliver(boot(), sink)
    assert heard == ["interrupted at its sample"]
    assert [e[0] for e in sink.events] == ["sample", "finished"] and sink.events[1][2].status == "interrupted"


def answer_200(request):
    """A handler named in a file's backend section (``handler: test_mock_backend:answer_200``)."""
    return [200.0]


def test_the_mock_is_a_backend_kind_made_from_the_files_section(tmp_path):
    assert {"local", "slurm", "mock"} <= set(BACKENDS)
    plan = _plan(tmp_path, backend={"kind": "mock", "slots": 2, "handler": "test_mock_backend:answer_200"})
    backend = make_backend(plan.spec, log_dir=tmp_path / "logs")
    assert isinstance(backend, MockBackend) and backend.slots == 2 and backend.name == "mock"
    (req,) = _requests(tmp_path)
    sink = _Collect()
    backend.run([req], sink)
    assert sink.samples[req.boot_id][0].metrics == {"tok_s": 200.0} and sink.events[-1][0] == "finished"
    with pytest.raises(SpecError, match=r"backend\.partition"):
        _plan(tmp_path, backend={"kind": "mock", "partition": "gpu"})
    with pytest.raises(SpecError, match=r"backend\.handler"):
        _plan(tmp_path, backend={"kind": "mock", "handler": "no-colon"})
    with pytest.raises(UserError, match="set backend.handler"):
        make_backend(_plan(tmp_path, backend={"kind": "mock"}).spec, log_dir=tmp_path / "logs")
    with pytest.raises(UserError, match="test_mock_backend:nothing"):
        make_backend(_plan(tmp_path, backend={"kind": "mock", "handler": "test_mock_backend:nothing"}).spec,
                     log_dir=tmp_path / "logs")
    with pytest.raises(SpecError, match=r"backend\.kind.*one of local, mock, slurm"):
        _plan(tmp_path, backend={"kind": "kubernetes"})


def test_a_backend_lent_as_a_kind_is_what_the_command_line_names(tmp_path):
    lent = MockBackend(answer_200, name="lent-for-a-test")
    BACKENDS.add(lent.as_kind())
    try:
        assert make_backend(_plan(tmp_path).spec, kind="lent-for-a-test", log_dir=tmp_path / "logs") is lent
        assert "lent-for-a-test" in BACKENDS.in_words()
    finally:
        BACKENDS.discard("lent-for-a-test")
    with pytest.raises(UserError, match="--backend 'lent-for-a-test'"):
        make_backend(_plan(tmp_path).spec, kind="lent-for-a-test", log_dir=tmp_path / "logs")


def test_a_registry_loads_its_kinds_once_before_it_is_first_read():
    loads: list[int] = []
    kinds: Registry = Registry("thing", name_of=str, load=lambda: (loads.append(1), kinds.add("c"), kinds.add("a")))
    kinds.add("b")  # adding does not load
    assert loads == []
    assert kinds.names() == ("a", "b", "c") and "c" in kinds and loads == [1]  # in name order, whoever came first
    assert kinds.in_words() == "a, b or c" and kinds.in_words(str.upper) == "A, B or C" and loads == [1]
    assert Registry("one", name_of=str, load=lambda: None).in_words() == ""


def test_an_exception_of_the_caller_goes_on_even_where_the_boot_takes_it_for_its_own_failure(tmp_path):
    (req,) = _requests(tmp_path)

    def boot():  # takes what was thrown in for a failure of its own and ends without raising
        try:
            yield Sampled(req, SampleOutcome(metrics={"tok_s": 1.0}, requests=1, output_tokens=1, duration_s=0.1))
        except RuntimeError:
            yield Finished(req, BootOutcome(boot_id=req.boot_id, status="failed", failure="benchmark failed"))

    sink = _Collect(raise_on_sample=RuntimeError("the ledger refused the sample"))
    with pytest.raises(RuntimeError, match="the ledger refused the sample"):
        deliver(boot(), sink)
    assert [e[0] for e in sink.events] == ["sample", "finished"] and sink.events[1][2].status == "failed"
