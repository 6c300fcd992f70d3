"""PT5: in a pretrained model some heads attend to the adjacent word and some heads behave nearly
identically (asked of a decoder).

Measure: P-SmolLM (``attnjax.audit.smollm``), 100 windows of 64 tokens, each run alone. Per
head, over every window and query i in 8..63: (a) the share of queries whose largest weight is
on position i - 1 (ties go to the first position, as argmax does); (b) per layer, the
Jensen-Shannon divergence between two heads' rows (``attnjax.ops.stats.head_divergence`` from
query 8 on, averaged over those rows of every window), the closest pair. Heads that share a
key/value head (SmolLM: 3 query heads per key/value head) are marked in the picture.

Criterion: (a) some head has >= 0.5 of its queries at i - 1; (b) some pair of heads of one
layer has JS <= 0.05 nats. Untestable when the model is not installed.

    make smollm && attnjax audit experiments/claims --workdir runs/claims --only PT5
"""

import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.audit import holds, untestable
from attnjax.audit.smollm import (FIRST_QUERY, absent, documentation_windows, load_smollm,
                                  window_attention)
from attnjax.audit.smollm import fingerprint as inputs  # noqa: F401  (the model's presence)
from attnjax.ops.stats import head_divergence

ID = "PT5"
SOURCE = "000 §4.3"
CLAIM = ("some pretrained decoder heads attend to the previous word and some behave nearly "
         "identically")
CRITERION = ("P-SmolLM, 100 windows of 64 tokens, queries 8-63: (a) some head has >= 0.5 of "
             "queries' argmax at i - 1; (b) some same-layer pair has JS <= 0.05")
WINDOWS, LENGTH, PREVIOUS, SIMILAR = 100, 64, 0.5, 0.05
TEST_SIZE = {"WINDOWS": 2}


def measure() -> dict:
    if missing := absent():
        return missing
    model, params, tokenizer = load_smollm()
    windows = documentation_windows(tokenizer, WINDOWS, LENGTH)
    previous = js = 0.0
    queries = np.arange(FIRST_QUERY, LENGTH)
    for weights in window_attention(model, params, windows):     # [layers, B, heads, T, T]
        argmax = weights[..., FIRST_QUERY:, :].argmax(-1)         # [layers, B, heads, T']
        previous = previous + (argmax == queries - 1).sum((1, 3))
        js = js + head_divergence(weights, start=FIRST_QUERY) * weights.shape[1]
    rows = WINDOWS * (LENGTH - FIRST_QUERY)
    return {"previous": (previous / rows).tolist(), "js": (js / WINDOWS).tolist(),
            "group": model.attention.num_heads // (model.attention.num_kv_heads
                                                   or model.attention.num_heads),
            "windows": WINDOWS, "length": LENGTH}


def _closest(js: np.ndarray) -> tuple[np.ndarray, float, tuple[int, int, int]]:
    pairs = np.where(np.eye(js.shape[1], dtype=bool)[None], np.inf, js)
    index = np.unravel_index(np.argmin(pairs), pairs.shape)
    return pairs, float(pairs[index]), tuple(int(i) for i in index)


def verdict(r):
    if "absent" in r:
        return {part: untestable(r["absent"]) for part in "ab"}
    previous, js = np.asarray(r["previous"]), np.asarray(r["js"])
    la, ha = np.unravel_index(np.argmax(previous), previous.shape)
    a = float(previous[la, ha])
    pairs, b, (lb, h, g) = _closest(js)
    shared = "sharing" if h // r["group"] == g // r["group"] else "not sharing"
    return {"a": holds(a >= PREVIOUS, f"L{la}.H{ha}: {a:.3f} of queries at i - 1 "
                       f"({int((previous >= PREVIOUS).sum())} heads >= {PREVIOUS})"),
            "b": holds(b <= SIMILAR, f"closest pair L{lb}.H{h}/H{g} ({shared} a key/value "
                       f"head): JS {b:.4f} nats ({int((pairs <= SIMILAR).sum()) // 2} pairs "
                       f"<= {SIMILAR})")}


def plot(r, out_dir):
    if "absent" in r:
        return []
    previous, js = np.asarray(r["previous"]), np.asarray(r["js"])
    pairs = np.where(np.eye(js.shape[1], dtype=bool)[None], np.nan, js)
    closest = np.nanmin(pairs, axis=2)
    fig, axes = subplots(1, 2, figsize=(12, 9), layout="constrained")
    panels = ((previous, "share of queries whose argmax is i - 1", "viridis"),
              (closest, "JS to the layer's closest other head (nats)", "viridis_r"))
    for ax, (matrix, title, cmap) in zip(axes, panels):
        image = ax.imshow(matrix, cmap=cmap, aspect="auto")
        ax.set_xticks(range(matrix.shape[1]), [f"H{h}" for h in range(matrix.shape[1])],
                      fontsize=7)
        ax.set_yticks(range(matrix.shape[0]), [f"L{l}" for l in range(matrix.shape[0])],
                      fontsize=7)
        for edge in range(r["group"], matrix.shape[1], r["group"]):   # key/value groups
            ax.axvline(edge - 0.5, color="w", linewidth=1.5)
        ax.set_title(title, fontsize=9)
        bright = image.norm(matrix) > 0.6
        if cmap.endswith("_r"):
            bright = ~bright
        for (l, h), value in np.ndenumerate(matrix):
            ax.text(h, l, f"{value:.2f}", ha="center", va="center", fontsize=5.5,
                    color="k" if bright[l, h] else "w")
        fig.colorbar(image, ax=ax, shrink=0.6)
    fig.suptitle(f"PT5: heads of SmolLM2-135M-Instruct over {r['windows']} windows of "
                 f"{r['length']} tokens, queries {FIRST_QUERY}-{r['length'] - 1} (white lines: "
                 f"heads sharing a key/value head)", fontsize=10)
    path = out_dir / "PT5.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(previous, js):
    return {"previous": [[0.1, previous, 0.2], [0.2, 0.1, 0.0]],
            "js": [[[0.0, js, 0.3], [js, 0.0, 0.3], [0.3, 0.3, 0.0]],
                   [[0.0, 0.4, 0.3], [0.4, 0.0, 0.3], [0.3, 0.3, 0.0]]],
            "group": 3, "windows": 100, "length": 64}


EXAMPLES = [
    (_example(0.8, 0.02), {"a": "confirmed", "b": "confirmed"}),
    (_example(0.3, 0.2), {"a": "refuted", "b": "refuted"}),
    ({"absent": "SmolLM2-135M-Instruct is not installed"}, {"a": "untestable", "b": "untestable"}),
]
