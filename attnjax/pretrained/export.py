"""``attnjax export``: a run directory as a Hugging Face model directory, the import read
backwards (the same name table, ``attnjax.pretrained.links``):

    OUT/config.json        the architecture's config.json (``Architecture.hf``)
    OUT/model.safetensors  the parameters of the run's best checkpoint (or latest) under the
                           architecture's tensor names, float32, C order
    OUT/tokenizer.json     the run's tokenizer (``data.tokenizer``), when it has one
    OUT/tokenizer_config.json  its chat template with the BOS and EOS tokens' text, when the
                           run keeps one (``attnjax.data.chat``: a GGUF's or a Hugging Face
                           directory's), so ``apply_chat_template`` and ``generate --chat``
                           work on the export as on the run

Which architecture: for an imported run, the one it came from (``imported.json``) where that
still expresses the model; then, for a decoder, the first of ``gpt2`` and ``llama`` that does,
for an encoder ``bert``. An architecture expresses a model when its config.json, read back by
the import, is the same model (``canonical``: what does not change the function the model
computes, how it runs, trains or was initialised, set aside) and it has a tensor for every
parameter. What none expresses is refused in one line naming the first field that differs
and what each architecture needs there, before the checkpoint is read and anything written.

The export rewrites three things exactly (``folded``): a fused or per-head q, k, v layout
becomes the separate one (``convert_projections``); heads knocked out by
``attention.knockout`` become zero rows of their output projection; an encoder without
segment embeddings gets BERT's single token type, a zero row. So ``import(export(run))``
computes the run's logits bit for bit.

OUT is written in a staging directory beside it and renamed into place
(``attnjax.outputs.staged_directory``): an export cut short leaves nothing that looks like a
model, and a killed one's leftovers are removed by the next export to the same place.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np
from safetensors.numpy import save_file

from attnjax.config import ModelConfig, to_dict
from attnjax.data.chat import CHAT_FILE, read_chat
from attnjax.nn.layouts import convert_projections
from attnjax.nn.transformer import mlp_width, token_scale
from attnjax.outputs import output_directory, staged_directory
from attnjax.pretrained.architectures import ARCHITECTURES
from attnjax.pretrained.links import UnwrittenError, write_links
from attnjax.registry import KERNELS
from attnjax.rundir import RunDir, config_differences, write_json_atomic

STAGING = "exporting"              # OUT's parent/.exporting-OUT-<pid>: an export in progress
FAMILIES = {"decoder": ("gpt2", "llama", "mistral", "qwen2"), "encoder": ("bert",)}
TRIED = {"decoder": ("gpt2", "llama"), "encoder": ("bert",)}   # for a run trained here, in order
EVERY = "; ".join(f"{family}: {', '.join(kinds)}" for family, kinds in FAMILIES.items())
# the fields a refusal names first when several differ, the most telling first
FIRST = ("family", "position.kind", "position.rope_scaling", "norm", "norm_position", "mlp",
         "classifier", "attention.kernel")
INITS = ("q", "k", "v", "o")


class Choice(NamedTuple):
    """An architecture tried: its name (``kind``), the model as its config.json (``hf``) and
    the fields in which the model that config.json reads back differs, ``(field, this run's,
    the architecture's)``, the most telling first (``None`` as field: the read-back itself
    failed, its message third)."""
    kind: str
    hf: dict
    differences: list[tuple]


class Exported(NamedTuple):
    """What ``export_run`` wrote: the architecture and why (``reason``), the checkpoint's
    ``step``, the tensors' count and bytes, and whether a tokenizer and a chat template came
    along."""
    kind: str
    class_name: str
    reason: str
    step: int
    tensors: int
    nbytes: int
    tokenizer: bool
    chat: bool


def folded(model: ModelConfig) -> ModelConfig:
    """The model the export writes, computing what ``model`` computes (the module
    docstring): separate q, k, v projections, ``knockout`` folded into the output projection
    (where it has one), an encoder's segment embeddings at least one type."""
    att = dataclasses.replace(model.attention, fused_qkv=False, per_head_projections=False)
    if att.output_projection == "dense":
        att = dataclasses.replace(att, knockout=())
    types = 1 if model.family == "encoder" and not model.type_vocab_size else None
    return dataclasses.replace(model, attention=att,
                               type_vocab_size=types or model.type_vocab_size)


def folded_params(model: ModelConfig, params) -> dict:
    """``params`` of ``model`` as those of ``folded(model)``, float32 NumPy arrays."""
    target = folded(model)
    params = convert_projections(jax.device_get(params), target)
    params = jax.tree_util.tree_map(lambda x: np.array(x, np.float32), params)
    if model.attention.knockout and not target.attention.knockout:
        for layer, head in model.attention.knockout:
            params[f"block_{layer}"]["attention"]["out"]["kernel"][head] = 0.0
    if target.type_vocab_size != model.type_vocab_size:
        params["type_embed"] = {"embedding": np.zeros((1, model.d_model), np.float32)}
    return params


def canonical(model: ModelConfig) -> dict:
    """``model`` as JSON with what does not change the function it computes set to one value:
    the compute dtype, dropout, initialisation, the q, k, v layout and an exact kernel's
    choice and blocks (``attnjax info`` lists the kernels); the widths, scales and lengths
    left to defaults written out."""
    att, pos = model.attention, model.position
    exact = KERNELS.get(att.kernel).exact
    att = dataclasses.replace(
        att, kernel="reference" if exact else att.kernel,
        block_q=None if exact else att.block_q, block_k=None if exact else att.block_k,
        dropout="none", dropout_rate=0.0, fused_qkv=False, per_head_projections=False,
        key_padding_mask=True, num_kv_heads=att.kv_heads, head_dim=model.head_dim,
        value_head_dim=model.value_head_dim,
        **{f"{p}_init": "default" for p in INITS}, **{f"{p}_init_scale": 1.0 for p in INITS})
    if pos.kind == "rope" and pos.rope_scaling in ("dynamic_ntk", "yarn", "llama3"):
        pos = dataclasses.replace(pos, train_length=pos.train_length or model.max_length)
    return to_dict(dataclasses.replace(
        model, attention=att, position=pos, dtype="float32", residual_dropout=0.0,
        embed_init_std=0.02, mlp_hidden=mlp_width(model), mlp_ratio=4.0,
        embed_scale=token_scale(model)))


def _rank(difference: tuple) -> tuple:
    field = difference[0]
    return (FIRST.index(field) if field in FIRST else len(FIRST), field)


def compare(model: ModelConfig, kind: str) -> Choice:
    """Architecture ``kind`` tried on ``model`` (a ``folded`` one): its config.json, read
    back, against the model."""
    mapping = ARCHITECTURES[kind]
    hf = mapping.hf(model)
    try:
        read = mapping.config(hf)
    except ValueError as error:
        return Choice(kind, hf, [(None, None, str(error))])
    return Choice(kind, hf, sorted(config_differences(canonical(model), canonical(read)),
                                   key=_rank))


def candidates(model: ModelConfig, imported: str | None) -> tuple[str, ...]:
    """The architectures to try, in order (the module docstring: ``imported`` first, the
    architecture the run was imported from); a family none of them is refused in one line."""
    if model.family not in TRIED:
        raise ValueError(f"model.family={model.family!r}: no Hugging Face architecture attnjax "
                         f"exports expresses it ({EVERY})")
    first = (imported,) if imported in FAMILIES[model.family] else ()
    return first + tuple(kind for kind in TRIED[model.family] if kind != imported)


def refusal(choices: list[Choice]) -> str:
    """The one line of a model no architecture of ``choices`` expresses: the most telling
    field of the closest one, and what each needs (at that field, or at its own first)."""
    ranked = sorted(choices, key=lambda c: (c.differences[0][0] is None, len(c.differences)))
    field, ours, _ = ranked[0].differences[0]
    needs = []
    for choice in choices:
        key, _, theirs = choice.differences[0]
        needs.append(f"{choice.kind}: {theirs}" if key is None else
                     f"{choice.kind} needs {theirs!r}" if key == field else
                     f"{choice.kind} needs model.{key}={theirs!r}")
    what = "this model" if field is None else f"model.{field}={ours!r}"
    return (f"{what}: no Hugging Face architecture attnjax exports expresses it "
            f"({', '.join(needs)})")


def choose(model: ModelConfig, kinds) -> tuple[list[Choice], str]:
    """The architectures of ``kinds`` whose config.json expresses ``model``, in order, and
    the words saying why the first was chosen (what the ones before it need); else the
    one-line ``refusal``."""
    choices = [compare(folded(model), kind) for kind in kinds]
    fitting = [choice for choice in choices if not choice.differences]
    if not fitting:
        raise ValueError(refusal(choices))
    passed = [f"{c.kind} needs model.{c.differences[0][0]}={c.differences[0][2]!r}"
              for c in choices[:choices.index(fitting[0])] if c.differences[0][0] is not None]
    return fitting, "the first architecture that expresses the model" + (
        f" ({'; '.join(passed)})" if passed else "")


def checkpoint_tensors(model: ModelConfig, params, fitting: list[Choice]
                       ) -> tuple[Choice, dict[str, np.ndarray], list[str]]:
    """``(choice, tensors, passed)``: the first of ``fitting`` (``choose``) that has a tensor
    for every parameter of ``params`` (a zero one may go unwritten: Qwen2's output bias), its
    checkpoint's tensors, and why the ones before it did not; else one line."""
    params, passed = folded_params(model, params), []
    for choice in fitting:
        try:
            table = ARCHITECTURES[choice.kind].table(folded(model))
            return choice, write_links(table, params, choice.kind), passed
        except UnwrittenError as error:
            passed.append(str(error))
    raise ValueError(passed[0])


def hf_export(model: ModelConfig, params, kinds) -> tuple[Choice, dict[str, np.ndarray]]:
    """The architecture of ``kinds`` that expresses ``model`` and ``params``, and its
    checkpoint's tensors (``choose``, ``checkpoint_tensors``)."""
    choice, tensors, _ = checkpoint_tensors(model, params, choose(model, kinds)[0])
    return choice, tensors


def check_out(out: Path) -> None:
    """``--out``: absent or an empty directory, in a place that can be written; else one
    line."""
    if out.exists() or out.is_symlink():
        if not out.is_dir() or any(out.iterdir()):
            raise ValueError(f"--out {str(out)!r} exists and is not an empty directory; an "
                             "export writes a new one")
    output_directory(out.parent, "--out", create=False)


def export_run(workdir: str | Path, out: str | Path, which: str = "best") -> Exported:
    """Write the Hugging Face directory of the module docstring for the run at ``workdir``
    (its ``which`` checkpoint) at ``out``; everything that can be refused is refused before
    anything is written, what no architecture expresses before the checkpoint is read."""
    run, out = RunDir(workdir), Path(out)
    check_out(out)
    config = run.config()
    imported = (run.imported() or {}).get("model_type")
    kinds = candidates(config.model, imported)
    fitting, reason = choose(config.model, kinds)       # refused before anything is read
    chat = read_chat(run.path)
    _, params, step = run.params(which)
    exported = export_model(config.model, params, out, fitting, config.data.tokenizer, chat)
    if exported.kind == imported:
        reason = "the architecture it was imported from"
    elif exported.reason:
        reason += f" ({exported.reason})"
    if config.model.dtype != "float32":
        reason += (f"; the run computes in {config.model.dtype}, the export holds its float32 "
                   "parameters")
    return exported._replace(reason=reason, step=step)


def export_model(model: ModelConfig, params, out: str | Path, fitting: list[Choice],
                 tokenizer: str | Path | None = None, chat: dict | None = None) -> Exported:
    """Write ``model`` with ``params`` at ``out`` (absent or empty) as the first architecture
    of ``fitting`` (``choose``) that holds every parameter, with ``tokenizer`` (a
    tokenizer.json) and ``chat`` (``read_chat``'s) if given; ``Exported.reason`` says why the
    ones before it did not."""
    out = Path(out)
    check_out(out)
    if tokenizer is not None and not Path(tokenizer).is_file():
        raise ValueError(f"data.tokenizer {str(tokenizer)!r} is not a file")
    choice, tensors, passed = checkpoint_tensors(model, params, fitting)
    hf = {**choice.hf, "dtype": "float32", "torch_dtype": "float32"}   # transformers 5 and 4
    with staged_directory(out, STAGING) as staging:
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer is not None:
            shutil.copyfile(tokenizer, staging / "tokenizer.json")
        if chat is not None:
            write_json_atomic(staging / CHAT_FILE,
                              {key: value for key, value in chat.items() if value is not None})
        write_json_atomic(staging / "config.json", hf)
        # safetensors writes through a private temporary file (mode 0600): the permissions
        # of any file written here instead
        shutil.copymode(staging / "config.json", staging / "model.safetensors")
    return Exported(choice.kind, hf["architectures"][0], "; ".join(passed), 0, len(tensors),
                    sum(t.nbytes for t in tensors.values()), tokenizer is not None,
                    chat is not None)
