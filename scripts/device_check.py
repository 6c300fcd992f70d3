"""``make device-check``: what an accelerator adds, checked in one script (sized for 5 minutes on
one GPU), printed and written as JSON.

1. Parity: every exact kernel that runs on the device (cudnn included on a GPU) against the
   float64 NumPy oracle, outputs and gradients, on the parity settings (``attnjax.parity``).
2. Training: bfloat16 tokens/s and model-FLOPs utilisation of a GPT-2-small-sized decoder
   (12 layers, width 768, 12 heads, 1024 tokens, the ``xla`` kernel where it runs, else
   ``triangular``), against the device's measured bfloat16 matmul peak.
3. Decoding: tokens/s of the compiled generation with the KV cache, batch 1 and 8.
4. Patching: ``attnjax bench patch`` (64 zero-ablations batched against a loop of 64 passes).

On a CPU the same code runs at a small size (4 layers, width 128, 256 tokens) and says so;
the figures are then only a smoke test of the script.

    python scripts/device_check.py [--out benchmarks/results/device-check.json]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.bench.common import write_json
from attnjax.bench.flops import matmul_peak_flops, model_flops_per_token
from attnjax.bench.patch import run_patch_benchmark
from attnjax.bench.throughput import train_throughput
from attnjax.config import Config, apply_overrides
from attnjax.generate import generate
from attnjax.parity import parity_table
from attnjax.registry import KERNELS
from attnjax.train.state import init_params

ACCELERATOR = jax.default_backend() != "cpu"
GPT2_SMALL = {"model.d_model": 768, "model.num_layers": 12, "model.attention.num_heads": 12,
              "model.max_length": 1024, "data.length": 1024, "train.batch_size": 8,
              "model.vocab_size": 50304, "data.task": "induction", "data.vocab_size": 50304}
SMALL = {"model.d_model": 128, "model.num_layers": 4, "model.attention.num_heads": 4,
         "model.max_length": 256, "data.length": 256, "train.batch_size": 4,
         "data.task": "induction", "data.vocab_size": 256}


def training(shape: dict) -> dict:
    """bfloat16 training tokens/s and MFU against a bfloat16 matmul peak."""
    kernel = "xla" if KERNELS.get("xla").available() and ACCELERATOR else "triangular"
    config = apply_overrides(Config(), {**shape, "model.dtype": "bfloat16",
                                        "model.attention.kernel": kernel,
                                        "train.steps_per_dispatch": 10, "train.log_every": 10,
                                        "train.eval_every": 10, "train.checkpoint_every": 10})
    sizes = (2048, 4096, 8192) if ACCELERATOR else (512, 1024)
    peak = matmul_peak_flops(sizes, dtype=jnp.bfloat16)
    result = train_throughput(config, steps=50 if ACCELERATOR else 10)
    mfu = result["tokens_per_s"] * model_flops_per_token(config) / peak
    return {"kernel": kernel, "tokens_per_s": result["tokens_per_s"], "mfu": mfu,
            "peak_tflops": peak / 1e12}


def decoding(shape: dict) -> list[dict]:
    """Compiled generation with the KV cache: tokens/s at batch 1 and 8."""
    config = apply_overrides(Config(), shape)
    params, rows = init_params(config), []
    for batch in (1, 8):
        prompts = np.ones((batch, 16), np.int32)
        tokens = 128 if ACCELERATOR else 32
        generate(config, params, prompts, tokens, temperature=0.0)       # compile
        began = time.perf_counter()
        generate(config, params, prompts, tokens, temperature=0.0)
        seconds = time.perf_counter() - began
        rows.append({"batch": batch, "tokens": tokens, "tokens_per_s": batch * tokens / seconds})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/device-check.json")
    out = parser.parse_args().out
    shape = GPT2_SMALL if ACCELERATOR else SMALL
    device = jax.devices()[0]
    print(f"device check on {device.device_kind} ({jax.default_backend()}); "
          f"{'GPT-2-small size' if ACCELERATOR else 'a small size: no accelerator here'}",
          flush=True)
    result = {"device": device.device_kind, "accelerator": ACCELERATOR}
    result["parity"] = parity_table()
    worst = max(row["grad_rel"] for row in result["parity"])
    print(f"parity: {len(result['parity'])} kernel x setting rows, worst gradient relative "
          f"error {worst:.1e}", flush=True)
    result["training"] = training(shape)
    print(f"training (bfloat16, {result['training']['kernel']}): "
          f"{result['training']['tokens_per_s']:.0f} tokens/s, MFU "
          f"{result['training']['mfu']:.1%}", flush=True)
    result["decoding"] = decoding(shape)
    for row in result["decoding"]:
        print(f"decoding batch {row['batch']}: {row['tokens_per_s']:.0f} tokens/s", flush=True)
    result["patching"] = run_patch_benchmark(apply_overrides(Config(), shape))
    write_json(out, result)


if __name__ == "__main__":
    main()
