"""``attnjax import``: a local Hugging Face model directory as an ordinary attnjax run directory
that every command reads (``eval``, ``generate``, ``attention``, ``heads``, ``compare``, ...):

    RUN/config.json        the model's config (``load_pretrained``) and data on its tokenizer
    RUN/ckpt/0             a checkpoint of the parameters alone (no optimizer state)
    RUN/tokenizer.json     the model's tokenizer, when the directory has one (``data.tokenizer``)
    RUN/imported.json      where it came from: the directory, its architecture, each file's
                           SHA-256

The data config trains what the model's head predicts (``text`` for a decoder, ``mlm`` for an
encoder with a masked-language head) on the built-in corpus until ``data.path`` says otherwise;
the run is written in a temporary directory beside ``RUN`` and renamed into place, so an
import killed midway leaves nothing that reads as a run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from attnjax.config import Config, DataConfig, apply_overrides, to_dict
from attnjax.data.tokenizer import TextTokenizer, check_vocabulary
from attnjax.models import family
from attnjax.pretrained import load_pretrained
from attnjax.pretrained.weights import read_config
from attnjax.rundir import IMPORTED, RunDir, write_json_atomic

# a model's objective -> its text task
TEXT_TASKS = {"next_token": "text", "mlm": "mlm", "embedding": "sentences"}
PROBE_LENGTH = 128                                    # data.length, at most model.max_length


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def imported_config(model, tokenizer: str | None, overrides=()) -> Config:
    """The run config of an imported ``model`` (a ``ModelConfig``): its objective's text task
    on ``tokenizer`` (a ``tokenizer.json`` path, or None: bytes), then ``overrides``."""
    objective = family(model).objective(model)
    if objective not in TEXT_TASKS:
        raise ValueError(f"an imported model trains {objective!r}; importable: "
                         f"{', '.join(TEXT_TASKS)}")
    data = DataConfig(task=TEXT_TASKS[objective], tokenizer=tokenizer,
                      length=min(PROBE_LENGTH, model.max_length))
    return apply_overrides(Config(model=model, data=data), list(overrides))


def import_run(source: str | Path, workdir: str | Path, overrides=()) -> Config:
    """Write the run directory of the module docstring for the Hugging Face model in
    ``source`` at ``workdir`` (which must not exist yet) and return its config; everything
    that can be refused is refused before anything is written."""
    source, run = Path(source), RunDir(Path(workdir).absolute())
    if run.path.exists():
        raise ValueError(f"--workdir {str(workdir)!r} exists; an import writes a new run "
                         "directory")
    model, params = load_pretrained(source)
    tokenizer = source / "tokenizer.json"
    if tokenizer.is_file():
        check_vocabulary(TextTokenizer(tokenizer), model.vocab_size)
    has_tokenizer = tokenizer.is_file()
    config = imported_config(model, str(tokenizer) if has_tokenizer else None, overrides)
    stored = json.loads(json.dumps(to_dict(config)))      # as config.json reads back
    if has_tokenizer:                                     # the run's own copy
        stored["data"]["tokenizer"] = str(run.path / "tokenizer.json")
    files = sorted(p for p in source.iterdir()
                   if p.suffix in (".json", ".safetensors") and p.is_file())
    record = {"source": str(source.absolute()), "model_type": read_config(source)["model_type"],
              "files": {p.name: sha256(p) for p in files}}
    staging = RunDir(run.path.with_name(f".{run.path.name}.importing-{os.getpid()}"))
    try:
        staging.checkpoint_dir.mkdir(parents=True)
        if has_tokenizer:
            shutil.copyfile(tokenizer, staging.path / "tokenizer.json")
        write_json_atomic(staging.path / "config.json", stored)
        checkpoints = staging.checkpoints()
        try:
            checkpoints.save_params(0, params, stored)
        finally:
            checkpoints.close()
        write_json_atomic(staging.path / IMPORTED, record)
        os.rename(staging.path, run.path)
    finally:
        shutil.rmtree(staging.path, ignore_errors=True)
    return run.config()
