"""CX9: (a) a KV cache reused across requests without clearing contaminates the next request
(beam search especially); (b) a > 10% shift of the keys' mean or std flags it.

Measure: the plain S-text arm ``{}`` (600 steps), seeds 0 and 1, best checkpoints, decoded
with attnjax's KV cache (``attnjax.generate.empty_cache`` / ``decode_step``:
``DecoderLM(decode=True)``, 64 slots). 20 prompt pairs from the first 40 validation sequences:
a first request of 24 bytes, then a second of 16 bytes, each prefilled in one call. The second
request's logits [16, 256] with (fresh) an empty cache; (as is) the cache the first request
left; (reset) that cache with every write index and the position counter set to 0, its stale
keys and values left in the buffers (slots 16-23 still hold the first request's). (a) max
|logits - fresh| per pair. (b) The keys a request attends to (each layer's cache slots below
its index, after RoPE): mean and std over all their entries, against those of the fresh
cache; shift = max over layers of |mean - mean_fresh| / std_fresh and |std / std_fresh - 1|;
the flag fires when shift > 0.1.

(c) The S-s2s runs (``attnjax.audit.settings.S_S2S``), seeds 0 and 1, best checkpoints, 50
held-out sources, beam width 4, no length penalty, up to 33 tokens (``attnjax.beam.
beam_translate``): with a cache slot per beam (``reorder_cache``: each beam's slot taken from
its parent's at every step) and with a deliberately shared one (every beam of a source given
the slot of the source's first beam's parent, so all of them read and extend one history).
Each returned hypothesis is decoded again on its own (``attnjax.translate.decoded_logits``:
a fresh cache, its tokens fed back, the rows laid out as the search lays out its beams) and
its log-probability summed up to its length in float32 in the search's order, so that only
the cache's contents can make the two differ; compared with the log-probability the search
returned.

Left open and resolved here: the keys' mean is near 0, so its shift is measured in units of
the fresh std rather than relative to the mean itself. (a) per seed: every pair's as-is
logits differ from fresh by > 1e-3 and every reset one matches within 1e-5; (b) per seed: the
flag fires on every as-is case (the contaminated ones) and on no fresh or reset case; (c) per
seed: per-beam slots match the independent decodes within 1e-5 on every hypothesis and the
shared cache differs by > 1e-3 on at least one.

Cost: the plain arm and the S-s2s runs, both shared with other claims.

    attnjax audit experiments/claims --workdir runs/claims --only CX9
"""

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.capture import probe_batch
from attnjax.audit import holds, over_seeds, untestable
from attnjax.audit.settings import S_S2S, s2s_held_out, with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.beam import beam_translate, reorder_cache
from attnjax.generate import decode_step, empty_cache
from attnjax.translate import decoded_logits

ID = "CX9"
SOURCE = "002 §5.4"
CLAIM = ("(a) an uncleared KV cache reused across requests contaminates the next (beam search "
         "especially); (b) a > 10% shift of k's mean or std flags it")
CRITERION = ("(a) a reuse variant differs from fresh by > 1e-3 while a cleared cache matches "
             "within 1e-5; (b) the flag fires on all contaminated cases, no fresh one; (c) "
             "beams with a cache slot each match independent decodes within 1e-5, a shared "
             "slot differs by > 1e-3 on some hypothesis")
PAIRS, FIRST, SECOND = 20, 24, 16
DIFFERS, MATCHES, FLAG = 1e-3, 1e-5, 0.1
VARIANTS = ("fresh", "as_is", "reset")
SOURCES, BEAMS = 50, 4


def get_sweep():
    return with_seeds([{}, S_S2S])


def _name(path) -> str:
    return str(getattr(path[-1], "key", path[-1]))


def reset(cache):
    """``cache`` with every write index and the position counter at 0, buffers untouched."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.zeros_like(x) if _name(path) in ("index", "position") else x, cache)


def visible_keys(cache) -> list[np.ndarray]:
    """Per layer, the cached keys the next query attends to: slots below the layer's index (the
    cache is ``[B, K, max_length, H]``)."""
    layers = [block["attention"] for name, block in sorted(cache.items()) if name != "position"]
    return [np.asarray(a["cached_key"][:, :, :int(a["index"])], np.float64) for a in layers]


def key_shift(cache, fresh) -> float:
    """max over layers of |mean - mean_fresh| / std_fresh and |std / std_fresh - 1|."""
    shifts = []
    for k, f in zip(visible_keys(cache), visible_keys(fresh)):
        shifts += [abs(k.mean() - f.mean()) / f.std(), abs(k.std() / f.std() - 1)]
    return float(max(shifts))


def requests(config, params) -> dict:
    """Per pair: max |logits - fresh| of each variant and its key shift."""
    step, empty = jax.jit(decode_step(config)), empty_cache(config)
    tokens = jnp.asarray(probe_batch(config, batch_size=2 * PAIRS, length=FIRST))
    out = {"diff": {v: [] for v in VARIANTS}, "shift": {v: [] for v in VARIANTS}}
    for p in range(PAIRS):
        first, second = tokens[2 * p:2 * p + 1], tokens[2 * p + 1:2 * p + 2, :SECOND]
        used, _ = step(params, empty, first)
        caches = {"fresh": empty, "as_is": used, "reset": reset(used)}
        results = {v: step(params, cache, second) for v, cache in caches.items()}
        fresh_cache, fresh_logits = results["fresh"]
        for v, (cache, logits) in results.items():
            out["diff"][v].append(float(jnp.abs(logits - fresh_logits).max()))
            out["shift"][v].append(key_shift(cache, fresh_cache))
    return out


def shared_slot(cache, rows):
    """The broken reorder: every beam of a source gets the slot of its first beam's parent."""
    first = rows.reshape(-1, BEAMS)[:, :1]
    return reorder_cache(cache, jnp.repeat(first, BEAMS, axis=1).reshape(-1))


def beam_errors(config, params) -> dict:
    """Per reorder: |log P the search returned - log P of decoding the hypothesis alone| of
    every hypothesis (the rows laid out and the log-probabilities summed in float32 as the
    search does, so that only the cache's contents can differ)."""
    held = s2s_held_out(config, SOURCES)
    out = {}
    for name, reorder in (("per_beam", reorder_cache), ("shared", shared_slot)):
        found = beam_translate(config, params, held["source"], held["source_mask"],
                               config.data.length, beams=BEAMS, alpha=0.0, reorder=reorder)
        tokens, lengths = found.tokens.reshape(SOURCES * BEAMS, -1), found.lengths.reshape(-1)
        logp = np.asarray(jax.nn.log_softmax(decoded_logits(
            config, params, held["source"], held["source_mask"], tokens)))
        picked = np.take_along_axis(logp, tokens[..., None], -1)[..., 0]
        alone = np.zeros(len(tokens), np.float32)
        for t in range(tokens.shape[1]):
            alone = np.where(t < lengths, alone + picked[:, t], alone)
        out[name] = np.abs(found.scores.reshape(-1) - alone).tolist()
    return out


def measure(runs) -> dict:
    out, beam = {}, {}
    for seed, trained in runs.by_seed({}).items():
        config, params, _ = trained.dir.params("best")
        out[str(seed)] = requests(config, params)
    for seed, trained in runs.by_seed(S_S2S).items():
        config, params, _ = trained.dir.params("best")
        beam[str(seed)] = beam_errors(config, params)
    return {"seeds": out, "beam": beam}


def verdict(r):
    seeds = r["seeds"]
    a_ok, a_note = over_seeds({s: min(x["diff"]["as_is"]) > DIFFERS
                               and max(x["diff"]["reset"]) <= MATCHES for s, x in seeds.items()})
    a_text = "; ".join(
        f"seed {s}: max |logits - fresh| over {len(x['diff']['as_is'])} pairs, as is "
        f"{min(x['diff']['as_is']):.3g}-{max(x['diff']['as_is']):.3g}, reset "
        f"{max(x['diff']['reset']):.1e} (limits > {DIFFERS:g}, <= {MATCHES:g})"
        for s, x in seeds.items())
    fires = lambda x, v: [shift > FLAG for shift in x["shift"][v]]
    b_ok, b_note = over_seeds({s: all(fires(x, "as_is")) and not any(fires(x, "fresh") + fires(
        x, "reset")) for s, x in seeds.items()})
    b_text = "; ".join(
        f"seed {s}: flag (shift > {FLAG}) fires on {sum(fires(x, 'as_is'))}/"
        f"{len(x['shift']['as_is'])} contaminated (shift {min(x['shift']['as_is']):.3f}-"
        f"{max(x['shift']['as_is']):.3f}), {sum(fires(x, 'fresh') + fires(x, 'reset'))} clean "
        f"(reset shift max {max(x['shift']['reset']):.1e})" for s, x in seeds.items())
    out = {"a": holds(a_ok, "; ".join(filter(None, [a_text, a_note]))),
           "b": holds(b_ok, "; ".join(filter(None, [b_text, b_note])))}
    if r.get("beam") is None:
        out["c"] = untestable("no beam-search measurement (the S-s2s runs) in these results")
        return out
    beam = r["beam"]
    c_ok, c_note = over_seeds({s: max(x["per_beam"]) <= MATCHES and max(x["shared"]) > DIFFERS
                               for s, x in beam.items()})
    c_text = "; ".join(
        f"seed {s}: |log P - decoded alone| over {len(x['per_beam'])} hypotheses, per-beam "
        f"slots max {max(x['per_beam']):.1e}, shared slot max {max(x['shared']):.3g} "
        f"({sum(e > DIFFERS for e in x['shared'])} over {DIFFERS:g})" for s, x in beam.items())
    out["c"] = holds(c_ok, "; ".join(filter(None, [c_text, c_note])))
    return out


def _example(as_is_diff, reset_diff, as_is_shift, per_beam=None, shared=None):
    pairs = lambda x: [x] * PAIRS
    run = {"diff": {"fresh": pairs(0.0), "as_is": pairs(as_is_diff), "reset": pairs(reset_diff)},
           "shift": {"fresh": pairs(0.0), "as_is": pairs(as_is_shift), "reset": pairs(0.0)}}
    beam = None if per_beam is None else {
        s: {"per_beam": [per_beam] * 8, "shared": [0.0] * 7 + [shared]} for s in ("0", "1")}
    return {"seeds": {"0": run, "1": run}, "beam": beam}


EXAMPLES = [
    (_example(2.0, 0.0, 0.3, 2e-6, 0.5), {"a": "confirmed", "b": "confirmed", "c": "confirmed"}),
    (_example(2.0, 1e-3, 0.05, 2e-6, 1e-4), {"a": "refuted", "b": "refuted", "c": "refuted"}),
    (_example(2.0, 0.0, 0.3), {"a": "confirmed", "b": "confirmed", "c": "untestable"}),
]
