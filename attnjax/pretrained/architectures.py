"""Hugging Face architectures as attnjax models, both ways: each reads a ``config.json`` into a
``ModelConfig`` that computes the same function (``config``), lists that model's tensors as a
name table (``table``: ``attnjax.pretrained.links``, which the import reads one way and the
export the other) and writes the model back as its ``config.json`` (``hf``, for the export).
What a checkpoint sets that the mapping does not express (an activation, a RoPE scaling type,
a sliding window, a tensor nobody reads) is refused in one line, never approximated.

- ``gpt2``: pre-norm LayerNorm blocks, learned positions, GELU (tanh), biases everywhere,
  fused ``c_attn`` in Conv1D layout (``x @ W``), the output tied to the token embedding.
- ``llama``, ``mistral``, ``qwen2``: pre-norm RMSNorm blocks, rotate-half RoPE at
  ``rope_theta`` (with Llama 3.1's frequency bands when ``rope_scaling`` says ``llama3``),
  grouped-query attention, SwiGLU of ``intermediate_size``, no biases (Qwen2: on q, k and v;
  ``attention_bias`` on all four in Llama), untied output unless ``tie_word_embeddings``.
- ``bert``: post-norm LayerNorm blocks, learned absolute positions and token types, LayerNorm
  on the summed embeddings, exact GELU; ``BertForMaskedLM`` (weights under ``bert.``) with
  the masked-language head ``cls.predictions`` tied to the word embeddings, a ``BertModel``
  (MiniLM, sentence-embedding models) outputting its last hidden states, or a
  ``BertForSequenceClassification``: BERT's [CLS] pooler and a classifier
  (``model.classifier=cls``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np
from flax.traverse_util import flatten_dict

from attnjax.config import AttentionConfig, ModelConfig, PositionConfig
from attnjax.models import parameter_shapes
from attnjax.nn.transformer import mlp_width
from attnjax.pretrained.links import (GATE_UP, TRANSPOSED, Link, Table, by_head, heads_in,
                                      heads_out, norm_links, read_links, thirds)
from attnjax.pretrained.tensors import Checkpoint, CheckpointError
from attnjax.registry import DROPOUTS

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


# -------------------------------------------------------------------------- shared by several

GELUS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact"}
GELU_NAMES = {"gelu": "gelu_new", "gelu_exact": "gelu"}      # attnjax's GELUs as written back


def probability_dropout(model: ModelConfig) -> float:
    """The rate of dropout on the attention probabilities, as Hugging Face configs hold it
    (training only: it changes no output)."""
    att = model.attention
    return att.dropout_rate if DROPOUTS.get(att.dropout).on_probs else 0.0


def block_links(i: int, names: dict, attention: list[Link], mlp: list[Link],
                bias: bool = True) -> list[Link]:
    """Block ``i``'s links in the parameter tree's order: the attention's norm (tensor
    ``names["attention_norm"]``), the ``attention`` links, the MLP's norm, the ``mlp`` links
    (norms with a bias unless ``bias`` is False)."""
    block = f"block_{i}/"
    return [*norm_links(names["attention_norm"], block + "attention_norm", bias), *attention,
            *norm_links(names["mlp_norm"], block + "mlp_norm", bias), *mlp]


# ------------------------------------------------------------------------------------ GPT-2

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


def gpt2_hf(model: ModelConfig) -> dict:
    """``model`` as GPT-2's config.json (``gpt2_config`` backwards; what GPT-2 cannot hold is
    left at GPT-2's own value, for the export to find by reading it back)."""
    width = mlp_width(model)
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": model.vocab_size, "n_embd": model.d_model,
            "n_layer": model.num_layers, "n_head": model.attention.num_heads,
            "n_positions": model.max_length,
            "n_inner": None if width == 4 * model.d_model else width,
            "activation_function": GELU_NAMES.get(model.mlp, "gelu_new"),
            "layer_norm_epsilon": model.norm_eps, "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False, "tie_word_embeddings": True,
            "embd_pdrop": model.residual_dropout, "resid_pdrop": model.residual_dropout,
            "attn_pdrop": probability_dropout(model)}


def gpt2_table(config: ModelConfig) -> Table:
    """GPT-2's tensors: Conv1D weights are ``[in, out]`` already (``x @ W``), the query, key
    and value fused in ``c_attn``; the output tied to ``wte`` (``lm_head.weight``, where
    saved, a copy); the causal-mask buffers of old checkpoints skipped."""
    N = config.attention.num_heads
    links = [Link(("wte.weight",), ("embed/embedding",)),
             Link(("wpe.weight",), ("position_embedding",)), *norm_links("ln_f", "final_norm")]
    for i in range(config.num_layers):
        p, a, m = f"h.{i}.", f"block_{i}/attention/", f"block_{i}/mlp/"
        qkv = [a + "query/", a + "key/", a + "value/"]
        links += block_links(i, {"attention_norm": p + "ln_1", "mlp_norm": p + "ln_2"}, [
            Link((p + "attn.c_attn.weight",), tuple(x + "kernel" for x in qkv), thirds(N)),
            Link((p + "attn.c_attn.bias",), tuple(x + "bias" for x in qkv), thirds(N)),
            Link((p + "attn.c_proj.weight",), (a + "out/kernel",), by_head(N)),
            Link((p + "attn.c_proj.bias",), (a + "out/bias",))], [
            Link((p + "mlp.c_fc.weight",), (m + "up/kernel",)),
            Link((p + "mlp.c_fc.bias",), (m + "up/bias",)),
            Link((p + "mlp.c_proj.weight",), (m + "down/kernel",)),
            Link((p + "mlp.c_proj.bias",), (m + "down/bias",))])
    links.append(Link(("lm_head.weight",), ("embed/embedding",), prefixed=False, tied=True))
    return Table(links, "transformer.", ("transformer.",), (".attn.bias", ".attn.masked_bias"))


# ------------------------------------------------------------------- Llama, Mistral, Qwen2

CAUSAL_LMS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
              "qwen2": "Qwen2ForCausalLM"}


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


def llama_hf(model: ModelConfig, kind: str = "llama") -> dict:
    """``model`` as the config.json of ``kind`` (llama, mistral or qwen2; ``llama_config``
    backwards, as ``gpt2_hf``). The rotation is written for transformers 5
    (``rope_parameters``) and 4 (``rope_theta``, ``rope_scaling``) alike; Mistral and Qwen2
    get no sliding window, and only Llama its bias flags (the others have none to set)."""
    att, pos = model.attention, model.position
    rope = {"rope_type": "default", "rope_theta": pos.rope_base}
    if pos.rope_scaling == "llama3":
        rope.update(rope_type="llama3", factor=pos.rope_scale,
                    original_max_position_embeddings=pos.train_length or model.max_length,
                    low_freq_factor=pos.rope_low_freq_factor,
                    high_freq_factor=pos.rope_high_freq_factor)
    hf = {"architectures": [CAUSAL_LMS[kind]], "model_type": kind,
          "vocab_size": model.vocab_size, "hidden_size": model.d_model,
          "intermediate_size": mlp_width(model), "num_hidden_layers": model.num_layers,
          "num_attention_heads": att.num_heads, "num_key_value_heads": att.kv_heads,
          "head_dim": model.head_dim, "hidden_act": "silu",
          "max_position_embeddings": model.max_length, "rms_norm_eps": model.norm_eps,
          "tie_word_embeddings": model.tie_embeddings, "rope_parameters": rope,
          "rope_theta": pos.rope_base,
          "rope_scaling": None if rope["rope_type"] == "default" else
          {key: value for key, value in rope.items() if key != "rope_theta"},
          "attention_dropout": probability_dropout(model)}
    if kind == "llama":
        hf.update(attention_bias=att.use_bias, mlp_bias=model.mlp_bias)
    else:
        hf.update(sliding_window=None, **{"use_sliding_window": False} if kind == "qwen2"
                  else {})
    return hf


def llama_table(config: ModelConfig, qwen2: bool = False) -> Table:
    """Llama's tensors (Mistral's and Qwen2's too): rotate-half RoPE as attnjax computes it,
    so the query and key rows map as they are; the gate and up projections one kernel; the
    recomputed RoPE frequency buffers of old checkpoints skipped. Qwen2's output projection
    has no bias: absent reads as zero (exact), and an export to Qwen2 leaves it out."""
    att = config.attention
    links = [Link(("embed_tokens.weight",), ("embed/embedding",)),
             *norm_links("norm", "final_norm", bias=False)]
    for i in range(config.num_layers):
        p, a, m = f"layers.{i}.", f"block_{i}/attention/", f"block_{i}/mlp/"
        attention = []
        for name, proj, heads in (("query", "q_proj", att.num_heads),
                                  ("key", "k_proj", att.kv_heads),
                                  ("value", "v_proj", att.kv_heads)):
            attention.append(Link((f"{p}self_attn.{proj}.weight",), (f"{a}{name}/kernel",),
                                  heads_in(heads)))
            if att.use_bias:
                attention.append(Link((f"{p}self_attn.{proj}.bias",), (f"{a}{name}/bias",),
                                      by_head(heads)))
        attention.append(Link((p + "self_attn.o_proj.weight",), (a + "out/kernel",),
                              heads_out(att.num_heads)))
        if att.use_bias:
            attention.append(Link((p + "self_attn.o_proj.bias",), (a + "out/bias",),
                                  absent=(config.d_model,), written=not qwen2))
        gate_up = (p + "mlp.gate_proj.", p + "mlp.up_proj.")
        mlp = [Link(tuple(x + "weight" for x in gate_up), (m + "gate_up/kernel",), GATE_UP),
               Link((p + "mlp.down_proj.weight",), (m + "down/kernel",), TRANSPOSED)]
        if config.mlp_bias:
            mlp[1:1] = [Link(tuple(x + "bias" for x in gate_up), (m + "gate_up/bias",),
                             GATE_UP)]
            mlp.append(Link((p + "mlp.down_proj.bias",), (m + "down/bias",)))
        links += block_links(i, {"attention_norm": p + "input_layernorm",
                                 "mlp_norm": p + "post_attention_layernorm"}, attention, mlp,
                             bias=False)
    links.append(Link(("lm_head.weight",), ("embed/embedding",), prefixed=False, tied=True)
                 if config.tie_embeddings else
                 Link(("lm_head.weight",), ("unembed/kernel",), TRANSPOSED, prefixed=False))
    return Table(links, "model.", ("model.",), ("rotary_emb.inv_freq",))


# ------------------------------------------------------------------------------------- BERT

MLM_HEADED = ("BertForMaskedLM", "BertForPreTraining")   # BERTs saved with cls.predictions
SEQUENCE_CLASSIFIER = "BertForSequenceClassification"   # the [CLS] pooler and a classifier
BERT_CLASSES = {"none": "BertForMaskedLM", "hidden": "BertModel", "cls": SEQUENCE_CLASSIFIER}


def bert_config(hf: dict) -> ModelConfig:
    act = setting(hf, "hidden_act", ("gelu", "gelu_new"), "gelu")
    setting(hf, "position_embedding_type", ("absolute",), "absolute")
    architectures = hf.get("architectures") or []
    if not (isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)):
        raise ValueError(f"config.json: architectures={architectures!r} is not a list of "
                         "class names")
    head = {}
    if any(name in MLM_HEADED for name in architectures):
        head = {"classifier": "none"}
    elif SEQUENCE_CLASSIFIER in architectures:
        labels = section(hf, "id2label")
        head = {"classifier": "cls", "num_classes": len(labels) if labels else
                integer(hf, "num_labels", 2)}
    return ModelConfig(
        **(head or {"classifier": "hidden"}),
        family="encoder", vocab_size=integer(hf, "vocab_size"),
        d_model=integer(hf, "hidden_size"), num_layers=integer(hf, "num_hidden_layers"),
        max_length=integer(hf, "max_position_embeddings"), mlp=GELUS[act],
        mlp_hidden=integer(hf, "intermediate_size"), norm="layer",
        norm_eps=number(hf, "layer_norm_eps", 1e-12), norm_position="post", embed_norm=True,
        embed_scale=1.0, type_vocab_size=integer(hf, "type_vocab_size", 2),
        tie_embeddings=True, position=PositionConfig("learned"),
        attention=AttentionConfig(num_heads=integer(hf, "num_attention_heads"), use_bias=True,
                                  fused_qkv=False))


def bert_hf(model: ModelConfig) -> dict:
    """``model`` as BERT's config.json (``bert_config`` backwards, as ``gpt2_hf``): a
    ``BertForMaskedLM``, a ``BertModel`` (hidden states) or a
    ``BertForSequenceClassification`` (a classifier on [CLS]) as ``model.classifier`` says."""
    hf = {"architectures": [BERT_CLASSES.get(model.classifier, SEQUENCE_CLASSIFIER)],
          "model_type": "bert", "vocab_size": model.vocab_size, "hidden_size": model.d_model,
          "num_hidden_layers": model.num_layers,
          "num_attention_heads": model.attention.num_heads,
          "intermediate_size": mlp_width(model), "hidden_act": GELU_NAMES.get(model.mlp, "gelu"),
          "max_position_embeddings": model.max_length, "type_vocab_size": model.type_vocab_size,
          "layer_norm_eps": model.norm_eps, "position_embedding_type": "absolute",
          "tie_word_embeddings": True, "hidden_dropout_prob": model.residual_dropout,
          "attention_probs_dropout_prob": probability_dropout(model)}
    if model.classifier in ("cls", "mean"):
        labels = [f"LABEL_{i}" for i in range(model.num_classes)]
        hf.update(id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    return hf


def bert_check(headers: dict, config: ModelConfig) -> None:
    """A checkpoint said to have the masked-language head must have it."""
    if config.classifier == "none" and not any(k.startswith("cls.predictions.") for k in headers):
        raise CheckpointError(f"config.json: architectures names one of "
                              f"{', '.join(MLM_HEADED)} but the checkpoint has no "
                              "masked-language head (cls.predictions.*)")


def bert_table(config: ModelConfig) -> Table:
    """BERT's tensors, under ``bert.`` in a model with a head: the embeddings (words,
    positions, token types) and their LayerNorm, post-norm blocks, and the head:
    ``cls.predictions`` (its output tied to the word embeddings; where saved, a copy), or the
    [CLS] pooler and ``classifier``. Read but not mapped: the pooler of a model without the
    classifier, the next-sentence head, the position-id buffer."""
    N, e = config.attention.num_heads, "embeddings."
    links = [Link((e + "word_embeddings.weight",), ("embed/embedding",)),
             Link((e + "position_embeddings.weight",), ("position_embedding",)),
             Link((e + "token_type_embeddings.weight",), ("type_embed/embedding",)),
             *norm_links(e + "LayerNorm", "embed_norm")]
    for i in range(config.num_layers):
        p, a, m = f"encoder.layer.{i}.", f"block_{i}/attention/", f"block_{i}/mlp/"
        attention = [link for name in ("query", "key", "value") for link in (
            Link((f"{p}attention.self.{name}.weight",), (f"{a}{name}/kernel",), heads_in(N)),
            Link((f"{p}attention.self.{name}.bias",), (f"{a}{name}/bias",), by_head(N)))]
        attention += [Link((p + "attention.output.dense.weight",), (a + "out/kernel",),
                           heads_out(N)),
                      Link((p + "attention.output.dense.bias",), (a + "out/bias",))]
        mlp = [Link((p + "intermediate.dense.weight",), (m + "up/kernel",), TRANSPOSED),
               Link((p + "intermediate.dense.bias",), (m + "up/bias",)),
               Link((p + "output.dense.weight",), (m + "down/kernel",), TRANSPOSED),
               Link((p + "output.dense.bias",), (m + "down/bias",))]
        links += block_links(i, {"attention_norm": p + "attention.output.LayerNorm",
                                 "mlp_norm": p + "output.LayerNorm"}, attention, mlp)
    if config.classifier == "none":
        head = "cls.predictions."
        links += [Link((head + "transform.dense.weight",), ("mlm_head/transform/kernel",),
                       TRANSPOSED, prefixed=False),
                  Link((head + "transform.dense.bias",), ("mlm_head/transform/bias",),
                       prefixed=False),
                  *norm_links(head + "transform.LayerNorm", "mlm_head/transform_norm",
                              prefixed=False),
                  Link((head + "bias",), ("mlm_head/bias",), prefixed=False),
                  Link((head + "decoder.weight",), ("embed/embedding",), prefixed=False,
                       tied=True),
                  Link((head + "decoder.bias",), ("mlm_head/bias",), prefixed=False, tied=True)]
    elif config.classifier == "cls":
        links += [Link(("pooler.dense.weight",), ("classifier/pooler/kernel",), TRANSPOSED),
                  Link(("pooler.dense.bias",), ("classifier/pooler/bias",)),
                  Link(("classifier.weight",), ("classifier/out/kernel",), TRANSPOSED,
                       prefixed=False),
                  Link(("classifier.bias",), ("classifier/out/bias",), prefixed=False)]
    skip = ("cls.seq_relationship.", "position_ids", *(() if config.classifier == "cls"
                                                       else ("pooler.",)))
    headed = config.classifier in ("none", "cls")
    return Table(links, "bert." if headed else "", ("bert.",), skip)


class Architecture(NamedTuple):
    """A Hugging Face architecture: ``config`` reads its config.json into the model, ``table``
    lists the model's tensors (``links``), ``hf`` writes the model back as its config.json,
    ``check`` refuses a checkpoint whose tensors contradict its config before any is read."""
    config: Callable[[dict], ModelConfig]
    table: Callable[[ModelConfig], Table]
    hf: Callable[[ModelConfig], dict]
    check: Callable[[dict, ModelConfig], None] = lambda headers, config: None

    def params(self, checkpoint: Checkpoint, config: ModelConfig) -> dict:
        """The parameter tree of ``config``'s model from ``checkpoint`` (``read_links``)."""
        self.check(checkpoint.headers, config)
        return read_links(self.table(config), checkpoint)


ARCHITECTURES = {"gpt2": Architecture(gpt2_config, gpt2_table, gpt2_hf),
                 "llama": Architecture(llama_config, llama_table, llama_hf),
                 "mistral": Architecture(llama_config, llama_table,
                                         functools.partial(llama_hf, kind="mistral")),
                 "qwen2": Architecture(llama_config, functools.partial(llama_table, qwen2=True),
                                       functools.partial(llama_hf, kind="qwen2")),
                 "bert": Architecture(bert_config, bert_table, bert_hf, bert_check)}


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
