"""MK7: padding must be masked; left unmasked, the pads add noise.

Measure: S-text on padded batches (``attnjax.data.padding``): every example has a real length
drawn uniformly in 16-64 (``data.min_length=16``) and is left-padded to 64 with byte 0
(``data.padding=left``, ``data.pad_token=0``; no loss on pads, real tokens at positions
0..n-1), trained with the key-padding mask (``model.attention.key_padding_mask=true``) and
without it (``false``: the pads stay visible to the real tokens), seeds 0 and 1, **300 steps**
(cut from 600, as CLAIMS.md allows). Per run: the real-token validation loss (the run's own
padded validation batches, pads unscored) and the logit change with pad content: on its first
2 validation batches (64 windows), the same batches with the pads replaced by random bytes
(``data.pad_token=null``: the same windows and lengths, only the pad content differs), the
mean over real tokens of ``max_v |logit_v(random pads) - logit_v(zero pads)|``. Control:
the same change on right-padded batches (``data.padding=right``, pads after the real tokens,
hidden by the causal mask), reported.

Left open and resolved here: "logits move by > 1e-3" is the mean over real tokens of each
token's largest logit change (the max is reported too); "loss is worse by > eps" compares the
unmasked and masked runs at each seed. The pad-content variation is applied at evaluation; the
training pads are zeros only (training with random pads as a second regime is cut: the
criterion does not need it).

Cost: 2 arms x 2 seeds at 300 steps, ~2 units.

    attnjax audit experiments/claims --workdir runs/claims --only MK7
"""

import functools

import jax
import numpy as np

from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import EPS, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.config import apply_overrides
from attnjax.data import load_dataset
from attnjax.data.padding import model_arguments
from attnjax.models import build

ID = "MK7"
SOURCE = "000 §6.1"
CLAIM = "padding must be masked, otherwise it adds noise"
CRITERION = "unmasked logits move by > 1e-3 with pad content and loss is worse by > eps"
MOVE = 1e-3
BATCHES = 2
S300 = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
PADDED = {"data.padding": "left", "data.min_length": 16, **S300}
ARMS = {"masked": PADDED, "unmasked": {**PADDED, "model.attention.key_padding_mask": False}}


def get_sweep():
    return with_seeds(list(ARMS.values()))


@functools.lru_cache(maxsize=4)
def _logits(model_config):
    model = build(model_config)
    return jax.jit(lambda p, batch: model.apply({"params": p}, batch["inputs"],
                                                **model_arguments(batch))[0])


def pad_change(config, params, padding: str) -> dict:
    """Mean and max over real tokens of the largest logit change when the pads (``padding``
    side) hold random bytes instead of zeros."""
    logits = _logits(config.model)
    mean, top = [], []
    zero_data = apply_overrides(config, {"data.padding": padding}).data
    random_data = apply_overrides(config, {"data.padding": padding, "data.pad_token": None}).data
    for i in range(BATCHES):
        zero, rand = (load_dataset(d).batch(config.seed, i, config.train.eval_batch_size,
                                            config.data.length, "val")
                      for d in (zero_data, random_data))
        assert np.array_equal(zero["token_mask"], rand["token_mask"])
        real = np.asarray(zero["token_mask"])
        change = np.abs(np.asarray(logits(params, rand)) - np.asarray(logits(params, zero)))
        per_token = change.max(-1)[real]
        mean.append(per_token.mean())
        top.append(per_token.max())
    return {"mean": float(np.mean(mean)), "max": float(np.max(top))}


def measure(runs) -> dict:
    out = {}
    for name, arm in ARMS.items():
        for seed, trained in runs.by_seed(arm).items():
            config, params, _ = trained.dir.params("latest")
            out.setdefault(name, {})[str(seed)] = {
                "loss": trained.loss(), "change": pad_change(config, params, "left"),
                "control": pad_change(config, params, "right")}
    return out


def verdict(r):
    masked, unmasked = r["masked"], r["unmasked"]
    ok, note = over_seeds({s: unmasked[s]["change"]["mean"] > MOVE
                           and unmasked[s]["loss"] - masked[s]["loss"] > EPS for s in unmasked})
    show = "; ".join(
        f"seed {s}: unmasked logit change mean {unmasked[s]['change']['mean']:.3g} (max "
        f"{unmasked[s]['change']['max']:.3g}), masked {masked[s]['change']['mean']:.2g}, "
        f"right-pad control {unmasked[s]['control']['mean']:.2g}; loss unmasked "
        f"{unmasked[s]['loss']:.4f} - masked {masked[s]['loss']:.4f} = "
        f"{unmasked[s]['loss'] - masked[s]['loss']:+.4f}" for s in unmasked)
    return holds(ok, "; ".join(filter(None, [show, note])))


def _example(change, unmasked_loss):
    run = lambda c, loss: {"loss": loss, "change": {"mean": c, "max": 3 * c},
                           "control": {"mean": 0.0, "max": 0.0}}
    return {"masked": {s: run(0.0, 2.30) for s in "01"},
            "unmasked": {s: run(change, unmasked_loss) for s in "01"}}


EXAMPLES = [
    (_example(0.05, 2.40), "confirmed"),
    (_example(0.05, 2.31), "refuted"),
    (_example(1e-4, 2.40), "refuted"),
]
