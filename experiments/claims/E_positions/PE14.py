"""PE14: encoding overlapping segments is a crude but effective fix for over-long inputs;
segments without overlap lose context.

Measure: the PE-sweep checkpoints at L = 32 (S-text at L = 32, 600 steps) of learned,
sinusoidal and rope, seeds 0 and 1, on inputs of 4L = 128 tokens, the same targets each way
(4 validation batches of 32, ``attnjax.train.evaluate``): (whole) the ordinary evaluation at
4L (the run's summary; learned interpolated); (disjoint) strided evaluation by windows of L
tokens every L (``window=L, stride=L``, each window scoring all its targets); (overlap)
windows of L every L/2, each window after the first scoring its last L/2 targets
(``stride=L/2, score_last=L/2``, as ``attnjax eval --stride 16 --score-last 16``). Each
window is encoded on its own at positions 0..L-1.

Left open and resolved here: (b)'s "wherever PE9's D > 0.1" is read per kind and seed, with
D = loss(4L) - loss(L) of that run (PE9's x = 4 at L = 32); without such a run (b) is
untestable (not reached here).

Cost: 6 PE-sweep runs (shared with PE1, PE4, PE6-PE13), ~6 units; 12 strided evaluations.

    attnjax audit experiments/claims --workdir runs/claims --only PE14
"""

from attnjax.audit import holds, over_seeds, untestable
from attnjax.audit.settings import EPS, pe_run, pe_sweep
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.data import load_dataset
from attnjax.train import evaluate

ID = "PE14"
SOURCE = "000 §8.5"
CLAIM = "encoding overlapping segments is a crude but effective fix for over-long inputs"
CRITERION = ("(a) overlapping (stride L/2) < disjoint segments by > eps for every kind; (b) "
             "overlapping < whole by > eps wherever PE9's D > 0.1")
L, T = 32, 128
KINDS = ("learned", "sinusoidal", "rope")
EXTRAPOLATES = 0.1          # PE9's D above which the whole-sequence evaluation counts as failing


def get_sweep():
    return pe_sweep(lengths=(L,), kinds=KINDS)


def measure(runs) -> dict:
    out = {}
    for kind in KINDS:
        for seed, t in runs.by_seed(pe_run(L, kind)).items():
            config, params, _ = t.dir.params("best")
            data = load_dataset(config.data)
            strided = {stride: evaluate(config, params, data, [T], window=L, stride=stride,
                                        score_last=stride)[T]["loss"] for stride in (L, L // 2)}
            out[f"{kind}/{seed}"] = {"L": t.loss(), "whole": t.loss(T),
                                     "disjoint": strided[L], "overlap": strided[L // 2]}
    return out


def verdict(results):
    table = "; ".join(f"{n}: whole {r['whole']:.3f}, disjoint {r['disjoint']:.3f}, overlap "
                      f"{r['overlap']:.3f} (D {r['whole'] - r['L']:+.3f})"
                      for n, r in results.items())
    seeds = lambda names: {n.split("/")[1] for n in names}
    better, note = over_seeds({s: all(r["overlap"] < r["disjoint"] - EPS
                                      for n, r in results.items() if n.endswith("/" + s))
                               for s in seeds(results)})
    out = {"a": holds(better, "; ".join(filter(None, [table, note])))}
    failing = [n for n, r in results.items() if r["whole"] - r["L"] > EXTRAPOLATES]
    if not failing:
        out["b"] = untestable(f"not reached here: no run has D > {EXTRAPOLATES}; {table}")
    else:
        ok = [n for n in failing if results[n]["overlap"] < results[n]["whole"] - EPS]
        out["b"] = holds(len(ok) == len(failing), f"runs with D > {EXTRAPOLATES}: "
                         f"{', '.join(failing)}; overlap beats whole by > eps in "
                         f"{', '.join(ok) or 'none'}; {table}")
    return out


def _run(whole, disjoint, overlap, loss=2.0):
    return {"L": loss, "whole": whole, "disjoint": disjoint, "overlap": overlap}


EXAMPLES = [
    ({"rope/0": _run(2.05, 2.3, 2.1), "rope/1": _run(2.05, 2.3, 2.1),
      "learned/0": _run(3.0, 2.3, 2.1), "learned/1": _run(3.0, 2.3, 2.1)},
     {"a": "confirmed", "b": "confirmed"}),
    ({"rope/0": _run(2.05, 2.3, 2.1), "rope/1": _run(2.05, 2.3, 2.3),
      "learned/0": _run(3.0, 2.3, 2.1), "learned/1": _run(2.2, 2.3, 2.25)},
     {"a": "refuted", "b": "refuted"}),
    ({"rope/0": _run(2.05, 2.3, 2.1), "rope/1": _run(2.05, 2.3, 2.1)},
     {"a": "confirmed", "b": "untestable"}),
]
