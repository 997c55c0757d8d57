"""Flags across an engine's history: which options a commit's parser accepts.

Engines rename flags. SGLang 0.5.22 split ``--cuda-graph-max-bs`` into
``--cuda-graph-max-bs-decode`` and ``--cuda-graph-max-bs-prefill``; Python's
argparse then refuses the old spelling as an *ambiguous* prefix and exits 2
before the server does anything. A boot like that is not a crash and not noise:
the same argv fails the same way every time at that commit. Two things here:

* :func:`argparse_rejection` reads a boot log for argparse's refusal (exit 2,
  ``error: unrecognized arguments`` / ``ambiguous option`` / ``invalid choice``)
  and returns the engine's own message, so the boot is recorded as "flag not
  accepted at this commit" (:class:`~bisect_harness.errors.FlagNotAccepted`);
* :func:`help_options` and :func:`check_argv` read a commit's ``--help`` text and
  say, before any boot, which planned options that commit would refuse::

      >>> opts = help_options("  --cuda-graph-max-bs-decode N\\n  --cuda-graph-max-bs-prefill N\\n  --port PORT")
      >>> [str(p) for p in check_argv(["--port", "1", "--cuda-graph-max-bs", "8"], opts)]
      ['--cuda-graph-max-bs: ambiguous (could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill)']

:func:`check_plan_flags` runs the check for every commit of a plan (``harness run
--dry-run --check-flags``): it checks out each commit's worktree and environment,
runs its build (cached, as a boot would), then the launch argv with the preset's
help arguments, in a process group of its own with a deadline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from bisect_harness.engines.rejection import (
    ARGPARSE_EXIT, FLAG_NOT_ACCEPTED, REJECTION_MARKERS, argparse_rejection,
)
from bisect_harness.engines import recipe
from bisect_harness.engines.preset_flags import help_options, run_help, without
from bisect_harness.engines.presets import notes_for, render_argv
from bisect_harness.errors import BuildFailed

__all__ = [
    "FLAG_NOT_ACCEPTED",
    "notes_for",
    "ARGPARSE_EXIT",
    "REJECTION_MARKERS",
    "argparse_rejection",
    "help_options",
    "check_argv",
    "FlagProblem",
    "CommitFlags",
    "check_plan_flags",
    "error_lines",
]



@dataclass(frozen=True)
class FlagProblem:
    """One planned option as a commit's parser would take it. ``status``:
    ``not_accepted`` (no such option), ``ambiguous`` (a prefix of several, argparse
    refuses it), ``abbreviation`` (a prefix of exactly one: argparse takes it as
    that option, which is rarely what a file that names an old flag meant)."""

    option: str
    status: str
    candidates: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.status == "ambiguous":
            return f"{self.option}: ambiguous (could match {', '.join(self.candidates)})"
        if self.status == "abbreviation":
            return f"{self.option}: taken as an abbreviation of {self.candidates[0]}"
        return f"{self.option}: not accepted"

    @property
    def refused(self) -> bool:
        """Would the parser exit 2 on it?"""
        return self.status in ("not_accepted", "ambiguous")

    def to_dict(self) -> dict:
        return {"option": self.option, "status": self.status, "candidates": list(self.candidates)}


def check_argv(argv: Sequence[str], options: Iterable[str]) -> list[FlagProblem]:
    """The options of ``argv`` (``--x`` or ``--x=v`` elements) that ``options`` (a
    commit's help) does not name exactly, each with what argparse would make of it."""
    known = frozenset(options)
    out: list[FlagProblem] = []
    seen: set[str] = set()
    for element in argv:
        if not element.startswith("--") or element == "--":
            continue
        opt = element.split("=", 1)[0]
        if opt not in known and "." in opt and opt.split(".", 1)[0] in known:
            continue  # vLLM's --json-arg.key value: a key of a known mapping option
        if opt in known or opt in seen or opt in ("--help",) or opt.startswith("--help="):
            continue
        seen.add(opt)
        matches = tuple(sorted(o for o in known if o.startswith(opt)))
        if len(matches) > 1:
            out.append(FlagProblem(opt, "ambiguous", matches))
        elif len(matches) == 1:
            out.append(FlagProblem(opt, "abbreviation", matches))
        else:
            out.append(FlagProblem(opt, "not_accepted"))
    return out


# --------------------------------------------------------------------------- the dry run's check


@dataclass(frozen=True)
class CommitFlags:
    """One commit's help, read, and each planned config's options checked against it."""

    commit: str | None
    help_argv: tuple[str, ...]
    options: int = 0                      # how many options the help named
    error: str = ""                       # why the help could not be read (build failed, no options, ...)
    problems: Mapping[str, tuple[FlagProblem, ...]] = field(default_factory=dict)  # config key -> problems
    help_failed: bool = False             # the help argv itself could not run or named no option
    build_log: str | None = None          # the failed build's log (error is then the build's failure)
    build_errors: tuple[str, ...] = ()    # the failed build log's last error lines (its last lines if none)
    dropped: tuple[str, ...] = ()         # the preset's own options this help does not name: boots leave them out

    @property
    def help_text(self) -> str:
        """The help argv as a person would type it."""
        import shlex

        return shlex.join(self.help_argv) if self.help_argv else "(no help argv)"

    @property
    def refused(self) -> dict[str, tuple[FlagProblem, ...]]:
        return {k: tuple(p for p in ps if p.refused) for k, ps in self.problems.items()
                if any(p.refused for p in ps)}

    def to_dict(self) -> dict:
        return {"commit": self.commit, "help_argv": list(self.help_argv), "options": self.options,
                "error": self.error, "help_failed": self.help_failed, "build_log": self.build_log,
                "build_errors": list(self.build_errors), "preset_flags_dropped": list(self.dropped),
                "configs": {k: [p.to_dict() for p in ps] for k, ps in self.problems.items()}}


_ERROR_WORDS = ("error", "fatal", "undefined reference", "no rule to make target")


def error_lines(log_tail: str, n: int = 5) -> tuple[str, ...]:
    """The last ``n`` lines of a build log that say an error (a compiler's ``error:``,
    make's ``Error 2``, CMake's ``CMake Error``), or its last ``n`` lines where none does."""
    lines = [line.rstrip() for line in log_tail.splitlines()
             if line.strip() and not line.startswith("== build step ")]  # the harness's own step headers
    errors = [line for line in lines if any(w in line.lower() for w in _ERROR_WORDS)]
    return tuple((errors or lines)[-n:])


def check_plan_flags(plan, *, timeout_s: float = 300.0, say=lambda text: None) -> list[CommitFlags]:
    """For each commit of ``plan`` (once per commit; an installed server counts as one),
    read its ``--help`` through the launch argv and check every config's planned options.

    Each commit is checked out, given its environment and built as a boot would
    (the build is cached, so the boots reuse it); a commit that fails to build is
    reported with the build's message instead of options. Worktree, environment,
    placeholders, working folder and process env come from each config's boot
    request through ``boot.recipe``, as ``backends.procedure.run_boot`` gets them, so the
    help runs where and how the boots will.
    """
    preset = plan.preset
    by_commit: dict[str | None, list] = {}
    for c in plan.configs:
        by_commit.setdefault(c.arm.commit, []).append(c)
    out: list[CommitFlags] = []
    for commit, configs in by_commit.items():
        # a request per config, as the scheduler makes them (no log: nothing boots here)
        reqs = [plan.boot_request(c, boot_id=0, seq=0, log_path=Path(os.devnull)) for c in configs]
        req = reqs[0]
        help_argv: tuple[str, ...] = ()
        try:
            if req.commit is not None and req.repo is not None:
                say(f"checking flags at {commit[:12]}: worktree, environment and build")
            worktree, cenv = recipe.checkout(req)
            places = recipe.placeholders(req, port=0, worktree=worktree, python=cenv.python)
            # the help as a boot reads it: the launch without the preset's own optional options
            template = req.help_argv or (tuple(plan.spec.engine.launch) + tuple(preset.help_args))
            help_argv = tuple(render_argv(list(template), **places))
            rc, text = run_help(help_argv, env=recipe.process_env(req, cenv),
                                cwd=recipe.working_dir(req, worktree, cenv.python), timeout_s=timeout_s)
        except BuildFailed as exc:
            out.append(CommitFlags(commit, help_argv, error=str(exc), build_log=exc.log_path,
                                   build_errors=error_lines(exc.log_tail or "")))
            continue
        except OSError as exc:
            out.append(CommitFlags(commit, help_argv, error=f"could not run the help argv: {exc}",
                                   help_failed=True))
            continue
        options = help_options(text)
        if rc is None or not options:
            why = (f"ran past {timeout_s:g} s" if rc is None else
                   f"exited {rc} naming no --option")
            tail = "\n".join(text.strip().splitlines()[-5:])
            out.append(CommitFlags(commit, help_argv, error=f"the help argv {why}: {tail}", help_failed=True))
            continue
        problems, dropped = {}, set()
        for c, r in zip(configs, reqs):
            argv = render_argv(list(r.argv), **recipe.placeholders(r, port=0, worktree=worktree, python=cenv.python))
            gone = [f for f in r.preset_flags if f not in options]  # left out at boot, not refused
            dropped.update(gone)
            problems[c.key] = tuple(check_argv(without(argv, gone), options))
        out.append(CommitFlags(commit, help_argv, options=len(options), problems=problems,
                               dropped=tuple(sorted(dropped))))
    return out
