"""TR5: the same position pair gets different attention weights for different inputs (the
weights are computed from the content, not fixed per position).

Measure: the plain S-text runs (overrides ``{}``: 600 steps, seeds 0 and 1, shared with
every claim that reads plain S-text), last checkpoint, 256 validation windows of 64 bytes
(``attnjax.analysis.capture.probe_batch``, ``attention_weights``): for every layer, head,
query row i >= 8 and key j <= i, the CV of ``w_ij`` across the windows (population std /
mean); per head the mean of that CV over its (i, j) pairs; then the median over the 8 heads.

Left open and resolved here: the rows are i >= 8 (CLAIMS.md's convention for attention
statistics); a pair whose mean weight is 0 in float32 (no such pair in practice: softmax
weights are positive) would be left out of the mean.

Cost: none of its own (the plain S-text arm).

    attnjax audit experiments/claims --workdir runs/claims --only TR5
"""

import numpy as np

from attnjax.analysis.capture import attention_weights, probe_batch
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.audit.settings import with_seeds

ID = "TR5"
SOURCE = "000 §1.2"
CLAIM = "the same position pair gets different weights for different inputs"
CRITERION = "median over heads of the mean CV >= 0.5"
WINDOWS, FIRST_ROW, THRESHOLD = 256, 8, 0.5


def get_sweep():
    return with_seeds([{}])


def head_cv(w: np.ndarray) -> list[float]:
    """Per (layer, head) of ``w`` ``[layers, B, heads, T, T]``: the mean over rows i >= 8 and
    keys j <= i of the CV of ``w_ij`` across the B windows."""
    w = np.asarray(w, np.float64)[..., FIRST_ROW:, :]
    T = w.shape[-1]
    pairs = np.arange(T)[None, :] <= np.arange(FIRST_ROW, T)[:, None]
    mean, std = w.mean(1), w.std(1)                                    # [layers, heads, T', T]
    keep = pairs & (mean > 0)
    cv = np.where(keep, std / np.where(keep, mean, 1.0), 0.0)
    return (cv.sum((-2, -1)) / keep.sum((-2, -1))).ravel().tolist()


def measure(runs) -> dict:
    out = {}
    for seed, trained in runs.by_seed({}).items():
        config, params, _ = trained.dir.params("latest")
        w = attention_weights(config, params, probe_batch(config, batch_size=WINDOWS))
        cv = head_cv(w)
        out[str(seed)] = {"head_cv": cv, "median": float(np.median(cv))}
    return out


def verdict(r):
    ok, note = over_seeds({s: x["median"] >= THRESHOLD for s, x in r.items()})
    show = "; ".join(f"seed {s}: median {x['median']:.3f} (heads " + ", ".join(
        f"{c:.2f}" for c in x["head_cv"]) + ")" for s, x in r.items())
    return holds(ok, "; ".join(filter(None, [f"mean CV of w_ij across {WINDOWS} windows: {show}",
                                             note])))


EXAMPLES = [
    ({s: {"head_cv": [0.8] * 8, "median": 0.8} for s in "01"}, "confirmed"),
    ({s: {"head_cv": [0.3] * 8, "median": 0.3} for s in "01"}, "refuted"),
    ({"0": {"head_cv": [0.8] * 8, "median": 0.8}, "1": {"head_cv": [0.3] * 8, "median": 0.3}},
     "refuted"),
]
