"""Tiny random Hugging Face checkpoints and their reference outputs, the fixtures of
``tests/test_pretrained.py``.

Run where ``torch`` and ``transformers`` are installed (the test suite needs neither):

    python scripts/make_hf_fixtures.py tests/data/hf

Each model is a directory laid out as a downloaded one: ``config.json``, the weights
(``model.safetensors``, or shards and ``model.safetensors.index.json``), ``tokenizer.json``
(trained here on a few sentences: WordPiece for BERT, byte-level BPE for the decoders); and
``reference.npz``: ``input_ids`` [2, T] (two sentences, cut to one length, so no padding),
``attentions`` [layers, 2, heads, T, T] (the eager attention's probabilities) and
``logits`` [2, T, vocab] (decoders, and BERT with its masked-language head) or
``last_hidden_state`` [2, T, d] (a bare BERT encoder). Weights are random (seeded), at
initialiser ranges wide enough that attention is far from uniform; half-precision checkpoints
are saved half-precision and their references computed by loading them in float32.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers

TEXT = [
    "Attention is a weighted average of values, the weights a softmax of query-key scores.",
    "The cat sat on the mat, and the dog sat on the log by the door.",
    "Heads that attend to the previous token form induction circuits with later layers.",
    "Rotary embeddings rotate queries and keys by an angle that grows with the position.",
    "A tokenizer splits text into pieces; a vocabulary maps each piece to an integer id.",
]
SENTENCES = ("The dog sat on the mat by the door.", "Attention heads rotate the queries.")


def wordpiece() -> Tokenizer:
    """A BERT-style uncased WordPiece tokenizer with [CLS] ... [SEP] around each text."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(TEXT, trainers.WordPieceTrainer(vocab_size=160,
                                                            special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    return tok


def byte_bpe(special: str) -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2's scheme) with one special token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=300, special_tokens=[special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def input_ids(tok: Tokenizer) -> np.ndarray:
    """The two sentences' ids, cut to the shorter one's length."""
    ids = [tok.encode(s).ids for s in SENTENCES]
    length = min(map(len, ids))
    return np.asarray([i[:length] for i in ids], np.int64)


def scaled(model, std: float):
    """Every weight matrix redrawn N(0, std^2) (seeded before), biases small, norms near 1,
    so the references exercise every parameter."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std)
            elif "norm" in name.lower() or "ln_" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.05)
    return model


def save(out: Path, model, tok: Tokenizer, ids: np.ndarray, dtype=torch.float32,
         shard: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.to(dtype).save_pretrained(out, max_shard_size=shard or "1GB")
    tok.save(str(out / "tokenizer.json"))
    # the reference is the checkpoint as a user loads it, in float32 (converting the model in
    # memory would also round its RoPE frequency buffer to half precision)
    model = type(model).from_pretrained(out, dtype=torch.float32,
                                        attn_implementation="eager").eval()
    with torch.no_grad():
        result = model(torch.as_tensor(ids), output_attentions=True)
    arrays = {"input_ids": ids,
              "attentions": np.stack([a.numpy() for a in result.attentions])}
    if hasattr(result, "logits"):
        arrays["logits"] = result.logits.numpy()
    else:
        arrays["last_hidden_state"] = result.last_hidden_state.numpy()
    np.savez_compressed(out / "reference.npz", **arrays)
    print(out, {k: v.shape for k, v in arrays.items()},
          sorted(p.name for p in out.iterdir()))


def bert(root: Path) -> None:
    tok = wordpiece()
    common = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=56, max_position_embeddings=64,
                  type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
                  attn_implementation="eager")
    torch.manual_seed(0)
    encoder = scaled(transformers.BertModel(transformers.BertConfig(**common),
                                            add_pooling_layer=False), 0.2)
    save(root / "bert", encoder, tok, input_ids(tok))
    torch.manual_seed(1)
    mlm = scaled(transformers.BertForMaskedLM(transformers.BertConfig(**common)), 0.2)
    save(root / "bert_mlm", mlm, tok, input_ids(tok), dtype=torch.bfloat16)


def gpt2(root: Path) -> None:
    tok = byte_bpe("<|endoftext|>")
    config = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=2, n_head=4, n_positions=64,
        activation_function="gelu_new", layer_norm_epsilon=1e-5,
        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    torch.manual_seed(2)
    model = scaled(transformers.GPT2LMHeadModel(config), 0.2)
    save(root / "gpt2", model, tok, input_ids(tok), shard="40KB")


def llama_like(root: Path) -> None:
    tok = byte_bpe("<s>")
    common = dict(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=88,
                  max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  attn_implementation="eager")
    torch.manual_seed(3)
    llama = transformers.LlamaConfig(**common, rope_theta=500000.0, hidden_act="silu")
    save(root / "llama", scaled(transformers.LlamaForCausalLM(llama), 0.2), tok,
         input_ids(tok), dtype=torch.float16)
    torch.manual_seed(4)
    qwen = transformers.Qwen2Config(**common, rope_theta=10000.0, use_sliding_window=False)
    save(root / "qwen2", scaled(transformers.Qwen2ForCausalLM(qwen), 0.2), tok, input_ids(tok))
    torch.manual_seed(5)
    mistral = transformers.MistralConfig(**common, rope_theta=10000.0, sliding_window=None)
    save(root / "mistral", scaled(transformers.MistralForCausalLM(mistral), 0.2), tok,
         input_ids(tok), dtype=torch.bfloat16)


def llama3(root: Path) -> None:
    """Llama with Llama 3.1's RoPE bands: at base 100 and head size 8 the four pairs' wavelengths
    (6.3, 19.9, 62.8, 199) fall in every band of an original context of 64 (kept below 16,
    mixed, scaled above 64)."""
    tok = byte_bpe("<s>")
    torch.manual_seed(6)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=88,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        attn_implementation="eager", hidden_act="silu",
        rope_parameters={"rope_type": "llama3", "rope_theta": 100.0, "factor": 8.0,
                         "original_max_position_embeddings": 64, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0})
    save(root / "llama3", scaled(transformers.LlamaForCausalLM(config), 0.2), tok,
         input_ids(tok))


def main(root: str) -> None:
    root = Path(root)
    bert(root)
    gpt2(root)
    llama_like(root)
    llama3(root)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    (root / "VERSIONS.json").write_text(json.dumps(versions, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/hf")
