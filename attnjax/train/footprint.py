"""The memory a training run, an evaluation or an inference needs at least, from shapes alone,
and the check ``attnjax train`` and ``attnjax eval`` make with it before anything is allocated
or written (``check_training``, ``check_evaluation``), and the other commands with
``check_inference`` (a probe, a beam search): a one-line ``ValueError`` with the estimated and
the available bytes.

The estimate is a lower bound, so that nothing that fits is refused, and costs one
``jax.eval_shape`` (nothing compiled, nothing allocated):

- parameters and optimizer state: ``jax.eval_shape`` of the model's and AdamW's
  initialisation; training adds the gradients (the parameters' bytes again);
- the attention scores of one layer, where the kernel materialises them (a kernel that can
  return the weights: ``reference``, ``masked_fill``): rows x heads x T x T, 4 bytes each
  (logits in float32; ``masked_fill`` with ``logits_dtype='input'`` in the compute dtype),
  for the rows of one device's micro-batch in training and of one evaluation forward pass
  (``eval_chunk_rows``: at most 1024 tokens, one row at least) at every evaluated length;
- the logits of those rows (rows x T x vocab, compute dtype) and an evaluation's batches
  (inputs and targets as int32, all stacked before its one dispatch);
- an inference's own parts (``check_inference``): every layer's attention weights a probe
  returns (``weights_bytes``), a KV cache of ``model.max_length`` slots per row
  (``cache_bytes``).

Memory available: an accelerator's per-device limit (``memory_stats()['bytes_limit']``), else
the host's MemAvailable plus SwapFree (``/proc/meminfo``; ``os.sysconf`` where there is none).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.config import Config
from attnjax.models import build
from attnjax.registry import KERNELS
from attnjax.train.loop import eval_chunk_rows
from attnjax.train.optim import make_optimizer

MEMINFO = Path("/proc/meminfo")


def tree_bytes(tree) -> int:
    """Bytes of every array of a pytree (or of its shapes), from its shapes and dtypes."""
    leaves = jax.tree_util.tree_leaves(tree)
    return sum(leaf.size * np.dtype(leaf.dtype).itemsize for leaf in leaves)


def state_bytes(config: Config) -> tuple[int, int]:
    """``(parameter bytes, optimizer-state bytes)`` of ``config``'s training state, from its
    shapes (``jax.eval_shape``: nothing is allocated or compiled). Not through
    ``init_state``, whose compiled program is cached: traced here, it would keep a tracer."""
    model, tx = build(config.model), make_optimizer(config.train)

    def initialise():
        tokens = jnp.zeros((1, config.data.length), jnp.int32)
        params = model.init(jax.random.key(0), tokens)["params"]
        return params, tx.init(params)

    params, opt_state = jax.eval_shape(initialise)
    return tree_bytes(params), tree_bytes(opt_state)


def forward_bytes(config: Config, rows: int, length: int) -> int:
    """Bytes a forward pass of ``rows`` sequences of ``length`` tokens holds at least: one
    layer's attention scores, where the kernel materialises them, and the logits."""
    model = config.model
    spec = KERNELS.get(model.attention.kernel)
    compute = np.dtype(model.dtype).itemsize
    scores = 0
    if "return_weights" in spec.supports:      # it computes the whole [B, N, T, S] weights
        width = 4 if model.attention.logits_dtype == "float32" else min(4, compute)
        scores = rows * model.attention.num_heads * length * length * width
    return scores + rows * length * model.vocab_size * compute


def weights_bytes(config: Config, rows: int, length: int) -> int:
    """Bytes of every layer's attention weights of ``rows`` sequences of ``length`` tokens, as
    a probe returns them (``[layers, rows, heads, T, T]`` float32)."""
    model = config.model
    return model.num_layers * rows * model.attention.num_heads * length * length * 4


def cache_bytes(config: Config, rows: int) -> int:
    """Bytes of the KV cache of ``rows`` sequences: every layer's keys and values at
    ``model.max_length`` slots, in the compute dtype (``nn.attention``'s ``cached_key`` and
    ``cached_value``)."""
    model = config.model
    width = model.attention.kv_heads * (model.head_dim + model.value_head_dim)
    return rows * model.num_layers * model.max_length * width * np.dtype(model.dtype).itemsize


def evaluation_bytes(config: Config, length: int, devices: int = 1,
                     window: int | None = None) -> int:
    """Bytes an evaluation at ``length`` holds at least beside the parameters: its stacked
    batches and one forward pass (of ``window`` tokens in a strided evaluation)."""
    evaluated, cfg = config.evaluated(), config.train
    rows = -(-eval_chunk_rows(cfg.eval_batch_size, length) // devices)
    batches = cfg.eval_batches * cfg.eval_batch_size * length * 2 * 4 // devices
    return batches + forward_bytes(evaluated, rows, window or length)


def training_needs(config: Config, devices: int = 1) -> dict[str, int]:
    """The bytes one device holds at least while training ``config``, by part: the training
    state, the gradients, and the larger of a training step's and an evaluation's
    activations (evaluations at ``data.lengths`` run between steps)."""
    params, optimizer = state_bytes(config)
    cfg = config.train
    rows = -(-(cfg.batch_size // cfg.grad_accum) // devices)
    step = forward_bytes(config, rows, config.data.length)
    evaluations = max(evaluation_bytes(config, length, devices) for length in config.data.lengths)
    return {"parameters": params, "optimizer state": optimizer, "gradients": params,
            "activations": max(step, evaluations)}


def available_bytes() -> tuple[int | None, str]:
    """The memory one device may use, and where the figure comes from (None: unknown)."""
    backend = jax.default_backend()
    if backend != "cpu":
        stats = jax.local_devices()[0].memory_stats() or {}
        if stats.get("bytes_limit"):
            return int(stats["bytes_limit"]), f"the {backend} device's limit"
    if MEMINFO.is_file():
        fields = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines()
                      if ":" in line)
        if "MemAvailable" in fields:
            kib = [int(fields.get(name, "0 kB").split()[0]) for name in ("MemAvailable",
                                                                         "SwapFree")]
            return sum(kib) * 1024, "MemAvailable + SwapFree"
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free pages"
    except (ValueError, OSError):
        return None, "unknown"


def size(n: int) -> str:
    """``n`` bytes to read: ``1.5 GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _refuse_beyond(needs: dict[str, int], what: str, advice: str) -> None:
    total = sum(needs.values())
    available, source = available_bytes()
    if available is not None and total > available:
        parts = ", ".join(f"{name} {size(n)}" for name, n in needs.items() if n)
        raise ValueError(f"{what} needs at least {total} bytes ({size(total)}: {parts}) but "
                         f"{available} bytes ({size(available)}) of memory are available "
                         f"({source}); {advice}")


def check_training(config: Config) -> None:
    """Refuse a config whose training cannot fit in one device's memory (see the module
    docstring), naming the estimate, the memory available and the fields to change."""
    needs = training_needs(config, jax.device_count())
    state = needs["parameters"] + needs["optimizer state"] + needs["gradients"]
    advice = ("make the model smaller (model.d_model, model.num_layers, model.mlp_ratio or "
              "model.mlp_hidden, model.vocab_size)" if state >= needs["activations"] else
              "a smaller train.batch_size (or more train.grad_accum), shorter data.length or "
              "data.eval_lengths, fewer train.eval_batch_size, or model.attention.kernel="
              "chunked (its scores are blocks)")
    _refuse_beyond(needs, "training this config", advice)


def check_evaluation(config: Config, lengths, window: int | None = None,
                     named: str = "--lengths") -> None:
    """Refuse an evaluation of ``config`` at ``lengths`` (``named``: where they come from)
    that cannot fit in one device's memory, naming the first length that does not."""
    params, _ = state_bytes(config)
    devices = jax.device_count()
    for length in lengths:
        parts = {"batches and activations": evaluation_bytes(config, length, devices, window)}
        check_inference(config, parts, f"{named} {length}: evaluating at length {length}",
                        "evaluate at shorter lengths, or with train.eval_kernel=chunked (its "
                        "scores are blocks)", parameters=params)


def check_inference(config: Config, parts: dict[str, int], what: str, advice: str, *,
                    parameters: int | None = None) -> None:
    """Refuse, in one line, an inference of ``config`` (``what``: the options that ask for it;
    ``advice``: what to change) that cannot fit in one device's memory: its parameters
    (``parameters`` bytes, default ``state_bytes``') and ``parts`` beside them (a part's name
    -> bytes: ``forward_bytes``, ``weights_bytes``, ``cache_bytes``, ...)."""
    if parameters is None:
        parameters, _ = state_bytes(config)
    _refuse_beyond({"parameters": parameters, **parts}, what, advice)
