"""Multi-query associative recall (Zoology's MQAR) with a small softmax-attention model.

    attnjax train experiments/mqar.py --workdir runs/mqar

Sequence length 64 with 4 key-value pairs (the first Zoology setting), vocabulary 256,
2 layers, 4 heads, width 64, RoPE. Runtime on 2 CPU cores: about 2 minutes.
Expected: attention solves MQAR (accuracy -> ~1.0 at every Zoology length, Arora et al. 2023,
REFERENCES.md); measured: filled in by the closing note of issue 3.
"""

from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, PositionConfig,
                            TrainConfig)


def get_config() -> Config:
    return Config(
        model=ModelConfig(vocab_size=256, d_model=64, num_layers=2, max_length=64,
                          attention=AttentionConfig(num_heads=4), position=PositionConfig("rope")),
        data=DataConfig(task="mqar", length=64, num_pairs=4, vocab_size=256),
        train=TrainConfig(steps=1500, batch_size=64, learning_rate=3e-3, warmup_steps=100,
                          weight_decay=0.1, steps_per_dispatch=10, log_every=100,
                          eval_every=500, eval_batches=8, eval_batch_size=64,
                          checkpoint_every=500),
        seed=0)
