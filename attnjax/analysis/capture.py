"""Probe inputs and the attention probabilities a model assigns on them.

A probe is either text (its UTF-8 bytes, or its ids under the run's ``data.tokenizer``,
cut to the probe's length, which is said on stderr)
or batch ``0`` of the validation split of the run's own data, so two checkpoints of the same
data see the same probe; ``probe_examples`` adds the targets and their weights.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.config import Config
from attnjax.config.fields import LENGTH
from attnjax.data import load_dataset
from attnjax.data.encoder import FRAMED_TASKS, encoder_specials
from attnjax.data.tokenizer import load_tokenizer
from attnjax.models import family
from attnjax.models.probe import capture, stream_cosines, stream_weights


def probe_examples(config: Config, *, text: str | None = None, batch_size: int = 4,
                   length: int | None = None, seed: int = 0,
                   named: str = "--text") -> dict[str, np.ndarray]:
    """A probe as a batch ``{"inputs", "targets", "weights", ...}`` ``[B, T]``: the tokens of
    ``text`` (``text_tokens``; ``B = 1``, cut to ``length`` tokens, default ``data.length``,
    and the cut said on stderr naming ``named``), each predicting the next token (the last
    one is not scored), or for a masked-language model ``[CLS] text
    [SEP]`` with nothing masked; or the first ``batch_size`` validation examples of the run's
    data for ``seed`` (``T = length``), with whatever else its batches hold (a padded batch's
    positions and token mask, segment ids: ``model_arguments``)."""
    limit = "data.length" if length is None else "the probe length"
    length = length or config.data.length
    if text is not None:
        return _text_probe(config, text, length, named, limit)
    batch = load_dataset(config.data).batch(seed, 0, batch_size, length, "val")
    return {name: np.asarray(value) for name, value in batch.items()}


def text_tokens(config: Config, text: str, named: str = "--text") -> np.ndarray:
    """The tokens of ``text`` as a probe reads them, uncut: the ids of ``data.tokenizer``
    with its special tokens, else the UTF-8 bytes, framed ``[CLS] ... [SEP]`` for a
    masked-language model; a run that does not read text is refused naming ``named``."""
    data = config.data
    if data.task not in ("text", *FRAMED_TASKS):
        raise ValueError(f"{named} needs a text model; this run's data.task is {data.task!r} "
                         "(use --batch)")
    if data.tokenizer is not None:             # with the special tokens its template adds
        return load_tokenizer(data.tokenizer).encode(text)
    tokens = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
    if data.task in FRAMED_TASKS:
        specials = encoder_specials(data)
        tokens = np.concatenate([[specials.cls], tokens, [specials.sep]])
    return tokens


def _text_probe(config: Config, text: str, length: int, named: str,
                limit: str) -> dict[str, np.ndarray]:
    data = config.data
    tokens = text_tokens(config, text, named)
    if tokens.size > length:
        print(f"attnjax: {named} is {tokens.size} tokens; cut to the first {length} ({limit})",
              file=sys.stderr)
        framed = data.task in FRAMED_TASKS and data.tokenizer is None
        tokens = np.append(tokens[:length - 1], tokens[-1]) if framed else tokens[:length]
    if data.task in FRAMED_TASKS:
        return {"inputs": tokens[None, :], "targets": tokens[None, :],
                "weights": np.zeros((1, tokens.size), np.float32),
                "segment_ids": np.zeros((1, tokens.size), np.int32)}
    if tokens.size < 2:
        raise ValueError(f"{named} must be at least 2 tokens long, got {tokens.size}")
    weights = np.ones(tokens.size, np.float32)
    weights[-1] = 0.0
    return {"inputs": tokens[None, :], "targets": np.append(tokens[1:], 0)[None, :],
            "weights": weights[None, :]}


def check_probe_length(config: Config, length: int, named: str = "--length") -> None:
    """Refuse, in one line naming ``named``, a probe ``length`` the model cannot take: past
    ``model.max_length`` where its position encoding refuses longer inputs (a learned table
    without interpolation), else past ``fields.LENGTH``."""
    model = config.model
    if length > LENGTH:
        raise ValueError(f"{named} must be at most {LENGTH}, got {length}")
    model.check_lengths((min(length, model.max_length),))   # what it refuses at any length
    try:
        model.check_lengths((length,))
    except ValueError:                          # refused only past max_length: its positions
        raise ValueError(f"{named} must be at most {model.max_length} (model.max_length: "
                         f"model.position.kind={model.position.kind!r} has no positions past "
                         f"it), got {length}") from None


def model_arguments(config: Config, probe: dict) -> dict:
    """The model's keyword arguments of a probe (its family's ``arguments``)."""
    return family(config.model).arguments(probe)


def probe_batch(config: Config, *, text: str | None = None, batch_size: int = 4,
                length: int | None = None, seed: int = 0) -> np.ndarray:
    """Token ids ``[B, T]``: the ``inputs`` of ``probe_examples``."""
    return probe_examples(config, text=text, batch_size=batch_size, length=length,
                          seed=seed)["inputs"]


def attention_weights(config: Config, params, tokens, arguments=None) -> np.ndarray:
    """Attention probabilities of every layer, ``[layers, B, heads, T, T]`` (float32; row i is
    query i's distribution over keys, zero where it sees none, as above the diagonal of a
    causal model); ``arguments``: ``model_arguments`` of a probe."""
    return np.asarray(_compiled_weights(config.model)(params, jnp.asarray(tokens),
                                                      arguments or {}), np.float32)


@functools.lru_cache(maxsize=16)
def _compiled_weights(model_config):
    return jax.jit(lambda p, t, a: capture(model_config, p, t, a)[0])


def stream_attention(config: Config, params, tokens, arguments=None) -> dict[str, np.ndarray]:
    """``models.probe.stream_weights`` of a probe: an encoder–decoder's ``cross`` (target
    queries over source keys) and ``encoder`` weights, stream -> ``[layers, B, heads, T, S]``;
    empty for the other families."""
    out = _compiled_streams(config.model)(params, jnp.asarray(tokens), arguments or {})
    return {name: np.asarray(value, np.float32) for name, value in out.items()}


@functools.lru_cache(maxsize=16)
def _compiled_streams(model_config):
    return jax.jit(functools.partial(stream_weights, model_config))


def layer_cosines(config: Config, params, tokens, arguments=None) -> dict[str, np.ndarray]:
    """Per layer, the mean pairwise cosine across positions (``ops.stats.mean_pairwise_cosine``)
    of the attention sub-layer outputs (``attn_out``) and of the residual stream after the
    block (``residual``), name -> ``[layers]`` float64."""
    out = _compiled_cosines(config.model)(params, jnp.asarray(tokens), arguments or {})
    return {name: np.asarray(value, np.float64) for name, value in out.items()}


@functools.lru_cache(maxsize=16)
def _compiled_cosines(model_config):
    return jax.jit(functools.partial(stream_cosines, model_config))
