"""The audit's shared settings (conventions of ../shared/design/CLAIMS.md, copied into
docs/CLAIMS_AUDIT.md): the small text setting every training claim starts from, its named
variants as overrides, the seeds, eps, and the S-op tensors of the op-level claims.

Every training run of the audit is ``get_config()`` with one override dict applied, so a run
named the same in two claims is the same run and is trained once.
"""

from __future__ import annotations

import numpy as np

from attnjax.config import Config
from attnjax.data import Dataset
from attnjax.experiment import small_text

EPS = 0.02              # nats: a loss difference smaller than this is no difference
SEEDS = (0, 1)          # every training claim runs each arm at these seeds

# S-text: byte-level text, 4 heads, RoPE, context 64, width 64, 2 layers, batch 16, 600
# steps at lr 3e-3 with 50 warmup steps, logged every 10 steps (for spike counts)
S_TEXT = {"data.length": 64, "model.max_length": 64, "train.log_every": 10}
S_WIDE = {"model.d_model": 128, "model.num_layers": 4}
S_128 = {"data.length": 128, "model.max_length": 128, "train.batch_size": 8}
S_SMALL = {"data.val_fraction": 0.995}          # ~23 kB of training text
S_IND = {"data.task": "induction", "data.vocab_size": 32, "model.vocab_size": 32,
         "train.steps": 2000, "train.final_lr_fraction": 1.0}
S_OP_SHAPE = (2, 128, 4, 32)                    # [batch, length, heads, head_dim]
# S-s2s (the cross-attention claims): an encoder-decoder of 2 + 2 layers, width 64, 4 heads,
# RoPE in both self-attentions (none in cross-attention); reversal of 8-32 content tokens of
# 32 (+ PAD, BOS, EOS: vocabulary 35), the source's real length (EOS included) drawn in
# [9, 33] and padded on the right to 33; room for BOS and 33 target tokens; 2000 steps of
# batch 32, evaluated and checkpointed at the end
S_S2S = {"model.family": "seq2seq", "model.encoder_position": "rope", "data.task": "reversal",
         "data.vocab_size": 35, "model.vocab_size": 35, "data.length": 33,
         "model.max_length": 34, "data.padding": "right", "data.min_length": 9,
         "train.batch_size": 32, "train.steps": 2000, "train.eval_every": 2000,
         "train.checkpoint_every": 2000}
S2S_SOURCES = 200                               # held-out sources of the S-s2s measurements


def get_config() -> Config:
    """S-text (``attnjax.experiment.small_text`` with ``S_TEXT``)."""
    return small_text(S_TEXT)


def with_seeds(entries: list[dict], seeds=SEEDS) -> list[dict]:
    """Every entry once per seed (the seed varies fastest, so replicas sit together)."""
    return [{**entry, "seed": seed} for entry in entries for seed in seeds]


def s2s_held_out(config: Config, count: int = S2S_SOURCES) -> dict:
    """``count`` validation examples of an S-s2s run (a fixed draw of its ``val`` split), as
    NumPy arrays: ``source``, ``source_mask``, ``inputs``, ``targets``, ``weights``,
    ``alignment``."""
    batch = Dataset(config.data).batch(config.seed, 0, count, config.data.length, "val")
    return {name: np.asarray(value) for name, value in batch.items()}


def s_op(seed: int = 0, shape=S_OP_SHAPE, dtype=np.float32) -> tuple[np.ndarray, ...]:
    """S-op: q, k, v ~ N(0, 1) of ``shape``, a pure function of ``seed``."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(dtype) for _ in range(3))


# The PE sweep shared by PE1, PE4 and PE6-PE14: S-text at L = 32 and S-128 (L = 128), each
# with these encodings, evaluated at 2L, 4L, 8L and 1024.
PE_KINDS = {
    "learned": {"model.position.kind": "learned", "model.position.learned_interpolate": True},
    "sinusoidal": {"model.position.kind": "sinusoidal"},
    "rope": {"model.position.kind": "rope"},
    "rope_base_1000": {"model.position.kind": "rope", "model.position.rope_base": 1000.0},
    "alibi": {"model.position.kind": "alibi"},
    "none": {"model.position.kind": "none"},
}
PE_LENGTHS = {
    32: {"data.length": 32, "model.max_length": 32, "data.eval_lengths": [64, 128, 256, 1024]},
    128: {**S_128, "data.eval_lengths": [256, 512, 1024]},
}


# The PE sweep evaluates with the chunked kernel: the function the model's reference kernel
# computes (equal losses to float rounding), without the [B, N, 1024, 1024] probabilities
# of every layer, and faster at long lengths (`attnjax bench attention`).
PE_EVAL = {"train.eval_kernel": "chunked"}


def pe_run(length: int, kind: str) -> dict:
    """The overrides of one PE-sweep arm (add ``seed``)."""
    return {**PE_LENGTHS[length], **PE_KINDS[kind], **PE_EVAL}


def pe_sweep(lengths=tuple(PE_LENGTHS), kinds=tuple(PE_KINDS)) -> list[dict]:
    """The PE-sweep runs (every seed) at these training lengths and encodings."""
    return with_seeds([pe_run(length, kind) for length in lengths for kind in kinds])
