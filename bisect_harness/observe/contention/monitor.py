"""The monitor: every registered contention source read over a window, on a background thread.

A :class:`Monitor` reads each source when it starts, about once per
``interval_s``, at each :meth:`Monitor.split` (a sample boundary) and when it
stops; :meth:`Monitor.window` turns the readings between two boundaries into a
:class:`~bisect_harness.observe.contention.window.Window`. :func:`sample_host`
watches the host for a few seconds, a :class:`Watch` beside other work; :func:`wait_quiet` waits for a quiet window.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Iterable, Sequence

import psutil

from bisect_harness.observe.contention.sources import SOURCES, Context, Source, SourceUnavailable, _span
from bisect_harness.observe.contention.window import Thresholds, Window, judge

def own_pids(roots: Iterable[int]) -> frozenset[int]:
    """The given pids and all their descendants that exist now."""
    out: set[int] = set()
    for pid in roots:
        try:
            p = psutil.Process(pid)
            out.add(pid)
            out.update(c.pid for c in p.children(recursive=True))
        except psutil.Error:
            continue
    return frozenset(out)


def allowed_cores(pid: int | None) -> int:
    try:
        return len(psutil.Process(pid).cpu_affinity()) if pid else len(os.sched_getaffinity(0))
    except (psutil.Error, AttributeError, OSError):
        return os.cpu_count() or 1


class Monitor:
    """Reads every source over a window, on a background thread every ``interval_s``.

    ``server_pid``: the server's root process; its tree is ours, as are the trees of
    ``roots`` (default: this process, the harness). ``sources``: instances to use instead of one of each registered
    class (tests pass sources with recorded text). :meth:`split` marks a boundary
    (between benchmark samples); :meth:`window` gives the figures between two
    boundaries (default: the whole window)."""

    def __init__(self, server_pid: int | None = None, *, interval_s: float = 1.0,
                 sources: Sequence[Source] | None = None, roots: Sequence[int] | None = None):
        self.server_pid = server_pid
        self.interval_s = interval_s
        self._roots = [*(roots if roots is not None else (os.getpid(),)), *([server_pid] if server_pid else [])]
        self.sources = list(sources) if sources is not None else [cls() for cls in SOURCES.values()]
        self._readings: dict[str, list[tuple[float, Any]]] = {s.name: [] for s in self.sources}
        self._unavailable: dict[str, str] = {}
        self._bounds: list[dict[str, int]] = []
        self._ctx = Context(frozenset(), allowed_cores(server_pid), server_pid)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Monitor":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _tick(self) -> None:
        with self._lock:
            self._ctx.own_pids = own_pids(self._roots)
            now = time.monotonic()
            for s in self.sources:
                if s.name in self._unavailable:
                    continue
                try:
                    self._readings[s.name].append((now, s.read(self._ctx)))
                except SourceUnavailable as exc:
                    if not self._readings[s.name]:
                        self._unavailable[s.name] = str(exc)
                except Exception as exc:  # a source that breaks mid-window keeps what it had
                    self._unavailable.setdefault(s.name, f"stopped: {type(exc).__name__}: {exc}")

    def _mark(self) -> None:
        self._tick()
        with self._lock:
            self._bounds.append({k: len(v) for k, v in self._readings.items()})

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("Monitor already started")
        self._mark()
        self._thread = threading.Thread(target=self._run, name="contention", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick()

    def split(self) -> None:
        """A boundary between two windows (say, two benchmark samples)."""
        self._mark()

    def stop(self) -> None:
        if self._thread is None or self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._mark()
        for s in self.sources:
            s.close()

    @property
    def n_windows(self) -> int:
        return max(0, len(self._bounds) - 1)

    def window(self, start: int = 0, end: int | None = None) -> Window:
        """Figures between boundary ``start`` and ``end`` (0 = start, -1 = last)."""
        with self._lock:
            bounds = list(self._bounds)
            readings = {k: list(v) for k, v in self._readings.items()}
            unavailable = dict(self._unavailable)
        if len(bounds) < 2:
            raise RuntimeError("a window needs the monitor started and split or stopped")
        b0, b1 = bounds[start], bounds[end if end is not None else -1]
        figures: dict[str, float] = {}
        sources: dict[str, dict] = {}
        details: dict[str, Any] = {}
        seconds = 0.0
        for s in self.sources:
            if s.name in unavailable:
                sources[s.name] = {"available": False, "note": unavailable[s.name], "description": s.description}
                continue
            rs = readings[s.name][max(0, b0[s.name] - 1):b1[s.name]]
            figures.update(s.figures(rs, self._ctx))
            details.update(s.details(rs, self._ctx))
            seconds = max(seconds, _span(rs))
            sources[s.name] = {"available": True, "readings": len(rs), "description": s.description}
        return Window(seconds, self._ctx.cores, figures, sources, details)

    def samples(self) -> list[Window]:
        """One window per pair of consecutive boundaries."""
        return [self.window(i, i + 1) for i in range(self.n_windows)]


def sample_host(seconds: float = 3.0, *, interval_s: float = 0.5, roots: Sequence[int] | None = None) -> Window:
    """Watch this host for ``seconds``; only the trees of ``roots`` (default: this
    process) count as ours."""
    with Monitor(interval_s=interval_s, roots=roots) as mon:
        time.sleep(seconds)  # the window itself: the sources measure what happens during it
    return mon.window()


class Watch:
    """A window of ``seconds`` watched on a background thread while the caller goes on
    (the run's preflight beside its first boot). :meth:`window` waits for the window's
    end, or with ``cut_short`` ends it now, and gives its figures."""

    def __init__(self, seconds: float, *, interval_s: float = 0.5, roots: Sequence[int] | None = None):
        self.seconds = seconds
        self._mon = Monitor(interval_s=interval_s, roots=roots)
        self._mon.start()
        self._timer = threading.Timer(seconds, self._mon.stop)
        self._timer.daemon = True
        self._timer.start()

    def window(self, *, cut_short: bool = False) -> Window:
        if cut_short:
            self._timer.cancel()
        self._timer.join()  # fired (the monitor stopped at its time) or cancelled
        self._mon.stop()    # nothing where the timer stopped it
        return self._mon.window()


def wait_quiet(thresholds: Thresholds, *, timeout_s: float, window_s: float = 3.0,
               say: Callable[[str], None] = lambda s: None) -> tuple[bool, Window]:
    """Sample windows until one is quiet or ``timeout_s`` has passed. Returns
    ``(quiet, last window)``."""
    deadline = time.monotonic() + timeout_s
    while True:
        w = sample_host(window_s)
        crossed = judge(w, thresholds)
        if not crossed:
            return True, w
        if time.monotonic() + window_s > deadline:
            return False, w
        say("host busy, waiting: " + "; ".join(c.message for c in crossed))
