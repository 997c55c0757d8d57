"""A host busy all the time: when a search stops booting again for quiet samples.

A search counts each boot's quiet samples (``defaults.search_samples: quiet``): a
neighbour's burst costs the samples it covered, and a boot busy in every sample
gives no value and is booted again, since bursts pass. On a host that is busy all
the time (a node shared with other jobs, two servers of one search on one machine)
they do not pass: every boot again is busy throughout too, the search doubles its
boots and some probes get no value at all.

:class:`BusyHost` watches the search's boots in order. Once ``THRESHOLD`` of the
last ``WINDOW`` boots that gave samples of the metric were busy throughout, the
host is taken as busy all the time: from then on, for the rest of the run, a boot
busy throughout counts with all its samples (as ``search_samples: all`` counts
every boot) instead of being booted again. A boot with quiet samples still counts
its quiet ones. The switch is said once, with the boots that made it, and each
boot counted whole is named in its probe's note; ``undetermined`` still counts
those boots as busy.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["BusyHost", "THRESHOLD", "WINDOW"]

#: the last so many boots with samples of the metric are looked at ...
WINDOW = 10
#: ... and this many of them busy throughout make a host busy all the time. Under a
#: neighbour in 1-6 s bursts with 1-6 s gaps (``bench/bench_busy_bisect.py``) about 4 boots
#: in 10 are marked busy, and 4 busy throughout of the last 6 came in every search, which
#: then counted bursts' boots whole (2 of 3 culprits named, not 3); at 4 in 10, 9 of 10
#: come about once in 600 windows.
THRESHOLD = 9


@dataclass
class BusyHost:
    """The run's view of whether its host is busy all the time (see the module)."""

    window: int = WINDOW
    threshold: int = THRESHOLD
    recent: deque = field(default_factory=deque)  # (boot id, busy throughout) of the last ``window`` boots
    since: int | None = None  # the boot whose verdict made the switch; None while bursts may pass

    def __post_init__(self):
        if not (1 <= self.threshold <= self.window):
            raise ValueError(f"threshold must lie in 1..window ({self.window}), got {self.threshold}")

    @property
    def all_the_time(self) -> bool:
        """Whether a boot busy throughout now counts whole."""
        return self.since is not None

    def observe(self, boot_id: int, busy_throughout: bool) -> str | None:
        """Note one boot that gave samples of the metric; the sentence that says the
        switch, once, when this boot makes it; else None."""
        self.recent.append((boot_id, busy_throughout))
        while len(self.recent) > self.window:
            self.recent.popleft()
        if self.since is not None:
            return None
        busy = [i for i, b in self.recent if b]
        if len(busy) < self.threshold:
            return None
        self.since = boot_id
        return (f"host busy all the time: {len(busy)} of the last {len(self.recent)} boots were busy in every "
                f"sample (boots {', '.join(map(str, busy))}); the bursts do not pass, so from boot {boot_id} on "
                "a boot busy throughout counts with all its samples instead of being booted again "
                "(as search_samples: all)")
