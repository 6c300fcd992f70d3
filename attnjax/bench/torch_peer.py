"""attnjax against PyTorch on this machine (``attnjax bench torch --python PYTHON``): training
tokens/s of the same GPT, and causal attention's forward and backward per layer, measured in
one run, the two alternating.

PyTorch runs in its own process (``PYTHON``: an interpreter that has torch; it need not have
JAX, nor the same Python version), ``attnjax/bench/torch_gpt.py`` as a worker that keeps its
model and data between requests; attnjax runs in this one. Both sides are warmed up, then
timed in ``peer.ROUNDS`` rounds of the same work, the first side alternating; a ratio is the
median of the rounds' ``attnjax / torch`` (above 1: attnjax faster). Both processes keep freed
memory for the next call (``attnjax.allocator``; ``ATTNJAX_KEEP_FREED=0``: neither does).

- Training: the decoder settings of ``attnjax bench train`` (a, b, c: learned positions, the
  ``flash`` kernel) at 1 and 10 steps per dispatch (``default``: the one attnjax chooses,
  ``train.dispatch_steps``); PyTorch trains eagerly with fused
  ``scaled_dot_product_attention`` whatever the dispatch (it has none).
- Attention: float32 ``[B, T, 8, 32]``, causal, ``sum(out)`` differentiated with respect to q,
  k and v, at lengths 256, 1024 and 4096 with ``B = 4096 / T`` (4096 tokens, as setting a's
  per-layer batch of 16 x 256), each exact kernel attnjax has against SDPA.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from attnjax.allocator import child_environment
from attnjax.bench.common import write_json
from attnjax.bench.peer import ROUNDS, WINDOW_S, alternating
from attnjax.bench.throughput import train_loop
from attnjax.bench.train import train_settings
from attnjax.config import apply_overrides
from attnjax.data.text import read_bytes, split_bounds
from attnjax.ops import dot_product_attention

WORKER = Path(__file__).with_name("torch_gpt.py")
LENGTHS = (256, 1024, 4096)
ATTENTION_KERNELS = ("flash", "triangular", "chunked", "reference")
DISPATCHES = (1, 10)


class TorchWorker:
    """``torch_gpt.py`` running under ``python``: ``ask(request) -> reply`` (one JSON line
    each way)."""

    def __init__(self, python: str):
        try:
            self.process = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, text=True,
                                            env=child_environment())
        except OSError as error:
            raise ValueError(f"--python {python!r} cannot be run ({error.strerror})") from None
        self.versions = self.ask({"versions": None})

    def ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise ValueError("the PyTorch worker stopped (see its error above): does --python "
                             "have torch?")
        return json.loads(line)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def _ask_seconds(worker: TorchWorker, what: str, argument) -> float:
    return worker.ask({what: argument})["seconds"]


def _attention_step(kernel: str, q):
    """attnjax's causal attention forward and backward at ``q``'s shape, compiled: a function
    of no arguments returning the seconds of one call after an untimed one, as the worker
    times SDPA (``torch_gpt.attention_seconds``). The output's sum is returned beside the
    gradients, as PyTorch computes it, so that a kernel that recomputes its forward pass in
    the backward one (``chunked``) cannot have the compiler drop the forward pass."""
    step = jax.jit(jax.value_and_grad(lambda q, k, v: dot_product_attention(
        q, k, v, is_causal=True, implementation=kernel).sum(), argnums=(0, 1, 2)))
    jax.block_until_ready(step(q, q, q))

    def run() -> float:
        jax.block_until_ready(step(q, q, q))
        began = time.perf_counter()
        jax.block_until_ready(step(q, q, q))
        return time.perf_counter() - began
    return run


def attention_rows(worker: TorchWorker, lengths=LENGTHS) -> list[dict]:
    """Per length and kernel: attnjax's and SDPA's median seconds, alternating rounds."""
    rows = []
    for length in lengths:
        batch = max(4096 // length, 1)
        q = jax.random.normal(jax.random.key(0), (batch, length, 8, 32))
        shape = {"batch": batch, "heads": 8, "length": length, "head_dim": 32, "repeats": 1}
        for kernel in ATTENTION_KERNELS:
            ours = _attention_step(kernel, q)
            result = alternating(ours, functools.partial(_ask_seconds, worker, "attention", shape),
                                 per_round=1.0)
            row = {"kernel": kernel, "length": length, "batch": batch,
                   "attnjax_ms": 1e3 / result["tokens_per_s"],
                   "sdpa_ms": 1e3 / result["peer_tokens_per_s"],
                   "vs_sdpa": result["peer_ratio"], "low": result["peer_ratio_low"],
                   "high": result["peer_ratio_high"]}
            rows.append(row)
            print(f"attention T={length:>5} B={batch:>2} {kernel:>10}: attnjax "
                  f"{row['attnjax_ms']:8.1f} ms, SDPA {row['sdpa_ms']:8.1f} ms, speed x"
                  f"{row['vs_sdpa']:.2f} ({row['low']:.2f}-{row['high']:.2f})", flush=True)
    return rows


def training_rows(worker: TorchWorker, steps: int) -> list[dict]:
    """Per decoder setting and dispatch: tokens/s of both, alternating rounds."""
    rows = []
    for name, config in train_settings().items():
        if config.model.family != "decoder":
            continue
        m, t = config.model, config.train
        with tempfile.TemporaryDirectory() as scratch:
            corpus = Path(scratch) / "train.bin"
            tokens = read_bytes(config.data.path)
            start, end = split_bounds(len(tokens), "train", config.data.val_fraction)
            np.asarray(tokens[start:end], np.uint8).tofile(corpus)
            for per_dispatch in DISPATCHES:
                cfg = apply_overrides(config, {"train.steps_per_dispatch": per_dispatch})
                ours, per_call = train_loop(cfg)
                worker.ask({"train": {
                    "d_model": m.d_model, "num_layers": m.num_layers,
                    "num_heads": m.attention.num_heads, "length": cfg.data.length,
                    "batch_size": t.batch_size, "corpus": str(corpus), "steps": t.steps,
                    "warmup": t.warmup_steps, "learning_rate": t.learning_rate,
                    "steps_per_call": per_call}})
                calls = max(steps // (ROUNDS * per_call), math.ceil(WINDOW_S / ours(1)), 1)
                result = alternating(functools.partial(ours, calls),
                                     functools.partial(_ask_seconds, worker, "advance", calls),
                                     calls * per_call * t.batch_size * cfg.data.length)
                row = {"setting": name, "steps_per_dispatch": per_call,
                       "default": per_call == t.dispatch_steps(),
                       "tokens_per_s": result["tokens_per_s"],
                       "torch_tokens_per_s": result["peer_tokens_per_s"],
                       "vs_torch": result["peer_ratio"], "low": result["peer_ratio_low"],
                       "high": result["peer_ratio_high"]}
                rows.append(row)
                print(f"train {name[:2]} {per_call:>2} step(s)/dispatch"
                      f"{' (default)' if row['default'] else ''}: attnjax "
                      f"{row['tokens_per_s']:9.0f} tok/s, PyTorch {row['torch_tokens_per_s']:9.0f}"
                      f" tok/s, x{row['vs_torch']:.2f} ({row['low']:.2f}-{row['high']:.2f})",
                      flush=True)
    return rows


def run_torch_benchmark(python: str, steps: int = 50, out: str | None = None) -> dict:
    """Both tables (``attention_rows``, ``training_rows``) against the worker under
    ``python``; JSON to ``out``."""
    worker = TorchWorker(python)
    print(f"PyTorch {worker.versions['torch']} ({worker.versions['threads']} threads) against "
          f"attnjax on jax {jax.__version__} ({jax.default_backend()})", flush=True)
    try:
        result = {"torch": worker.versions, "attention": attention_rows(worker),
                  "training": training_rows(worker, steps)}
    finally:
        worker.close()
    write_json(out, {"backend": jax.default_backend(), **result})
    return result
