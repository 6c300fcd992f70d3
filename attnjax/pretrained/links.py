"""The name table between a Hugging Face checkpoint and an attnjax parameter tree, read one way
by the import (``read_links``) and the other by the export (``write_links``), so the two are
inverse by construction: each architecture (``attnjax.pretrained.architectures``) lists its
tensors once, as ``Link`` rows.

A ``Link`` relates checkpoint tensors (names, under the table's prefix unless ``prefixed`` is
False) to parameters (paths, ``block_0/attention/query/kernel``) through a ``Codec``: ``read``
turns the tensors into the parameters, ``write`` the parameters back into the tensors, each
the other's inverse exactly (transposes, reshapes, splits and concatenations: no arithmetic).
Torch ``Linear`` weights are ``[out, in]`` (``y = x W^T``); attnjax's kernels are ``[in,
...]`` with heads as axes: queries ``[d, N, H]``, the output projection ``[N, H, d]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from attnjax.pretrained.tensors import Checkpoint, Tensors


class Codec(NamedTuple):
    """``read``: the link's tensors (a list, in its order) -> its parameters (a list);
    ``write``: the parameters -> the tensors."""
    read: Callable[[list], list]
    write: Callable[[list], list]


def one_to_one(read: Callable, write: Callable) -> Codec:
    """The codec of one tensor and one parameter."""
    return Codec(lambda tensors: [read(*tensors)], lambda params: [write(*params)])


SAME = one_to_one(lambda x: x, lambda x: x)
# a torch Linear's weight [out, in] <-> a Flax Dense kernel [in, out]
TRANSPOSED = one_to_one(lambda w: w.T, lambda kernel: kernel.T)
# SwiGLU's gate and up projections, two torch Linears [h, d] (or their biases [h]) <-> the one
# kernel [d, 2h] (bias [2h]) attnjax computes both with, gate first
GATE_UP = Codec(lambda tensors: [np.concatenate([x.T for x in tensors], axis=-1)],
                lambda params: [x.T for x in np.split(params[0], 2, axis=-1)])


def heads_in(heads: int) -> Codec:
    """A torch ``Linear`` weight ``[heads H, d]`` <-> an attnjax kernel ``[d, heads, H]``."""
    return one_to_one(lambda w: w.T.reshape(w.shape[1], heads, -1),
                      lambda kernel: kernel.reshape(kernel.shape[0], -1).T)


def heads_out(heads: int) -> Codec:
    """A torch output projection ``[d, heads H]`` <-> an attnjax kernel ``[heads, H, d]``."""
    return one_to_one(lambda w: w.T.reshape(heads, -1, w.shape[0]),
                      lambda kernel: kernel.reshape(-1, kernel.shape[-1]).T)


def by_head(heads: int) -> Codec:
    """A tensor whose first axis is ``heads H`` (a projection's bias ``[heads H]``, GPT-2's
    Conv1D output projection ``[heads H, d]``) <-> the parameter with that axis as ``[heads,
    H]``."""
    return one_to_one(lambda x: x.reshape(heads, -1, *x.shape[1:]),
                      lambda p: p.reshape(-1, *p.shape[2:]))


def thirds(heads: int) -> Codec:
    """GPT-2's fused ``c_attn``, a Conv1D weight ``[d, 3 heads H]`` (``x @ W``) or its bias
    ``[3 heads H]`` <-> the query, key and value parameters ``[(d,) heads, H]``."""
    return Codec(
        lambda tensors: [x.reshape(*x.shape[:-1], heads, -1)
                         for x in np.split(tensors[0], 3, axis=-1)],
        lambda params: [np.concatenate([p.reshape(*p.shape[:-2], -1) for p in params],
                                       axis=-1)])


class Link(NamedTuple):
    """One row of a name table (the module docstring). ``absent``: the shape of the zeros an
    import reads where the checkpoint lacks the tensor (Qwen2's output-projection bias);
    ``written=False``: an export leaves the tensor out, which is exact only while the
    parameters are zero (``write_links`` refuses them otherwise); ``tied``: the tensor, where
    a checkpoint saves it, is a copy of the parameter (an output layer tied to the
    embedding): checked on import, never written; ``legacy``: a norm's, also read under its
    old name (``gamma``, ``beta``)."""
    hf: tuple[str, ...]
    params: tuple[str, ...]
    codec: Codec = SAME
    prefixed: bool = True
    absent: tuple[int, ...] | None = None
    written: bool = True
    tied: bool = False
    legacy: bool = False


class Table(NamedTuple):
    """An architecture's ``links`` for one model config; ``prefix``: the prefix an export
    writes before the prefixed names; ``prefixes``: those an import tries (the first its
    checkpoint's names use; none: no prefix); ``skip``: parts of names an import leaves
    unread (buffers, heads it does not map)."""
    links: list[Link]
    prefix: str = ""
    prefixes: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()


def norm_links(name: str, path: str, bias: bool = True, prefixed: bool = True) -> list[Link]:
    """A norm's links: ``name.weight`` -> ``path/scale`` (and ``name.bias`` ->
    ``path/bias``)."""
    return [Link((f"{name}.{tensor}",), (f"{path}/{param}",), prefixed=prefixed, legacy=True)
            for tensor, param in (("weight", "scale"), ("bias", "bias"))[:2 if bias else 1]]


def read_links(table: Table, checkpoint: Checkpoint) -> dict:
    """The parameter tree ``table`` reads from ``checkpoint``'s tensors (under the first of
    its ``prefixes`` they use); every tensor must be read or skipped."""
    tensors, flat = Tensors(checkpoint, table.prefixes, table.skip), {}
    for link in table.links:
        names = [tensors.legacy(n, link.prefixed) if link.legacy else n for n in link.hf]
        if link.tied:
            tensors.tied(names[0], flat[link.params[0]], link.prefixed)
        elif link.absent is not None and not all(tensors.has(n, link.prefixed) for n in names):
            flat.update((path, np.zeros(link.absent, np.float32)) for path in link.params)
        else:
            values = link.codec.read([tensors(n, link.prefixed) for n in names])
            flat.update(zip(link.params, values, strict=True))
    tensors.check_all_read()
    return unflatten_dict(flat, sep="/")


class UnwrittenError(ValueError):
    """Parameters that an architecture's checkpoint has no tensor for (one line)."""


def write_links(table: Table, params: dict, kind: str) -> dict[str, np.ndarray]:
    """The checkpoint tensors of ``params`` (a tree of arrays) under ``table``'s names, each a
    C-contiguous float32 array: ``read_links`` of them gives ``params`` back bit for bit.
    A parameter no link writes, and a non-zero one whose link is left out, are refused in one
    line naming it and ``kind`` (the architecture)."""
    flat = {path: np.asarray(value) for path, value in flatten_dict(params, sep="/").items()}
    missing = sorted({p for link in table.links for p in link.params} - flat.keys())
    if missing:
        raise UnwrittenError(f"the model has no parameter {missing[0]}, which {kind} needs")
    out, used = {}, set()
    for link in table.links:
        values = [flat[path] for path in link.params]
        used.update(link.params)
        prefix = table.prefix if link.prefixed else ""
        if link.tied:
            continue
        if not link.written:
            nonzero = [path for path, value in zip(link.params, values) if np.any(value)]
            if nonzero:
                raise UnwrittenError(f"parameter {nonzero[0]} is not zero, but {kind} has no "
                                     f"tensor {prefix + link.hf[0]!r} to hold it")
            continue
        for name, array in zip(link.hf, link.codec.write(values), strict=True):
            out[prefix + name] = np.ascontiguousarray(array, np.float32)
    rest = sorted(flat.keys() - used)
    if rest:
        raise UnwrittenError(f"parameter {rest[0]} has no tensor in {kind}'s checkpoint")
    return out
