"""The local backend: a round's boots on this host, ``slots`` at a time.

:class:`LocalBackend` runs a batch of requests through the boot procedure
(``backends.procedure``), each on its own device set (``CUDA_VISIBLE_DEVICES``
sized by the boot's tensor parallel degree; a disjoint set of CPU cores for CPU
engines), and hands back each boot's events as they happen. Its kind, ``local``,
is the default of ``backend.kind`` and ``--backend``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from typing import Any, Iterator, Mapping, Sequence

from bisect_harness.backends import BACKENDS, Backend, BackendKind
from bisect_harness.boot import BootRequest, DeviceSet, Event, Finished, Sampled
from bisect_harness.errors import SpecError, UserError

__all__ = ["LocalBackend", "device_sets"]


def device_sets(slots: int, *, cpus: Sequence[int] | None = None) -> list[DeviceSet]:
    """``slots`` disjoint shares of this host's CPU cores (by default this process's
    affinity). Raises UserError when the host has fewer cores than slots."""
    slots = max(1, int(slots))
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if slots > 1 and len(cpus) < slots:
        raise UserError(f"slots {slots} (--slots or backend.slots): this host gives the harness {len(cpus)} CPU "
                        "core(s); use at most that many slots")
    per = len(cpus) // slots
    return [DeviceSet(slot=i, cpus=tuple(cpus[i * per:(i + 1) * per]) if slots > 1 else None)
            for i in range(slots)]


def _visible_gpus() -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [int(x) for x in visible.split(",") if x.strip().isdigit()]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return list(range(pynvml.nvmlDeviceGetCount()))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return []


class LocalBackend(Backend):
    """Boots on this host, ``slots`` at a time on disjoint device sets.

    With one slot a boot runs on the caller's thread, stepped by the caller, on the
    whole host (nothing pinned). With more, each boot of a batch gets a slot: a share
    of the CPU cores and, on a host with GPUs, ``devices_needed`` GPUs of its own (the
    config's tensor parallel degree), so fewer boots run at once when the GPUs run
    out. Each slot is a thread; their events reach the caller through a queue drained
    on the caller's thread (the ledger is written from one thread only). An interrupt
    on the caller's thread cancels the boots in flight and stops their servers."""

    name = "local"

    def __init__(self, slots: int = 1, *, gpus: Sequence[int] | None = None, cpus: Sequence[int] | None = None):
        self.sets = device_sets(slots, cpus=cpus)
        self.slots = len(self.sets)
        self.gpus = list(gpus) if gpus is not None else (_visible_gpus() if self.slots > 1 else [])
        self._next = 0

    def close(self) -> None:
        pass

    def batch_size(self, requests: Sequence[BootRequest]) -> int:
        """Boots of ``requests`` that fit at once: the slots, and the GPUs where there are any."""
        if not self.gpus or self.slots == 1:
            return self.slots
        need = max((r.devices_needed for r in requests), default=1)
        fit = len(self.gpus) // max(1, need)
        if fit < 1:
            raise UserError(f"a boot needs {need} GPUs (its tensor parallel degree) and this host shows "
                            f"{len(self.gpus)}; run it on a larger host")
        return max(1, min(self.slots, fit))

    def assign(self, requests: Sequence[BootRequest]) -> list[BootRequest]:
        """Device sets for a batch that fits at once: request i takes slot i (rotated by
        one each batch, so a config does not keep the same cores or GPUs round after
        round) and the next ``devices_needed`` GPUs."""
        if self.slots == 1:
            return list(requests)
        out = []
        need = max((r.devices_needed for r in requests), default=1)
        for i, r in enumerate(requests):
            slot = (self._next + i) % self.slots
            base = self.sets[slot]
            gpus = None
            if self.gpus:
                start = (slot * need) % len(self.gpus)
                gpus = tuple(self.gpus[start:start + r.devices_needed])
            out.append(r.with_devices(DeviceSet(slot=slot, gpus=gpus, cpus=base.cpus)))
        self._next = (self._next + 1) % self.slots
        return out

    def events(self, requests: Sequence[BootRequest]) -> Iterator[Event]:
        from bisect_harness.backends.procedure import boot_events  # the boot's modules, once a boot runs

        if self.slots == 1:
            for r in requests:
                yield from boot_events(r)
            return
        pending = list(requests)
        while pending:
            size = self.batch_size(pending)
            batch, pending = pending[:size], pending[size:]
            yield from self._run_parallel(self.assign(batch))

    def _run_parallel(self, requests: Sequence[BootRequest]) -> Iterator[Event]:
        from bisect_harness.backends.procedure import boot_events
        from bisect_harness.engines.server import stop_all

        if len(requests) == 1:
            yield from boot_events(requests[0])
            return
        events: queue.Queue = queue.Queue()
        cancel = threading.Event()

        def work(req: BootRequest) -> None:
            try:
                for event in boot_events(req, cancel=cancel):
                    events.put(event)
            except (KeyboardInterrupt, SystemExit):
                pass  # handed back as an interrupted outcome
            except BaseException as exc:  # noqa: BLE001 - a crash of one boot must reach the caller
                events.put(_Crashed(exc))

        threads = [threading.Thread(target=work, args=(r,), name=f"boot-{r.boot_id}", daemon=True)
                   for r in requests]
        for t in threads:
            t.start()
        done = 0
        try:
            while done < len(requests):
                event = events.get()
                if isinstance(event, _Crashed):
                    done += 1
                    raise event.exc
                done += isinstance(event, Finished)
                yield event
        except BaseException as exc:
            cancel.set()  # boots stop at their next sample; servers stop as their threads unwind
            stop_all()  # every server this process launched; their threads unwind through failing requests
            for t in threads:
                t.join(timeout=30)
            if isinstance(exc, GeneratorExit):
                raise  # the caller let go of the events: nothing more can be handed back
            with contextlib.suppress(queue.Empty):
                while True:
                    event = events.get_nowait()
                    if isinstance(event, (Finished, Sampled)):
                        yield event
            raise


class _Crashed:
    """A boot thread's unexpected exception, on its way to the caller's thread."""

    def __init__(self, exc: BaseException):
        self.exc = exc


def _check(options: Mapping[str, Any], where: str) -> None:
    if options:
        key = sorted(options)[0]
        raise SpecError(f"the local backend takes only kind and slots; {key!r} belongs to another backend "
                        "(set kind: slurm for cluster keys)", key=f"{where}.{key}")


BACKENDS.add(BackendKind(name="local", summary="this host", check=_check,
                         make=lambda options, *, slots, log_dir: LocalBackend(slots)))
