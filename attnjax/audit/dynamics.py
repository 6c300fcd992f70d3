"""A trained run's dynamics as CLAIMS.md defines them (conventions of docs/CLAIMS_AUDIT.md):

- spike: a logged training loss above the previous logged one by more than 0.3, both logged
  at or after the warmup (``train.log_every=10`` in S-text);
- diverged: an error, a non-finite logged or evaluated loss, a skipped update, or a final
  training loss (the last logged one) above the step-0 loss minus 0.1, where the step-0 loss
  is the validation loss of the initial parameters (``summary.json``'s ``initial_loss``: an
  untrained model's training and validation losses agree).
"""

from __future__ import annotations

import math

import numpy as np

SPIKE = 0.3              # nats: a rise of the logged training loss larger than this is a spike
DIVERGED_MARGIN = 0.1    # nats: a run must end this far below its step-0 loss


def logged(trained) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, training losses)`` of every logged record."""
    records = trained.dir.metrics()
    return (np.array([r["step"] for r in records]), np.array([r["loss"] for r in records]))


def loss_changes(trained) -> np.ndarray:
    """Logged training loss minus the previous logged one, both at or after the warmup."""
    steps, losses = logged(trained)
    return np.diff(losses[steps >= trained.config.train.warmup_steps])


def spikes(trained) -> int:
    """Rises of the logged training loss by more than ``SPIKE`` after the warmup."""
    return int(np.sum(loss_changes(trained) > SPIKE))


def diverged(trained) -> str | None:
    """Why the run diverged (the definition above), or None."""
    error = trained.dir.error()
    summary = trained.dir.summary()
    if error is not None or summary is None:
        return (error or "no summary").strip().splitlines()[-1]
    losses = list(logged(trained)[1]) + [r["loss"] for r in summary["eval"].values()]
    if not all(math.isfinite(x) for x in losses):
        return "non-finite loss"
    if summary["skipped_updates"]:
        return f"{summary['skipped_updates']} skipped updates"
    start, final = summary["initial_loss"], summary["train_loss"]
    if final > start - DIVERGED_MARGIN:
        return f"final training loss {final:.3f} > step-0 loss {start:.3f} - {DIVERGED_MARGIN}"
    return None


def attention_grad_max(trained) -> float:
    """Largest logged ``grad_norm/block_<l>/attention`` (W_qkv and W_o together, before
    clipping) over layers and logged steps; NaN when a logged one is NaN or none was logged."""
    values = [v for r in trained.dir.metrics() for k, v in r.items()
              if k.startswith("grad_norm/block_") and k.endswith("/attention")]
    return float(np.max(values)) if values else float("nan")


def seeds_text(by_seed: dict, key: str, spec: str = ".3f") -> str:
    """``by_seed[s][key]`` of every seed, ``/``-separated (``-`` for None)."""
    return "/".join("-" if x[key] is None else format(x[key], spec) for x in by_seed.values())
