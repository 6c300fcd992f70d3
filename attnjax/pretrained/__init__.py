"""Pretrained checkpoints: a local Hugging Face model directory as an attnjax model
(``load_pretrained``; the architectures in ``attnjax.pretrained.architectures``), and as an
attnjax run directory with its tokenizer (``import_run``)."""

from __future__ import annotations

from pathlib import Path

from attnjax.config import ModelConfig
from attnjax.pretrained.architectures import ARCHITECTURES, architecture, as_tree
from attnjax.pretrained.weights import read_config, read_weights

__all__ = ["ARCHITECTURES", "load_pretrained"]


def load_pretrained(directory: str | Path) -> tuple[ModelConfig, dict]:
    """``(model config, float32 parameters)`` of the checkpoint in ``directory``, an attnjax
    model computing what the Hugging Face model computes; anything it cannot express is
    refused in one line (what config.json says, before any weight is read; the tensors'
    names, shapes and ties after)."""
    hf = read_config(directory)
    mapping = architecture(hf)
    config = mapping.config(hf)
    return config, as_tree(mapping.params(read_weights(directory), config))
