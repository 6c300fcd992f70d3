"""``attnjax import``: a local Hugging Face model directory as an ordinary attnjax run directory
that every command reads (``eval``, ``generate``, ``attention``, ``heads``, ``compare``, ...):

    RUN/config.json        the model's config (``load_pretrained``) and data on its tokenizer
    RUN/ckpt/0             a checkpoint of the parameters alone (no optimizer state)
    RUN/tokenizer.json     the model's tokenizer, when the directory has one (``data.tokenizer``)
    RUN/tokenizer_config.json  its chat template with its BOS and EOS tokens, when it has one
                           (``attnjax.data.chat``: ``attnjax generate --chat``)
    RUN/imported.json      where it came from: the directory, its architecture, each file's
                           SHA-256

The data config trains what the model's head predicts (``text`` for a decoder, ``mlm`` for an
encoder with a masked-language head) on the built-in corpus until ``data.path`` says otherwise;
the run is written in a staging directory beside ``RUN`` and renamed into place, so an
import killed midway leaves nothing that reads as a run: Ctrl-C and SIGTERM remove the staging
directory on their way out, and the next import into ``RUN`` removes one a SIGKILL left.
``imported.json`` holds the SHA-256 of every file the import read.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from attnjax.config import Config, DataConfig, apply_overrides
from attnjax.data.chat import CHAT_FILE
from attnjax.data.tokenizer import TextTokenizer, check_vocabulary
from attnjax.models import check_same_parameters, family
from attnjax.outputs import output_directory, staged_directory
from attnjax.pretrained import read_pretrained
from attnjax.rundir import IMPORTED, RunDir, write_json_atomic

# a model's objective -> its text task
TEXT_TASKS = {"next_token": "text", "mlm": "mlm", "embedding": "sentences"}
PROBE_LENGTH = 128                                    # data.length, at most model.max_length
STAGING = "importing"               # RUN's parent/.importing-RUN-<pid>: an import in progress


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
    that can be refused is refused before anything is written, overrides that would change a
    parameter's shape included. SIGTERM, like Ctrl-C, stops it with nothing written."""
    source, run = Path(source), RunDir(Path(workdir).absolute())
    if run.path.exists():
        raise ValueError(f"--workdir {str(workdir)!r} exists; an import writes a new run "
                         "directory")
    output_directory(run.path.parent, "--workdir", create=False)
    opened, model, params = read_pretrained(source)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = opened.tokenizer
        if isinstance(tokenizer, str):           # a GGUF file's, rebuilt from its metadata
            tokenizer = Path(scratch) / "tokenizer.json"
            tokenizer.write_text(opened.tokenizer)
        if tokenizer is not None:
            check_vocabulary(TextTokenizer(tokenizer), model.vocab_size)
        config = imported_config(model, None if tokenizer is None else str(tokenizer),
                                 overrides)
        check_same_parameters(model, config.model,
                              [o for o in overrides if o.startswith("model.")])
        stored = run.stored(config)
        if tokenizer is not None:  # the run's own copy, named relative to RUN (RunDir.stored)
            stored["data"]["tokenizer"] = "tokenizer.json"
        base = source if source.is_dir() else source.parent
        record = {"source": str(source.absolute()), "model_type": opened.hf["model_type"],
                  "files": {str(p.relative_to(base)): sha256(p) for p in sorted(opened.files)}}
        write_run(run, stored, params, record, tokenizer, opened.chat)
    return run.config()


def write_run(run: RunDir, stored: dict, params, record: dict, tokenizer: Path | None,
              chat: dict | None = None) -> None:
    """Write the run directory in a staging directory beside it, then rename it into place
    (the module docstring; ``attnjax.outputs.staged_directory``)."""
    with staged_directory(run.path, STAGING) as path:
        staging = RunDir(path)
        staging.checkpoint_dir.mkdir()
        if tokenizer is not None:
            shutil.copyfile(tokenizer, staging.path / "tokenizer.json")
        if chat is not None:
            write_json_atomic(staging.path / CHAT_FILE, chat)
        write_json_atomic(staging.path / "config.json", stored)
        checkpoints = staging.checkpoints()
        try:
            checkpoints.save_params(0, params, stored)
        finally:
            checkpoints.close()
        write_json_atomic(staging.path / IMPORTED, record)
