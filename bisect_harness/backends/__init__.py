"""Backends: a boot request in, a boot outcome out, on this host or on a cluster node.

A backend runs a batch of boot requests (one round's boots) and reports to a
:class:`~bisect_harness.boot.Sink` on the caller's thread::

    backend.run(requests, sink)   # returns when every request has an outcome
    backend.slots                 # how many boots it runs at once

An interrupt (Ctrl-C, SIGTERM) stops the boots in flight (their servers, their
jobs) and propagates after each of them has reported an ``interrupted`` outcome.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from bisect_harness.boot import BootRequest, Sink

__all__ = ["Backend"]


class Backend(Protocol):
    name: str
    slots: int

    def run(self, requests: Sequence[BootRequest], sink: Sink) -> None: ...

    def close(self) -> None: ...
