"""Training throughput (``attnjax bench train``): tokens/s of the compiled training loop and
model-FLOPs utilisation against a matmul peak measured in the same run, at 1 and 10 steps per
dispatch, and at 10 the framework tax of the decoder against the plain Flax peer
(``attnjax.bench.peer``); the encoder family's masked-language-model training at (b)'s size."""

from __future__ import annotations

import jax

from attnjax.bench.common import write_json
from attnjax.bench.flops import matmul_peak_flops, model_flops_per_token
from attnjax.bench.peer import peer_comparison
from attnjax.bench.throughput import train_throughput
from attnjax.config import Config, apply_overrides


def train_settings() -> dict:
    """The settings of the training benchmark: (a) width 256, 4 layers, 8 heads, sequence 256,
    batch 16; (b) the nanoGPT CPU setting (REFERENCES.md); (c) (b)'s model at sequence 1024,
    batch 4; (d) (b)'s size as a BERT-style encoder on masked-language modelling (sentence
    pairs, segment and embedding norm, the ``reference`` kernel: bidirectional attention has
    no masked half to skip). Learned absolute positions, as the plain Flax peer has
    (``attnjax.bench.peer``), and for the decoders the ``flash`` kernel, attnjax's fastest
    exact one for causal training on the CPU (the default ``reference`` kernel computes the
    masked half of the scores as the peer does)."""
    common = {"data.task": "text", "model.vocab_size": 256, "model.num_layers": 4,
              "model.position.kind": "learned", "model.attention.kernel": "flash"}
    a = {**common, "model.d_model": 256, "model.attention.num_heads": 8, "model.max_length": 256,
         "data.length": 256, "train.batch_size": 16}
    b = {**common, "model.d_model": 128, "model.attention.num_heads": 4, "model.max_length": 64,
         "data.length": 64, "train.batch_size": 12}
    c = {**b, "model.max_length": 1024, "data.length": 1024, "train.batch_size": 4}
    d = {**b, "model.family": "encoder", "data.task": "mlm", "model.vocab_size": 260,
         "data.segments": "pair", "model.type_vocab_size": 2, "model.embed_norm": True,
         "model.attention.kernel": "reference"}
    return {name: apply_overrides(Config(), {**o, "train.log_every": 10, "train.eval_every": 10,
                                             "train.checkpoint_every": 10})
            for name, o in (("a: d256 L4 H8 T256 B16", a), ("b: nanoGPT d128 L4 H4 T64 B12", b),
                            ("c: d128 L4 H4 T1024 B4", c),
                            ("d: BERT MLM d128 L4 H4 T64 B12", d))}


def run_train_benchmark(steps: int = 50, out: str | None = None) -> list[dict]:
    """Tokens/s and model-FLOPs utilisation against a matmul peak measured in the same run,
    for each setting and for 1 vs 10 steps per dispatch; at 10, also the plain Flax peer's
    tokens/s and ``peer_ratio`` (``attnjax.bench.peer``)."""
    peak = matmul_peak_flops()
    print(f"matmul peak (float32, best of 512^2..2048^2): {peak / 1e9:.1f} GFLOP/s", flush=True)
    rows = []
    for name, config in train_settings().items():
        per_token = model_flops_per_token(config)
        for per_dispatch in (1, 10):
            cfg = apply_overrides(config, {"train.steps_per_dispatch": per_dispatch})
            has_peer = per_dispatch > 1 and cfg.model.family == "decoder"
            peer = peer_comparison(cfg, steps) if has_peer else None
            result = peer or train_throughput(cfg, steps)
            peak = max(peak, matmul_peak_flops())  # a noisy machine: keep the best seen
            mfu = result["tokens_per_s"] * per_token / peak
            rows.append({"setting": name, "kernel": cfg.model.attention.kernel,
                         "steps_per_dispatch": per_dispatch,
                         "flops_per_token": per_token, "peak_flops": peak, "mfu": mfu, **result})
            versus = "" if peer is None else (
                f"  peer {peer['peer_tokens_per_s']:>9,.0f} tokens/s  peer_ratio "
                f"{peer['peer_ratio']:.2f}x ({peer['peer_ratio_low']:.2f}-"
                f"{peer['peer_ratio_high']:.2f} over {peer['rounds']} rounds)")
            print(f"{name:<32} steps/dispatch {per_dispatch:>2}: "
                  f"{result['tokens_per_s']:>9,.0f} tokens/s  MFU {mfu:6.1%}{versus}", flush=True)
    for row in rows:  # every ratio against the best peak of the whole run
        row["peak_flops"], row["mfu"] = peak, row["tokens_per_s"] * row["flops_per_token"] / peak
    print(f"MFU against the run's best matmul peak {peak / 1e9:.1f} GFLOP/s: " + ", ".join(
        f"{r['setting'][:1]}/{r['steps_per_dispatch']} {r['mfu']:.1%}" for r in rows))
    write_json(out, {"backend": jax.default_backend(), "rows": rows})
    return rows
