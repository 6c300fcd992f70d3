"""Activation and path patching experiments on clean / corrupted input pairs
(``attnjax.analysis.patching`` underneath, every intervention of one experiment in one
batched pass).

A metric ``m(logits)`` reads the behaviour (``target_logprob``: the mean log-probability of
the scored targets; ``logit_diff``: the logit of token A minus that of B at the last
position). With ``m_c`` on the clean input and ``m_x`` on the corrupted one, an intervention on
the corrupted run that gives ``m`` recovers the share ``(m - m_x) / (m_c - m_x)``: 1 when it
restores the clean behaviour, 0 when it changes nothing.

- ``head_patching``: each head's output (``z``, every position) from the clean run:
  ``[layers, heads]``.
- ``position_patching``: the residual stream entering each block at one position from the
  clean run: ``[layers, positions]``.
- ``path_patching``: for each sender head and each receiver head in a later layer, the
  sender's clean output reaches only the receiver's queries, keys or values: first the
  corrupted run with the sender patched and every other head frozen at its corrupted output
  gives the receiver's inputs, then the corrupted run with only those inputs of the receiver
  patched is scored: ``[senders, receivers, 3]`` (q, k, v).

References: Vig et al. 2020 and Meng et al. 2022 (activation patching); Wang et al. 2023,
"Interpretability in the Wild" (path patching).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.capture import probe_examples
from attnjax.analysis.heatmaps import plot_head_matrix, token_labels
from attnjax.analysis.patching import heads_where, patch, positions_where, run, run_worlds, stack
from attnjax.config import Config
from attnjax.data import Dataset
from attnjax.data.tokenizer import load_tokenizer
from attnjax.rundir import RunDir

INPUTS = ("q", "k", "v")            # a receiver head's inputs path patching reaches


def target_logprob(batch: dict) -> Callable:
    """``m(logits)``: the mean log-probability of ``batch``'s targets at its scored positions."""
    targets, weights = jnp.asarray(batch["targets"]), jnp.asarray(batch["weights"])

    def metric(logits):
        logprobs = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logprobs, targets[..., None], -1)[..., 0]
        return (picked * weights).sum() / weights.sum()
    return metric


def logit_diff(a: int, b: int) -> Callable:
    """``m(logits)``: the logit of token ``a`` minus that of ``b`` at the last position, mean
    over the batch."""
    return lambda logits: (logits[:, -1, a] - logits[:, -1, b]).mean()


def _shares(metric, clean_logits, corrupt_logits, logits_per_world) -> np.ndarray:
    clean, corrupt = float(metric(clean_logits)), float(metric(corrupt_logits))
    if abs(clean - corrupt) < 1e-9:
        raise ValueError(f"the corruption does not change the metric (clean {clean:.4g}, "
                         f"corrupted {corrupt:.4g}): nothing to recover")
    patched = np.asarray(jax.vmap(metric)(logits_per_world))
    return (patched - corrupt) / (clean - corrupt)


def _z(layer: int) -> str:
    return f"block_{layer}.attention.z"


def head_patching(config: Config, params, clean: dict, corrupt: dict, metric) -> np.ndarray:
    """``[layers, heads]``: the share each head's clean output recovers."""
    L, N = config.model.num_layers, config.model.attention.num_heads
    names = [_z(layer) for layer in range(L)]
    clean_logits, captured = run(config, params, clean, capture=names)
    corrupt_logits, _ = run(config, params, corrupt)
    worlds = [{name: patch(captured[name], where=heads_where(name, [h] if l == layer else [], N))
               for l, name in enumerate(names)} for layer in range(L) for h in range(N)]
    logits, _ = run_worlds(config, params, corrupt, stack(worlds))
    return _shares(metric, clean_logits, corrupt_logits, logits).reshape(L, N)


def position_patching(config: Config, params, clean: dict, corrupt: dict,
                      metric) -> np.ndarray:
    """``[layers, positions]``: the share the clean residual stream entering block l at one
    position recovers."""
    L, T = config.model.num_layers, np.shape(clean["inputs"])[1]
    names = [f"block_{layer}.resid_pre" for layer in range(L)]
    clean_logits, captured = run(config, params, clean, capture=names)
    corrupt_logits, _ = run(config, params, corrupt)
    worlds = [{name: patch(captured[name],
                           where=positions_where(name, [t] if l == layer else [], T))
               for l, name in enumerate(names)} for layer in range(L) for t in range(T)]
    logits, _ = run_worlds(config, params, corrupt, stack(worlds))
    return _shares(metric, clean_logits, corrupt_logits, logits).reshape(L, T)


def path_patching(config: Config, params, clean: dict, corrupt: dict,
                  metric) -> tuple[np.ndarray, list, list]:
    """``(shares [senders, receivers, 3], senders, receivers)``: senders and receivers are
    ``(layer, head)``, every head of a layer below the last a sender, every head of a layer
    above the first a receiver; the share is 0 where the receiver is not above the sender."""
    L, N = config.model.num_layers, config.model.attention.num_heads
    z = [_z(layer) for layer in range(L)]
    inputs = [f"block_{layer}.attention.{x}" for layer in range(1, L) for x in INPUTS]
    clean_logits, clean_z = run(config, params, clean, capture=z)
    corrupt_logits, corrupt_z = run(config, params, corrupt, capture=z + inputs)
    senders = [(l, h) for l in range(L - 1) for h in range(N)]
    receivers = [(l, h) for l in range(1, L) for h in range(N)]
    # 1: each sender's clean output, every other head frozen at its corrupted one
    frozen = [{name: patch(jnp.where(heads_where(name, [h] if l == layer else [], N),
                                     clean_z[name], corrupt_z[name]))
               for l, name in enumerate(z)} for layer, h in senders]
    _, reached = run_worlds(config, params, corrupt, stack(frozen), capture=inputs)
    # 2: only the receiver's q, k or v from that run (k and v: its key/value head, which
    # the query heads of its group share)
    heads = {"q": N, "k": config.model.attention.kv_heads, "v": config.model.attention.kv_heads}
    worlds, index = [], []
    for (s, sender), (r, receiver), x in itertools.product(enumerate(senders),
                                                           enumerate(receivers), INPUTS):
        if receiver[0] <= sender[0]:
            continue
        target, head = f"block_{receiver[0]}.attention.{x}", receiver[1] * heads[x] // N
        worlds.append({name: patch(reached[name][s], where=heads_where(
            name, [head] if name == target else [], heads[name.rsplit(".", 1)[-1]]))
            for name in inputs})
        index.append((s, r, INPUTS.index(x)))
    shares = np.zeros((len(senders), len(receivers), len(INPUTS)))
    if worlds:
        logits, _ = run_worlds(config, params, corrupt, stack(worlds))
        for (s, r, x), share in zip(index, _shares(metric, clean_logits, corrupt_logits,
                                                   logits), strict=True):
            shares[s, r, x] = share
    return shares, senders, receivers


def induction_pairs(config: Config, count: int, seed: int = 0) -> tuple[dict, dict]:
    """``(clean, corrupted)``: ``count`` validation examples of an induction run and the same
    with the first occurrence of the repeated block (its first ``length // 4`` tokens) changed
    to other tokens, so the second occurrence can no longer be predicted from it."""
    if config.data.task != "induction":
        raise ValueError(f"the run's own clean/corrupted pairs exist for data.task='induction', "
                         f"not {config.data.task!r}: give --clean TEXT --corrupt TEXT")
    clean = jax.device_get(Dataset(config.data).batch(seed, 0, count, config.data.length,
                                                      "val"))
    inputs = np.array(clean["inputs"])
    block, V = config.data.length // 4, config.data.vocab_size
    # uniform over the task's other tokens 1..V-1: a shift by 1..V-2 within them
    shift = np.random.default_rng(seed).integers(1, V - 1, size=(len(inputs), block))
    inputs[:, :block] = 1 + (inputs[:, :block] - 1 + shift) % (V - 1)
    return clean, {**clean, "inputs": inputs}


def text_pairs(config: Config, clean: str, corrupt: str,
               metric: str) -> tuple[dict, dict, Callable]:
    """``(clean, corrupted, metric)`` of two texts of as many tokens and ``metric``
    ``logit_diff:A,B`` (A and B each one token of the run's text)."""
    kind, _, tokens = metric.partition(":")
    if kind != "logit_diff" or len(tokens.split(",")) != 2:
        raise ValueError(f"--metric {metric!r} is not logit_diff:A,B (A, B: one token each)")
    batches = [probe_examples(config, text=text) for text in (clean, corrupt)]
    if batches[0]["inputs"].shape != batches[1]["inputs"].shape:
        raise ValueError(f"--clean and --corrupt must have as many tokens, got "
                         f"{batches[0]['inputs'].shape[1]} and {batches[1]['inputs'].shape[1]}")
    ids = []
    for token in tokens.split(","):
        encoded = (load_tokenizer(config.data.tokenizer).encode(token, special=False)
                   if config.data.tokenizer else np.frombuffer(token.encode(), np.uint8))
        if encoded.size != 1:
            raise ValueError(f"--metric token {token!r} is {encoded.size} tokens of this run's "
                             "text, not one")
        ids.append(int(encoded[0]))
    return batches[0], batches[1], logit_diff(*ids)


def write_patch_report(run_dir, out_dir, *, clean: str | None = None,
                       corrupt: str | None = None, metric: str | None = None,
                       examples: int = 16, which: str = "best") -> str:
    """Head, position and path patching of a run's checkpoint (``heads.png``,
    ``positions.png``, ``path.png``, ``patching.md``) on ``--clean``/``--corrupt`` texts with
    a ``logit_diff`` metric, or an induction run's own pairs (``induction_pairs``) with
    ``target_logprob``; returns the Markdown."""
    config, params, step = RunDir(run_dir).params(which)
    if clean is not None or corrupt is not None:
        if clean is None or corrupt is None or metric is None:
            raise ValueError("give --clean, --corrupt and --metric together")
        clean_batch, corrupt_batch, measure = text_pairs(config, clean, corrupt, metric)
        described = f"the texts {clean!r} / {corrupt!r}, metric {metric}"
    else:
        clean_batch, corrupt_batch = induction_pairs(config, examples, config.seed)
        measure = target_logprob(clean_batch)
        described = (f"{examples} induction examples, the first occurrence of the block "
                     "changed; metric: the mean log-probability of the scored targets")
    heads = head_patching(config, params, clean_batch, corrupt_batch, measure)
    positions = position_patching(config, params, clean_batch, corrupt_batch, measure)
    paths, senders, receivers = path_patching(config, params, clean_batch, corrupt_batch,
                                              measure)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{Path(run_dir).name} step {step}"
    plot_head_matrix(heads, out / "heads.png", f"{name}: share of the metric recovered by "
                     "each head's clean output", diverging=True, label="recovered share")
    labels = token_labels(clean_batch["inputs"][0], config.data)
    plot_head_matrix(positions, out / "positions.png", f"{name}: share recovered by the clean "
                     "residual stream entering each block at one position", diverging=True,
                     label="recovered share", fmt="{:.2f}", columns=labels,
                     axes=("position (example 0's tokens)", "block input"),
                     cell_width=min(1.0, 24.0 / len(labels)))
    head_label = lambda lh: f"L{lh[0]}.H{lh[1]}"
    columns = [f"{head_label(r)} {x}" for r in receivers for x in INPUTS]
    plot_head_matrix(paths.reshape(len(senders), -1), out / "path.png",
                     f"{name}: path patching, sender head -> receiver's q, k, v",
                     diverging=True, label="recovered share", fmt="{:.2f}",
                     rows=[head_label(s) for s in senders], columns=columns,
                     axes=("receiver input", "sender head"))
    L, N = heads.shape
    lines = [f"# Patching: {name}", "", f"On {described}.", "",
             "| head | recovered share |", "|---|---|"]
    lines += [f"| L{l}.H{h} | {heads[l, h]:+.3f} |" for l in range(L) for h in range(N)]
    order = np.argsort(-paths.ravel(), kind="stable")[:5]
    lines += ["", "Largest paths (sender -> receiver input: recovered share):", ""]
    for index in order:
        s, r, x = np.unravel_index(index, paths.shape)
        lines.append(f"- {head_label(senders[s])} -> {head_label(receivers[r])} {INPUTS[x]}: "
                     f"{paths[s, r, x]:+.3f}")
    text = "\n".join(lines) + "\n"
    (out / "patching.md").write_text(text)
    return text
