"""MS1: viridis is perceptually uniform, while jet has false bands (yellow-green) that mislead
the eye in attention heatmaps.

Capability M23, written here in NumPy: sRGB -> CIELAB (IEC 61966-2-1 transfer curve, the sRGB
-> XYZ matrix, D65 white, CIE 1976 L*a*b*) and CIEDE2000 (Sharma, Wu & Dalal 2005, with
k_L = k_C = k_H = 1). ``measure`` asserts both against published values first: sRGB white
is L* = 100, a* = b* = 0 and pure red is L*a*b* = (53.24, 80.09, 67.20); seven test pairs of
Sharma et al.'s table (pairs 1, 7, 13, 15, 17, 25, 34, covering the hue wrap-around, a
neutral colour, large and small differences) give their published Delta E00 to 1e-4.

Measure: 256 evenly spaced samples of matplotlib's viridis and jet: L* of each, CIEDE2000
between neighbours, its coefficient of variation (CV = std / mean over the 255 steps).
Left open and fixed here: "monotonic" allows equal neighbours (no sign change of Delta L*);
L* extrema are the interior samples where Delta L* changes sign; Delta E peaks are the
interior local maxima of the neighbour Delta E that are >= 1.5x its median; "hue 60-120
degrees" is read on the usual hue wheel (HSV hue of the sRGB colour: 60 yellow, 120 green,
the "yellow-green" of the claim), taken at the L* extremum and at the midpoint colour of a
Delta E peak's two samples (CIELAB hue angles are reported beside).

    attnjax audit experiments/claims --workdir runs/claims --only MS1
"""

import matplotlib
import numpy as np
from matplotlib.colors import rgb_to_hsv

from attnjax.analysis.figures import subplots
from attnjax.audit import holds

ID = "MS1"
SOURCE = "002 §4.2"
CLAIM = "viridis is perceptually uniform; jet has false bands (yellow-green) that mislead"
CRITERION = ("(a) viridis: L* monotonic, CV of Delta E <= 0.2; (b) jet: L* non-monotonic or "
             "CV >= 0.5, with a Delta E peak or L* extremum at hue 60-120 degrees")
SAMPLES, PEAK = 256, 1.5
SRGB_TO_XYZ = np.array([[0.4124564, 0.3575761, 0.1804375],
                        [0.2126729, 0.7151522, 0.0721750],
                        [0.0193339, 0.1191920, 0.9503041]])
D65 = SRGB_TO_XYZ.sum(1)                       # the white point, X_n, Y_n, Z_n
# (L1, a1, b1, L2, a2, b2, Delta E00): Sharma, Wu & Dalal 2005, Table 1, pairs 1, 7, 13, 15,
# 17, 25, 34
SHARMA_PAIRS = [
    (50.0, 2.6772, -79.7751, 50.0, 0.0, -82.7485, 2.0425),
    (50.0, 0.0, 0.0, 50.0, -1.0, 2.0, 2.3669),
    (50.0, 2.49, -0.001, 50.0, -2.49, 0.0009, 7.1792),
    (50.0, 2.49, -0.001, 50.0, -2.49, 0.0011, 7.2195),
    (50.0, 2.5, 0.0, 73.0, 25.0, -18.0, 27.1492),
    (60.2574, -34.0099, 36.2677, 60.4626, -34.1751, 39.4387, 1.2644),
    (2.0776, 0.0795, -1.135, 0.9033, -0.0636, -0.5514, 0.9082),
]


def srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB in [0, 1], [..., 3] -> CIELAB (D65) [..., 3]: linearise, XYZ, then
    L* = 116 f(Y/Y_n) - 16, a* = 500 (f(X/X_n) - f(Y/Y_n)), b* = 200 (f(Y/Y_n) - f(Z/Z_n))
    with f(t) = t^(1/3) above (6/29)^3 and t / (3 (6/29)^2) + 4/29 below."""
    rgb = np.asarray(rgb, np.float64)
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    t = linear @ SRGB_TO_XYZ.T / D65
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]),
                     200 * (f[..., 1] - f[..., 2])], -1)


def ciede2000(lab1: np.ndarray, lab2: np.ndarray) -> np.ndarray:
    """CIEDE2000 colour difference of CIELAB colours [..., 3] (Sharma et al. 2005, eqs. 1-22;
    angles in degrees)."""
    (L1, a1, b1), (L2, a2, b2) = np.moveaxis(lab1, -1, 0), np.moveaxis(lab2, -1, 0)
    c7 = ((np.hypot(a1, b1) + np.hypot(a2, b2)) / 2) ** 7
    g = 0.5 * (1 - np.sqrt(c7 / (c7 + 25.0**7)))
    a1, a2 = (1 + g) * a1, (1 + g) * a2                           # a'
    C1, C2 = np.hypot(a1, b1), np.hypot(a2, b2)                   # C'
    h1, h2 = (np.degrees(np.arctan2(b, a)) % 360 for b, a in ((b1, a1), (b2, a2)))
    chroma = C1 * C2 != 0
    dh = h2 - h1
    dh = np.where(dh > 180, dh - 360, np.where(dh < -180, dh + 360, dh)) * chroma
    dH = 2 * np.sqrt(C1 * C2) * np.sin(np.radians(dh) / 2)
    h_sum = h1 + h2
    h_bar = np.where(~chroma, h_sum, np.where(np.abs(h1 - h2) <= 180, h_sum / 2,
                     np.where(h_sum < 360, (h_sum + 360) / 2, (h_sum - 360) / 2)))
    cos = lambda deg: np.cos(np.radians(deg))
    t = (1 - 0.17 * cos(h_bar - 30) + 0.24 * cos(2 * h_bar) + 0.32 * cos(3 * h_bar + 6)
         - 0.20 * cos(4 * h_bar - 63))
    l_bar, c_bar = (L1 + L2) / 2, (C1 + C2) / 2
    s_l = 1 + 0.015 * (l_bar - 50) ** 2 / np.sqrt(20 + (l_bar - 50) ** 2)
    s_c, s_h = 1 + 0.045 * c_bar, 1 + 0.015 * c_bar * t
    r_t = (-np.sin(np.radians(60 * np.exp(-(((h_bar - 275) / 25) ** 2))))
           * 2 * np.sqrt(c_bar**7 / (c_bar**7 + 25.0**7)))
    dl, dc, dhh = (L2 - L1) / s_l, (C2 - C1) / s_c, dH / s_h
    return np.sqrt(dl**2 + dc**2 + dhh**2 + r_t * dc * dhh)


def _check_colour_science():
    """The published values M23's code must reproduce; a wrong formula fails here."""
    white, red = srgb_to_lab(np.array([[1.0, 1, 1], [1, 0, 0]]))
    assert np.allclose(white, [100, 0, 0], atol=0.01), white
    assert np.allclose(red, [53.24, 80.09, 67.20], atol=0.01), red
    pairs = np.array(SHARMA_PAIRS)
    got = ciede2000(pairs[:, :3], pairs[:, 3:6])
    assert np.allclose(got, pairs[:, 6], atol=1e-4), (got, pairs[:, 6])
    return float(np.abs(got - pairs[:, 6]).max())


def _hue(rgb) -> float:
    return float(rgb_to_hsv(np.clip(rgb, 0, 1))[0] * 360)


def colormap_stats(name: str) -> dict:
    rgb = matplotlib.colormaps[name](np.linspace(0, 1, SAMPLES))[:, :3]
    lab = srgb_to_lab(rgb)
    de = ciede2000(lab[:-1], lab[1:])
    steps = np.diff(lab[:, 0])
    moving = np.flatnonzero(steps != 0)             # equal neighbours neither turn nor break
    sign = np.sign(steps[moving])
    turns = moving[1:][sign[1:] * sign[:-1] < 0]    # the sample where L* turns
    peaks = [i for i in range(1, len(de) - 1)
             if de[i] >= de[i - 1] and de[i] > de[i + 1] and de[i] >= PEAK * np.median(de)]
    lab_hue = lambda c: float(np.degrees(np.arctan2(c[2], c[1])) % 360)
    return {
        "L": lab[:, 0].tolist(), "delta_e": de.tolist(),
        "monotonic": bool(len(turns) == 0),
        "cv": float(de.std() / de.mean()),
        "L_extrema": [{"index": int(i), "L": float(lab[i, 0]), "hue": _hue(rgb[i]),
                       "lab_hue": lab_hue(lab[i])} for i in turns],
        "delta_e_peaks": [{"index": i, "delta_e": float(de[i]),
                           "hue": _hue((rgb[i] + rgb[i + 1]) / 2),
                           "lab_hue": lab_hue((lab[i] + lab[i + 1]) / 2)} for i in peaks],
    }


def measure() -> dict:
    error = _check_colour_science()
    return {"sharma_max_error": error,
            "viridis": colormap_stats("viridis"), "jet": colormap_stats("jet")}


def _describe(points, key) -> str:
    return ", ".join(f"#{p['index']} {key} {p[key]:.1f} hue {p['hue']:.0f} (Lab {p['lab_hue']:.0f})"
                     for p in points) or "none"


def verdict(r):
    v, j = r["viridis"], r["jet"]
    hits = [p for p in j["L_extrema"] + j["delta_e_peaks"] if 60 <= p["hue"] <= 120]
    return {
        "a": holds(v["monotonic"] and v["cv"] <= 0.2,
                   f"viridis: L* {'monotonic' if v['monotonic'] else 'NOT monotonic'} "
                   f"({v['L'][0]:.1f} -> {v['L'][-1]:.1f}), CV of Delta E00 {v['cv']:.3f} "
                   f"(limit 0.2)"),
        "b": holds((not j["monotonic"] or j["cv"] >= 0.5) and bool(hits),
                   f"jet: L* {'monotonic' if j['monotonic'] else 'non-monotonic'}, CV "
                   f"{j['cv']:.3f}; L* extrema: {_describe(j['L_extrema'], 'L')}; Delta E "
                   f"peaks: {_describe(j['delta_e_peaks'], 'delta_e')}; {len(hits)} at hue "
                   "60-120"),
    }


def plot(r, out_dir):
    fig, axes = subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    for name, style in (("viridis", "-"), ("jet", "--")):
        x = r[name]
        colours = matplotlib.colormaps[name](np.linspace(0, 1, SAMPLES))
        axes[0].plot(x["L"], style, color="0.6", lw=0.8)
        axes[0].scatter(range(SAMPLES), x["L"], c=colours, s=6, label=name)
        axes[1].plot(x["delta_e"], style, lw=1, label=f"{name} (CV {x['cv']:.2f})")
    axes[0].set(xlabel="colormap sample", ylabel="L*", title="lightness along the colormap")
    axes[1].set(xlabel="colormap sample", ylabel="CIEDE2000 to the next sample",
                title="perceptual step between neighbours")
    axes[0].legend()
    axes[1].legend()
    path = out_dir / "MS1-lightness-delta-e.png"
    fig.savefig(path, dpi=120)
    return [path]


def _cmap(monotonic: bool, cv: float, hue: float) -> dict:
    point = {"index": 100, "L": 90.0, "hue": hue, "lab_hue": 110.0, "delta_e": 3.0}
    return {"L": [0.0, 1.0], "delta_e": [1.0], "monotonic": monotonic, "cv": cv,
            "L_extrema": [] if monotonic else [point], "delta_e_peaks": [point]}


EXAMPLES = [
    ({"sharma_max_error": 0.0, "viridis": _cmap(True, 0.1, 200), "jet": _cmap(False, 0.6, 90)},
     {"a": "confirmed", "b": "confirmed"}),
    ({"sharma_max_error": 0.0, "viridis": _cmap(False, 0.4, 200), "jet": _cmap(True, 0.3, 200)},
     {"a": "refuted", "b": "refuted"}),
]
