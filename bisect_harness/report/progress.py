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

from bisect_harness.secrets import redact_text

__all__ = ["boot_budget", "BarsObserver", "LinesObserver", "observer_for"]


def boot_budget(plan) -> int | None:
    """Every config booted up to ``defaults.max_boots_per_arm`` times (configs shared by
    hypotheses are booted once per round for all of them), plus an A/A check's boots.
    None when the plan does not say (the bar then shows boots done without a total)."""
    try:
        per_config = int(plan.spec.defaults.max_boots_per_arm)
        n = len(plan.configs) * per_config
        if plan.spec.defaults.aa_check:
            n += len({h.baseline.key for h in plan.hypotheses}) * per_config
        return n
    except (AttributeError, TypeError, ValueError):
        return None


def observer_for(console: Console, budget: int | None = None):
    """Bars where the console is a terminal, plain lines on stderr where it is not."""
    return BarsObserver(console, budget) if console.is_terminal else LinesObserver(console, budget)


def _status(boot) -> str:
    return boot.status + (f" [{', '.join(boot.marks)}]" if boot.marks else "")


def _requests_note(boot) -> str:
    """`` (2 tries sent again, 1 request failed in samples 1, 3)``: the boot's failed
    requests (``provenance["request_retries"]["samples"]``), or ""."""
    per = ((getattr(boot, "provenance", None) or {}).get("request_retries") or {}).get("samples") or {}
    retried = sum(v.get("retries", 0) for v in per.values())
    failed = sum(v.get("failed", 0) for v in per.values())
    said = ([f"{retried} {'try' if retried == 1 else 'tries'} sent again"] if retried else []) + (
        [f"{failed} request{'' if failed == 1 else 's'} failed"] if failed else [])
    if not said:
        return ""
    return f" ({', '.join(said)} in sample{'' if len(per) == 1 else 's'} {', '.join(sorted(per, key=int))})"


class _Common:
    """What both observers do alike: the run's start, verdicts and messages on the console."""

    def __init__(self, console: Console, budget: int | None = None):
        self.console = console
        self.budget = budget
        self.search: str | None = None  # the search the boots count for (a run's bisection, say); None: the command's

    def run_started(self, run, plan) -> None:
        self.console.print(f"run {run.id}: {len(plan.hypotheses)} hypotheses, {len(plan.configs)} configs", markup=False)
        self.budget = boot_budget(plan)

    def search_started(self, name: str, budget: int | None) -> None:
        """A search (a bisection, an explanation) starts: its boots count against its own
        budget from here on (a run's planned boots say nothing of a follow-up search's)."""
        self.search, self.budget = name, budget

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

    def _overall(self):
        if self.overall is None:
            self.overall = self.progress.add_task("boots done / budget", total=self.budget)
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
        self.task = self.progress.add_task(escape(f"boot {attempt} {config.label[:60]}"), total=samples)

    def sample_done(self, config, index, metrics) -> None:
        if self.task is not None:
            self.progress.advance(self.task)

    def boot_finished(self, config, boot) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=escape(f"boot {boot.seq} {config.label[:48]}: {_status(boot)}"
                                                               + _requests_note(boot)))
            self.task = None
        overall = self._overall()
        self.progress.advance(overall)
        task = next(t for t in self.progress.tasks if t.id == overall)
        if task.total is not None and task.completed > task.total:  # retries past the budget
            self.progress.update(overall, total=task.completed)

    def search_started(self, name: str, budget: int | None) -> None:
        super().search_started(name, budget)
        self.overall = self.progress.add_task(escape(f"{name}: boots done / budget"), total=budget)

    def search_step(self, text: str) -> None:
        if self.step is None:
            self.step = self.progress.add_task("", total=None)
        self.progress.update(self.step, description=escape(redact_text(text)))


class LinesObserver(_Common):
    """One line on stderr per boot and per search step, written as it happens:
    ``boot 12 (HEAD~3 NCCL_ALGO=Ring, #2): ok [host_busy] in 41 s; 12/40 boots``."""

    def __init__(self, console: Console, budget: int | None = None, stream=None):
        super().__init__(console, budget)
        self.stream = stream
        self.done = 0
        self._search_from = 0  # boots done when the search started
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
        self.done += 1
        took = f" in {time.monotonic() - self._started:.0f} s" if self._started is not None else ""
        self._started = None
        budget = f"/{self.budget}" if self.budget else ""
        n = self.done - self._search_from if self.search else self.done
        count = f"{n}{budget} boot{'' if n == 1 and not budget else 's'}" + (f" of the {self.search}" if self.search else "")
        self._line(f"boot {boot.id} ({config.label[:60]}, #{boot.seq}): {_status(boot)}{_requests_note(boot)}{took}; "
                   f"{count}")

    def search_started(self, name: str, budget: int | None) -> None:
        super().search_started(name, budget)
        self._search_from = self.done

    def search_step(self, text: str) -> None:
        self._line(text)
