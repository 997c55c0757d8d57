"""A command's output in its log, capped: the first and the last bytes kept, the middle counted.

The supervisor process (:mod:`bisect_harness.process.supervisor`) reads what the
command writes from a pipe and writes it into the log through :class:`_CappedLog`;
the harness reads the caps' defaults (:data:`LOG_HEAD_BYTES`, :data:`LOG_TAIL_BYTES`).

A write the kernel refuses (a full disk: ENOSPC; EIO; EFBIG past a file-size limit)
never holds the command up, and is never lost in silence: the writer keeps the
first error and counts the bytes it could not write, keeps the newest
:data:`MEMORY_TAIL_BYTES` of the output in memory for the boot's record, and, once
writes succeed again, says in the log how much is missing above.

This module imports nothing of the package: the supervisor process runs
without it (``python -I``), importing this file from its own folder.
"""

from __future__ import annotations

import collections
import errno
import os
import time


#: A command's output kept in its log: the first LOG_HEAD_BYTES and the last
#: LOG_TAIL_BYTES, what came between them dropped and counted. An engine's whole
#: boot log fits by far; a server that floods stdout cannot fill the disk.
LOG_HEAD_BYTES = 32 << 20  # model.Limits' defaults (this file runs alone, importing nothing of the package)
LOG_TAIL_BYTES = 32 << 20
_LOG_REWRITE_S = 1.0
#: The newest output kept in memory whatever the log holds: what the boot's record
#: shows as its log's tail when the log could not be written. Small enough to cross
#: the status pipe (64 KiB) as base64 while the harness is not reading it.
MEMORY_TAIL_BYTES = 16 << 10


class _CappedLog:
    """The supervisor's writer of the command's output into the log (its own fd 1).

    The head is written as it comes. Past it, the newest ``tail`` bytes are kept in
    memory and written after a marker line, the file cut back to the marker first,
    at most once a second and at the end: the log stays readable while the command
    runs (about a second behind once capped), and never holds more than head +
    marker + tail."""

    def __init__(self, fd: int, head: int, tail: int):
        self.fd, self.head, self.tail = fd, head, tail
        try:
            self.start = os.lseek(fd, 0, os.SEEK_END)  # the log may hold lines written before this command
        except OSError:
            self.start = 0
        self.total = 0         # bytes of output the command wrote
        self.dropped = 0       # of them, those neither in the head nor in the tail
        self.ring: collections.deque[bytes] = collections.deque()  # the newest output, at most ``tail`` bytes
        self.ring_bytes = 0
        self.mark_at: int | None = None
        self.dirty = False
        self.rewritten = 0.0
        self.error: OSError | None = None  # the first write the kernel refused
        self.unwritten = 0     # bytes of output (or of the supervisor's notes) that never reached the log
        self._gap = 0          # of them, those since the last write that succeeded
        self.recent: collections.deque[bytes] = collections.deque()  # the newest output, MEMORY_TAIL_BYTES
        self.recent_bytes = 0

    def write(self, data: bytes) -> None:
        self.total += len(data)
        self._remember(data)
        if self.mark_at is None:
            room = self.head - (self.total - len(data))
            if len(data) <= room:
                self._raw(data)
                return
            self._raw(data[:room])
            self.mark_at = self.start + self.head
            data = data[room:]
        self.ring.append(data)
        self.ring_bytes += len(data)
        while self.ring_bytes > self.tail:  # drop from the oldest end, a chunk (or part of one) at a time
            over = self.ring_bytes - self.tail
            first = self.ring[0]
            if len(first) <= over:
                self.ring.popleft()
                cut = len(first)
            else:
                self.ring[0] = first[over:]
                cut = over
            self.ring_bytes -= cut
            self.dropped += cut
        self.dirty = True

    def _remember(self, data: bytes) -> None:
        self.recent.append(data)
        self.recent_bytes += len(data)
        while self.recent_bytes - len(self.recent[0]) >= MEMORY_TAIL_BYTES:
            self.recent_bytes -= len(self.recent.popleft())

    def memory_tail(self) -> bytes:
        """The newest output, up to :data:`MEMORY_TAIL_BYTES`, whatever the log holds."""
        return b"".join(self.recent)[-MEMORY_TAIL_BYTES:]

    def _raw(self, data: bytes) -> None:
        if self._gap and not self._try(f"\n[bisect-harness supervisor] {self._gap:,} bytes of output could not "
                                       f"be written here ({self._why()})\n".encode()):
            self._lost(len(data))
            return
        self._gap = 0
        self._try(data)

    def _try(self, data: bytes) -> bool:
        """Write all of ``data``; on a refused write count what is left as lost (the
        command is never held up) and return False."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.fd, view):]
            except InterruptedError:
                continue
            except OSError as exc:  # ENOSPC, EIO, EFBIG, EDQUOT...
                self.error = self.error or exc
                self._lost(len(view))
                return False
        return True

    def _lost(self, n: int) -> None:
        self.unwritten += n
        self._gap += n

    def _why(self) -> str:
        exc = self.error
        if exc is None:
            return ""
        name = errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")
        return f"{name}: {exc.strerror or exc}"

    def failure(self) -> str | None:
        """The first refused write (``"ENOSPC: No space left on device"``), None when every write succeeded."""
        return self._why() if self.unwritten else None

    def flush(self, now: float | None = None) -> None:
        """Write the tail after the marker (no more than once a second unless ``now`` is None)."""
        if not self.dirty or self.mark_at is None:
            return
        if now is not None and now - self.rewritten < _LOG_REWRITE_S:
            return
        try:
            os.ftruncate(self.fd, self.mark_at)
        except OSError as exc:
            self.error = self.error or exc
            return
        self._raw((f"\n[bisect-harness supervisor] log capped: the first {self.head:,} bytes of the output are "
                   f"above, the last {self.ring_bytes:,} below; {self.dropped:,} bytes between them were "
                   f"dropped\n").encode())
        for chunk in self.ring:
            self._raw(chunk)
        self.dirty, self.rewritten = False, time.monotonic()


def _read_output(fd: int, log: _CappedLog, most: int = 8 << 20) -> bool:
    """Move what the command wrote into the log (up to ``most`` bytes a call). False at
    end-of-file: every process holding the pipe has closed it."""
    moved = 0
    while moved < most:
        try:
            chunk = os.read(fd, 1 << 20)
        except (BlockingIOError, InterruptedError):
            return True
        if not chunk:
            return False
        log.write(chunk)
        moved += len(chunk)
    return True
