"""PT4: a pretrained model pours a large share of its attention on one fixed token that carries
little meaning; in a decoder without special tokens, that token is the first one.

Measure: P-SmolLM (``attnjax.audit.smollm``), 100 windows of 64 tokens of the standard
library's docstrings, each run alone with no BOS. Per layer l, over every head, window and
query i in 8..63: the mean attention weight on position 0, against the uniform share, the mean
of 1/(i + 1) over those queries (what a query spreading its weight evenly over the i + 1 keys
it sees puts there).

Criterion: at least half of the 30 layers put >= 10x the uniform share on position 0.
Untestable when the model is not installed.

    make smollm && attnjax audit experiments/claims --workdir runs/claims --only PT4
"""

import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.audit import holds, untestable
from attnjax.audit.smollm import (FIRST_QUERY, absent, documentation_windows, load_smollm,
                                  window_attention)
from attnjax.audit.smollm import fingerprint as inputs  # noqa: F401  (the model's presence)

ID = "PT4"
SOURCE = "000 §2.3, §8.4"
CLAIM = ("a pretrained model pours a large share of its attention on one fixed, meaningless "
         "token; in a decoder without special tokens, the first one")
CRITERION = ("P-SmolLM, 100 windows of 64 tokens: at least half of the 30 layers put >= 10x "
             "the uniform share (mean of 1/(i+1), queries 8-63) on position 0")
WINDOWS, LENGTH, FACTOR = 100, 64, 10.0
TEST_SIZE = {"WINDOWS": 2}


def measure() -> dict:
    if missing := absent():
        return missing
    model, params, tokenizer = load_smollm()
    windows = documentation_windows(tokenizer, WINDOWS, LENGTH)
    first = 0.0
    for weights in window_attention(model, params, windows):     # [layers, B, heads, T, T]
        first = first + weights[:, :, :, FIRST_QUERY:, 0].sum((1, 2, 3))
    rows = WINDOWS * model.attention.num_heads * (LENGTH - FIRST_QUERY)
    uniform = float(np.mean(1.0 / (np.arange(FIRST_QUERY, LENGTH) + 1)))
    return {"first": (first / rows).tolist(), "uniform": uniform, "windows": WINDOWS,
            "length": LENGTH}


def verdict(r):
    if "absent" in r:
        return untestable(r["absent"])
    first = np.asarray(r["first"])
    ratio = first / r["uniform"]
    layers = int((ratio >= FACTOR).sum())
    text = (f"{r['windows']} windows of {r['length']}: {layers} of {first.size} layers put >= "
            f"{FACTOR:g}x the uniform share {r['uniform']:.4f} on position 0; per layer "
            + ", ".join(f"L{l} {w:.2f}" for l, w in enumerate(first))
            + f" (largest {ratio.max():.1f}x, median {np.median(ratio):.1f}x)")
    return holds(2 * layers >= first.size, text)


def plot(r, out_dir):
    if "absent" in r:
        return []
    first = np.asarray(r["first"])
    layers = np.arange(first.size)
    fig, ax = subplots(figsize=(8.5, 3.8))
    ax.bar(layers, first, color=np.where(first >= FACTOR * r["uniform"], "tab:blue", "0.6"))
    ax.axhline(r["uniform"], color="0.3", linewidth=1, label="uniform share, mean 1/(i+1)")
    ax.axhline(FACTOR * r["uniform"], color="tab:red", linewidth=1, linestyle=":",
               label=f"{FACTOR:g}x uniform (criterion)")
    ax.set_xticks(layers, [f"L{l}" for l in layers], fontsize=7, rotation=90)
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean weight on position 0")
    ax.set_title(f"PT4: SmolLM2-135M-Instruct, {r['windows']} windows of {r['length']} tokens, "
                 f"queries {FIRST_QUERY}-{r['length'] - 1}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path = out_dir / "PT4.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(high):
    return {"first": [0.5] * high + [0.1] * (30 - high), "uniform": 0.03, "windows": 100,
            "length": 64}


EXAMPLES = [
    (_example(20), "confirmed"),
    (_example(10), "refuted"),
    ({"absent": "SmolLM2-135M-Instruct is not installed"}, "untestable"),
]
