"""A boot whose argv the engine's parser refused: how its log reads, and its mark.

Python's argparse refuses an unknown or ambiguous option with exit status 2 and
an ``error:`` line before the server does anything (llama.cpp's own parser, exit 1
and ``error: unknown argument: --x``, now ``error: invalid argument: --x``); the same argv fails the same
way every time at that commit, so such a boot is a recipe failure ("flag not
accepted at this commit"), never noise. The server wrapper reads the log with
:func:`argparse_rejection`; ``plan/flag_check`` checks argvs against a
commit's ``--help`` before any boot.
"""

from __future__ import annotations

import re

__all__ = ["FLAG_NOT_ACCEPTED", "ARGPARSE_EXIT", "REJECTION_EXITS", "REJECTION_MARKERS", "argparse_rejection"]

#: The boot mark (and verdict/journal word) of a boot whose argv the commit's parser refused.
FLAG_NOT_ACCEPTED = "flag_not_accepted"
#: argparse's exit status on a usage error (``parser.error``).
ARGPARSE_EXIT = 2
#: The phrases of argparse's usage errors that mean "this commit does not take this argv",
#: and llama.cpp's own parser's (2023: "error: unknown argument: --metrics"; now "error: invalid
#: argument: --x"; exit 1 both).
REJECTION_MARKERS = ("unrecognized arguments", "ambiguous option", "invalid choice", "unknown argument",
                     "invalid argument")
#: The exit statuses of a parser's refusal: argparse's 2, llama.cpp's 1.
REJECTION_EXITS = (ARGPARSE_EXIT, 1)

_ERROR_LINE = re.compile(r"^(?:[\w.\-/ ]*: )?error: (?P<msg>.*)$")


def argparse_rejection(log_text: str) -> str | None:
    """The engine's own argparse error line when ``log_text`` shows its parser
    refused the argv (the last such line), or None.

    >>> argparse_rejection("usage: serve.py [-h]\\nserve.py: error: unrecognized arguments: --batch 4\\n")
    'serve.py: error: unrecognized arguments: --batch 4'
    >>> argparse_rejection("error: unknown argument: --metrics\\nusage: ./server [options]\\n")
    'error: unknown argument: --metrics'
    """
    found = None
    for line in log_text.splitlines():
        text = line.strip()
        m = _ERROR_LINE.match(text)
        if m and any(marker in m.group("msg") for marker in REJECTION_MARKERS):
            found = text
    return found
