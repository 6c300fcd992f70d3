"""Name -> implementation tables for the swappable parts: attention kernels, position
encodings, the attention module's slots (qk-norm, scale policy, sink, dropout placement),
data tasks and sweep launchers.

A registry is a small ordered dict with one job: look a name up, and if it is not there, say
which names are. Entries register themselves in the module that defines them (the registry's
``provider``); the registry imports that module the first time it is read, so a config can be
validated without anyone having imported the implementations first. Adding a variant is one
function plus one ``register`` call; the registry-wide tests pick it up with no edits.
"""

from __future__ import annotations

import importlib


class Registry[T]:
    """Ordered mapping from names to entries, with errors that list the valid choices."""

    def __init__(self, kind: str, provider: str):
        self.kind = kind
        self.provider = provider        # the module whose import registers the entries
        self._entries: dict[str, T] = {}
        self._loaded = False

    def _load(self):
        if not self._loaded:
            self._loaded = True
            importlib.import_module(self.provider)

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def get(self, name: str, field: str | None = None) -> T:
        """The entry for ``name``; if absent, a one-line ValueError naming ``field`` and the
        valid choices."""
        self._load()
        if name not in self._entries:
            where = f"{field}=" if field else f"{self.kind} "
            raise ValueError(f"{where}{name!r} is not a known {self.kind}; "
                             f"valid choices: {', '.join(self._entries)}")
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        self._load()
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def items(self):
        self._load()
        return self._entries.items()


KERNELS: Registry = Registry("attention kernel", "attnjax.ops")
POSITIONS: Registry = Registry("position encoding", "attnjax.nn.positions")
QK_NORMS: Registry = Registry("qk-norm", "attnjax.nn.slots")
SCALES: Registry = Registry("scale policy", "attnjax.nn.slots")
SINKS: Registry = Registry("attention sink", "attnjax.nn.slots")
DROPOUTS: Registry = Registry("dropout placement", "attnjax.nn.slots")
INITS: Registry = Registry("initializer", "attnjax.nn.slots")
REGULARIZERS: Registry = Registry("attention regularizer", "attnjax.train.regularizers")
TASKS: Registry = Registry("data task", "attnjax.data")
LAUNCHERS: Registry = Registry("sweep launcher", "attnjax.sweep.launch")
MODELS: Registry = Registry("model family", "attnjax.models")
