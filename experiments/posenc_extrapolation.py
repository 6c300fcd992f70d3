"""Train short, test long: position encodings evaluated at 1x..16x the training length.

    attnjax sweep experiments/posenc_extrapolation.py --workdir runs/posenc --launcher vmap
    attnjax report runs/posenc

Byte-level text (built-in corpus), trained at L = 32, evaluated at 32, 64, 128, 256, 512.
RESULTS
"""

from attnjax.config import (AttentionConfig, Config, DataConfig, ModelConfig, PositionConfig,
                            TrainConfig)
from attnjax.sweep import cross, product

LENGTH = 32
EVAL_LENGTHS = (64, 128, 256, 512)


def get_config() -> Config:
    return Config(
        model=ModelConfig(vocab_size=256, d_model=64, num_layers=2, max_length=LENGTH,
                          attention=AttentionConfig(num_heads=4),
                          # interpolate only acts for kind=learned (past max_length)
                          position=PositionConfig("rope", learned_interpolate=True)),
        data=DataConfig(task="text", path=None, length=LENGTH, eval_lengths=EVAL_LENGTHS),
        train=TrainConfig(steps=800, batch_size=16, learning_rate=3e-3, warmup_steps=50,
                          weight_decay=0.1, steps_per_dispatch=10, log_every=100,
                          eval_every=800, checkpoint_every=800, eval_batches=4,
                          eval_batch_size=16),
        seed=0)


POSITIONS = [
    {"model.position.kind": "sinusoidal"},
    {"model.position.kind": "learned"},
    {"model.position.kind": "rope"},
    {"model.position.kind": "alibi"},
    {"model.position.kind": "t5"},
    {"model.position.kind": "none"},
]


def get_sweep() -> list[dict]:
    return cross(POSITIONS, product({"seed": [0]}))


def get_eval_variants() -> list[dict]:
    """RoPE checkpoints re-evaluated with a scaling schedule, s = eval_length / LENGTH."""
    rope = {"model.position.kind": "rope"}
    return [
        {"label": f"rope+{name}", "run": rope,
         "overrides": {"model.position.rope_scaling": schedule},
         "scale_with_length": True}
        for name, schedule in [("pi", "linear"), ("ntk", "ntk"), ("yarn", "yarn")]]
