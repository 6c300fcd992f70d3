"""MultiHeadAttention: parameters for the fixed slots, all math in ``attnjax.ops``.

Slots, in order (each set by one config field and resolved from a registry; none aware of
the others, see ``attnjax.nn.slots``):
1. projections (fused qkv, separate, or one matmul per head; ``num_kv_heads`` for GQA/MQA;
   ``head_dim`` H of queries and keys, ``value_head_dim`` D of values)
2. q/k transform: ``qk_norm`` (``QK_NORMS``), then the position encoding's ``rotate`` hook
3. score bias: the position encoding's ``bias`` hook (ALiBi, T5); masks (causal, window)
4. kernel: ``kernel`` (``KERNELS``), with its own settings (e.g. ``block_q``)
5. score shaping: ``scale`` (``SCALES``), ``logit_soft_cap``, ``sink`` (``SINKS``)
6. probability dropout and 7. output dropout: ``dropout`` (``DROPOUTS``), then the output
   projection (``output_projection``: dense, none, frozen)

``int8`` simulates int8 projections (``attnjax.ops.quantize``): every q, k, v and o weight
rounded per output channel, and with ``weights_inputs`` each projection's input per example.

``attnjax.nn.layouts.convert_projections`` re-lays the q, k, v parameters out between the
fused, separate and per-head layouts (the same function, so layouts compare at equal weights).

References: Vaswani et al. 2017, "Attention Is All You Need" (multi-head attention, W_o).
"""

from __future__ import annotations

import functools
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attnjax.config import ModelConfig
from attnjax.config.kernel import cross_arguments, kernel_request, score_arguments
from attnjax.nn.slots import (head_init, kernel_settings, padding_arguments, probability_dropout,
                              projection_init, visible_keys)
from attnjax.ops import dot_product_attention
from attnjax.ops.attention import rate_active
from attnjax.ops.dense import dense_dot_general
from attnjax.ops.quantize import int8_dot_general
from attnjax.ops.stats import masked_max_logit
from attnjax.nn import axes
from attnjax.nn.points import KERNEL_POINTS, point, touched
from attnjax.registry import DROPOUTS, KERNELS, POSITIONS, QK_NORMS, SCALES, SINKS


class Dropout(nn.Module):
    """Inverted dropout ``where(keep, x / (1 - rate), 0)``, ``keep ~ Bernoulli(1 - rate)``.

    ``flax.linen.Dropout`` with the same masks for the same rng, except that ``rate`` may be
    traced (a hyperparameter a vmapped sweep varies), so it never branches on its value.
    """
    rate: float

    @nn.compact
    def __call__(self, x, deterministic: bool):
        if deterministic or not rate_active(self.rate):
            return x
        keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.rate, x.shape)
        return jax.lax.select(keep, (x / (1.0 - self.rate)).astype(x.dtype), jnp.zeros_like(x))


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention, causal or bidirectional as ``ModelConfig.causal`` says, or
    with ``cross=True`` cross-attention.

    Call with ``x`` ``[B, T, d_model]`` and ``positions`` ``[B|1, T]``.

    Cross-attention: queries from ``x``, keys and values from ``source`` ``[B, S, d_model]``
    (an encoder's output) through projections of their own (``query``, ``key``, ``value``;
    ``fused_qkv`` does not apply), every real source token visible to every query: no causal
    mask, window or position encoding (RoPE, ALiBi and T5 buckets relate two positions of one
    sequence; the absolute encodings are in the embeddings of each stream). ``source_mask``
    ``[B, S]`` (True at real tokens) hides the source's pads. With ``decode=True`` the keys
    and values are a static cache (collection ``cache``: ``cross_key``, ``cross_value``,
    ``source_mask``) written by the call that passes ``source`` and read by the later calls,
    which pass none; ``x`` may then hold ``R`` rows (beams) per source, which share that
    cache. Kernels, qk-norm, scale, soft-cap, sink and dropout apply as in self-attention;
    what a kernel cannot do is refused by ``kernel_request(..., cross=True)``.

    Self-attention with ``decode=True``: the keys and values are appended to a cache of
    ``max_length`` entries (collection ``cache``: ``cached_key``, ``cached_value``, ``index``;
    named apart from the ``key`` and ``value`` projections of the separate layout) and the
    queries attend to everything cached so far. With ``return_weights=True`` the
    probabilities ``[B, N, T, S]`` are returned and sown as ``intermediates/attn_weights``;
    kernels that cannot return them (chunked, xla) are swapped for ``reference`` for that call,
    which computes the same function. When applied with ``mutable=["intermediates"]`` it also
    sows ``max_logit`` ``[N]`` (``ops.stats.masked_max_logit`` over the visible pairs) for
    diagnostics, and with ``return_weights`` as well the queries and keys that meet in the
    scores (after qk-norm and the ``rotate`` hook) as ``queries`` ``[B, T, N, H]`` and
    ``keys`` ``[B, T, K, H]``, and the logit scale of every head as ``scale`` ``[N]``.

    Decoding appends to a cache of ``max_length`` entries: a call with more tokens than that is
    refused, and a step that would write past the end returns NaN (a cache cannot hold it;
    ``attnjax.generate.sample`` refuses such a request up front).

    ``head_gates`` ``[N]`` (optional) multiplies head h's output ``[B, T, N, D]`` by
    ``head_gates[h]`` before the output projection: 0 knocks the head out, and the gradient
    with respect to the gates is the head importance of Michel et al. 2019. ``None`` leaves
    the computation untouched.

    The output projection maps the heads ``o`` ``[B, T, N, D]`` to ``[B, T, d_model]``:
    ``dense``: ``sum_{n,e} o[n, e] W_o[n, e, :]`` with a trained ``out`` kernel ``[N, D,
    d_model]`` (and bias with ``use_bias``); ``none``: the concatenation ``concat_n o[n]``
    itself (``N D = d_model``; no ``out`` parameter, so the heads are not mixed before the
    residual); ``frozen``: ``concat_n o[n] @ W`` with ``W`` the fixed orthogonal matrix of
    ``frozen_projection``, no bias.
    """
    config: ModelConfig
    cross: bool = False

    @nn.compact
    def __call__(self, x, positions, *, source=None, source_mask=None,
                 deterministic: bool = True, decode: bool = False, return_weights: bool = False,
                 head_gates=None, token_mask=None):
        cfg, att = self.config, self.config.attention
        if self.cross:
            kernel, _ = kernel_request(cfg, decode=decode, return_weights=return_weights,
                                       padded=decode or source_mask is not None, cross=True)
            q, k, v, extra, visible = self._cross_streams(x, source, source_mask, decode)
            if not decode:
                q, k, v = self._points(q, k, v)
            bias, scores, fits = None, cross_arguments(cfg), None
        else:
            kernel, _ = kernel_request(cfg, decode=decode, return_weights=return_weights,
                                       padded=token_mask is not None)
            q, k, v = self._project(x)
            q, k = QK_NORMS.get(att.qk_norm).apply(self, q, k, att, jnp.dtype(cfg.dtype))
            position = POSITIONS.get(cfg.position.kind)
            if position.rotate is not None:
                q, k = position.rotate(q, k, positions, positions, cfg)
            if not decode:
                q, k, v = self._points(q, k, v)
            extra, fits = self._update_cache(k, v, positions) if decode else ({}, None)
            k, v = extra.pop("key", k), extra.pop("value", v)
            if token_mask is not None:
                extra.update(padding_arguments(att, positions, token_mask))
            bias = position.bias(self, cfg) if position.bias is not None else None
            scores = score_arguments(cfg)
            visible = None if decode else visible_keys(cfg, q.shape[1], token_mask)
        scale = SCALES.get(att.scale).scale(self, att, cfg.head_dim)
        if self.is_mutable_collection("intermediates") and not decode:
            self._sow_diagnostics(q, k, scale, return_weights, visible)
        inside = {}
        if not decode and touched(self, KERNEL_POINTS):      # scores and probabilities
            if not KERNELS.get(kernel).exact:
                raise ValueError(f"model.attention.kernel={kernel!r} computes no softmax "
                                 f"scores or probabilities: points {', '.join(KERNEL_POINTS)} "
                                 "cannot be captured or patched")
            kernel, inside = "reference", {"point": functools.partial(point, self)}
        result = dot_product_attention(
            q, k, v, bias, scale=scale, **scores,
            sink=SINKS.get(att.sink).logit(self, att),
            **probability_dropout(self, att, deterministic), return_weights=return_weights,
            implementation=kernel, **kernel_settings(att, kernel), **inside, **extra)
        out, weights = result if return_weights else (result, None)
        if self.cross:
            out, weights = unfold_beams(out, weights, x.shape[0])
        if not decode:
            out = point(self, "z", out)
        if return_weights:
            self.sow("intermediates", "attn_weights", weights)
        if fits is not None:     # a step past the cache's end: never a silently wrong answer
            out = jnp.where(fits, out, jnp.nan).astype(out.dtype)
        if head_gates is not None:
            out = out * jnp.asarray(head_gates)[:, None].astype(out.dtype)
        out = self._output_projection(out)
        if DROPOUTS.get(att.dropout).on_output:
            out = Dropout(att.dropout_rate)(out, deterministic=deterministic)
        return out, weights

    def _cross_streams(self, x, source, source_mask, decode: bool):
        """Cross-attention's ``(q, k, v, padding arguments, visible pairs)``: queries from
        ``x`` ``[B R, T, d]``, keys and values from ``source`` ``[B, S, d]`` (both after
        qk-norm), or, decoding without ``source``, from the static cross cache that the first
        decoding call (with ``source``) filled and no later call rewrites. ``R`` beams of a
        source share its keys and values: their queries are folded into one query sequence of
        length ``R T`` (``unfold_beams`` undoes it), exact because no cross-attention mask
        relates a query's position to a key's. The source's pads (``source_mask`` False) are
        hidden by segment ids, queries all in segment 1."""
        cfg, att = self.config, self.config.attention
        norm = lambda q, k: QK_NORMS.get(att.qk_norm).apply(self, q, k, att, jnp.dtype(cfg.dtype))
        q = self._queries(x)
        if source is not None:
            q, k = norm(q, self._keys(source))
            v = self._values(source)
            mask = (jnp.ones(source.shape[:2], bool) if source_mask is None
                    else jnp.asarray(source_mask, bool))
            if decode:
                for name, value in (("cross_key", k), ("cross_value", v), ("source_mask", mask)):
                    self.put_variable("cache", name, value)
        elif not decode:
            raise ValueError("cross-attention needs the source sequence (the encoder's output)")
        elif not self.has_variable("cache", "cross_key"):
            raise ValueError("the cross-attention cache is empty: the first decoding call "
                             "passes the encoder's output to fill it")
        else:    # the cached keys are normalised already; the unused second norm is dead code
            k, v, mask = (self.get_variable("cache", name)
                          for name in ("cross_key", "cross_value", "source_mask"))
            q = norm(q, k)[0]
        B, beams = k.shape[0], x.shape[0] // k.shape[0]
        q = q.reshape(B, beams * q.shape[1], *q.shape[2:])
        extra = {}
        if decode or source_mask is not None:
            extra["segment_ids"] = (jnp.ones(q.shape[:2], jnp.int32), mask.astype(jnp.int32))
        visible = jnp.broadcast_to(mask[:, None, None, :], (B, 1, q.shape[1], k.shape[1]))
        return q, k, v, extra, visible

    def _queries(self, x):
        """Cross-attention's queries ``[B, T, N, H]`` (parameter ``query``, or ``query_n``
        per head)."""
        att = self.config.attention
        return self._heads(x, "query", "q", att.num_heads, self.config.head_dim)

    def _keys(self, source):
        """Cross-attention's keys ``[B, S, K, H]`` (``key``, or ``key_j`` per head)."""
        att = self.config.attention
        return self._heads(source, "key", "k", att.kv_heads, self.config.head_dim)

    def _values(self, source):
        """Cross-attention's values ``[B, S, K, D]`` (``value``, or ``value_j`` per head)."""
        att = self.config.attention
        return self._heads(source, "value", "v", att.kv_heads, self.config.value_head_dim)

    def _dot_general(self):
        """The projections' product: ``dense_dot_general``, or with ``int8`` the fake-int8 one."""
        mode = self.config.attention.int8
        if mode == "none":
            return dense_dot_general
        return int8_dot_general(inputs=mode == "weights_inputs")

    def _dense(self, features, name: str, init, kernel_axes: tuple):
        """A projection from the model width to ``features``, its kernel's logical axes
        ``("embed", *kernel_axes)`` (``attnjax.nn.axes``)."""
        cfg, att = self.config, self.config.attention
        return nn.DenseGeneral(features, use_bias=att.use_bias, dtype=jnp.dtype(cfg.dtype),
                               name=name, dot_general=self._dot_general(),
                               **axes.dense(("embed", *kernel_axes), kernel_axes, init))

    def _heads(self, x, name: str, part: str, count: int, width: int):
        """``[B, T, count, width]``: one projection ``name`` ``[d, count, width]``, or with
        ``per_head_projections`` one ``name_i`` ``[d, width]`` per head (each head's kernel
        drawn as its columns of the whole would be)."""
        att = self.config.attention
        if att.per_head_projections:
            return jnp.stack([self._dense(width, f"{name}_{i}",
                                          head_init(att, part, count, width, i), ("head_dim",))(x)
                              for i in range(count)], axis=-2)
        heads = "heads" if part == "q" else "kv_heads"
        return self._dense((count, width), name, projection_init(att, [(part, count * width)]),
                           (heads, "head_dim"))(x)

    def _project(self, x):
        """Slot 1: queries ``[B, T, N, H]``, keys ``[B, T, K, H]``, values ``[B, T, K, D]``.

        Layouts (same function; ``convert_projections`` maps the parameters): fused, one
        matmul, kernel ``qkv`` ``[d, N + 2K, H]`` (``[d, (N + K) H + K D]`` when ``D != H``);
        separate, ``query`` ``[d, N, H]``, ``key`` ``[d, K, H]``, ``value`` ``[d, K, D]``;
        per head, ``query_n`` / ``key_j`` ``[d, H]`` and ``value_j`` ``[d, D]``, one matmul
        each (every head's kernel drawn as its columns of the separate kernel would be)."""
        cfg, att = self.config, self.config.attention
        N, K, H, D = att.num_heads, att.kv_heads, cfg.head_dim, cfg.value_head_dim
        parts = [("q", N * H), ("k", K * H), ("v", K * D)]
        if att.fused_qkv and D == H:
            qkv = self._dense((N + 2 * K, H), "qkv", projection_init(att, parts),
                              ("qkv", "head_dim"))(x)
            return jnp.split(qkv, [N, N + K], axis=2)
        if att.fused_qkv:
            qkv = self._dense(sum(w for _, w in parts), "qkv", projection_init(att, parts),
                              ("qkv",))(x)
            q, k, v = jnp.split(qkv, [N * H, (N + K) * H], axis=-1)
            lead = x.shape[:-1]
            return q.reshape(*lead, N, H), k.reshape(*lead, K, H), v.reshape(*lead, K, D)
        return self._queries(x), self._keys(x), self._values(x)

    def _output_projection(self, heads):
        """``[B, T, N, D]`` -> ``[B, T, d_model]`` as ``output_projection`` says (see the
        class docstring)."""
        cfg, att = self.config, self.config.attention
        if att.output_projection == "dense":
            return nn.DenseGeneral(cfg.d_model, axis=(-2, -1), use_bias=att.use_bias,
                                   dtype=jnp.dtype(cfg.dtype), name="out",
                                   dot_general=self._dot_general(),
                                   **axes.dense(("heads", "head_dim", "embed"), ("norm",),
                                                projection_init(att, [("o", cfg.d_model)])))(
                axes.constrain(heads, "batch", "length", "act_heads", None))
        concat = heads.reshape(*heads.shape[:-2], -1)                    # [B, T, N D]
        if att.output_projection == "none":
            return concat
        w = frozen_projection("/".join(self.scope.path), concat.shape[-1], cfg.d_model)
        dot = self._dot_general()
        return dot(concat, jnp.asarray(w, concat.dtype), (((concat.ndim - 1,), (0,)), ((), ())))

    def _points(self, q, k, v):
        """The points ``q``, ``k`` and ``v`` (``attnjax.nn.points``), each laid out by its
        heads (``attnjax.nn.axes``)."""
        q = axes.constrain(q, "batch", "length", "act_heads", None)
        k, v = (axes.constrain(x, "batch", "length", "act_kv_heads", None) for x in (k, v))
        return point(self, "q", q), point(self, "k", k), point(self, "v", v)

    def _sow_diagnostics(self, q, k, scale, with_qk: bool, visible):
        """What diagnostics read: the largest logit per head over the pairs that meet
        (``visible``, ``nn.slots.visible_keys``), and with ``with_qk`` the queries and keys
        that meet in the scores and the scale of every head."""
        self.sow("intermediates", "max_logit", masked_max_logit(q, k, scale, visible))
        if with_qk:
            self.sow("intermediates", "queries", q)
            self.sow("intermediates", "keys", k)
            self.sow("intermediates", "scale", jnp.broadcast_to(
                jnp.asarray(scale, jnp.float32), (self.config.attention.num_heads,)))

    def _update_cache(self, k, v, positions) -> tuple[dict, jax.Array | None]:
        """Write this step's keys/values at the cache index; return the whole cache (``key``,
        ``value``) with the kernel arguments that place the queries after the cached keys, and
        whether the step fits in the cache (``None`` for the init call, which only creates it).

        The cache is stored head-major, ``[B, K, max_length, H]``, the head layout the
        kernels' products use (handed over as a ``[B, T, K, H]`` view), so a step writes one
        slice and reads the cache without re-laying it out. A step past the end poisons the
        layer's output (NaN) instead of selecting over the whole value cache at every step,
        which would cost as much as the step's attention itself. Time per token:
        ``attnjax bench generate`` (docs/PERFORMANCE.md)."""
        B, T, K, H = k.shape
        length = self.config.max_length
        if T > length:
            raise ValueError(f"decoding {T} tokens at once exceeds the KV cache "
                             f"(model.max_length={length})")
        initialized = self.has_variable("cache", "cached_key")
        cached_k = self.variable("cache", "cached_key", jnp.zeros, (B, K, length, H), k.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, (B, K, length, v.shape[3]),
                                 v.dtype)
        index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
        if not initialized:
            return {}, None
        start = index.value
        write = lambda cache, x: axes.constrain(jax.lax.dynamic_update_slice(
            cache, jnp.swapaxes(x, 1, 2), (0, 0, start, 0)), "batch", "act_kv_heads", None, None)
        cached_k.value, cached_v.value = write(cached_k.value, k), write(cached_v.value, v)
        index.value = start + T
        arguments = dict(key=jnp.swapaxes(cached_k.value, 1, 2),
                         value=jnp.swapaxes(cached_v.value, 1, 2),
                         query_positions=jnp.broadcast_to(positions, (B, T)),
                         key_positions=jnp.arange(length)[None, :],
                         key_value_seq_lengths=jnp.full((B,), jnp.minimum(start + T, length),
                                                        jnp.int32))
        return arguments, start + T <= length   # dynamic_update_slice clamps past the end


def unfold_beams(out, weights, rows: int):
    """Cross-attention's output ``[B, R T, N, D]`` (and weights ``[B, N, R T, S]``) of ``R``
    beams folded into one query sequence per source, back to ``rows = B R`` rows ``[B R, T,
    N, D]`` (weights ``[B R, N, T, S]``)."""
    B, RT, N, D = out.shape
    beams = rows // B
    out = out.reshape(rows, RT // beams, N, D)
    if weights is not None:
        S = weights.shape[-1]
        weights = weights.reshape(B, N, beams, RT // beams, S).swapaxes(1, 2).reshape(
            rows, N, RT // beams, S)
    return out, weights


@functools.lru_cache(maxsize=64)
def frozen_projection(name: str, rows: int, cols: int) -> np.ndarray:
    """The fixed output projection of ``output_projection='frozen'``: float32 ``[rows, cols]``,
    rows ``:rows`` and columns ``:cols`` of a Haar-random orthogonal ``m x m`` matrix, ``m =
    max(rows, cols)`` (QR of a standard normal matrix, columns signed so that R's diagonal is
    positive; Mezzadri 2007), drawn by NumPy's PCG64 seeded with the CRC-32 of ``name`` (the
    module path, e.g. ``block_0/attention``, so every layer has its own). ``W^T W = I`` when
    ``rows >= cols``, else ``W W^T = I``.

    A constant of the architecture rather than a parameter: it is in no parameter tree, so it
    has no optimizer state, weight decay (which ``attnjax.train.optim`` applies to every
    matrix) cannot move it, checkpoints and analyses of the parameters never see it, and it is
    the same bit for bit at every step and in every process; the price is that it does not
    change with the run's seed. Computed once on the host and embedded in the program.

    References: Mezzadri 2007, "How to generate random matrices from the classical compact
    groups".
    """
    m = max(rows, cols)
    q, r = np.linalg.qr(np.random.default_rng(zlib.crc32(name.encode())).standard_normal((m, m)))
    w = (q * np.sign(np.diag(r)))[:rows, :cols].astype(np.float32)
    w.flags.writeable = False
    return w
