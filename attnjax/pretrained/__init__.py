"""Pretrained checkpoints: a local Hugging Face model directory, or a GGUF file
(``attnjax.pretrained.gguf``), as an attnjax model (``load_pretrained``; the architectures in
``attnjax.pretrained.architectures``), and as an attnjax run directory with its tokenizer
(``import_run``); and a run directory back as a Hugging Face directory
(``attnjax.pretrained.export``, through the same name tables: ``attnjax.pretrained.links``)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from attnjax.config import ModelConfig
from attnjax.data.chat import directory_chat
from attnjax.pretrained.architectures import ARCHITECTURES, architecture, mapped_params
from attnjax.pretrained.gguf import GGUFModel
from attnjax.pretrained.weights import INDEX, Weights, read_config

__all__ = ["ARCHITECTURES", "load_pretrained", "read_pretrained"]


class Source(NamedTuple):
    """A checkpoint as read: its config.json (``hf``, a GGUF file's from its metadata), its
    tensors (``weights``: ``headers`` and ``load``), every file it is read from (``files``)
    and its tokenizer: a tokenizer.json path, the text of one (a GGUF file's, rebuilt from
    its metadata), or None; and its chat template (``attnjax.data.chat``), or None."""
    hf: dict
    weights: object
    files: list[Path]
    tokenizer: Path | str | None
    chat: dict | None = None


def open_source(source: str | Path) -> Source:
    """The ``Source`` of a GGUF file or a Hugging Face model directory (headers only: no
    tensor data is read)."""
    path = Path(source)
    if path.suffix == ".gguf" and path.is_file():
        model = GGUFModel(path)
        return Source(model.hf, model, [path], model.tokenizer_json(), model.chat())
    hf = read_config(path)
    weights = Weights(path)
    tokenizer = path / "tokenizer.json"
    chat, chat_files = directory_chat(path)
    files = [path / "config.json", *weights.files,
             *[p for p in (path / INDEX, tokenizer) if p.is_file()], *chat_files]
    return Source(hf, weights, files, tokenizer if tokenizer.is_file() else None, chat)


def read_pretrained(source: str | Path) -> tuple[Source, ModelConfig, dict]:
    """``(source, model config, float32 parameters)`` of the checkpoint at ``source``, an
    attnjax model computing what the original computes; anything it cannot express is refused
    in one line: what config.json (or the GGUF metadata) says, then the tensors' names, dtypes
    and shapes from the files' headers, all before any tensor's data is read; the ties
    after."""
    opened = open_source(source)
    mapping = architecture(opened.hf)
    try:
        config = mapping.config(opened.hf)
    except ValueError as error:      # a model attnjax's own config refuses (model.* fields)
        message = str(error)
        raise ValueError(message if message.startswith("config.json") else
                         f"config.json describes a model attnjax refuses: {message}") from None
    return opened, config, mapped_params(mapping, opened.weights, config)


def load_pretrained(source: str | Path) -> tuple[ModelConfig, dict]:
    """``(model config, float32 parameters)`` of ``read_pretrained``."""
    _, config, params = read_pretrained(source)
    return config, params
