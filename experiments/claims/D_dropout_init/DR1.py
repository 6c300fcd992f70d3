"""DR1: (a) about 0.1 is the right attention-dropout rate; (b) too high a rate loses
information; (c) too low a rate overfits small data; (d) overall the effect is small.

Measure: per-head dropout on the attention probabilities
(``model.attention.dropout=probs_per_head``) at rates 0.05, 0.1, 0.2, 0.3, 0.5 and no dropout,
seeds 0 and 1, in two regimes: S-text and S-small (``data.val_fraction=0.995``, ~23 kB of
training text), **300 steps** each (cut from 600, as CLAIMS.md allows). Per run: the
validation loss at the training length (evaluated once, at the end, so the best and the final
loss coincide) and the train-val gap, ``loss(val) - loss(train)``, the training loss taken
the same way as the validation loss (dropout off, ``train.eval_batches`` batches of
``train.eval_batch_size`` windows of the training split, ``attnjax.analysis.heads``'s
evaluation).

Left open and resolved here: at each seed, the best rate is the one (no dropout counting as
0) with the lowest loss. (a) best rate in [0.05, 0.2] and (b) loss(0.5) - loss(best) > 0.05
in both regimes; (c) S-small: loss(none) - loss(best) > eps and a larger gap without dropout
than at the best rate; (d) S-text: max - min of the loss over none, 0.05, 0.1, 0.2, 0.3 <=
0.05.

Cost: 24 runs at 300 steps in 4 vmapped programs (the rates of a regime train as one), ~8
units; the S-small arms at 0.1 and 0.3 are DR3's (and with 0.5 read by HD7-HD9 too), the
S-text arm without dropout is TR3's baseline.

    attnjax audit experiments/claims --workdir runs/claims --only DR1
"""

import numpy as np

from attnjax.analysis.heads import evaluate_gates
from attnjax.audit import holds, over_regimes, over_seeds
from attnjax.audit.settings import EPS, S_SMALL, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.config import apply_overrides
from attnjax.data import load_dataset

ID = "DR1"
SOURCE = "000 §8.6"
CLAIM = ("~0.1 is the right attention-dropout rate; too high loses information, too low "
         "overfits small data; the effect is small")
CRITERION = ("(a) best rate in [0.05, 0.2]; (b) 0.5 worse than best by > 0.05; (c) S-small: "
             "none worse than best by > eps, larger gap; (d) S-text: final-loss spread over "
             "0-0.3 <= 0.05")
RATES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5)
S300 = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
REGIMES = {"S-text": {}, "S-small": S_SMALL}
WORSE, SPREAD, SMALL_RATES = 0.05, 0.05, (0.0, 0.05, 0.1, 0.2, 0.3)


def arm(regime: str, rate: float) -> dict:
    """The overrides of one arm (add ``seed``); rate 0 is no dropout."""
    if rate == 0.0:
        return {**REGIMES[regime], **S300}
    return {**REGIMES[regime], "model.attention.dropout": "probs_per_head",
            "model.attention.dropout_rate": rate, **S300}


def get_sweep():
    return with_seeds([arm(regime, rate) for regime in REGIMES for rate in RATES])


def train_loss(config, params) -> float:
    """The loss on the training split, dropout off, as the validation loss is taken."""
    dataset = load_dataset(config.data)
    batches = [dataset.batch(config.seed, i, config.train.eval_batch_size, config.data.length,
                             "train") for i in range(config.train.eval_batches)]
    gates = np.ones((config.model.num_layers, config.model.attention.num_heads))
    # dropout is off in evaluation, so this config (one compiled program for every rate and
    # seed of a regime) computes the same function
    plain = apply_overrides(config, {"model.attention.dropout": "none",
                                     "model.attention.dropout_rate": 0.0, "seed": 0})
    return evaluate_gates(plain, params, gates, batches)["loss"]


def measure(runs) -> dict:
    out = {}
    for regime in REGIMES:
        for rate in RATES:
            for seed, trained in runs.by_seed(arm(regime, rate)).items():
                config, params, _ = trained.dir.params("latest")
                loss = trained.loss()
                out.setdefault(regime, {}).setdefault(str(seed), {})[str(rate)] = {
                    "loss": loss, "gap": loss - train_loss(config, params)}
    return out


def _best(by_rate: dict) -> str:
    return min(by_rate, key=lambda rate: by_rate[rate]["loss"])


def _show(r, regime: str) -> str:
    return "; ".join(f"{regime} seed {s}: " + ", ".join(
        f"{float(rate):g} {x['loss']:.4f}" for rate, x in by_rate.items())
        + f" (best {float(_best(by_rate)):g})" for s, by_rate in r[regime].items())


def verdict(r):
    best = {regime: {s: _best(by_rate) for s, by_rate in seeds.items()}
            for regime, seeds in r.items()}
    a = over_regimes({regime: {s: 0.05 <= float(b) <= 0.2 for s, b in seeds.items()}
                      for regime, seeds in best.items()},
                     "loss by rate: " + "; ".join(_show(r, regime) for regime in r))
    b = over_regimes(
        {regime: {s: r[regime][s]["0.5"]["loss"] - r[regime][s][b]["loss"] > WORSE
                  for s, b in seeds.items()} for regime, seeds in best.items()},
        "loss(0.5) - loss(best): " + "; ".join(
            f"{regime} seed {s} {r[regime][s]['0.5']['loss'] - r[regime][s][b]['loss']:+.4f}"
            for regime, seeds in best.items() for s, b in seeds.items()))
    small = r["S-small"]
    c_ok, c_note = over_seeds({
        s: small[s]["0.0"]["loss"] - small[s][b]["loss"] > EPS
        and small[s]["0.0"]["gap"] > small[s][b]["gap"] for s, b in best["S-small"].items()})
    c = holds(c_ok, "; ".join(filter(None, [
        "S-small: " + "; ".join(
            f"seed {s}: loss(none) - loss(best {float(b):g}) "
            f"{small[s]['0.0']['loss'] - small[s][b]['loss']:+.4f}, gap none "
            f"{small[s]['0.0']['gap']:.4f} vs best {small[s][b]['gap']:.4f}"
            for s, b in best["S-small"].items()), c_note])))
    text = r["S-text"]
    spread = {s: max(by_rate[str(x)]["loss"] for x in SMALL_RATES)
              - min(by_rate[str(x)]["loss"] for x in SMALL_RATES) for s, by_rate in text.items()}
    d_ok, d_note = over_seeds({s: v <= SPREAD for s, v in spread.items()})
    d = holds(d_ok, "; ".join(filter(None, [
        "S-text loss spread over rates 0-0.3: " + ", ".join(
            f"seed {s} {v:.4f}" for s, v in spread.items()), d_note])))
    return {"a": a, "b": b, "c": c, "d": d}


def plot(r, out_dir):
    from attnjax.analysis.figures import subplots
    fig, axes = subplots(1, len(r), figsize=(4.4 * len(r), 3.4), layout="constrained",
                         squeeze=False)
    for ax, (regime, seeds) in zip(axes[0], r.items()):
        for i, (s, by_rate) in enumerate(seeds.items()):
            rates = [float(x) for x in by_rate]
            ax.plot(rates, [x["loss"] for x in by_rate.values()], "o-", color=f"C{i}",
                    label=f"seed {s} validation")
            ax.plot(rates, [x["loss"] - x["gap"] for x in by_rate.values()], "x:",
                    color=f"C{i}", label=f"seed {s} train")
        ax.axvspan(0.05, 0.2, color="0.9", zorder=0)
        ax.set(xlabel="per-head attention dropout rate (0: none)", ylabel="loss (nats/byte)",
               title=regime)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("DR1: loss after 300 steps by dropout rate (shaded: 0.05-0.2)", fontsize=10)
    path = out_dir / "DR1-loss-by-rate.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(losses: dict, gaps: dict | None = None) -> dict:
    """``losses``: regime -> loss per rate in RATES order (the same at both seeds)."""
    gaps = gaps or {}
    return {regime: {s: {str(rate): {"loss": loss, "gap": gaps.get(regime, {}).get(rate, 0.1)}
                         for rate, loss in zip(RATES, values)} for s in "01"}
            for regime, values in losses.items()}


EXAMPLES = [
    (_example({"S-text": [2.40, 2.39, 2.38, 2.39, 2.40, 2.45],
               "S-small": [2.60, 2.55, 2.50, 2.52, 2.54, 2.60]},
              gaps={"S-small": {0.0: 0.5, 0.1: 0.2}}),
     {"a": "confirmed", "b": "confirmed", "c": "confirmed", "d": "confirmed"}),
    (_example({"S-text": [2.30, 2.35, 2.38, 2.39, 2.45, 2.50],
               "S-small": [2.60, 2.55, 2.50, 2.52, 2.54, 2.60]}),
     {"a": "scale-dependent", "b": "confirmed", "c": "refuted", "d": "refuted"}),
    (_example({"S-text": [2.30, 2.31, 2.32, 2.33, 2.33, 2.34],
               "S-small": [2.50, 2.51, 2.52, 2.52, 2.53, 2.53]}),
     {"a": "refuted", "b": "refuted", "c": "refuted", "d": "confirmed"}),
]
