"""PT6: a hand-written attention, swapped into a mature pretrained model, keeps its quality.

Measure: P-SmolLM (``attnjax.audit.smollm``), 200 windows of 128 tokens, each run alone: the
perplexity ``exp(mean NLL)`` of the predictions of queries 8 and later (the setting's
positions; every prediction in the evidence too) with each exact kernel of attnjax swapped in
(``model.attention.kernel``: reference, chunked, triangular and flash in blocks of 32, so the
online softmax runs over four key blocks, and xla), against the perplexity transformers gives
on the same windows reading the same GGUF file (``tests/data/smollm_perplexity_reference.npz``,
written once by ``scripts/make_smollm_perplexity_reference.py``; the windows are its ids). For
contrast, the deliberately unsafe ``masked_fill`` variants: an additive -1e4 mask with the
logits in float16 (the model computing in float16, as that needs; the reference kernel in
float16 beside it separates what float16 itself costs) and the mask applied after the
softmax (float32).

Criterion: every exact kernel within 0.1% relative perplexity of the reference. Untestable
when the model is not installed (or the reference file is missing, naming the script).

    make smollm && attnjax audit experiments/claims --workdir runs/claims --only PT6
"""

import hashlib
import json
from pathlib import Path

import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.audit import holds, untestable
from attnjax.audit.smollm import FIRST_QUERY, absent, fingerprint, load_smollm, token_nll
from attnjax.config import apply_overrides

ID = "PT6"
SOURCE = "000 §9"
CLAIM = "a hand-written attention swapped into a mature pretrained model keeps its quality"
CRITERION = ("P-SmolLM, 200 windows of 128 tokens: every exact kernel (reference, chunked, "
             "triangular, flash, xla) within 0.1% relative perplexity of transformers' on the same "
             "windows")
REFERENCE = Path(__file__).resolve().parents[3] / "tests/data/smollm_perplexity_reference.npz"
WINDOWS, TOLERANCE = 200, 1e-3
BLOCKS = {"attention.block_q": 32, "attention.block_k": 32}
EXACT = {"reference": {}, "chunked": BLOCKS,
         "triangular": {"attention.block_q": 32}, "flash": BLOCKS, "xla": {}}
UNSAFE = {"reference, float16": {"dtype": "float16"},
          "masked_fill add -1e4, float16 logits": {
              "dtype": "float16", "attention.kernel": "masked_fill",
              "attention.mask_mode": "add", "attention.mask_fill": -1e4,
              "attention.logits_dtype": "input"},
          "masked_fill after softmax": {"attention.kernel": "masked_fill",
                                        "attention.mask_after_softmax": True}}
KERNELS = (*EXACT, *UNSAFE)
TEST_SIZE = {"WINDOWS": 1, "KERNELS": ("reference", "masked_fill after softmax")}


def inputs() -> str:
    """The model's presence and the reference's content."""
    return fingerprint() + (hashlib.sha256(REFERENCE.read_bytes()).hexdigest()
                            if REFERENCE.is_file() else "no reference")


def _overrides(name: str) -> dict:
    return ({"attention.kernel": name, **EXACT[name]} if name in EXACT else UNSAFE[name])


def measure() -> dict:
    if missing := absent():
        return missing
    if not REFERENCE.is_file():
        return {"absent": f"no reference perplexities ({REFERENCE}): "
                          "scripts/make_smollm_perplexity_reference.py writes them"}
    reference = np.load(REFERENCE)
    if int(reference["first_query"]) != FIRST_QUERY:
        raise ValueError(f"{REFERENCE} scores from query {int(reference['first_query'])}, "
                         f"not {FIRST_QUERY}: write it again")
    model, params, _ = load_smollm()
    windows = reference["ids"][:WINDOWS].astype(np.int32)
    out = {}
    for name in KERNELS:
        nll = token_nll(apply_overrides(model, _overrides(name)), params, windows)
        out[name] = {"nll": float(nll[:, FIRST_QUERY:].mean()), "nll_all": float(nll.mean()),
                     "window_nll": nll[:, FIRST_QUERY:].mean(1).tolist()}
    return {"kernels": out, "exact": [k for k in KERNELS if k in EXACT],
            "reference": {"nll": float(reference["window_nll"][:WINDOWS].mean()),
                          "nll_all": float(reference["window_nll_all"][:WINDOWS].mean()),
                          "window_nll": reference["window_nll"][:WINDOWS].tolist(),
                          **json.loads(str(reference["versions"]))},
            "windows": len(windows), "length": int(windows.shape[1])}


def _relative(r, name: str, key: str = "nll") -> float:
    """Relative perplexity difference of kernel ``name`` from the reference."""
    return float(np.expm1(r["kernels"][name][key] - r["reference"][key]))


def _names(r) -> list[str]:
    """The measured variants, exact kernels first, in ``KERNELS`` order."""
    return sorted(r["kernels"], key=lambda k: (k not in r["exact"], KERNELS.index(k)
                                               if k in KERNELS else len(KERNELS)))


def verdict(r):
    if "absent" in r:
        return untestable(r["absent"])
    ppl = np.exp(r["reference"]["nll"])
    worst = max(r["exact"], key=lambda k: abs(_relative(r, k)))
    rows = {group: "; ".join(f"{k} {np.exp(r['kernels'][k]['nll']):.4f} "
                             f"({_relative(r, k):+.1e})" for k in _names(r)
                             if (k in r["exact"]) == (group == "exact"))
            for group in ("exact", "unsafe")}
    text = (f"{r['windows']} windows of {r['length']}, queries {FIRST_QUERY}+: transformers "
            f"{r['reference'].get('transformers', '')} perplexity {ppl:.4f}; exact: "
            f"{rows['exact']}; unsafe, for contrast: {rows['unsafe']}; largest exact difference "
            f"{worst} {abs(_relative(r, worst)):.1e} (all predictions: transformers "
            f"{np.exp(r['reference']['nll_all']):.4f}, {worst} "
            f"{abs(_relative(r, worst, 'nll_all')):.1e})")
    return holds(all(abs(_relative(r, k)) <= TOLERANCE for k in r["exact"]), text)


def plot(r, out_dir):
    if "absent" in r:
        return []
    names = _names(r)
    relative = np.array([abs(_relative(r, k)) for k in names])
    fig, ax = subplots(figsize=(8.5, 3.8))
    colours = ["tab:blue" if k in r["exact"] else "tab:orange" for k in names]
    ax.barh(range(len(names)), np.maximum(relative, 1e-9), color=colours)
    ax.set_xscale("log")
    ax.axvline(TOLERANCE, color="tab:red", linestyle=":", label="0.1% (criterion)")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    for i, (name, value) in enumerate(zip(names, relative)):
        ax.text(max(value, 1e-9), i, f"  {np.exp(r['kernels'][name]['nll']):.3f}",
                va="center", fontsize=7)
    ax.set_xlabel("|relative perplexity difference| from transformers (log)")
    ax.set_title(f"PT6: SmolLM2-135M-Instruct, {r['windows']} windows of {r['length']}, "
                 f"queries {FIRST_QUERY}+: transformers' perplexity "
                 f"{np.exp(r['reference']['nll']):.3f}\nbeside each kernel's (blue: exact, "
                 "orange: unsafe variants)", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    path = out_dir / "PT6.png"
    fig.savefig(path, dpi=110)
    return [path]


def _example(shift):
    kernel = lambda nll: {"nll": nll, "nll_all": nll, "window_nll": [nll]}
    return {"kernels": {"reference": kernel(3.0 + shift), "xla": kernel(3.0),
                        "masked_fill after softmax": kernel(4.0)},
            "exact": ["reference", "xla"],
            "reference": {**kernel(3.0), "transformers": "5"}, "windows": 200, "length": 128}


EXAMPLES = [
    (_example(1e-5), "confirmed"),
    (_example(5e-3), "refuted"),
    ({"absent": "SmolLM2-135M-Instruct is not installed"}, "untestable"),
]
