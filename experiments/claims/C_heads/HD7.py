"""HD7: the per-head means ``attn_weights.mean(dim=(0, 2, 3))`` can read ~0.8 for four heads and
~0.05 for the rest (a model that uses only some of its heads).

Measure: the runs of HD1 and HD4 (S-wide, 1 and 8 heads, 300 steps) and of HD9 (S-small,
shared and per-head probability dropout at 0.1, 0.3, 0.5, 300 steps), seeds 0 and 1, best
checkpoints. On the first 16 validation sequences of 64 bytes, each head's mean of its
weights ``[B, T, T]`` over examples, queries and keys (the article's reduction; the weights of
``analysis.capture.attention_weights``), before dropout and, in training mode, after it:
``keep * p / (1 - rate)`` with the mask attnjax's kernel draws (``ops.attention.dropout_keep``,
the run's rate and placement; rng ``fold_in(key(seed), layer)``). Runs without dropout have
one value. 1/T = 1/64 beside it: a causal row sums to 1, so before dropout every head's mean
is exactly T / T^2 = 1/T.

Left open and resolved here: the criterion is applied per seed over all of that seed's runs
and layers, before and after dropout; a one-head layer has no "other" head.

Cost: no runs of its own.

    attnjax audit experiments/claims --workdir runs/claims --only HD7
"""

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.capture import attention_weights, probe_batch
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import S_SMALL, S_WIDE, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.ops.attention import Dropout, dropout_keep

ID = "HD7"
SOURCE = "002 §5.3"
CLAIM = "per-head means attn_weights.mean(dim=(0,2,3)) can read ~0.8 for four heads, ~0.05 rest"
CRITERION = "some layer has one head mean >= 0.5 and another <= 0.1"
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
ARMS = {f"S-wide {n} head{'s' * (n > 1)}": {**S_WIDE, "model.attention.num_heads": n, **STEPS}
        for n in (1, 8)}
ARMS.update({f"S-small {placement} {rate}": {
    **S_SMALL, "model.attention.dropout": placement, "model.attention.dropout_rate": rate,
    **STEPS} for placement in ("probs_shared", "probs_per_head") for rate in (0.1, 0.3, 0.5)})
PROBES, HIGH, LOW = 16, 0.5, 0.1


def get_sweep():
    return with_seeds(list(ARMS.values()))


def dropped(weights: np.ndarray, rate: float, shared: bool, seed: int) -> np.ndarray:
    """``weights`` ``[layers, B, heads, T, T]`` after inverted dropout with the kernel's mask."""
    L, B, N, T, _ = weights.shape
    out = []
    for layer in range(L):
        mask = Dropout(rate, jax.random.fold_in(jax.random.key(seed), layer), shared)
        keep = dropout_keep(mask, jnp.arange(B)[:, None, None, None],
                            jnp.arange(N)[None, :, None, None], jnp.arange(T)[:, None],
                            jnp.arange(T))
        out.append(np.where(np.asarray(keep), weights[layer] / (1 - rate), 0.0))
    return np.stack(out)


def measure(runs) -> dict:
    out = {}
    for name, overrides in ARMS.items():
        for seed, trained in runs.by_seed(overrides).items():
            config, params, _ = trained.dir.params("best")
            tokens = probe_batch(config, batch_size=PROBES)
            weights = attention_weights(config, params, tokens).astype(np.float64)
            att = config.model.attention
            means = {"before": weights.mean(axis=(1, 3, 4)).tolist()}          # [layers, heads]
            if att.dropout != "none":
                after = dropped(weights, att.dropout_rate, att.dropout == "probs_shared", seed)
                means["after"] = after.mean(axis=(1, 3, 4)).tolist()
            out.setdefault(str(seed), {})[name] = {"means": means,
                                                   "inverse_t": 1 / tokens.shape[1]}
    return out


def _uneven(layers) -> bool:
    return any(len(heads) > 1 and max(heads) >= HIGH and min(heads) <= LOW for heads in layers)


def verdict(r):
    holding, text = {}, []
    for seed, by_run in r.items():
        tables = [m for run in by_run.values() for m in run["means"].values()]
        holding[seed] = any(_uneven(m) for m in tables)
        values = [x for m in tables for heads in m for x in heads]
        inverse = next(iter(by_run.values()))["inverse_t"]
        exact = max(abs(x - inverse) for run in by_run.values()
                    for heads in run["means"]["before"] for x in heads)
        text.append(f"seed {seed}: {len(by_run)} runs, head means in [{min(values):.4f}, "
                    f"{max(values):.4f}] (1/T = {inverse:.4f}; before dropout max |mean - 1/T| "
                    f"= {exact:.1e})")
    ok, note = over_seeds(holding)
    return holds(ok, "; ".join(filter(None, ["; ".join(text), note])))


def _example(high, low):
    run = {"means": {"before": [[1 / 64] * 8], "after": [[high, low] + [1 / 64] * 6]},
           "inverse_t": 1 / 64}
    return {s: {"S-small probs_shared 0.5": run} for s in "01"}


EXAMPLES = [
    (_example(0.8, 0.05), "confirmed"),
    (_example(0.02, 0.01), "refuted"),
]
