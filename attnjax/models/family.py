"""What a model family declares: one ``MODELS`` registration (``attnjax.registry``), looked up
by ``model.family``. Everything above ``attnjax.models`` (training, evaluation, generation,
sweeps, analysis, benchmarks) reaches a model through ``family`` and ``build`` and never names
a model class, so a new family is its own module plus one registration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn

from attnjax.config import ModelConfig
from attnjax.registry import MODELS


class Family(NamedTuple):
    """A model family.

    - ``module``: ``ModelConfig -> flax Module`` whose ``apply(variables, inputs,
      **arguments(batch), deterministic=..., return_weights=..., head_gates=...)`` returns
      ``(logits, aux)`` (``aux["attn_weights"]``: one ``[B, heads, T, S]`` array per layer
      with ``return_weights``), and whose blocks sow what ``nn.transformer.sown_by_layer``
      reads;
    - ``arguments``: ``batch -> dict``, the module's keyword arguments a batch carries besides
      its ``inputs`` (positions and padding mask of a padded batch);
    - ``sums``: ``(logits, batch) -> {"ce", "z", "correct", "weight"}``, the weighted sums of
      the family's objective over a batch (cross-entropy, ``log^2 Z``, correct predictions,
      weight); training divides them by the global weight;
    - ``decodes``: whether ``generate`` can run it token by token with a cache;
    - ``tasks``: the data tasks it trains on (``None``: every task);
    - ``reads``: the ``model`` fields only this family reads (refused for the others).
    """
    module: Callable[[ModelConfig], nn.Module]
    arguments: Callable[[dict], dict]
    sums: Callable
    decodes: bool
    tasks: tuple[str, ...] | None = None
    reads: tuple[str, ...] = ()


def family(config: ModelConfig) -> Family:
    """The family ``config.family`` names."""
    return MODELS.get(config.family)


def build(config: ModelConfig) -> nn.Module:
    """The Flax module of ``config``'s family."""
    return family(config).module(config)
