"""The `make demo` sweep: RoPE vs ALiBi on byte-level text, trained at length 32 and evaluated
at 32 and 128 (4x), two seeds each (each encoding's seeds train as one vmapped program).

    attnjax sweep experiments/demo.py --workdir runs/demo-sweep --launcher vmap
    attnjax report runs/demo-sweep

RESULTS
"""

from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, PositionConfig,
                            TrainConfig)
from attnjax.sweep import product


def get_config() -> Config:
    return Config(
        model=ModelConfig(vocab_size=256, d_model=64, num_layers=2, max_length=32,
                          attention=AttentionConfig(num_heads=4),
                          position=PositionConfig("rope")),
        data=DataConfig(task="text", path=None, length=32, eval_lengths=(128,)),
        train=TrainConfig(steps=1000, batch_size=16, learning_rate=3e-3, warmup_steps=50,
                          weight_decay=0.1, steps_per_dispatch=10, log_every=50,
                          eval_every=500, checkpoint_every=1000, eval_batches=4,
                          eval_batch_size=16),
        seed=0)


def get_sweep() -> list[dict]:
    return product({"model.position.kind": ["rope", "alibi"], "seed": [0, 1]})
