"""PE8: sinusoidal encodings degrade past the training length, although in principle they
extrapolate.

Measure: the PE-sweep sinusoidal runs, S-text at L = 32 and S-128 (L = 128), 600 steps, seeds
0 and 1: validation loss at L and 2L (``data.eval_lengths``). Regimes: L = 32, 128; every
seed.

Cost: 4 PE-sweep runs (shared with PE1, PE4, PE6, PE7, PE9-PE14), ~4 units.

    attnjax audit experiments/claims --workdir runs/claims --only PE8
"""

from attnjax.audit import over_regimes
from attnjax.audit.settings import PE_LENGTHS, pe_run, pe_sweep
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "PE8"
SOURCE = "000 §5.3"
CLAIM = "sinusoidal encodings degrade past the training length despite extrapolating in principle"
CRITERION = "loss(2L) - loss(L) > 0.1"
MARGIN = 0.1


def get_sweep():
    return pe_sweep(kinds=("sinusoidal",))


def measure(runs) -> dict:
    return {str(length): {str(seed): {"L": t.loss(), "2L": t.loss(2 * length)}
                          for seed, t in runs.by_seed(pe_run(length, "sinusoidal")).items()}
            for length in PE_LENGTHS}


def verdict(results):
    holding = {f"L={n}": {s: x["2L"] - x["L"] > MARGIN for s, x in r.items()}
               for n, r in results.items()}
    return over_regimes(holding, "; ".join(
        f"L={n}: loss L -> 2L " + ", ".join(f"seed {s} {x['L']:.3f} -> {x['2L']:.3f} "
                                             f"({x['2L'] - x['L']:+.3f})" for s, x in r.items())
        for n, r in results.items()))


def _example(gap32, gap128):
    return {"32": {s: {"L": 2.0, "2L": 2.0 + gap32} for s in "01"},
            "128": {s: {"L": 2.0, "2L": 2.0 + gap128} for s in "01"}}


EXAMPLES = [
    (_example(0.5, 0.3), "confirmed"),
    (_example(0.05, 0.0), "refuted"),
    (_example(0.5, 0.05), "scale-dependent"),
]
