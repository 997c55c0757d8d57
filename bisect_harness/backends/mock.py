"""A backend whose boots are answered by a function: the seam's one stand-in.

Shaped like httpx's ``MockTransport(handler)``: :class:`MockBackend` boots
nothing; each boot request goes to ``handler(request)``, and what the handler
returns is what the boot gave::

    def answer(request):
        if request.commit == bad:
            return failed("the server exited 1")                  # a failed boot, retried
        return [100.0, 101.0]                                       # an ok boot: its samples of tok_s

    backend = MockBackend(answer)                                   # slots=2: batches of two
    Executor(plan, ledger, log_dir=..., backend=backend).execute()

The handler may return

* a :class:`~bisect_harness.boot.BootOutcome` (its ``boot_id`` is the request's
  whatever it says; :func:`failed` makes a failed one), or
* the boot's samples, an ok boot: numbers (the mock's ``metric``), mappings of
  metrics, or :class:`~bisect_harness.boot.SampleOutcome` values. A generator
  hands each sample back the moment it yields it and may raise where a boot
  would (an interrupt after one sample: yield it, then raise).

Each sample is handed back as it is made (an outcome's samples, before it), then
the outcome without them, as the local backend does; an exception the handler raises propagates. ``requests`` and
``batches`` keep what was asked, in order.

Adding a backend is this much: a module in ``backends/`` that adds its
:class:`~bisect_harness.backends.BackendKind` to ``BACKENDS``. This one is
``kind: mock`` in a file's ``backend:`` section, or ``--backend mock``, with
``handler: module:function`` naming the handler. A test that runs the command
line lends it a backend of its own under a name of its own
(:meth:`MockBackend.as_kind`).
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from bisect_harness.backends import BACKENDS, Backend, BackendKind
from bisect_harness.boot import BootOutcome, BootRequest, Event, Finished, SampleOutcome, Sampled, handed_back
from bisect_harness.evidence import BootStatus
from bisect_harness.errors import SpecError, UserError

__all__ = ["MockBackend", "failed"]


def failed(why: str, *, config_status: str | None = None, **fields: Any) -> BootOutcome:
    """A failed boot saying ``why``. With ``config_status`` (``build_failed`` or
    ``boot_failed``) the config itself cannot be measured at this commit (a broken
    build, a refused flag): never retried."""
    return BootOutcome(boot_id=0, status=BootStatus.FAILED, failure=why, config_failure=why if config_status else None,
                       config_status=config_status, **fields)


class MockBackend(Backend):
    """Boots answered by ``handler(request)`` (see the module doc), ``slots`` at a time."""

    def __init__(self, handler: Callable[[BootRequest], Any], *, slots: int = 1, name: str = "mock",
                 metric: str = "tok_s"):
        self.handler, self.slots, self.name, self.metric = handler, slots, name, metric
        self.requests: list[BootRequest] = []
        self.batches: list[tuple[BootRequest, ...]] = []

    def events(self, requests: Sequence[BootRequest]) -> Iterator[Event]:
        self.batches.append(tuple(requests))
        for r in requests:
            self.requests.append(r)
            answer = self.handler(r)
            if isinstance(answer, BootOutcome):
                samples = tuple(self._sample(s, k) for k, s in enumerate(answer.samples))
                yield from handed_back(r, dataclasses.replace(answer, boot_id=r.boot_id, samples=samples))
                continue
            for k, s in enumerate(answer):
                yield Sampled(r, self._sample(s, k))
            yield Finished(r, BootOutcome(boot_id=r.boot_id, status=BootStatus.OK))

    def _sample(self, value: Any, k: int) -> SampleOutcome:
        """Sample ``k`` (from 0) of a boot as the ledger takes it: numbered from 1 where it is not."""
        if isinstance(value, SampleOutcome):
            return value if value.seq else dataclasses.replace(value, seq=k + 1)
        metrics = dict(value) if isinstance(value, Mapping) else {self.metric: float(value)}
        return SampleOutcome(metrics=metrics, requests=1, output_tokens=1, duration_s=0.1, seq=k + 1)

    def close(self) -> None:
        pass

    def as_kind(self) -> BackendKind:
        """This backend as a kind named ``self.name`` that makes itself, for a test that runs
        the command line: ``BACKENDS.add(backend.as_kind())``, then ``--backend NAME``."""
        return BackendKind(name=self.name, summary="a test's mock", check=_check_handler_only,
                           make=lambda options, *, slots, log_dir: self)


def _check_handler_only(options: Mapping[str, Any], where: str) -> None:
    for key in sorted(set(options) - {"handler"}):
        raise SpecError(f"the mock backend takes only kind, slots and handler; {key!r} belongs to another backend",
                        key=f"{where}.{key}")
    handler = options.get("handler")
    if handler is not None and (not isinstance(handler, str) or handler.count(":") != 1):
        raise SpecError(f"must name the handler as module:function, got {handler!r}", key=f"{where}.handler")


def _make(options: Mapping[str, Any], *, slots: int, log_dir: Path) -> MockBackend:
    where = options.get("handler")
    if where is None:
        raise UserError("the mock backend answers each boot with a handler: set backend.handler to "
                        "module:function (a function of the boot request) in the file's backend: section")
    module, _, name = where.partition(":")
    try:
        handler = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"backend.handler {where!r}: {exc}; name a function importable from here "
                        "(module:function)") from None
    return MockBackend(handler, slots=slots)


BACKENDS.add(BackendKind(name="mock", summary="boots answered by a function; backend.handler names it",
                         check=_check_handler_only, make=_make))
