"""The transformers side of ``attnjax bench warm``: a Hugging Face model directory (an
``attnjax export``) continues a prompt greedily, as one command would, in its own process:

    PYTHON attnjax/bench/hf_generate.py DIR PROMPT TOKENS

It loads the model with the class its config.json names (float32) and its tokenizer.json when
it has one (else the prompt's UTF-8 bytes are its ids, as a byte-level run's), generates
``TOKENS`` tokens with ``do_sample=False`` and prints the prompt and continuation as text.
It needs torch and transformers, not JAX or attnjax.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(directory: str, prompt: str, tokens: str) -> int:
    import torch
    import transformers
    directory = Path(directory)
    name = json.loads((directory / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, name).from_pretrained(directory, dtype=torch.float32).eval()
    tokenizer = None
    if (directory / "tokenizer.json").is_file():
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(directory / "tokenizer.json"))
    ids = tokenizer.encode(prompt) if tokenizer else list(prompt.encode())
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=int(tokens), do_sample=False,
                             pad_token_id=0)[0].tolist()
    print(tokenizer.decode(out) if tokenizer else bytes(out).decode("utf-8", "replace"))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
