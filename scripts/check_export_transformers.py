"""``attnjax export`` against ``transformers``: each exported directory, loaded by the
``transformers`` class its config.json names, computes the logits attnjax computes from the
run's checkpoint, within ``TOLERANCE``.

The test suite needs neither torch nor transformers (``tests/test_export.py`` checks the round
trip through attnjax's own import bit for bit). Run it with the project's Python; the
transformers half (``scripts/transformers_logits.py``, no JAX in it) runs under ``--python``,
any interpreter that has torch and transformers (by default this one):

    python scripts/check_export_transformers.py [--python PYTHON]              # the fixtures
    python scripts/check_export_transformers.py [--python PYTHON] RUN [RUN...] # these runs

By default it checks every Hugging Face fixture of ``tests/data/hf`` (imported, then
exported) and the tiny runs of ``TINY``, which ``tests/test_export.py`` exports too: models
configured here that an architecture expresses, with random parameters (GPT-2-like with fused
q, k, v; Llama-like with grouped queries, biases, a knocked-out head and Llama 3.1's RoPE
bands; a BERT masked-language model without segment embeddings; a BERT [CLS] classifier with
per-head projections), each shaped as a fixture whose reference inputs it reads. Each is
exported into a temporary directory with the tokens it reads (``inputs.npy``); transformers
loads it with eager attention in float32 and both sides run the same tokens. One line per
model with the largest difference; exit status 1 if any exceeds ``TOLERANCE``, 2 when the
transformers half cannot run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnjax.config import Config, apply_overrides
from attnjax.models import build, parameter_shapes
from attnjax.pretrained.export import export_run
from attnjax.pretrained.run import import_run
from attnjax.rundir import RunDir

TOLERANCE = 1e-5
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf"
SHAPE = {"model.d_model": 32, "model.num_layers": 2, "model.attention.num_heads": 4,
         "model.max_length": 64, "data.length": 16}
BERT = {"model.family": "encoder", "model.norm_position": "post", "model.embed_norm": True,
        "model.position.kind": "learned", "model.attention.use_bias": True,
        "data.padding": "right", "data.min_length": 4}
# name -> (the fixture whose shape it has and whose reference inputs it reads, its overrides)
TINY = {
    "gpt2-like": ("gpt2", {"model.vocab_size": 300, "model.position.kind": "learned",
                           "model.attention.use_bias": True}),
    "llama-like": ("llama", {
        "model.vocab_size": 300, "model.norm": "rms", "model.mlp": "swiglu",
        "model.mlp_hidden": 88, "model.tie_embeddings": False,
        "model.attention.num_kv_heads": 2, "model.attention.use_bias": True,
        "model.attention.knockout": [[0, 1]], "model.position.rope_scaling": "llama3",
        "model.position.rope_scale": 4.0}),
    "bert-mlm-like": ("bert_mlm", {**BERT, "data.task": "mlm", "model.vocab_size": 260,
                                   "model.mlp_hidden": 56}),
    "bert-cls-like": ("bert", {
        **BERT, "data.task": "first_repeat", "data.vocab_size": 16, "model.vocab_size": 160,
        "model.classifier": "cls", "model.mlp": "gelu_exact", "model.mlp_hidden": 56,
        "model.attention.fused_qkv": False, "model.attention.per_head_projections": True}),
}


def tiny_config(name: str) -> Config:
    """The config of ``TINY[name]``."""
    return apply_overrides(Config(), {**SHAPE, **TINY[name][1]})


def inputs(fixture: str) -> np.ndarray:
    """The token ids [2, T] ``fixture``'s reference outputs were computed on."""
    return np.load(FIXTURES / fixture / "reference.npz")["input_ids"]


def tiny_run(path: Path, config: Config, seed: int) -> dict:
    """A run directory of ``config`` at ``path`` whose checkpoint holds random parameters
    (normal: no zero bias, no unit norm), saved as training saves them: the parameters."""
    from flax.traverse_util import unflatten_dict
    run = RunDir(path)
    run.prepare(config)
    rng = np.random.default_rng(seed)
    params = unflatten_dict({name: rng.normal(0, 0.5, shape).astype(np.float32)
                             for name, shape in parameter_shapes(config.model).items()}, "/")
    checkpoints = run.checkpoints()
    try:
        checkpoints.save_params(0, params, run.stored(config))
    finally:
        checkpoints.close()
    return params


def write(run: RunDir, out: Path, tokens: np.ndarray) -> tuple[str, np.ndarray]:
    """Export ``run`` to ``out`` with ``tokens`` as its ``inputs.npy``: the line that names it
    and attnjax's outputs of the run itself on them."""
    done = export_run(run.path, out)
    np.save(out / "inputs.npy", tokens)
    config, params, _ = run.params()
    ours = np.asarray(build(config.model).apply({"params": params}, tokens)[0])
    return f"{run.path.name:16} {done.kind:8} {done.class_name:32}", ours


def cases(runs: list[str], scratch: Path) -> list[tuple[RunDir, np.ndarray]]:
    """``(run, tokens)`` to check: ``runs`` on random tokens, else the fixtures and ``TINY``."""
    found = []
    for run in map(RunDir, runs):
        model = run.config().model
        found.append((run, np.random.default_rng(0).integers(
            0, model.vocab_size, (2, min(16, model.max_length)))))
    if not runs:
        for fixture in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
            import_run(fixture, scratch / fixture.name)
            found.append((RunDir(scratch / fixture.name), inputs(fixture.name)))
        for seed, (name, (fixture, _)) in enumerate(TINY.items()):
            tiny_run(scratch / name, tiny_config(name), seed)
            found.append((RunDir(scratch / name), inputs(fixture)))
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter with torch and transformers (default: this one)")
    parser.add_argument("runs", nargs="*", metavar="RUN")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        written = []
        for i, (run, tokens) in enumerate(cases(args.runs, scratch)):
            out = scratch / f"exported-{i}"
            written.append((out, *write(run, out, tokens)))
        status = subprocess.run([args.python, str(Path(__file__).with_name(
            "transformers_logits.py")), *(str(out) for out, _, _ in written)]).returncode
        if status:
            return 2
        worst = 0.0
        for out, line, ours in written:
            difference = float(np.abs(ours - np.load(out / "transformers.npy")).max())
            print(f"{line} max |difference| {difference:.2e}")
            worst = max(worst, difference)
    print(f"largest difference {worst:.2e} (tolerance {TOLERANCE:g})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
