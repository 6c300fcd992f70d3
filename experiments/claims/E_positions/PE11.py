"""PE11: swapping in ALiBi's -|i - j| * slope bias needs no retraining and helps long inputs.

Measure: the PE-sweep checkpoints of learned (judged), rope, sinusoidal and none (reported),
S-text at L = 32 and S-128 (L = 128), 600 steps, seeds 0 and 1, each evaluated
(``attnjax.train.evaluate``, 4 validation batches of 32) at L and 4L under the run's config
with ``model.position.kind=alibi`` applied by ``apply_overrides``, as ``attnjax eval RUN
model.position.kind=alibi`` does, against the run's own validation loss at L and 4L (its
summary: the same checkpoint, batches and evaluation).

Left open and resolved here: the override alone is refused for a learned run (its
``model.position.learned_interpolate=true`` "means nothing with kind='alibi'"), so the
``model.position`` fields only the old encoding reads are reset to their defaults with it;
and the factor on the token embeddings, which defaults per encoding (sinusoidal: sqrt(d)), is
kept at the trained model's value (``model.embed_scale``), so only the encoding changes. The
learned checkpoint's ``position_embedding`` table then goes unused: the ALiBi model loads the
checkpoint and ignores it (no [M25] gap). Regimes: L = 32, 128; every seed.

Cost: 16 PE-sweep runs (shared with PE1, PE4, PE6-PE10, PE12-PE14), ~16 units; 32 extra
evaluations (~1 min).

    attnjax audit experiments/claims --workdir runs/claims --only PE11
"""

from attnjax.audit import over_regimes
from attnjax.audit.settings import EPS, PE_LENGTHS, pe_run, pe_sweep
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.config import Config, PositionConfig, apply_overrides
from attnjax.data import load_dataset
from attnjax.nn.transformer import token_scale
from attnjax.registry import POSITIONS
from attnjax.train import evaluate

ID = "PE11"
SOURCE = "002 §5.2"
CLAIM = "swapping in ALiBi's -|i-j|*slope bias needs no retraining and helps long inputs"
CRITERION = ("swapped loss at 4L below unswapped by > eps, and at L <= unswapped + 0.1 "
             "(judged on learned)")
KINDS = ("learned", "rope", "sinusoidal", "none")
JUDGED = "learned"
MARGIN = 0.1


def get_sweep():
    return pe_sweep(kinds=KINDS)


def alibi_swap(config: Config) -> Config:
    """``config`` with ``model.position.kind=alibi``, the old encoding's own fields reset and
    the token-embedding factor kept."""
    position, defaults = config.model.position, PositionConfig()
    reset = {f"model.position.{f}": getattr(defaults, f)
             for f in POSITIONS.get(position.kind).reads
             if getattr(position, f) != getattr(defaults, f)}
    return apply_overrides(config, {"model.position.kind": "alibi", **reset,
                                    "model.embed_scale": token_scale(config.model)})


def measure(runs) -> dict:
    out = {}
    for length in PE_LENGTHS:
        lengths = (length, 4 * length)
        out[str(length)] = {}
        for kind in KINDS:
            out[str(length)][kind] = {}
            for seed, t in runs.by_seed(pe_run(length, kind)).items():
                config, params, _ = t.dir.params("best")
                swapped = alibi_swap(config)
                loss = evaluate(swapped, params, load_dataset(swapped.data), lengths)
                out[str(length)][kind][str(seed)] = {
                    "own_L": t.loss(), "own_4L": t.loss(4 * length),
                    "alibi_L": loss[length]["loss"], "alibi_4L": loss[4 * length]["loss"]}
    return out


def verdict(results):
    holding, notes = {}, []
    for length, r in results.items():
        holding[f"L={length}"] = {s: x["alibi_4L"] < x["own_4L"] - EPS
                                  and x["alibi_L"] <= x["own_L"] + MARGIN
                                  for s, x in r[JUDGED].items()}
        pairs = lambda xs, at: "/".join(f"{x['own_' + at]:.3f}->{x['alibi_' + at]:.3f}"
                                        for x in xs.values())
        notes.append(f"L={length}: " + "; ".join(
            f"{kind} L {pairs(xs, 'L')}, 4L {pairs(xs, '4L')}" for kind, xs in r.items()))
    seeds = "/".join(next(iter(results.values()))[JUDGED])
    return over_regimes(holding, f"loss own -> alibi-swapped (seeds {seeds}); "
                        + "; ".join(notes))


def _example(alibi_4l32, alibi_4l128, alibi_l=2.05):
    run = lambda a4: {"own_L": 2.0, "own_4L": 2.6, "alibi_L": alibi_l, "alibi_4L": a4}
    at = lambda a4: {"learned": {s: run(a4) for s in "01"}, "rope": {s: run(2.7) for s in "01"}}
    return {"32": at(alibi_4l32), "128": at(alibi_4l128)}


EXAMPLES = [
    (_example(2.3, 2.4), "confirmed"),
    (_example(2.3, 2.4, alibi_l=2.5), "refuted"),
    (_example(2.59, 2.9), "refuted"),
    (_example(2.3, 2.9), "scale-dependent"),
]
