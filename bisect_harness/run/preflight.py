"""The run's preflight: the host watched at the run's start, judged and recorded.

With ``--wait-quiet`` the first boot waits for a quiet window (``contention.wait_quiet``).
Without, a :class:`~bisect_harness.observe.contention.Watch` of ``defaults.host_preflight_s``
runs beside the run's first batch of boots, from its start (after any calibration
probe): the harness's own processes, the server's among them, are not foreign, so the
figures mean what they would before the first boot, and no boot waits for them. When
that batch is over the window is waited out (a batch shorter than it), judged and
recorded as the run's ``preflight`` calibration row, whose ``watched`` says which.
"""

from __future__ import annotations

import time
from typing import Callable

from bisect_harness.observe import contention, host_state
from bisect_harness.spec.types import Defaults

__all__ = ["Preflight"]


class Preflight:
    """One run's preflight. ``say``: a message to the user; ``record``: adds the
    calibration row's result (the scheduler's)."""

    def __init__(self, defaults: Defaults, wait_quiet_s: float | None, say: Callable[[str], None],
                 record: Callable[[dict], None]):
        self.defaults, self.wait_quiet_s, self.say, self.record = defaults, wait_quiet_s, say, record
        self._due: float | None = None      # its seconds, until the first batch starts it
        self._watch: contention.Watch | None = None

    def begin(self) -> None:
        """At the run's start: with ``wait_quiet_s``, wait for a quiet window now and
        record it; else make the window due for the first batch."""
        seconds = self.defaults.host_preflight_s
        if seconds <= 0 and not self.wait_quiet_s:
            return
        seconds = seconds or 2.0
        if not self.wait_quiet_s:
            self._due = seconds
            return
        t0 = time.monotonic()
        quiet, window = contention.wait_quiet(self.defaults.host_thresholds, timeout_s=self.wait_quiet_s,
                                              window_s=seconds, say=self.say)
        waited = time.monotonic() - t0
        self._judge(window, waited, when="before the first boot")
        if quiet:
            self.say(f"host quiet after {waited:.0f} s")

    def start(self) -> None:
        """The first batch starts: so does the window, where one is due."""
        if self._due is not None:
            self._watch, self._due = contention.Watch(self._due), None

    def end(self, *, cut_short: bool = False) -> None:
        """The window watched beside the first batch: its time waited out (or, when the
        run ends early, ``cut_short`` where it is), judged and recorded. Once per run;
        a run that ends before any boot watches its window now, unless cut short."""
        if not cut_short:
            self.start()
        self._due = None
        watch, self._watch = self._watch, None
        if watch is not None:
            self._judge(watch.window(cut_short=cut_short), 0.0, when="beside the first boot")

    def _judge(self, window: contention.Window, waited: float, *, when: str) -> None:
        d = self.defaults
        crossed = contention.judge(window, d.host_thresholds)
        if crossed:
            why = "; ".join(c.message for c in crossed)
            self.say(f"{host_state.PREFLIGHT_BUSY} of the run ({when}: {why}); the boots' figures will say how "
                     f"busy each one was. Use --wait-quiet to wait for a quiet host, or defaults.host_check "
                     f"(now {d.host_check}) to act on busy boots.")
        self.record({"contention": window.to_dict(), "watched": when, "crossed": [c.to_dict() for c in crossed],
                     "waited_s": round(waited, 2), "thresholds": d.host_thresholds.to_dict()})
