"""PE6: RoPE with base 1000 instead of 10000 fails on long text.

Measure: the PE-sweep rope runs (``model.position.rope_base`` 10000, the default, and 1000),
S-text at L = 32 and S-128 (L = 128), 600 steps, seeds 0 and 1: validation loss at 4L
(``data.eval_lengths``). Regimes: L = 32, 128; in each, base 1000's loss at 4L must exceed
base 10000's by > 0.1 at every seed (the runs of one seed compared).

Cost: 8 PE-sweep runs (shared with PE1, PE4, PE7-PE14), ~8 units.

    attnjax audit experiments/claims --workdir runs/claims --only PE6
"""

from attnjax.audit import over_regimes
from attnjax.audit.settings import PE_LENGTHS, pe_run, pe_sweep
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "PE6"
SOURCE = "002 §5.2"
CLAIM = "RoPE with base 1000 instead of 10000 fails on long text"
CRITERION = "loss at 4L of base 1000 worse than base 10000 by > 0.1"
KINDS = ("rope", "rope_base_1000")
MARGIN = 0.1


def get_sweep():
    return pe_sweep(kinds=KINDS)


def measure(runs) -> dict:
    return {str(length): {kind: {str(seed): {"L": t.loss(), "4L": t.loss(4 * length)}
                                 for seed, t in runs.by_seed(pe_run(length, kind)).items()}
                          for kind in KINDS}
            for length in PE_LENGTHS}


def verdict(results):
    holding, notes = {}, []
    for length, r in results.items():
        seeds = list(r["rope"])
        gap = {s: r["rope_base_1000"][s]["4L"] - r["rope"][s]["4L"] for s in seeds}
        holding[f"L={length}"] = {s: g > MARGIN for s, g in gap.items()}
        notes.append(f"L={length}: loss(4L) base 10000 " + "/".join(
            f"{r['rope'][s]['4L']:.3f}" for s in seeds) + ", base 1000 " + "/".join(
            f"{r['rope_base_1000'][s]['4L']:.3f}" for s in seeds) + " (gap " + "/".join(
            f"{g:+.3f}" for g in gap.values()) + ")")
    return over_regimes(holding, "; ".join(notes) + f" (seeds {'/'.join(seeds)})")


def _example(gap32, gap128):
    arm = lambda gap: {"rope": {s: {"L": 2.0, "4L": 2.2} for s in "01"},
                       "rope_base_1000": {s: {"L": 2.0, "4L": 2.2 + gap} for s in "01"}}
    return {"32": arm(gap32), "128": arm(gap128)}


EXAMPLES = [
    (_example(0.3, 0.5), "confirmed"),
    (_example(0.05, -0.1), "refuted"),
    (_example(0.05, 0.5), "scale-dependent"),
]
