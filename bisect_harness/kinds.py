"""Kinds that register themselves: one way for every sort the harness chooses by name.

Engine presets, benchmark APIs, metric sources, contention sources, analyses,
backends and checkout modes are each a :class:`Registry`. A kind is added where it
is defined, and whatever needs the names (the spec's checks, the JSON Schema, the
CLI's help) reads them from the registry, so adding a kind is one new definition::

    PRESETS = Registry("engine preset")

    @PRESETS.add                   # or PRESETS.add(obj); named by obj.name
    class Mine: name = "mine"

    PRESETS.names()                # ("mine",), in the order they were added
    PRESETS["mine"]                # a read-only mapping: no item assignment

Kinds defined across the modules of a package (backends: one module each) are
found by ``load``: a function the registry runs once, before it is first read,
that imports those modules (each adds its kind as it is imported). Such a
registry keeps its kinds in name order, as the modules may be imported in any,
unless ``order`` gives the key they are listed by (analyses: the order their
names are offered in, robust first).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Name -> kind, in the order they were added; read-only but through :meth:`add`.

    ``what`` names the sort in messages ("engine preset"); ``name_of`` reads a
    kind's name (its ``name`` attribute unless told otherwise); ``load``, when
    given, runs once before the registry is first read, and the kinds are then in
    name order (see the module doc); ``order``, when given, is the key the kinds
    are listed by instead (ties in the order added).
    """

    def __init__(self, what: str, *, name_of: Callable[[Any], str] = attrgetter("name"),
                 load: Callable[[], None] | None = None, order: Callable[[Any], Any] | None = None) -> None:
        self.what = what
        self._name_of = name_of
        self._load = load
        self._order = order if order is not None else (name_of if load is not None else None)
        self._found: dict[str, T] = {}

    @property
    def _kinds(self) -> dict[str, T]:
        """The kinds, after ``load`` has run (once; a read while it runs sees those added so far)."""
        load, self._load = self._load, None
        if load is not None:
            load()
        return self._found

    def add(self, kind: T) -> T:
        """Make ``kind`` known by its name and return it (usable as a class decorator).
        A second kind under one name, or a kind with no name, is an error."""
        name = self._name_of(kind)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.what} needs a name, got {name!r} from {kind!r}")
        old = self._found.get(name)
        if old is not None and old is not kind:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._found[name] = kind
        if self._order is not None:
            self._found = dict(sorted(self._found.items(), key=lambda item: self._order(item[1])))
        return kind

    def discard(self, name: str) -> None:
        """Forget ``name`` if it is known (for a test that added a kind of its own)."""
        self._found.pop(name, None)

    def names(self) -> tuple[str, ...]:
        """The known names, in the order they were added (by name where found by ``load``,
        by ``order`` where given)."""
        return tuple(self._kinds)

    def in_words(self, say: Callable[[T], str] | None = None) -> str:
        """The kinds as a sentence says them, "a, b or c"; each as ``say(kind)`` has it
        (its name unless told otherwise), for help and messages."""
        said = [say(kind) if say else name for name, kind in self._kinds.items()]
        return " or ".join([", ".join(said[:-1]), said[-1]]) if len(said) > 1 else "".join(said)

    def __getitem__(self, name: str) -> T:
        return self._kinds[name]

    def __contains__(self, name: object) -> bool:
        # a value read from YAML may be a list or a mapping: not a kind's name, never an error
        return isinstance(name, str) and name in self._kinds

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._kinds)})"
