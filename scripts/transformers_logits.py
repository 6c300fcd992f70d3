"""The transformers half of ``scripts/check_export_transformers.py``: for each directory
given, a Hugging Face model directory holding ``inputs.npy`` (token ids [B, T]), load the
model with the class its config.json names (eager attention, float32) and write its outputs
on those tokens (the logits, or an encoder's last hidden state) as ``transformers.npy``.

It needs numpy, torch and transformers, not attnjax or JAX, so any Python that has torch runs
it (a torch interpreter beside the project's, say):

    PYTHON scripts/transformers_logits.py DIR [DIR...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def outputs(directory: Path) -> np.ndarray:
    """The outputs of the model at ``directory`` on its ``inputs.npy``."""
    import torch
    import transformers
    name = json.loads((directory / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, name).from_pretrained(
        directory, attn_implementation="eager").float().eval()
    with torch.no_grad():
        result = model(torch.as_tensor(np.load(directory / "inputs.npy")))
    return (result.logits if hasattr(result, "logits") else result.last_hidden_state).numpy()


def main(directories: list[str]) -> int:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as error:
        print(f"needs torch and transformers ({error})", file=sys.stderr)
        return 2
    for directory in map(Path, directories):
        np.save(directory / "transformers.npy", outputs(directory))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
