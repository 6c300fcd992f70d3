"""Train short, test long, with every sequence split over devices: the position encodings of
``posenc_extrapolation`` trained at L = 256 and evaluated at L, 2L, 4L and 8L (2048) on a
``sequence`` axis of 8 devices, the ring kernel passing keys and values around them (the
zig-zag layout under the causal mask). Positions stay global, so each encoding computes what
one device computes (tests/test_sharding.py).

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
        attnjax sweep experiments/posenc_long.py --workdir runs/posenc-long --launcher sequential
    attnjax report runs/posenc-long

On a CPU the 8 devices share its cores: this is the small version, 300 steps of the shared
small model (width 64, 2 layers, 4 heads) at batch 8. To scale it on accelerators: more
devices on the axis (``train.mesh.sequence``, the device count, or -1), a longer L
(``data.length``, ``model.max_length``) and its multiples in ``data.eval_lengths``, each a
multiple of twice the axis size; e.g. on 8 GPUs ``data.length=8192 model.max_length=65536
data.eval_lengths=[16384,32768,65536]``.
"""

from attnjax.config import Config
from attnjax.experiment import small_text
from attnjax.sweep import cross, product

POSITIONS = [
    {"model.position.kind": "sinusoidal"},
    {"model.position.kind": "rope"},
    {"model.position.kind": "alibi"},
    {"model.position.kind": "t5"},
    {"model.position.kind": "none"},
]


def get_config() -> Config:
    """L = 256 over a sequence axis of 8 devices, evaluated at 2L..8L."""
    return small_text({"data.length": 256, "model.max_length": 2048,
                       "data.eval_lengths": [512, 1024, 2048], "train.steps": 300,
                       "train.batch_size": 8, "train.log_every": 100, "train.eval_every": 300,
                       "train.checkpoint_every": 300, "train.eval_batch_size": 8,
                       "train.eval_batches": 2, "model.attention.kernel": "ring",
                       "model.attention.fused_qkv": False, "train.mesh.data": 1,
                       "train.mesh.sequence": 8})


def get_sweep() -> list[dict]:
    return cross(POSITIONS, product({"seed": [0]}))
