"""Hugging Face architectures as attnjax models: each reads a ``config.json`` into a
``ModelConfig`` that computes the same function, and its tensors into that model's parameter
tree. What a checkpoint sets that the mapping does not express (an activation, a RoPE
scaling type, a sliding window, a tensor nobody reads) is refused in one line, never
approximated.

- ``gpt2``: pre-norm LayerNorm blocks, learned positions, GELU (tanh), biases everywhere,
  fused ``c_attn`` in Conv1D layout (``x @ W``), the output tied to the token embedding.
- ``llama``, ``mistral``, ``qwen2``: pre-norm RMSNorm blocks, rotate-half RoPE at
  ``rope_theta`` (with Llama 3.1's frequency bands when ``rope_scaling`` says ``llama3``),
  grouped-query attention, SwiGLU of ``intermediate_size``, no biases (Qwen2: on q, k and v;
  ``attention_bias`` on all four in Llama), untied output unless ``tie_word_embeddings``.
- ``bert``: post-norm LayerNorm blocks, learned absolute positions and token types, LayerNorm
  on the summed embeddings, exact GELU; ``BertForMaskedLM`` (weights under ``bert.``) with
  the masked-language head ``cls.predictions`` tied to the word embeddings, a ``BertModel``
  (MiniLM, sentence-embedding models) outputting its last hidden states.

Torch ``Linear`` weights are ``[out, in]`` (``y = x W^T``); attnjax's kernels are ``[in, ...]``
with heads as axes: queries ``[d, N, H]``, the output projection ``[N, H, d]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np
from flax.traverse_util import flatten_dict

from attnjax.config import AttentionConfig, ModelConfig, PositionConfig
from attnjax.models import parameter_shapes
from attnjax.pretrained.weights import DTYPES, FLOATS


class CheckpointError(ValueError):
    """A checkpoint's tensors that a mapping refuses (missing, unread, of a dtype it does not
    read, a tie that does not hold)."""


class Placeholder(np.ndarray):
    """A tensor's shape without its data (a zero-strided array of float32 zeros) that
    remembers the tensor it stands for (``source``) through views, reshapes and splits: a
    mapping run on placeholders gives every parameter's shape before any data is read."""

    source: str | None = None

    def __array_finalize__(self, obj):
        self.source = getattr(obj, "source", None)

    def __array_function__(self, func, types, args, kwargs):
        """``np.concatenate`` of placeholders is the placeholder of the joined shape (nothing
        allocated), standing for all of their tensors."""
        if func is not np.concatenate:
            return super().__array_function__(func, types, args, kwargs)
        arrays, axis = args[0], kwargs.get("axis", args[1] if len(args) > 1 else 0)
        shapes = [a.shape for a in arrays]
        if any(not -len(shape) <= axis < len(shape) for shape in shapes):
            raise ValueError(f"cannot concatenate shapes {shapes} on axis {axis}")
        rests = [list(shape) for shape in shapes]
        joined = sum(rest.pop(axis) for rest in rests)
        if any(rest != rests[0] for rest in rests):
            raise ValueError(f"cannot concatenate shapes {shapes} on axis {axis}")
        shape = rests[0]
        shape.insert(axis % (len(shape) + 1), joined)
        return placeholder(" + ".join(str(getattr(a, "source", "?")) for a in arrays),
                           tuple(shape))


def placeholder(name: str, shape: tuple[int, ...]) -> Placeholder:
    array = np.broadcast_to(np.float32(0), shape).view(Placeholder)
    array.source = name
    return array


class Checkpoint:
    """A checkpoint's tensors (``headers``: name -> a header with ``shape``, ``floating`` and
    ``type_name``: ``weights.Tensor``, ``gguf.GGUFTensor``) and how a mapping gets one: its
    data (``load(name)``), or without ``load`` a ``placeholder`` of its shape; ``last`` is the
    name of the tensor asked for last."""

    def __init__(self, headers: dict, load: Callable[[str], np.ndarray] | None = None):
        self.headers, self.load, self.last = headers, load, None

    @property
    def read(self) -> bool:
        return self.load is not None

    def get(self, name: str) -> np.ndarray:
        self.last = name
        return (self.load(name) if self.read
                else placeholder(name, self.headers[name].shape))


class Tensors:
    """A checkpoint's tensors by name, under the first of ``prefixes`` its names use (``bert.``
    when saved from a model with a head); a tensor taken must be floating point;
    ``check_all_read`` refuses a checkpoint with tensors nobody took (but those whose names
    contain one of ``skip``: buffers and unused parts)."""

    def __init__(self, checkpoint: Checkpoint, prefixes=(), skip=()):
        names = checkpoint.headers
        self.prefix = next((p for p in prefixes if any(k.startswith(p) for k in names)), "")
        self.checkpoint, self.skip, self.taken = checkpoint, tuple(skip), set()

    def __call__(self, name: str, prefixed: bool = True) -> np.ndarray:
        key = self.prefix + name if prefixed else name
        tensor = self.checkpoint.headers.get(key)
        if tensor is None:
            raise CheckpointError(f"the checkpoint has no tensor {key!r}")
        if not tensor.floating:
            raise CheckpointError(f"tensor {key!r} is {tensor.type_name}; supported: "
                                  f"{', '.join(DTYPES[name].name for name in FLOATS)}")
        self.taken.add(key)
        return self.checkpoint.get(key)

    def has(self, name: str, prefixed: bool = True) -> bool:
        return (self.prefix + name if prefixed else name) in self.checkpoint.headers

    def tied(self, name: str, embedding: np.ndarray) -> None:
        """A saved copy (``name``, unprefixed) of an output layer tied to ``embedding`` must
        equal it (in shape, and in value once the data is read)."""
        if not self.has(name, prefixed=False):
            return
        saved = self(name, prefixed=False)
        if saved.shape != embedding.shape or (self.checkpoint.read
                                              and not np.array_equal(saved, embedding)):
            raise CheckpointError(f"the checkpoint's {name!r} differs from the embedding it is "
                                  "tied to")

    def check_all_read(self) -> None:
        rest = sorted(k for k in self.checkpoint.headers
                      if k not in self.taken and not any(s in k for s in self.skip))
        if rest:
            raise CheckpointError(f"the checkpoint has {len(rest)} tensor(s) this mapping "
                                  f"does not read, e.g. {rest[0]!r}: an architecture variant "
                                  "attnjax does not express")


REQUIRED = object()


def integer(hf: dict, key: str, default=REQUIRED, within: str = "", low: int = 1) -> int:
    """``hf[key]`` (or ``default`` where it is absent or null), an integer of at least ``low``
    (a whole float such as 2048.0 counts); else one line naming the key (as ``within.key``
    for a key of the section ``within``)."""
    value = default if hf.get(key) is None else hf[key]
    name = f"{within}.{key}" if within else key
    if value is REQUIRED:
        raise ValueError(f"config.json has no {name}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"config.json: {name}={value!r} is not an integer >= {low}")
    return value


def number(hf: dict, key: str, default=REQUIRED, within: str = "") -> float:
    """``hf[key]`` (or ``default``), a finite number > 0; else one line naming the key (as
    ``within.key`` for a key of the section ``within``)."""
    value = default if hf.get(key) is None else hf[key]
    name = f"{within}.{key}" if within else key
    if value is REQUIRED:
        raise ValueError(f"config.json has no {name}")
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"config.json: {name}={value!r} is not a finite number > 0")
    return float(value)


def section(hf: dict, key: str) -> dict:
    """``hf[key]``, a JSON object (absent or null: empty); else one line naming the key."""
    value = hf.get(key) or {}
    if not isinstance(value, dict):
        raise ValueError(f"config.json: {key} is a {type(value).__name__}, not an object")
    return value


def setting(hf: dict, key: str, supported: tuple, default=None):
    """``hf[key]`` (or ``default`` where it is absent or null) if it is one of ``supported``,
    else a one-line refusal."""
    value = default if hf.get(key) is None else hf[key]
    if not any(type(value) is type(s) and value == s for s in supported):
        raise ValueError(f"config.json: {key}={value!r} is not supported for model_type "
                         f"{hf.get('model_type')!r}; supported: "
                         f"{', '.join(map(repr, supported))}")
    return value


ROPE_TYPES = ("default", "llama3")          # Hugging Face rope types attnjax computes


def rope_position(hf: dict) -> PositionConfig:
    """Rotate-half RoPE at the base ``rope_theta``, read from ``rope_parameters`` (transformers
    5) or the top level with ``rope_scaling``: the plain rotation, or Llama 3.1's frequency
    bands (``factor``, ``original_max_position_embeddings``, ``low_freq_factor``,
    ``high_freq_factor``); other scaling types are refused."""
    parameters = section(hf, "rope_parameters")
    within = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    scaling = section(hf, "rope_scaling") or parameters
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if not isinstance(kind, str) or kind not in ROPE_TYPES:
        raise ValueError(f"config.json: rope scaling type {kind!r} is not supported for "
                         f"model_type {hf.get('model_type')!r}; supported: "
                         f"{', '.join(map(repr, ROPE_TYPES))}")
    base = (number(parameters, "rope_theta", within="rope_parameters")
            if "rope_theta" in parameters else number(hf, "rope_theta", 10000.0))
    if kind == "default":
        return PositionConfig("rope", rope_base=base)
    return PositionConfig("rope", rope_base=base, rope_scaling="llama3",
                          rope_scale=number(scaling, "factor", within=within),
                          train_length=integer(scaling, "original_max_position_embeddings",
                                               within=within),
                          rope_low_freq_factor=number(scaling, "low_freq_factor", 1.0,
                                                      within),
                          rope_high_freq_factor=number(scaling, "high_freq_factor", 4.0,
                                                       within))


def heads_in(weight: np.ndarray, heads: int) -> np.ndarray:
    """A torch ``Linear`` weight ``[heads H, d]`` as an attnjax kernel ``[d, heads, H]``."""
    return weight.T.reshape(weight.shape[1], heads, -1)


def heads_out(weight: np.ndarray, heads: int) -> np.ndarray:
    """A torch output projection ``[d, heads H]`` as an attnjax kernel ``[heads, H, d]``."""
    return weight.T.reshape(heads, -1, weight.shape[0])


def dense(weight: np.ndarray, bias: np.ndarray | None = None) -> dict:
    """A torch ``Linear`` as a Flax ``Dense``: kernel ``W^T`` (and bias)."""
    return {"kernel": weight.T, **({} if bias is None else {"bias": bias})}


def norm(t: Tensors, name: str, bias: bool = True, prefixed: bool = True) -> dict:
    """A norm's scale (and bias): ``weight`` / ``bias``, or old checkpoints' ``gamma`` /
    ``beta``."""
    scale, shift = (("weight", "bias") if t.has(f"{name}.weight", prefixed)
                    else ("gamma", "beta"))
    return {"scale": t(f"{name}.{scale}", prefixed),
            **({"bias": t(f"{name}.{shift}", prefixed)} if bias else {})}


# ------------------------------------------------------------------------------------ GPT-2

GELUS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact"}


def gpt2_config(hf: dict) -> ModelConfig:
    act = setting(hf, "activation_function", tuple(GELUS), "gelu_new")
    setting(hf, "scale_attn_weights", (True,), True)
    setting(hf, "scale_attn_by_inverse_layer_idx", (False,), False)
    d = integer(hf, "n_embd")
    return ModelConfig(
        family="decoder", vocab_size=integer(hf, "vocab_size"), d_model=d,
        num_layers=integer(hf, "n_layer"), max_length=integer(hf, "n_positions"),
        mlp=GELUS[act], mlp_hidden=integer(hf, "n_inner", 4 * d),
        norm="layer", norm_eps=number(hf, "layer_norm_epsilon", 1e-5), embed_scale=1.0,
        tie_embeddings=True, position=PositionConfig("learned"),
        attention=AttentionConfig(num_heads=integer(hf, "n_head"), use_bias=True,
                                  fused_qkv=False))


def gpt2_params(tensors: Checkpoint, config: ModelConfig) -> dict:
    # skipped: the causal-mask buffers old checkpoints saved
    t = Tensors(tensors, ("transformer.",), skip=(".attn.bias", ".attn.masked_bias"))
    N = config.attention.num_heads
    params = {"embed": {"embedding": t("wte.weight")}, "position_embedding": t("wpe.weight"),
              "final_norm": norm(t, "ln_f")}
    for i in range(config.num_layers):
        p = f"h.{i}."
        q, k, v = np.split(t(p + "attn.c_attn.weight"), 3, axis=1)     # Conv1D: [d, 3d]
        qb, kb, vb = np.split(t(p + "attn.c_attn.bias"), 3)
        attention = {name: {"kernel": w.reshape(w.shape[0], N, -1), "bias": b.reshape(N, -1)}
                     for name, w, b in (("query", q, qb), ("key", k, kb), ("value", v, vb))}
        out = t(p + "attn.c_proj.weight")
        attention["out"] = {"kernel": out.reshape(N, -1, out.shape[1]),
                            "bias": t(p + "attn.c_proj.bias")}
        params[f"block_{i}"] = {
            "attention_norm": norm(t, p + "ln_1"), "attention": attention,
            "mlp_norm": norm(t, p + "ln_2"),
            "mlp": {"up": {"kernel": t(p + "mlp.c_fc.weight"), "bias": t(p + "mlp.c_fc.bias")},
                    "down": {"kernel": t(p + "mlp.c_proj.weight"),
                             "bias": t(p + "mlp.c_proj.bias")}}}
    t.tied("lm_head.weight", params["embed"]["embedding"])
    t.check_all_read()
    return params


# ------------------------------------------------------------------- Llama, Mistral, Qwen2

def llama_config(hf: dict) -> ModelConfig:
    setting(hf, "hidden_act", ("silu",), "silu")
    if hf.get("model_type") == "mistral" or hf.get("use_sliding_window"):
        setting(hf, "sliding_window", (None,), None)
    qkv_bias = (hf.get("model_type") == "qwen2"
                or setting(hf, "attention_bias", (False, True), False))
    heads, width = integer(hf, "num_attention_heads"), integer(hf, "hidden_size")
    return ModelConfig(
        family="decoder", vocab_size=integer(hf, "vocab_size"), d_model=width,
        num_layers=integer(hf, "num_hidden_layers"),
        max_length=integer(hf, "max_position_embeddings"), mlp="swiglu",
        mlp_hidden=integer(hf, "intermediate_size"),
        mlp_bias=setting(hf, "mlp_bias", (False, True), False),
        norm="rms", norm_eps=number(hf, "rms_norm_eps", 1e-6), embed_scale=1.0,
        tie_embeddings=setting(hf, "tie_word_embeddings", (False, True), False),
        position=rope_position(hf),
        attention=AttentionConfig(
            num_heads=heads, num_kv_heads=integer(hf, "num_key_value_heads", heads),
            head_dim=integer(hf, "head_dim", width // heads), use_bias=qkv_bias,
            fused_qkv=False))


def llama_params(tensors: Checkpoint, config: ModelConfig) -> dict:
    t = Tensors(tensors, ("model.",), skip=("rotary_emb.inv_freq",))   # recomputed buffers
    att = config.attention
    params = {"embed": {"embedding": t("embed_tokens.weight")}, "final_norm": norm(t, "norm",
                                                                                  False)}
    for i in range(config.num_layers):
        p = f"layers.{i}."
        attention = {}
        for name, proj, heads in (("query", "q_proj", att.num_heads),
                                  ("key", "k_proj", att.kv_heads),
                                  ("value", "v_proj", att.kv_heads)):
            attention[name] = {"kernel": heads_in(t(f"{p}self_attn.{proj}.weight"), heads)}
            if att.use_bias:
                attention[name]["bias"] = t(f"{p}self_attn.{proj}.bias").reshape(heads, -1)
        attention["out"] = {"kernel": heads_out(t(p + "self_attn.o_proj.weight"), att.num_heads)}
        if att.use_bias:       # Qwen2 has none on the output projection: zero is exact
            name = p + "self_attn.o_proj.bias"
            attention["out"]["bias"] = (t(name) if t.has(name)
                                        else np.zeros(config.d_model, np.float32))
        gate, up = t(p + "mlp.gate_proj.weight"), t(p + "mlp.up_proj.weight")
        mlp = {"gate_up": {"kernel": np.concatenate([gate.T, up.T], axis=1)},
               "down": {"kernel": t(p + "mlp.down_proj.weight").T}}
        if config.mlp_bias:
            mlp["gate_up"]["bias"] = np.concatenate([t(p + "mlp.gate_proj.bias"),
                                                     t(p + "mlp.up_proj.bias")])
            mlp["down"]["bias"] = t(p + "mlp.down_proj.bias")
        params[f"block_{i}"] = {"attention_norm": norm(t, p + "input_layernorm", False),
                                "attention": attention,
                                "mlp_norm": norm(t, p + "post_attention_layernorm", False),
                                "mlp": mlp}
    if config.tie_embeddings:
        t.tied("lm_head.weight", params["embed"]["embedding"])
    else:
        params["unembed"] = {"kernel": t("lm_head.weight", prefixed=False).T}
    t.check_all_read()
    return params


# ------------------------------------------------------------------------------------- BERT

MLM_HEADED = ("BertForMaskedLM", "BertForPreTraining")   # BERTs saved with cls.predictions


def bert_config(hf: dict) -> ModelConfig:
    act = setting(hf, "hidden_act", ("gelu", "gelu_new"), "gelu")
    setting(hf, "position_embedding_type", ("absolute",), "absolute")
    architectures = hf.get("architectures") or []
    if not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        raise ValueError(f"config.json: architectures={architectures!r} is not a list of "
                         "class names")
    headed = any(name in MLM_HEADED for name in architectures)
    return ModelConfig(
        classifier="none" if headed else "hidden",
        family="encoder", vocab_size=integer(hf, "vocab_size"),
        d_model=integer(hf, "hidden_size"), num_layers=integer(hf, "num_hidden_layers"),
        max_length=integer(hf, "max_position_embeddings"), mlp=GELUS[act],
        mlp_hidden=integer(hf, "intermediate_size"), norm="layer",
        norm_eps=number(hf, "layer_norm_eps", 1e-12), norm_position="post", embed_norm=True,
        embed_scale=1.0, type_vocab_size=integer(hf, "type_vocab_size", 2),
        tie_embeddings=True, position=PositionConfig("learned"),
        attention=AttentionConfig(num_heads=integer(hf, "num_attention_heads"), use_bias=True,
                                  fused_qkv=False))


def bert_params(tensors: Checkpoint, config: ModelConfig) -> dict:
    headed = config.classifier == "none"
    if headed and not any(k.startswith("cls.predictions.") for k in tensors.headers):
        raise CheckpointError(f"config.json: architectures names one of "
                              f"{', '.join(MLM_HEADED)} but the checkpoint has no "
                              "masked-language head (cls.predictions.*)")
    # not the masked LM: the [CLS] pooler, next-sentence head, the position-id buffer
    t = Tensors(tensors, ("bert.",), skip=("pooler.", "cls.seq_relationship.", "position_ids"))
    N = config.attention.num_heads
    e = "embeddings."
    params = {"embed": {"embedding": t(e + "word_embeddings.weight")},
              "position_embedding": t(e + "position_embeddings.weight"),
              "type_embed": {"embedding": t(e + "token_type_embeddings.weight")},
              "embed_norm": norm(t, e + "LayerNorm")}
    for i in range(config.num_layers):
        p = f"encoder.layer.{i}."
        attention = {name: {"kernel": heads_in(t(f"{p}attention.self.{name}.weight"), N),
                            "bias": t(f"{p}attention.self.{name}.bias").reshape(N, -1)}
                     for name in ("query", "key", "value")}
        attention["out"] = {"kernel": heads_out(t(p + "attention.output.dense.weight"), N),
                            "bias": t(p + "attention.output.dense.bias")}
        params[f"block_{i}"] = {
            "attention": attention, "attention_norm": norm(t, p + "attention.output.LayerNorm"),
            "mlp": {"up": dense(t(p + "intermediate.dense.weight"),
                                t(p + "intermediate.dense.bias")),
                    "down": dense(t(p + "output.dense.weight"), t(p + "output.dense.bias"))},
            "mlp_norm": norm(t, p + "output.LayerNorm")}
    if headed:
        params["mlm_head"] = mlm_head(t, params["embed"]["embedding"])
    t.check_all_read()
    return params


def mlm_head(t: Tensors, embedding: np.ndarray) -> dict:
    """BERT's ``cls.predictions``: the transform, its LayerNorm and the output bias (the
    output matrix tied to ``embedding``)."""
    head = lambda name: t(f"cls.predictions.{name}", prefixed=False)
    params = {"transform": dense(head("transform.dense.weight"),
                                             head("transform.dense.bias")),
                          "transform_norm": norm(t, "cls.predictions.transform.LayerNorm",
                                                 prefixed=False),
              "bias": head("bias")}
    t.tied("cls.predictions.decoder.weight", embedding)
    t.tied("cls.predictions.decoder.bias", params["bias"])
    return params


class Architecture(NamedTuple):
    config: Callable[[dict], ModelConfig]
    params: Callable[[Checkpoint, ModelConfig], dict]


ARCHITECTURES = {"gpt2": Architecture(gpt2_config, gpt2_params),
                 "llama": Architecture(llama_config, llama_params),
                 "mistral": Architecture(llama_config, llama_params),
                 "qwen2": Architecture(llama_config, llama_params),
                 "bert": Architecture(bert_config, bert_params)}


def architecture(hf: dict) -> Architecture:
    kind = hf.get("model_type")
    if not isinstance(kind, str) or kind not in ARCHITECTURES:
        raise ValueError(f"config.json: model_type={kind!r} is not supported; supported: "
                         f"{', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[kind]


def mapped_params(mapping: Architecture, weights, config: ModelConfig) -> dict:
    """The float32 parameter tree of ``config``'s model from ``weights``. The mapping runs on
    placeholders first, so that a missing, unread or non-floating tensor, a tie between
    tensors of two shapes, or a tensor whose shape is not the one ``config`` (config.json)
    gives its parameter is refused, naming the tensor, before any tensor's data is read; then
    on the data."""
    check_shapes(mapping, weights, config)
    return as_tree(mapping.params(Checkpoint(weights.headers, weights.load), config))


def check_shapes(mapping: Architecture, weights, config: ModelConfig) -> None:
    """The mapping on placeholders (``mapped_params``), each parameter's shape against
    ``config``'s model."""
    shapes = Checkpoint(weights.headers)
    try:
        shaped = mapping.params(shapes, config)
    except CheckpointError:
        raise
    except (ValueError, IndexError) as error:   # NumPy's, where a tensor has another shape
        raise ValueError(f"the tensors do not fit the model config.json describes ({error}; "
                         f"last read: {shapes.last!r} of shape "
                         f"{list(weights.headers[shapes.last].shape)})") from None
    wanted, found = parameter_shapes(config), flatten_dict(shaped, sep="/")
    if found.keys() != wanted.keys():
        name = sorted(found.keys() ^ wanted.keys())[0]
        raise ValueError(f"the tensors give the parameters of another model than config.json "
                         f"describes (e.g. {name})")
    for path, array in found.items():
        if array.shape != wanted.get(path):
            source = (f"tensor {array.source!r} gives {path}" if getattr(array, "source", None)
                      else f"the tensors give {path}")
            raise ValueError(f"{source} the shape {array.shape}, but config.json's model "
                             f"needs {wanted.get(path)}")


def as_tree(params: dict) -> dict:
    """``params`` with every leaf a float32 ``jax.Array`` of its own, replaced in place, so
    that a tensor the mapping read is let go as its last view is replaced: the parameters
    exist about once, as the checkpoint writer takes them."""
    host = jax.devices("cpu")[0]       # not an accelerator's memory: the writer reads them
    for key, value in params.items():
        params[key] = (as_tree(value) if isinstance(value, dict) else
                       jax.device_put(np.asarray(value, np.float32), host))
    return params
