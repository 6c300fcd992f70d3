"""The layers a model family stacks: feed-forward, block, the token and position embedding
helpers, head gates, and ``sown_by_layer`` (what each block sowed, in layer order). The
models themselves are in ``attnjax.models``.

References: Vaswani et al. 2017 (post-norm block); Xiong et al. 2020, "On Layer Normalization
in the Transformer Architecture" (pre-norm); Hendrycks & Gimpel 2016, "Gaussian Error Linear
Units" (GELU and its tanh approximation); Shazeer 2020, "GLU Variants Improve Transformer"
(SwiGLU).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attnjax.config import ModelConfig
from attnjax.nn import axes
from attnjax.nn.attention import Dropout, MultiHeadAttention
from attnjax.nn.points import point
from attnjax.nn.slots import make_norm
from attnjax.ops.dense import dense_dot_general
from attnjax.registry import POSITIONS

# a model's parameters with a vocabulary axis: the input embedding [vocab_size, d_model] and,
# untied, the output one [d_model, vocab_size]
VOCAB_PARAMS = ("embed", "unembed")


def knockout_gates(config: ModelConfig, head_gates=None):
    """``head_gates`` ``[num_layers, num_heads]`` with the ``attention.knockout`` heads set to
    0, or ``None`` when there are neither gates nor knocked-out heads."""
    shape = (config.num_layers, config.attention.num_heads)
    if head_gates is not None and jnp.shape(head_gates) != shape:
        raise ValueError(f"head_gates must have shape [num_layers, num_heads] = {list(shape)}, "
                         f"got {list(jnp.shape(head_gates))}")
    if not config.attention.knockout:
        return head_gates
    keep = np.ones(shape, np.float32)
    for layer, head in config.attention.knockout:
        keep[layer, head] = 0.0
    return jnp.asarray(keep) if head_gates is None else head_gates * keep


def sown_by_layer(intermediates: dict, num_layers: int) -> list[dict]:
    """What each layer sowed into ``intermediates``, in layer order: its attention module's
    ``max_logit`` (and with ``return_weights`` ``queries``, ``keys``, ``scale`` and
    ``attn_weights``) and the block's ``attn_out`` (the attention sub-layer's output, before
    dropout and the residual add) and ``residual`` (the residual stream after the block), each
    ``[B, T, d_model]``."""
    def layer(scope: dict) -> dict:
        own = {name: values for name, values in scope.items() if isinstance(values, tuple)}
        return {name: values[0] for name, values in {**scope["attention"], **own}.items()}
    return [layer(intermediates[f"block_{i}"]) for i in range(num_layers)]


def token_scale(config: ModelConfig) -> float:
    """The factor on the token embeddings: ``model.embed_scale``, or by default the position
    encoding's (sinusoidal: ``sqrt(d_model)``, as Vaswani et al. 2017 do, so tokens are not
    swamped by a sinusoid of norm ``sqrt(d_model / 2)``; the others: 1)."""
    if config.embed_scale is not None:
        return config.embed_scale
    default = POSITIONS.get(config.position.kind).token_scale
    return 1.0 if default is None else default(config)


def added_positions(module: nn.Module, pe, config: ModelConfig):
    """The absolute position embedding ``pe`` ``[B|1, T, d]`` as added to the tokens:
    ``added_scale * norm(pe)``, ``norm`` per position as ``model.position.added_norm`` says:
    ``none``; ``layer``, a LayerNorm with its own gain and bias (``position_norm``); ``unit``,
    ``pe / ||pe||`` (each position's vector of norm 1; a sinusoid's norm is sqrt(d / 2))."""
    kind = config.position.added_norm
    if kind == "layer":
        pe = make_norm(config, "position_norm", "layer")(pe)
    elif kind == "unit":
        pe = pe / jnp.linalg.norm(pe.astype(jnp.float32), axis=-1, keepdims=True).astype(pe.dtype)
    return jnp.asarray(config.position.added_scale, pe.dtype) * pe


def mlp_width(config: ModelConfig) -> int:
    """The MLP's hidden width: ``model.mlp_hidden``, or from ``mlp_ratio``: ratio * d, and for
    SwiGLU 2/3 * ratio * d rounded up to a multiple of 8 (its three matrices then hold about
    as many parameters as the GELU MLP's two)."""
    if config.mlp_hidden is not None:
        return config.mlp_hidden
    if config.mlp == "swiglu":
        return -(-int(2 * config.mlp_ratio * config.d_model / 3) // 8) * 8
    return int(config.mlp_ratio * config.d_model)


class FeedForward(nn.Module):
    """``W2 gelu(W1 x)``, GELU ``x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))`` (``gelu_exact``) or
    its tanh approximation ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` (``gelu``),
    or SwiGLU ``W2 (silu(W1 x) * W3 x)`` (``swiglu``; W1 and W3 one kernel, ``gate_up``);
    hidden width ``mlp_width``, each projection with a bias when ``model.mlp_bias``."""
    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dense = lambda features, name, kernel, bias: nn.Dense(
            features, use_bias=cfg.mlp_bias, dtype=jnp.dtype(cfg.dtype), name=name,
            dot_general=dense_dot_general, **axes.dense(kernel, bias))
        hidden = mlp_width(cfg)
        widen = (("embed", "mlp"), ("mlp",))
        if cfg.mlp == "swiglu":
            gate, up = jnp.split(dense(2 * hidden, "gate_up", *widen)(x), 2, axis=-1)
            h = nn.silu(gate) * up
        else:
            h = nn.gelu(dense(hidden, "up", *widen)(x), approximate=cfg.mlp == "gelu")
        h = axes.constrain(h, "batch", "length", "act_mlp")
        return dense(cfg.d_model, "down", ("mlp", "embed"), ("norm",))(h)


class Block(nn.Module):
    """Pre-norm ``x + f(norm(x))`` or post-norm ``norm(x + f(x))`` for each sub-layer:
    self-attention, then with ``cross_attention`` (the cross-attention's own config, e.g.
    its head count) cross-attention over ``source`` (an encoder's output;
    ``MultiHeadAttention(cross=True)``, norm ``cross_norm``), then the MLP."""
    config: ModelConfig
    cross_attention: ModelConfig | None = None

    @nn.compact
    def __call__(self, x, positions, *, deterministic=True, decode=False, return_weights=False,
                 head_gates=None, token_mask=None, source=None, source_mask=None,
                 cross_gates=None):
        cfg = self.config
        at = (lambda name, y: y) if decode else functools.partial(point, self)   # nn.points
        x = at("resid_pre", axes.constrain(x, "batch", "length", "act_embed"))
        drop = lambda y: Dropout(cfg.residual_dropout)(y, deterministic=deterministic)
        kwargs = dict(deterministic=deterministic, decode=decode, return_weights=return_weights)
        sublayers = [("attention", MultiHeadAttention(cfg, name="attention"),
                      dict(kwargs, head_gates=head_gates, token_mask=token_mask))]
        if self.cross_attention is not None:
            sublayers.append(("cross", MultiHeadAttention(self.cross_attention, cross=True,
                                                          name="cross_attention"),
                              dict(kwargs, source=source, source_mask=source_mask,
                                   head_gates=cross_gates)))
        weights = {}
        for name, attention, arguments in sublayers:
            norm = make_norm(cfg, f"{name}_norm")
            if cfg.norm_position == "pre":
                y, weights[name] = attention(norm(x), positions, **arguments)
                x = x + drop(y)
            else:
                y, weights[name] = attention(x, positions, **arguments)
                x = norm(x + drop(y))
            if name == "attention":       # the self-attention sub-layer, before the add
                self.sow("intermediates", "attn_out", y)
        x = at("resid_mid", x)
        mlp = FeedForward(cfg, name="mlp")
        if cfg.norm_position == "pre":
            x = x + drop(mlp(make_norm(cfg, "mlp_norm")(x)))
        else:
            x = make_norm(cfg, "mlp_norm")(x + drop(mlp(x)))
        x = at("resid_post", x)
        self.sow("intermediates", "residual", x)       # the residual stream after the block
        if self.cross_attention is not None:
            return x, (weights["attention"], weights["cross"])
        return x, weights["attention"]


class RecomputedBlock(Block):
    """``Block`` with its arguments positional, so that ``nn.remat`` can take the flags as
    static arguments (``REMAT_STATIC``): its activations are recomputed in the backward pass
    (``model.remat``); the same parameters, the same function."""

    def __call__(self, x, positions, deterministic, decode, return_weights, head_gates,
                 token_mask, source, source_mask, cross_gates):
        return super().__call__(x, positions, deterministic=deterministic, decode=decode,
                                return_weights=return_weights, head_gates=head_gates,
                                token_mask=token_mask, source=source, source_mask=source_mask,
                                cross_gates=cross_gates)


REMAT_STATIC = (3, 4, 5)          # RecomputedBlock's deterministic, decode, return_weights
RematBlock = nn.remat(RecomputedBlock, static_argnums=REMAT_STATIC)


def decoding_positions(module: nn.Module, tokens, decode: bool):
    """``[1, T]`` positions of ``tokens`` ``[B, T]``: ``arange(T)``, or with ``decode`` after
    the tokens already decoded (a counter ``position`` in ``module``'s ``cache``
    collection)."""
    offset = 0
    if decode:
        initialized = module.has_variable("cache", "position")
        counter = module.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
        if initialized:
            offset = counter.value
            counter.value = offset + tokens.shape[1]
    return (offset + jnp.arange(tokens.shape[1]))[None, :]


def token_embedding(config: ModelConfig, name: str = VOCAB_PARAMS[0]) -> nn.Embed:
    """The token embedding ``[vocab_size, d_model]``, entries ``N(0, embed_init_std^2)``."""
    return nn.Embed(config.vocab_size, config.d_model, name=name, embedding_init=axes.with_axes(
        nn.initializers.normal(config.embed_init_std), "vocab", "embed"))


def embed_tokens(module: nn.Module, config: ModelConfig, tokens, positions, embed=None):
    """``(x, embed)``: the token embeddings times ``token_scale`` plus the absolute position
    encoding's ``added_positions`` (for the encodings that add one), ``[B, T, d_model]``, and
    the embedding module (a tied output layer reads it; ``embed``, another stream's, is used
    instead of a new one). Called inside ``module``'s compact ``__call__``, whose parameters
    they become."""
    dtype = jnp.dtype(config.dtype)
    embed = embed or token_embedding(config)
    position = POSITIONS.get(config.position.kind)
    # the table is whole along the model width where it is looked up (on an fsdp mesh, gathered
    # first, as every FSDP parameter is), so the rows come out laid out like the tokens
    table = axes.constrain(embed.embedding, "vocab", None)
    x = jnp.take(table, tokens, axis=0).astype(dtype) * token_scale(config)
    if position.embed is not None:
        x = x + added_positions(module, position.embed(module, positions, config).astype(dtype),
                                config)
    return x, embed


def stack_blocks(config: ModelConfig, x, positions, *, head_gates=None, cross_attention=None,
                 cross_gates=None, num_layers=None, **kwargs):
    """``(x, weights)``: ``num_layers`` (default ``config.num_layers``) blocks (``block_i``,
    ``head_gates[i]`` each; ``cross_attention``: the config of a cross-attention sub-layer in
    each) and, pre-norm, the final norm; ``weights`` one entry per layer (``None`` without
    ``return_weights``; with ``cross_attention``, a pair: self, cross).
    ``kwargs``: the blocks' ``deterministic``, ``decode``, ``return_weights``, ``token_mask``
    and, with ``cross_attention``, ``source`` and ``source_mask``."""
    weights = []
    for i in range(config.num_layers if num_layers is None else num_layers):
        if cross_gates is not None:
            kwargs["cross_gates"] = cross_gates[i]
        gates = None if head_gates is None else head_gates[i]
        if config.remat:
            names = ("deterministic", "decode", "return_weights", "token_mask", "source",
                     "source_mask", "cross_gates")
            flags = {name: kwargs.get(name) for name in names}
            flags.update(deterministic=kwargs.get("deterministic", True),
                         decode=kwargs.get("decode", False),
                         return_weights=kwargs.get("return_weights", False))
            x, w = RematBlock(config, cross_attention, name=f"block_{i}")(
                x, positions, flags["deterministic"], flags["decode"], flags["return_weights"],
                gates, flags["token_mask"], flags["source"], flags["source_mask"],
                flags["cross_gates"])
        else:
            x, w = Block(config, cross_attention, name=f"block_{i}")(
                x, positions, head_gates=gates, **kwargs)
        weights.append(w)
    if config.norm_position == "pre":
        x = make_norm(config, "final_norm")(x)
    return x, tuple(weights)


class Readout(nn.Module):
    """A decoder's last steps on any residual stream ``x`` ``[..., d_model]``: the final norm
    (pre-norm) and the output layer, under the decoder's own parameter names (``final_norm``,
    ``embed``, ``unembed``), so its parameters apply: the logit lens."""
    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        if cfg.norm_position == "pre":
            x = make_norm(cfg, "final_norm")(x)
        return output_logits(cfg, token_embedding(cfg), x).astype(jnp.float32)


def output_logits(config: ModelConfig, embed: nn.Embed, x) -> jax.Array:
    """``x @ embed^T`` (``tie_embeddings``) or through an ``unembed`` of its own (no bias),
    ``[..., vocab_size]``."""
    if config.tie_embeddings:
        return embed.attend(x)
    return nn.Dense(config.vocab_size, use_bias=False, dtype=jnp.dtype(config.dtype),
                    name=VOCAB_PARAMS[1], dot_general=dense_dot_general,
                    **axes.dense(("embed", "vocab"), ("vocab",)))(x)
