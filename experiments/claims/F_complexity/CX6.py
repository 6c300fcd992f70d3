"""CX6: multi-query and grouped-query attention shrink the KV cache a lot while keeping the
model's quality where possible.

Measure: S-wide (width 128, 4 layers) with 8 query heads (head_dim 16) and
``model.attention.num_kv_heads`` = 8 (MHA: HD1's 8-head arm), 2 (GQA) and 1 (MQA), seeds 0 and
1, **300 steps** (cut for the budget). (a) The bytes of the key and value buffers of the KV
cache ``attnjax.generate.empty_cache`` builds for one sequence (``model.max_length`` = 64
slots per layer; the per-layer write index and the position counter, a few int32 scalars,
reported apart); (b) validation loss at L = 64.

Left open and resolved here: (b) "within 0.05 of MHA" is read as not worse than MHA by more
than 0.05 (loss(kv) <= loss(MHA) + 0.05), for every variant and seed.

Cost (unit: one S-text arm, both seeds, 600 steps): the GQA and MQA arms ~4 units each (the
MHA arm is HD1's).

    attnjax audit experiments/claims --workdir runs/claims --only CX6
"""

import jax

from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import S_WIDE, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.generate import empty_cache

ID = "CX6"
SOURCE = "000 §6.3"
CLAIM = "MQA/GQA greatly shrink the KV cache while keeping quality where possible"
CRITERION = ("(a) bytes scale exactly as kv/query heads; (b) per variant, loss within 0.05 of "
             "MHA")
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
WIDE8 = {**S_WIDE, "model.attention.num_heads": 8, **STEPS}
ARMS = {8: WIDE8, 2: {**WIDE8, "model.attention.num_kv_heads": 2},
        1: {**WIDE8, "model.attention.num_kv_heads": 1}}
QUERY_HEADS, QUALITY = 8, 0.05


def get_sweep():
    return with_seeds(list(ARMS.values()))


def cache_bytes(config) -> dict:
    """Bytes of the cache's ``key``/``value`` buffers and of everything else in it."""
    out = {"kv": 0, "other": 0}
    for path, leaf in jax.tree_util.tree_leaves_with_path(empty_cache(config)):
        name = str(getattr(path[-1], "key", path[-1]))
        out["kv" if name in ("key", "value") else "other"] += leaf.size * leaf.dtype.itemsize
    return out


def measure(runs) -> dict:
    out = {}
    for kv, overrides in ARMS.items():
        trained = runs.by_seed(overrides)
        config = next(iter(trained.values())).config
        out[str(kv)] = {"bytes": cache_bytes(config),
                        "loss": {str(s): t.loss() for s, t in trained.items()},
                        "failed": {str(s): t.failed for s, t in trained.items()}}
    return out


def verdict(r):
    mha = r[str(QUERY_HEADS)]
    exact = {kv: x["bytes"]["kv"] * QUERY_HEADS == mha["bytes"]["kv"] * int(kv)
             for kv, x in r.items()}
    sizes = ", ".join(f"kv={kv}: {x['bytes']['kv']:,} ({x['bytes']['kv'] / mha['bytes']['kv']:.4g}"
                      f" of MHA, expected {int(kv) / QUERY_HEADS:.4g})" for kv, x in r.items())
    a = holds(all(exact.values()), f"KV cache bytes (one sequence, 64 slots): {sizes}; "
              f"index/position scalars {mha['bytes']['other']} B")
    variants = [kv for kv in r if kv != str(QUERY_HEADS)]
    ok, note = over_seeds({s: all(r[kv]["loss"][s] <= mha["loss"][s] + QUALITY
                                  for kv in variants) for s in mha["loss"]})
    losses = ", ".join(f"kv={kv} " + "/".join(f"{x:.4f}" for x in r[kv]["loss"].values())
                       for kv in r)
    b = holds(ok, "; ".join(filter(None, [f"loss (seeds {'/'.join(mha['loss'])}): {losses}; "
                                          f"limit MHA + {QUALITY}", note])))
    return {"a": a, "b": b}


def _example(kv_bytes_1, loss_1):
    row = lambda kv_bytes, loss: {"bytes": {"kv": kv_bytes, "other": 20},
                                  "loss": {"0": loss, "1": loss}, "failed": {"0": None, "1": None}}
    return {"8": row(262144, 1.80), "2": row(65536, 1.82), "1": row(kv_bytes_1, loss_1)}


EXAMPLES = [
    (_example(32768, 1.84), {"a": "confirmed", "b": "confirmed"}),
    (_example(40000, 1.90), {"a": "refuted", "b": "refuted"}),
]
