"""TR6: RNNs lose early information over distance and CNNs need depth for distant relations;
attention does not.

Measure: TR4's second-copy accuracy by query-source distance (S-ind at L = 64 and 128, seeds 0
and 1, the same runs and buckets, read through TR4's own code) for the attention model, and
the same buckets for a 2-layer GRU and a 2-layer causal CNN (kernel 3) of equal size.

Untestable here: attnjax has no recurrent or convolutional mixer to put in the attention's
place (CLAIMS.md's missing capability M24), so the GRU and CNN halves of the criterion cannot
be measured; the attention model's buckets are measured and reported in the evidence. The
verdict applies the criterion (per regime and seed) to GRU and CNN results of TR4's form
should a measurement provide them.

Cost: none of its own (TR4's runs).

    attnjax audit experiments/claims --workdir runs/claims --only TR6
"""

from pathlib import Path

from attnjax.audit import load_claim, over_regimes, untestable
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "TR6"
SOURCE = "000 §1.1; 002 §2.1"
CLAIM = ("RNNs lose early information over distance and CNNs need depth for distant relations; "
         "attention does not")
CRITERION = ("GRU and CNN farthest buckets each below their nearest by > 0.05 while "
             "attention's is not")
TR4 = load_claim(Path(__file__).resolve().parent / "TR4.py").module
GAP = 0.05


def get_sweep():
    return TR4.get_sweep()


def measure(runs) -> dict:
    return {"attention": TR4.measure(runs), "gru": None, "cnn": None}


def _drop(x: dict) -> float:
    """How far the farthest bucket is below the nearest."""
    near, far = TR4.ends(x)
    return near - far


def verdict(r):
    attention = r["attention"]
    drops = "; ".join(f"L={length} seed {s}: nearest - farthest {_drop(x):+.3f}"
                      for length, seeds in attention.items() for s, x in seeds.items())
    if r["gru"] is None or r["cnn"] is None:
        return untestable("no GRU or causal-CNN mixer in attnjax (missing capability M24); "
                          f"attention (TR4's runs): {drops}; {TR4.describe(attention)}")
    holding = {f"L={length}": {s: _drop(r["gru"][length][s]) > GAP
                               and _drop(r["cnn"][length][s]) > GAP and _drop(x) <= GAP
                               for s, x in seeds.items()} for length, seeds in attention.items()}
    return over_regimes(holding, "nearest - farthest bucket: " + "; ".join(
        f"L={length} seed {s}: attention {_drop(x):+.3f}, GRU {_drop(r['gru'][length][s]):+.3f}"
        f", CNN {_drop(r['cnn'][length][s]):+.3f}"
        for length, seeds in attention.items() for s, x in seeds.items()))


_FLAT, _DECAYING = TR4.EXAMPLES[0][0], TR4.EXAMPLES[1][0]
EXAMPLES = [
    ({"attention": _FLAT, "gru": None, "cnn": None}, "untestable"),
    ({"attention": _FLAT, "gru": _DECAYING, "cnn": _DECAYING}, "confirmed"),
    ({"attention": _DECAYING, "gru": _DECAYING, "cnn": _FLAT}, "refuted"),
]
