"""Reference outputs of the real all-MiniLM-L6-v2 (``make minilm``) computed by the
``transformers`` library, for ``tests/test_minilm.py``.

Run where ``torch`` and ``transformers`` are installed (the test suite needs neither):

    python scripts/make_minilm_reference.py .cache/models/all-MiniLM-L6-v2 tests/data/minilm.npz

For each sentence ``i`` of ``SENTENCES`` (encoded alone, so with no padding): ``input_ids_i``
[T] from the model's own tokenizer, ``last_hidden_state_i`` [T, 384] and ``attentions_i``
[layers, heads, T, T] (the eager attention's probabilities), in float32.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer

SENTENCES = ("The cat sat on the mat because it was tired.",
             "Attention heads in BERT often look at [SEP] when they have nothing to do.")


def main(model_dir: str, out: str) -> None:
    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    model = transformers.BertModel.from_pretrained(model_dir, dtype=torch.float32,
                                                   attn_implementation="eager").eval()
    arrays = {}
    for i, sentence in enumerate(SENTENCES):
        ids = np.asarray(tokenizer.encode(sentence).ids, np.int32)
        with torch.no_grad():
            result = model(torch.as_tensor(ids[None].astype(np.int64)), output_attentions=True)
        arrays[f"input_ids_{i}"] = ids
        arrays[f"last_hidden_state_{i}"] = result.last_hidden_state[0].numpy()
        arrays[f"attentions_{i}"] = np.stack([a[0].numpy() for a in result.attentions])
    np.savez_compressed(out, **arrays)
    print(out, {k: v.shape for k, v in arrays.items()}, transformers.__version__)


if __name__ == "__main__":
    main(*sys.argv[1:3])
