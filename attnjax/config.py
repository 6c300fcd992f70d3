"""Typed, frozen, validated configuration: dataclasses, dict/JSON round-trip, dotted overrides.

Every field is checked when a config is built, with a one-line ``ValueError`` that names the
dotted field (``model.attention.num_heads``) and, for a choice, the valid values:

- its type, and for a number its valid range (declared once, next to the field, with
  ``_number``; floats must also be finite);
- a choice that is a registry name (kernel, position encoding, qk-norm, scale policy, sink,
  dropout placement, data task) is looked up in ``attnjax.registry``;
- a field that only one kind reads (``qk_kappa`` for ``qk_norm='kappa'``, ``block_q`` for the
  chunked kernel, the ``rope_*`` fields for RoPE, ...) is refused under any other kind when it
  is set to anything but its default: it would mean nothing;
- impossible combinations (width not divisible by heads, a kernel that cannot honour an
  option, a learned position table evaluated past its rows) fail here, before anything is
  traced, compiled or written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from typing import Any, Literal

from attnjax.ops.masked_fill import LOGITS_DTYPES, MASK_MODES
from attnjax.ops.positions import ROPE_SCHEDULES
from attnjax.registry import (DROPOUTS, INITS, KERNELS, POSITIONS, QK_NORMS, SCALES, SINKS,
                              TASKS, Registry)


ADDED_NORMS = ("none", "layer", "unit")   # see attnjax.nn.transformer.added_positions


def _number(default, *, ge=None, gt=None, le=None, lt=None, infinite: bool = False):
    """A numeric field and its valid range (``None`` values are not range-checked); a float
    field must be finite unless ``infinite``."""
    return dataclasses.field(default=default, metadata={"range": (ge, gt, le, lt),
                                                        "infinite": infinite})


def _choice(default: str, registry: Registry):
    """A field whose value is a name in ``registry``."""
    return dataclasses.field(default=default, metadata={"registry": registry})


def range_text(bounds) -> str:
    """``[0, 1)``, ``>= 1``, ``> 0`` ... for ``(ge, gt, le, lt)``."""
    ge, gt, le, lt = bounds
    low, high = (ge if gt is None else gt), (le if lt is None else lt)
    if low is not None and high is not None:
        return f"in {'[' if gt is None else '('}{low:g}, {high:g}{']' if lt is None else ')'}"
    if low is not None:
        return f"{'>=' if gt is None else '>'} {low:g}"
    return f"{'<=' if lt is None else '<'} {high:g}"


def in_range(value, bounds) -> bool:
    ge, gt, le, lt = bounds
    return ((ge is None or value >= ge) and (gt is None or value > gt)
            and (le is None or value <= le) and (lt is None or value < lt))


def _check_value(path: str, hint, value):
    """Return ``value`` converted to ``hint`` (int -> float only) or raise naming ``path``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_value(path, inner, value)
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{path}={value!r} is not valid; choices: {', '.join(map(str, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{path} must be a list, got {value!r}")
        return tuple(_check_value(f"{path}[{i}]", args[0], v) for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        if isinstance(value, dict):
            return from_dict(hint, value, path)
        raise ValueError(f"{path} must be a {hint.__name__} or a dict, got {type(value).__name__}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise ValueError(f"{path} must be {hint.__name__}, got {value!r} ({type(value).__name__})")
    return value


def _check_finite(path: str, value):
    for v in value if isinstance(value, tuple) else (value,):
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{path} must be finite, got {v!r}")


def _check_range(path: str, value, bounds):
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        if v is not None and not in_range(v, bounds):
            raise ValueError(f"{path} must be {range_text(bounds)}, got {v!r}")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def field_default(field: dataclasses.Field):
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


class _Validated:
    """Mixin: type-, range- and choice-check every field on construction, refuse settings the
    chosen kinds do not read (``KINDS``), then run ``_validate``.

    ``KINDS``: ``(selector field, registry, entry attribute)`` triples: the entry attribute of
    every registry entry names the fields of this class only that entry reads."""
    PATH = ""
    KINDS: tuple = ()

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            path = _join(self.PATH, field.name)
            value = _check_value(path, hints[field.name], getattr(self, field.name))
            if not field.metadata.get("infinite"):
                _check_finite(path, value)
            if "range" in field.metadata:
                _check_range(path, value, field.metadata["range"])
            if "registry" in field.metadata and value is not None:
                field.metadata["registry"].get(value, path)
            object.__setattr__(self, field.name, value)
        self._check_kind_fields()
        self._validate()

    def _check_kind_fields(self):
        defaults = {f.name: field_default(f) for f in dataclasses.fields(self)}
        for selector, registry, attribute in self.KINDS:
            chosen = getattr(self, selector)
            readers: dict[str, list[str]] = {}
            for name, entry in registry.items():
                for field in getattr(entry, attribute):
                    readers.setdefault(field, []).append(name)
            for field, kinds in readers.items():
                value = getattr(self, field)
                if chosen not in kinds and value != defaults[field]:
                    self._fail(field, f"={value!r} means nothing with {selector}={chosen!r}; it "
                               f"is read by {selector}={' or '.join(map(repr, kinds))}")

    def _validate(self):
        pass

    def _fail(self, field: str, message: str):
        separator = "" if message.startswith("=") else " "
        raise ValueError(f"{_join(self.PATH, field)}{separator}{message}")


@dataclasses.dataclass(frozen=True)
class AttentionConfig(_Validated):
    """The attention module's slots (see docs/ARCHITECTURE.md and ``attnjax.nn.slots``)."""
    PATH = "model.attention"
    KINDS = (("kernel", KERNELS, "settings"), ("qk_norm", QK_NORMS, "reads"),
             ("dropout", DROPOUTS, "reads"))
    num_heads: int = _number(4, ge=1)
    num_kv_heads: int | None = _number(None, ge=1)   # None = num_heads (MHA); 1 = MQA; else GQA
    head_dim: int | None = _number(None, ge=1)       # None = d_model // num_heads
    kernel: str = _choice("reference", KERNELS)
    block_q: int | None = _number(None, ge=1)       # chunked / triangular blocks (None: default)
    block_k: int | None = _number(None, ge=1)
    fused_qkv: bool = True
    use_bias: bool = False
    qk_norm: str = _choice("none", QK_NORMS)        # kappa: fixed RMS sqrt(qk_kappa)
    qk_kappa: float = _number(1.0, gt=0)
    scale: str = _choice("inv_sqrt_d", SCALES)
    scale_multiplier: float = _number(1.0, gt=0)    # logits *= multiplier * policy
    logit_soft_cap: float | None = _number(None, gt=0)
    sink: str = _choice("none", SINKS)
    dropout: str = _choice("none", DROPOUTS)
    dropout_rate: float = _number(0.0, ge=0, lt=1)
    window: int | None = _number(None, ge=1)        # each query sees its last `window` keys
    causal: bool = True                 # False: no causal mask (e.g. padding mask in its place)
    key_padding_mask: bool = True       # padded data: pads hidden; False keeps them visible
    # settings of kernel='masked_fill' (PyTorch-style masking; see attnjax.ops.masked_fill)
    mask_fill: float | None = _number(None, le=0, infinite=True)   # None: finfo.min; -inf ok
    mask_mode: Literal[MASK_MODES] = "select"       # where(mask, s, fill) or s + (1-mask) fill
    logits_dtype: Literal[LOGITS_DTYPES] = "float32"  # "input": float16 logits may overflow
    mask_after_softmax: bool = False                # softmax over all keys, then times the mask
    causal_offset: int = 0                          # key j visible iff j <= i + causal_offset
    knockout: tuple[tuple[int, int], ...] = ()  # (layer, head) pairs gated to 0 (train and eval)
    # initialisation of each projection (INITS: default, zeros, normal, xavier_uniform); the
    # scale is normal's std or xavier_uniform's gain
    q_init: str = _choice("default", INITS)
    k_init: str = _choice("default", INITS)
    v_init: str = _choice("default", INITS)
    o_init: str = _choice("default", INITS)
    q_init_scale: float = _number(1.0, gt=0)
    k_init_scale: float = _number(1.0, gt=0)
    v_init_scale: float = _number(1.0, gt=0)
    o_init_scale: float = _number(1.0, gt=0)
    # head shapes (see attnjax.nn.attention): the value's width (None = head_dim); the output
    # projection: dense (trained W_o), none (heads concatenated into the residual; needs
    # num_heads * value_head_dim = d_model), frozen (a fixed random orthogonal W_o, never
    # trained); one matmul per head for q, k and v (needs fused_qkv=False)
    value_head_dim: int | None = _number(None, ge=1)
    output_projection: Literal["dense", "none", "frozen"] = "dense"
    per_head_projections: bool = False

    def _validate(self):
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            self._fail("num_kv_heads", f"={self.num_kv_heads} must divide "
                       f"num_heads={self.num_heads}")
        from attnjax.nn.slots import SCALED_INITS
        for name in "qkvo":
            scheme, scale = getattr(self, f"{name}_init"), getattr(self, f"{name}_init_scale")
            if scheme not in SCALED_INITS and scale != 1.0:
                self._fail(f"{name}_init_scale", f"={scale} means nothing with {name}_init="
                           f"{scheme!r}; it is read by {name}_init="
                           f"{' or '.join(map(repr, SCALED_INITS))}")
        if self.dropout != "none" and self.dropout_rate == 0.0:
            self._fail("dropout_rate", f"is 0 but dropout={self.dropout!r}; set a rate or "
                       "dropout='none'")
        if not self.causal and self.window is not None:
            self._fail("causal", f"=False means nothing with window={self.window}: the window "
                       "(window - 1 keys back, none ahead) is causal itself")
        if not self.causal and self.causal_offset != 0:
            self._fail("causal_offset", f"={self.causal_offset} means nothing with causal=False")
        if self.output_projection != "dense" and self.o_init != "default":
            self._fail("o_init", f"={self.o_init!r} means nothing with output_projection="
                       f"{self.output_projection!r}; it is read by output_projection='dense'")
        if self.per_head_projections and self.fused_qkv:
            self._fail("per_head_projections", "=True needs fused_qkv=False (it splits the "
                       "separate q, k, v projections into one matmul per head)")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads


@dataclasses.dataclass(frozen=True)
class PositionConfig(_Validated):
    """Which position encoding, and its settings. ``kind`` is a name in ``POSITIONS``."""
    PATH = "model.position"
    KINDS = (("kind", POSITIONS, "reads"),)
    kind: str = _choice("rope", POSITIONS)
    rope_base: float = _number(10000.0, gt=1)
    rope_fraction: float = _number(1.0, gt=0, le=1)  # fraction of head_dim that rotates
    rope_scaling: Literal[ROPE_SCHEDULES] = "default"
    rope_scale: float = _number(1.0, ge=1)           # s = L_eval / L_train for linear/ntk/yarn
    train_length: int | None = _number(None, ge=1)   # L_train (dynamic_ntk, yarn); None: max_length
    t5_num_buckets: int = _number(32, ge=2)
    t5_max_distance: int = _number(128, ge=2)
    learned_interpolate: bool = False                # learned table stretched to longer inputs
    added_scale: float = _number(1.0, gt=0)          # x the added absolute embedding (embed hook)
    added_norm: Literal[ADDED_NORMS] = "none"       # the added embedding normalised first

    def _validate(self):
        if self.kind == "t5" and self.t5_max_distance <= self.t5_num_buckets // 2:
            self._fail("t5_max_distance", f"={self.t5_max_distance} must exceed half of "
                       f"t5_num_buckets={self.t5_num_buckets} (the exact buckets)")


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Validated):
    """A decoder-only language model."""
    PATH = "model"
    vocab_size: int = _number(256, ge=1)
    d_model: int = _number(128, ge=1)
    num_layers: int = _number(4, ge=1)
    max_length: int = _number(256, ge=1)
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_ratio: float = _number(4.0, gt=0)
    norm: Literal["layer", "rms"] = "layer"
    norm_position: Literal["pre", "post"] = "pre"
    residual_dropout: float = _number(0.0, ge=0, lt=1)
    tie_embeddings: bool = True
    embed_init_std: float = _number(0.02, gt=0)     # token embeddings ~ N(0, std^2)
    embed_scale: float | None = _number(None, gt=0)  # tokens x this; None: the encoding's default
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"   # compute dtype
    attention: AttentionConfig = dataclasses.field(default_factory=AttentionConfig)
    position: PositionConfig = dataclasses.field(default_factory=PositionConfig)

    def _validate(self):
        from attnjax.nn.slots import kernel_request  # the model's own map of its kernel options
        att = self.attention
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
    def head_dim(self) -> int:
        """``attention.head_dim``, or ``d_model // num_heads`` when it is not set."""
        return self.attention.head_dim or self.d_model // self.attention.num_heads

    @property
    def value_head_dim(self) -> int:
        """``attention.value_head_dim``, or the key/query ``head_dim`` when it is not set."""
        return self.attention.value_head_dim or self.head_dim


@dataclasses.dataclass(frozen=True)
class DataConfig(_Validated):
    """What to train on: ``task`` is a name in ``attnjax.registry.TASKS``. ``text``: bytes of
    ``path`` (a file or directory; ``None`` = the built-in corpus, the interpreter's
    standard-library source); ``tokens``: a flat binary file of token ids; the rest are
    synthetic tasks generated on device."""
    PATH = "data"
    KINDS = (("task", TASKS, "reads"),)
    task: str = _choice("text", TASKS)
    path: str | None = None
    length: int = _number(128, ge=2)                  # training sequence length
    eval_lengths: tuple[int, ...] = _number((), ge=2)  # extra evaluation lengths
    val_fraction: float = _number(0.1, gt=0, lt=1)
    vocab_size: int = _number(256, ge=2)             # synthetic tasks and token files
    num_pairs: int = _number(8, ge=1)                # mqar key-value pairs
    token_dtype: Literal["uint16", "uint32", "int32"] = "uint16"
    # text and tokens (attnjax.data.padding): a BOS id before every window; padded examples
    bos_token: int | None = _number(None, ge=0)      # id < model.vocab_size; input only
    padding: Literal["none", "left", "right"] = "none"   # where the pads of an example go
    min_length: int = _number(1, ge=1)               # padded: real lengths in [this, length]
    pad_token: int | None = _number(0, ge=0)         # padded: the pad id; None: random tokens

    def _validate(self):
        TASKS.get(self.task).check(self)
        if self.padding == "none":
            for name, default in (("min_length", 1), ("pad_token", 0)):
                if getattr(self, name) != default:
                    self._fail(name, f"={getattr(self, name)!r} means nothing with "
                               "padding='none'; it is read by padding='left' or 'right'")
        elif self.min_length > min(self.lengths):
            self._fail("min_length", f"={self.min_length} exceeds the shortest length "
                       f"{min(self.lengths)} (data.length, data.eval_lengths)")

    @property
    def lengths(self) -> tuple[int, ...]:
        """Every length the model is trained or evaluated at."""
        return (self.length,) + self.eval_lengths


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Validated):
    """Optimisation, evaluation, logging and checkpoint cadence."""
    PATH = "train"
    steps: int = _number(1000, ge=1)
    batch_size: int = _number(32, ge=1)
    learning_rate: float = _number(1e-3, gt=0)
    warmup_steps: int = _number(100, ge=0)
    final_lr_fraction: float = _number(0.1, ge=0, le=1)   # cosine decays to this x the peak
    weight_decay: float = _number(0.1, ge=0)              # on matrices only
    b1: float = _number(0.9, ge=0, lt=1)
    b2: float = _number(0.95, ge=0, lt=1)
    clip_norm: float | None = _number(1.0, gt=0)          # None: no clipping
    grad_accum: int = _number(1, ge=1)              # micro-batches per update (batch split evenly)
    z_loss: float = _number(0.0, ge=0)              # coefficient of log^2 Z
    # attention regularisers (attnjax.train.regularizers), each a coefficient of any sign
    entropy_reg: float = 0.0                        # mean attention entropy
    weight_std_reg: float = 0.0                     # per-head std of the attention weights
    sharpen_reg: float = 0.0                        # KL to the sharpened attention
    steps_per_dispatch: int = _number(1, ge=1)      # >1: lax.scan over steps, data made on device
    parallel: Literal["mesh", "pmap"] = "mesh"
    log_every: int = _number(50, ge=1)
    eval_every: int = _number(500, ge=1)
    eval_batches: int = _number(8, ge=1)
    eval_batch_size: int = _number(32, ge=1)
    # the attention kernel evaluation runs (None: the model's); kernels compute the same
    # function, so this trades speed and memory (``chunked`` at long lengths), not results
    eval_kernel: str | None = dataclasses.field(default=None, metadata={"registry": KERNELS})
    checkpoint_every: int = _number(500, ge=1)
    keep_best: int = _number(1, ge=1)               # checkpoints kept by validation loss (+ latest)
    head_metrics: bool = False                      # log per-head attention statistics (log_every)

    def _validate(self):
        if self.batch_size % self.grad_accum:
            self._fail("grad_accum", f"={self.grad_accum} must divide batch_size={self.batch_size}")
        for name in ("log_every", "eval_every", "checkpoint_every"):
            if getattr(self, name) % self.steps_per_dispatch:
                self._fail(name, f"={getattr(self, name)} must be a multiple of "
                           f"steps_per_dispatch={self.steps_per_dispatch}")


@dataclasses.dataclass(frozen=True)
class Config(_Validated):
    """Top-level config: what ``experiments/<name>.py:get_config()`` returns."""
    PATH = ""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    seed: int = _number(0, ge=0)

    def _validate(self):
        from attnjax.nn.slots import kernel_request
        if self.model.vocab_size < self.data.vocab_size:
            self._fail("model.vocab_size", f"={self.model.vocab_size} is smaller than the "
                       f"data's vocabulary ({self.data.vocab_size})")
        if self.data.length > self.model.max_length:
            self._fail("data.length", f"={self.data.length} exceeds model.max_length="
                       f"{self.model.max_length}")
        self.model.check_lengths(self.data.lengths)
        for name in ("bos_token", "pad_token"):
            token = getattr(self.data, name)
            if token is not None and token >= self.model.vocab_size:
                self._fail(f"data.{name}", f"={token} must be in [0, model.vocab_size="
                           f"{self.model.vocab_size})")
        padded = self.data.padding != "none"
        if padded:
            try:
                kernel_request(self.model, padded=True)
            except ValueError as error:
                self._fail("data.padding", f"={self.data.padding!r} needs per-example positions "
                           f"and a key-padding mask, which {error}")
        elif not self.model.attention.key_padding_mask:
            self._fail("model.attention.key_padding_mask", "=False means nothing with "
                       "data.padding='none'; it is read by data.padding='left' or 'right'")
        if self.train.eval_kernel is not None:
            exact = [name for name, spec in KERNELS.items() if spec.exact]
            for kernel in (self.train.eval_kernel, self.model.attention.kernel):
                if kernel not in exact:
                    self._fail("train.eval_kernel", f"={self.train.eval_kernel!r} needs exact "
                               f"softmax kernels to evaluate the same function, and {kernel!r} "
                               f"is not; exact kernels: {', '.join(exact)}")
            try:
                kernel_request(self.evaluated().model, padded=padded)
            except ValueError as error:
                self._fail("train.eval_kernel", f"={self.train.eval_kernel!r} cannot evaluate "
                           f"this model: {error}")
        from attnjax.train.regularizers import active
        for field in ["head_metrics"] * self.train.head_metrics + [
                reg.coefficient for reg in active(self.train).values()]:
            if padded:      # the attention statistics average over every row and key
                self._fail(f"train.{field}", f"cannot be used with data.padding="
                           f"{self.data.padding!r}: the attention statistics would count the "
                           "pads' rows and keys")
            try:
                kernel_request(self.model, return_weights=True, padded=padded)
            except ValueError as error:
                self._fail(f"train.{field}", f"needs attention weights, which {error}")


    def evaluated(self) -> Config:
        """The config evaluation runs: the model with ``train.eval_kernel`` when one is set."""
        if self.train.eval_kernel is None:
            return self
        attention = dataclasses.replace(self.model.attention, kernel=self.train.eval_kernel)
        return dataclasses.replace(self, model=dataclasses.replace(self.model, attention=attention),
                                   train=dataclasses.replace(self.train, eval_kernel=None))


def from_dict(cls, data: dict, path: str | None = None):
    """Build dataclass ``cls`` from a (nested) dict; an unknown key is an error listing the
    valid ones."""
    path = cls.PATH if path is None else path
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ValueError(f"{_join(path, unknown[0])} is not a config field; "
                         f"valid: {', '.join(names)}")
    return cls(**data)


def to_dict(config) -> dict:
    """Nested plain dict of a config (JSON-serialisable)."""
    return dataclasses.asdict(config)


def to_json(config) -> str:
    return json.dumps(to_dict(config), indent=2, sort_keys=True)


def from_json(cls, text: str):
    return from_dict(cls, json.loads(text))


def _parse_value(text: str) -> Any:
    """``'4'`` -> 4, ``'0.5'`` -> 0.5, ``'true'`` -> True, ``'null'``/``'None'`` -> None, else
    the string."""
    if text == "None":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a.b=4", "c=x"]`` -> ``{"a.b": 4, "c": "x"}`` (values parsed as JSON where possible)."""
    pairs = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like KEY=VALUE")
        key, value = item.split("=", 1)
        pairs[key.strip()] = _parse_value(value.strip())
    return pairs


def apply_overrides(config, overrides: dict[str, Any] | list[str]):
    """Return a copy of ``config`` with dotted overrides applied, validated once, together.

    ``overrides`` is a dict ``{"model.attention.num_heads": 8}`` or a list of ``KEY=VALUE``
    strings (values parsed as JSON where possible, else kept as strings). Keys are relative to
    the top-level config (``model.d_model``, ``seed``).
    """
    if isinstance(overrides, (list, tuple)):
        overrides = parse_overrides(overrides)
    data = to_dict(config)
    for key, value in overrides.items():
        node, parts = data, key.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                where = ".".join(parts[:depth]) or "config"
                valid = ", ".join(node) if isinstance(node, dict) else "(not a section)"
                raise ValueError(f"override {key!r}: {part!r} is not a field of {where}; "
                                 f"valid: {valid}")
            if depth == len(parts) - 1:
                node[part] = value
            else:
                node = node[part]
    return from_dict(type(config), data)
