"""AR1: the articles' arithmetic: score-matrix sizes, memory, float16's range, the scaling
example, head widths, context blocks and a head count that does not divide the width.

Each part compares the quoted figure with the computed one; "M", "MB" and "k" may be powers of
10 or of 2, and a quoted figure with fewer digits matches if it is the computed one rounded or
truncated to those digits. Part (g) also reports attnjax's refusal of ``model.d_model=512``
with ``model.attention.num_heads=7``.

    attnjax audit experiments/claims --workdir runs/claims --only AR1
"""

import math

import numpy as np

from attnjax.audit import holds
from attnjax.config import Config, apply_overrides

ID = "AR1"
SOURCE = "000 §2.2, §4.2, §6.2, §8.2, §8.3; 002 §2.2, §2.3, §3.1-§3.3"
CLAIM = ("n=4096 gives ~16M / 16.77M scores; 8*8*1024*1024*2 B = 128 MB; fp16 max ~65504; "
         "sqrt(64)=8 example; 512/8, 768/12, 4096/32; 1M = 8 x 128k; 512 not in 7 heads")
CRITERION = "each quoted figure equals the computed one (M, MB, k as powers of 10 or 2)"
UNITS = {"k": (1e3, 2**10), "M": (1e6, 2**20)}


def _matches(quoted: float, computed: float, unit: str = "") -> bool:
    """``quoted`` (in ``unit``) equals ``computed`` rounded or truncated to its digits."""
    digits = len(repr(float(quoted)).split(".")[1].rstrip("0")) if "." in repr(quoted) else 0
    for size in UNITS.get(unit, (1,)):
        value = computed / size
        if quoted in (round(value, digits), math.floor(value * 10**digits) / 10**digits):
            return True
    return False


def _refusal() -> str:
    try:
        apply_overrides(Config(), {"model.d_model": 512, "model.attention.num_heads": 7})
    except ValueError as error:
        return str(error)
    return ""


def measure() -> dict:
    return {
        "scores_4096": 4096 * 4096,
        "memory_bytes": 8 * 8 * 1024 * 1024 * 2,
        "fp16_max": float(np.finfo(np.float16).max),
        "sqrt64": math.sqrt(64), "scaled": [x / math.sqrt(64) for x in (1, 2, 10, 3)],
        "sqrt128": math.sqrt(128),
        "head_widths": [512 / 8, 768 / 12, 4096 / 32],
        "blocks": 2**20 / (128 * 2**10), "blocks_decimal": 1e6 / 128e3,
        "512_mod_7": 512 % 7, "refusal": _refusal(),
    }


def verdict(r):
    scores = r["scores_4096"]
    return {
        "a": holds(_matches(16, scores, "M") and _matches(16.77, scores, "M"),
                   f"4096^2 = {scores:,} = {scores / 2**20:g} Mi = {scores / 1e6:.4f} M"),
        "b": holds(_matches(128, r["memory_bytes"], "M"),
                   f"{r['memory_bytes']:,} B = {r['memory_bytes'] / 2**20:g} MiB"),
        "c": holds(r["fp16_max"] == 65504, f"finfo(float16).max = {r['fp16_max']:g}"),
        "d": holds(r["sqrt64"] == 8 and r["scaled"] == [0.125, 0.25, 1.25, 0.375]
                   and round(r["sqrt128"], 1) == 11.3,
                   f"sqrt(64) = {r['sqrt64']:g}, [1, 2, 10, 3]/8 = {r['scaled']}, "
                   f"sqrt(128) = {r['sqrt128']:.4f}"),
        "e": holds(r["head_widths"] == [64, 64, 128], f"head widths {r['head_widths']}"),
        "f": holds(r["blocks"] == 8,
                   f"2^20 / (128 * 2^10) = {r['blocks']:g} (decimal: {r['blocks_decimal']:g})"),
        "g": holds(r["512_mod_7"] != 0 and bool(r["refusal"]),
                   f"512 mod 7 = {r['512_mod_7']}; attnjax: {r['refusal']}"),
    }


_TRUE = measure()
EXAMPLES = [
    (_TRUE, dict.fromkeys("abcdefg", "confirmed")),
    ({**_TRUE, "scores_4096": 4000 * 4000, "memory_bytes": 100 * 2**20, "fp16_max": 65500.0,
      "sqrt64": 8.0, "scaled": [0.1, 0.25, 1.25, 0.375], "head_widths": [64, 64, 100],
      "blocks": 7.0, "512_mod_7": 0, "refusal": ""}, dict.fromkeys("abcdefg", "refuted")),
]
