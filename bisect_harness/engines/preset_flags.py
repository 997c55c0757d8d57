"""A preset's own launch options against the build that runs them.

A preset's launch adds options for the harness's sake (llama.cpp's ``--metrics``
turns ``/metrics`` on). Older builds of the engine may not have one: a 2023
llama.cpp ``server`` stops with ``error: unknown argument: --metrics`` and exit 1.
Such an option is named in the preset (``Preset.optional_flags``); where the launch
is the preset's own, each boot reads the build's ``--help`` first
(:func:`adapt_launch`) and launches without the options the help does not name,
saying so (the boot's ``BootEvidence.preset_flags``). A build whose help cannot be
read keeps them, and a boot the build then refuses over one says plainly which
(:func:`refused_preset_flag`). ``harness run --dry-run --check-flags`` reads the same
help and says the same before any boot.

Also here, for the boot and the dry run's check alike: running a help argv under a
supervisor (:func:`run_help`) and reading the options it names (:func:`help_options`).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from bisect_harness.engines.presets import OPTION_NAME
from bisect_harness.process import supervised

__all__ = ["help_options", "run_help", "without", "Adapted", "adapt_launch", "refused_preset_flag"]


def help_options(help_text: str) -> frozenset[str]:
    """Every ``--option`` named in a ``--help`` text (``--x, --no-x`` gives both)."""
    return frozenset(o.rstrip(".") for o in OPTION_NAME.findall(help_text))


def run_help(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout_s: float) -> tuple[int | None, str]:
    """Run a help argv under a supervisor (its whole tree is gone on return, also on
    Ctrl-C or the harness's death), with a deadline; (exit code, stdout+stderr). The
    exit code is None when it ran past ``timeout_s``."""
    with tempfile.TemporaryFile() as out:
        try:
            code = supervised.run(list(argv), env=dict(env), cwd=cwd, stdout=out, timeout_s=timeout_s)
        except supervised.LaunchError as exc:
            return 127, f"{argv[0]}: not found or not runnable ({exc})"
        out.seek(0)
        return code, out.read().decode("utf-8", errors="replace")


def without(argv: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``argv`` with the bare options ``flags`` (options that take no value) left out."""
    drop = set(flags)
    return [a for a in argv if a not in drop]


@dataclass(frozen=True)
class Adapted:
    """A launch argv as a build takes it: ``dropped`` the preset's options its help does
    not name (left out of ``argv``), ``kept`` those it names; ``checked`` False where the
    help could not be read (``why``), and then every option is kept."""

    argv: tuple[str, ...]
    dropped: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    checked: bool = True
    why: str = ""

    def note(self) -> str:
        """One sentence for the boot's record and the person running it."""
        if not self.checked:
            return (f"the preset's {', '.join(self.kept)} kept unchecked: this build's help could not be read "
                    f"({self.why})")
        if self.dropped:
            return (f"this build's --help does not name the preset's {', '.join(self.dropped)}: launched without "
                    f"{'it' if len(self.dropped) == 1 else 'them'}")
        return f"the preset's {', '.join(self.kept)} named by this build's --help: kept"

    def to_dict(self) -> dict:
        return {"dropped": list(self.dropped), "kept": list(self.kept), "checked": self.checked, "note": self.note()}


def adapt_launch(argv: Sequence[str], optional: Sequence[str], help_argv: Sequence[str], *, env: Mapping[str, str],
                 cwd: Path, timeout_s: float = 60.0) -> Adapted:
    """``argv`` without those of the preset's ``optional`` options that the build's help
    (``help_argv``, run in ``cwd`` with ``env``) does not name."""
    present = tuple(f for f in optional if f in argv)
    if not present:
        return Adapted(tuple(argv))
    rc, text = run_help(help_argv, env=env, cwd=cwd, timeout_s=timeout_s)
    options = help_options(text)
    if rc is None or not options:
        why = f"ran past {timeout_s:g} s" if rc is None else f"`{' '.join(help_argv)}` exited {rc} naming no --option"
        return Adapted(tuple(argv), kept=present, checked=False, why=why)
    dropped = tuple(f for f in present if f not in options)
    return Adapted(tuple(without(argv, dropped)), dropped=dropped, kept=tuple(f for f in present if f in options))


def refused_preset_flag(engine_message: str, optional: Sequence[str]) -> str | None:
    """The preset's own option that an engine's refusal (its ``error:`` line) names, or None."""
    named = {o.rstrip(".,:;'\"") for o in OPTION_NAME.findall(engine_message or "")}
    return next((f for f in optional if f in named), None)
