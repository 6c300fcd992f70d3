"""MK8: (a) an all-zero input made attention, and so the loss, NaN; (b) ``nan_to_num`` on q and
k fixed it; (c) a NaN or inf among the scores breaks the softmax.

Measure, at initialisation (no training), NaN anywhere in the outputs, the loss or the
gradients:

(a) attnjax's ``MultiHeadAttention`` on an all-zero input ``x`` [2, 16, 32] (loss
``sum(out * g)``, ``g`` a fixed N(0, 1) cotangent; gradients with respect to the parameters
and ``x``) and a ``DecoderLM`` (width 32, 4 heads, 2 layers, RoPE) whose token embeddings
are set to zero (next-token cross-entropy of random tokens, ``attnjax.train.step``'s
``scored_sums``; gradients with respect to the parameters). Model settings: float32, no
qk-norm, no bias, then each changed alone: ``model.dtype`` bfloat16 and float16, every other
``model.attention.qk_norm`` of ``attnjax.registry.QK_NORMS``, ``use_bias``. Each with three
masks: causal (attnjax's reference kernel), and causal with query 0 seeing no key (the
unsafe kernel, ``kernel="masked_fill"`` with ``causal_offset=-1``) with its default finite
fill ``finfo.min`` and with PyTorch's ``-inf``.
(b) every setting of (a) that gave NaN, rerun with ``jnp.nan_to_num`` applied to q and k
right after the projection (a Flax method interceptor on the fused ``qkv`` projection, the
place 002's fix puts it).
(c) S-op q, k, v, causal, with one visible score (batch 0, head 0, query 5, key 3) replaced
by NaN, +inf or -inf (through ``bias``), in the reference and the unsafe kernel: NaN in that
output row and in the other rows.

Each setting's initialisation, forward pass and gradient are compiled programs (jit), which
return whether NaN appeared.

Left open: to fit the op-level budget (compilation dominates), the model settings change one
factor at a time rather than as a full product, and only for ``MultiHeadAttention`` (7
settings x 3 masks); the DecoderLM runs the base setting with the three masks. (b) "removes
it" is judged on every setting that gave NaN in (a) (none: untestable, not reached here).
(c) "makes its row NaN" means every entry of that query's output row of that head is NaN, in
both kernels, for NaN and for +inf (-inf is reported).

    attnjax audit experiments/claims --workdir runs/claims --only MK8
"""

import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds, untestable
from attnjax.audit.settings import s_op
from attnjax.config import AttentionConfig, ModelConfig
from attnjax.models import build
from attnjax.nn import MultiHeadAttention
from attnjax.ops import dot_product_attention
from attnjax.registry import QK_NORMS
from attnjax.models.family import scored_sums

ID = "MK8"
SOURCE = "002 §6; 000 §7.3"
CLAIM = ("an all-zero input made attention and loss NaN; nan_to_num on q, k fixed it; NaN/inf "
         "scores break softmax")
CRITERION = ("(a) some setting gives NaN; (b) nan_to_num removes it; (c) NaN or +inf makes its "
             "row NaN")
B, T, WIDTH, HEADS = 2, 16, 32, 4
BASE = {"dtype": "float32", "qk_norm": "none", "use_bias": False}
MASKS = {"causal": {},
         "empty row, finfo.min": {"kernel": "masked_fill", "causal_offset": -1},
         "empty row, -inf": {"kernel": "masked_fill", "causal_offset": -1,
                             "mask_fill": -float("inf")}}
PLANT = (0, 0, 5, 3)                 # batch, head, query, key


def model_settings(changes: int | None = None) -> list[dict]:
    """The base setting, then each factor changed alone (the first ``changes`` of them)."""
    changed = ([{"dtype": d} for d in ("bfloat16", "float16")]
               + [{"qk_norm": n} for n in QK_NORMS.names() if n != "none"]
               + [{"use_bias": True}])
    return [BASE] + [{**BASE, **c} for c in changed[:changes]]


CHANGES = None                            # every factor
TEST_SIZE = {"CHANGES": 1}                # the suite: the base and one change


def config(setting: dict, mask: str) -> ModelConfig:
    attention = AttentionConfig(num_heads=HEADS, qk_norm=setting["qk_norm"],
                                use_bias=setting["use_bias"], **MASKS[mask])
    return ModelConfig(vocab_size=32, d_model=WIDTH, num_layers=2, max_length=T,
                       dtype=setting["dtype"], attention=attention)


def _nan_to_num_qk(next_fun, args, kwargs, context):
    """``jnp.nan_to_num`` on the q and k parts of every fused ``qkv`` projection's output."""
    out = next_fun(*args, **kwargs)
    if isinstance(context.module.parent, MultiHeadAttention) and context.module.name == "qkv":
        qk = 2 * HEADS                        # [B, T, N + 2K, H]: q heads, then k heads
        out = out.at[..., :qk, :].set(jnp.nan_to_num(out[..., :qk, :]))
    return out


def _has_nan(tree) -> jax.Array:
    """Whether any leaf of ``tree`` holds a NaN, as a boolean scalar (computed inside the
    compiled programs of ``nan_report``)."""
    return jnp.stack([jnp.isnan(jnp.asarray(x, jnp.float32)).any()
                      for x in jax.tree.leaves(tree)]).any()


def _objective(cfg: ModelConfig, module: str):
    """``(loss_fn(params, x) -> (loss, output), params, x)`` of the module at init."""
    rng = np.random.default_rng(0)
    if module == "MultiHeadAttention":
        mha, x = MultiHeadAttention(cfg), jnp.zeros((B, T, WIDTH))
        positions = jnp.arange(T)[None]
        params = jax.jit(mha.init)(jax.random.key(0), x, positions)["params"]
        g = jnp.asarray(rng.standard_normal((B, T, WIDTH)), jnp.float32)

        def loss(params, x):
            out = mha.apply({"params": params}, x, positions)[0].astype(jnp.float32)
            return (out * g).sum(), out
        return loss, params, x
    model = build(cfg)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T)))
    params = jax.jit(model.init)(jax.random.key(0), tokens)["params"]
    params = {**params, "embed": {"embedding": jnp.zeros_like(params["embed"]["embedding"])}}
    batch = {"targets": tokens[:, 1:], "weights": jnp.ones((B, T - 1))}

    def loss(params, tokens):
        logits = model.apply({"params": params}, tokens)[0]
        sums = scored_sums(logits[:, :-1], batch)
        return sums["ce"] / sums["weight"], logits
    return loss, params, tokens


def nan_report(cfg: ModelConfig, module: str, fix: bool = False) -> dict:
    """Whether the output, the loss and the gradients contain NaN (gradients are taken only
    when the forward pass is finite: a NaN loss already decides the setting). The forward pass
    and the gradient are each one compiled program, traced inside the ``fix`` interceptor."""
    loss, params, x = _objective(cfg, module)
    argnums = (0, 1) if module == "MultiHeadAttention" else 0
    forward = jax.jit(lambda params, x: tuple(map(_has_nan, loss(params, x))))
    gradient = jax.jit(lambda params, x: _has_nan(
        jax.grad(lambda *a: loss(*a)[0], argnums)(params, x)))
    with nn.intercept_methods(_nan_to_num_qk) if fix else contextlib.nullcontext():
        value, out = forward(params, x)
        report = {"output": bool(out), "loss": bool(value)}
        if not (report["output"] or report["loss"]):
            report["gradients"] = bool(gradient(params, x))
    return report


def planted(kernel: str, value: float) -> dict:
    """NaN entries of the planted row and of the other rows, one score set to ``value``."""
    q, k, v = s_op()
    bias = np.zeros((B, q.shape[2], q.shape[1], k.shape[1]), np.float32)
    bias[PLANT] = value
    attend = jax.jit(functools.partial(dot_product_attention, is_causal=True,
                                       implementation=kernel))
    out = np.asarray(attend(q, k, v, bias))
    b, n, i, _ = PLANT
    row = np.isnan(out[b, i, n])
    return {"row_nan": int(row.sum()), "row_size": int(row.size),
            "other_nan": int(np.isnan(out).sum() - row.sum())}


def _name(setting: dict) -> str:
    return f"{setting['dtype']} qk_norm={setting['qk_norm']} bias={setting['use_bias']}"


def measure() -> dict:
    zero, fixed = {}, {}
    runs = [("MultiHeadAttention", s) for s in model_settings(CHANGES)] + [("DecoderLM", BASE)]
    for module, setting in runs:
        for mask in MASKS:
            name, cfg = f"{module} {_name(setting)} {mask}", config(setting, mask)
            zero[name] = nan_report(cfg, module)
            if any(zero[name].values()):
                fixed[name] = nan_report(cfg, module, fix=True)
    plants = {f"{kernel} {value}": planted(kernel, value)
              for kernel in ("reference", "masked_fill")
              for value in (float("nan"), float("inf"), -float("inf"))}
    return {"zero_input": zero, "nan_to_num": fixed, "planted": plants}


def _short(names: list[str]) -> str:
    return ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")


def verdict(r):
    zero, fixed = r["zero_input"], r["nan_to_num"]
    nan = [n for n, x in zero.items() if any(x.values())]
    by_mask = {m: sum(n.endswith(m) for n in nan) for m in MASKS}
    per_mask = sum(n.endswith("causal") for n in zero)
    a = holds(bool(nan), f"NaN in {len(nan)}/{len(zero)} settings: " + ", ".join(
        f"{m} {c}/{per_mask}" for m, c in by_mask.items()))
    if nan:
        still = [n for n in nan if any(fixed[n].values())]
        b = holds(not still, f"after nan_to_num on q, k: NaN in {len(still)}/{len(nan)} of them"
                  + (f" ({_short(still)})" if still else ""))
    else:
        b = untestable("not reached here: no setting of (a) gave NaN")
    p = r["planted"]
    breaks = all(p[f"{kernel} {value}"]["row_nan"] == p[f"{kernel} {value}"]["row_size"]
                 for kernel in ("reference", "masked_fill") for value in ("nan", "inf"))
    c = holds(breaks, "NaN in the planted row / in other rows: " + "; ".join(
        f"{name} {x['row_nan']}/{x['row_size']} / {x['other_nan']}" for name, x in p.items()))
    return {"a": a, "b": b, "c": c}


def _example(nan_settings: int, fixed_nan: bool, row_nan: int):
    zero = {f"MultiHeadAttention s{i} {mask}": {"output": i < nan_settings and mask != "causal",
                                                "loss": False}
            for i in range(3) for mask in MASKS}
    fixed = {n: {"output": fixed_nan, "loss": False} for n, x in zero.items() if any(x.values())}
    planted_rows = {f"{kernel} {value}": {"row_nan": row_nan if value != "-inf" else 0,
                                          "row_size": 32, "other_nan": 0}
                    for kernel in ("reference", "masked_fill") for value in ("nan", "inf", "-inf")}
    return {"zero_input": zero, "nan_to_num": fixed, "planted": planted_rows}


EXAMPLES = [
    (_example(1, False, 32), {"a": "confirmed", "b": "confirmed", "c": "confirmed"}),
    (_example(2, True, 1), {"a": "confirmed", "b": "refuted", "c": "refuted"}),
    (_example(0, False, 32), {"a": "refuted", "b": "untestable", "c": "confirmed"}),
]
