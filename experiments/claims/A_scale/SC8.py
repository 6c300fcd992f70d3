"""SC8: saturated attention rows (one weight near 1) come from oversized softmax inputs: (a)
token embeddings not divided by sqrt(d), (b) 1/d_k in place of 1/sqrt(d_k), (c) a padding mask
used in place of the causal mask.

Measure: S-text at 300 steps (SC3's 300-step arm), seeds 0, 1; after training, the fraction of
saturated rows (max weight > 0.99) over rows i >= 8 of every layer, head and example of 8
validation windows of the run's own data (unpadded windows for the padded runs, so every row
is a real token):

- (a) embeddings x sqrt(d) (``model.embed_scale=8``) and N(0, 1) initialisation
  (``model.embed_init_std=1``), each against the default of its regime, pre-norm (the default)
  and post-norm (``model.norm_position=post``);
- (b) ``model.attention.scale=inv_d`` against the default;
- (c) padded batches (``data.padding=right``, real lengths uniform in [1, 64]) with the padding
  mask in place of the causal one (``model.attention.causal=false``, key-padding mask on)
  against padded batches with both masks.

Resolved here: (a)'s cause is "not divided by sqrt(d)", so its causes are x sqrt(d) and the
N(0, 1) init; CLAIMS.md's third setting, x 1/sqrt(d), is the remedy (dividing), would decide
nothing and is not run (budget). (a) holds in a regime for a seed when either cause exceeds
that regime's default by >= 0.2.

    attnjax audit experiments/claims --workdir runs/claims --only SC8

Budget: 7 new programs of 2 lanes (seeds) at 300 steps, ~6 units.
"""

import functools
from pathlib import Path

import jax
import numpy as np

from attnjax.analysis.capture import probe_batch
from attnjax.audit import load_claim, over_regimes
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (S-text)
from attnjax.config import apply_overrides
from attnjax.models.probe import capture

SC3 = load_claim(Path(__file__).with_name("SC3.py")).module

ID = "SC8"
SOURCE = "002 §5.1"
CLAIM = ("saturated rows come from oversized softmax inputs: (a) embeddings not divided by "
         "sqrt(d), (b) 1/d_k for 1/sqrt(d_k), (c) a padding mask used as causal")
CRITERION = "a cause's fraction exceeds the default's by >= 0.2"
FIRST_ROW, SATURATED, MARGIN, PROBE_EXAMPLES = 8, 0.99, 0.2, 8
NORMS = {"pre": {}, "post": {"model.norm_position": "post"}}
EMBEDDINGS = {"x sqrt(d)": {"model.embed_scale": 8.0}, "init std 1": {"model.embed_init_std": 1.0}}
INV_D = {"model.attention.scale": "inv_d"}
PADDED = {"data.padding": "right"}
PADDING_AS_CAUSAL = {"data.padding": "right", "model.attention.causal": False}


def arms() -> dict[str, dict]:
    out = {}
    for norm, base in NORMS.items():
        out[f"{norm}: default"] = base
        out.update({f"{norm}: {name}": {**base, **o} for name, o in EMBEDDINGS.items()})
    out.update({"inv_d": INV_D, "padded": PADDED, "padding as causal": PADDING_AS_CAUSAL})
    return {name: {**SC3.STEPS, **o} for name, o in out.items()}


def get_sweep():
    return with_seeds(list(arms().values()))


@functools.lru_cache(maxsize=16)
def _weights_fn(model):
    return jax.jit(lambda params, tokens: capture(model, params, tokens)[0])


def saturated_fraction(trained) -> float:
    """Fraction of rows i >= 8 (all layers, heads, examples) whose max weight is > 0.99."""
    config, params, _ = trained.dir.params("latest")
    probe = apply_overrides(config, {"data.padding": "none"}) if config.data.padding != "none" \
        else config
    weights = _weights_fn(config.model)(params, probe_batch(probe, batch_size=PROBE_EXAMPLES))
    rows = np.asarray(weights)[..., FIRST_ROW:, :]
    return float(np.mean(rows.max(-1) > SATURATED))


def measure(runs):
    return {name: {str(s): saturated_fraction(t) for s, t in runs.by_seed(o).items()}
            for name, o in arms().items()}


def verdict(results):
    cell = lambda name: "/".join(f"{v:.3f}" for v in results[name].values())
    seeds = list(results["pre: default"])
    exceeds = lambda name, base, s: results[name][s] - results[base][s] >= MARGIN
    a = {norm: {s: any(exceeds(f"{norm}: {c}", f"{norm}: default", s) for c in EMBEDDINGS)
                for s in seeds} for norm in NORMS}
    ev_a = "; ".join(f"{norm}: default {cell(f'{norm}: default')}, " + ", ".join(
        f"{name} {cell(f'{norm}: {name}')}" for name in EMBEDDINGS) for norm in NORMS)
    b = {"inv_d": {s: exceeds("inv_d", "pre: default", s) for s in seeds}}
    c = {"padded": {s: exceeds("padding as causal", "padded", s) for s in seeds}}
    return {"a": over_regimes(a, f"saturated-row fraction (seed 0/1) {ev_a}"),
            "b": over_regimes(b, f"inv_d {cell('inv_d')} vs default {cell('pre: default')}"),
            "c": over_regimes(c, f"padding mask as causal {cell('padding as causal')} vs "
                                 f"padded default {cell('padded')}")}


def _example(cause: float) -> dict:
    out = {name: {"0": 0.05, "1": 0.05} for name in arms()}
    for name in ("pre: x sqrt(d)", "post: init std 1", "inv_d", "padding as causal"):
        out[name] = {"0": cause, "1": cause}
    return out


EXAMPLES = [
    (_example(0.40), {"a": "confirmed", "b": "confirmed", "c": "confirmed"}),
    (_example(0.10), {"a": "refuted", "b": "refuted", "c": "refuted"}),
]
