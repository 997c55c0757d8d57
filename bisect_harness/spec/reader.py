"""The YAML of hypotheses.yaml, read with the line of every key, and the checks
every section's values go through.

``_Doc(text, file)`` composes the YAML (safe loader, merge keys resolved, no other
aliases, capped in size and depth) and keeps the line each key path came from;
``_Doc.error(path, message)`` is the ``SpecError`` that names the key and its line.
``_Reader`` checks a value's shape (a mapping of known keys, a bounded number, an
argv, env and flags) and raises that error. The caps below turn hostile or
mistyped input into a clean error at once (docs/hypotheses-format.md, "Limits").
"""

from __future__ import annotations

import math
import re

import yaml

from bisect_harness.errors import SpecError
from bisect_harness.model import FlagValue

__all__ = ["effect_value", "parse_effect", "MAX_SPEC_BYTES", "MAX_NODES", "MAX_DEPTH", "MAX_MATRIX_POINTS",
           "MAX_HYPOTHESES", "MAX_SWEEP_POINTS", "MAX_COUNT", "MAX_BOOTS", "MAX_SAMPLES_PER_BOOT", "MAX_SECONDS",
           "MAX_SEED"]

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FLAG_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")

# Input limits (documented in docs/hypotheses-format.md, "Limits"). A hypotheses file is
# a few kilobytes; these caps turn hostile or mistyped input into a clean error at once.
MAX_SPEC_BYTES = 1_000_000      # the file itself
MAX_NODES = 100_000             # YAML nodes after merge keys are expanded
MAX_DEPTH = 64                  # nesting of mappings and lists
MAX_MATRIX_POINTS = 256         # one hypothesis's matrix: the product of its axes' lengths
MAX_HYPOTHESES = 1_000          # the whole file, after matrix and sweep expansion
MAX_SWEEP_POINTS = 32           # one sweep's points (a product of axes: computed before expanding)
#: upper bounds of numbers; a value above is an error that names the key and the cap
MAX_COUNT = 1_000_000           # requests, tokens, concurrency, seeds-free counts
MAX_BOOTS = 1_000               # boots_per_arm, max_boots_per_arm, boot_retries
MAX_SAMPLES_PER_BOOT = 10_000
MAX_SECONDS = 7 * 24 * 3600.0   # timeouts and waits: one week
MAX_SEED = 2**63 - 1


# --------------------------------------------------------------------------- YAML with lines


class _Doc:
    """The parsed YAML plus the line of every key path, for error messages."""

    def __init__(self, text: str, file: str):
        self.file = file
        self.lines: dict[str, int] = {}
        if len(text) > MAX_SPEC_BYTES:
            raise SpecError(f"the file has {len(text)} characters, above the cap of {MAX_SPEC_BYTES}; "
                            "a hypotheses file is a few kilobytes (see docs/hypotheses-format.md, Limits)",
                            file=file)
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise SpecError(f"not valid YAML: {getattr(exc, 'problem', exc)}",
                            line=mark.line + 1 if mark else None, file=file) from None
        except RecursionError:
            raise SpecError(f"nested too deeply (the cap is {MAX_DEPTH} levels)", file=file) from None
        if node is None:
            raise SpecError("the file is empty; see docs/hypotheses-format.md", file=file)
        _check_aliases(node, file)
        try:
            self.data = self._convert(node, "")
        except SpecError as exc:
            if exc.file is not None:
                raise
            raise SpecError(exc.message, key=exc.key, line=exc.line, file=file) from None

    def _convert(self, node, path: str):
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            _flatten_merges(node)
            out: dict = {}
            for key_node, value_node in node.value:
                key = self._convert(key_node, path + ".<key>")
                if not isinstance(key, (str, int, float, bool)):
                    raise SpecError("a mapping key must be a plain scalar",
                                    key=path or None, line=key_node.start_mark.line + 1, file=self.file)
                key = str(key)
                sub = f"{path}.{key}" if path else key
                if key in out:
                    raise SpecError("duplicate key", key=sub, line=key_node.start_mark.line + 1,
                                    file=self.file)
                self.lines[sub] = key_node.start_mark.line + 1
                out[key] = self._convert(value_node, sub)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._convert(v, f"{path}[{i}]") for i, v in enumerate(node.value)]
        return _scalar(node)

    def line(self, path: str) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path)
        return None

    def error(self, path: str, message: str) -> SpecError:
        return SpecError(message, key=path or None, line=self.line(path), file=self.file)


def _check_aliases(root, file: str) -> None:
    """Refuse aliases other than merge keys, alias cycles, deep nesting and expansion bombs.

    PyYAML's composer shares one node object between an anchor and each of its
    aliases, so an alias is a node met a second time. Only the value of a merge key
    (``<<: *defaults``) may be one; its expanded size still counts toward ``MAX_NODES``,
    so a billion-laughs file built from merge keys is refused before anything expands.
    """
    sizes: dict[int, int] = {}   # node id -> expanded node count (done)
    open_: set[int] = set()      # node ids on the current path (a cycle if met again)
    seen: set[int] = set()

    def where(node) -> int:
        return node.start_mark.line + 1

    def size(node, depth: int, via_merge: bool, at: int) -> int:
        """``at``: the line where the node is used (an alias's node carries its anchor's line)."""
        nid = id(node)
        if nid in open_:
            raise SpecError("an alias refers to a node that contains it (a cycle); remove the alias",
                            line=at, file=file)
        if nid in sizes:
            if not via_merge:
                raise SpecError("YAML aliases (*name) are accepted only as the value of a merge key "
                                "('<<: *name'); write the value out, or merge a mapping", line=at,
                                file=file)
            return sizes[nid]
        if nid in seen and not via_merge:
            raise SpecError("YAML aliases (*name) are accepted only as the value of a merge key "
                            "('<<: *name')", line=at, file=file)
        seen.add(nid)
        if depth > MAX_DEPTH:
            raise SpecError(f"nested too deeply (the cap is {MAX_DEPTH} levels)", line=where(node), file=file)
        open_.add(nid)
        total = 1
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                merge = key_node.tag == "tag:yaml.org,2002:merge"
                total += size(key_node, depth + 1, False, where(key_node))
                if merge and isinstance(value_node, yaml.SequenceNode):
                    total += 1
                    for sub in value_node.value:
                        total += size(sub, depth + 2, True, where(key_node))
                else:
                    total += size(value_node, depth + 1, merge, where(key_node))
                if total > MAX_NODES:
                    break
        elif isinstance(node, yaml.SequenceNode):
            for sub in node.value:
                total += size(sub, depth + 1, False, where(node))
                if total > MAX_NODES:
                    break
        open_.discard(nid)
        if total > MAX_NODES:
            raise SpecError(f"the file expands to more than {MAX_NODES} YAML nodes (merge keys included); "
                            "a hypotheses file is far smaller: look for a merge key repeated inside "
                            "another", line=where(node), file=file)
        sizes[nid] = total
        return total

    size(root, 0, False, where(root))


def _flatten_merges(node: yaml.MappingNode) -> None:
    """Resolve YAML merge keys (``<<: *defaults``) in place, as PyYAML's loader does."""
    loader = yaml.SafeLoader("")
    try:
        loader.flatten_mapping(node)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        raise SpecError(f"bad merge key: {exc.problem}", line=mark.line + 1 if mark else None) from None
    finally:
        loader.dispose()


def _scalar(node: yaml.ScalarNode):
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as exc:  # an unknown tag (!!python/object) or a malformed !!binary
        raise SpecError(f"cannot read this value: {getattr(exc, 'problem', None) or exc}",
                        line=node.start_mark.line + 1) from None
    except (ValueError, TypeError, OverflowError) as exc:  # an explicit tag that does not fit: !!int abc
        raise SpecError(f"cannot read this value as {node.tag.rsplit(':', 1)[-1]}: {exc}",
                        line=node.start_mark.line + 1) from None
    finally:
        loader.dispose()


# --------------------------------------------------------------------------- validation helpers


class _Reader:
    def __init__(self, doc: _Doc):
        self.doc = doc

    def mapping(self, value, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.doc.error(path, f"expected a mapping, got {_typename(value)}")
        for key in value:
            if key not in allowed:
                hint = _closest(key, allowed)
                raise self.doc.error(
                    f"{path}.{key}" if path else key,
                    f"unknown key{f'; did you mean {hint!r}' if hint else ''}. "
                    f"Allowed here: {', '.join(allowed)}")
        for key in required:
            if key not in value:
                raise self.doc.error(path, f"missing required key '{key}'")
        return value

    def typed(self, value, path: str, types: tuple[type, ...], what: str):
        if isinstance(value, bool) and bool not in types:
            raise self.doc.error(path, f"expected {what}, got a boolean")
        if not isinstance(value, types):
            raise self.doc.error(path, f"expected {what}, got {_typename(value)}")
        return value

    def positive_int(self, value, path: str, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
        self.typed(value, path, (int,), "an integer")
        if value < minimum:
            raise self.doc.error(path, f"must be >= {minimum}, got {value}")
        if value > maximum:
            raise self.doc.error(path, f"must be <= {maximum}, got {value} (see docs/hypotheses-format.md, Limits)")
        return value

    def number(self, value, path: str, what: str = "a number", maximum: float = MAX_SECONDS,
               positive: bool = False) -> float:
        """A finite number in [0, maximum] (or (0, maximum] when ``positive``)."""
        self.typed(value, path, (int, float), what)
        if not math.isfinite(value):
            raise self.doc.error(path, f"must be a finite number, got {value}")
        if value < 0 or (positive and value == 0):
            raise self.doc.error(path, f"must be {'positive' if positive else 'not negative'}, got {value}")
        if value > maximum:
            raise self.doc.error(path, f"must be <= {maximum:g}, got {value:g} (see docs/hypotheses-format.md, Limits)")
        return float(value)

    def argv(self, value, path: str) -> tuple[str, ...]:
        """An argv list. A plain string is split like a command line (shlex), never run by a shell."""
        import shlex

        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                raise self.doc.error(path, f"cannot split into arguments: {exc}") from None
        if not isinstance(value, list) or not value:
            raise self.doc.error(path, "expected a non-empty list of arguments")
        out = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise self.doc.error(f"{path}[{i}]", f"expected a string argument, got {_typename(item)}")
            out.append(_no_nul(self.doc, str(item), f"{path}[{i}]"))
        return tuple(out)

    def steps(self, value, path: str) -> tuple[tuple[str, ...], ...]:
        """A build: one argv (a string or a list of strings), or a list of argvs run in
        order (each a list of strings, or a string split like a command line)."""
        if isinstance(value, list) and value and any(isinstance(v, list) for v in value):
            for i, item in enumerate(value):
                if not isinstance(item, (list, str)):
                    raise self.doc.error(f"{path}[{i}]", "a build of several steps is a list of argvs: make every "
                                         f"item a list of arguments, e.g. [cmake, --build, build], got {_typename(item)}")
            return tuple(self.argv(item, f"{path}[{i}]") for i, item in enumerate(value))
        return (self.argv(value, path),)

    def env(self, value, path: str) -> dict[str, str]:
        if value is None:
            return {}
        self.typed(value, path, (dict,), "a mapping of environment variables")
        out = {}
        for name, v in value.items():
            if not _ENV_NAME_RE.match(name):
                raise self.doc.error(f"{path}.{name}", "not a valid environment variable name")
            if v is None or isinstance(v, (dict, list)):
                raise self.doc.error(f"{path}.{name}",
                                     f"an environment value must be a string or number, got {_typename(v)}")
            out[name] = _no_nul(self.doc, _env_str(v), f"{path}.{name}")
        return out

    def flags(self, value, path: str) -> dict[str, FlagValue]:
        if value is None:
            return {}
        self.typed(value, path, (dict,), "a mapping of server flags")
        out = {}
        for name, v in value.items():
            _check_flag_name(self.doc, name, f"{path}.{name}")
            _no_nul_inside(self.doc, v, f"{path}.{name}")
            out[name] = v
        return out


def _no_nul(doc: "_Doc", text: str, path: str) -> str:
    """``text``, refused where it holds a NUL byte: no process argument or environment
    value can carry one (the launch would fail on every boot)."""
    if "\0" in text:
        raise doc.error(path, "holds a NUL byte (\\0), which no process argument or environment value can "
                        "carry; remove it")
    return text


def _no_nul_inside(doc: "_Doc", value, path: str) -> None:
    if isinstance(value, str):
        _no_nul(doc, value, path)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _no_nul_inside(doc, item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, item in value.items():
            _no_nul_inside(doc, str(k), f"{path}.{k}")
            _no_nul_inside(doc, item, f"{path}.{k}")


def _check_flag_name(doc: "_Doc", name: str, path: str) -> None:
    if name.startswith("-"):
        raise doc.error(path, "write flag names without leading dashes "
                        f"(e.g. '{name.lstrip('-')}')")
    if not _FLAG_NAME_RE.match(name):
        raise doc.error(path, "not a valid flag name: letters, digits, '_', '.' or '-', starting with a "
                        "letter or digit (e.g. 'max-num-seqs')")


def _env_str(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _typename(v) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "an integer", float: "a number",
            bool: "a boolean", type(None): "nothing (null)"}.get(type(v), type(v).__name__)


def _closest(word: str, options) -> str | None:
    import difflib

    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return match[0] if match else None


def effect_value(value) -> float:
    """``10%``, ``"10 %"``, ``0.1`` -> 0.1, in (0, 1); a ValueError that says what is
    expected otherwise. The one reader of a relative effect: the spec's
    ``min_effect`` and the CLI's ``--min-effect`` both use it."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", value)
        if not m:
            raise ValueError(f"expected a fraction like 0.1 or a percentage like '10%', got {value!r}")
        number = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise ValueError(f"expected a fraction like 0.1 or a percentage like '10%', got {_typename(value)}")
    if not 0.0 < number < 1.0:
        raise ValueError(f"must be a relative effect between 0 and 1 (0% and 100%), got {value!r}")
    return number


def parse_effect(value, path: str, doc: _Doc) -> float:
    """``10%``, ``"10 %"``, ``0.1`` -> 0.1. Must lie in (0, 1)."""
    if isinstance(value, str) and not value.strip().endswith("%"):
        raise doc.error(path, f"expected a fraction like 0.1 or a percentage like '10%', got {value!r}")
    try:
        return effect_value(value)
    except ValueError as exc:
        raise doc.error(path, str(exc)) from None
