"""No function of the package takes more than 8 parameters, the typer commands aside.

A long signature is a set of options that wants to be a value (``SearchOptions``,
``BisectRequest``, ``NightlyOptions``, ``ExplainOptions``, ``MeasureSetup``). The typer
commands are the exception: each option of the command line is one parameter of its
function, which is how typer reads them. ``self`` and ``cls`` do not count.

``WAITING`` names the functions of other rooms that are still over: each entry must
still exist and still be over (so the list only shrinks), and nothing else may be.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bisect_harness
from bisect_harness.cli import app

PACKAGE = Path(bisect_harness.__file__).parent
MAX_PARAMETERS = 8

#: (module, qualified name) -> parameters: over the limit, in rooms whose change is under way
WAITING = {
    ("bisect_harness.decide.evaluate", "evaluate"): 9,
    ("bisect_harness.decide.simulate", "simulate"): 10,
    ("bisect_harness.engines.server", "ServerProcess.__init__"): 13,
    ("bisect_harness.measure.sources.collector", "SourceCollector.__init__"): 11,
    ("bisect_harness.run.executor", "Executor.__init__"): 11,
}


def _commands(group) -> set[tuple[str, str]]:
    """(module, qualified name) of every command function registered on ``group`` and its subgroups."""
    out = {(c.callback.__module__, c.callback.__qualname__) for c in group.registered_commands}
    for sub in group.registered_groups:
        out |= _commands(sub.typer_instance)
    return out


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def _functions(tree: ast.Module):
    """(qualified name, node) of every function in ``tree``, methods and nested ones included."""
    stack = [("", node) for node in tree.body]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            stack += [(f"{prefix}{node.name}.<locals>.", child) for child in node.body]
        elif isinstance(node, ast.ClassDef):
            stack += [(f"{prefix}{node.name}.", child) for child in node.body]
        else:
            stack += [(prefix, child) for child in ast.iter_child_nodes(node)
                      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.Try))]


def _over() -> dict[tuple[str, str], int]:
    commands = _commands(app)
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for name, fn in _functions(ast.parse(path.read_text(), str(path))):
            n = _parameters(fn)
            if n > MAX_PARAMETERS and (module, name) not in commands:
                out[(module, name)] = n
    return out


def test_the_typer_commands_are_found():
    commands = _commands(app)
    assert ("bisect_harness.cli.measuring", "bisect") in commands
    assert ("bisect_harness.cli.reading", "ledger_list") in commands  # a command of a group


def test_no_signature_over_eight_parameters_outside_the_typer_commands():
    over = _over()
    new = {k: n for k, n in over.items() if k not in WAITING}
    assert not new, ("these take more than 8 parameters: make their options a frozen value "
                     f"(as SearchOptions, MeasureSetup): {new}")
    fixed = sorted(set(WAITING) - set(over))
    assert not fixed, f"these are no longer over 8 parameters: take them out of WAITING: {fixed}"


def test_the_count_sees_a_long_signature():
    src = "class K:\n    def m(self, a, b, c, d, e, f, g, h, *, i=1): ...\ndef f(a, *args, **kw): ...\n"
    found = dict((name, _parameters(fn)) for name, fn in _functions(ast.parse(src)))
    assert found == {"K.m": 9, "f": 3}
