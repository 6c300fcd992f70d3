"""XA3: the cross-attention argmax shows which source token the decoder is using, so a focus
error can be read off the weights.

Measure: the S-s2s runs (``attnjax.audit.settings.S_S2S``), seeds 0 and 1, best checkpoints,
200 held-out sources (``s2s_held_out``), teacher-forced with the cross-attention weights
returned. A target token is correct when the model's argmax is the target, wrong otherwise
(EOS included; pads not counted). Per cross-attention head (layer, head): the share of
correct tokens whose largest cross-attention weight is on the gold source position
(``attnjax.ops.stats.argmax_hits``; reversal: target j copies source n - 1 - j, EOS the
source's EOS), and the same share among the wrong tokens; reported beside them, the share of
correct tokens whose argmax is within one position of the gold one (the bidirectional
encoder mixes neighbours, so a head may read a token off its neighbour's state).

Criterion (per seed): (a) the best head on correct tokens reaches >= 0.9; (b) on the wrong
tokens that head's argmax is off the gold position in >= 50% of cases. A seed with no wrong
token leaves (b) untestable.

Cost: no runs of its own (the S-s2s runs are shared with XA1, XA2 and CX9).

    attnjax audit experiments/claims --workdir runs/claims --only XA3
"""

import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds, over_seeds, untestable
from attnjax.audit.settings import S_S2S, s2s_held_out, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.models import build
from attnjax.ops.stats import argmax_hits

ID = "XA3"
SOURCE = "002 §5.4"
CLAIM = ("the cross-attention argmax shows which source token the decoder uses, so a focus "
         "error can be read off the weights")
CRITERION = ("(a) some cross-attention head puts its argmax on the gold source position for "
             ">= 0.9 of correct tokens; (b) on wrong tokens that head's argmax is off gold in "
             ">= 50%")
FOCUSED, OFF = 0.9, 0.5


def get_sweep():
    return with_seeds([S_S2S])


def focus(config, params, held) -> dict:
    """Per head ``[layers, heads]``: gold-argmax shares on correct and on wrong tokens."""
    logits, aux = build(config.model).apply(
        {"params": params}, held["inputs"], source=held["source"],
        source_mask=held["source_mask"], return_weights=True)
    weights = jnp.stack(aux["cross_weights"])                     # [layers, B, heads, T, S]
    scored = held["weights"] > 0
    right = np.asarray(logits.argmax(-1)) == held["targets"]
    out = {}
    for name, tokens in (("correct", scored & right), ("wrong", scored & ~right)):
        hits, count = argmax_hits(weights, jnp.asarray(held["alignment"]), jnp.asarray(tokens))
        out[name] = (np.asarray(hits) / max(float(count), 1.0)).tolist()
        out[f"{name}_tokens"] = int(count)
    gold, counted = held["alignment"], scored & right & (held["alignment"] >= 0)
    offset = np.abs(np.asarray(weights.argmax(-1)) - gold[None, :, None, :])  # [L, B, N, T]
    near = ((offset <= 1) & counted[None, :, None, :]).sum((1, 3))
    out["correct_near"] = (near / max(int(counted.sum()), 1)).tolist()
    return out


def measure(runs) -> dict:
    out = {}
    for seed, trained in runs.by_seed(S_S2S).items():
        config, params, _ = trained.dir.params("best")
        out[str(seed)] = focus(config, params, s2s_held_out(config))
    return {"seeds": out}


def _best(x) -> tuple[int, int]:
    shares = np.asarray(x["correct"])
    return tuple(int(i) for i in np.unravel_index(shares.argmax(), shares.shape))


def verdict(r):
    seeds = r["seeds"]
    best = {s: _best(x) for s, x in seeds.items()}
    share = {s: x["correct"][best[s][0]][best[s][1]] for s, x in seeds.items()}
    off = {s: 1.0 - x["wrong"][best[s][0]][best[s][1]] for s, x in seeds.items()}
    a_ok, a_note = over_seeds({s: share[s] >= FOCUSED for s in seeds})
    a_text = "; ".join(f"seed {s}: best head L{best[s][0]}.H{best[s][1]} {share[s]:.3f} of "
                       f"{x['correct_tokens']} correct tokens on the gold position (within one "
                       f"of it: {x['correct_near'][best[s][0]][best[s][1]]:.3f})"
                       for s, x in seeds.items())
    out = {"a": holds(a_ok, "; ".join(filter(None, [a_text, a_note])))}
    if not all(x["wrong_tokens"] for x in seeds.values()):
        out["b"] = untestable("no wrong target token on the held-out sources of seed(s) " +
                              ", ".join(s for s, x in seeds.items() if not x["wrong_tokens"]))
        return out
    b_ok, b_note = over_seeds({s: off[s] >= OFF for s in seeds})
    b_text = "; ".join(f"seed {s}: that head's argmax off gold on {off[s]:.3f} of "
                       f"{x['wrong_tokens']} wrong tokens" for s, x in seeds.items())
    out["b"] = holds(b_ok, "; ".join(filter(None, [b_text, b_note])))
    return out


def _example(correct, wrong, wrong_tokens=12):
    run = {"correct": [[0.2, correct], [0.3, 0.1]], "wrong": [[0.5, wrong], [0.2, 0.0]],
           "correct_near": [[0.4, 0.99], [0.5, 0.3]], "correct_tokens": 3000,
           "wrong_tokens": wrong_tokens}
    return {"seeds": {"0": run, "1": run}}


EXAMPLES = [
    (_example(0.97, 0.25), {"a": "confirmed", "b": "confirmed"}),
    (_example(0.60, 0.90), {"a": "refuted", "b": "refuted"}),
    (_example(0.97, 0.0, wrong_tokens=0), {"a": "confirmed", "b": "untestable"}),
]
