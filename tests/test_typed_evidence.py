"""The house reads evidence through its types: what issue "evidence as types" promised, held.

* No module but ``evidence.py`` picks a key out of a stored bag: a boot's provenance, a
  verdict's stats or a run's host record, by ``.get("...")`` or ``["..."]``; each is read
  through its type (``BootEvidence``, ``VerdictStats``, ``RunHost``).
* No regular expression reads a stored message: the rooms that render what the ledger
  holds (``report/``, ``cli/``) match no pattern against text; a finding is grouped by its kind.
* A function of ``decide/``, ``run/`` or ``report/`` over 80 lines says in its docstring why
  it is long ("Long because ..."), and ``journal.render`` reads in under 60.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bisect_harness

PACKAGE = Path(bisect_harness.__file__).parent
#: attribute names under which a stored bag is held, on a row or a record
BAGS = ("provenance", "stats", "host")
#: the receivers of those names that are not stored bags (a GPU's sampled stats per field)
NOT_BAGS = {"gs.stats", "self.stats", "gpu.stats", "g.stats", "summary.stats"}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        if "demo/engine" in path.as_posix():
            continue
        yield path.relative_to(PACKAGE).as_posix(), path, ast.parse(path.read_text())


def _bag(node: ast.AST, source: str) -> str | None:
    """The text of ``node`` when it is (or wraps in ``x or {}``) an attribute named as a bag."""
    if isinstance(node, ast.BoolOp) and node.values:
        node = node.values[0]
    if isinstance(node, ast.Attribute) and node.attr in BAGS:
        text = ast.get_source_segment(source, node) or ""
        return None if text in NOT_BAGS else text
    return None


def test_no_module_but_the_evidence_module_picks_keys_out_of_a_stored_bag():
    found = []
    for name, path, tree in _modules():
        if name == "evidence.py":
            continue
        source = path.read_text()
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                bag = _bag(node.func.value, source)
            elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                  and isinstance(node.slice.value, str) and isinstance(node.ctx, ast.Load)):
                bag = _bag(node.value, source)
            else:
                continue
            if bag is not None:
                found.append(f"{name}:{node.lineno}: {ast.get_source_segment(source, node)}")
    assert found == [], "\n".join(found)


def test_the_rooms_that_render_the_ledger_read_no_message_with_a_pattern():
    """``report/`` and ``cli/`` may make text with a pattern (a file name's slug), never read
    text with one."""
    readers = []
    for name, path, tree in _modules():
        if not name.startswith(("report/", "cli/")):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                    and node.func.attr in ("match", "search", "fullmatch", "findall", "finditer", "compile", "split")):
                readers.append(f"{name}:{node.lineno}: {ast.get_source_segment(path.read_text(), node)}")
    assert readers == [], readers


def test_a_long_function_of_decide_run_or_report_says_why_and_the_journal_reads_short():
    long_ = []
    for name, _path, tree in _modules():
        if not name.startswith(("decide/", "run/", "report/")):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80 and "Long because" not in (ast.get_docstring(node) or ""):
                    long_.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert long_ == [], long_
    (render,) = [n for _, path, tree in _modules() if path.name == "journal.py" for n in ast.walk(tree)
                 if isinstance(n, ast.FunctionDef) and n.name == "render"]
    assert render.end_lineno - render.lineno + 1 < 60
