"""PT1: BERT-class models put very high attention on [CLS] and [SEP] (Clark et al. 2019).

Measure: P-MiniLM (``attnjax.audit.pretrained``), 200 sentences each run alone as ``[CLS] ...
[SEP]``. Per layer l, over every query row of every head and sentence: the mean attention
weight on the [CLS] and [SEP] positions together, against the mean of their uniform share
2/n (n the sentence's tokens); [CLS] and [SEP] shown apart too.

Criterion: every layer from L1 on (the second of six; L0, which reads token identities, is
exempt) puts >= 3x the uniform share on them. Untestable when the model is not installed.

    make minilm && attnjax audit experiments/claims --workdir runs/claims --only PT1
"""

import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.audit import holds, untestable
from attnjax.audit.pretrained import absent, load_minilm, sentence_attention
from attnjax.audit.pretrained import fingerprint as inputs  # noqa: F401  (the model's presence)

ID = "PT1"
SOURCE = "000 §8.4; Clark et al. 2019"
CLAIM = "BERT-class models put very high attention on [CLS] and [SEP]"
CRITERION = ("P-MiniLM: every layer from L1 on puts >= 3x the uniform share 2/n on [CLS] and "
             "[SEP] together")
SENTENCES, FACTOR, FIRST_LAYER = 200, 3.0, 1
TEST_SIZE = {"SENTENCES": 4}


def measure() -> dict:
    if missing := absent():
        return missing
    config, params, _, sentences = load_minilm(SENTENCES)
    cls, sep, uniform, rows = 0.0, 0.0, 0.0, 0
    for ids, weights in zip(sentences, sentence_attention(config, params, sentences)):
        heads, n = weights.shape[1], ids.size        # weights [layers, heads, n, n]
        cls = cls + weights[..., 0].sum((1, 2))
        sep = sep + weights[..., n - 1].sum((1, 2))
        uniform += heads * n * (2.0 / n)               # each of the heads x n rows: 2/n
        rows += heads * n
    return {"cls": (cls / rows).tolist(), "sep": (sep / rows).tolist(),
            "uniform": uniform / rows, "sentences": len(sentences)}


def verdict(r):
    if "absent" in r:
        return untestable(r["absent"])
    share = np.add(r["cls"], r["sep"])
    ratio = share / r["uniform"]
    text = (f"{r['sentences']} sentences; [CLS]+[SEP] weight per layer "
            + ", ".join(f"L{l} {s:.2f} ({x:.1f}x)" for l, (s, x) in enumerate(zip(share, ratio)))
            + f" against a uniform share of {r['uniform']:.3f}")
    return holds(bool((ratio[FIRST_LAYER:] >= FACTOR).all()), text)


def plot(r, out_dir):
    if "absent" in r:
        return []
    layers = np.arange(len(r["cls"]))
    fig, ax = subplots(figsize=(6.5, 3.8))
    ax.plot(layers, np.add(r["cls"], r["sep"]), marker="o", label="[CLS] + [SEP]")
    ax.plot(layers, r["cls"], marker=".", linestyle="--", label="[CLS]")
    ax.plot(layers, r["sep"], marker=".", linestyle="--", label="[SEP]")
    ax.axhline(r["uniform"], color="0.4", linewidth=1, label="uniform share 2/n")
    ax.axhline(FACTOR * r["uniform"], color="tab:red", linewidth=1, linestyle=":",
               label=f"{FACTOR:g}x uniform (criterion)")
    ax.set_xticks(layers, [f"L{l}" for l in layers])
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention weight")
    ax.set_title(f"PT1: all-MiniLM-L6-v2, {r['sentences']} sentences", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out_dir / "PT1.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(share):
    per_layer = [share / 2] * 6
    return {"cls": per_layer, "sep": per_layer, "uniform": 0.1, "sentences": 200}


EXAMPLES = [
    (_example(0.5), "confirmed"),
    ({**_example(0.5), "cls": [0.25, 0.25, 0.05, 0.25, 0.25, 0.25]}, "refuted"),
    ({"absent": "all-MiniLM-L6-v2 is not installed"}, "untestable"),
]
