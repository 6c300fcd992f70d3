"""A checkpoint's tensors as an import's name table reads them (``attnjax.pretrained.links``):
``Checkpoint`` hands out a tensor's data, or before any data is read a ``Placeholder`` of its
shape; ``Tensors`` takes them by name under the checkpoint's prefix, refusing a missing or
non-floating tensor, a saved copy of a tied one that differs, and tensors nobody took."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from attnjax.pretrained.weights import DTYPES, FLOATS

# old checkpoints' names of a norm's scale and shift (``LayerNorm.gamma`` / ``.beta``)
LEGACY = {".weight": ".gamma", ".bias": ".beta"}


class CheckpointError(ValueError):
    """A checkpoint's tensors that a mapping refuses (missing, unread, of a dtype it does not
    read, a tie that does not hold)."""


class Placeholder(np.ndarray):
    """A tensor's shape without its data (a zero-strided array of float32 zeros) that
    remembers the tensor it stands for (``source``) through views, reshapes and splits: a
    mapping run on placeholders gives every parameter's shape before any data is read."""

    source: str | None = None

    def __array_finalize__(self, obj):
        self.source = getattr(obj, "source", None)

    def __array_function__(self, func, types, args, kwargs):
        """``np.concatenate`` of placeholders is the placeholder of the joined shape (nothing
        allocated), standing for all of their tensors."""
        if func is not np.concatenate:
            return super().__array_function__(func, types, args, kwargs)
        arrays, axis = args[0], kwargs.get("axis", args[1] if len(args) > 1 else 0)
        shapes = [a.shape for a in arrays]
        if any(not -len(shape) <= axis < len(shape) for shape in shapes):
            raise ValueError(f"cannot concatenate shapes {shapes} on axis {axis}")
        rests = [list(shape) for shape in shapes]
        joined = sum(rest.pop(axis) for rest in rests)
        if any(rest != rests[0] for rest in rests):
            raise ValueError(f"cannot concatenate shapes {shapes} on axis {axis}")
        shape = rests[0]
        shape.insert(axis % (len(shape) + 1), joined)
        return placeholder(" + ".join(str(getattr(a, "source", "?")) for a in arrays),
                           tuple(shape))


def placeholder(name: str, shape: tuple[int, ...]) -> Placeholder:
    array = np.broadcast_to(np.float32(0), shape).view(Placeholder)
    array.source = name
    return array


class Checkpoint:
    """A checkpoint's tensors (``headers``: name -> a header with ``shape``, ``floating`` and
    ``type_name``: ``weights.Tensor``, ``gguf.GGUFTensor``) and how a mapping gets one: its
    data (``load(name)``), or without ``load`` a ``placeholder`` of its shape; ``last`` is the
    name of the tensor asked for last."""

    def __init__(self, headers: dict, load: Callable[[str], np.ndarray] | None = None):
        self.headers, self.load, self.last = headers, load, None

    @property
    def read(self) -> bool:
        return self.load is not None

    def get(self, name: str) -> np.ndarray:
        self.last = name
        return (self.load(name) if self.read
                else placeholder(name, self.headers[name].shape))


class Tensors:
    """A checkpoint's tensors by name, under the first of ``prefixes`` its names use (``bert.``
    when saved from a model with a head); a tensor taken must be floating point;
    ``check_all_read`` refuses a checkpoint with tensors nobody took (but those whose names
    contain one of ``skip``: buffers and unused parts)."""

    def __init__(self, checkpoint: Checkpoint, prefixes=(), skip=()):
        names = checkpoint.headers
        self.prefix = next((p for p in prefixes if any(k.startswith(p) for k in names)), "")
        self.checkpoint, self.skip, self.taken = checkpoint, tuple(skip), set()

    def __call__(self, name: str, prefixed: bool = True) -> np.ndarray:
        key = self.prefix + name if prefixed else name
        tensor = self.checkpoint.headers.get(key)
        if tensor is None:
            raise CheckpointError(f"the checkpoint has no tensor {key!r}")
        if not tensor.floating:
            raise CheckpointError(f"tensor {key!r} is {tensor.type_name}; supported: "
                                  f"{', '.join(DTYPES[name].name for name in FLOATS)}")
        self.taken.add(key)
        return self.checkpoint.get(key)

    def has(self, name: str, prefixed: bool = True) -> bool:
        return (self.prefix + name if prefixed else name) in self.checkpoint.headers

    def legacy(self, name: str, prefixed: bool = True) -> str:
        """``name`` of a norm's scale or shift, or its old name (``gamma`` / ``beta``) where
        the checkpoint has that one instead."""
        for new, old in LEGACY.items():
            if (name.endswith(new) and not self.has(name, prefixed)
                    and self.has(name[:-len(new)] + old, prefixed)):
                return name[:-len(new)] + old
        return name

    def tied(self, name: str, embedding: np.ndarray, prefixed: bool = False) -> None:
        """A saved copy (``name``) of an output layer tied to ``embedding`` must equal it (in
        shape, and in value once the data is read)."""
        if not self.has(name, prefixed):
            return
        saved = self(name, prefixed)
        if saved.shape != embedding.shape or (self.checkpoint.read
                                              and not np.array_equal(saved, embedding)):
            raise CheckpointError(f"the checkpoint's {name!r} differs from the embedding it is "
                                  "tied to")

    def check_all_read(self) -> None:
        rest = sorted(k for k in self.checkpoint.headers
                      if k not in self.taken and not any(s in k for s in self.skip))
        if rest:
            raise CheckpointError(f"the checkpoint has {len(rest)} tensor(s) this mapping "
                                  f"does not read, e.g. {rest[0]!r}: an architecture variant "
                                  "attnjax does not express")
