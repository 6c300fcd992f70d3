"""Byte-level language model on the built-in corpus (the interpreter's standard library).

The nanoGPT CPU setting: 4 layers, 4 heads, width 128, context 64, batch 12, 2000 steps,
lr 1e-3, no dropout, RoPE.

    attnjax train experiments/baseline.py --workdir runs/baseline
    attnjax train experiments/baseline.py data.path=../shared/data/tinyshakespeare.txt \
        --workdir runs/shakespeare

Runtime on 2 CPU cores: about 3 minutes (with evaluation and checkpoints).
Expected: on tiny Shakespeare nanoGPT's README reports validation loss ~1.88 for this setting
(REFERENCES.md); source code is more regular than Shakespeare, so the built-in corpus lands
lower. Measured (2026-11-29, 2 CPU cores, Python 3.12.1's stdlib as the built-in corpus):
validation loss 1.541 on the built-in corpus in 3 min 16 s (`make demo` from a fresh clone);
1.687 on tiny Shakespeare (train loss 1.505).
"""

from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, PositionConfig,
                            TrainConfig)


def get_config() -> Config:
    return Config(
        model=ModelConfig(vocab_size=256, d_model=128, num_layers=4, max_length=64,
                          attention=AttentionConfig(num_heads=4), position=PositionConfig("rope")),
        data=DataConfig(task="text", path=None, length=64),
        train=TrainConfig(steps=2000, batch_size=12, learning_rate=1e-3, warmup_steps=100,
                          weight_decay=0.1, steps_per_dispatch=10, log_every=100,
                          eval_every=500, eval_batches=20, eval_batch_size=64,
                          checkpoint_every=500),
        seed=0)
