"""XA1: (a) cross-attention keys and values computed once per source and reused for every
decoded token give the same output, (b) faster (the article: -47% latency); (c) freezing the
self-attention cache the same way costs accuracy (the article: 5 points).

Measure: the S-s2s runs (``attnjax.audit.settings.S_S2S``), seeds 0 and 1, best checkpoints,
200 held-out sources (``s2s_held_out``). (a) Greedy decoding with the static cross cache
(``attnjax.translate.translate``), then the logits of decoding those tokens step by step with
the cross cache (``decoded_logits``) and with the cross keys and values recomputed from the
encoder's output at every step (``recompute=True``): max |difference| over every real target
position. (b) Seconds per decoding step of 32 steps after BOS, static against recomputed
(``attnjax.bench.translate.cross_cache_seconds``: one ``lax.scan``, an optimisation barrier per
step so XLA cannot hoist the recomputation out of the loop), on the S-s2s architecture at
width 256 (a random initialisation: time does not depend on the weights), batch 1, source
lengths m = 64, 256, 1024, median of 5 calls. (c) Exact match (the greedy output equals the
target, EOS included: ``exact_matches``) with the normal self-attention cache against a
frozen one (``translate(freeze_self=True)``: every self-attention layer's cache kept as after
BOS, so each later token attends to BOS and to itself; the cross cache as usual).

Left open and resolved here: "keys and values fixed after the prompt" for a decoder whose
prompt is BOS alone leaves each new token its own keys and values too (a token always sees
itself in causal attention). (a) per seed: max |difference| <= 1e-5; (b) per m: static time
<= 0.53 x recomputed; (c) per seed: exact match drops by >= 0.05.

Cost: 2 runs of 2000 steps (shared with XA2, XA3 and CX9), then decoding and timing.

    attnjax audit experiments/claims --workdir runs/claims --only XA1
"""

import numpy as np

from attnjax.audit import holds, over_regimes, over_seeds
from attnjax.audit.settings import S_S2S, s2s_held_out, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.bench.translate import cross_cache_seconds
from attnjax.config import apply_overrides
from attnjax.data.seq2seq import seq2seq_specials
from attnjax.translate import decoded_logits, exact_matches, translate

ID = "XA1"
SOURCE = "002 §2.2"
CLAIM = ("(a) cross-attention k, v computed once per source give the same output, (b) faster "
         "(-47%); (c) freezing self-attention's cache the same way costs accuracy (5 points)")
CRITERION = ("(a) max |logit difference| <= 1e-5; (b) cached step time <= 0.53x recomputed at "
             "m = 64, 256, 1024; (c) exact match lower by >= 0.05 with self-attention frozen")
TIMED = True
SAME, FASTER, DROP = 1e-5, 0.53, 0.05
LENGTHS, STEPS, WIDTH, REPEATS = (64, 256, 1024), 32, 256, 5


def get_sweep():
    return with_seeds([S_S2S])


def same_output(config, params, held) -> float:
    """max |logits with the static cross cache - logits recomputing it| at real targets."""
    tokens = translate(config, params, held["source"], held["source_mask"],
                       held["targets"].shape[1])
    static, again = (np.asarray(decoded_logits(config, params, held["source"],
                                               held["source_mask"], tokens, recompute))
                     for recompute in (False, True))
    ends = tokens == seq2seq_specials(config.model.vocab_size).eos
    real = np.cumsum(ends, 1) - ends == 0                          # up to the first EOS
    return float(np.abs(static - again)[real].max())


def step_seconds(config) -> dict:
    """``{m: {"static", "recompute"}}``: seconds per decoding step at width ``WIDTH``."""
    wide = apply_overrides(config, {"model.d_model": WIDTH, "model.max_length": STEPS + 2})
    return {str(m): cross_cache_seconds(wide, m, STEPS, repeats=REPEATS) for m in LENGTHS}


def measure(runs) -> dict:
    seeds = {}
    for seed, trained in runs.by_seed(S_S2S).items():
        config, params, _ = trained.dir.params("best")
        held = s2s_held_out(config)
        seeds[str(seed)] = {
            "max_diff": same_output(config, params, held),
            "exact": float(exact_matches(config, params, held).mean()),
            "exact_frozen": float(exact_matches(config, params, held, freeze_self=True).mean())}
    return {"seeds": seeds, "seconds": step_seconds(runs.by_seed(S_S2S)[0].config)}


def verdict(r):
    seeds = r["seeds"]
    seconds = dict(sorted(r["seconds"].items(), key=lambda item: int(item[0])))
    a_ok, a_note = over_seeds({s: x["max_diff"] <= SAME for s, x in seeds.items()})
    a_text = "; ".join(f"seed {s}: max |static - recomputed| {x['max_diff']:.1e}"
                       for s, x in seeds.items())
    ratio = {m: t["static"] / t["recompute"] for m, t in seconds.items()}
    b_text = "; ".join(f"m={m}: {t['static'] * 1e3:.3f} vs {t['recompute'] * 1e3:.3f} ms/step "
                       f"({ratio[m]:.2f}x)" for m, t in seconds.items())
    drop = {s: x["exact"] - x["exact_frozen"] for s, x in seeds.items()}
    c_ok, c_note = over_seeds({s: d >= DROP for s, d in drop.items()})
    c_text = "; ".join(f"seed {s}: exact match {x['exact']:.3f}, self-attention frozen "
                       f"{x['exact_frozen']:.3f} (drop {drop[s]:.3f})" for s, x in seeds.items())
    return {"a": holds(a_ok, "; ".join(filter(None, [a_text, a_note]))),
            "b": over_regimes({f"m={m}": q <= FASTER for m, q in ratio.items()},
                              f"{b_text} (limit {FASTER}x, width {WIDTH})"),
            "c": holds(c_ok, "; ".join(filter(None, [c_text, c_note])))}


def _example(diff, static, exact, frozen):
    run = {"max_diff": diff, "exact": exact, "exact_frozen": frozen}
    return {"seeds": {"0": run, "1": run},
            "seconds": {str(m): {"static": static * m / 1024, "recompute": m / 1024}
                        for m in LENGTHS}}


EXAMPLES = [
    (_example(2e-7, 0.3, 0.98, 0.40), {"a": "confirmed", "b": "confirmed", "c": "confirmed"}),
    (_example(3e-4, 0.9, 0.98, 0.96), {"a": "refuted", "b": "refuted", "c": "refuted"}),
]
