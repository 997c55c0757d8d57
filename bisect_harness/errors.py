"""The harness's errors, as a tree that says what to do.

::

    HarnessError                 base of everything we raise on purpose
    ├── UserError                fatal: the input is wrong; fix it and re-run (exit 2)
    │   ├── SpecError            hypotheses.yaml: names the key and the line
    │   ├── CommitError          a revision that does not resolve in the engine repo
    │   └── DatasetError         a dataset file (benchmark.workload) that cannot be read as
    │                            conversations: names the file, the entry and the fix
    ├── InfrastructureError      fatal for the run: the machine or a tool failed (exit 3)
    │   └── LaunchError          a command could not start (not found, not executable, bad cwd);
    │                            an OSError too (process/supervised): a boot's launch becomes
    │                            BootFailed, a build's a failed build, where the caller can go on
    ├── NotObserved              informational: what the harness could not read or take is
    │   │                        recorded with its reason; the boot and the run go on
    │   ├── SourceUnavailable    a contention source cannot be read here (observe/contention)
    │   ├── NoProfilerEndpoint   the engine has no profiler to ask (engines/profilers)
    │   └── ProfileFailed        the profiler was there and the profile failed (engines/profilers)
    ├── ConfigFailure            recoverable: one config could not be measured;
    │   │                        recorded in the ledger with its log tail, the run goes on
    │   ├── BuildFailed          the build command failed at a commit (bisection skips it)
    │   └── BootFailed           the server exited early or never became ready
    │       ├── BootTimeout      ... within its deadline (may be retried)
    │       └── FlagNotAccepted  ... because its argument parser refused a flag at this
    │                            commit (argparse exit 2): never retried
    └── ServerReplyError         recoverable: a server's reply refused as untrusted input;
        │                        caught where it is read, it fails that one request or read
        │                        with its reason (a failed request, a metric-source problem)
        ├── StreamError          measure/apis: a streamed chunk of the wrong shape, or a
        │                        token count that cannot be true
        ├── SSELineTooLong       measure/sse: an event-stream line past its limit
        ├── BodyTooLarge         measure/bodies: a body past its limit once decoded
        └── UnreadableBody       measure/bodies: a body compressed in a way not decoded,
                                 or corrupt

Only ``cli`` turns these into exit codes; library code raises, never prints or exits.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""

    exit_code = 1


class UserError(HarnessError):
    """Bad input: the message names what is wrong and what to do."""

    exit_code = 2


class SpecError(UserError):
    """A problem in a hypotheses file, located by key path and line."""

    def __init__(self, message: str, *, key: str | None = None, line: int | None = None,
                 file: str | None = None):
        self.key, self.line, self.file, self.message = key, line, file, message
        where = []
        if file:
            where.append(f"{file}" + (f":{line}" if line else ""))
        elif line:
            where.append(f"line {line}")
        if key:
            where.append(f"key '{key}'")
        prefix = ", ".join(where)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class CommitError(UserError):
    """A revision that does not resolve in the engine's repository."""


class DatasetError(UserError):
    """A dataset file of conversations (``benchmark.workload``) that cannot be used: unreadable,
    malformed (the message names the line or index), or with no conversation the workload
    can send (the message counts why each was left out)."""


class InfrastructureError(HarnessError):
    """The machine, git, or the ledger failed in a way no config can route around."""

    exit_code = 3


class NotObserved(HarnessError):
    """Something the harness could not read or take (a contention source, a profile): recorded
    with its reason where the observation would have been; the boot and the run go on."""


class ConfigFailure(HarnessError):
    """One config could not be measured; recorded and skipped, never fatal to the run.
    ``log_unwritten``: where its log could not be written (a full disk), how much is
    missing and why; ``log_tail`` then comes from memory."""

    def __init__(self, message: str, *, log_tail: str = "", log_path: str | None = None):
        self.log_tail, self.log_path = log_tail, log_path
        self.log_unwritten: str | None = None
        super().__init__(message)


class BuildFailed(ConfigFailure):
    """The build command exited non-zero in a commit's worktree."""


class BootFailed(ConfigFailure):
    """The server process exited before it was ready, or failed its health check."""


class BootTimeout(BootFailed):
    """The server did not become ready before its deadline."""


class FlagNotAccepted(BootFailed):
    """The engine's argument parser refused the launch argv at this commit: a flag
    that does not exist there, is ambiguous there, or a value it does not accept
    (argparse exits 2 with ``error: unrecognized arguments`` / ``ambiguous option``
    / ``invalid choice``). Not a crash: the same argv fails the same way every time,
    so it is recorded once and the config is not retried. ``engine_message`` is the
    engine's own ``error:`` line."""

    def __init__(self, message: str, *, engine_message: str, log_tail: str = "", log_path: str | None = None):
        self.engine_message = engine_message
        super().__init__(message, log_tail=log_tail, log_path=log_path)


class ServerReplyError(HarnessError):
    """A server's reply that the harness refuses to believe or to read on (STYLE: read
    what a server sends as untrusted input). Raised where the reply is read and caught
    by the reader's caller, which records the reason against that one request or
    metric-source read; the boot goes on. The kinds are defined beside what reads
    them (``measure.apis``, ``measure.sse``, ``measure.bodies``)."""
