"""MK6: long text split into blocks needs "lower-triangular within blocks, one-way between
blocks" (block 5 sees blocks 1-5), built as ``block_id[:, None] <= block_id[None, :]`` from
``block_id = position_ids // block_size``.

Measure at T = 64, block 8, rows = queries, columns = keys, True = may attend:
(a) the expression as written, ``block_id[:, None] <= block_id[None, :]``;
(b) the rule as described: key j visible from query i iff j's block is earlier than i's
(``block_causal_mask`` without the same-block entries) or j is in i's block at or before i
(``causal_mask`` within the block; "same block" is attnjax's ``segment_mask`` on the block
ids);
(c) attnjax's ``causal_mask`` and ``block_causal_mask`` (full attention within a block).

Criterion, two parts, each iff elementwise true: (a) == (b), and (b) != the global causal
mask. (b) vs ``block_causal_mask`` is reported.

    attnjax audit experiments/claims --workdir runs/claims --only MK6
"""

import numpy as np

from attnjax.audit import holds
from attnjax.ops import block_causal_mask, causal_mask, segment_mask

ID = "MK6"
SOURCE = "002 §3.3"
CLAIM = ("blocked long text: lower-triangular within blocks + one-way between blocks, built as "
         "block_id[:, None] <= block_id[None, :]")
CRITERION = "two parts, each iff elementwise true: (a) == (b); (b) != the global causal mask"
T = 64
BLOCK = 8


def masks() -> dict[str, np.ndarray]:
    """``{name: bool [T, T]}``, rows queries, columns keys."""
    positions = np.arange(T)[None, :]
    block_id = positions[0] // BLOCK
    causal = np.asarray(causal_mask(positions, positions))[0, 0]
    blocks = np.asarray(block_causal_mask(positions, positions, BLOCK))[0, 0]
    same = np.asarray(segment_mask(block_id[None], block_id[None]))[0, 0]
    return {
        "expression": block_id[:, None] <= block_id[None, :],
        "described": (blocks & ~same) | (same & causal),
        "causal_mask": causal,
        "block_causal_mask": blocks,
    }


def measure() -> dict:
    m = masks()
    differ = lambda a, b: int((m[a] != m[b]).sum())
    return {
        "expression_vs_described": differ("expression", "described"),
        "described_vs_causal": differ("described", "causal_mask"),
        "described_vs_block_causal": differ("described", "block_causal_mask"),
        "expression_vs_block_causal_transposed": int((m["expression"]
                                                      != m["block_causal_mask"].T).sum()),
        # block 5 (1-based) is block index 4: which key blocks its first query sees
        "block5_sees": {name: sorted({int(j) // BLOCK + 1 for j in np.flatnonzero(x[4 * BLOCK])})
                        for name, x in m.items()},
    }


def verdict(r):
    sees = r["block5_sees"]
    return {
        "a": holds(r["expression_vs_described"] == 0,
                   f"{r['expression_vs_described']} of {T * T} entries differ; the expression "
                   f"lets block 5 see blocks {sees['expression']}, the rule {sees['described']}"
                   f" (the expression is block_causal_mask transposed: "
                   f"{r['expression_vs_block_causal_transposed']} entries differ)"),
        "b": holds(r["described_vs_causal"] != 0,
                   f"{r['described_vs_causal']} entries differ from causal_mask; "
                   f"{r['described_vs_block_causal']} from block_causal_mask"),
    }


def plot(results, out_dir):
    from attnjax.analysis.figures import subplots
    m = masks()
    fig, axes = subplots(1, 4, figsize=(13, 3.6), layout="constrained")
    titles = {"expression": "(a) block_id[:, None] <= block_id[None, :]",
              "described": "(b) causal in block + earlier blocks",
              "causal_mask": "causal_mask", "block_causal_mask": "block_causal_mask"}
    for ax, (name, mask) in zip(axes, m.items()):
        ax.imshow(mask, cmap="Greys", interpolation="nearest")
        ax.set_title(titles[name], fontsize=9)
        ax.set_xlabel("key j")
        ax.set_xticks(range(0, T + 1, 2 * BLOCK))
        ax.set_yticks(range(0, T + 1, 2 * BLOCK))
    axes[0].set_ylabel("query i")
    fig.suptitle(f"MK6: masks at T={T}, block {BLOCK} (black = may attend)", fontsize=10)
    path = out_dir / "MK6-masks.png"
    fig.savefig(path, dpi=110)
    return [path]


EXAMPLES = [
    ({"expression_vs_described": 0, "described_vs_causal": 224, "described_vs_block_causal": 0,
      "expression_vs_block_causal_transposed": 0,
      "block5_sees": {"expression": [1, 2, 3, 4, 5], "described": [1, 2, 3, 4, 5]}},
     {"a": "confirmed", "b": "confirmed"}),
    ({"expression_vs_described": 2240, "described_vs_causal": 0,
      "described_vs_block_causal": 224, "expression_vs_block_causal_transposed": 0,
      "block5_sees": {"expression": [5, 6, 7, 8], "described": [1, 2, 3, 4, 5]}},
     {"a": "refuted", "b": "refuted"}),
]
