"""PE10: for a fixed short length a learned position table is entirely sufficient.

Measure: the whole PE sweep (learned, sinusoidal, rope, rope base 1000, alibi, none), S-text
at L = 32 and S-128 (L = 128), 600 steps, seeds 0 and 1: validation loss at the training
length. Regimes: L = 32, 128; in each, at every seed, loss(learned) - min over the six kinds
<= 0.05 (the best kind at that seed).

Cost: the 24 PE-sweep runs (shared with PE1, PE4, PE6-PE9, PE11-PE14), ~24 units.

    attnjax audit experiments/claims --workdir runs/claims --only PE10
"""

from attnjax.audit import over_regimes
from attnjax.audit.settings import PE_KINDS, PE_LENGTHS, pe_run, pe_sweep
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "PE10"
SOURCE = "000 §5.3"
CLAIM = "for a fixed short length a learned position table is entirely sufficient"
CRITERION = "learned's loss at L within 0.05 of the best kind's"
MARGIN = 0.05


def get_sweep():
    return pe_sweep()


def measure(runs) -> dict:
    return {str(length): {kind: {str(seed): t.loss()
                                 for seed, t in runs.by_seed(pe_run(length, kind)).items()}
                          for kind in PE_KINDS}
            for length in PE_LENGTHS}


def verdict(results):
    holding, notes = {}, []
    for length, r in results.items():
        seeds = list(r["learned"])
        best = {s: min(r, key=lambda k: r[k][s]) for s in seeds}
        holding[f"L={length}"] = {s: r["learned"][s] - r[best[s]][s] <= MARGIN for s in seeds}
        notes.append(f"L={length}: " + ", ".join(
            f"{k} " + "/".join(f"{r[k][s]:.3f}" for s in seeds) for k in r)
            + "; learned - best " + "/".join(
            f"{r['learned'][s] - r[best[s]][s]:+.3f} ({best[s]})" for s in seeds))
    return over_regimes(holding, "; ".join(notes) + f" (seeds {'/'.join(seeds)})")


def _example(learned32, learned128):
    at = lambda learned: {"learned": dict.fromkeys("01", learned),
                          "rope": dict.fromkeys("01", 2.0), "none": dict.fromkeys("01", 2.3)}
    return {"32": at(learned32), "128": at(learned128)}


EXAMPLES = [
    (_example(2.03, 1.99), "confirmed"),
    (_example(2.1, 2.2), "refuted"),
    (_example(2.03, 2.2), "scale-dependent"),
]
