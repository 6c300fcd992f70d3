"""PT2: in a pretrained model some heads attend to adjacent words, some to the sentence-initial
special token, and some heads behave nearly identically (redundant).

Measure: P-MiniLM (``attnjax.audit.pretrained``), 200 sentences each run alone. Per head, over
every query row of every sentence: (a) the share of queries whose largest weight is on
position i - 1 or i + 1 (ties go to the first position, as argmax does); (b) the mean weight
on [CLS] (position 0); (c) per layer, the Jensen-Shannon divergence between two heads' rows
(``attnjax.ops.stats.head_divergence``, every query row, averaged over the rows of all
sentences), the closest pair.

Criterion: (a) some head has >= 0.5 of its queries at i +- 1; (b) some head's mean [CLS]
weight is >= 0.5; (c) some pair of heads of one layer has JS <= 0.05 nats. Untestable when
the model is not installed.

    make minilm && attnjax audit experiments/claims --workdir runs/claims --only PT2
"""

import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.audit import holds, untestable
from attnjax.audit.pretrained import absent, load_minilm, sentence_attention
from attnjax.audit.pretrained import fingerprint as inputs  # noqa: F401  (the model's presence)
from attnjax.ops.stats import head_divergence

ID = "PT2"
SOURCE = "000 §4.3"
CLAIM = ("some pretrained heads attend to adjacent words, some to the initial special token, "
         "and some behave nearly identically")
CRITERION = ("P-MiniLM: (a) some head has >= 0.5 of queries' argmax at i +- 1; (b) some head "
             "puts mean weight >= 0.5 on [CLS]; (c) some same-layer pair has JS <= 0.05")
SENTENCES, ADJACENT, CLS, SIMILAR = 200, 0.5, 0.5, 0.05
TEST_SIZE = {"SENTENCES": 4}


def measure() -> dict:
    if missing := absent():
        return missing
    config, params, _, sentences = load_minilm(SENTENCES)
    adjacent = cls = js = 0.0
    rows = 0
    for weights in sentence_attention(config, params, sentences):   # [layers, heads, n, n]
        n = weights.shape[-1]
        offset = weights.argmax(-1) - np.arange(n)                    # [layers, heads, n]
        adjacent = adjacent + (np.abs(offset) == 1).sum(-1)
        cls = cls + weights[..., 0].sum(-1)
        js = js + head_divergence(weights[:, None], start=0) * n
        rows += n
    return {"adjacent": (adjacent / rows).tolist(), "cls": (cls / rows).tolist(),
            "js": (js / rows).tolist(), "sentences": len(sentences)}


def _best(matrix, pick) -> tuple[float, tuple[int, int]]:
    index = np.unravel_index(pick(matrix), matrix.shape)
    return float(matrix[index]), tuple(int(i) for i in index)


def verdict(r):
    if "absent" in r:
        return {part: untestable(r["absent"]) for part in "abc"}
    adjacent, cls, js = (np.asarray(r[k]) for k in ("adjacent", "cls", "js"))
    a, (la, ha) = _best(adjacent, np.argmax)
    b, (lb, hb) = _best(cls, np.argmax)
    pairs = np.where(np.eye(js.shape[1], dtype=bool)[None], np.inf, js)
    c, (lc, h, g) = _best(pairs, np.argmin)
    count = lambda m, bound: int((m >= bound).sum())
    return {"a": holds(a >= ADJACENT, f"L{la}.H{ha}: {a:.3f} of queries at i +- 1 "
                       f"({count(adjacent, ADJACENT)} heads >= {ADJACENT})"),
            "b": holds(b >= CLS, f"L{lb}.H{hb}: mean [CLS] weight {b:.3f} "
                       f"({count(cls, CLS)} heads >= {CLS})"),
            "c": holds(c <= SIMILAR, f"closest pair L{lc}.H{h}/H{g}: JS {c:.4f} nats "
                       f"({int((pairs <= SIMILAR).sum()) // 2} pairs <= {SIMILAR})")}


def plot(r, out_dir):
    if "absent" in r:
        return []
    adjacent, cls, js = (np.asarray(r[k]) for k in ("adjacent", "cls", "js"))
    pairs = np.where(np.eye(js.shape[1], dtype=bool)[None], np.nan, js)
    fig, axes = subplots(1, 3, figsize=(15, 3.8), layout="constrained")
    panels = ((adjacent, "share of queries whose argmax is i - 1 or i + 1", "viridis"),
              (cls, "mean weight on [CLS]", "viridis"),
              (np.nanmin(pairs, axis=2), "JS to the layer's closest other head (nats)",
               "viridis_r"))
    for ax, (matrix, title, cmap) in zip(axes, panels):
        image = ax.imshow(matrix, cmap=cmap, aspect="auto")
        ax.set_xticks(range(matrix.shape[1]), [f"H{h}" for h in range(matrix.shape[1])],
                      fontsize=7)
        ax.set_yticks(range(matrix.shape[0]), [f"L{l}" for l in range(matrix.shape[0])])
        ax.set_title(title, fontsize=9)
        bright = image.norm(matrix) > 0.6                  # dark text on the bright cells
        if cmap.endswith("_r"):
            bright = ~bright
        for (l, h), value in np.ndenumerate(matrix):
            ax.text(h, l, f"{value:.2f}", ha="center", va="center", fontsize=6,
                    color="k" if bright[l, h] else "w")
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"PT2: heads of all-MiniLM-L6-v2 over {r['sentences']} sentences", fontsize=10)
    path = out_dir / "PT2.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(adjacent, cls, js):
    heads = lambda top: [[0.1, top], [0.2, 0.1]]
    return {"adjacent": heads(adjacent), "cls": heads(cls),
            "js": [[[0.0, js], [js, 0.0]], [[0.0, 0.3], [0.3, 0.0]]], "sentences": 200}


EXAMPLES = [
    (_example(0.8, 0.7, 0.02), {"a": "confirmed", "b": "confirmed", "c": "confirmed"}),
    (_example(0.3, 0.2, 0.2), {"a": "refuted", "b": "refuted", "c": "refuted"}),
    ({"absent": "all-MiniLM-L6-v2 is not installed"},
     {"a": "untestable", "b": "untestable", "c": "untestable"}),
]
