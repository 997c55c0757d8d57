"""Kinds that register themselves: one way for every sort the harness chooses by name.

Engine presets, benchmark APIs, metric sources, contention sources, analyses,
backends and checkout modes are each a :class:`Registry`. A kind is added where it
is defined, and whatever needs the names (the spec's checks, the JSON Schema, the
CLI's help) reads them from the registry, so adding a kind is one new definition::

    PRESETS = Registry("engine preset")

    @PRESETS.add                   # or PRESETS.add(obj); named by obj.name
    class Mine: name = "mine"

    PRESETS.names()                # ("mine",), in the order they were added
                                   # (or by ``order``: Registry("x", order=attrgetter("listed")))
    PRESETS["mine"]                # a read-only mapping: no item assignment
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """Name -> kind, in the order they were added; read-only but through :meth:`add`.

    ``what`` names the sort in messages ("engine preset"); ``name_of`` reads a
    kind's name (its ``name`` attribute unless told otherwise). ``order``, when
    given, is a key the kinds are listed by instead (ties in the order added): for
    kinds found by walking a package, which arrive in the order of their files.
    """

    def __init__(self, what: str, *, name_of: Callable[[Any], str] = attrgetter("name"),
                 order: Callable[[Any], Any] | None = None) -> None:
        self.what = what
        self._name_of = name_of
        self._order = order
        self._kinds: dict[str, T] = {}

    def add(self, kind: T) -> T:
        """Make ``kind`` known by its name and return it (usable as a class decorator).
        A second kind under one name, or a kind with no name, is an error."""
        name = self._name_of(kind)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.what} needs a name, got {name!r} from {kind!r}")
        old = self._kinds.get(name)
        if old is not None and old is not kind:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._kinds[name] = kind
        return kind

    def discard(self, name: str) -> None:
        """Forget ``name`` if it is known (for a test that added a kind of its own)."""
        self._kinds.pop(name, None)

    def names(self) -> tuple[str, ...]:
        """The known names, in the order they were added (or by ``order``)."""
        if self._order is None:
            return tuple(self._kinds)
        return tuple(sorted(self._kinds, key=lambda name: self._order(self._kinds[name])))

    def __getitem__(self, name: str) -> T:
        return self._kinds[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._kinds)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self.names())})"
