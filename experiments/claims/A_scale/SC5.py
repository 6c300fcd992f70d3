"""SC5: dividing the logits by 0.5 sqrt(d_k) (doubling them, m = 2) tends to destabilise
training.

Measure: S-text at 300 steps (SC3's 300-step arm) with ``model.attention.scale_multiplier``
m = 1 and m = 2, regimes lr 3e-3 and 1e-2, seeds 0, 1: all eight runs differ only in values
(seed, lr, m) and train as lanes of the shared 300-step program. Per run: spikes, skipped
updates, divergence (CLAIMS.md's, ``attnjax.audit.dynamics``), the largest logged
``max_attn_logit`` and the standard deviation of the step-to-step change of the logged
training loss after the warmup (the same pairs the spike count reads).

Not run: the S-wide regime of CLAIMS.md (8 S-wide lanes cost ~15-25 units, beyond group A's
share); the verdict's regimes are S-text lr 3e-3 and 1e-2 only.

    attnjax audit experiments/claims --workdir runs/claims --only SC5

Budget: ~0.8 units (four lanes added to the shared 300-step program).
"""

from pathlib import Path

import numpy as np

from attnjax.audit import dynamics, load_claim, over_regimes
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (S-text)

SC3 = load_claim(Path(__file__).with_name("SC3.py")).module

ID = "SC5"
SOURCE = "000 §3.3"
CLAIM = "dividing by 0.5 sqrt(d_k) (logits doubled) tends to destabilise training"
CRITERION = "m = 2 diverges, has >= 3 more spikes, or a change std >= 1.5x m = 1's"
MULTIPLIERS = {1: {}, 2: {"model.attention.scale_multiplier": 2.0}}
MORE_SPIKES, STD_RATIO = 3, 1.5


def arm(lr: float, m: int) -> dict:
    return {**SC3.STEPS, **SC3.LRS[lr], **MULTIPLIERS[m]}


def get_sweep():
    return with_seeds([arm(lr, m) for lr in SC3.LRS for m in MULTIPLIERS])


def describe(trained) -> dict:
    finished = trained.dir.summary() is not None
    logits = [r["max_attn_logit"] for r in trained.dir.metrics()]
    return {"diverged": dynamics.diverged(trained),
            "spikes": dynamics.spikes(trained) if finished else None,
            "skipped": trained.summary["skipped_updates"] if finished else None,
            "max_attn_logit": float(np.max(logits)) if logits else None,
            "change_std": float(np.std(dynamics.loss_changes(trained))) if finished else None}


def measure(runs):
    return {f"lr {lr:g}": {str(m): {str(s): describe(t)
                                    for s, t in runs.by_seed(arm(lr, m)).items()}
                           for m in MULTIPLIERS}
            for lr in SC3.LRS}


def _unstable(doubled: dict, plain: dict) -> bool:
    return (doubled["diverged"] is not None
            or doubled["spikes"] - plain["spikes"] >= MORE_SPIKES
            or doubled["change_std"] >= STD_RATIO * plain["change_std"])


def verdict(results):
    holding, evidence = {}, []
    for name, r in results.items():
        holding[name] = {s: _unstable(r["2"][s], r["1"][s]) for s in r["2"]}
        cell = lambda m, key, spec, r=r: dynamics.seeds_text(r[m], key, spec)
        div = {m: sum(x["diverged"] is not None for x in r[m].values()) for m in ("1", "2")}
        evidence.append(
            f"{name}: m=2 vs m=1 spikes {cell('2', 'spikes', 'd')} vs {cell('1', 'spikes', 'd')}, "
            f"change std {cell('2', 'change_std', '.3f')} vs {cell('1', 'change_std', '.3f')}, "
            f"skips {cell('2', 'skipped', 'd')} vs {cell('1', 'skipped', 'd')}, max logit "
            f"{cell('2', 'max_attn_logit', '.1f')} vs {cell('1', 'max_attn_logit', '.1f')}, "
            f"diverged {div['2']} vs {div['1']}")
    return over_regimes(holding, "; ".join(evidence))


def _example(doubled_std: float, doubled_spikes: int = 0) -> dict:
    run = lambda std, spikes: {"diverged": None, "spikes": spikes, "skipped": 0,
                               "max_attn_logit": 5.0, "change_std": std}
    per_lr = {"1": {"0": run(0.05, 0), "1": run(0.05, 0)},
              "2": {"0": run(doubled_std, doubled_spikes), "1": run(doubled_std, doubled_spikes)}}
    return {"lr 0.003": per_lr, "lr 0.01": per_lr}


EXAMPLES = [
    (_example(0.09), "confirmed"),
    (_example(0.05, doubled_spikes=4), "confirmed"),
    (_example(0.06), "refuted"),
]
