"""What a person sees while a run goes: progress bars on a terminal, plain lines elsewhere.

Both are a scheduler ``Observer``. On a terminal (:class:`BarsObserver`): one
overall bar (boots done against the command's budget, with an ETA), a bar per
boot advanced per sample, and, during a bisection, a line with the search's state.
Piped, in CI or under a job scheduler (:class:`LinesObserver`): a bar cannot be
redrawn, so each boot and each search step is one plain line on stderr as it
happens, never held back to the end. Run-level lines (the run's start, verdicts,
messages) go to the command's console in both.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from bisect_harness.evidence import BootEvidence
from bisect_harness.secrets import redact_text

__all__ = ["boot_budget", "config_labels", "BarsObserver", "LinesObserver", "observer_for"]


def boot_budget(plan) -> int | None:
    """The most boots the run's rounds may start: every config up to
    ``defaults.boots_per_config`` times (its ``max_boots_per_arm`` plus the boots that
    failed or were left out and were booted again; configs shared by hypotheses are
    booted once per round for all of them), plus an A/A check's boots. A count of boots
    done, retries included, never passes it. None when the plan does not say (the
    bar then shows boots done without a total)."""
    try:
        per_config = int(plan.spec.defaults.boots_per_config)
        n = len(plan.configs) * per_config
        if plan.spec.defaults.aa_check:
            n += len({h.baseline.key for h in plan.hypotheses}) * per_config
        return n
    except (AttributeError, TypeError, ValueError):
        return None


def _replica(config) -> str:
    n = getattr(config, "replica", 0)
    return f" (replica {n})" if n else ""


def config_labels(plan) -> dict[str, str]:
    """Each config's progress label: what sets it apart from its hypothesis' other arm
    (``Arm.describe_against``: ``+--md=draft.gguf``, ``NCCL_PROTO=LL``, the commit where
    only the commit differs), taken from the first hypothesis it is an arm of. Configs
    whose labels would read alike keep their whole label, so no two print the same."""
    labels: dict[str, str] = {}
    for h in getattr(plan, "hypotheses", ()):
        for mine, other in ((h.baseline, h.treatment), (h.treatment, h.baseline)):
            if mine.key not in labels:
                labels[mine.key] = mine.arm.describe_against(other.arm) + _replica(mine)
    by_label: dict[str, list[str]] = {}
    for key, label in labels.items():
        by_label.setdefault(label, []).append(key)
    full = {c.key: c.label for c in getattr(plan, "configs", ())}
    for keys in by_label.values():
        if len(keys) > 1:
            for key in keys:
                labels[key] = full.get(key, labels[key])
    return labels


def observer_for(console: Console, budget: int | None = None):
    """Bars where the console is a terminal, plain lines on stderr where it is not."""
    return BarsObserver(console, budget) if console.is_terminal else LinesObserver(console, budget)


def _status(boot) -> str:
    return boot.status + (f" [{', '.join(boot.marks)}]" if boot.marks else "")


def _requests_note(boot) -> str:
    """`` (2 tries sent again, 1 request failed in samples 1, 3)``: the boot's failed
    requests (``BootEvidence.request_retries["samples"]``), or ""."""
    evidence = getattr(boot, "evidence", None) or BootEvidence()  # an observer's stand-in boot may carry none
    per = (evidence.request_retries or {}).get("samples") or {}
    retried = sum(v.get("retries", 0) for v in per.values())
    failed = sum(v.get("failed", 0) for v in per.values())
    said = ([f"{retried} {'try' if retried == 1 else 'tries'} sent again"] if retried else []) + (
        [f"{failed} request{'' if failed == 1 else 's'} failed"] if failed else [])
    if not said:
        return ""
    return f" ({', '.join(said)} in sample{'' if len(per) == 1 else 's'} {', '.join(sorted(per, key=int))})"


class _Common:
    """What both observers do alike: the run's start, verdicts and messages on the
    console, each config's label, and the count of boots done against the budget."""

    def __init__(self, console: Console, budget: int | None = None):
        self.console = console
        self.budget = budget
        self.search: str | None = None  # the search the boots count for (a run's bisection, say); None: the command's
        self.labels: dict[str, str] = {}  # config key -> what sets it apart from its hypothesis' other arm
        self.reference = None  # a search's arm that its configs are told apart from (``search_started``)
        self.done = 0  # boots finished since the command started
        self._search_from = 0  # boots finished when the search started
        self.not_ok: dict[str, int] = {}  # of the boots counted, those that did not end ok, by status

    def run_started(self, run, plan) -> None:
        self.console.print(f"run {run.id}: {len(plan.hypotheses)} hypotheses, {len(plan.configs)} configs", markup=False)
        self.budget = boot_budget(plan)
        self.labels = config_labels(plan)

    def search_started(self, name: str, budget: int | None, reference=None) -> None:
        """A search (a bisection, an explanation) starts: its boots count against its own
        budget from here on (a run's planned boots say nothing of a follow-up search's),
        and its configs are labelled by what sets them apart from ``reference`` (an
        ``Arm``: the good commit's, the fast arm), else by their whole label."""
        self.search, self.budget, self.reference = name, budget, reference
        self._search_from, self.not_ok = self.done, {}

    def label(self, config) -> str:
        """What a progress line calls ``config``: what sets it apart, never a cut prefix."""
        arm = getattr(config, "arm", None)
        if self.reference is not None and arm is not None:
            return arm.describe_against(self.reference) + _replica(config)
        return self.labels.get(getattr(config, "key", None)) or config.label

    def _count(self, boot) -> str:
        """Count a finished boot; ``12/40 boots (1 failed)``: boots done against the budget,
        retries included, with those that did not end ok (booted again) by status."""
        self.done += 1
        if boot.status != "ok":
            self.not_ok[boot.status] = self.not_ok.get(boot.status, 0) + 1
        n = self.done - self._search_from
        budget = f"/{self.budget}" if self.budget else ""
        return f"{n}{budget} boot{'' if n == 1 and not budget else 's'}" + self._not_ok_text()

    def _not_ok_text(self) -> str:
        return (" (" + ", ".join(f"{n} {status}" for status, n in sorted(self.not_ok.items())) + ")"
                if self.not_ok else "")

    def verdict(self, hypothesis, verdict) -> None:
        if verdict.final:
            self.console.print(f"  {escape(hypothesis.id)}: [bold]{escape(verdict.outcome)}[/bold] ({escape(verdict.reason)})")

    def message(self, text: str) -> None:
        self.console.print(redact_text(text), markup=False, emoji=False)  # verbatim: names may hold :codes:


class BarsObserver(_Common):
    """Rich progress: one overall bar on top, boots done against the budget with an ETA;
    one bar per boot, advanced per sample; the search's state as a line of its own."""

    def __init__(self, console: Console, budget: int | None = None):
        super().__init__(console, budget)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False)
        self.task = None
        self.step = None  # the search's state, a line of its own
        self.overall = None  # made with the run's first line or boot: bad input shows no empty bar

    def _what(self) -> str:
        return (f"{self.search}: " if self.search else "") + "boots done / budget"

    def _overall(self):
        if self.overall is None:
            self.overall = self.progress.add_task(escape(self._what()), total=self.budget)
        return self.overall

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()

    def run_started(self, run, plan) -> None:
        super().run_started(run, plan)
        self.progress.update(self._overall(), total=self.budget)

    def boot_started(self, config, attempt, samples) -> None:
        self._overall()
        self.task = self.progress.add_task(escape(f"boot {attempt} {self.label(config)}"), total=samples)

    def sample_done(self, config, index, metrics) -> None:
        if self.task is not None:
            self.progress.advance(self.task)

    def boot_finished(self, config, boot) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=escape(f"boot {boot.seq} {self.label(config)}: {_status(boot)}"
                                                               + _requests_note(boot)))
            self.task = None
        overall = self._overall()
        self._count(boot)
        self.progress.update(overall, advance=1, description=escape(self._what() + self._not_ok_text()))

    def search_started(self, name: str, budget: int | None, reference=None) -> None:
        super().search_started(name, budget, reference)
        self.overall = None
        self._overall()

    def search_step(self, text: str) -> None:
        if self.step is None:
            self.step = self.progress.add_task("", total=None)
        self.progress.update(self.step, description=escape(redact_text(text)))


class LinesObserver(_Common):
    """One line on stderr per boot and per search step, written as it happens:
    ``boot 12 (+NCCL_ALGO=Ring, #2): ok [host_busy] in 41 s; 12/40 boots``."""

    def __init__(self, console: Console, budget: int | None = None, stream=None):
        super().__init__(console, budget)
        self.stream = stream
        self._started = None

    def _line(self, text: str) -> None:
        out = self.stream if self.stream is not None else sys.stderr
        out.write(redact_text(text) + "\n")
        out.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def boot_started(self, config, attempt, samples) -> None:
        self._started = time.monotonic()

    def sample_done(self, config, index, metrics) -> None:
        return None

    def boot_finished(self, config, boot) -> None:
        took = f" in {time.monotonic() - self._started:.0f} s" if self._started is not None else ""
        self._started = None
        count = self._count(boot) + (f" of the {self.search}" if self.search else "")
        self._line(f"boot {boot.id} ({self.label(config)}, #{boot.seq}): {_status(boot)}{_requests_note(boot)}{took}; "
                   f"{count}")

    def search_step(self, text: str) -> None:
        self._line(text)
