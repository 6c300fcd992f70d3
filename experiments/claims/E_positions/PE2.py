"""PE2: the sinusoidal encoding PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(same):
(a) the article's prose says sine on the odd and cosine on the even dimensions; (b) the
frequency falls with the dimension index; (c) PE(p + k) is a fixed linear map of PE(p).

Measure, d = 64 and 512, positions p < 1024:

(a) the indices of the sine columns of three tables, read off position 0 (sin 0 = 0, cos 0 = 1):
the formula above (float64, written from the definition); the article's code convention, as
implemented here: the angle of pair i is p times a frequency computed in the log domain,
exp(2i * (-ln 10000 / d)), and the sine fills the columns of a zero table from column 0 in
steps of two, the cosine from column 1 in steps of two; and attnjax's
``sinusoidal_table``. The prose's "odd dimensions" are the 0-based indices 1, 3, ... under
0-based counting and 0, 2, ... under 1-based counting; both are compared.

(b) on attnjax's table, mean over p of |PE(p+1) - PE(p)| for each dimension in index order;
"non-increasing" allows a float32 rounding slack of 1e-6 (fixed before measuring). The mean
over each sin/cos pair is reported beside it.

(c) on attnjax's table (float32, in float64 for the fit), the least-squares fit
(minimum-norm, ``numpy.linalg.lstsq``'s cutoff) of PE(p + k) on PE(p) over rows p < 512,
k = 1, 10, 100; held out: 512 <= p < 1024 - k; relative residual
||PE(p+k) - PE(p) M_k||_F / ||PE(p+k)||_F. Reported, not judged: the same fit on the float64
formula table at d = 64 (at 512 its SVD costs seconds), and the residual of the exact map
(the block rotation by k w_i) on attnjax's table.

A criterion holds if it holds at both widths (and every k).

    attnjax audit experiments/claims --workdir runs/claims --only PE2
"""

import math

import numpy as np

from attnjax.audit import holds
from attnjax.ops import sinusoidal_table

ID = "PE2"
SOURCE = "000 §5.2"
CLAIM = ("PE(p,2i)=sin, PE(p,2i+1)=cos; the prose says sine on odd dims; frequency falls with "
         "the dim; PE(p+k) is a linear map of PE(p)")
CRITERION = ("(a) formula, article code, sinusoidal_embedding agree, prose under 0- or 1-based "
             "counting; (b) non-increasing; (c) held-out relative residual <= 1e-4")
DIMS, LENGTH, FIT, SHIFTS = (64, 512), 1024, 512, (1, 10, 100)
SLACK, TOLERANCE = 1e-6, 1e-4


def formula_table(d: int) -> np.ndarray:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d)), float64."""
    p, i = np.arange(LENGTH)[:, None], np.arange(d // 2)[None, :]
    pe = np.empty((LENGTH, d))
    pe[:, 2 * i[0]] = np.sin(p / 10000 ** (2 * i / d))
    pe[:, 2 * i[0] + 1] = np.cos(p / 10000 ** (2 * i / d))
    return pe


def article_convention_table(d: int) -> np.ndarray:
    """The article code's convention: log-domain frequencies; sine into columns 0, 2, ...,
    cosine into columns 1, 3, ... of a zero table."""
    angles = np.arange(LENGTH)[:, None] * np.exp(np.arange(0, d, 2) * (-math.log(10000.0) / d))
    pe = np.zeros((LENGTH, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


def sine_columns(pe: np.ndarray) -> list[int]:
    return [int(c) for c in np.flatnonzero(np.abs(pe[0]) < 0.5)]


def _fits(pe: np.ndarray) -> dict:
    """Held-out relative residual of the least-squares M_k for each k: the minimum-norm
    solution with ``numpy.linalg.lstsq``'s singular-value cutoff (eps * max(rows, cols) * s_max),
    from one SVD of the fit rows PE(p), p < 512 (the same rows for every k < 512)."""
    u, s, vt = np.linalg.svd(pe[:FIT], full_matrices=False)
    keep = s > np.finfo(np.float64).eps * max(pe[:FIT].shape) * s[0]
    pinv = (vt[keep].T / s[keep]) @ u[:, keep].T
    out = {}
    for k in SHIFTS:
        m = pinv @ pe[k:FIT + k]
        x, y = pe[FIT:LENGTH - k], pe[FIT + k:]
        out[str(k)] = float(np.linalg.norm(y - x @ m) / np.linalg.norm(y))
    return out


def _rotation(pe: np.ndarray, k: int) -> float:
    """Residual of the exact map: (sin, cos)(p + k) from (sin, cos)(p) rotated by k w_i."""
    d = pe.shape[1]
    w = 10000.0 ** (-np.arange(0, d, 2) / d)
    s, c = pe[:-k, 0::2], pe[:-k, 1::2]
    mapped = np.empty_like(pe[:-k])
    mapped[:, 0::2] = s * np.cos(k * w) + c * np.sin(k * w)
    mapped[:, 1::2] = c * np.cos(k * w) - s * np.sin(k * w)
    return float(np.linalg.norm(pe[k:] - mapped) / np.linalg.norm(pe[k:]))


def measure() -> dict:
    out = {}
    for d in DIMS:
        ours = np.asarray(sinusoidal_table(LENGTH, d), np.float64)
        formula, code = formula_table(d), article_convention_table(d)
        step = np.abs(np.diff(ours, axis=0)).mean(0)
        rise = np.diff(step)
        out[str(d)] = {
            "sin_formula": sine_columns(formula), "sin_code": sine_columns(code),
            "sin_attnjax": sine_columns(ours),
            "prose_0based": list(range(1, d, 2)), "prose_1based": list(range(0, d, 2)),
            "max_diff_formula_code": float(np.abs(formula - code).max()),
            "max_diff_formula_attnjax": float(np.abs(formula - ours).max()),
            "step": step.tolist(), "max_rise": float(rise.max()),
            "first_rise": int(np.argmax(rise > SLACK)) if (rise > SLACK).any() else -1,
            "pair_max_rise": float(np.diff(step.reshape(-1, 2).mean(1)).max()),
            "residual": _fits(ours),
            "residual_float64_formula": _fits(formula) if d == DIMS[0] else {},
            "residual_exact_map": {str(k): _rotation(ours, k) for k in SHIFTS},
        }
    return out


def verdict(r):
    agree = {d: x["sin_formula"] == x["sin_code"] == x["sin_attnjax"] for d, x in r.items()}
    prose = {d: [name for name in ("0based", "1based") if x[f"prose_{name}"] == x["sin_formula"]]
             for d, x in r.items()}
    a = holds(all(agree.values()) and all(prose.values()), "; ".join(
        f"d={d}: sine columns {'agree' if agree[d] else 'DISAGREE'} (formula "
        f"{x['sin_formula'][:3]}..., code {x['sin_code'][:3]}..., attnjax "
        f"{x['sin_attnjax'][:3]}...); prose matches under "
        f"{' and '.join(n.replace('based', '-based') for n in prose[d]) or 'neither'} counting"
        for d, x in r.items()))
    b = holds(all(x["max_rise"] <= SLACK for x in r.values()), "; ".join(
        f"d={d}: largest rise of mean |dPE| from one dim to the next {x['max_rise']:.1e} "
        f"(first at dim {x['first_rise']}); per sin/cos pair {x['pair_max_rise']:.1e}"
        for d, x in r.items()))
    c = holds(all(v <= TOLERANCE for x in r.values() for v in x["residual"].values()),
              "; ".join(f"d={d}: held-out residual "
                        + ", ".join(f"k={k} {v:.1e}" for k, v in x["residual"].items())
                        + " (float64 formula table: "
                        + (", ".join(f"{v:.1e}" for v in x["residual_float64_formula"].values())
                           or "not run") + "; exact rotation: "
                        + ", ".join(f"{v:.1e}" for v in x["residual_exact_map"].values()) + ")"
                        for d, x in r.items()))
    return {"a": a, "b": b, "c": c}


def _example(good: bool) -> dict:
    sines = [0, 2] if good else [1, 3]
    return {"4": {"sin_formula": [0, 2], "sin_code": [0, 2], "sin_attnjax": sines,
                  "prose_0based": [1, 3], "prose_1based": [0, 2],
                  "max_diff_formula_code": 0.0, "max_diff_formula_attnjax": 1e-7,
                  "step": [0.6, 0.6, 0.01, 0.01], "max_rise": 0.0 if good else 0.01,
                  "first_rise": -1 if good else 0, "pair_max_rise": -0.5,
                  "residual": {"1": 1e-6 if good else 0.3},
                  "residual_float64_formula": {"1": 1e-9}, "residual_exact_map": {"1": 1e-7}}}


EXAMPLES = [(_example(True), dict.fromkeys("abc", "confirmed")),
            (_example(False), dict.fromkeys("abc", "refuted"))]
