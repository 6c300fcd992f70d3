"""XA2: INT8 quantisation collapses self-attention layers while cross-attention layers stay
stable.

Measure: the S-s2s runs (``attnjax.audit.settings.S_S2S``), seeds 0 and 1, best checkpoints,
200 held-out sources (``s2s_held_out``): exact match of greedy decoding (``attnjax.translate.
exact_matches``) of the float model, and with the q, k, v and o projections of (i) every
self-attention layer, encoder's and decoder's (``model.attention.int8``, ``model.cross_int8=
none``), (ii) every cross-attention layer (``model.attention.int8=none``, ``model.cross_int8``)
in simulated symmetric int8 (``attnjax.ops.quantize``: each weight's output channel rounded to
255 levels, computed in float32). Regimes: ``weights`` only; ``weights_inputs`` (also each
projection's input activations, one scale per example and call: greedy decoding quantises
each step's inputs). drop = exact match of the float model minus
that of the quantised one.

Criterion (per regime and seed): drop(i) - drop(ii) >= 0.05 and drop(ii) <= 0.01.

Cost: no runs of its own (the S-s2s runs are shared with XA1, XA3 and CX9).

    attnjax audit experiments/claims --workdir runs/claims --only XA2
"""

from attnjax.audit import over_regimes
from attnjax.audit.settings import S_S2S, s2s_held_out, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.config import apply_overrides
from attnjax.translate import exact_matches

ID = "XA2"
SOURCE = "002 §2.2"
CLAIM = "INT8 quantisation collapses self-attention layers while cross-attention stays stable"
CRITERION = ("per regime (weights; weights and inputs): exact-match drop(self int8) - "
             "drop(cross int8) >= 0.05 and drop(cross int8) <= 0.01")
GAP, STABLE = 0.05, 0.01
REGIMES = ("weights", "weights_inputs")
KINDS = {"self": lambda mode: {"model.attention.int8": mode, "model.cross_int8": "none"},
         "cross": lambda mode: {"model.attention.int8": "none", "model.cross_int8": mode}}


def get_sweep():
    return with_seeds([S_S2S])


def exact_match(config, params, held, overrides=None) -> float:
    """Greedy exact match on ``held`` of the model with ``overrides`` (the int8 settings)."""
    return float(exact_matches(apply_overrides(config, overrides or {}), params, held).mean())


def measure(runs) -> dict:
    out = {}
    for seed, trained in runs.by_seed(S_S2S).items():
        config, params, _ = trained.dir.params("best")
        held = s2s_held_out(config)
        out[str(seed)] = {"float": exact_match(config, params, held), **{
            f"{kind}_{mode}": exact_match(config, params, held, overrides(mode))
            for kind, overrides in KINDS.items() for mode in REGIMES}}
    return {"seeds": out}


def verdict(r):
    seeds = r["seeds"]
    drop = lambda x, kind, mode: x["float"] - x[f"{kind}_{mode}"]
    holding = {mode: {s: drop(x, "self", mode) - drop(x, "cross", mode) >= GAP
                      and drop(x, "cross", mode) <= STABLE for s, x in seeds.items()}
               for mode in REGIMES}
    text = "; ".join(
        f"seed {s}: float {x['float']:.3f}; " + ", ".join(
            f"{mode}: self int8 {x[f'self_{mode}']:.3f} (drop {drop(x, 'self', mode):.3f}), "
            f"cross int8 {x[f'cross_{mode}']:.3f} (drop {drop(x, 'cross', mode):.3f})"
            for mode in REGIMES) for s, x in seeds.items())
    return over_regimes(holding, text)


def _example(self_drop, cross_drop):
    run = {"float": 0.98, **{f"self_{m}": 0.98 - self_drop for m in REGIMES},
           **{f"cross_{m}": 0.98 - cross_drop for m in REGIMES}}
    return {"seeds": {"0": run, "1": run}}


EXAMPLES = [
    (_example(0.40, 0.0), "confirmed"),
    (_example(0.01, 0.0), "refuted"),
    (_example(0.40, 0.05), "refuted"),
]
