"""Name -> implementation tables for the swappable slots (attention kernels, position encodings).

A registry is a small ordered dict with one job: look a name up, and if it is not there, say
which names are. Entries register themselves where they are defined, so adding a variant is
one function plus one ``register`` call; the registry-wide tests pick it up with no edits.
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Ordered mapping from names to entries, with errors that list the valid choices."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def get(self, name: str, field: str | None = None) -> T:
        """The entry for ``name``; a one-line ValueError naming ``field`` and the choices if absent."""
        if name not in self._entries:
            where = f"{field}=" if field else f"{self.kind} "
            raise ValueError(f"{where}{name!r} is not a known {self.kind}; "
                             f"valid choices: {', '.join(self._entries)}")
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def items(self):
        return self._entries.items()


KERNELS: Registry = Registry("attention kernel")
POSITIONS: Registry = Registry("position encoding")
