"""SC9: near-uniform attention comes from (a) a missing scale or else (b) a d_k too small to
separate the scores; (c) on uninformative data averaging is simply the optimum.

Measure: S-text at 300 steps (SC3's 300-step arm), seeds 0, 1: after training, ``norm_entropy``
(row i's entropy / log(i + 1), rows i >= 8) averaged over every layer, head and example of 8
validation windows of the run's own data, for (a) unscaled (``model.attention.scale=constant``:
SC3's run), (b) head_dim 4, 8, 32 at 4 heads (``model.attention.head_dim``; 16 is the default),
(c) i.i.d. uniform random bytes (``data.task=uniform``, 256 tokens: the best model is
uniform, loss ln 256), each against the default.

    attnjax audit experiments/claims --workdir runs/claims --only SC9

Budget: 4 new arms at 300 steps (seeds 0, 1).
"""

import functools
from pathlib import Path

import jax
import numpy as np

from attnjax.analysis.capture import probe_batch
from attnjax.audit import load_claim, over_regimes
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (S-text)
from attnjax.models.probe import capture
from attnjax.ops import stats

SC3 = load_claim(Path(__file__).with_name("SC3.py")).module

ID = "SC9"
SOURCE = "000 §8.1"
CLAIM = ("near-uniform attention comes from (a) a missing scale, else (b) a d_k too small; (c) "
         "on uninformative data averaging is optimal")
CRITERION = ("(a), (c) norm_entropy >= default + 0.1; (b) rises as head_dim falls, head_dim 4 >= "
             "default + 0.1")
FIRST_ROW, MARGIN, PROBE_EXAMPLES = 8, 0.1, 8
HEAD_DIMS = (4, 8, 16, 32)          # 16: the default (head_dim unset)


def arms() -> dict[str, dict]:
    """name -> overrides."""
    out = {"default": {}, "unscaled": {"model.attention.scale": "constant"}}
    out.update({f"head_dim {h}": {"model.attention.head_dim": h} for h in HEAD_DIMS if h != 16})
    out["random"] = {"data.task": "uniform", "data.vocab_size": 256, "model.vocab_size": 256}
    return {name: {**SC3.STEPS, **o} for name, o in out.items()}


def get_sweep():
    return with_seeds(list(arms().values()))


@functools.lru_cache(maxsize=16)
def _weights_fn(model):
    return jax.jit(lambda params, tokens: capture(model, params, tokens)[0])


def norm_entropy(weights) -> np.ndarray:
    """``[layers, heads]``: mean over examples and rows i >= 8 of H_i / log(i + 1)."""
    rows = np.arange(FIRST_ROW, weights.shape[-1])
    h = np.asarray(stats.row_entropy(weights[..., FIRST_ROW:, :])) / np.log(rows + 1)
    return h.mean(axis=(1, 3))


def layer_entropies(trained) -> list[float]:
    """Per layer, ``norm_entropy`` averaged over its heads (the checkpoint at the end)."""
    config, params, _ = trained.dir.params("latest")
    weights = _weights_fn(config.model)(params, probe_batch(config, batch_size=PROBE_EXAMPLES))
    return norm_entropy(np.asarray(weights)).mean(-1).tolist()


def measure(runs):
    out = {name: {str(s): layer_entropies(t) for s, t in runs.by_seed(o).items()}
           for name, o in arms().items()}
    return {"norm_entropy": {name: {s: float(np.mean(v)) for s, v in r.items()}
                             for name, r in out.items()},
            "by_layer": out}


def verdict(results):
    r = results["norm_entropy"]
    seeds = list(r["default"])
    above = lambda name, s: r[name][s] >= r["default"][s] + MARGIN
    by_dim = lambda s: [r["default" if h == 16 else f"head_dim {h}"][s] for h in HEAD_DIMS]
    rising = lambda s: all(x > y for x, y in zip(by_dim(s), by_dim(s)[1:]))
    cell = lambda name: "/".join(f"{v:.3f}" for v in r[name].values())
    dims = ", ".join(f"{h}: {'/'.join(f'{v:.3f}' for v in vals)}" for h, vals in zip(
        HEAD_DIMS, zip(*(by_dim(s) for s in seeds))))
    return {
        "a": over_regimes({"S-text": {s: above("unscaled", s) for s in seeds}},
                          f"norm_entropy (seed 0/1) unscaled {cell('unscaled')} vs default "
                          f"{cell('default')}"),
        "b": over_regimes({"S-text": {s: rising(s) and above("head_dim 4", s) for s in seeds}},
                          f"norm_entropy by head_dim {dims}"),
        "c": over_regimes({"S-text": {s: above("random", s) for s in seeds}},
                          f"norm_entropy random bytes {cell('random')} vs default "
                          f"{cell('default')}"),
    }


def _example(gap: float) -> dict:
    values = {"default": 0.50, "unscaled": 0.50 + gap, "head_dim 4": 0.50 + gap,
              "head_dim 8": 0.50 + gap / 2, "head_dim 32": 0.50 - gap / 4, "random": 0.50 + gap}
    return {"norm_entropy": {name: {"0": v, "1": v} for name, v in values.items()},
            "by_layer": {}}


EXAMPLES = [
    (_example(0.2), {"a": "confirmed", "b": "confirmed", "c": "confirmed"}),
    (_example(0.05), {"a": "refuted", "b": "refuted", "c": "refuted"}),
]
