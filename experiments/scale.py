"""Attention logit scale and qk-normalisation, and the Wortsman et al. (2023) kappa probe.

    attnjax sweep experiments/scale.py --workdir runs/scale --launcher vmap
    attnjax report runs/scale

The shared small setting (``attnjax.experiment.small_text``: byte-level text, length 32, 2
layers, 4 heads of head_dim 16, width 64, RoPE, batch 16, 600 steps) at a high learning
rate (1e-2, where logit growth shows; Wortsman et al.). Runs: scale 1/sqrt(d) x {0.5, 1, 2}
(``scale_multiplier``, one vmapped program per qk-norm) with qk_norm none / rms / layer,
scale 1/d without qk-norm, and the kappa probe (``qk_norm=kappa``: q and k normalised to RMS
sqrt(kappa), no gain) for kappa in 1..1e4.

Runtime on 2 shared CPU cores: about 5 minutes with ``--launcher vmap`` (load ~5).

Expected (REFERENCES.md): 1/sqrt(d) keeps q.k at unit variance; Wortsman et al. 2023: attention
logit growth makes high learning rates unstable and per-head qk-layernorm removes it; with q
and k normalised to RMS sqrt(kappa), loss degrades around kappa = 1e3 and is worse than a
bigram model at 1e4. Bigram baseline here: 2.474 nats/byte (``bigram_val_loss()``: counts on
the training split, add-0.1, scored on the validation split; a unigram model gives 3.153).
Measured (2026-11-29, one seed, all runs on the same batches; from `attnjax report
runs/scale`: val loss, train loss and max logit are its columns `val loss` (nats/byte),
`train loss` and `max_attn_logit`, the largest scaled q.k over causal pairs at the end; the
peaks below are `max_attn_logit:max`, the skipped updates `skipped`):

    qk_norm  scale                      val loss   train loss   max logit
    none     0.5/sqrt(d)                2.073      2.109          29
    none     1/d (= 0.25/sqrt(d))       2.093      2.145          32
    none     1/sqrt(d)                  2.111      2.170          55
    none     2/sqrt(d)                  2.146      2.184          94
    rms      0.5/sqrt(d)                2.110      2.152           9
    rms      1/sqrt(d)                  2.064      2.098          11
    rms      2/sqrt(d)                  2.037      2.132          14
    layer    0.5/sqrt(d)                2.088      2.099           9
    layer    1/sqrt(d)                  2.056      2.083          13
    layer    2/sqrt(d)                  2.043      2.076          13
    kappa 1      (1/sqrt(d))            2.112      2.200           4
    kappa 10                            2.108      2.150          38
    kappa 100                           2.389      2.424         384
    kappa 1e3                           2.647      2.687        3789
    kappa 1e4                           2.780      2.800       37893

Without qk-norm the max attention logit grows with the scale (peaks 42 / 71 / 145 for
0.5 / 1 / 2 x 1/sqrt(d)) and, at this high learning rate, a cooler scale is better (2.073 at
0.5/sqrt(d) vs 2.146 at 2/sqrt(d); 1/d sits between). No run diverged (no skipped updates):
at this size lr 1e-2 is not enough to show Wortsman's divergence, only the logit growth.
qk-norm (rms or layer, with learned gains) bounds the logits (9-14) and reverses the
preference: the hottest scale is best (2.037 rms, 2.043 layer at 2/sqrt(d)); at 1 and 2 x
1/sqrt(d) both beat every run without qk-norm.
The kappa probe reproduces in shape, one decade early: kappa 1 and 10 train normally
(2.11), kappa 100 is already 0.28 worse, and kappa 1e3 (2.647) and 1e4 (2.780) are worse than
the bigram model (2.474); Wortsman et al. put the degradation near 1e3 and the bigram crossing
at 1e4. With RMS sqrt(kappa) the largest logit is kappa * sqrt(head_dim) = 4 kappa here, so
from kappa 100 on the attention is close to one-hot at initialisation and gets little
gradient. Differences under ~0.03 nats are within the noise of one seed.
"""

import numpy as np

from attnjax.config import Config
from attnjax.experiment import small_text
from attnjax.sweep import cross


def get_config() -> Config:
    return small_text({"train.learning_rate": 1e-2})    # high: where logit growth shows


def get_sweep() -> list[dict]:
    multipliers = [{"model.attention.scale": "inv_sqrt_d", "model.attention.scale_multiplier": m}
                   for m in (0.5, 1.0, 2.0)]
    norms = [{"model.attention.qk_norm": n} for n in ("none", "rms", "layer")]
    inv_d = [{"model.attention.scale": "inv_d", "model.attention.qk_norm": "none"}]
    kappa = [{"model.attention.qk_norm": "kappa", "model.attention.qk_kappa": k}
             for k in (1.0, 10.0, 100.0, 1000.0, 10000.0)]
    return cross(multipliers, norms) + inv_d + kappa


def get_report() -> dict:
    """Extra columns of ``attnjax report``: the final and peak max attention logit, and the
    updates skipped as non-finite."""
    return {"metrics": ["max_attn_logit", "max_attn_logit:max", "skipped"]}


def bigram_val_loss(val_fraction: float = 0.1, smoothing: float = 0.1) -> float:
    """Cross-entropy (nats/byte) on the validation split of the built-in corpus of a bigram
    model counted on its training split (add-``smoothing``): the baseline of the kappa probe.
    ``python -c "from attnjax.experiment import load_experiment as l;
    print(l('experiments/scale.py').bigram_val_loss())"``"""
    from attnjax.data.text import read_bytes, split_bounds
    tokens = read_bytes(None).astype(np.int64)

    def counts(start_end):
        x = tokens[slice(*start_end)]
        table = np.zeros((256, 256))
        np.add.at(table, (x[:-1], x[1:]), 1.0)
        return table

    train = counts(split_bounds(len(tokens), "train", val_fraction))
    val = counts(split_bounds(len(tokens), "val", val_fraction))
    p = (train + smoothing) / (train + smoothing).sum(1, keepdims=True)
    return float(-(val * np.log(p)).sum() / val.sum())
