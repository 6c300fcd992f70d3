"""PE13: (a) an unscaled sin/cos position embedding drove max q.k^T to ~1200 and collapsed the
attention weights to 0 or 1; (b) a LayerNorm after the embedding, or dividing it by its norm,
fixes that.

Measure: S-text with sinusoidal positions (tokens x sqrt(d), the encoding's default), pre-
and post-norm (``model.norm_position``), the added position embedding x 1, sqrt(d) = 8 and
10 sqrt(d) = 80 (``model.position.added_scale``), seeds 0 and 1, 300 steps (cut from 600 to fit
the budget, as CLAIMS.md allows). On the first 8 validation sequences of 64 bytes
(``analysis.capture.probe_examples``), from one forward pass (``nn.probe.capture``): the
unscaled max q.k^T over causal pairs, heads and layers (``ops.stats.causal_max_logit`` with
scale 1 on the queries and keys the model sows), and the saturated fraction: the share of rows
i >= 8 (of every head and sequence) whose max weight exceeds 0.99, per layer and pooled.
Regimes for (a): the three scales; (a) is judged on post-norm, at every seed; pre-norm is
reported.

Left open and resolved here: which layer's saturated fraction. It is the first layer's, the
one attention whose input carries the added embedding as it is: in a post-norm block the
later layers read a normalised stream (pre-norm normalises every layer's input), so the
fraction pooled over both layers cannot reach 0.5 by much whatever the embedding does; the
pooled fraction is reported beside it.

(b): the two fixes are ``model.position.added_norm=layer`` (a LayerNorm of the added
embedding, before its scale) and ``added_norm=unit`` (each position's vector divided by its
norm), each post-norm at the three scales; (b) is judged, like (a), on the post-norm layer-0
saturated fraction, in every scale regime and at every seed.

Cost: 12 arms x 2 seeds at 300 steps (seeds vmapped), ~12 units.

    attnjax audit experiments/claims --workdir runs/claims --only PE13
"""

import math

import numpy as np

from attnjax.analysis.capture import probe_examples
from attnjax.audit import over_regimes
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (base: S-text)
from attnjax.models.probe import capture
from attnjax.ops.stats import causal_max_logit

ID = "PE13"
SOURCE = "002 §5.1"
CLAIM = ("(a) an unscaled sin/cos position embedding drove max q.k^T to ~1200 and saturated the "
         "weights; (b) LayerNorm after it or dividing by its norm fixes that")
CRITERION = "(a) post-norm saturated fraction >= 0.5; (b) both fixes bring it below 0.1"
D = 64
SCALES = {"x1": 1.0, "x sqrt(d)": math.sqrt(D), "x 10 sqrt(d)": 10 * math.sqrt(D)}
NORMS = ("pre", "post")
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
PROBES, FIRST_ROW, SATURATED = 8, 8, 0.99
COLLAPSED, FIXED = 0.5, 0.1
FIXES = {"layernorm": "layer", "unit_norm": "unit"}       # model.position.added_norm


def arm(norm: str, scale: float, fix: str | None = None) -> dict:
    extra = {} if fix is None else {"model.position.added_norm": FIXES[fix]}
    return {"model.position.kind": "sinusoidal", "model.norm_position": norm,
            "model.position.added_scale": scale, **extra, **STEPS}


def get_sweep():
    return with_seeds([arm(norm, scale) for norm in NORMS for scale in SCALES.values()]
                      + [arm("post", scale, fix) for fix in FIXES for scale in SCALES.values()])


def saturation(config, params) -> dict:
    """Unscaled max q.k^T and the saturated fraction (rows i >= 8) on the probe batch."""
    tokens = probe_examples(config, batch_size=PROBES)["inputs"]
    weights, sown = capture(config.model, params, tokens)
    max_qk = max(float(causal_max_logit(s["queries"], s["keys"], 1.0).max()) for s in sown)
    rows = np.asarray(weights)[..., FIRST_ROW:, :].max(-1) > SATURATED   # [layers, B, N, T-8]
    return {"max_qk": max_qk, "saturated": float(rows.mean()),
            "saturated_by_layer": rows.mean(axis=(1, 2, 3)).tolist()}


def measure(runs) -> dict:
    out = {"runs": {}, "fixes": {fix: {} for fix in FIXES}}
    for norm in NORMS:
        for name, scale in SCALES.items():
            for seed, t in runs.by_seed(arm(norm, scale)).items():
                config, params, _ = t.dir.params("best")
                out["runs"][f"{norm}/{name}/{seed}"] = {
                    **saturation(config, params), "loss": t.loss(), "failed": t.failed}
    for fix in FIXES:
        for name, scale in SCALES.items():
            out["fixes"][fix][name] = {
                str(seed): saturation(*t.dir.params("best")[:2])["saturated_by_layer"][0]
                for seed, t in runs.by_seed(arm("post", scale, fix)).items()}
    return out


def _by_seed(runs: dict, norm: str, scale: str) -> dict:
    prefix = f"{norm}/{scale}/"
    return {n[len(prefix):]: r for n, r in runs.items() if n.startswith(prefix)}


def verdict(results):
    runs = results["runs"]
    table = "; ".join(f"{n}: max q.k {r['max_qk']:.0f}, saturated layer 0 "
                      f"{r['saturated_by_layer'][0]:.2f} (pooled {r['saturated']:.2f}), loss "
                      f"{r['loss']:.3f}{' (' + r['failed'] + ')' if r['failed'] else ''}"
                      for n, r in runs.items())
    collapsed = {scale: {s: r["saturated_by_layer"][0] >= COLLAPSED
                         for s, r in _by_seed(runs, "post", scale).items()} for scale in SCALES}
    out = {"a": over_regimes(collapsed, f"post-norm layer-0 saturated fraction >= {COLLAPSED}?"
                                        f" {table}")}
    fixes = results["fixes"]
    fixed = {scale: {s: all(by_scale[scale][s] < FIXED for by_scale in fixes.values())
                     for s in by_seed} for scale, by_seed in next(iter(fixes.values())).items()}
    shown = "; ".join(f"{fix} {scale} " + "/".join(f"{v:.2f}" for v in by_seed.values())
                      for fix, by_scale in fixes.items() for scale, by_seed in by_scale.items())
    out["b"] = over_regimes(fixed, f"post-norm layer-0 saturated fraction with the fix: {shown}")
    return out


def _example(post: float, fixes=None) -> dict:
    run = lambda sat: {"max_qk": 1200.0, "saturated": sat, "saturated_by_layer": [sat, sat],
                       "loss": 2.0, "failed": None}
    return {"runs": {f"{norm}/{scale}/{s}": run(post if norm == "post" else 0.0)
                     for norm in NORMS for scale in SCALES for s in "01"}, "fixes": fixes}


_FIXED = {fix: {scale: {"0": 0.02, "1": 0.05} for scale in SCALES}
          for fix in ("layernorm", "unit_norm")}
EXAMPLES = [
    (_example(0.8, _FIXED), {"a": "confirmed", "b": "confirmed"}),
    (_example(0.1, {**_FIXED, "unit_norm": {s: {"0": 0.3, "1": 0.3} for s in SCALES}}),
     {"a": "refuted", "b": "refuted"}),
]
