"""Attention logit scale and qk-normalisation, and the Wortsman et al. (2023) kappa probe.

    attnjax sweep experiments/scale.py --workdir runs/scale --launcher vmap
    attnjax report runs/scale

Byte-level text (built-in corpus), length 32, 2 layers, 4 heads of head_dim 16, width 64,
RoPE, batch 16, 600 steps at a high learning rate (1e-2, where logit growth shows; Wortsman
et al.). Runs: scale 1/sqrt(d) x {0.5, 1, 2} (``scale_multiplier``, one vmapped program per
qk-norm) with qk_norm none / rms / layer, scale 1/d without qk-norm, and the kappa probe
(``qk_norm=kappa``: q and k normalised to RMS sqrt(kappa), no gain) for kappa in 1..1e4.

RESULTS
"""

import numpy as np

from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, PositionConfig,
                            TrainConfig)
from attnjax.sweep import cross


def get_config() -> Config:
    return Config(
        model=ModelConfig(vocab_size=256, d_model=64, num_layers=2, max_length=32,
                          attention=AttentionConfig(num_heads=4),
                          position=PositionConfig("rope")),
        data=DataConfig(task="text", path=None, length=32),
        train=TrainConfig(steps=600, batch_size=16, learning_rate=1e-2, warmup_steps=50,
                          weight_decay=0.1, steps_per_dispatch=10, log_every=50,
                          eval_every=600, checkpoint_every=600, eval_batches=4,
                          eval_batch_size=32),
        seed=0)


def get_sweep() -> list[dict]:
    multipliers = [{"model.attention.scale": "inv_sqrt_d", "model.attention.scale_multiplier": m}
                   for m in (0.5, 1.0, 2.0)]
    norms = [{"model.attention.qk_norm": n} for n in ("none", "rms", "layer")]
    inv_d = [{"model.attention.scale": "inv_d", "model.attention.qk_norm": "none"}]
    kappa = [{"model.attention.qk_norm": "kappa", "model.attention.qk_kappa": k}
             for k in (1.0, 10.0, 100.0, 1000.0, 10000.0)]
    return cross(multipliers, norms) + inv_d + kappa


def bigram_val_loss(val_fraction: float = 0.1, smoothing: float = 0.1) -> float:
    """Cross-entropy (nats/byte) on the validation split of the built-in corpus of a bigram
    model counted on its training split (add-``smoothing``): the baseline of the kappa probe.
    ``python -c "from attnjax.experiment import load_experiment as l;
    print(l('experiments/scale.py').bigram_val_loss())"``"""
    from attnjax.data.text import read_bytes, split_bounds
    tokens = read_bytes(None).astype(np.int64)

    def counts(start_end):
        x = tokens[slice(*start_end)]
        table = np.zeros((256, 256))
        np.add.at(table, (x[:-1], x[1:]), 1.0)
        return table

    train = counts(split_bounds(len(tokens), "train", val_fraction))
    val = counts(split_bounds(len(tokens), "val", val_fraction))
    p = (train + smoothing) / (train + smoothing).sum(1, keepdims=True)
    return float(-(val * np.log(p)).sum() / val.sum())
