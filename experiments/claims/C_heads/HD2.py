"""HD2: going from 12 to 6 heads at equal width cut peak memory by 18% and tripled an error
rate.

Measure: S-text at width 96 (``model.d_model=96``, 2 layers) with 12 heads (head_dim 8) and 6
heads (head_dim 16). (a) The peak memory of one compiled training step
(``attnjax.bench.memory.train_step_memory``: arguments + outputs - donated + temporaries, from
XLA's buffer assignment; compiled, not run), batch 16, at L = 64 and L = 128 (the regimes;
``data.length`` = ``model.max_length`` = L); reduction = 1 - peak(6) / peak(12). (b) Seeds 0
and 1, **300 steps** (cut for the budget), L = 64: error = 1 - validation accuracy (next-byte
prediction) at L = 64.

Left open and resolved here: (a) "18 ± 6 points" is a reduction in [12%, 24%], per regime.
(b) is judged on text only, per seed; the S-ind alternative is not run (an S-ind arm is 2000
steps, more than this claim's budget), so a refutation here is a refutation on text.

Cost (unit: one S-text arm, both seeds, 600 steps): 2 arms at width 96, 300 steps, ~3 units;
(a) compiles 4 training steps (~40 s each on the shared machine).

    attnjax audit experiments/claims --workdir runs/claims --only HD2
"""

from attnjax.audit import holds, over_regimes, over_seeds
from attnjax.audit.settings import get_config, with_seeds
from attnjax.bench.memory import train_step_memory
from attnjax.config import apply_overrides

ID = "HD2"
SOURCE = "002 §2.3"
CLAIM = "12 -> 6 heads at equal width cut peak memory 18% and tripled an error rate"
CRITERION = "(a) reduction 18 ± 6 points; (b) error(6)/error(12) >= 2 on text or S-ind"
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
HEADS, LENGTHS = (12, 6), (64, 128)
REDUCTION, RATIO = (0.12, 0.24), 2.0


def width96(heads: int) -> dict:
    return {"model.d_model": 96, "model.attention.num_heads": heads}


def get_sweep():
    return with_seeds([{**width96(h), **STEPS} for h in HEADS])


def peak_memory() -> dict:
    """``{L: {heads: train_step_memory row}}`` (MB figures kept)."""
    out = {}
    for length in LENGTHS:
        for heads in HEADS:
            config = apply_overrides(get_config(), {**width96(heads), "data.length": length,
                                                    "model.max_length": length})
            row = train_step_memory(config)
            out.setdefault(str(length), {})[str(heads)] = {
                k: row[k] / 2**20 for k in ("peak_bytes", "temp_bytes", "argument_bytes")}
    return out


def measure(runs) -> dict:
    errors = {str(h): {str(s): 1 - t.summary["eval"]["64"]["accuracy"]
                       for s, t in runs.by_seed({**width96(h), **STEPS}).items()}
              for h in HEADS}
    return {"memory_mb": peak_memory(), "error": errors}


def verdict(r):
    memory = r["memory_mb"]
    cut = {L: 1 - m["6"]["peak_bytes"] / m["12"]["peak_bytes"] for L, m in memory.items()}
    a = over_regimes({f"L={L}": REDUCTION[0] <= c <= REDUCTION[1] for L, c in cut.items()},
                     "peak MB of a training step 12 -> 6 heads: " + "; ".join(
                         f"L={L}: {memory[L]['12']['peak_bytes']:.1f} -> "
                         f"{memory[L]['6']['peak_bytes']:.1f} (-{c:.1%})" for L, c in cut.items())
                     + f"; 18 ± 6 points = [{REDUCTION[0]:.0%}, {REDUCTION[1]:.0%}]")
    error = r["error"]
    ratio = {s: error["6"][s] / error["12"][s] for s in error["12"]}
    ok, note = over_seeds({s: x >= RATIO for s, x in ratio.items()})
    b = holds(ok, "; ".join(filter(None, ["; ".join(
        f"seed {s}: error 12 heads {error['12'][s]:.4f}, 6 heads {error['6'][s]:.4f}, ratio "
        f"{x:.2f} (>= {RATIO}?)" for s, x in ratio.items()) + "; text only, S-ind not run",
        note])))
    return {"a": a, "b": b}


def _example(peak_6, error_6):
    mem = lambda p: {"peak_bytes": p, "temp_bytes": p - 3, "argument_bytes": 3.0}
    return {"memory_mb": {"64": {"12": mem(50.0), "6": mem(peak_6[0])},
                          "128": {"12": mem(130.0), "6": mem(peak_6[1])}},
            "error": {"12": {"0": 0.45, "1": 0.46}, "6": {"0": error_6, "1": error_6}}}


EXAMPLES = [
    (_example((41.0, 106.0), 0.95), {"a": "confirmed", "b": "confirmed"}),
    (_example((41.0, 90.0), 0.47), {"a": "scale-dependent", "b": "refuted"}),
    (_example((49.0, 125.0), 0.47), {"a": "refuted", "b": "refuted"}),
]
