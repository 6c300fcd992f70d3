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

Expected (Press et al., ALiBi, Table 2, REFERENCES.md): sinusoidal and rotary degrade past L,
ALiBi stays flat or improves; T5's bucketed bias and no position encoding (causal attention
alone) extrapolate too.

Measured (2 seeds, 300 steps each, about 30 s a run on 2 CPU cores; the extrapolation table
of ``attnjax report runs/posenc-long``: validation loss in nats/byte, mean +- std over seeds;
a longer window also averages its early, short-context positions, so a flat curve is the best
an encoding can do; the plot is docs/experiments/posenc_long.png):

    kind          256 (L)         512            1024           2048 (8L)
    sinusoidal    2.675 +- 0.050  2.657 +- 0.042  2.800 +- 0.007  2.897 +- 0.026
    rope          2.407 +- 0.082  2.300 +- 0.084  2.509 +- 0.015  2.740 +- 0.087
    alibi         2.354 +- 0.084  2.212 +- 0.050  2.196 +- 0.044  2.190 +- 0.030
    t5            2.569 +- 0.076  2.488 +- 0.047  2.472 +- 0.034  2.498 +- 0.013
    none          2.604 +- 0.076  2.507 +- 0.049  2.491 +- 0.033  2.499 +- 0.011

As published, and as ``posenc_extrapolation`` measures on one device at L = 32: ALiBi is the
best at L and improves out to 8L (2.354 -> 2.190); rotary is second at L, better at 2L, then
worse than every other encoding but sinusoidal by 8L (+0.33 over its L); sinusoidal is the
worst at L and degrades steadily (+0.22); T5 and no encoding stay flat within 0.1 of their
L. So the orders at L and at 8L differ: a ranking at the training length alone would pick
rotary over T5 and NoPE, and at 8L it is the other way round.
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
    return cross(POSITIONS, product({"seed": [0, 1]}))
