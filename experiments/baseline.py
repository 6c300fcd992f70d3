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

from attnjax.config import Config
from attnjax.experiment import small_text


def get_config() -> Config:
    """The shared small setting, scaled up to nanoGPT's CPU run."""
    return small_text({
        "model.d_model": 128, "model.num_layers": 4, "model.max_length": 64, "data.length": 64,
        "train.steps": 2000, "train.batch_size": 12, "train.learning_rate": 1e-3,
        "train.warmup_steps": 100, "train.log_every": 100, "train.eval_every": 500,
        "train.checkpoint_every": 500, "train.eval_batches": 20, "train.eval_batch_size": 64})
