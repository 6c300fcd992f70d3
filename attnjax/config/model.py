"""The model's configs: the attention module's slots, the position encoding, the model."""

from __future__ import annotations

import dataclasses
from typing import Literal

from attnjax.config.fields import (INT32, LENGTH, RATE, Validated, choice, field, number,
                                   when)
from attnjax.config.kernel import kernel_request
from attnjax.ops.masked_fill import LOGITS_DTYPES, MASK_MODES
from attnjax.ops.positions import ROPE_SCHEDULES
from attnjax.ops.quantize import INT8_MODES
from attnjax.registry import (DROPOUTS, INITS, KERNELS, MODELS, POSITIONS, QK_NORMS, SCALES,
                              SINKS)

ADDED_NORMS = ("none", "layer", "unit")   # see attnjax.nn.transformer.added_positions
SCALED_INITS = ("normal", "xavier_uniform")   # the INITS that read their <name>_init_scale
PADDED = ("left", "right")                    # data.padding values that pad examples


@dataclasses.dataclass(frozen=True)
class AttentionConfig(Validated):
    """The attention module's slots (see docs/ARCHITECTURE.md and ``attnjax.nn.slots``)."""
    PATH = "model.attention"
    KINDS = (("kernel", KERNELS, "settings"), ("qk_norm", QK_NORMS, "reads"),
             ("dropout", DROPOUTS, "reads"))
    num_heads: int = number(4, ge=1, le=INT32)
    num_kv_heads: int | None = number(None, ge=1, le=INT32)  # None = num_heads; 1 = MQA; GQA
    head_dim: int | None = number(None, ge=1, le=INT32)      # None = d_model // num_heads
    kernel: str = choice("reference", KERNELS)
    block_q: int | None = number(None, ge=1, le=LENGTH)  # chunked / triangular (None: default)
    block_k: int | None = number(None, ge=1, le=LENGTH)
    fused_qkv: bool = True
    use_bias: bool = False
    qk_norm: str = choice("none", QK_NORMS)         # kappa: fixed RMS sqrt(qk_kappa)
    qk_kappa: float = number(1.0, gt=0, argument=1.0)
    scale: str = choice("inv_sqrt_d", SCALES)
    scale_multiplier: float = number(1.0, gt=0, argument=1.0)   # logits *= multiplier * policy
    logit_soft_cap: float | None = number(None, gt=0)
    sink: str = choice("none", SINKS)
    dropout: str = choice("none", DROPOUTS)
    dropout_rate: float = number(0.0, ge=0, lt=1, argument=RATE)
    window: int | None = number(None, ge=1, le=LENGTH)   # each query sees its last `window` keys
    # False: no causal mask (e.g. padding mask in its place)
    causal: bool = field(True, read_when=when(
        "window", None, why="a window, window - 1 keys back and none ahead, is causal itself"))
    # padded data: pads hidden; False keeps them visible
    key_padding_mask: bool = field(True, read_when=when("data.padding", *PADDED))
    # settings of kernel='masked_fill' (PyTorch-style masking; see attnjax.ops.masked_fill)
    mask_fill: float | None = number(None, le=0, infinite=True)   # None: finfo.min; -inf ok
    mask_mode: Literal[MASK_MODES] = "select"       # where(mask, s, fill) or s + (1-mask) fill
    logits_dtype: Literal[LOGITS_DTYPES] = "float32"  # "input": float16 logits may overflow
    mask_after_softmax: bool = False                # softmax over all keys, then times the mask
    # key j visible iff j <= i + causal_offset
    causal_offset: int = number(0, ge=-LENGTH, le=LENGTH, read_when=when("causal", True))
    # (layer, head) pairs gated to 0 (train and eval); a seq2seq model's decoder self-attention
    knockout: tuple[tuple[int, int], ...] = ()
    # initialisation of each projection (INITS: default, zeros, normal, xavier_uniform); the
    # scale is normal's std or xavier_uniform's gain
    q_init: str = choice("default", INITS)
    k_init: str = choice("default", INITS)
    v_init: str = choice("default", INITS)
    o_init: str = choice("default", INITS, read_when=when("output_projection", "dense"))
    q_init_scale: float = number(1.0, gt=0, read_when=when("q_init", *SCALED_INITS))
    k_init_scale: float = number(1.0, gt=0, read_when=when("k_init", *SCALED_INITS))
    v_init_scale: float = number(1.0, gt=0, read_when=when("v_init", *SCALED_INITS))
    o_init_scale: float = number(1.0, gt=0, read_when=when("o_init", *SCALED_INITS))
    # head shapes (see attnjax.nn.attention): the value's width (None = head_dim); the output
    # projection: dense (trained W_o), none (heads concatenated into the residual; needs
    # num_heads * value_head_dim = d_model), frozen (a fixed random orthogonal W_o, never
    # trained); one matmul per head for q, k and v (needs fused_qkv=False)
    value_head_dim: int | None = number(None, ge=1, le=INT32)
    output_projection: Literal["dense", "none", "frozen"] = "dense"
    per_head_projections: bool = False
    # simulated int8 (attnjax.ops.quantize) of the q, k, v and o projections: none, weights
    # (per output channel), weights_inputs (and each projection's input, per example)
    int8: Literal[INT8_MODES] = "none"

    def _validate(self):
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            self._fail("num_kv_heads", f"={self.num_kv_heads} must divide "
                       f"num_heads={self.num_heads}")
        if self.dropout != "none" and self.dropout_rate == 0.0:
            self._fail("dropout_rate", f"is 0 but dropout={self.dropout!r}; set a rate or "
                       "dropout='none'")
        if self.per_head_projections and self.fused_qkv:
            self._fail("per_head_projections", "=True needs fused_qkv=False (it splits the "
                       "separate q, k, v projections into one matmul per head)")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads


@dataclasses.dataclass(frozen=True)
class PositionConfig(Validated):
    """Which position encoding, and its settings. ``kind`` is a name in ``POSITIONS``."""
    PATH = "model.position"
    KINDS = (("kind", POSITIONS, "reads"),)
    kind: str = choice("rope", POSITIONS)
    rope_base: float = number(10000.0, gt=1)
    rope_fraction: float = number(1.0, gt=0, le=1)  # fraction of head_dim that rotates
    rope_scaling: Literal[ROPE_SCHEDULES] = "default"
    # s = L_eval / L_train, and L_train (None: max_length), of the schedules that read them
    rope_scale: float = number(1.0, ge=1, read_when=when("rope_scaling", "linear", "ntk", "yarn",
                                                         "llama3"))
    train_length: int | None = number(None, ge=1, le=LENGTH, read_when=when(
        "rope_scaling", "dynamic_ntk", "yarn", "llama3"))
    # llama3's band edges: wavelengths below train_length / high keep their frequency, those
    # above train_length / low are scaled (attnjax.ops.positions.rope_frequencies)
    rope_low_freq_factor: float = number(1.0, gt=0, read_when=when("rope_scaling", "llama3"))
    rope_high_freq_factor: float = number(4.0, gt=0, read_when=when("rope_scaling", "llama3"))
    t5_num_buckets: int = number(32, ge=2, le=INT32)
    t5_max_distance: int = number(128, ge=2, le=LENGTH)
    learned_interpolate: bool = False               # learned table stretched to longer inputs
    added_scale: float = number(1.0, gt=0, argument=1.0)   # x the added absolute embedding
    added_norm: Literal[ADDED_NORMS] = "none"       # the added embedding normalised first

    def _validate(self):
        if self.rope_high_freq_factor <= self.rope_low_freq_factor:
            self._fail("rope_high_freq_factor", f"={self.rope_high_freq_factor} must exceed "
                       f"rope_low_freq_factor={self.rope_low_freq_factor}")
        if self.kind == "t5" and self.t5_max_distance <= self.t5_num_buckets // 2:
            self._fail("t5_max_distance", f"={self.t5_max_distance} must exceed half of "
                       f"t5_num_buckets={self.t5_num_buckets} (the exact buckets)")


@dataclasses.dataclass(frozen=True)
class ModelConfig(Validated):
    """A model of the family ``family`` names (``attnjax.registry.MODELS``, ``attnjax.models``:
    ``decoder``, a decoder-only language model, by default); the fields below are shared by
    the families, and a field one family alone reads is refused under the others."""
    PATH = "model"
    KINDS = (("family", MODELS, "reads"),)
    family: str = choice("decoder", MODELS)
    vocab_size: int = number(256, ge=1, le=INT32)
    d_model: int = number(128, ge=1, le=INT32)
    num_layers: int = number(4, ge=1, le=INT32)
    max_length: int = number(256, ge=1, le=LENGTH)
    # the MLP (see attnjax.nn.transformer.FeedForward): gelu (tanh approximation), gelu_exact
    # (erf), swiglu; its hidden width, mlp_hidden or else from mlp_ratio; biases on its
    # projections (the attention's: attention.use_bias)
    mlp: Literal["gelu", "gelu_exact", "swiglu"] = "gelu"
    mlp_ratio: float = number(4.0, gt=0, read_when=when(
        "mlp_hidden", None, why="mlp_hidden sets the hidden width"))
    mlp_hidden: int | None = number(None, ge=1, le=INT32)
    mlp_bias: bool = True
    norm: Literal["layer", "rms"] = "layer"
    norm_eps: float = number(1e-6, gt=0)            # the epsilon of every LayerNorm / RMSNorm
    norm_position: Literal["pre", "post"] = "pre"
    residual_dropout: float = number(0.0, ge=0, lt=1, argument=RATE)
    # logits x @ embed^T; False: through an unembed [d_model, vocab_size] of their own, no bias
    tie_embeddings: bool = True
    embed_init_std: float = number(0.02, gt=0)      # token embeddings ~ N(0, std^2)
    embed_scale: float | None = number(None, gt=0)  # tokens x this; None: the encoding's default
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"   # compute dtype
    # recompute each block's activations in the backward pass instead of keeping them
    # (jax.checkpoint): memory for compute; on an fsdp mesh each block's parameters are then
    # gathered again for its backward pass instead of kept whole from the forward one
    remat: bool = False
    # the encoder family's (attnjax.models.encoder): segment (token-type) embeddings, 0 = none;
    # a LayerNorm on the summed embeddings; the output: the masked-language-model head
    # (none), a classifier of num_classes on [CLS] (cls) or the mean of the real tokens, or
    # the last hidden states themselves (hidden: a pretrained BertModel's outputs)
    type_vocab_size: int = number(0, ge=0, le=INT32)
    embed_norm: bool = False
    classifier: Literal["none", "cls", "mean", "hidden"] = "none"
    num_classes: int = number(2, ge=2, le=INT32, read_when=when("classifier", "cls", "mean"))
    # the seq2seq family's (attnjax.models.seq2seq): the encoder's blocks (None: num_layers,
    # the decoder's) and position encoding (None: position.kind, the decoder's); the
    # cross-attention heads (None: attention.num_heads) and simulated int8 (None:
    # attention.int8, the self-attention's); one token embedding for source, target and
    # output, or one per stream
    encoder_layers: int | None = number(None, ge=1, le=INT32)
    encoder_position: str | None = choice(None, POSITIONS)
    cross_heads: int | None = number(None, ge=1, le=INT32)
    cross_int8: Literal[INT8_MODES] | None = None
    share_embeddings: bool = True
    attention: AttentionConfig = dataclasses.field(default_factory=AttentionConfig)
    position: PositionConfig = dataclasses.field(default_factory=PositionConfig)

    def _validate(self):
        att = self.attention
        MODELS.get(self.family).check(self)
        if att.head_dim is None and self.d_model % att.num_heads:
            self._fail("d_model", f"={self.d_model} is not divisible by "
                       f"attention.num_heads={att.num_heads} (or set attention.head_dim)")
        if att.output_projection == "none" and att.num_heads * self.value_head_dim != self.d_model:
            self._fail("attention.output_projection", f"='none' needs num_heads * value_head_dim "
                       f"= d_model, got {att.num_heads} * {self.value_head_dim} != "
                       f"{self.d_model}; choices: dense, none, frozen")
        kernel_request(self)
        self.check_lengths(())
        for pair in att.knockout:
            if (len(pair) != 2 or not 0 <= pair[0] < self.num_layers
                    or not 0 <= pair[1] < att.num_heads):
                self._fail("attention.knockout", f"entry {list(pair)} must be [layer, head] with "
                           f"0 <= layer < num_layers={self.num_layers} and 0 <= head < "
                           f"num_heads={att.num_heads}")

    def check_lengths(self, lengths):
        """Raise if the position encoding cannot honour inputs of these lengths."""
        position = POSITIONS.get(self.position.kind)
        if position.check is not None:
            position.check(self, tuple(lengths))

    @property
    def causal(self) -> bool:
        """Whether self-attention is causal: the family's choice (``Family.causal``), and for a
        causal family ``attention.causal`` (False: the ablation without the causal mask)."""
        return MODELS.get(self.family).causal and self.attention.causal

    @property
    def window(self) -> tuple[int, int | None] | None:
        """``attention.window`` as the keys ``(left, right)`` of its query each query sees:
        its last ``window`` keys under a causal mask, ``window - 1`` on each side without."""
        w = self.attention.window
        return None if w is None else (w - 1, 0 if self.causal else w - 1)

    @property
    def head_dim(self) -> int:
        """``attention.head_dim``, or ``d_model // num_heads`` when it is not set."""
        return self.attention.head_dim or self.d_model // self.attention.num_heads

    @property
    def value_head_dim(self) -> int:
        """``attention.value_head_dim``, or the key/query ``head_dim`` when it is not set."""
        return self.attention.value_head_dim or self.head_dim
