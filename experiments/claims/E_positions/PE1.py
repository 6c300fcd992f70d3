"""PE1: without position information attention is order-blind (permuting the tokens only
permutes the scores), so position must be injected.

Measure: (a) op level: S-op q, k, v (seed 0), non-causal, no encoding, through attnjax's
``dot_product_attention``; P a random permutation of the 128 positions (numpy seed 0):
max |attn(Pq, Pk, Pv) - P attn(q, k, v)|. (b) the PE-sweep runs at L = 128 (S-128, 600 steps)
with encodings none, rope and learned, seeds 0 and 1: (b1) on the first 32 validation
sequences of 128 bytes (``analysis.capture.probe_batch``), the mean over sequences of
KL(p || p~) of the last position's next-byte distribution, p~ with bytes 0-95 of each
sequence shuffled (numpy seed 0, one permutation per sequence) and bytes 96-127 kept;
(b2) validation loss at L.

Left open and resolved here: (b2) "none worse than rope and learned by > eps" is judged per
seed (loss(none) - loss(kind) > eps for both kinds and every seed). The causal model is the one
the sweep trains; a causal model is not exactly order-blind even without an encoding (the
earlier positions see different prefixes after the shuffle), which is what (b1) measures.

Cost: the 6 PE-sweep runs at L = 128 used here (shared with PE4, PE6-PE13), ~6 units.

    attnjax audit experiments/claims --workdir runs/claims --only PE1
"""

import functools

import jax
import numpy as np

from attnjax.analysis.capture import probe_batch
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import EPS, pe_run, pe_sweep, s_op
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.models import build
from attnjax.ops import dot_product_attention

ID = "PE1"
SOURCE = "000 §5.1"
CLAIM = "without position information attention is order-blind, so position must be injected"
CRITERION = ("(a) max |attn(Px) - P attn(x)| <= 1e-5; (b1) none's last-position KL under a "
             "shuffle of bytes 0-95 <= 0.01; (b2) none worse than rope and learned by > eps")
L, SHUFFLED, PROBES = 128, 96, 32
KINDS = ("none", "rope", "learned")
OP_TOLERANCE, KL_TOLERANCE = 1e-5, 0.01


def get_sweep():
    return pe_sweep(lengths=(L,), kinds=KINDS)


def permutation_error() -> float:
    """max |attn(Pq, Pk, Pv) - P attn(q, k, v)| on S-op, non-causal, no encoding."""
    q, k, v = s_op(0)
    perm = np.random.default_rng(0).permutation(q.shape[1])
    out = np.asarray(dot_product_attention(q, k, v))
    permuted = np.asarray(dot_product_attention(q[:, perm], k[:, perm], v[:, perm]))
    return float(np.abs(permuted - out[:, perm]).max())


@functools.lru_cache(maxsize=8)
def _last_log_probs(model_config):
    """Jitted ``(params, tokens [B, T]) -> log p(next byte)`` at the last position ``[B, V]``."""
    model = build(model_config)
    return jax.jit(lambda params, tokens: jax.nn.log_softmax(
        model.apply({"params": params}, tokens)[0][:, -1]))


def shuffle_kl(config, params, tokens: np.ndarray) -> float:
    """Mean over sequences of KL(p || p~) (nats) of the last position's prediction, p~ with
    tokens 0..SHUFFLED-1 of each sequence permuted."""
    rng = np.random.default_rng(0)
    shuffled = tokens.copy()
    for row in shuffled:
        row[:SHUFFLED] = row[rng.permutation(SHUFFLED)]
    logp = np.asarray(_last_log_probs(config.model)(params, np.concatenate([tokens, shuffled])),
                      np.float64)
    p, p_shuffled = np.split(logp, 2)
    return float((np.exp(p) * (p - p_shuffled)).sum(-1).mean())


def measure(runs) -> dict:
    out = {"op_error": permutation_error(), "loss": {}, "kl": {}}
    for kind in KINDS:
        out["loss"][kind], out["kl"][kind] = {}, {}
        for seed, trained in runs.by_seed(pe_run(L, kind)).items():
            config, params, _ = trained.dir.params("best")
            tokens = probe_batch(config, batch_size=PROBES, length=L)
            out["loss"][kind][str(seed)] = trained.loss()
            out["kl"][kind][str(seed)] = shuffle_kl(config, params, np.asarray(tokens))
    return out


def verdict(r):
    loss, kl = r["loss"], r["kl"]
    seeds = list(loss["none"])
    blind, blind_note = over_seeds({s: kl["none"][s] <= KL_TOLERANCE for s in seeds})
    worse, worse_note = over_seeds({s: all(loss["none"][s] - loss[k][s] > EPS
                                           for k in ("rope", "learned")) for s in seeds})
    show = lambda table: "; ".join(
        f"{k} " + "/".join(f"{table[k][s]:.4f}" for s in seeds) for k in KINDS)
    return {
        "a": holds(r["op_error"] <= OP_TOLERANCE,
                   f"max |attn(Px) - P attn(x)| = {r['op_error']:.2e}"),
        "b1": holds(blind, "; ".join(filter(None, [
            f"last-position KL after shuffling bytes 0-{SHUFFLED - 1} (seeds {'/'.join(seeds)}):"
            f" {show(kl)}", blind_note]))),
        "b2": holds(worse, "; ".join(filter(None, [
            f"loss at L={L} (seeds {'/'.join(seeds)}): {show(loss)}", worse_note]))),
    }


def _example(op_error, kl_none, loss_none):
    return {"op_error": op_error,
            "loss": {"none": {"0": loss_none, "1": loss_none},
                     "rope": {"0": 2.0, "1": 2.0}, "learned": {"0": 2.05, "1": 2.05}},
            "kl": {"none": {"0": kl_none, "1": kl_none},
                   "rope": {"0": 0.3, "1": 0.3}, "learned": {"0": 0.4, "1": 0.4}}}


EXAMPLES = [
    (_example(1e-7, 0.001, 2.3), {"a": "confirmed", "b1": "confirmed", "b2": "confirmed"}),
    (_example(1e-3, 0.2, 2.06), {"a": "refuted", "b1": "refuted", "b2": "refuted"}),
    ({**_example(1e-7, 0.001, 2.3), "kl": {**_example(1e-7, 0.001, 2.3)["kl"],
                                           "none": {"0": 0.001, "1": 0.05}}},
     {"a": "confirmed", "b1": "refuted", "b2": "confirmed"}),
]
