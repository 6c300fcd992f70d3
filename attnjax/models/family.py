"""What a model family declares: one ``MODELS`` registration (``attnjax.registry``), looked up
by ``model.family``. Everything above ``attnjax.models`` (training, evaluation, generation,
sweeps, analysis, benchmarks) reaches a model through ``family`` and ``build`` and never names
a model class, so a new family is its own module plus one registration.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.traverse_util import flatten_dict

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
    - ``objective``: ``ModelConfig -> str``, what the model trains (``next_token``, ``mlm``,
      ``classification``): it trains the data tasks of that objective
      (``attnjax.data.task.Task.objective``);
    - ``reads``: the ``model`` fields only this family reads (refused for the others);
    - ``causal``: whether its self-attention is causal (``ModelConfig.causal``: then also as
      ``attention.causal`` says) or bidirectional;
    - ``marked``: ``DataConfig -> {name: token id}``, the special tokens whose attention the
      training diagnostics log per layer (``attn_<name>/L{l}``);
    - ``check``: ``ModelConfig -> None``, or a one-line ValueError naming a field the family
      cannot honour;
    - ``scores``: ``(logits, aux, batch) -> sums`` of evaluation metrics beyond loss and
      accuracy, from a forward pass with ``return_weights`` (``aux`` the module's), or None;
      ``ratios``: ``(metric, numerator, denominator)`` triples of those sums, a numerator of more
      than one entry reported by its best entry (e.g. the best head);
    - ``head_groups``: ``ModelConfig -> {group: (layers, heads)}``, heads besides the
      self-attention's ``head_gates`` cover (an encoder–decoder's ``cross``), gated through the
      module's ``group_gates={group: [layers, heads]}``.
    """
    module: Callable[[ModelConfig], nn.Module]
    arguments: Callable[[dict], dict]
    sums: Callable
    decodes: bool
    objective: Callable[[ModelConfig], str] = lambda config: "next_token"
    reads: tuple[str, ...] = ()
    causal: bool = True
    check: Callable[[ModelConfig], None] = lambda config: None
    marked: Callable[[object], dict] = lambda data: {}
    scores: Callable | None = None
    ratios: tuple[tuple[str, str, str], ...] = ()
    head_groups: Callable[[ModelConfig], dict] = lambda config: {}


def scored_sums(logits: jax.Array, batch: dict) -> dict:
    """Weighted sums over a batch's scored predictions, ``logits`` ``[..., V]`` against
    ``targets`` ``[...]`` with ``weights`` ``[...]`` (0 where not scored): cross-entropy,
    ``log^2 Z``, correct predictions, weight. The next tokens of a decoder, the masked tokens
    of an encoder, or one label per example."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, batch["targets"][..., None], -1)[..., 0]
    w = batch["weights"]
    return {"ce": ((logz - target_logit) * w).sum(), "z": (logz**2 * w).sum(),
            "correct": ((jnp.argmax(logits, -1) == batch["targets"]) * w).sum(), "weight": w.sum()}


def mean_pool(hidden, token_mask=None):
    """``[B, d]``: the mean of ``hidden`` ``[B, T, d]`` over the real tokens (``token_mask``
    ``[B, T]``, default all): a sentence embedding, as sentence-transformers pools."""
    real = (jnp.ones(hidden.shape[:2], bool) if token_mask is None
            else jnp.asarray(token_mask, bool))
    weights = real.astype(hidden.dtype) / real.sum(-1, keepdims=True).astype(hidden.dtype)
    return jnp.einsum("bt,btd->bd", weights, hidden)


def family(config: ModelConfig) -> Family:
    """The family ``config.family`` names."""
    return MODELS.get(config.family)


def build(config: ModelConfig) -> nn.Module:
    """The Flax module of ``config``'s family."""
    return family(config).module(config)


@functools.lru_cache(maxsize=32)
def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter of ``config``'s model by its path (``block_0/mlp/up/
    kernel``), from ``jax.eval_shape`` of its initialisation: nothing is allocated."""
    model = build(config)
    tree = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
    return {path: tuple(leaf.shape)
            for path, leaf in flatten_dict(tree["params"], sep="/").items()}


def check_same_parameters(config: ModelConfig, changed: ModelConfig, overrides) -> None:
    """Refuse, in one line naming ``overrides``, a ``changed`` model config whose parameters
    differ in name or shape from those of ``config``, the model a checkpoint holds."""
    if changed == config:
        return
    old, new = parameter_shapes(config), parameter_shapes(changed)
    if old != new:
        name = next(n for n in sorted(old.keys() | new.keys()) if old.get(n) != new.get(n))
        raise ValueError(f"{' '.join(overrides)} change the model's parameters ({name}: "
                         f"{old.get(name, 'absent')} in the checkpoint, "
                         f"{new.get(name, 'absent')} after them): the checkpoint's model is "
                         "kept, so only overrides that keep every parameter's shape apply")
