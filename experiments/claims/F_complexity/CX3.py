"""CX3: doubling the length (512 -> 1024) while halving the batch still ran out of memory: the
n^2 attention scores dominate training memory, not the parameters.

Measure: the peak memory of one compiled S-wide training step (width 128, 4 layers, 8 heads of
head_dim 16, attnjax's default reference kernel, float32;
``attnjax.bench.memory.train_step_memory``: arguments + outputs - donated + temporaries, from
XLA's buffer assignment, compiled with unoptimised machine code and not run) at (n, B) and (2n,
B/2), same tokens per batch, ``data.length`` = ``model.max_length``; and the parameters +
optimizer state (AdamW: two moments) as a share of the larger peak. Regimes: n = 128 (B 32 ->
256, B 16) and n = 512 (B 8 -> 1024, B 4).

Four compilations of a 4-layer training step (nothing initialised or run): ~8 s each on one
core (2 s of tracing, 6 s of XLA).

    attnjax audit experiments/claims --workdir runs/claims --only CX3
"""

from attnjax.audit import over_regimes
from attnjax.audit.settings import S_WIDE, get_config
from attnjax.bench.memory import train_step_memory
from attnjax.config import apply_overrides

ID = "CX3"
SOURCE = "000 §6.2"
CLAIM = "length 512 -> 1024 at half the batch still ran out of memory: n^2 scores dominate"
CRITERION = ("peak(2n, B/2) >= 1.1x peak(n, B) and parameters + optimizer < 50% of the larger "
             "peak")
REGIMES = {128: 32, 512: 8}
TEST_SIZE = {"REGIMES": {128: 32}}      # the suite: one regime (two compilations)
GROWTH, STATE_SHARE = 1.1, 0.5


def step_memory(length: int, batch: int) -> dict:
    config = apply_overrides(get_config(), {
        **S_WIDE, "model.attention.num_heads": 8, "data.length": length,
        "model.max_length": length, "train.batch_size": batch})
    row = train_step_memory(config, buffers_only=True)
    return {"peak_mb": row["peak_bytes"] / 2**20, "temp_mb": row["temp_bytes"] / 2**20,
            "state_mb": (row["parameter_bytes"] + row["optimizer_bytes"]) / 2**20}


def measure() -> dict:
    return {str(n): {"short": step_memory(n, batch), "long": step_memory(2 * n, batch // 2)}
            for n, batch in REGIMES.items()}


def verdict(r):
    holding, text = {}, []
    for n, x in r.items():
        short, long = x["short"], x["long"]
        growth = long["peak_mb"] / short["peak_mb"]
        share = long["state_mb"] / max(short["peak_mb"], long["peak_mb"])
        holding[f"n={n}"] = growth >= GROWTH and share < STATE_SHARE
        text.append(f"n={n}, B={REGIMES[int(n)]}: peak {short['peak_mb']:.0f} -> "
                    f"{long['peak_mb']:.0f} MB at 2n, B/2 (x{growth:.2f}); parameters + "
                    f"optimizer {long['state_mb']:.1f} MB = {share:.1%} of the larger peak")
    return over_regimes(holding, "; ".join(text)
                        + f"; limits x{GROWTH}, < {STATE_SHARE:.0%}")


def _example(growth, state):
    row = lambda peak: {"peak_mb": peak, "temp_mb": peak - 20, "state_mb": state}
    return {str(n): {"short": row(500.0), "long": row(500.0 * g)}
            for n, g in zip(REGIMES, growth)}


EXAMPLES = [
    (_example((1.4, 1.8), 9.4), "confirmed"),
    (_example((1.05, 1.8), 9.4), "scale-dependent"),
    (_example((1.4, 1.8), 600.0), "refuted"),
]
