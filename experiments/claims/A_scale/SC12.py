"""SC12: attention scores in the hundreds early in training point to an initialisation or
scale problem.

Measure: ``max_attn_logit`` (the largest causal logit over layers and heads, as training logs
it, before soft-capping) at step 0 (the initial parameters on the first 4 examples of training
batch 0, as the training loop's diagnostics read them) and at every logged step up to 100
(every 10 steps) of 300-step S-text runs (the shared arms of SC3, SC5, SC8): default at lr
3e-3 and 1e-2; unscaled (``model.attention.scale=constant``); m = 4; embedding x sqrt(d)
(``model.embed_scale=8``, post-norm: SC8's run); W_q, W_k initialised x 10 (``q_init=k_init=
normal`` with std 1.25, ten times the default LeCun std 1/sqrt(64)). Seeds 0, 1.

The criterion's second clause ("every run that reaches 100 has a scale or init change") holds
by construction whenever the first does, since every run but the two defaults changes the scale
or the initialisation; the evidence names the runs that reached 100.

    attnjax audit experiments/claims --workdir runs/claims --only SC12

Budget: ~0.9 units (the W_q, W_k x 10 program; m = 4 is a lane of the shared program).
"""

from pathlib import Path

import jax
import numpy as np

from attnjax.audit import holds, load_claim, over_seeds
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (S-text)
from attnjax.data import load_dataset
from attnjax.train.loop import DIAGNOSTIC_EXAMPLES
from attnjax.train.state import init_params
from attnjax.train.step import make_diagnostics

SC3 = load_claim(Path(__file__).with_name("SC3.py")).module

ID = "SC12"
SOURCE = "000 §8.2"
CLAIM = "attention scores in the hundreds early in training point to an init or scale problem"
CRITERION = ("no default scale/init run (any lr) reaches 100 in steps 0-100; every run that does "
             "has a scale or init change")
LIMIT, LAST_STEP = 100.0, 100
INIT_X10 = {"model.attention.q_init": "normal", "model.attention.q_init_scale": 1.25,
            "model.attention.k_init": "normal", "model.attention.k_init_scale": 1.25}
ARMS = {
    "default lr 3e-3": {},
    "default lr 1e-2": {"train.learning_rate": 0.01},
    "unscaled": {"model.attention.scale": "constant"},
    "m = 4": {"model.attention.scale_multiplier": 4.0},
    "embedding x sqrt(d), post-norm": {"model.embed_scale": 8.0, "model.norm_position": "post"},
    "W_q, W_k init x 10": INIT_X10,
}
DEFAULTS = ("default lr 3e-3", "default lr 1e-2")


def get_sweep():
    return with_seeds([{**SC3.STEPS, **overrides} for overrides in ARMS.values()])


_DIAGNOSTICS = {}


def step0_logit(trained) -> float:
    """``max_attn_logit`` of the initial parameters on training batch 0, as logged."""
    config = trained.config
    if config.model not in _DIAGNOSTICS:
        _DIAGNOSTICS[config.model] = jax.jit(make_diagnostics(config))
    batch = load_dataset(config.data).batch(config.seed, 0, config.train.batch_size,
                                            config.data.length, "train")
    batch = {k: v[:DIAGNOSTIC_EXAMPLES] for k, v in batch.items()}
    return float(_DIAGNOSTICS[config.model](init_params(config), batch)["max_attn_logit"])


def early_max(trained) -> float:
    logged = [r["max_attn_logit"] for r in trained.dir.metrics() if r["step"] <= LAST_STEP]
    return float(np.nanmax([step0_logit(trained)] + logged))


def measure(runs):
    return {name: {str(s): early_max(t) for s, t in runs.by_seed({**SC3.STEPS, **o}).items()}
            for name, o in ARMS.items()}


def verdict(results):
    seeds = next(iter(results.values()))
    holding = {}
    for s in seeds:
        reached = [name for name, r in results.items() if r[s] >= LIMIT]
        holding[int(s)] = all(name not in DEFAULTS for name in reached)
    ok, note = over_seeds(holding)
    cells = "; ".join(f"{name} {'/'.join(f'{v:.1f}' for v in r.values())}"
                      for name, r in results.items())
    reached = sorted({name for name, r in results.items() for v in r.values() if v >= LIMIT})
    return holds(ok, f"max_attn_logit steps 0-{LAST_STEP} (seed 0/1): {cells}; reached "
                     f"{LIMIT:g}: {', '.join(reached) or 'none'}" + (f"; {note}" if note else ""))


def _example(default: float, init: float) -> dict:
    out = {name: {"0": 3.0, "1": 3.0} for name in ARMS}
    out["default lr 1e-2"] = {"0": default, "1": 3.0}
    out["W_q, W_k init x 10"] = {"0": init, "1": init}
    return out


EXAMPLES = [(_example(8.0, 400.0), "confirmed"), (_example(150.0, 400.0), "refuted")]
