"""The journal's short markdown, as HTML: what a sentence of the journal may carry.

The journal's views write their sentences and cells for markdown (``report.cells.md``:
one line, pipes escaped; ``**bold**`` for what must be seen, backticks around a
commit, a flag or a command). The HTML report prints the same sentences, so it
reads that much markdown and no more: the text is escaped whole first (a server's
log line or a label never becomes markup), then the escaped pipes, the code spans
and the bold spans become HTML.
"""

from __future__ import annotations

import re
from html import escape

from markupsafe import Markup

__all__ = ["inline"]

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_HELD = re.compile("\x00([0-9]+)\x00")


def inline(text) -> Markup:
    """``text`` (a journal sentence or cell) as safe HTML: escaped, then ``\\|`` as ``|``,
    ```x``` as ``<code>x</code>`` and ``**x**`` as ``<strong>x</strong>``. None reads "n/a"."""
    if text is None:
        return Markup("n/a")
    html = escape(str(text), quote=False).replace("\\|", "|")
    spans: list[str] = []

    def hold(m: re.Match) -> str:  # a code span is kept apart: a ** inside it is not bold
        spans.append(m.group(1))
        return f"\x00{len(spans) - 1}\x00"

    html = _BOLD.sub(r"<strong>\1</strong>", _CODE.sub(hold, html.replace("\x00", "")))
    return Markup(_HELD.sub(lambda m: f"<code>{spans[int(m.group(1))]}</code>", html))
