"""Pretrained checkpoints: a local Hugging Face model directory as an attnjax model
(``load_pretrained``; the architectures in ``attnjax.pretrained.architectures``), and as an
attnjax run directory with its tokenizer (``import_run``)."""

from __future__ import annotations

from pathlib import Path

from attnjax.config import ModelConfig
from attnjax.pretrained.architectures import ARCHITECTURES, architecture, mapped_params
from attnjax.pretrained.weights import Weights, read_config

__all__ = ["ARCHITECTURES", "load_pretrained"]


def load_pretrained(directory: str | Path) -> tuple[ModelConfig, dict]:
    """``(model config, float32 parameters)`` of the checkpoint in ``directory``, an attnjax
    model computing what the Hugging Face model computes; anything it cannot express is
    refused in one line: what config.json says, then the tensors' names, dtypes and shapes
    from the files' headers, all before any tensor's data is read; the ties after."""
    hf = read_config(directory)
    mapping = architecture(hf)
    try:
        config = mapping.config(hf)
    except ValueError as error:      # a model attnjax's own config refuses (model.* fields)
        message = str(error)
        raise ValueError(message if message.startswith("config.json") else
                         f"config.json describes a model attnjax refuses: {message}") from None
    return config, mapped_params(mapping, Weights(directory), config)
