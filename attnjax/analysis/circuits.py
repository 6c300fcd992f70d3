"""Activation and path patching experiments on pairs of inputs (``attnjax.analysis.patching``
underneath, every intervention of one experiment in one compiled program over a worlds axis,
in groups of worlds on a CPU: ``patching.default_group``).

A metric ``m(logits)`` reads the behaviour (``target_logprob``: the mean log-probability of
the scored targets; ``logit_diff``: the logit of token A minus that of B at the last
position). Activations are taken from a run on the ``source`` input and patched into a run on
the ``target`` input; with ``m_s`` and ``m_t`` the metric of the two unpatched runs, a patch
giving ``m`` moves the share ``(m - m_t) / (m_s - m_t)`` of the way: 1 when the target run
then behaves like the source, 0 when nothing changes. Denoising (source clean, target
corrupted) finds what is *sufficient* to restore a behaviour: the share recovered; noising
(source corrupted, target clean) finds what is *necessary*: the share lost. Heads that back
each other up each recover much and lose little; a head the others depend on loses much.

- ``head_patching``: each head's output (``z``, every position, or one position at a time)
  from the source run: ``[layers, heads]`` or ``[layers, heads, positions]``.
- ``position_patching``: the residual stream entering each block at one position from the
  source run: ``[layers, positions]``.
- ``path_patching``: for each sender head and each receiver head in a later layer, the
  sender's source output reaches only the receiver's queries, keys or values: first the
  target run with the sender patched and every other head frozen at its target output gives
  the receiver's inputs, then the target run with only those inputs of the receiver patched
  is scored: ``[senders, receivers, 3]`` (q, k, v).

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

from attnjax.analysis.capture import probe_examples, text_tokens
from attnjax.analysis.heatmaps import plot_head_matrix, token_labels
from attnjax.analysis.patching import (default_group, heads_where, patch, positions_where, run,
                                       run_worlds, stack)
from attnjax.config import Config
from attnjax.data import Dataset
from attnjax.data.tokenizer import load_tokenizer
from attnjax.outputs import output_directory
from attnjax.rundir import RunDir
from attnjax.train.footprint import check_inference, forward_bytes

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


def _shares(metric, source_logits, target_logits, logits_per_world) -> np.ndarray:
    source, target = float(metric(source_logits)), float(metric(target_logits))
    if abs(source - target) < 1e-9:
        raise ValueError(f"the two inputs give the same metric ({source:.4g} and {target:.4g}): "
                         "a patch has nothing to move")
    patched = np.asarray(jax.vmap(metric)(logits_per_world))
    return (patched - target) / (source - target)


def _z(layer: int) -> str:
    return f"block_{layer}.attention.z"


def head_patching(config: Config, params, source: dict, target: dict, metric, *,
                  by_position: bool = False) -> np.ndarray:
    """``[layers, heads]``: the share each head's source output moves the target run, at
    every position together; ``[layers, heads, positions]`` with ``by_position``."""
    L, N, T = config.model.num_layers, config.model.attention.num_heads, np.shape(
        target["inputs"])[1]
    names = [_z(layer) for layer in range(L)]
    source_logits, captured = run(config, params, source, capture=names)
    target_logits, _ = run(config, params, target)
    positions = [[t] for t in range(T)] if by_position else [list(range(T))]

    def where(name, layer, head, at):
        chosen = heads_where(name, [head] if name == _z(layer) else [], N)
        return chosen & positions_where(name, at, T)
    worlds = [{name: patch(captured[name], where=where(name, layer, h, at)) for name in names}
              for layer in range(L) for h in range(N) for at in positions]
    logits, _ = run_worlds(config, params, target, stack(worlds), group=default_group(target))
    shares = _shares(metric, source_logits, target_logits, logits).reshape(L, N, -1)
    return shares if by_position else shares[..., 0]


def position_patching(config: Config, params, source: dict, target: dict,
                      metric) -> np.ndarray:
    """``[layers, positions]``: the share the source residual stream entering block l at one
    position moves the target run."""
    L, T = config.model.num_layers, np.shape(target["inputs"])[1]
    names = [f"block_{layer}.resid_pre" for layer in range(L)]
    source_logits, captured = run(config, params, source, capture=names)
    target_logits, _ = run(config, params, target)
    worlds = [{name: patch(captured[name],
                           where=positions_where(name, [t] if l == layer else [], T))
               for l, name in enumerate(names)} for layer in range(L) for t in range(T)]
    logits, _ = run_worlds(config, params, target, stack(worlds), group=default_group(target))
    return _shares(metric, source_logits, target_logits, logits).reshape(L, T)


def path_patching(config: Config, params, source: dict, target: dict, metric,
                  heads=None) -> tuple[np.ndarray, list, list]:
    """``(shares [senders, receivers, 3], senders, receivers)``: senders and receivers are
    ``(layer, head)``, every head of a layer below the last a sender, every head of a layer
    above the first a receiver (of ``heads`` only, when given: a list of ``(layer, head)``,
    in layer order); the share is 0 where the receiver is not above the sender. A one-layer
    model has no paths (no senders, no receivers)."""
    L, N = config.model.num_layers, config.model.attention.num_heads
    chosen = sorted(heads) if heads is not None else [(l, h) for l in range(L)
                                                      for h in range(N)]
    senders = [(l, h) for l, h in chosen if l < L - 1]
    receivers = [(l, h) for l, h in chosen if l > 0]
    if not senders or not receivers:
        return np.zeros((len(senders), len(receivers), len(INPUTS))), senders, receivers
    z = [_z(layer) for layer in range(L)]
    inputs = [f"block_{layer}.attention.{x}" for layer in range(1, L) for x in INPUTS]
    source_logits, source_z = run(config, params, source, capture=z)
    target_logits, target_z = run(config, params, target, capture=z + inputs)
    # 1: each sender's source output, every other head frozen at its target one
    frozen = [{name: patch(jnp.where(heads_where(name, [h] if l == layer else [], N),
                                     source_z[name], target_z[name]))
               for l, name in enumerate(z)} for layer, h in senders]
    _, reached = run_worlds(config, params, target, stack(frozen), capture=inputs,
                            group=default_group(target))
    # 2: only the receiver's q, k or v from that run (k and v: its key/value head, which
    # the query heads of its group share)
    heads = {"q": N, "k": config.model.attention.kv_heads, "v": config.model.attention.kv_heads}
    worlds, index = [], []
    for (s, sender), (r, receiver), x in itertools.product(enumerate(senders),
                                                           enumerate(receivers), INPUTS):
        if receiver[0] <= sender[0]:
            continue
        chosen, head = f"block_{receiver[0]}.attention.{x}", receiver[1] * heads[x] // N
        worlds.append({name: patch(reached[name][s], where=heads_where(
            name, [head] if name == chosen else [], heads[name.rsplit(".", 1)[-1]]))
            for name in inputs})
        index.append((s, r, INPUTS.index(x)))
    shares = np.zeros((len(senders), len(receivers), len(INPUTS)))
    if worlds:
        logits, _ = run_worlds(config, params, target, stack(worlds), group=default_group(target))
        for (s, r, x), share in zip(index, _shares(metric, source_logits, target_logits,
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
    """``(clean, corrupted, metric)`` of two texts of as many tokens (counted before a probe
    cuts them to ``data.length``) and ``metric`` ``logit_diff:A,B`` (A and B each one token
    of the run's text)."""
    kind, _, tokens = metric.partition(":")
    if kind != "logit_diff" or len(tokens.split(",")) != 2:
        raise ValueError(f"--metric {metric!r} is not logit_diff:A,B (A, B: one token each)")
    sizes = [text_tokens(config, text, flag).size
             for text, flag in ((clean, "--clean"), (corrupt, "--corrupt"))]
    if sizes[0] != sizes[1]:
        raise ValueError(f"--clean and --corrupt must have as many tokens, got {sizes[0]} and "
                         f"{sizes[1]}")
    batches = [probe_examples(config, text=text, named=flag)
               for text, flag in ((clean, "--clean"), (corrupt, "--corrupt"))]
    ids = []
    for token in tokens.split(","):
        encoded = (load_tokenizer(config.data.tokenizer).encode(token, special=False)
                   if config.data.tokenizer else np.frombuffer(token.encode(), np.uint8))
        if encoded.size != 1:
            raise ValueError(f"--metric token {token!r} is {encoded.size} tokens of this run's "
                             "text, not one")
        ids.append(int(encoded[0]))
    return batches[0], batches[1], logit_diff(*ids)


def check_patching(config: Config, rows: int, length: int, by_position: bool,
                   named: str) -> None:
    """Refuse, in one line naming ``named``, patching experiments on pairs of ``rows`` x
    ``length`` tokens that cannot fit in memory: the logits every world of the largest
    experiment returns (a world per layer and head, per layer and position, or with
    ``by_position`` per layer, head and position), beside one forward pass."""
    model = config.model
    worlds = model.num_layers * (model.attention.num_heads * length if by_position else
                                 max(model.attention.num_heads, length))
    logits = worlds * rows * length * model.vocab_size * np.dtype(model.dtype).itemsize
    check_inference(config, {"activations": forward_bytes(config, rows, length),
                             f"the logits of {worlds} worlds": logits},
                    f"{named}: patching {rows} x {length} tokens",
                    "patch fewer (--examples) or shorter sequences")


def write_patch_report(run_dir, out_dir, *, clean: str | None = None,
                       corrupt: str | None = None, metric: str | None = None,
                       examples: int = 16, which: str = "best",
                       by_position: bool = False, paths: int | None = None) -> str:
    """Head patching both ways (``heads.png``: recovered by each head's clean output;
    ``heads_noising.png``: lost by its corrupted output), position and path patching
    (``positions.png``, ``path.png``) and ``patching.md`` of a run's checkpoint, on
    ``--clean``/``--corrupt`` texts with a ``logit_diff`` metric or an induction run's own pairs
    (``induction_pairs``) with ``target_logprob``; ``by_position`` adds each head at each
    position (``heads_by_position.png``); ``paths``: path patching among the ``paths`` heads
    whose clean output recovers the most (None: every pair of heads; 0: none, for a model
    whose pairs are too many to run). Returns the Markdown."""
    if paths is not None and paths < 0:
        raise ValueError(f"paths (--paths) must be >= 0, got {paths}")
    run_directory = RunDir(run_dir)
    config = run_directory.config()
    if clean is not None or corrupt is not None:
        if clean is None or corrupt is None or metric is None:
            raise ValueError("give --clean, --corrupt and --metric together")
        clean_batch, corrupt_batch, measure = text_pairs(config, clean, corrupt, metric)
        check_patching(config, *clean_batch["inputs"].shape, by_position, "--clean/--corrupt")
        described = f"the texts {clean!r} / {corrupt!r}, metric {metric}"
    else:
        check_patching(config, examples, config.data.length, by_position, "--examples")
        clean_batch, corrupt_batch = induction_pairs(config, examples, config.seed)
        measure = target_logprob(clean_batch)
        described = (f"{examples} induction examples, the first occurrence of the block "
                     "changed; metric: the mean log-probability of the scored targets")
    _, params, step = run_directory.params(which)
    recovered = head_patching(config, params, clean_batch, corrupt_batch, measure)
    lost = head_patching(config, params, corrupt_batch, clean_batch, measure)
    positions = position_patching(config, params, clean_batch, corrupt_batch, measure)
    top = None
    if paths is not None:                       # the heads recovering most, largest first
        order = np.argsort(-recovered.ravel(), kind="stable")[:paths]
        top = [tuple(int(i) for i in np.unravel_index(k, recovered.shape)) for k in order]
    paths, senders, receivers = path_patching(config, params, clean_batch, corrupt_batch,
                                              measure, top)
    among = "" if top is None else f" among the {len(top)} heads that recover the most"
    out = Path(out_dir)
    output_directory(out, "--out")
    name = f"{Path(run_dir).name} step {step}"
    plot_head_matrix(recovered, out / "heads.png", f"{name}: share of the metric recovered by "
                     "each head's clean output in the corrupted run", diverging=True,
                     label="recovered share")
    plot_head_matrix(lost, out / "heads_noising.png", f"{name}: share of the metric lost by "
                     "each head's corrupted output in the clean run", diverging=True,
                     label="lost share")
    labels = token_labels(clean_batch["inputs"][0], config.data)
    by_token = dict(diverging=True, label="recovered share", fmt="{:.2f}", columns=labels,
                    cell_width=min(1.0, 24.0 / len(labels)))
    plot_head_matrix(positions, out / "positions.png", f"{name}: share recovered by the clean "
                     "residual stream entering each block at one position",
                     axes=("position (example 0's tokens)", "block input"), **by_token)
    head_label = lambda lh: f"L{lh[0]}.H{lh[1]}"
    L, N = recovered.shape
    heads = [(layer, h) for layer in range(L) for h in range(N)]
    if by_position:
        at = head_patching(config, params, clean_batch, corrupt_batch, measure,
                           by_position=True)
        plot_head_matrix(at.reshape(L * N, -1), out / "heads_by_position.png",
                         f"{name}: share recovered by each head's clean output at one position",
                         rows=[head_label(lh) for lh in heads],
                         axes=("position (example 0's tokens)", "head"), **by_token)
    if senders and receivers:
        columns = [f"{head_label(r)} {x}" for r in receivers for x in INPUTS]
        plot_head_matrix(paths.reshape(len(senders), -1), out / "path.png",
                         f"{name}: path patching{among}, sender head -> receiver's q, k, v",
                         diverging=True, label="recovered share", fmt="{:.2f}",
                         rows=[head_label(s) for s in senders], columns=columns,
                         axes=("receiver input", "sender head"))
    else:                                   # an earlier report's would be read as this one's
        (out / "path.png").unlink(missing_ok=True)
    values = [float(measure(run(config, params, batch)[0]))
              for batch in (clean_batch, corrupt_batch)]
    lines = [f"# Patching: {name}", "", f"On {described}.", "",
             f"The metric: {values[0]:+.4f} on the clean input, {values[1]:+.4f} on the "
             "corrupted one (a share of 1 moves it the whole way between them).", "",
             "| head | recovered by its clean output | lost by its corrupted output |",
             "|---|---|---|"]
    lines += [f"| {head_label(lh)} | {recovered[lh]:+.3f} | {lost[lh]:+.3f} |" for lh in heads]
    order = np.argsort(-paths.ravel(), kind="stable")[:5]
    lines += ["", f"Largest paths{among} (sender -> receiver input: recovered share):"
              if senders and receivers else
              "No paths: a one-layer model has no head that feeds another (no path.png)."
              if top is None else f"No paths{among} (no path.png).", ""]
    for index in order:
        s, r, x = np.unravel_index(index, paths.shape)
        lines.append(f"- {head_label(senders[s])} -> {head_label(receivers[r])} {INPUTS[x]}: "
                     f"{paths[s, r, x]:+.3f}")
    text = "\n".join(lines) + "\n"
    (out / "patching.md").write_text(text)
    return text
