"""Peak memory of ``attnjax import`` against the size of the weights it keeps: a Llama-shaped
checkpoint written here (random float32 weights, about 450 MiB), imported in a fresh process,
and the same checkpoint with an unused 1 GiB tensor, which the import refuses before reading
any data. Each figure is the process's peak resident memory (``wait4``'s ``ru_maxrss``) less
that of a process that only imports attnjax's import code.

    python scripts/import_memory.py [--out benchmarks/results/import-memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WIDTH, LAYERS, MLP, VOCAB = 1024, 8, 2816, 8000
UNUSED = 1 << 28                       # float32 values of the unused tensor: 1 GiB


def write_checkpoint(directory: Path, unused: bool) -> int:
    """A Llama directory of random weights (and an unused tensor); its weights' bytes."""
    import numpy as np      # in the child that writes, so that the measuring parent stays small
    from safetensors.numpy import save_file
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": WIDTH, "intermediate_size": MLP,
        "num_attention_heads": 16, "num_hidden_layers": LAYERS, "vocab_size": VOCAB,
        "max_position_embeddings": 512}))
    shapes = {"model.embed_tokens.weight": (VOCAB, WIDTH), "model.norm.weight": (WIDTH,),
              "lm_head.weight": (VOCAB, WIDTH)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({f"{p}self_attn.{n}_proj.weight": (WIDTH, WIDTH) for n in "qkvo"})
        shapes.update({p + "mlp.gate_proj.weight": (MLP, WIDTH),
                       p + "mlp.up_proj.weight": (MLP, WIDTH),
                       p + "mlp.down_proj.weight": (WIDTH, MLP),
                       p + "input_layernorm.weight": (WIDTH,),
                       p + "post_attention_layernorm.weight": (WIDTH,)})
    rng = np.random.default_rng(0)
    tensors = {name: rng.standard_normal(shape, np.float32) for name, shape in shapes.items()}
    kept = sum(t.nbytes for t in tensors.values())
    if unused:
        tensors["model.unused.weight"] = np.zeros(UNUSED, np.float32)
    save_file(tensors, str(directory / "model.safetensors"))
    return kept


def peak_rss(argv: list[str]) -> tuple[int, int]:
    """``(exit status, peak resident bytes)`` of the command ``argv``."""
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/import-memory.json")
    parser.add_argument("--write", default=None, metavar="DIR",
                        help="(child) write the checkpoint into DIR and print its bytes")
    parser.add_argument("--unused", action="store_true", help="(child) with the unused tensor")
    args = parser.parse_args()
    if args.write:
        print(write_checkpoint(Path(args.write), args.unused))
        return
    attnjax = [sys.executable, "-m", "attnjax.cli"]
    _, baseline = peak_rss([sys.executable, "-c", "import attnjax.pretrained.run"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, unused in (("llama", False), ("llama + unused 1 GiB tensor", True)):
            source = Path(tmp) / name.split()[0] / str(unused)
            kept = int(subprocess.check_output([sys.executable, __file__, "--write", str(source),
                                                *["--unused"] * unused]))
            code, peak = peak_rss([*attnjax, "import", str(source), "--workdir",
                                   str(Path(tmp) / f"run-{unused}")])
            rows.append({"checkpoint": name, "weights_mib": kept / 2**20, "exit": code,
                         "peak_over_baseline_mib": (peak - baseline) / 2**20,
                         "ratio_to_weights": (peak - baseline) / kept})
    print(f"baseline (python -c 'import attnjax.pretrained.run'): {baseline / 2**20:.0f} MiB")
    print(f"{'checkpoint':<30} {'weights MiB':>12} {'exit':>5} {'peak - baseline MiB':>20} "
          f"{'x weights':>10}")
    for r in rows:
        print(f"{r['checkpoint']:<30} {r['weights_mib']:>12.0f} {r['exit']:>5} "
              f"{r['peak_over_baseline_mib']:>20.0f} {r['ratio_to_weights']:>10.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"baseline_mib": baseline / 2**20, "rows": rows},
                                         indent=2))


if __name__ == "__main__":
    main()
