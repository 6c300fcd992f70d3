"""Typed, frozen, validated configuration: dataclasses, dict/JSON round-trip, dotted overrides.

Every field is checked when a config is built, with a one-line ``ValueError`` that names the
dotted field (``model.attention.num_heads``) and, for a choice, the valid values. Impossible
combinations (width not divisible by heads, a kernel that cannot honour an option) fail here,
before anything is traced or compiled.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal

from attnjax.registry import KERNELS, POSITIONS

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


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class _Validated:
    """Mixin: type-check every field on construction, then run ``_validate``."""
    PATH = ""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            hint = typing.get_type_hints(type(self))[field.name]
            value = _check_value(_join(self.PATH, field.name), hint, getattr(self, field.name))
            object.__setattr__(self, field.name, value)
        self._validate()

    def _validate(self):
        pass

    def _fail(self, field: str, message: str):
        separator = "" if message.startswith("=") else " "
        raise ValueError(f"{_join(self.PATH, field)}{separator}{message}")


@dataclasses.dataclass(frozen=True)
class AttentionConfig(_Validated):
    """The attention module's slots (see docs/ARCHITECTURE.md)."""
    PATH = "model.attention"
    num_heads: int = 4
    num_kv_heads: int | None = None            # None = num_heads (MHA); 1 = MQA; else GQA
    kernel: str = "reference"                 # a name in attnjax.registry.KERNELS
    block_q: int = 512                        # chunked kernel block sizes
    block_k: int = 512
    fused_qkv: bool = True
    use_bias: bool = False
    qk_norm: Literal["none", "rms", "layer", "kappa"] = "none"   # kappa: fixed RMS sqrt(qk_kappa)
    qk_kappa: float = 1.0
    scale: Literal["inv_sqrt_d", "inv_d", "constant", "learned"] = "inv_sqrt_d"
    scale_multiplier: float = 1.0              # logits *= multiplier * policy (constant: multiplier)
    logit_soft_cap: float | None = None
    sink: Literal["none", "learned", "plus_one"] = "none"
    dropout: Literal["none", "probs_shared", "probs_per_head", "output"] = "none"
    dropout_rate: float = 0.0
    window: int | None = None                 # sliding window: each query sees its last `window` keys
    knockout: tuple[tuple[int, int], ...] = ()  # (layer, head) pairs gated to 0 (train and eval)

    def _validate(self):
        KERNELS.get(self.kernel, f"{self.PATH}.kernel")
        for name in ("num_heads", "block_q", "block_k"):
            if getattr(self, name) < 1:
                self._fail(name, f"must be >= 1, got {getattr(self, name)}")
        if self.num_kv_heads is not None and (
                self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads):
            self._fail("num_kv_heads", f"={self.num_kv_heads} must be >= 1 and divide "
                       f"num_heads={self.num_heads}")
        if not 0.0 <= self.dropout_rate < 1.0:
            self._fail("dropout_rate", f"must be in [0, 1), got {self.dropout_rate}")
        if self.dropout != "none" and self.dropout_rate == 0.0:
            self._fail("dropout_rate", f"is 0 but dropout={self.dropout!r}; set a rate or "
                       "dropout='none'")
        if self.qk_kappa <= 0:
            self._fail("qk_kappa", f"must be > 0, got {self.qk_kappa}")
        if self.logit_soft_cap is not None and self.logit_soft_cap <= 0:
            self._fail("logit_soft_cap", f"must be > 0, got {self.logit_soft_cap}")
        if self.window is not None and self.window < 1:
            self._fail("window", f"must be >= 1, got {self.window}")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads


@dataclasses.dataclass(frozen=True)
class PositionConfig(_Validated):
    """Which position encoding, and its settings. ``kind`` is a name in ``POSITIONS``."""
    PATH = "model.position"
    kind: str = "rope"
    rope_base: float = 10000.0
    rope_fraction: float = 1.0                  # fraction of head_dim that rotates
    rope_scaling: Literal["default", "linear", "ntk", "dynamic_ntk", "yarn"] = "default"
    rope_scale: float = 1.0                     # s = L_eval / L_train for linear / ntk / yarn
    train_length: int | None = None             # L_train; None = model.max_length
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    learned_interpolate: bool = False           # learned table stretched to longer inputs

    def _validate(self):
        POSITIONS.get(self.kind, f"{self.PATH}.kind")
        if not 0.0 < self.rope_fraction <= 1.0:
            self._fail("rope_fraction", f"must be in (0, 1], got {self.rope_fraction}")
        if self.rope_scale < 1.0:
            self._fail("rope_scale", f"must be >= 1, got {self.rope_scale}")


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Validated):
    """A decoder-only language model."""
    PATH = "model"
    vocab_size: int = 256
    d_model: int = 128
    num_layers: int = 4
    max_length: int = 256
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_ratio: float = 4.0
    norm: Literal["layer", "rms"] = "layer"
    norm_position: Literal["pre", "post"] = "pre"
    residual_dropout: float = 0.0
    tie_embeddings: bool = True
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"   # compute dtype
    attention: AttentionConfig = dataclasses.field(default_factory=AttentionConfig)
    position: PositionConfig = dataclasses.field(default_factory=PositionConfig)

    def _validate(self):
        from attnjax.ops.attention import check_kernel_supports, requested_options
        att = self.attention
        for name in ("vocab_size", "d_model", "num_layers", "max_length"):
            if getattr(self, name) < 1:
                self._fail(name, f"must be >= 1, got {getattr(self, name)}")
        if self.d_model % att.num_heads:
            self._fail("d_model", f"={self.d_model} is not divisible by "
                       f"attention.num_heads={att.num_heads}")
        if not 0.0 <= self.residual_dropout < 1.0:
            self._fail("residual_dropout", f"must be in [0, 1), got {self.residual_dropout}")
        position = POSITIONS.get(self.position.kind)
        asked = requested_options(
            bias=True if position.bias is not None else None,
            window=att.window, scale=(1.0,) if att.scale == "learned" else None,
            logit_soft_cap=att.logit_soft_cap, sink=None if att.sink == "none" else 0.0,
            dropout_rate=att.dropout_rate if att.dropout.startswith("probs") else 0.0)
        check_kernel_supports(att.kernel, asked, field="model.attention.kernel")
        if position.check is not None:
            position.check(self)
        for pair in att.knockout:
            if (len(pair) != 2 or not 0 <= pair[0] < self.num_layers
                    or not 0 <= pair[1] < att.num_heads):
                self._fail("attention.knockout", f"entry {list(pair)} must be [layer, head] with "
                           f"0 <= layer < num_layers={self.num_layers} and 0 <= head < "
                           f"num_heads={att.num_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.attention.num_heads


@dataclasses.dataclass(frozen=True)
class DataConfig(_Validated):
    """What to train on. ``text``: bytes of ``path`` (a file or directory; ``None`` = the
    built-in corpus, the interpreter's standard-library source); ``tokens``: a flat binary
    file of token ids; the rest are synthetic tasks generated on device."""
    PATH = "data"
    task: Literal["text", "tokens", "mqar", "copy", "sort", "induction"] = "text"
    path: str | None = None
    length: int = 128                           # training sequence length
    eval_lengths: tuple[int, ...] = ()          # extra evaluation lengths (length is always one)
    val_fraction: float = 0.1
    vocab_size: int = 256                       # synthetic tasks and token files
    num_pairs: int = 8                          # mqar key-value pairs
    token_dtype: Literal["uint16", "uint32", "int32"] = "uint16"

    def _validate(self):
        if self.length < 2:
            self._fail("length", f"must be >= 2, got {self.length}")
        if any(n < 2 for n in self.eval_lengths):
            self._fail("eval_lengths", f"must all be >= 2, got {self.eval_lengths}")
        if not 0.0 < self.val_fraction < 1.0:
            self._fail("val_fraction", f"must be in (0, 1), got {self.val_fraction}")
        if self.task == "tokens" and self.path is None:
            self._fail("path", "is required for task='tokens'")
        if self.task == "mqar":
            for n in (self.length,) + self.eval_lengths:
                if n < 3 * self.num_pairs:
                    self._fail("length", f"={n} must be >= 3 * num_pairs = {3 * self.num_pairs} "
                               "for mqar (pairs, then one query per pair)")
        if self.task == "text" and self.vocab_size != 256:
            self._fail("vocab_size", f"is 256 for byte-level text, got {self.vocab_size}")


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Validated):
    """Optimisation, evaluation, logging and checkpoint cadence."""
    PATH = "train"
    steps: int = 1000
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    final_lr_fraction: float = 0.1              # cosine decays to this fraction of the peak
    weight_decay: float = 0.1                   # on matrices only: not on norms, biases, scalars
    b1: float = 0.9
    b2: float = 0.95
    clip_norm: float | None = 1.0
    grad_accum: int = 1                         # micro-batches per update (batch split evenly)
    z_loss: float = 0.0                         # coefficient of log^2 Z
    entropy_reg: float = 0.0                    # coefficient of mean attention entropy
    steps_per_dispatch: int = 1                 # >1: lax.scan over steps, data made on device
    parallel: Literal["mesh", "pmap"] = "mesh"
    log_every: int = 50
    eval_every: int = 500
    eval_batches: int = 8
    eval_batch_size: int = 32
    checkpoint_every: int = 500
    keep_best: int = 1                          # checkpoints kept by validation loss (plus latest)
    head_metrics: bool = False                  # log per-head attention statistics (log_every)

    def _validate(self):
        for name in ("steps", "batch_size", "grad_accum", "steps_per_dispatch", "log_every",
                     "eval_every", "eval_batches", "eval_batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                self._fail(name, f"must be >= 1, got {getattr(self, name)}")
        if self.batch_size % self.grad_accum:
            self._fail("grad_accum", f"={self.grad_accum} must divide batch_size={self.batch_size}")
        if self.learning_rate <= 0:
            self._fail("learning_rate", f"must be > 0, got {self.learning_rate}")
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
    seed: int = 0

    def _validate(self):
        if self.model.vocab_size < self.data.vocab_size:
            self._fail("model.vocab_size", f"={self.model.vocab_size} is smaller than the "
                       f"data's vocabulary ({self.data.vocab_size})")
        if self.data.length > self.model.max_length:
            self._fail("data.length", f"={self.data.length} exceeds model.max_length="
                       f"{self.model.max_length}")
        kernel = self.model.attention.kernel
        if self.train.head_metrics and not KERNELS.get(kernel).exact:
            self._fail("train.head_metrics", f"needs attention weights, which model.attention."
                       f"kernel={kernel!r} does not have (it is not softmax attention)")


def from_dict(cls, data: dict, path: str | None = None):
    """Build dataclass ``cls`` from a (nested) dict; unknown keys are an error listing valid ones."""
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
    """``'4'`` -> 4, ``'0.5'`` -> 0.5, ``'true'`` -> True, ``'null'``/``'None'`` -> None, else str."""
    if text == "None":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(config, overrides: dict[str, Any] | list[str]):
    """Return a copy of ``config`` with dotted overrides applied.

    ``overrides`` is a dict ``{"model.attention.num_heads": 8}`` or a list of ``KEY=VALUE``
    strings (values parsed as JSON where possible, else kept as strings). Keys are relative to
    the top-level config (``model.d_model``, ``seed``).
    """
    if isinstance(overrides, (list, tuple)):
        pairs = {}
        for item in overrides:
            if "=" not in item:
                raise ValueError(f"override {item!r} must look like KEY=VALUE")
            key, value = item.split("=", 1)
            pairs[key.strip()] = _parse_value(value.strip())
        overrides = pairs
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
