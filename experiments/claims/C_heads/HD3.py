"""HD3: heads that each see the full width learn similar patterns; per-head subspaces
(head_dim = d_model / N) force them to differ.

Measure: S-text (width 64, 4 heads, 600 steps), seeds 0 and 1: the plain arm ``{}`` (head_dim
16, each head a 16-wide subspace) against ``model.attention.head_dim=64`` (4 full-width heads;
values 64 wide too, the output projection maps 4 x 64 back to 64). On the first 16 validation
sequences of 64 bytes, the mean over a layer's 6 head pairs of their JS divergence
(``analysis.head_similarity.head_js``: rows i >= 8, the conventions), best checkpoints.

Criterion per seed, every seed and every layer: mean JS(head_dim 64) <= 0.8 x mean JS(head_dim
16), i.e. full width lowers it by >= 20% relative.

Cost (unit: one S-text arm, both seeds, 600 steps): the head_dim-64 arm ~2 units (the plain
arm is shared).

    attnjax audit experiments/claims --workdir runs/claims --only HD3
"""

from attnjax.analysis.capture import probe_batch
from attnjax.analysis.head_similarity import head_js, layer_summary
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "HD3"
SOURCE = "000 §2.2"
CLAIM = "full-width heads learn similar patterns; per-head subspaces force diversity"
CRITERION = "full width lowers the mean pairwise JS by >= 20% (relative) in every layer"
ARMS = {"16": {}, "64": {"model.attention.head_dim": 64}}
PROBES, FIRST_ROW, DROP = 16, 8, 0.2


def get_sweep():
    return with_seeds(list(ARMS.values()))


def measure(runs) -> dict:
    out = {}
    for width, overrides in ARMS.items():
        for seed, trained in runs.by_seed(overrides).items():
            config, params, _ = trained.dir.params("best")
            js = head_js(config, params, probe_batch(config, batch_size=PROBES), start=FIRST_ROW)
            out.setdefault(width, {})[str(seed)] = {
                "mean_js": [row["mean"] for row in layer_summary(js)], "loss": trained.loss()}
    return out


def verdict(r):
    narrow, full = r["16"], r["64"]
    lower = {s: all(f <= (1 - DROP) * n for f, n in zip(full[s]["mean_js"], narrow[s]["mean_js"]))
             for s in narrow}
    ok, note = over_seeds(lower)
    text = "; ".join(f"seed {s}: mean pairwise JS per layer, head_dim 16 "
                     + "/".join(f"{x:.4f}" for x in narrow[s]["mean_js"]) + " vs 64 "
                     + "/".join(f"{x:.4f}" for x in full[s]["mean_js"]) + " (relative change "
                     + "/".join(f"{f / n - 1:+.0%}" for f, n in zip(full[s]["mean_js"],
                                                                   narrow[s]["mean_js"]))
                     + f"; loss {narrow[s]['loss']:.4f} vs {full[s]['loss']:.4f})"
                     for s in narrow)
    return holds(ok, "; ".join(filter(None, [text, note])))


def _example(narrow, full):
    row = lambda js: {"mean_js": list(js), "loss": 2.0}
    return {"16": {s: row(narrow) for s in "01"}, "64": {s: row(full) for s in "01"}}


EXAMPLES = [
    (_example([0.30, 0.25], [0.20, 0.15]), "confirmed"),
    (_example([0.30, 0.25], [0.20, 0.24]), "refuted"),
    (_example([0.30, 0.25], [0.35, 0.30]), "refuted"),
]
