"""HD8: (a) a healthy model's per-head fractions of attention weights above 0.1 are even, about
0.4 (0.42, 0.38, 0.45); (b) fractions like 0.92, 0.03, 0.02 mark an imbalanced model.

Measure: the plain S-text arm ``{}`` (600 steps) and HD9's twelve S-small runs (shared and
per-head probability dropout at 0.1, 0.3, 0.5, 300 steps), seeds 0 and 1, best checkpoints. On
the first 16 validation sequences of T bytes, T = 16, 32, 64 (the regimes; a causal model's
first T rows do not depend on what follows them), from ``analysis.capture.attention_weights``,
per layer and head: the article's ratio ``(w > 0.1).mean()`` over the full T x T matrix (the
zeros above the diagonal included), averaged over the sequences, and ``active_frac`` (the
fraction of causally allowed weights j <= i above 0.1) over rows i >= 8. Beside each, its
largest possible value: a row's weights sum to 1, so at most min(i + 1, 9) of them exceed 0.1;
the full-matrix ratio is at most sum_i min(i + 1, 9) / T^2 (0.42, 0.25, 0.13 at T = 16, 32, 64).

Healthy run: not diverged (no failure, no skipped update, final training loss <= ln 256 - 0.1,
ln 256 being the step-0 loss of attnjax's near-uniform initial predictions) and validation loss
within 0.1 of the best run of its setting (S-text; S-small), seeds pooled.

Left open and resolved here: the criterion is judged on the article's ratio (the quoted
figures are that ratio); ``active_frac`` is reported beside it. (a) per regime T, every head of
every healthy run in [0.3, 0.5]; (b) every head with ratio >= 0.9 is in an unhealthy run; no
such head anywhere is "not reached here" (untestable).

Cost: no runs of its own.

    attnjax audit experiments/claims --workdir runs/claims --only HD8
"""

import math

import numpy as np

from attnjax.analysis.capture import attention_weights, probe_batch
from attnjax.audit import holds, over_regimes, untestable
from attnjax.audit.settings import S_SMALL, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "HD8"
SOURCE = "002 §5.3"
CLAIM = "per-head fractions of weights > 0.1 should be even, ~0.4; 0.92, 0.03, 0.02 is imbalance"
CRITERION = ("(a) every head of every healthy run in [0.3, 0.5]; (b) heads >= 0.9 only in "
             "unhealthy runs")
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
ARMS = {"S-text": {"": {}}, "S-small": {
    f"{placement} {rate}": {**S_SMALL, "model.attention.dropout": placement,
                            "model.attention.dropout_rate": rate, **STEPS}
    for placement in ("probs_shared", "probs_per_head") for rate in (0.1, 0.3, 0.5)}}
LENGTHS, PROBES, FIRST_ROW = (16, 32, 64), 16, 8
THRESHOLD, EVEN, IMBALANCED, HEALTHY = 0.1, (0.3, 0.5), 0.9, 0.1


def get_sweep():
    return with_seeds([arm for setting in ARMS.values() for arm in setting.values()])


def largest_possible(T: int, first: int = FIRST_ROW) -> dict:
    """The largest full-matrix ratio and ``active_frac`` (rows >= ``first``) any causal
    attention can have at length ``T``: row i has at most min(i + 1, 9) weights above 0.1."""
    above = np.minimum(np.arange(1, T + 1), math.ceil(1 / THRESHOLD) - 1)
    return {"ratio": float(above.sum() / T**2),
            "active_frac": float(above[first:].sum() / np.arange(first + 1, T + 1).sum())}


def fractions(weights: np.ndarray, first: int = FIRST_ROW) -> dict:
    """``[layers, heads]``: the full-matrix ratio and ``active_frac`` over rows >= ``first``."""
    T = weights.shape[-1]
    above = weights > THRESHOLD
    allowed = np.tril(np.ones((T, T), bool))[first:]
    return {"ratio": above.mean(axis=(1, 3, 4)),
            "active_frac": (above[..., first:, :] & allowed).sum(axis=(3, 4)).mean(1)
            / allowed.sum()}


def diverged(trained) -> bool:
    """The conventions' divergence: a failure, a skipped update, a non-finite final training
    loss or one above the step-0 loss (ln vocab) - 0.1."""
    summary, vocab = trained.dir.summary(), trained.config.model.vocab_size
    final = summary.get("train_loss")
    return bool(trained.failed or summary["skipped_updates"]
                or final is None or not final <= math.log(vocab) - 0.1)


def measure(runs) -> dict:
    out = {"largest": {str(T): largest_possible(T) for T in LENGTHS}, "runs": {}}
    for setting, arms in ARMS.items():
        for label, overrides in arms.items():
            for seed, trained in runs.by_seed(overrides).items():
                config, params, _ = trained.dir.params("best")
                row = {"setting": setting, "seed": seed, "loss": trained.loss(),
                       "diverged": diverged(trained), "by_length": {}}
                for T in LENGTHS:
                    tokens = probe_batch(config, batch_size=PROBES, length=T)
                    f = fractions(attention_weights(config, params, tokens))
                    row["by_length"][str(T)] = {k: v.tolist() for k, v in f.items()}
                out["runs"][f"{setting} {label} seed {seed}".replace("  ", " ")] = row
    return out


def healthy(runs: dict) -> dict:
    """``{run: bool}``: not diverged and loss within 0.1 of its setting's best."""
    best = {}
    for row in runs.values():
        best[row["setting"]] = min(best.get(row["setting"], math.inf), row["loss"])
    return {name: not row["diverged"] and row["loss"] <= best[row["setting"]] + HEALTHY
            for name, row in runs.items()}


def verdict(r):
    runs, largest = r["runs"], r["largest"]
    ok = healthy(runs)
    heads = lambda name, T, key="ratio": [x for layer in runs[name]["by_length"][T][key]
                                          for x in layer]
    even, text = {}, []
    for T in largest:
        even[f"T={T}"] = {}
        for name in runs:
            if ok[name]:
                seed = runs[name]["seed"]
                inside = all(EVEN[0] <= x <= EVEN[1] for x in heads(name, T))
                even[f"T={T}"][seed] = even[f"T={T}"].get(seed, True) and inside
        kept = [x for name in runs if ok[name] for x in heads(name, T)]
        active = [x for name in runs if ok[name] for x in heads(name, T, "active_frac")]
        text.append(f"T={T}: ratio in [{min(kept):.3f}, {max(kept):.3f}] (largest possible "
                    f"{largest[T]['ratio']:.3f}), active_frac in [{min(active):.3f}, "
                    f"{max(active):.3f}] (largest {largest[T]['active_frac']:.3f})")
    summary = (f"{sum(ok.values())} of {len(ok)} runs healthy; " + "; ".join(text))
    out = {"a": over_regimes(even, f"healthy heads' ratio in [{EVEN[0]}, {EVEN[1]}]? " + summary)}
    high = [(name, T) for name in runs for T in largest
            if any(x >= IMBALANCED for x in heads(name, T))]
    if not high:
        top = max(x for name in runs for T in largest for x in heads(name, T))
        out["b"] = untestable(f"not reached here: no head of any run has ratio >= {IMBALANCED} "
                              f"(largest {top:.3f}; largest possible at T >= 16: "
                              f"{largest[min(largest, key=int)]['ratio']:.3f})")
    else:
        bad = sorted({name for name, _ in high if ok[name]})
        out["b"] = holds(not bad, f"heads >= {IMBALANCED} in {len(high)} (run, T) cases; in "
                         f"healthy runs: {', '.join(bad) or 'none'}")
    return out


def _example(ratio: float, high_in: str | None = None) -> dict:
    by_length = lambda x: {str(T): {"ratio": [[x] * 4] * 2, "active_frac": [[x] * 4] * 2}
                           for T in LENGTHS}
    runs = {f"S-text seed {s}": {"setting": "S-text", "seed": int(s), "loss": 1.9,
                                 "diverged": False, "by_length": by_length(ratio)} for s in "01"}
    runs.update({f"S-small x seed {s}": {
        "setting": "S-small", "seed": int(s), "loss": 2.5 if high_in == "healthy" else 3.0,
        "diverged": False, "by_length": by_length(0.95 if high_in else ratio)} for s in "01"})
    runs.update({f"S-small y seed {s}": {"setting": "S-small", "seed": int(s), "loss": 2.5,
                                         "diverged": False, "by_length": by_length(ratio)}
                 for s in "01"})
    return {"largest": {str(T): largest_possible(T) for T in LENGTHS}, "runs": runs}


EXAMPLES = [
    (_example(0.4, "unhealthy"), {"a": "confirmed", "b": "confirmed"}),
    (_example(0.1, "healthy"), {"a": "refuted", "b": "refuted"}),
    (_example(0.1), {"a": "refuted", "b": "untestable"}),
]
