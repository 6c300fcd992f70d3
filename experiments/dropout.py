"""Dropout placement when the model overfits: none, on the attention probabilities (one mask
shared by all heads, or one per head), on the attention output, or on the residual stream.

    attnjax sweep experiments/dropout.py --workdir runs/dropout --launcher vmap
    attnjax report runs/dropout

The shared small setting (``attnjax.experiment.small_text``: byte-level text, 2 layers, 4
heads, width 64, RoPE, batch 16, 600 steps, lr 3e-3) at length 64, trained on the first 0.5%
of the built-in corpus (22.9 kB: ~27 epochs) and validated on 16 batches of 32 windows from
the rest, every 150 steps. Dropout rates are program arguments, so the two rates of each
placement train as one vmapped program (5 programs, 9 runs); one seed (every run sees the
same batches and the same validation windows, so differences are paired).
Runtime on 2 shared CPU cores: 6 min 19 s (load average ~5 from other jobs; timings on this
machine are pessimistic and noisy).

Expected: no published numbers in REFERENCES.md; qualitatively, when a model overfits, dropout
trades training loss for validation loss (Vaswani et al. 2017 use residual dropout 0.1 and
dropout on the attention probabilities).
Measured (2026-11-29; loss in nats/byte; from `attnjax report runs/dropout`: train, val
(final) and val (best @ step) are its columns `train loss`, `val loss` and `best_val_loss` @
`best_val_step`, the lowest validation loss over the 4 evaluations, i.e. early stopping):

    placement        rate   train   val (final)   val (best @ step)
    none             -      0.788   2.669         2.546 @ 150
    probs_shared     0.1    1.138   2.495         2.477 @ 300
    probs_shared     0.3    1.486   2.461         2.461 @ 600
    probs_per_head   0.1    1.137   2.509         2.490 @ 450
    probs_per_head   0.3    1.547   2.460         2.459 @ 450
    output           0.1    1.113   2.536         2.526 @ 450
    output           0.3    1.490   2.483         2.483 @ 600
    residual         0.1    1.459   2.465         2.465 @ 600
    residual         0.3    1.988   2.488         2.488 @ 600

Without dropout the model overfits at once: validation loss is lowest at step 150 (2.546) and
climbs to 2.669 while training loss falls to 0.79. Every placement stops the climb: final
validation loss 2.46-2.54, 0.13-0.21 below no dropout and up to 0.09 below its early-stopped
best. On the attention, 0.3 beats 0.1 for every placement; one mask shared across heads and
one per head are indistinguishable here (2.461 vs 2.460 at 0.3); dropout on the attention
output is the weakest at both rates. Residual dropout is as good at 0.1 (2.465) and already
too strong at 0.3 (training loss 1.99, validation accuracy 0.390 vs ~0.42 for the rest).
Differences under ~0.02 nats are within the noise of one seed and 32k validation tokens.
"""

from attnjax.config import Config
from attnjax.experiment import small_text
from attnjax.sweep import cross

PLACEMENTS = [
    {"model.attention.dropout": "probs_shared"},
    {"model.attention.dropout": "probs_per_head"},
    {"model.attention.dropout": "output"},
]
RATES = [0.1, 0.3]


def get_config() -> Config:
    return small_text({
        "model.max_length": 64, "data.length": 64,
        # the model trains on the first 0.5% of the corpus (22.9 kB) and is validated on
        # windows from the other 99.5%: ~27 epochs in 600 steps
        "data.val_fraction": 0.995,
        "train.eval_every": 150, "train.eval_batches": 16})


def get_sweep() -> list[dict]:
    attention = cross(PLACEMENTS, [{"model.attention.dropout_rate": r} for r in RATES])
    residual = [{"model.residual_dropout": r} for r in RATES]
    return [{}] + attention + residual


def get_report() -> dict:
    """Extra columns of ``attnjax report``: the early-stopped best against the final loss."""
    return {"metrics": ["best_val_loss", "best_val_step"]}
