"""HD4: heads specialise: some attend to the neighbouring (previous) token, some to the first
token, and some are alike and redundant.

Measure: the S-wide 8-head arm of HD1 (width 128, 4 layers, 8 heads of head_dim 16), seeds 0
and 1, **300 steps** (CLAIMS.md asks 1000; cut to 300 for the budget and to share the arm
with HD1, HD6, HD7, CX6), best checkpoint. On the first 16 validation sequences of 64 bytes
(``analysis.capture.probe_batch``), from attnjax's attention weights
(``analysis.capture.attention_weights``), over query rows i >= 8 (the conventions):
``prev_token`` = mean p_{i,i-1}, ``sink_mass`` = mean p_{i,0}, and the same-layer pairwise JS
(``analysis.head_similarity.head_js``, rows i >= 8); the knockout loss change of every head
(``analysis.heads.knockout_losses``, the run's validation batches).

Criterion per seed, every seed: (a) max over heads of ``prev_token`` >= 0.5; (b) max
``sink_mass`` >= 0.5; (c) some knockout change < 0.005 or a same-layer pair with JS < 0.05.

Cost: no runs of its own (the 8-head S-wide arm is HD1's).

    attnjax audit experiments/claims --workdir runs/claims --only HD4
"""

import numpy as np

from attnjax.analysis.capture import attention_weights, probe_batch
from attnjax.analysis.figures import subplots
from attnjax.analysis.head_similarity import head_js
from attnjax.analysis.heads import knockout_losses
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import S_WIDE, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "HD4"
SOURCE = "000 §4.3"
CLAIM = "some heads attend to the neighbour token, some to the first, some are alike/redundant"
CRITERION = ("(a) some prev_token >= 0.5; (b) some sink_mass >= 0.5; (c) some knockout change "
             "< 0.005 or a same-layer pair with JS < 0.05")
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
WIDE8 = {**S_WIDE, "model.attention.num_heads": 8, **STEPS}
PROBES, FIRST_ROW = 16, 8
PREV, SINK, KNOCKOUT, JS = 0.5, 0.5, 0.005, 0.05


def get_sweep():
    return with_seeds([WIDE8])


def row_statistics(weights: np.ndarray, first: int = FIRST_ROW) -> dict:
    """``prev_token`` and ``sink_mass`` ``[layers, heads]`` over query rows i >= ``first`` of
    weights ``[layers, B, heads, T, T]``: the means of p_{i,i-1} and p_{i,0}."""
    previous = np.diagonal(weights, offset=-1, axis1=-2, axis2=-1)[..., first - 1:]
    return {"prev_token": previous.mean(axis=(1, 3)),
            "sink_mass": weights[..., first:, 0].mean(axis=(1, 3))}


def measure(runs) -> dict:
    out = {}
    for seed, trained in runs.by_seed(WIDE8).items():
        config, params, step = trained.dir.params("best")
        tokens = probe_batch(config, batch_size=PROBES)
        stats = row_statistics(attention_weights(config, params, tokens))
        js = head_js(config, params, tokens, start=FIRST_ROW)
        pairs = np.triu_indices(js.shape[1], k=1)
        out[str(seed)] = {"step": step, **{k: v.tolist() for k, v in stats.items()},
                          "knockout": knockout_losses(config, params).tolist(),
                          "min_js_by_layer": [float(m[pairs].min()) for m in js],
                          "js": js.tolist()}
    return out


def _summary(r) -> dict:
    return {"prev": float(np.max(r["prev_token"])), "sink": float(np.max(r["sink_mass"])),
            "knockout": float(np.min(r["knockout"])), "js": float(min(r["min_js_by_layer"]))}


def verdict(r):
    top = {s: _summary(x) for s, x in r.items()}

    def part(test, label):
        ok, note = over_seeds({s: test(t) for s, t in top.items()})
        return holds(ok, "; ".join(filter(None, [
            "; ".join(f"seed {s}: {label(t)}" for s, t in top.items()), note])))

    return {
        "a": part(lambda t: t["prev"] >= PREV, lambda t: f"max prev_token {t['prev']:.3f} "
                  f"(>= {PREV}?)"),
        "b": part(lambda t: t["sink"] >= SINK, lambda t: f"max sink_mass {t['sink']:.3f} "
                  f"(>= {SINK}?)"),
        "c": part(lambda t: t["knockout"] < KNOCKOUT or t["js"] < JS,
                  lambda t: f"min knockout change {t['knockout']:+.4f} (< {KNOCKOUT}?), "
                  f"closest same-layer pair JS {t['js']:.3f} (< {JS}?)"),
    }


def plot(results, out_dir):
    seed = min(results)
    r = results[seed]
    panels = [("prev_token", r["prev_token"], (0.0, 1.0), "{:.2f}"),
              ("sink_mass", r["sink_mass"], (0.0, 1.0), "{:.2f}"),
              ("knockout loss change (nats)", r["knockout"], (None, None), "{:.3f}")]
    fig, axes = subplots(1, 3, figsize=(13, 3.6), layout="constrained")
    for ax, (title, values, (low, high), form) in zip(axes, panels):
        values = np.asarray(values)
        image = ax.imshow(values, cmap="viridis", aspect="auto", vmin=low, vmax=high)
        middle = np.mean(image.get_clim())
        for (layer, head), value in np.ndenumerate(values):
            ax.text(head, layer, form.format(value), ha="center", va="center", fontsize=7,
                    color="white" if value < middle else "black")
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(values.shape[0]))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"HD4: S-wide 8 heads, seed {seed}, step {r['step']} (rows i >= {FIRST_ROW})",
                 fontsize=10)
    path = out_dir / "HD4-heads.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(prev, sink, knockout, js):
    heads = lambda x: [[x] + [0.1] * 7] * 4
    run = {"step": 300, "prev_token": heads(prev), "sink_mass": heads(sink),
           "knockout": heads(knockout), "min_js_by_layer": [js, 0.3, 0.3, 0.3], "js": []}
    return {"0": run, "1": run}


EXAMPLES = [
    (_example(0.7, 0.6, 0.001, 0.2), dict.fromkeys("abc", "confirmed")),
    (_example(0.3, 0.2, 0.05, 0.2), dict.fromkeys("abc", "refuted")),
    (_example(0.3, 0.2, 0.05, 0.01), {"a": "refuted", "b": "refuted", "c": "confirmed"}),
]
