"""PT7: the KV cache takes a large part of a language model's inference memory.

Measure: P-SmolLM's model (``attnjax.audit.smollm``: the architecture its GGUF metadata
describes; no weight is read, nothing is run), computing in bfloat16 with bfloat16 parameters:
the compiled decoding step (``attnjax.bench.memory.decode_step_memory``: one token per sequence
into a bfloat16 KV cache of ``max_length`` slots, the cache donated, as generation runs it),
XLA's buffer assignment of it at batch 1 and 8 and cache lengths 512, 2048 and 8192. Per
setting: the cache's bytes over every byte the step holds, ``peak = arguments + outputs -
aliased + temporaries`` (parameters, cache, the token and logits, and XLA's temporaries). On
this CPU backend the temporaries include float32 copies XLA makes of bfloat16 weights for its
dot products (a GPU multiplies bfloat16 directly), so the share is also given over parameters
+ cache alone.

Criterion: the cache is >= 50% of the total at batch 8, length 8192; scale-dependent if it is
below at the smaller settings. Untestable when the model is not installed.

    make smollm && attnjax audit experiments/claims --workdir runs/claims --only PT7
"""

import numpy as np

from attnjax.analysis.figures import subplots
from attnjax.audit import Verdict, holds, untestable
from attnjax.audit.smollm import absent, model_config
from attnjax.audit.smollm import fingerprint as inputs  # noqa: F401  (the model's presence)
from attnjax.bench.memory import decode_step_memory
from attnjax.config import apply_overrides
from attnjax.pretrained.run import imported_config

ID = "PT7"
SOURCE = "000 §6.3"
CLAIM = "the KV cache takes a large part of a language model's inference memory"
CRITERION = ("P-SmolLM, compiled bfloat16 decoding step: the cache >= 50% of all bytes it holds "
             "at batch 8, length 8192 (scale-dependent if below at batch 1, 8 x length 512, "
             "2048, 8192)")
BATCHES, LENGTHS, SHARE = (1, 8), (512, 2048, 8192), 0.5
TEST_SIZE = {"BATCHES": (1,), "LENGTHS": (128,)}


def measure() -> dict:
    if missing := absent():
        return missing
    model = model_config()
    rows = []
    for length in LENGTHS:
        config = apply_overrides(imported_config(model, None),
                                 {"model.dtype": "bfloat16", "model.max_length": length})
        rows += [decode_step_memory(config, batch, param_dtype="bfloat16") for batch in BATCHES]
    return {"rows": rows}


def _share(row, key="peak"):
    total = row["peak_bytes"] if key == "peak" else row["parameter_bytes"] + row["cache_bytes"]
    return row["cache_bytes"] / total


def verdict(r):
    if "absent" in r:
        return untestable(r["absent"])
    rows = r["rows"]
    text = "; ".join(f"batch {row['batch']} x {row['max_length']}: cache "
                     f"{row['cache_bytes'] / 2**20:.0f} MB of {row['peak_bytes'] / 2**20:.0f} MB "
                     f"= {_share(row):.1%} ({_share(row, 'held'):.1%} of parameters + cache)"
                     for row in rows)
    largest = [row for row in rows if (row["batch"], row["max_length"]) == (8, 8192)]
    if not largest:
        return Verdict("untestable", f"batch 8 x 8192 was not measured: {text}")
    holding = _share(largest[0]) >= SHARE
    below = [row for row in rows if _share(row) < SHARE]
    if holding and below:
        return Verdict("scale-dependent", f"{text}; below {SHARE:.0%} at "
                       + ", ".join(f"{row['batch']} x {row['max_length']}" for row in below))
    return holds(holding, text)


def plot(r, out_dir):
    if "absent" in r:
        return []
    rows = r["rows"]
    labels = [f"B{row['batch']}\nL{row['max_length']}" for row in rows]
    mb = lambda key: np.array([row[key] for row in rows]) / 2**20
    other = mb("peak_bytes") - mb("cache_bytes") - mb("parameter_bytes")
    fig, ax = subplots(figsize=(7.5, 3.8))
    x = np.arange(len(rows))
    ax.bar(x, mb("parameter_bytes"), label="parameters (bfloat16)", color="tab:gray")
    ax.bar(x, mb("cache_bytes"), bottom=mb("parameter_bytes"), label="KV cache (bfloat16)",
           color="tab:blue")
    ax.bar(x, other, bottom=mb("parameter_bytes") + mb("cache_bytes"),
           label="temporaries, token, logits", color="tab:orange", alpha=0.6)
    for i, row in enumerate(rows):
        ax.text(i, row["peak_bytes"] / 2**20, f"{_share(row):.0%}", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("MB held by the step")
    ax.set_title("PT7: SmolLM2-135M decoding step, compiled (XLA:CPU); the cache's share on "
                 "top", fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = out_dir / "PT7.png"
    fig.savefig(path, dpi=110)
    return [path]


def _row(batch, length, cache):
    return {"batch": batch, "max_length": length, "cache_bytes": cache, "parameter_bytes": 250,
            "peak_bytes": cache + 250 + 50}


EXAMPLES = [
    ({"rows": [_row(1, 512, 500), _row(8, 8192, 1000)]}, "confirmed"),
    ({"rows": [_row(1, 512, 10), _row(8, 8192, 1000)]}, "scale-dependent"),
    ({"rows": [_row(1, 512, 10), _row(8, 8192, 100)]}, "refuted"),
    ({"absent": "SmolLM2-135M-Instruct is not installed"}, "untestable"),
]
