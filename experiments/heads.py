"""Head count at fixed width (d_model 64: 1..16 heads, head_dim 64..4), and key/value sharing
(MQA: 8 query heads, 1 key/value head; GQA: 8 query heads, 2 key/value heads), on a recall
task and on byte-level text.

    attnjax sweep experiments/heads.py --workdir runs/heads --launcher vmap
    attnjax report runs/heads

RESULTS
"""

from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, PositionConfig,
                            TrainConfig)
from attnjax.sweep import cross

TASKS = [
    {"data.task": "text", "train.batch_size": 16, "train.steps": 600},
    {"data.task": "induction", "data.vocab_size": 32, "train.batch_size": 32, "train.steps": 800},
]
HEADS = [{"model.attention.num_heads": n} for n in (1, 2, 4, 8, 16)] + [
    {"model.attention.num_heads": 8, "model.attention.num_kv_heads": 1},    # MQA
    {"model.attention.num_heads": 8, "model.attention.num_kv_heads": 2},    # GQA
]


def get_config() -> Config:
    return Config(
        model=ModelConfig(vocab_size=256, d_model=64, num_layers=2, max_length=32,
                          attention=AttentionConfig(num_heads=4),
                          position=PositionConfig("rope")),
        data=DataConfig(task="text", path=None, length=32),
        # constant learning rate after warmup: the induction circuit forms sooner
        train=TrainConfig(steps=600, batch_size=32, learning_rate=3e-3, warmup_steps=50,
                          final_lr_fraction=1.0, weight_decay=0.0, steps_per_dispatch=10,
                          log_every=50, eval_every=200, checkpoint_every=400, eval_batches=4,
                          eval_batch_size=32),
        seed=0)


def get_sweep() -> list[dict]:
    return cross(TASKS, HEADS)
