"""TR3: (a) entropy regularisation spreads attention; (b) a summed per-head weight-std term
diversifies the heads (activation 0.92, 0.03, ... -> 0.41, 0.39, ...); (c) a KL term pushes
the secondary weights below 0.01.

Measure: S-text, seeds 0 and 1, **300 steps** (cut from 600, as CLAIMS.md allows), with the
attention regularisers of ``attnjax.train.regularizers`` against no regulariser (the plain
300-step arm, DR1's S-text arm without dropout): (a) ``train.entropy_reg`` -0.01 and -0.003
(< 0 rewards entropy); (b) the article's ``loss + lambda sum_h std(w_h)``, lambda 0.01 and
0.1: attnjax's term is the mean over layers and heads of a head's weight std (over its
causally allowed weights), so ``train.weight_std_reg = 4 lambda`` (4 heads) gives lambda
times the sum over a layer's heads, averaged over the 2 layers; (c) ``loss + lambda KL(p ||
p^2 / sum p^2)`` (``train.sharpen_reg = lambda``, the target held fixed), lambda 0.01 and 0.1.
On the last checkpoint, over 64 validation windows and query rows i >= 8, per (layer, head):
``norm_entropy`` (``H_i / log(i + 1)``), ``sink_mass`` (``w_i0``), ``active_frac`` (the share
of causally allowed weights above 0.1), and over all heads the share of the non-top-1 allowed
weights (every allowed weight of a row except its largest) below 0.01.

Left open and resolved here: each coefficient is a regime, the criterion applied per seed
against the unregularised run of the same seed: (a) mean ``norm_entropy`` up >= 0.05 and mean
``sink_mass`` down; (b) the CV (population std / mean) of ``active_frac`` over the 8 heads
down by >= 30%; (c) >= 95% of the non-top-1 weights < 0.01.

Cost: 6 arms x 2 seeds at 300 steps, ~6 units (the baseline is DR1's).

    attnjax audit experiments/claims --workdir runs/claims --only TR3
"""

import numpy as np

from attnjax.analysis.capture import attention_weights, probe_batch
from attnjax.audit import over_regimes
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.audit.settings import with_seeds
from attnjax.ops.stats import row_entropy

ID = "TR3"
SOURCE = "000 §8.4; 002 §4.1, §5.3"
CLAIM = ("entropy regularisation spreads attention; a per-head weight-std term diversifies "
         "heads; a KL term pushes secondary weights below 0.01")
CRITERION = ("(a) norm_entropy up >= 0.05, sink_mass down; (b) CV of active_frac down >= 30%; "
             "(c) >= 95% of non-top-1 weights < 0.01")
S300 = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
HEADS = 4
PARTS = {"a": ("train.entropy_reg", {"-0.01": -0.01, "-0.003": -0.003}),
         "b": ("train.weight_std_reg", {"0.01": 0.01 * HEADS, "0.1": 0.1 * HEADS}),
         "c": ("train.sharpen_reg", {"0.01": 0.01, "0.1": 0.1})}
FIRST_ROW, WINDOWS = 8, 64
ENTROPY_UP, CV_DOWN, SMALL, SHARE = 0.05, 0.3, 0.01, 0.95


def arms() -> dict:
    """``{name: overrides}``: the baseline and one arm per part and coefficient."""
    out = {"none": dict(S300)}
    for part, (field, values) in PARTS.items():
        for label, value in values.items():
            out[f"{part} {label}"] = {field: value, **S300}
    return out


def get_sweep():
    return with_seeds(list(arms().values()))


def statistics(w: np.ndarray) -> dict:
    """Row statistics of ``w`` ``[layers, B, heads, T, T]`` over rows i >= FIRST_ROW."""
    T = w.shape[-1]
    rows = np.arange(FIRST_ROW, T)
    p = w[..., FIRST_ROW:, :]                                           # [L, B, N, T', T]
    allowed = np.arange(T)[None, :] <= rows[:, None]                    # [T', T]
    norm_entropy = np.asarray(row_entropy(p)) / np.log(rows + 1)
    active = ((p > 0.1) & allowed).sum(axis=(-2, -1)) / allowed.sum()  # [L, B, N]
    top = p.argmax(-1)[..., None] == np.arange(T)
    secondary = p[allowed & ~top]
    return {"norm_entropy": float(norm_entropy.mean()), "sink_mass": float(p[..., 0].mean()),
            "active_frac": active.mean(1).ravel().tolist(),
            "secondary_small": float((secondary < SMALL).mean())}


def measure(runs) -> dict:
    out = {}
    for name, arm in arms().items():
        for seed, trained in runs.by_seed(arm).items():
            config, params, _ = trained.dir.params("latest")
            w = attention_weights(config, params, probe_batch(config, batch_size=WINDOWS))
            out.setdefault(name, {})[str(seed)] = {**statistics(w), "loss": trained.loss()}
    return out


def _cv(x) -> float:
    x = np.asarray(x)
    return float(x.std() / x.mean())


def verdict(r):
    base = r["none"]
    seeds = list(base)
    regimes = lambda part: [f"{part} {label}" for label in PARTS[part][1]]
    per = lambda name, key, fmt: "/".join(fmt(r[name][s][key]) for s in seeds)
    a = over_regimes(
        {name: {s: r[name][s]["norm_entropy"] - base[s]["norm_entropy"] >= ENTROPY_UP
                and r[name][s]["sink_mass"] < base[s]["sink_mass"] for s in seeds}
         for name in regimes("a")},
        f"norm_entropy / sink_mass (seeds {'/'.join(seeds)}): " + "; ".join(
            f"{name}: {per(name, 'norm_entropy', '{:.3f}'.format)} / "
            f"{per(name, 'sink_mass', '{:.3f}'.format)}" for name in ["none", *regimes("a")]))
    cv = {name: {s: _cv(r[name][s]["active_frac"]) for s in seeds}
          for name in ["none", *regimes("b")]}
    b = over_regimes(
        {name: {s: cv[name][s] <= (1 - CV_DOWN) * cv["none"][s] for s in seeds}
         for name in regimes("b")},
        "CV of active_frac over heads: " + "; ".join(
            f"{name} " + "/".join(f"{cv[name][s]:.3f}" for s in seeds) for name in cv))
    c = over_regimes(
        {name: {s: r[name][s]["secondary_small"] >= SHARE for s in seeds}
         for name in regimes("c")},
        "share of non-top-1 weights < 0.01: " + "; ".join(
            f"{name} {per(name, 'secondary_small', '{:.3f}'.format)}"
            for name in ["none", *regimes("c")]))
    return {"a": a, "b": b, "c": c}


def _example(entropy_up: float, active: list, secondary: float) -> dict:
    def run(entropy, sink, active_frac, small):
        return {"norm_entropy": entropy, "sink_mass": sink, "active_frac": active_frac,
                "secondary_small": small, "loss": 2.4}
    out = {"none": run(0.5, 0.3, [0.9, 0.1, 0.1, 0.1, 0.5, 0.2, 0.1, 0.1], 0.7)}
    for name in arms():
        if name.startswith("a"):
            out[name] = run(0.5 + entropy_up, 0.2, [0.3] * 8, 0.7)
        elif name.startswith("b"):
            out[name] = run(0.5, 0.3, active, 0.7)
        elif name.startswith("c"):
            out[name] = run(0.4, 0.3, [0.3] * 8, secondary)
    return {name: dict.fromkeys("01", x) for name, x in out.items()}


EXAMPLES = [
    (_example(0.1, [0.4, 0.38, 0.42, 0.4, 0.41, 0.39, 0.43, 0.4], 0.97),
     dict.fromkeys("abc", "confirmed")),
    (_example(0.01, [0.9, 0.1, 0.1, 0.1, 0.5, 0.2, 0.1, 0.1], 0.8),
     dict.fromkeys("abc", "refuted")),
]
