"""Was the box busy? Host contention measured over a window, judged against thresholds.

A :class:`Monitor` reads every registered :class:`Source` when it starts, about once
per ``interval_s`` on a background thread, at each :meth:`Monitor.split` (a sample
boundary) and when it stops; :meth:`Monitor.window` turns the readings between two
boundaries into a :class:`Window` of figures. :func:`judge` compares a window's
figures with :class:`Thresholds` and returns the :class:`Crossing` s, each a
sentence that names the figure, its value, the limit and (for foreign CPU) the
busiest processes outside the server's tree.

The sources (:mod:`~bisect_harness.observe.contention.sources`, one class each,
registered by name in :data:`SOURCES`, each describing itself):

* ``pressure`` -- Linux pressure stall information (``/proc/pressure/cpu|io|memory``):
  the share of the window in which some task waited, from the ``total`` counters.
* ``steal`` -- CPU time taken by the hypervisor from this guest (``/proc/stat``).
* ``runqueue`` -- runnable tasks (``procs_running``) minus the runnable threads of the
  harness and the server's tree, per core the server may use (its affinity).
* ``foreign_cpu`` -- CPU seconds used during the window by processes outside the
  harness's own process tree (which holds the server's), per core the server may use.
* ``gpu_processes`` -- processes on the server's GPUs that are not in its tree (NVML).

A source that cannot be read here (no PSI in a container, no NVML) is recorded as
unavailable with the reason, and the others are used. Parsing is done by pure
functions (:func:`parse_pressure`, :func:`parse_proc_stat`, :func:`parse_task_state`)
so each source is testable on recorded text; each source reads through a ``read``
callable (a path to text) and the GPU source through an ``nvml`` object, the seams.

The figures of a window and their judgement are in
:mod:`~bisect_harness.observe.contention.window`; the monitor that reads the
sources over a window, on a thread, in :mod:`~bisect_harness.observe.contention.monitor`.

Example::

    with Monitor(server_pid=server.pid) as mon:
        run_benchmark()
    window = mon.window()
    for c in judge(window, Thresholds()):
        print(c.message)
"""

from __future__ import annotations

from bisect_harness.observe.contention.monitor import (
    Monitor, Watch, allowed_cores, own_pids, sample_host, wait_quiet,
)
from bisect_harness.observe.contention.sources import (
    SOURCES, Context, ForeignCpuSource, GpuProcessSource, PressureSource, ProcCpu, ProcStat, RunQueueSource, Source,
    SourceUnavailable, StealSource, parse_pressure, parse_proc_stat, parse_task_state, register,
)
from bisect_harness.observe.contention.window import HOST_BUSY, Crossing, Thresholds, Window, judge, record, summary_line

__all__ = [
    "Context", "Crossing", "ForeignCpuSource", "HOST_BUSY", "GpuProcessSource", "Monitor", "PressureSource", "ProcCpu",
    "ProcStat", "RunQueueSource", "SOURCES", "Source", "SourceUnavailable", "StealSource", "Thresholds",
    "Watch", "Window", "allowed_cores", "judge", "own_pids", "parse_pressure", "parse_proc_stat", "parse_task_state",
    "record", "register", "sample_host", "summary_line", "wait_quiet",
]
