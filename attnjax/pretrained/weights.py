"""A Hugging Face model directory's files, read as files from a stranger: ``config.json``
and the weights in safetensors (``model.safetensors``, or the shards that
``model.safetensors.index.json`` lists). Pickled weights (``pytorch_model.bin``) are never
loaded: a directory with only those is refused.

Every header is read and checked before any tensor data (``read_header``): its size against
the file, each tensor's dtype among ``DTYPES``, its shape, and its byte range inside the file,
of exactly the shape's size and overlapping no other. Shards must be named inside the model
directory, relatively (never ``..`` or an absolute path, whatever the index says; a symbolic
link is followed, as a Hugging Face cache snapshot's point into its blobs), and a tensor may be
in one shard only. A tensor's data is read when a mapping asks for it
(``Weights.load``), straight from the file into float32 (bfloat16 and float16 cast
explicitly) or, for the integer buffers of old checkpoints, as saved.

References: the safetensors format (Hugging Face): an 8-byte little-endian header length, a
JSON header ``{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}``,
then the data, offsets relative to its start.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from attnjax.rundir import inside
from attnjax.userfiles import checked_size, parsing, read_json

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
HEADER_LIMIT = 100 << 20            # the largest header the safetensors library reads
WEIGHTS_LIMIT = 1 << 44             # 16 TiB: no file of weights is larger
# safetensors dtype -> the NumPy dtype of its little-endian data
DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
          "BF16": np.dtype(jnp.bfloat16), "F8_E4M3": np.dtype(jnp.float8_e4m3fn),
          "F8_E5M2": np.dtype(jnp.float8_e5m2), "I64": np.dtype("<i8"),
          "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
          "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"),
          "U8": np.dtype("u1"), "BOOL": np.dtype("?")}
FLOATS = ("F32", "F16", "BF16")     # read as float32; the others are buffers, read as saved


def read_config(directory: str | Path) -> dict:
    """``config.json`` of a model directory, or a one-line ValueError naming what is missing
    or wrong with it."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"{str(directory)!r} is not a directory (a Hugging Face model "
                         "directory: config.json and model.safetensors)")
    path = directory / "config.json"
    if not path.is_file():
        raise ValueError(f"{str(directory)!r} has no config.json")
    return read_json(path)


def weight_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a model directory (the shards its index lists, each inside the
    directory, or the single file); a directory without them is refused in one line (pickled
    ``.bin`` weights too)."""
    directory = Path(directory)
    if (directory / INDEX).is_file():
        weight_map = read_json(directory / INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{directory / INDEX} has no weight_map of tensor names to files")
        shards = sorted({inside(directory, name, f"{INDEX}: shard")
                         for name in weight_map.values()})
        missing = [path for path in shards if not path.is_file()]
        if missing:
            raise ValueError(f"{str(directory)!r}: {INDEX} lists "
                             f"{missing[0].relative_to(directory)}, which is missing")
        return shards
    if (directory / SINGLE).is_file():
        return [directory / SINGLE]
    pickled = sorted(p.name for p in directory.glob("*.bin"))
    reason = (f"has only pickled weights ({pickled[0]}), which attnjax never loads: convert "
              "them to safetensors" if pickled else "has no model.safetensors")
    raise ValueError(f"{str(directory)!r} {reason}")


class Tensor(NamedTuple):
    """Where one tensor is: its file, safetensors dtype, shape and byte offset in the file."""
    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def floating(self) -> bool:
        return self.dtype in FLOATS

    @property
    def type_name(self) -> str:
        return DTYPES[self.dtype].name


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors of the safetensors file ``path`` by name, from its header alone; a header
    that is too large, not JSON, or that describes data the file does not hold exactly
    (an unknown dtype, a shape that is not a list of sizes, a byte range outside the data, of
    another size than the shape's, or overlapping another tensor's) is one line naming the
    file and the tensor."""
    size = checked_size(path, WEIGHTS_LIMIT)
    with path.open("rb") as file:
        length = int.from_bytes(file.read(8), "little") if size >= 8 else -1
        if not 0 < length <= min(HEADER_LIMIT, size - 8):
            raise ValueError(f"{path} is not a safetensors file (its header length "
                             f"{length:,} does not fit its {size:,} bytes)")
        with parsing(path):
            header = json.loads(file.read(length).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is not a JSON object")
    data_start, data_size = 8 + length, size - 8 - length
    tensors, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ValueError(f"{where} has dtype {dtype!r}; known: {', '.join(DTYPES)}")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(shape, list) and all(_is_size(n) for n in shape)):
            raise ValueError(f"{where} has shape {shape!r}, not a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_size, offsets))
                and offsets[0] <= offsets[1] <= data_size):
            raise ValueError(f"{where} has data_offsets {offsets!r} outside the file's "
                             f"{data_size:,} bytes of data")
        nbytes = math.prod(shape) * DTYPES[entry["dtype"]].itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise ValueError(f"{where}: shape {shape} of {entry['dtype']} is {nbytes:,} bytes "
                             f"but its data_offsets span {offsets[1] - offsets[0]:,}")
        tensors[name] = Tensor(path, entry["dtype"], tuple(shape), data_start + offsets[0])
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise ValueError(f"{path}: tensors {first!r} and {second!r} overlap in the file")
    return tensors


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Weights:
    """Every tensor of a model directory by name (``headers``), its data read on ``load``; the
    files it read (``files``). A tensor in two shards is refused."""

    def __init__(self, directory: str | Path):
        self.files = weight_files(directory)
        self.headers: dict[str, Tensor] = {}
        for path in self.files:
            for name, tensor in read_header(path).items():
                if name in self.headers:
                    raise ValueError(f"tensor {name!r} is in two files, "
                                     f"{self.headers[name].path.name} and {path.name}")
                self.headers[name] = tensor

    def load(self, name: str) -> np.ndarray:
        """The data of tensor ``name``: float32 if it is floating point, else as saved."""
        tensor = self.headers[name]
        stored = DTYPES[tensor.dtype]
        dtype = np.float32 if tensor.floating else stored.newbyteorder("=")
        if math.prod(tensor.shape) == 0:                  # nothing to map
            return np.zeros(tensor.shape, dtype)
        data = np.memmap(tensor.path, stored, mode="r", offset=tensor.offset,
                         shape=(math.prod(tensor.shape),))
        return data.astype(dtype).reshape(tensor.shape)
