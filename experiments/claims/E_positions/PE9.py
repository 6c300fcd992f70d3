"""PE9: RoPE and ALiBi extrapolate much better than absolute encodings.

Measure: the PE-sweep runs of rope, alibi, learned (interpolated past L) and sinusoidal, S-text
at L = 32 and S-128 (L = 128), 600 steps, seeds 0 and 1: D = loss(xL) - loss(L) per kind
(``data.eval_lengths``). Regimes: L = 32, 128 x x = 4, 8 (8 x 128 = 1024). In each regime and
at every seed: max(D(rope), D(alibi)) <= min(D(learned), D(sinusoidal)) - 0.1.

Cost: 8 PE-sweep runs (shared with PE1, PE4, PE6-PE8, PE10-PE14), ~8 units.

    attnjax audit experiments/claims --workdir runs/claims --only PE9
"""

from attnjax.analysis.figures import subplots
from attnjax.audit import over_regimes
from attnjax.audit.settings import PE_LENGTHS, pe_run, pe_sweep
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "PE9"
SOURCE = "000 §5.3, §8.5; 002 §5.2"
CLAIM = "RoPE and ALiBi extrapolate much better than absolute encodings"
CRITERION = ("D = loss(xL) - loss(L): D(rope) and D(alibi) each below both absolute kinds' "
             "(learned, sinusoidal) by >= 0.1")
RELATIVE, ABSOLUTE = ("rope", "alibi"), ("learned", "sinusoidal")
FACTORS = (4, 8)
MARGIN = 0.1


def get_sweep():
    return pe_sweep(kinds=RELATIVE + ABSOLUTE)


def measure(runs) -> dict:
    """``{L: {kind: {seed: {x: D}}}}`` with x = 1 holding loss(L) itself."""
    out = {}
    for length in PE_LENGTHS:
        out[str(length)] = {}
        for kind in RELATIVE + ABSOLUTE:
            out[str(length)][kind] = {
                str(seed): {"1": t.loss(), **{str(x): t.loss(x * length) - t.loss()
                                              for x in FACTORS}}
                for seed, t in runs.by_seed(pe_run(length, kind)).items()}
    return out


def verdict(results):
    holding, notes = {}, []
    for length, r in results.items():
        seeds = list(r["rope"])
        for x in map(str, FACTORS):
            d = {kind: {s: r[kind][s][x] for s in seeds} for kind in r}
            holding[f"L={length},x={x}"] = {
                s: max(d[k][s] for k in RELATIVE) <= min(d[k][s] for k in ABSOLUTE) - MARGIN
                for s in seeds}
            notes.append(f"L={length} x={x}: D " + ", ".join(
                f"{k} " + "/".join(f"{d[k][s]:+.3f}" for s in seeds) for k in d))
    return over_regimes(holding, "; ".join(notes) + f" (seeds {'/'.join(seeds)})")


def plot(results, out_dir):
    kinds = RELATIVE + ABSOLUTE
    fig, axes = subplots(1, len(results), figsize=(5 * len(results), 3.6))
    for ax, (length, r) in zip(axes.ravel(), results.items()):
        for kind in kinds:
            for s, d in r[kind].items():
                ax.plot([1, *FACTORS], [0.0] + [d[str(x)] for x in FACTORS], "o-",
                        color=f"C{kinds.index(kind)}", alpha=1.0 if s == "0" else 0.5,
                        label=kind if s == "0" else None)
        ax.set(xscale="log", xticks=[1, *FACTORS], xticklabels=["L", "4L", "8L"],
               xlabel="evaluation length", ylabel="loss(xL) - loss(L) (nats)",
               title=f"trained at L = {length} (seed 1 faded)")
        ax.minorticks_off()
        ax.legend()
    path = out_dir / f"{ID}-extrapolation.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return [path]


def _example(d_rope32, d_rope128, d_learned):
    arm = lambda d4: {s: {"1": 2.0, "4": d4, "8": d4 * 1.5} for s in "01"}
    at = lambda d_rope: {"rope": arm(d_rope), "alibi": arm(0.0), "learned": arm(d_learned),
                         "sinusoidal": arm(1.0)}
    return {"32": at(d_rope32), "128": at(d_rope128)}


EXAMPLES = [
    (_example(0.05, 0.05, 0.8), "confirmed"),
    (_example(0.5, 0.5, 0.3), "refuted"),
    (_example(0.05, 0.5, 0.4), "scale-dependent"),
]
