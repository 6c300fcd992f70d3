"""Write the tiny Llama GGUF fixtures (``tests/data/gguf/llama-<type>.gguf``) from the tiny
Hugging Face Llama fixture (``tests/data/hf/llama``), as llama.cpp's converter writes a Llama
checkpoint: its tensor names, the query and key rows permuted for its rotary layout, the
hyperparameters, the byte-level BPE tokenizer and a chat template in the metadata, and the
weights in F32, F16, Q8_0 or Q4_1 (a tensor whose rows are not whole quantisation blocks, and
every 1-D tensor, stays F32, as llama.cpp leaves them).

    python scripts/make_gguf_fixtures.py [--out tests/data/gguf]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "data" / "hf" / "llama"
TYPES = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
         "q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_1": gguf.GGMLQuantizationType.Q4_1}
# a ChatML template, as an instruction-tuned model's tokenizer_config.json gives the converter
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
                 "message['content'] + '<|im_end|>\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name: str) -> str:
    """A Hugging Face Llama tensor's GGUF name."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    if name in fixed:
        return fixed[name]
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER[module]}.{kind}"


def permuted(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation of a query or key projection ``[heads * H, d]``: each head's
    rows from rotate-half order (first half, second half) to interleaved pairs."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write(out: Path, kind: str) -> None:
    hf = json.loads((SOURCE / "config.json").read_text())
    tokenizer = json.loads((SOURCE / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(out / f"llama-{kind}.gguf", "llama")
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(hf["num_attention_heads"])
    writer.add_head_count_kv(hf["num_key_value_heads"])
    writer.add_key_length(hf["head_dim"])
    writer.add_value_length(hf["head_dim"])
    writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    writer.add_rope_freq_base(hf["rope_parameters"]["rope_theta"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda item: item[1])
    special = {t["id"]: t["content"] for t in tokenizer["added_tokens"]}
    tokens = [special.get(i, token) for i, (token, _) in enumerate(vocab)]
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
                            for i in range(len(tokens))])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m)
                             for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(hf["bos_token_id"])
    writer.add_eos_token_id(hf["eos_token_id"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, weight in sorted(load_file(SOURCE / "model.safetensors").items()):
        weight = weight.astype(np.float32)
        if name.endswith("q_proj.weight"):
            weight = permuted(weight, hf["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            weight = permuted(weight, hf["num_key_value_heads"])
        qtype = TYPES[kind]
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if weight.ndim == 1 or weight.shape[-1] % block:
            qtype = gguf.GGMLQuantizationType.F32
        data = weight.astype(np.float16) if qtype == gguf.GGMLQuantizationType.F16 else (
            gguf.quants.quantize(weight, qtype) if qtype != gguf.GGMLQuantizationType.F32
            else weight)
        writer.add_tensor(gguf_name(name), data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "gguf")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for kind in TYPES:
        write(args.out, kind)
        print(f"wrote {args.out / f'llama-{kind}.gguf'}")


if __name__ == "__main__":
    main()
