"""PE5: sinusoidal wavelengths are fixed, so past the training length the high-frequency
components go out of phase and distort the similarity of positions.

Measure on attnjax's ``sinusoidal_table`` (d = 64, training length L = 128, positions up to
16L + 100):

(a) c_k(p) = cos(PE(p), PE(p + k)) for k = 1, 10, 100; its mean over p < L against its mean
over L <= p < 16L (the largest spread of c_k over all those p is reported too). For the exact
encoding PE(p).PE(p+k) = sum_i cos(k w_i) and |PE(p)|^2 = d/2, so c_k does not depend on p.

(b) per frequency pair i (columns 2i, 2i+1), the phase phi_i(p) = atan2(PE[p, 2i],
PE[p, 2i+1]) = p w_i mod 2 pi; its gap at p is the circular distance from phi_i(p) to the
nearest phase seen below L, and the pair's gap the largest over L <= p < 16L. Left open and
fixed here: a pair is high-frequency if its wavelength 2 pi / w_i is at most L (its phase turns
at least once within the training length), w_i read off the table as phi_i(1). "Gaps > 0.1 rad
occur in high-frequency pairs only": some pair has a gap > 0.1, and every such pair is
high-frequency.

    attnjax audit experiments/claims --workdir runs/claims --only PE5
"""

import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.audit import holds
from attnjax.ops import sinusoidal_table

ID = "PE5"
SOURCE = "002 §5.2"
CLAIM = ("fixed sinusoidal wavelengths: past the training length high-frequency components go "
         "out of phase and distort position similarity")
CRITERION = ("(a) some k's cos(PE(p), PE(p+k)) differs by > 0.01 between p < L and L <= p < 16L;"
             " (b) gaps > 0.1 rad occur in high-frequency pairs only")
D, L, SHIFTS, GAP = 64, 128, (1, 10, 100), 0.1


def measure() -> dict:
    pe = np.asarray(sinusoidal_table(16 * L + max(SHIFTS), D), np.float64)
    unit = pe / np.linalg.norm(pe, axis=1, keepdims=True)
    similarity = {}
    for k in SHIFTS:
        c = (unit[: 16 * L] * unit[k: 16 * L + k]).sum(1)
        similarity[str(k)] = {"inside": float(c[:L].mean()), "outside": float(c[L:].mean()),
                              "spread": float(c.max() - c.min())}
    phase = np.mod(np.arctan2(pe[: 16 * L, 0::2], pe[: 16 * L, 1::2]), 2 * np.pi)  # [p, i]
    seen, new = phase[:L], phase[L:]
    gaps = []
    for i in range(D // 2):
        delta = np.abs(new[:, i, None] - seen[None, :, i])
        gaps.append(float(np.minimum(delta, 2 * np.pi - delta).min(1).max()))
    freq = phase[1]
    return {"similarity": similarity, "gap": gaps, "frequency": freq.tolist(),
            "high_frequency": [bool(2 * np.pi / w <= L) for w in freq]}


def verdict(r):
    s = r["similarity"]
    moved = {k: abs(x["outside"] - x["inside"]) for k, x in s.items()}
    wide = [i for i, g in enumerate(r["gap"]) if g > GAP]
    high = [i for i, h in enumerate(r["high_frequency"]) if h]
    wide_low = [i for i in wide if not r["high_frequency"][i]]
    return {
        "a": holds(any(m > 0.01 for m in moved.values()), "; ".join(
            f"k={k}: mean cos {x['inside']:.4f} below L, {x['outside']:.4f} beyond (|diff| "
            f"{moved[k]:.1e}, spread over p {x['spread']:.1e})" for k, x in s.items())),
        "b": holds(bool(wide) and not wide_low,
                   f"pairs with gap > {GAP} rad: {len(wide)} ({wide[:3]}...{wide[-3:]}); "
                   f"high-frequency pairs (wavelength <= L): {high[0] if high else '-'}-"
                   f"{high[-1] if high else '-'}, largest gap among them "
                   f"{max((r['gap'][i] for i in high), default=0):.3f}; "
                   f"low-frequency pairs with a gap > {GAP}: {len(wide_low)}, largest "
                   f"{max((r['gap'][i] for i in wide_low), default=0):.3f}"),
    }


def plot(r, out_dir):
    fig, ax = subplots(figsize=(6, 3.2), layout="constrained")
    pairs = np.arange(len(r["gap"]))
    high = np.array(r["high_frequency"])
    ax.bar(pairs[high], np.array(r["gap"])[high], color="tab:blue",
           label="high frequency (wavelength <= L)")
    ax.bar(pairs[~high], np.array(r["gap"])[~high], color="tab:orange", label="low frequency")
    ax.axhline(GAP, color="k", lw=0.8, ls="--", label=f"{GAP} rad")
    ax.set(xlabel="frequency pair i (w_i = 10000^(-2i/64))",
           ylabel="largest phase gap beyond L (rad)", yscale="log",
           title="PE5: phases at L <= p < 16L not seen below L = 128")
    ax.legend(fontsize=8)
    path = out_dir / "PE5-phase-gaps.png"
    fig.savefig(path, dpi=120)
    return [path]


def _example(inside: float, wide_high: bool) -> dict:
    return {"similarity": {"1": {"inside": inside, "outside": 0.9, "spread": 1e-6}},
            "gap": [0.2, 0.05, 0.01] if wide_high else [0.05, 0.05, 0.3],
            "frequency": [1.0, 0.1, 0.001], "high_frequency": [True, True, False]}


EXAMPLES = [(_example(0.95, True), {"a": "confirmed", "b": "confirmed"}),
            (_example(0.9, False), {"a": "refuted", "b": "refuted"})]
