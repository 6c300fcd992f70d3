"""The reference ``tests/test_smollm.py`` compares attnjax's import of SmolLM2-135M-Instruct
with: transformers' own reading of the same GGUF file (it dequantizes the tensors with the
``gguf`` package and rebuilds the tokenizer from the metadata, independently of attnjax).

Run where ``torch``, ``transformers`` and ``gguf`` are installed (the test suite needs none of
them), after ``make smollm`` has put the file in ``.cache/models``:

    python scripts/make_smollm_reference.py .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        tests/data/smollm_reference.npz

It writes, for ``PROMPTS``: their ``ids`` (padded with -1 to one length), and, to keep the
file small, the float32 logits of every position at ``COLUMNS`` (the first 512 vocabulary
ids and every 97th after them) and each position's 16 largest logits with their ids; and for
``TEXTS``, the ids transformers' tokenizer gives each (without special tokens added), as
JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

PROMPTS = ("The capital of France is",
           "<|im_start|>user\nWhat is 17 times 3?<|im_end|>\n<|im_start|>assistant\n")
# unicode, digits, runs of spaces and newlines, special tokens, code
TEXTS = ("The year 2024 had 366 days.", "naïve café – 東京 🙂", "  two spaces\n\nand lines",
         "1234567890", "3.14159 + 2.71828 = 5.85987", "    four spaces", "\t\ttabs\tinside",
         "<|im_start|>system\nYou are helpful.<|im_end|>", "<|endoftext|>", "Ünïcödé ßtraße",
         "emoji 🚀🔥 mix", "don't won't can't", "e-mail: a.b@c.org", "def f(x):\n    return x",
         "\n\n\n", "UPPER lower MiXeD", "中文字符和English混合", "$100,000.00!", "a" * 40,
         "Привет, мир")
COLUMNS = np.concatenate([np.arange(512), np.arange(512, 49152, 97)])
TOP = 16


def main(gguf_path: str, out: str) -> None:
    path = Path(gguf_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32)
    model.eval()
    ids = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in PROMPTS]
    length = max(map(len, ids))
    logits, top_values, top_ids = [], [], []
    for prompt in ids:
        with torch.no_grad():
            out_logits = model(torch.tensor([prompt])).logits[0].float().numpy()
        padded = np.full((length, out_logits.shape[1]), np.nan, np.float32)
        padded[:len(prompt)] = out_logits
        logits.append(padded[:, COLUMNS])
        order = np.argsort(-np.nan_to_num(padded, nan=-np.inf), axis=1)[:, :TOP]
        top_ids.append(order)
        top_values.append(np.take_along_axis(padded, order, axis=1))
    texts = {text: tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS}
    np.savez_compressed(
        out, ids=np.array([p + [-1] * (length - len(p)) for p in ids], np.int64),
        columns=COLUMNS, logits=np.stack(logits), top_ids=np.stack(top_ids),
        top_values=np.stack(top_values), texts=json.dumps(texts, ensure_ascii=False),
        versions=json.dumps({"torch": torch.__version__,
                             "transformers": transformers.__version__}))
    print(f"wrote {out}: {len(PROMPTS)} prompts, {len(TEXTS)} texts")


if __name__ == "__main__":
    main(*sys.argv[1:])
