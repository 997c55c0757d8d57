"""Backends: a boot request in, a boot outcome out, on this host or on a cluster node.

A backend runs a batch of boot requests (one round's boots) and hands back what
happens as events (``boot.Started``, ``boot.Sampled``, ``boot.Finished``,
``boot.Message``), in order, on the caller's thread: each sample once, as a
``Sampled`` event before its boot's ``Finished`` (a boot that comes back whole, a
Slurm job's, through ``boot.handed_back``); the caller records each as it comes::

    for event in backend.events(requests):   # ends when every request has its Finished
        ...
    backend.run(requests, sink)                # the same, handed to a boot.Sink
    backend.slots                              # how many boots it runs at once

An interrupt (Ctrl-C, SIGTERM), on the caller's side too (thrown into the events
where one was handed over, as ``boot.deliver`` does), stops the boots in flight
(their servers, their jobs) and propagates after each of them has handed back an
``interrupted`` outcome.

Each sort of backend is a :class:`BackendKind` in :data:`BACKENDS`, added by the
module that defines it (``local``, ``slurm``, ``mock``): a new backend is one new
module in this package, found when the registry is first read. ``backend.kind``
in the file and ``--backend`` name a kind; :func:`make_backend` makes it.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from bisect_harness.boot import BootRequest, Event, Sink, deliver
from bisect_harness.errors import UserError
from bisect_harness.kinds import Registry

__all__ = ["Backend", "BackendKind", "BACKENDS", "make_backend", "check_options"]


class Backend(Protocol):
    name: str
    slots: int

    def events(self, requests: Sequence[BootRequest]) -> Iterator[Event]:
        """Boot ``requests``, handing back each boot's events as they happen (a generator)."""
        ...

    def run(self, requests: Sequence[BootRequest], sink: Sink) -> None:
        """Boot ``requests``, each event handed to ``sink`` as it comes."""
        deliver(self.events(requests), sink)

    def close(self) -> None:
        """Let go of what the backend holds (jobs still in flight)."""


@dataclass(frozen=True)
class BackendKind:
    """One sort of backend, named by ``backend.kind`` and ``--backend``.

    ``summary`` says where its boots run (the ``--backend`` help); ``check(options,
    where)`` raises SpecError naming the key when the ``backend:`` section's own keys
    (all but kind and slots) do not fit it; ``make(options, slots=, log_dir=)`` makes
    the backend, ``log_dir`` being the folder of the run's logs."""

    name: str
    summary: str
    check: Callable[[Mapping[str, Any], str], None]
    make: Callable[..., Backend]


#: Modules of this package that add no kind: the boot procedure and its checks (the kinds
#: import them when they boot, so that reading the names stays cheap).
_NOT_KINDS = ("procedure", "checks")


def _import_kinds() -> None:
    """Import each module of this package but :data:`_NOT_KINDS`: each adds its kind."""
    for module in pkgutil.iter_modules(__path__):
        if module.name not in _NOT_KINDS:
            importlib.import_module(f"{__name__}.{module.name}")


#: Every backend kind, by name; each module of this package adds its own.
BACKENDS: Registry[BackendKind] = Registry("backend", load=_import_kinds)


def check_options(kind: str, options: Mapping[str, Any], *, where: str = "backend") -> None:
    """Raise SpecError naming the key when ``options`` do not fit backend ``kind``."""
    BACKENDS[kind].check(options, where)


def make_backend(spec, *, kind: str | None = None, slots: int | None = None, log_dir: Path) -> Backend:
    """The backend a run boots through. Command-line values win over the file's."""
    kind = kind or spec.backend.kind
    if kind not in BACKENDS:
        raise UserError(f"--backend {kind!r}: one of {', '.join(BACKENDS)}")
    slots = slots if slots is not None else spec.backend.slots
    if slots < 1:
        raise UserError(f"--slots {slots}: at least 1")
    options = spec.backend.options_dict() if spec.backend.kind == kind else {}
    return BACKENDS[kind].make(options, slots=slots, log_dir=Path(log_dir))
