"""TR2: a token that is always present at a fixed position (like [CLS] or [SEP]) draws very
high attention.

Measure: S-wide (``model.d_model=128``, ``model.num_layers=4``), seeds 0 and 1, **300 steps**
(cut from 1000, as CLAIMS.md allows), with a BOS byte before every window
(``data.bos_token=0``: byte 0 never occurs in the built-in corpus, so it is a token of its
own, input only) and without. On the last checkpoint, over 64 validation windows of the run's
own data (``attnjax.analysis.capture.probe_batch``; position 0 is the BOS byte in the BOS
runs, the window's first byte otherwise): the weight on position 0 per (layer, head), the
mean over windows and query rows i >= 16 of ``w_i0`` (``attention_weights``).

Left open and resolved here: layers are numbered from 0 as attnjax does (``L0``-``L3``), so
"every layer from 1 on" is layers 1-3 (layer 0, the first, reported); per such layer and
seed, the criterion holds when the largest head weight with BOS is >= 0.3 and the layer's
head mean with BOS exceeds the no-BOS run's (same seed, same layer) by >= 0.1.

Cost: 4 S-wide runs at 300 steps in 2 vmapped programs, ~12 units.

    attnjax audit experiments/claims --workdir runs/claims --only TR2
"""

import numpy as np

from attnjax.analysis.capture import attention_weights, probe_batch
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import S_WIDE, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "TR2"
SOURCE = "000 §8.4"
CLAIM = "tokens always present at a fixed position (like [CLS]/[SEP]) draw very high attention"
CRITERION = ("with BOS every layer from 1 on has a head >= 0.3 and the head mean exceeds "
             "no-BOS by >= 0.1")
S300 = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
ARMS = {"bos": {**S_WIDE, "data.bos_token": 0, **S300}, "plain": {**S_WIDE, **S300}}
FIRST_ROW, WINDOWS = 16, 64
HEAD, GAIN = 0.3, 0.1


def get_sweep():
    return with_seeds(list(ARMS.values()))


def first_position_weight(config, params) -> list:
    """``[layers][heads]``: mean over windows and rows i >= 16 of the weight on key 0."""
    tokens = probe_batch(config, batch_size=WINDOWS)
    w = attention_weights(config, params, tokens)             # [layers, B, heads, T, T]
    return w[:, :, :, FIRST_ROW:, 0].mean(axis=(1, 3)).tolist()


def measure(runs) -> dict:
    out = {}
    for name, arm in ARMS.items():
        for seed, trained in runs.by_seed(arm).items():
            config, params, _ = trained.dir.params("latest")
            out.setdefault(name, {})[str(seed)] = first_position_weight(config, params)
    return out


def verdict(r):
    bos, plain = r["bos"], r["plain"]
    layers = range(1, len(next(iter(bos.values()))))

    def seed_holds(s):
        return all(max(bos[s][l]) >= HEAD and np.mean(bos[s][l]) - np.mean(plain[s][l]) >= GAIN
                   for l in layers)

    ok, note = over_seeds({s: seed_holds(s) for s in bos})
    show = "; ".join(
        f"seed {s}: " + ", ".join(
            f"L{l} max {max(bos[s][l]):.3f} mean {np.mean(bos[s][l]):.3f} vs no-BOS "
            f"{np.mean(plain[s][l]):.3f}" for l in range(len(bos[s]))) for s in bos)
    return holds(ok, "; ".join(filter(None, [f"weight on position 0 (rows i >= {FIRST_ROW}), "
                                             f"with BOS: {show}", note])))


def plot(r, out_dir):
    from attnjax.analysis.figures import subplots
    seeds = list(r["bos"])
    fig, axes = subplots(1, len(seeds), figsize=(4.2 * len(seeds), 3.4), layout="constrained",
                         squeeze=False)
    for ax, s in zip(axes[0], seeds):
        for name, color in (("bos", "tab:red"), ("plain", "tab:blue")):
            w = np.asarray(r[name][s])
            layer = np.repeat(np.arange(w.shape[0]), w.shape[1])
            jitter = 0.15 if name == "bos" else -0.15
            ax.scatter(layer + jitter, w.ravel(), color=color, s=18,
                       label="with BOS" if name == "bos" else "without BOS")
            ax.plot(np.arange(w.shape[0]) + jitter, w.mean(1), color=color, lw=1)
        ax.axhline(HEAD, color="0.4", ls="--", lw=0.8, label=f"{HEAD} (criterion)")
        ax.set(xlabel="layer", ylabel="weight on position 0", title=f"seed {s}", ylim=(0, 1),
               xticks=range(len(r["bos"][s])))
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"TR2: mean weight on position 0, rows i >= {FIRST_ROW} (dots: heads, "
                 "lines: head mean)", fontsize=10)
    path = out_dir / "TR2-first-position.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(bos_top: float, bos_rest: float) -> dict:
    layer = lambda top, rest: [top, rest, rest, rest]
    return {"bos": {s: [layer(0.1, 0.05)] + [layer(bos_top, bos_rest)] * 3 for s in "01"},
            "plain": {s: [layer(0.1, 0.05)] * 4 for s in "01"}}


EXAMPLES = [
    (_example(0.8, 0.2), "confirmed"),
    (_example(0.25, 0.2), "refuted"),
    (_example(0.35, 0.05), "refuted"),
]
