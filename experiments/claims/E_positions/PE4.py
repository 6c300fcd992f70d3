"""PE4: a healthy position encoding gives cosine similarity > 0.9 between positions 0 and 10
(the article's code comment: > 0.8) and > 0.6 between 0 and 100 (comment: > 0.5); below 0.2
at 100 means the encoding has failed.

Measure: the PE-sweep runs at L = 128 (S-128, 600 steps, seeds 0 and 1): ``pos_sim@10`` and
``pos_sim@100`` (``attnjax.analysis.diagnostics.position_similarity`` on the best
checkpoint) of learned, sinusoidal, rope and rope base 1000. A run works if its loss is within
0.1 of the best kind's at its seed (best over all six PE-sweep kinds at L = 128) and
loss(4L) - loss(L) <= 0.3.

Left open and resolved here: ``pos_sim`` is ``[layers, heads]``; for these four encodings it
is one number repeated (an embedding table or a rotation shared by every head), so its mean
is taken. (a) and (a') need at least one working run and (b) at least one run below 0.2 at
100, else the part is untestable (not reached here).

Cost: the 12 PE-sweep runs at L = 128 (shared with PE1, PE6-PE13), ~12 units.

    attnjax audit experiments/claims --workdir runs/claims --only PE4
"""

import numpy as np

from attnjax.analysis.diagnostics import position_similarity
from attnjax.audit import holds, untestable
from attnjax.audit.settings import PE_KINDS, pe_run, pe_sweep
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "PE4"
SOURCE = "002 §5.2"
CLAIM = ("healthy encodings: cos(pos 0, pos 10) > 0.9 (code: 0.8), cos(0, 100) > 0.6 (code: "
         "0.5); < 0.2 at 100 means failure")
CRITERION = ("(a) every working run passes 0.9/0.6; (a') 0.8/0.5; (b) no run < 0.2 at 100 "
             "works")
L = 128
KINDS = ("learned", "sinusoidal", "rope", "rope_base_1000")
THRESHOLDS = {"a": (0.9, 0.6), "a'": (0.8, 0.5)}
FAILED = 0.2
NEAR_BEST, LONG_GAP = 0.1, 0.3


def get_sweep():
    return pe_sweep(lengths=(L,))


def measure(runs) -> dict:
    best = {}
    for kind in PE_KINDS:
        for seed, trained in runs.by_seed(pe_run(L, kind)).items():
            best[str(seed)] = min(best.get(str(seed), np.inf), trained.loss())
    out = {"best": best, "runs": {}}
    for kind in KINDS:
        for seed, trained in runs.by_seed(pe_run(L, kind)).items():
            config, params, _ = trained.dir.params("best")
            out["runs"][f"{kind}/{seed}"] = {
                "sim10": float(np.mean(position_similarity(config, params, 10))),
                "sim100": float(np.mean(position_similarity(config, params, 100))),
                "loss": trained.loss(), "loss_4L": trained.loss(4 * L)}
    return out


def works(r: dict, best: float) -> bool:
    return r["loss"] - best <= NEAR_BEST and r["loss_4L"] - r["loss"] <= LONG_GAP


def verdict(results):
    runs = results["runs"]
    working = {name for name, r in runs.items()
               if works(r, results["best"][name.split("/")[1]])}
    table = "; ".join(f"{name}{' (works)' if name in working else ''}: sim@10 {r['sim10']:.3f},"
                      f" sim@100 {r['sim100']:.3f}, loss {r['loss']:.3f}, 4L-L "
                      f"{r['loss_4L'] - r['loss']:+.3f}" for name, r in runs.items())
    best = "/".join(f"{v:.3f}" for v in results["best"].values())
    out = {}
    for part, (at10, at100) in THRESHOLDS.items():
        if not working:
            out[part] = untestable(f"not reached here: no run works (best loss {best}); {table}")
            continue
        failing = [n for n in working
                   if not (runs[n]["sim10"] > at10 and runs[n]["sim100"] > at100)]
        out[part] = holds(not failing, f"working runs below {at10}/{at100}: "
                          f"{', '.join(sorted(failing)) or 'none'}; {table}")
    low = [n for n, r in runs.items() if r["sim100"] < FAILED]
    if not low:
        out["b"] = untestable(f"not reached here: no run has sim@100 < {FAILED}; {table}")
    else:
        bad = sorted(set(low) & working)
        out["b"] = holds(not bad, f"runs below {FAILED} at 100: {', '.join(sorted(low))}; of them "
                         f"working: {', '.join(bad) or 'none'}; best loss {best}")
    return out


def _run(sim10, sim100, loss=2.0, loss_4l=2.1):
    return {"sim10": sim10, "sim100": sim100, "loss": loss, "loss_4L": loss_4l}


EXAMPLES = [
    ({"best": {"0": 2.0, "1": 2.0},
      "runs": {"rope/0": _run(0.95, 0.7), "rope/1": _run(0.95, 0.7),
               "learned/0": _run(0.5, 0.1, loss_4l=3.0), "learned/1": _run(0.5, 0.1, 2.5)}},
     {"a": "confirmed", "a'": "confirmed", "b": "confirmed"}),
    ({"best": {"0": 2.0, "1": 2.0},
      "runs": {"rope/0": _run(0.85, 0.55), "rope/1": _run(0.95, 0.7),
               "learned/0": _run(0.5, 0.1), "learned/1": _run(0.5, 0.1, 2.5)}},
     {"a": "refuted", "a'": "refuted", "b": "refuted"}),
    ({"best": {"0": 2.0, "1": 2.0},
      "runs": {"rope/0": _run(0.85, 0.55, loss=2.5), "rope/1": _run(0.95, 0.7, loss=2.5)}},
     {"a": "untestable", "a'": "untestable", "b": "untestable"}),
]
