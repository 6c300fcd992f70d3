"""The reference perplexity claim PT6 compares attnjax's kernels with: transformers' own reading
of the SmolLM2-135M-Instruct GGUF file (it dequantizes the tensors with the ``gguf`` package,
independently of attnjax) on the P-SmolLM windows.

Run where ``torch``, ``transformers`` and ``gguf`` are installed (the test suite and the audit
need none of them), after ``make smollm`` has put the file in ``.cache/models``:

    python scripts/make_smollm_perplexity_reference.py \\
        .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf tests/data/smollm_perplexity_reference.npz

The windows are attnjax's (``attnjax.audit.smollm.documentation_windows``: 200 windows of 128
tokens of the standard library's docstrings, under the file's own tokenizer), asked of the
project's interpreter (``--python``, default ``.venv/bin/python``: its standard library is the
text), so they are the ones the audit reads. It writes their ``ids`` ``[200, 128]``, and,
from transformers' float32 logits (eager attention; log-softmax in float64), each window's
mean negative log-likelihood over the predictions of queries ``FIRST_QUERY`` and later
(``window_nll``) and over all of them (``window_nll_all``), the ``perplexity`` ``exp(mean
window_nll)``, and the versions and interpreter that made them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

import numpy as np
import torch
import transformers

COUNT, LENGTH, FIRST_QUERY, BATCH = 200, 128, 8, 8
WINDOWS = f"""
import json, sys
from attnjax.audit.smollm import documentation_windows, smollm_tokenizer
ids = documentation_windows(smollm_tokenizer(), {COUNT}, {LENGTH})
json.dump({{"ids": ids.tolist(), "python": sys.version.split()[0]}}, sys.stdout)
"""


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("out")
    parser.add_argument("--python", default=".venv/bin/python",
                        help="the project's interpreter (default: %(default)s)")
    args = parser.parse_args(argv)
    windows = json.loads(subprocess.run(   # the tokenizer of this file, from its metadata
        [args.python, "-c", WINDOWS], check=True, capture_output=True, text=True,
        env={**os.environ, "ATTNJAX_SMOLLM": args.gguf}).stdout)
    ids = np.asarray(windows["ids"], np.int64)
    path = args.gguf.rsplit("/", 1)
    directory, name = (path[0], path[1]) if len(path) == 2 else (".", path[0])
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=name, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    nll = []
    for start in range(0, COUNT, BATCH):
        tokens = torch.tensor(ids[start:start + BATCH])
        with torch.no_grad():
            logits = model(tokens).logits[:, :-1].double()
        logp = torch.log_softmax(logits, dim=-1)
        nll.append(-logp.gather(-1, tokens[:, 1:, None])[..., 0].numpy())
    nll = np.concatenate(nll)                                     # [COUNT, LENGTH - 1]
    window_nll = nll[:, FIRST_QUERY:].mean(1)
    np.savez_compressed(
        args.out, ids=ids.astype(np.uint16), window_nll=window_nll,
        window_nll_all=nll.mean(1), first_query=FIRST_QUERY,
        perplexity=np.exp(window_nll.mean()),
        versions=json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                             "windows_python": windows["python"]}))
    print(f"wrote {args.out}: {COUNT} windows of {LENGTH} tokens, perplexity "
          f"{np.exp(window_nll.mean()):.6f} (queries {FIRST_QUERY} and later), "
          f"{np.exp(nll.mean()):.6f} (all)")


if __name__ == "__main__":
    main()
