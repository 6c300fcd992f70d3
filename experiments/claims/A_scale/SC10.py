"""SC10: with near-uniform weights each attention output is about the mean of the values, so the
outputs of all tokens nearly coincide.

Measure: per layer, the mean pairwise cosine across positions i >= 8 of the attention
sub-layer's output (``attn_out``, before the residual add; ``attnjax.models.probe.capture_streams``,
``ops.stats.mean_pairwise_cosine``) and ``norm_entropy`` (rows i >= 8, mean over heads), on 8
validation windows of the run's own data:

- (a) the S-text checkpoints (``{}``, 600 steps, seeds 0, 1; the shared default arm) evaluated
  unscaled at m = 1e-6 (``model.attention.scale=constant``, ``scale_multiplier=1e-6``: uniform
  causal attention, the running mean of the values);
- (b) SC9's runs (default, unscaled, head_dim 4, 8, 32, random bytes; 300 steps), as trained:
  Spearman's rho of (``norm_entropy``, cosine) over the (run, layer) points of each seed.

Resolved here: positions i >= 8 for the cosine as for the statistics (the conventions' rows);
(b) must reach 0.5 for each seed's 12 points.

    attnjax audit experiments/claims --workdir runs/claims --only SC10

Budget: no runs of its own (the shared default arm, 1.4 units, and SC9's runs).
"""

import functools
from pathlib import Path

import jax
import numpy as np

from attnjax.analysis.capture import probe_batch
from attnjax.audit import load_claim, over_regimes
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (S-text)
from attnjax.config import apply_overrides
from attnjax.models.probe import capture, capture_streams
from attnjax.ops import stats

SC9 = load_claim(Path(__file__).with_name("SC9.py")).module

ID = "SC10"
SOURCE = "000 §8.1"
CLAIM = ("near-uniform weights make each output ~ the mean of the values, so the outputs of all "
         "tokens nearly coincide")
CRITERION = ("(a) forced uniform (unscaled, m = 1e-6): cosine >= 0.95 in every layer; (b) "
             "Spearman(norm_entropy, cosine) >= 0.5 over (run, layer)")
FIRST_ROW, PROBE_EXAMPLES, COSINE, RHO = 8, 8, 0.95, 0.5
UNIFORM = {"model.attention.scale": "constant", "model.attention.scale_multiplier": 1e-6}


def get_sweep():
    return with_seeds([{}]) + SC9.get_sweep()


@functools.lru_cache(maxsize=16)
def _probe_fn(model):
    def probe(params, tokens):
        weights = capture(model, params, tokens)[0]
        out = capture_streams(model, params, tokens)["attn_out"][:, :, FIRST_ROW:]
        return weights, stats.mean_pairwise_cosine(out)
    return jax.jit(probe)


def layers(config, params) -> dict:
    """Per layer: mean-over-heads ``norm_entropy`` and the ``attn_out`` cosine."""
    weights, cosine = _probe_fn(config.model)(params, probe_batch(config,
                                                                  batch_size=PROBE_EXAMPLES))
    return {"norm_entropy": SC9.norm_entropy(np.asarray(weights)).mean(-1).tolist(),
            "cosine": np.asarray(cosine).tolist()}


def measure(runs):
    uniform = {}
    for seed, t in runs.by_seed({}).items():
        config, params, _ = t.dir.params("latest")
        uniform[str(seed)] = layers(apply_overrides(config, UNIFORM), params)
    trained = {name: {str(s): layers(*t.dir.params("latest")[:2])
                      for s, t in runs.by_seed(o).items()}
               for name, o in SC9.arms().items()}
    return {"uniform": uniform, "sc9": trained}


def _rho(sc9: dict, seed: str) -> float:
    pairs = [(e, c) for r in sc9.values() for e, c in zip(r[seed]["norm_entropy"],
                                                            r[seed]["cosine"])]
    return stats.spearman(*zip(*pairs))


def verdict(results):
    uniform, sc9 = results["uniform"], results["sc9"]
    seeds = list(uniform)
    a = {s: min(uniform[s]["cosine"]) >= COSINE for s in seeds}
    rho = {s: _rho(sc9, s) for s in seeds}
    fmt = lambda xs: "[" + ", ".join(f"{x:.3f}" for x in xs) + "]"
    return {
        "a": over_regimes({"S-text": a}, "forced uniform: attn_out cosine by layer " + "; ".join(
            f"seed {s} {fmt(uniform[s]['cosine'])} (norm_entropy {fmt(uniform[s]['norm_entropy'])})"
            for s in seeds)),
        "b": over_regimes({"S-text": {s: rho[s] >= RHO for s in seeds}},
                          "Spearman(norm_entropy, cosine) over SC9's (run, layer): " + ", ".join(
                              f"seed {s} {rho[s]:.3f}" for s in seeds)),
    }


def _example(cosine: float, aligned: bool) -> dict:
    layer = lambda e, c: {"norm_entropy": [e, e], "cosine": [c, c]}
    values = [(0.3, 0.2), (0.5, 0.4), (0.7, 0.6), (0.9, 0.8)]
    runs = {f"run {i}": {s: layer(e, c if aligned else 1 - c) for s in "01"}
            for i, (e, c) in enumerate(values)}
    return {"uniform": {s: layer(1.0, cosine) for s in "01"}, "sc9": runs}


EXAMPLES = [
    (_example(0.99, True), {"a": "confirmed", "b": "confirmed"}),
    (_example(0.80, False), {"a": "refuted", "b": "refuted"}),
]
