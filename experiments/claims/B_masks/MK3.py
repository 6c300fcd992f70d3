"""MK3: (a) -1e9 overflows float16 to -inf, which breaks mixed-precision softmax; (b)
``finfo(dtype).min`` (or ``-finfo(dtype).max``) is the safer fill; (c) a fill near the limit
can still turn into -inf or NaN after small errors.

Measure: (a) ``float16(-1e9)``. (b, c) the unsafe kernel (``implementation="masked_fill"``)
with float16 and bfloat16 logits (inputs in that dtype, ``logits_dtype="input"``), fills
-1e9, ``finfo(dtype).min``, ``-finfo(dtype).max`` (the same number in both dtypes) and -1e4,
``mask_mode`` select and add, a causal mask with and without a fully masked row (query 0 sees
no key), scores drawn uniformly from [-50, 0] (S-op q, k, v at ``scale=0`` plus the scores
as ``bias``, so ``s = bias`` exactly). Per setting: the number of NaN and of infinite output
entries, and of NaN and infinite logits: the kernel cannot return its logits, so they are
recomputed in the dtype with the two lines of arithmetic its docstring states (select:
``where(mask, s, fill)``; add: ``s + (1 - mask) * fill``).

Left open: (b) "fewer settings, never more" is read as: the number of settings with a NaN is
smaller for finfo.min than for -1e9, and in no setting (same dtype, mode, mask) does
finfo.min give more NaN entries than -1e9. (c) "near-limit" fills are finfo.min and
-finfo.max; a NaN or infinite logit or output in some setting confirms.

    attnjax audit experiments/claims --workdir runs/claims --only MK3
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds
from attnjax.audit.settings import s_op
from attnjax.ops import dot_product_attention

ID = "MK3"
SOURCE = "000 §6.1, §8.2"
CLAIM = ("-1e9 overflows fp16 to -inf, breaking mixed-precision softmax; finfo.min is safer; "
         "a near-limit fill can still turn NaN")
CRITERION = ("(a) float16(-1e9) is -inf; (b) finfo.min gives NaN in fewer settings than -1e9, "
             "never more; (c) some near-limit fill gives -inf or NaN")
DTYPES = ("float16", "bfloat16")
FILLS = ("-1e9", "finfo.min", "-finfo.max", "-1e4")
NEAR_LIMIT = ("finfo.min", "-finfo.max")
MODES = ("select", "add")
MASKS = ("causal", "causal + empty row 0")


def fill_value(name: str, dtype) -> float:
    info = jnp.finfo(dtype)
    return {"-1e9": -1e9, "finfo.min": float(info.min), "-finfo.max": -float(info.max),
            "-1e4": -1e4}[name]


def masks(T: int) -> dict[str, np.ndarray]:
    causal = np.tril(np.ones((T, T), bool))
    empty = causal.copy()
    empty[0] = False
    return dict(zip(MASKS, (causal[None, None], empty[None, None])))


@functools.partial(jax.jit, static_argnames=("mode",))
def _attend(q, k, v, scores, mask, fill, *, mode):
    return dot_product_attention(q, k, v, scores, mask, scale=0.0, implementation="masked_fill",
                                 mask_fill=fill, mask_mode=mode, logits_dtype="input")


@functools.partial(jax.jit, static_argnames=("mode",))
def _logits(scores, mask, fill, *, mode):
    """The masked logits in the scores' dtype (see the module docstring)."""
    fill = jnp.asarray(fill, scores.dtype)
    if mode == "select":
        return jnp.where(mask, scores, fill)
    return scores + (1 - mask.astype(scores.dtype)) * fill


def measure() -> dict:
    q, k, v = s_op()
    B, T, N, _ = q.shape
    scores = np.random.default_rng(3).uniform(-50.0, 0.0, (B, N, T, T))
    with np.errstate(over="ignore"):        # the overflow is what (a) measures
        out = {"float16(-1e9)": float(jnp.asarray(-1e9, jnp.float16)), "settings": {}}
    for dtype in DTYPES:
        inputs = [jnp.asarray(x, dtype) for x in (q, k, v, scores)]
        for mask_name, mask in masks(T).items():
            for mode in MODES:
                for fill in FILLS:
                    value = fill_value(fill, dtype)
                    o = np.asarray(_attend(*inputs, mask, value, mode=mode), np.float32)
                    s = np.asarray(_logits(inputs[3], mask, value, mode=mode), np.float32)
                    out["settings"][f"{fill} | {dtype} {mode} {mask_name}"] = {
                        "nan": int(np.isnan(o).sum()), "inf": int(np.isinf(o).sum()),
                        "nan_logits": int(np.isnan(s).sum()),
                        "inf_logits": int(np.isinf(s).sum())}
    return out


def _by_fill(r: dict, fill: str) -> dict:
    """``{setting without the fill: counts}`` of one fill."""
    return {name.split(" | ")[1]: x for name, x in r["settings"].items()
            if name.split(" | ")[0] == fill}


def verdict(r):
    nan_settings = {f: [s for s, x in _by_fill(r, f).items() if x["nan"]] for f in FILLS}
    low, big = _by_fill(r, "finfo.min"), _by_fill(r, "-1e9")
    more = [s for s in low if low[s]["nan"] > big[s]["nan"]]
    total = len(low)
    broken = {f: [f"{s} ({x['inf_logits']} inf / {x['nan_logits']} NaN logits, {x['nan']} NaN "
                  f"outputs)" for s, x in _by_fill(r, f).items() if any(x.values())]
              for f in NEAR_LIMIT}
    return {
        "a": holds(r["float16(-1e9)"] == -np.inf, f"float16(-1e9) = {r['float16(-1e9)']}"),
        "b": holds(len(nan_settings["finfo.min"]) < len(nan_settings["-1e9"]) and not more,
                   "settings with NaN: " + ", ".join(f"{f} {len(nan_settings[f])}/{total}"
                                                     for f in FILLS)
                   + f"; -1e9 in: {', '.join(nan_settings['-1e9']) or 'none'}; finfo.min in: "
                   f"{', '.join(nan_settings['finfo.min']) or 'none'}"
                   + (f"; finfo.min has more NaN in {', '.join(more)}" if more else "")),
        "c": holds(any(broken.values()),
                   "; ".join(f"{f}: NaN/inf in {', '.join(b) or 'no setting'}"
                             for f, b in broken.items())
                   + f" (of {total} settings each)"),
    }


def _example(nan: dict, inf_logits: dict | None = None):
    """Counts: ``nan[fill]`` NaN outputs and ``inf_logits[fill]`` infinite logits in the add
    setting of ``fill``, none elsewhere."""
    row = lambda fill, mode: {"nan": nan.get(fill, 0) if mode == "add" else 0, "inf": 0,
                              "nan_logits": 0,
                              "inf_logits": (inf_logits or {}).get(fill, 0) if mode == "add" else 0}
    return {"float16(-1e9)": -np.inf, "settings": {
        f"{fill} | float16 {mode} causal": row(fill, mode) for fill in FILLS for mode in MODES}}


EXAMPLES = [
    (_example({"-1e9": 128}, {"finfo.min": 40, "-finfo.max": 40}),
     {"a": "confirmed", "b": "confirmed", "c": "confirmed"}),
    ({**_example({"finfo.min": 4}), "float16(-1e9)": -1e9},
     {"a": "refuted", "b": "refuted", "c": "confirmed"}),
    (_example({"-1e9": 4}), {"a": "confirmed", "b": "confirmed", "c": "refuted"}),
    (_example({"-1e9": 4, "finfo.min": 8}), {"a": "confirmed", "b": "refuted", "c": "confirmed"}),
]
