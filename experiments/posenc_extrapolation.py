"""Train short, test long: position encodings evaluated at 1x..16x the training length.

    attnjax sweep experiments/posenc_extrapolation.py --workdir runs/posenc --launcher vmap
    attnjax report runs/posenc

The shared small setting (``attnjax.experiment.small_text``: byte-level text from the
built-in corpus, 2 layers, 4 heads (ALiBi slopes 1/4..1/256; REFERENCES.md asks for >= 4
heads), width 64, batch 16, lr 3e-3), 800 steps, one seed, trained at L = 32 and evaluated at
L, 2L, 4L, 8L and 16L (32..512). ``learned`` reads its 32-row table stretched
to longer inputs (``learned_interpolate``). The RoPE checkpoint is evaluated again with PI
(``rope_scaling=linear``), NTK and YaRN at s = eval_length / 32 (``get_eval_variants``).
Runtime on 2 shared CPU cores: 4 min 8 s for the whole sweep with its evaluation variants
(load average ~4 from other jobs; timings on this machine are pessimistic and noisy).

The same ablation at length, trained at L = 256 and evaluated to 8L with every sequence split
over a sequence axis of devices (the ring kernel): ``posenc_long``.

Expected (Press et al., ALiBi, Table 2, REFERENCES.md): sinusoidal fails almost at once past L,
rotary degrades after ~1.5-2x L, ALiBi stays flat or improves; T5 bias also extrapolates.

Measured (2026-11-29; the sinusoidal row 2026-12-01, after token embeddings were scaled by
sqrt(d_model) under sinusoidal positions, as Vaswani et al. do; the other rows do not change
with it. The extrapolation table of `attnjax report runs/posenc`: validation
loss in nats/byte at each evaluation length, one row per ``kind``; the rows `kind=rope +
rope+pi`, `+ rope+ntk` and `+ rope+yarn` are the evaluation variants, shown under rope here;
a longer window also averages its early, short-context positions, so a flat curve is the best
an encoding can do):

    kind                32 (L)    64     128    256    512
    sinusoidal          2.002   2.537  2.823  3.015  2.991
    learned (interp.)   2.010   2.112  2.381  2.579  2.743
    rope                1.852   2.074  2.601  2.993  3.243
      + PI (linear)     1.852   2.275  2.810  3.049  3.214
      + NTK             1.852   1.905  2.486  2.830  3.116
      + YaRN            1.852   1.925  2.259  2.572  2.815
    alibi               2.047   2.066  2.196  2.208  2.159
    t5                  2.020   2.123  2.366  2.526  2.582
    none (NoPE)         2.162   2.273  2.471  2.544  2.544

The shape of Table 2 reproduces: sinusoidal is as good as the learned table at L (2.00 vs
2.01) but the worst encoding from 2L on (+0.53 at 2L, +0.99 at 16L); RoPE is best at L but
+0.22 at 2L and +1.39 at 16L;
ALiBi is within +0.02 at 2L and stays within 0.17 of its L value out to 16L (lower at 512
than at 256). T5 bias degrades gently (+0.56 at 16L), unlike the paper's flat T5 curve: its
32 buckets reach max_distance 128 but only distances < 32 were ever trained. Applied at
evaluation only (no fine-tuning), NTK and YaRN cut RoPE's 2L loss from 2.07 to 1.91 / 1.93;
PI (positions squeezed by s) is worse than plain RoPE up to 8L.
At L = 32 YaRN's 32-rotation cutoff does not exist (REFERENCES.md): of the 8 rotary pairs
only pair 0 keeps its frequency, pair 1 is half interpolated and the rest are interpolated as
in PI, plus the temperature term; it still gives the best RoPE numbers from 4L on.
What differs from the paper: at L the encodings are not equal (RoPE 1.85, sinusoidal 2.00,
ALiBi 2.05) because 800 steps is far from convergence. Before tokens were scaled, sinusoidal
was a strawman: 2.439 at L, worse than no position encoding, and above a unigram model (3.15)
from 4L on. Token embeddings start at std 0.02 (row norm ~0.16) while the added sinusoid has
norm sqrt(32) = 5.7, so after the pre-norm the token identity was a few percent of the signal;
times sqrt(64) = 8 it is comparable (``model.embed_scale`` sets the factor explicitly).
Reproduce the row: ``attnjax train experiments/posenc_extrapolation.py
model.position.kind=sinusoidal --workdir runs/sinusoidal`` (40 s).
"""

from attnjax.config import Config
from attnjax.experiment import small_text
from attnjax.sweep import cross, product


def get_config() -> Config:
    """Trained at the shared length 32, evaluated at 2x..16x."""
    return small_text({"data.eval_lengths": [64, 128, 256, 512], "train.steps": 800,
                       "train.log_every": 100, "train.eval_every": 800,
                       "train.checkpoint_every": 800, "train.eval_batch_size": 16})


POSITIONS = [
    {"model.position.kind": "sinusoidal"},
    # the learned table has data.length rows: longer evaluations read it stretched
    {"model.position.kind": "learned", "model.position.learned_interpolate": True},
    {"model.position.kind": "rope"},
    {"model.position.kind": "alibi"},
    {"model.position.kind": "t5"},
    {"model.position.kind": "none"},
]


def get_sweep() -> list[dict]:
    return cross(POSITIONS, product({"seed": [0]}))


def get_eval_variants() -> list[dict]:
    """RoPE checkpoints re-evaluated with a scaling schedule, s = eval_length / data.length."""
    rope = {"model.position.kind": "rope"}
    return [
        {"label": f"rope+{name}", "run": rope,
         "overrides": {"model.position.rope_scaling": schedule},
         "scale_with_length": True}
        for name, schedule in [("pi", "linear"), ("ntk", "ntk"), ("yarn", "yarn")]]
