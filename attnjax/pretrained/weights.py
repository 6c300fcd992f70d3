"""A Hugging Face model directory's files: ``config.json`` and the weights in safetensors
(``model.safetensors``, or shards listed by ``model.safetensors.index.json``), the floating
tensors read as float32 NumPy arrays (bfloat16 and float16 cast explicitly), the others (old
checkpoints' integer buffers) as saved. Pickled weights (``pytorch_model.bin``) are never
loaded: a directory with only those is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import safe_open

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOATS = ("float32", "float16", "bfloat16")


def read_config(directory: str | Path) -> dict:
    """``config.json`` of a model directory, or a one-line ValueError naming what is missing."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{str(directory)!r} is not a directory (a Hugging Face model "
                         "directory: config.json and model.safetensors)")
    path = directory / "config.json"
    if not path.is_file():
        raise ValueError(f"{str(directory)!r} has no config.json")
    return json.loads(path.read_text())


def weight_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a model directory (the shards its index lists, or the single
    file); a directory without them is refused in one line (pickled ``.bin`` weights too)."""
    directory = Path(directory)
    if (directory / INDEX).is_file():
        shards = sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))
        missing = [name for name in shards if not (directory / name).is_file()]
        if missing:
            raise ValueError(f"{str(directory)!r}: {INDEX} lists {missing[0]}, which is missing")
        return [directory / name for name in shards]
    if (directory / SINGLE).is_file():
        return [directory / SINGLE]
    pickled = sorted(p.name for p in directory.glob("*.bin"))
    reason = (f"has only pickled weights ({pickled[0]}), which attnjax never loads: convert "
              "them to safetensors" if pickled else "has no model.safetensors")
    raise ValueError(f"{str(directory)!r} {reason}")


def read_weights(directory: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the model directory by name: float32 if it is one of ``FLOATS``, else
    as saved (a mapping refuses such a tensor if it reads it)."""
    tensors = {}
    for path in weight_files(directory):
        with safe_open(path, framework="numpy") as f:
            for name in f.keys():
                array = f.get_tensor(name)
                tensors[name] = (np.asarray(array, np.float32) if array.dtype.name in FLOATS
                                 else array)
    return tensors
