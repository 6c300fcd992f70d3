"""MK4: multiplying the softmax output by the mask (instead of masking the scores before the
softmax) leaves rows that do not sum to 1 and makes the gradients explode.

Measure: (a) op level: 100 draws of S-op q, k, v (``s_op(seed)``, seeds 0-99) with a causal
mask through the unsafe kernel ``implementation="masked_fill"``, once with
``mask_after_softmax=True`` (softmax over all 128 keys, then times the mask) and once with the
pre-softmax select (``where(mask, s, finfo.min)``); per draw the mean over rows of
``|sum_j w_ij - 1|`` and the gradient-norm ratio ``||grad_post|| / ||grad_select||`` of the
global norm of the q, k, v gradients of ``L = sum(out * g)``, ``g`` a fixed N(0, 1) cotangent
per draw. (b) training: S-text with ``model.attention.kernel=masked_fill`` and
``mask_after_softmax=true`` against the same kernel with the pre-softmax select (its
defaults: the healthy control), seeds 0 and 1, **300 steps** (cut from 600, as CLAIMS.md
allows): the median of the logged ``grad_norm`` (metrics.jsonl, every 10 steps) and
divergence (CLAIMS.md: a non-finite logged loss, a skipped update, or a final training loss
above the step-0 loss - 0.1; the step-0 loss is the initial parameters' loss on the first
training batch).

Left open and resolved here: the criterion has two parts, (a) "rows" on the op-level row sums
(100 draws pooled) and (b) "explosion", confirmed if the op-level median ratio is >= 10 or, at
every seed, the post-softmax run diverges or its median ``grad_norm`` is >= 10x the control's
at that seed. The control's own health and both validation losses are reported (the
post-softmax kernel normalises over the future keys too, so its rows leak a little of the
future through their sums).

Cost: 2 arms x 2 seeds at 300 steps, ~2 units; the op-level part takes 3-7 s.

    attnjax audit experiments/claims --workdir runs/claims --only MK4
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.audit.settings import s_op, with_seeds
from attnjax.ops import dot_product_attention

ID = "MK4"
SOURCE = "002 §3.3"
CLAIM = "multiplying the softmax output by the mask leaves rows not summing to 1 and explodes grads"
CRITERION = ("rows: mean |sum - 1| > 1e-3; explosion: median ratio >= 10 in (a), or in (b) "
             "divergence or median grad_norm >= 10x the healthy control's")
DRAWS = 100
ROW_GAP, RATIO = 1e-3, 10.0
S300 = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
POST = {"model.attention.kernel": "masked_fill", "model.attention.mask_after_softmax": True,
        **S300}
SELECT = {"model.attention.kernel": "masked_fill", **S300}


def get_sweep():
    return with_seeds([POST, SELECT])


@functools.partial(jax.jit, static_argnames="after")
def _attend(q, k, v, g, *, after: bool):
    """Row sums of the weights and the global norm of the q, k, v gradients of sum(out g)."""
    def loss(q, k, v):
        out, w = dot_product_attention(q, k, v, is_causal=True, return_weights=True,
                                       implementation="masked_fill", mask_after_softmax=after)
        return (out * g).sum(), w
    grads, w = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return w.sum(-1), jnp.sqrt(sum(jnp.sum(x * x) for x in grads))


def op_level() -> dict:
    gaps, ratios = [], []
    for seed in range(DRAWS):
        q, k, v = s_op(seed)
        g = np.random.default_rng(1000 + seed).standard_normal(q.shape).astype(np.float32)
        sums, post = _attend(q, k, v, g, after=True)
        _, select = _attend(q, k, v, g, after=False)
        gaps.append(float(np.abs(np.asarray(sums) - 1).mean()))
        ratios.append(float(post / select))
    return {"row_gap_mean": float(np.mean(gaps)), "ratio_median": float(np.median(ratios)),
            "ratio_max": float(np.max(ratios))}


def measure(runs) -> dict:
    out = {"op": op_level(), "train": {}}
    for name, arm in (("post", POST), ("select", SELECT)):
        for seed, trained in runs.by_seed(arm).items():
            norms = [r["grad_norm"] for r in trained.dir.metrics()]
            out["train"].setdefault(name, {})[str(seed)] = {
                "grad_norm_median": float(np.median(norms)), "diverged": trained.failed or "",
                "loss": trained.loss()}
    return out


def verdict(r):
    op, post, select = r["op"], r["train"]["post"], r["train"]["select"]
    ratio = {s: post[s]["grad_norm_median"] / select[s]["grad_norm_median"] for s in post}
    trained, note = over_seeds({s: bool(post[s]["diverged"]) or ratio[s] >= RATIO for s in post})
    show = "; ".join(
        f"seed {s}: median grad_norm post {post[s]['grad_norm_median']:.3g} / select "
        f"{select[s]['grad_norm_median']:.3g} = {ratio[s]:.2f}x, post "
        f"{post[s]['diverged'] or 'not diverged'}, control "
        f"{select[s]['diverged'] or 'healthy'}, val loss post {post[s]['loss']:.4f} / select "
        f"{select[s]['loss']:.4f}" for s in post)
    return {
        "a": holds(op["row_gap_mean"] > ROW_GAP,
                   f"post-softmax multiply: mean |row sum - 1| = {op['row_gap_mean']:.4f} over "
                   f"{DRAWS} S-op draws"),
        "b": holds(op["ratio_median"] >= RATIO or trained, "; ".join(filter(None, [
            f"(a) gradient-norm ratio post/select: median {op['ratio_median']:.3f}, max "
            f"{op['ratio_max']:.3f}", f"(b) {show}", note]))),
    }


def _example(gap, ratio, post_norm, post_diverged=""):
    run = lambda norm, div: {"grad_norm_median": norm, "diverged": div, "loss": 2.5}
    return {"op": {"row_gap_mean": gap, "ratio_median": ratio, "ratio_max": ratio * 2},
            "train": {"post": {"0": run(post_norm, post_diverged), "1": run(post_norm, "")},
                      "select": {"0": run(0.5, ""), "1": run(0.5, "")}}}


EXAMPLES = [
    (_example(0.4, 1.1, 0.6), {"a": "confirmed", "b": "refuted"}),
    (_example(1e-4, 12.0, 0.6), {"a": "refuted", "b": "confirmed"}),
    (_example(0.4, 1.1, 6.0), {"a": "confirmed", "b": "confirmed"}),
    (_example(0.4, 1.1, 0.6, post_diverged="3 skipped updates"),
     {"a": "confirmed", "b": "refuted"}),
]
