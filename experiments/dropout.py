"""Dropout placement when the model overfits: none, on the attention probabilities (one mask
shared by all heads, or one per head), on the attention output, or on the residual stream.

    attnjax sweep experiments/dropout.py --workdir runs/dropout --launcher vmap
    attnjax report runs/dropout

RESULTS
"""

from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, PositionConfig,
                            TrainConfig)
from attnjax.sweep import cross, product

PLACEMENTS = [
    {"model.attention.dropout": "probs_shared"},
    {"model.attention.dropout": "probs_per_head"},
    {"model.attention.dropout": "output"},
]
RATES = [0.1, 0.3]


def get_config() -> Config:
    return Config(
        model=ModelConfig(vocab_size=256, d_model=64, num_layers=2, max_length=64,
                          attention=AttentionConfig(num_heads=4),
                          position=PositionConfig("rope")),
        # val_fraction 0.995: the model trains on the first 0.5% of the corpus (22.9 kB) and
        # is validated on windows from the other 99.5%: ~27 epochs in 600 steps
        data=DataConfig(task="text", path=None, length=64, val_fraction=0.995),
        train=TrainConfig(steps=600, batch_size=16, learning_rate=3e-3, warmup_steps=50,
                          weight_decay=0.1, steps_per_dispatch=10, log_every=50,
                          eval_every=150, checkpoint_every=600, eval_batches=16,
                          eval_batch_size=32),
        seed=0)


def get_sweep() -> list[dict]:
    attention = cross(PLACEMENTS, [{"model.attention.dropout_rate": r} for r in RATES])
    residual = [{"model.residual_dropout": r} for r in RATES]
    return [{}] + attention + residual
