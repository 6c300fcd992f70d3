"""A GGUF file (llama.cpp's format) read as the Hugging Face checkpoint it was converted from,
so that the Llama mapping (``architectures.llama_*``) reads it like a model directory:

- ``hf``: the ``config.json`` its metadata describes (``{arch}.block_count``,
  ``{arch}.embedding_length``, ``{arch}.attention.head_count`` ... -> ``num_hidden_layers``,
  ``hidden_size``, ``num_attention_heads`` ...);
- ``headers`` / ``load``: its tensors under their Hugging Face names (``blk.0.attn_q.weight``
  -> ``model.layers.0.self_attn.q_proj.weight``) in the Hugging Face shape (GGUF lists the
  dimensions fastest first), dequantized to float32 by the ``gguf`` package's NumPy code, and
  for ``llama`` the query and key rows put back from llama.cpp's interleaved rotary order;
- ``chat``: its chat template (``tokenizer.chat_template``) and BOS and EOS tokens;
- ``tokenizer_json``: the byte-level BPE its ``tokenizer.ggml.*`` metadata holds, rebuilt as a
  ``tokenizers`` tokenizer (tokens, merges, control tokens as special ones, BOS when
  ``add_bos_token``, the pre-tokenizer ``tokenizer.ggml.pre`` names).

Anything else (another architecture, a quantisation the package cannot dequantize, a RoPE
scaling, a SentencePiece vocabulary, an unknown pre-tokenizer) is refused in one line.

References: the GGUF specification (ggml, docs/gguf.md); llama.cpp's convert_hf_to_gguf.py
(tensor names, ``LlamaModel.permute``) and llama-vocab.cpp (pre-tokenizers).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import gguf
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from attnjax.pretrained.weights import WEIGHTS_LIMIT
from attnjax.userfiles import checked_size, parsing

ARCHITECTURES = ("llama", "qwen2")
FIXED = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
         "model.norm.weight", "output.weight": "lm_head.weight"}
LAYER = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
         "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj"}
Q = gguf.GGMLQuantizationType
FLOATING = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K,
            Q.Q4_K, Q.Q5_K, Q.Q6_K)
# llama.cpp's pre-tokenizer names -> the split before byte-level BPE (GPT-2's regex; SmolLM's
# splits each digit first)
PRE_TOKENIZERS = {"default": False, "gpt-2": False, "smollm": True}


class GGUFTensor(NamedTuple):
    """One tensor of the file: its index there, GGML type, Hugging Face shape."""
    index: int
    dtype: str
    shape: tuple[int, ...]
    floating: bool

    @property
    def type_name(self) -> str:
        return self.dtype


def hf_name(name: str) -> str:
    """The Hugging Face name of a GGUF tensor name (an unknown one is kept: the mapping then
    refuses it as a tensor it does not read)."""
    if name in FIXED:
        return FIXED[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in LAYER:
        return f"model.layers.{parts[1]}.{LAYER[parts[2]]}.{parts[3]}"
    return name


def unpermuted(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of a query or key projection ``[heads * H, d]``: its rows
    per head from interleaved pairs back to rotate-half order (first half, second half)."""
    return (weight.reshape(heads, weight.shape[0] // heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


class GGUFModel:
    """The GGUF file at ``path``: ``hf``, ``headers``, ``load``, ``files``,
    ``tokenizer_json`` (see the module docstring)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        checked_size(self.path, WEIGHTS_LIMIT)
        with parsing(self.path):
            self.reader = gguf.GGUFReader(self.path)
        self.files = [self.path]
        self.arch = self.field("general.architecture")
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"{self.path}: general.architecture={self.arch!r} is not "
                             f"supported; supported: {', '.join(ARCHITECTURES)}")
        self.headers = {}
        for index, tensor in enumerate(self.reader.tensors):
            kind = tensor.tensor_type
            self.headers[hf_name(tensor.name)] = GGUFTensor(
                index, kind.name, tuple(int(n) for n in reversed(tensor.shape.tolist())),
                kind in FLOATING)
        if "rope_freqs.weight" in self.headers or self.field(
                f"{self.arch}.rope.scaling.type", "none") != "none":
            raise ValueError(f"{self.path}: a RoPE scaling is not supported for GGUF files")
        self.hf = self._config()

    def field(self, key: str, default=None):
        """The metadata value ``key`` (a scalar, a string or a list), else ``default``; a
        float32 as the shortest decimal that is that float32 (1e-06, not 9.99999997e-07),
        as the config.json it was converted from wrote it."""
        entry = self.reader.get_field(key)
        if entry is None:
            return default
        with parsing(self.path):
            value = entry.contents()
        if entry.types == [gguf.GGUFValueType.FLOAT32]:
            value = float(str(np.float32(value)))
        return value

    def _config(self) -> dict:
        a = self.arch + "."
        heads = self.field(a + "attention.head_count")
        embedding = self.headers.get("model.embed_tokens.weight")
        tokens = self.field("tokenizer.ggml.tokens")
        vocab = (len(tokens) if tokens else embedding.shape[0] if embedding else None)
        hf = {"model_type": self.arch, "hidden_size": self.field(a + "embedding_length"),
              "intermediate_size": self.field(a + "feed_forward_length"),
              "num_hidden_layers": self.field(a + "block_count"),
              "num_attention_heads": heads,
              "num_key_value_heads": self.field(a + "attention.head_count_kv", heads),
              "head_dim": self.field(a + "attention.key_length"),
              "rms_norm_eps": self.field(a + "attention.layer_norm_rms_epsilon"),
              "rope_theta": self.field(a + "rope.freq_base", 10000.0),
              "max_position_embeddings": self.field(a + "context_length"),
              "vocab_size": self.field(a + "vocab_size", vocab),
              "tie_word_embeddings": "lm_head.weight" not in self.headers}
        missing = [key for key, value in hf.items() if value is None and key != "head_dim"]
        if missing:
            raise ValueError(f"{self.path} has no metadata for {missing[0]} (a {self.arch} "
                             "GGUF file names it)")
        return hf

    def load(self, name: str) -> np.ndarray:
        """Tensor ``name`` (a Hugging Face name) as float32 in its Hugging Face shape."""
        header = self.headers[name]
        tensor = self.reader.tensors[header.index]
        with parsing(self.path):
            data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        weight = np.asarray(data, np.float32).reshape(header.shape)
        if self.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            kind = "num_attention_heads" if "q_proj" in name else "num_key_value_heads"
            weight = unpermuted(weight, self.hf[kind])
        return weight

    def chat(self) -> dict | None:
        """Its chat template (``tokenizer.chat_template``) with the text of its BOS and EOS
        tokens, as ``attnjax.data.chat`` keeps them; None without a template."""
        template = self.field("tokenizer.chat_template")
        if not isinstance(template, str):
            return None
        tokens = self.field("tokenizer.ggml.tokens") or []

        def token(key):
            index = self.field(key)
            return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

        return {"chat_template": template, "bos_token": token("tokenizer.ggml.bos_token_id"),
                "eos_token": token("tokenizer.ggml.eos_token_id")}

    def tokenizer_json(self) -> str | None:
        """The tokenizer its metadata describes, as tokenizer.json text; None without one."""
        model = self.field("tokenizer.ggml.model")
        if model is None:
            return None
        pre = self.field("tokenizer.ggml.pre", "default")
        if model != "gpt2" or pre not in PRE_TOKENIZERS:
            raise ValueError(f"{self.path}: tokenizer.ggml.model={model!r} with "
                             f"tokenizer.ggml.pre={pre!r} is not supported; supported: "
                             f"'gpt2' (byte-level BPE) with {', '.join(PRE_TOKENIZERS)}")
        tokens = self.field("tokenizer.ggml.tokens")
        types = self.field("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in self.field("tokenizer.ggml.merges") or []]
        tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.pre_tokenizer = (pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True), byte_level])
            if PRE_TOKENIZERS[pre] else byte_level)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                      for i, kind in enumerate(types)
                                      if kind == gguf.TokenType.CONTROL])
        bos = self.field("tokenizer.ggml.bos_token_id")
        if self.field("tokenizer.ggml.add_bos_token", False) and bos is not None:
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"{tokens[bos]} $A", special_tokens=[(tokens[bos], bos)])
        return tokenizer.to_str()
