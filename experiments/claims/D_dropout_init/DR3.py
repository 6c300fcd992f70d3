"""DR3: attention dropout left on at inference makes the outputs unstable.

Measure: DR1's S-small runs with per-head dropout (``probs_per_head``) at rates 0.1 and 0.3,
seeds 0 and 1, 300 steps, last checkpoint; 10 evaluations with dropout on over the run's
validation batches (``train.eval_batches`` batches of ``train.eval_batch_size`` windows at
the training length): per pass the mean cross-entropy, and per position the argmax
prediction. Loss std: the standard deviation (ddof 1) of the 10 pass losses; flip rate: the
fraction of scored positions whose argmax differs between two passes, averaged over the 45
pairs of passes.

How the passes are made: ``attnjax.train.evaluate(..., train_mode=True)`` draws its dropout
masks from ``fold_in(stream_key(seed, EVAL_DROPOUT_STREAM), batch index)``, a function of the
run's seed and the batch index only, so calling it 10 times repeats one pass 10 times (the
measurement checks this: ``evaluate_repeats``) and a new seed would also change the
validation batches. The passes here use the same derivation with the batch index shifted by
``pass * eval_batches`` (pass 0 is ``evaluate``'s own pass, checked: ``pass0_vs_evaluate``),
through ``DecoderLM`` with ``deterministic=False``.

Regimes: dropout 0.1, 0.3; criterion per seed.

Cost: none of its own (DR1's runs).

    attnjax audit experiments/claims --workdir runs/claims --only DR3
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.heads import validation_batches
from attnjax.audit import over_regimes
from attnjax.audit.settings import S_SMALL, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.data import load_dataset
from attnjax.models import build
from attnjax.train.loop import evaluate
from attnjax.train.state import EVAL_DROPOUT_STREAM, stream_key
from attnjax.models.family import scored_sums

ID = "DR3"
SOURCE = "000 §8.6"
CLAIM = "attention dropout left on at inference makes outputs unstable"
CRITERION = "flip rate >= 1% or loss std >= 0.01"
RATES = (0.1, 0.3)
PASSES = 10
FLIPS, STD = 0.01, 0.01
S300 = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}


def arm(rate: float) -> dict:
    """DR1's S-small arm at ``rate`` (spelled as DR1 spells it, so the runs are shared)."""
    return {**S_SMALL, "model.attention.dropout": "probs_per_head",
            "model.attention.dropout_rate": rate, **S300}


def get_sweep():
    return with_seeds([arm(rate) for rate in RATES])


@functools.lru_cache(maxsize=4)
def _dropout_pass(model_config):
    model = build(model_config)

    def run(params, batch, rng):
        logits, _ = model.apply({"params": params}, batch["inputs"], deterministic=False,
                                rngs={"dropout": rng})
        return scored_sums(logits, batch), jnp.argmax(logits, -1)
    return jax.jit(run)


def passes(config, params) -> dict:
    batches = validation_batches(config)
    run, n = _dropout_pass(config.model), len(batches)
    losses, argmax = [], []
    for p in range(PASSES):
        totals, predictions = np.zeros(2), []
        for i, batch in enumerate(batches):
            rng = jax.random.fold_in(stream_key(config.seed, EVAL_DROPOUT_STREAM), p * n + i)
            sums, top = run(params, batch, rng)
            totals += [float(sums["ce"]), float(sums["weight"])]
            predictions.append(np.asarray(top)[np.asarray(batch["weights"]) > 0])
        losses.append(totals[0] / totals[1])
        argmax.append(np.concatenate(predictions))
    flips = [np.mean(a != b) for a, b in itertools.combinations(argmax, 2)]
    dataset = load_dataset(config.data)
    repeats = [evaluate(config, params, dataset, train_mode=True)[config.data.length]["loss"]
               for _ in range(2)]
    return {"loss_std": float(np.std(losses, ddof=1)), "flip_rate": float(np.mean(flips)),
            "losses": losses, "evaluate_repeats": repeats,
            "pass0_vs_evaluate": abs(losses[0] - repeats[0])}


def measure(runs) -> dict:
    out = {}
    for rate in RATES:
        for seed, trained in runs.by_seed(arm(rate)).items():
            config, params, _ = trained.dir.params("latest")
            out.setdefault(str(rate), {})[str(seed)] = passes(config, params)
    return out


def verdict(r):
    holding = {f"dropout {rate}": {s: x["flip_rate"] >= FLIPS or x["loss_std"] >= STD
                                   for s, x in seeds.items()} for rate, seeds in r.items()}
    evidence = "; ".join(
        f"dropout {rate} seed {s}: flip rate {x['flip_rate']:.2%}, loss std {x['loss_std']:.4f}"
        for rate, seeds in r.items() for s, x in seeds.items())
    same = all(x["evaluate_repeats"][0] == x["evaluate_repeats"][1]
               for seeds in r.values() for x in seeds.values())
    note = ("evaluate(train_mode=True) repeats one pass (identical losses when called twice)"
            if same else "evaluate(train_mode=True) gave different losses when called twice")
    return over_regimes(holding, f"{evidence}; {PASSES} passes; {note}")


def _example(flips, std):
    run = {"loss_std": std, "flip_rate": flips, "losses": [2.0] * PASSES,
           "evaluate_repeats": [2.0, 2.0], "pass0_vs_evaluate": 0.0}
    return {str(rate): dict.fromkeys("01", run) for rate in RATES}


EXAMPLES = [
    (_example(0.03, 0.002), "confirmed"),
    (_example(0.001, 0.015), "confirmed"),
    (_example(0.001, 0.002), "refuted"),
    ({"0.1": _example(0.001, 0.002)["0.1"], "0.3": _example(0.05, 0.02)["0.3"]},
     "scale-dependent"),
]
