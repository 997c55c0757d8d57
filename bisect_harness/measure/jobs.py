"""What a sample sends, as jobs: one streamed request, or (``measure.workloads``) a
session of turns that each carry the conversation so far.

The client's dispatcher (``client``) runs a sample's jobs, closed loop
(``concurrency`` workers, each taking the next job when its last one ends) or open
loop (each job sent at its arrival time); a job hands back the records of the
requests it sent, each timed from the sample's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import httpx

from bisect_harness.measure.apis import Api
from bisect_harness.measure.request import MAX_SSE_LINE, Reading, RequestRecord, run_request

__all__ = ["Draw", "Job", "RequestJob"]


@dataclass(frozen=True)
class Draw:
    """Which requests a sample sends: those of sample ``sample`` (0: the warm-up; below 0:
    the warm-ups of a sweep's later points) of boot ``boot`` (its ledger id: every boot's
    texts its own), whose lengths, arrival times and dataset draws are those of the
    config's ``boot_seq``-th boot (None: of boot ``boot``), so both arms of a round send
    the same traffic; prompts ``words`` words long (None: ``prompt_tokens`` words)."""

    boot: int = 0
    sample: int = 1
    boot_seq: int | None = None
    words: int | None = None


class Job(Protocol):
    """One unit of a sample's work."""

    def run(self, http: httpx.Client, sample_t0: float) -> list[RequestRecord]:
        """Send the job's requests on ``http``; their records, timed from ``sample_t0``."""
        ...


@dataclass(frozen=True)
class RequestJob:
    """One streamed request: its URL and body (already in ``api``'s form), at most
    ``most`` output tokens counted, ``timeout_s`` for the whole stream."""

    url: str
    payload: dict
    api: Api
    timeout_s: float
    most: int
    max_line: int = MAX_SSE_LINE

    def run(self, http: httpx.Client, sample_t0: float) -> list[RequestRecord]:
        return [run_request(http, self.url, self.payload, self.api, self.timeout_s, self.most, sample_t0,
                            Reading(self.max_line))]
