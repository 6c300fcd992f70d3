"""PT3: attention weights are not the whole reason for a model's output.

Measure: P-MiniLM (``attnjax.audit.pretrained``), 100 sentences each run alone. Per sentence,
over its content tokens (all but [CLS] and [SEP]): the Spearman correlation between the
attention the [CLS] query pays each token (the last layer's weights, mean over its heads) and
the change of the sentence embedding (the mean-pooled last hidden states, as the model is
used) when that token alone is replaced by [MASK], ``1 - cos``
(``attnjax.analysis.occlusion.embedding_occlusion``).

Criterion: the median rho over the sentences < 0.5 (attention ranks the tokens differently
from what moves the output). Untestable when the model is not installed.

    make minilm && attnjax audit experiments/claims --workdir runs/claims --only PT3
"""

import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.analysis.occlusion import draw_embedding_occlusion, embedding_occlusion
from attnjax.audit import holds, untestable
from attnjax.audit.pretrained import absent, load_minilm, sentence_attention
from attnjax.audit.pretrained import fingerprint as inputs  # noqa: F401  (the model's presence)
from attnjax.ops.stats import spearman

ID = "PT3"
SOURCE = "000 §4.3"
CLAIM = "attention weights are not the whole reason for a model's output"
CRITERION = ("P-MiniLM, 100 sentences: median Spearman rho between the [CLS] query's "
             "last-layer attention and the embedding change when the token is masked < 0.5")
SENTENCES, SPLIT = 100, 0.5
TEST_SIZE = {"SENTENCES": 4}


def measure() -> dict:
    if missing := absent():
        return missing
    config, params, tokenizer, sentences = load_minilm(SENTENCES)
    mask = tokenizer.token_id("[MASK]")
    rho, example = [], None
    for ids, weights in zip(sentences, sentence_attention(config, params, sentences)):
        attention = weights[-1, :, 0, 1:-1].mean(0)               # [CLS] row, content keys
        drift = embedding_occlusion(config, params, ids[None], mask)[0, 1:-1]
        rho.append(spearman(attention, drift))
        if example is None and ids.size >= 12:
            example = {"tokens": tokenizer.labels(ids[1:-1]), "attention": attention.tolist(),
                       "drift": drift.tolist(), "rho": rho[-1]}
    return {"rho": rho, "example": example}


def verdict(r):
    if "absent" in r:
        return untestable(r["absent"])
    rho = np.asarray(r["rho"], np.float64)
    rho = rho[np.isfinite(rho)]
    median = float(np.median(rho))
    quartiles = np.percentile(rho, [25, 75])
    return holds(median < SPLIT, f"median Spearman rho {median:.3f} over {rho.size} sentences "
                 f"(quartiles {quartiles[0]:.2f}, {quartiles[1]:.2f}; "
                 f"{int((rho >= SPLIT).sum())} sentences >= {SPLIT})")


def plot(r, out_dir):
    if "absent" in r:
        return []
    rho = np.asarray(r["rho"], np.float64)
    rho = rho[np.isfinite(rho)]
    example = r["example"]
    fig, axes = subplots(1, 3, figsize=(15, 3.8), layout="constrained",
                         width_ratios=(1.0, 1.6, 1.6))
    axes[0].hist(rho, bins=np.linspace(-1, 1, 21), color="tab:blue")
    axes[0].axvline(np.median(rho), color="k", label=f"median {np.median(rho):.2f}")
    axes[0].axvline(SPLIT, color="tab:red", linestyle=":", label=f"criterion {SPLIT}")
    axes[0].set_xlabel("Spearman rho (per sentence)")
    axes[0].set_ylabel("sentences")
    axes[0].legend(fontsize=8)
    draw_embedding_occlusion(axes[1:], example["tokens"], example["attention"],
                             example["drift"])
    axes[1].set_title(f"one sentence: rho = {example['rho']:.2f}", fontsize=9, loc="left")
    fig.suptitle(f"PT3: all-MiniLM-L6-v2, {rho.size} sentences: attention vs occlusion",
                 fontsize=10)
    path = out_dir / "PT3.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(median):
    return {"rho": [median - 0.2, median, median + 0.1], "example": None}


EXAMPLES = [
    (_example(0.2), "confirmed"),
    (_example(0.7), "refuted"),
    ({"absent": "all-MiniLM-L6-v2 is not installed"}, "untestable"),
]
