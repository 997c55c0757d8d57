"""The journal's short markdown, as HTML: what a sentence of the journal may carry.

The journal's views write their sentences and cells for markdown (``report.cells.md``:
one line, pipes escaped; ``**bold**`` for what must be seen, backticks around a
commit, a flag or a command). The HTML report prints the same sentences, so it
renders that much markdown and no more, with markdown-it-py's CommonMark inline
rules (the parser rich already brings): code spans, emphasis and backslash escapes
only, raw HTML off, so a server's log line or a label never becomes markup.
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from markupsafe import Markup

__all__ = ["inline"]

_INLINE = MarkdownIt("zero").enable(["backticks", "emphasis", "escape"])


def inline(text) -> Markup:
    """``text`` (a journal sentence or cell) as safe HTML: escaped, ``\\|`` as ``|``,
    ```x``` as ``<code>x</code>`` and ``**x**`` as ``<strong>x</strong>``. None reads "n/a"."""
    if text is None:
        return Markup("n/a")
    return Markup(_INLINE.renderInline(str(text)))
