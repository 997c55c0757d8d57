"""How a sample's jobs (``jobs``) are sent: closed loop or open loop.

- **Closed loop** (:func:`closed_loop`): ``workers`` threads each take the next job when
  their last one ends, so at most ``workers`` are in flight and the server's speed sets
  the pace; with a window (``benchmark.sample_seconds``) a worker takes no new job once
  it has passed.
- **Open loop** (:func:`open_loop`): each job starts at its arrival time
  (``arrivals.arrival_times``), whether or not the jobs before it have ended, so the
  pace is the arrival process's and a slow server builds a queue, as real traffic
  does. The calling thread hands each job, :data:`LEAD_S` before its time, to an idle
  thread of the sample's crew, or where none is idle to a new one, and that thread
  sleeps until the time and sends: no job ever waits for another to end, and a send
  waits on one thread's wake-up, not on two (the dispatcher's, then a worker's), which
  on a busy host is what a send's lag is mostly made of.

A job's *send lag* is how late it started: the time its thread began it less its
arrival time. A client that cannot keep up (a busy host, a GIL held by stream parsing)
shows as lag, and a sample whose p99 lag is over ``benchmark.max_lag_ms`` is marked
(``client``), never counted as the rate it was asked for.

While an open-loop sample runs, the objects that existed before it are frozen
(``gc.freeze``) so that a full collection of the cyclic garbage collector, which holds
every thread while it walks the heap (tens of milliseconds in a process that has
loaded numpy and scipy, hundreds with torch), scans only what the sample made; they
are unfrozen when it ends. vLLM's engine freezes its start-up heap for the same reason.

A job that raises (a bug, not a failed request: those are records) is raised again
here once every job has ended, never dropped silently.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import httpx

from bisect_harness.measure.jobs import Job
from bisect_harness.measure.request import RequestRecord

__all__ = ["LEAD_S", "Dispatched", "closed_loop", "open_loop"]

#: How long before its arrival time an open-loop job is handed to the thread that sends
#: it (which then sleeps until the time itself).
LEAD_S = 0.02


@dataclass(frozen=True)
class Dispatched:
    """What a sample's jobs gave: their requests' records (in job order), the sample's
    wall time (its start to the last job's end), when each job started (seconds from
    the sample's start) and, open loop, how late each started (``lags_s``; closed loop
    ``()``: it has no schedule to be late for)."""

    records: tuple[RequestRecord, ...]
    wall_s: float
    started_s: tuple[float, ...]
    lags_s: tuple[float, ...] = ()


class _Results:
    """Each job's records and start, by its index; the first exception a job raised."""

    def __init__(self) -> None:
        self.records: dict[int, list[RequestRecord]] = {}
        self.started: dict[int, float] = {}
        self.lags: dict[int, float] = {}
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def run(self, i: int, job: Job, http: httpx.Client, t0: float, at: float | None = None) -> None:
        started = time.perf_counter()
        try:
            records = job.run(http, t0)
        except BaseException as e:  # noqa: BLE001 - handed to the sample's thread, raised there
            with self.lock:
                self.error = self.error or e
            return
        with self.lock:
            self.records[i] = records
            self.started[i] = started - t0
            if at is not None:
                self.lags[i] = started - t0 - at

    def dispatched(self, wall_s: float) -> Dispatched:
        if self.error is not None:
            raise self.error
        order = sorted(self.records)
        return Dispatched(records=tuple(r for i in order for r in self.records[i]), wall_s=wall_s,
                          started_s=tuple(self.started[i] for i in order),
                          lags_s=tuple(self.lags[i] for i in order if i in self.lags))


def closed_loop(http: httpx.Client, jobs: Iterable[Job], workers: int, *, until_s: float | None = None) -> Dispatched:
    """Run ``jobs`` on ``workers`` threads, each taking the next job as its last ends
    (taken from ``jobs`` as they are needed, so ``jobs`` may be a long or endless
    stream where ``until_s`` ends the sample: no job is taken once ``until_s`` seconds
    have passed since the start)."""
    source = iter(enumerate(jobs))
    take = threading.Lock()
    out = _Results()
    t0 = time.perf_counter()

    def worker() -> None:
        while out.error is None:
            with take:
                if until_s is not None and time.perf_counter() - t0 >= until_s:
                    return
                item = next(source, None)
            if item is None:
                return
            out.run(item[0], item[1], http, t0)

    if workers <= 1:
        worker()
    else:
        threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{k}") for k in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return out.dispatched(time.perf_counter() - t0)


class _Crew:
    """The threads of an open-loop sample: an idle one takes the next job, and where none
    is idle a new one starts, so a job never waits for another to end. Each job handed
    over either reserved an idle thread or started one, so there is always a thread
    free to take it."""

    def __init__(self, out: _Results, http: httpx.Client, t0: float) -> None:
        self.out, self.http, self.t0 = out, http, t0
        self.jobs: "queue.SimpleQueue[tuple[int, Job, float] | None]" = queue.SimpleQueue()
        self.idle = 0
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def send(self, i: int, job: Job, at: float) -> None:
        with self.lock:
            if self.idle:
                self.idle -= 1
                start = False
            else:
                start = True
        if start:
            t = threading.Thread(target=self._work, daemon=True, name=f"bench-open-{len(self.threads)}")
            self.threads.append(t)
            t.start()
        self.jobs.put((i, job, at))

    def _work(self) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            i, job, at = item
            wait = self.t0 + at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            self.out.run(i, job, self.http, self.t0, at)
            with self.lock:
                self.idle += 1

    def close(self) -> None:
        """Wait for every job to end; the threads then leave."""
        for _ in self.threads:
            self.jobs.put(None)  # after every job: each thread takes its jobs before its stop
        for t in self.threads:
            t.join()


def open_loop(http: httpx.Client, jobs: Sequence[Job], times: Sequence[float]) -> Dispatched:
    """Start job i at ``times[i]`` seconds from the sample's start (ascending), each on a
    thread of its own for as long as it runs, handed to it :data:`LEAD_S` ahead (module
    docstring); ``Dispatched.lags_s`` says how late each began."""
    if len(jobs) != len(times):
        raise ValueError(f"{len(jobs)} jobs for {len(times)} arrival times")
    out = _Results()
    gc.freeze()  # module docstring: no full collection walks the heap the sample found
    try:
        t0 = time.perf_counter() + LEAD_S  # the sample starts at its first arrival, which gets its lead too
        crew = _Crew(out, http, t0)
        try:
            for i, (job, at) in enumerate(zip(jobs, times)):
                wait = t0 + at - LEAD_S - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                crew.send(i, job, at)
        finally:
            crew.close()
        wall = time.perf_counter() - t0
    finally:
        gc.unfreeze()
    return out.dispatched(wall)
