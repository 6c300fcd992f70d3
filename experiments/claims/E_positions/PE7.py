"""PE7: (a) a learned position table caps inference at the training length; (b) interpolating
it (002: bilinear, 512 -> 1024 rows) makes long inputs work.

Measure: the PE-sweep learned runs (trained with ``model.position.learned_interpolate=true``),
S-text at L = 32 and S-128 (L = 128), 600 steps, seeds 0 and 1. (a) each best checkpoint
evaluated at 2L with ``model.position.learned_interpolate=false``: the config is rebuilt with
that override (it is refused there when ``data.eval_lengths`` exceed ``model.max_length``),
and, should that pass, ``attnjax.train.evaluate`` at 2L is called (the model refuses an input
longer than its table); the refusal message is recorded. (b) with interpolation (attnjax's is
linear along positions: row p * (L - 1) / (T - 1), the 1-D case of the article's bilinear
resize): the run's validation loss at L, 2L and 4L. Regimes: L = 32, 128; every seed.

Cost: 4 PE-sweep runs (shared with PE1, PE4, PE6, PE8-PE14), ~4 units; (a) compiles nothing
when the config refuses.

    attnjax audit experiments/claims --workdir runs/claims --only PE7
"""

from attnjax.audit import over_regimes
from attnjax.audit.settings import PE_LENGTHS, pe_run, pe_sweep
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)
from attnjax.config import apply_overrides
from attnjax.data import load_dataset
from attnjax.train import evaluate

ID = "PE7"
SOURCE = "000 §5.3; 002 §5.2"
CLAIM = "(a) a learned table caps inference at the training length; (b) interpolating it fixes it"
CRITERION = "(a) evaluation past L is refused; (b) loss(2L) and loss(4L) <= loss(L) + 0.1"
MARGIN = 0.1


def get_sweep():
    return pe_sweep(kinds=("learned",))


def refusal(trained) -> str:
    """The error of evaluating the checkpoint at 2L without interpolation ('' if it runs)."""
    length = trained.config.data.length
    try:
        config, params, _ = trained.dir.params("best")
        config = apply_overrides(config, {"model.position.learned_interpolate": False})
        evaluate(config, params, load_dataset(config.data), [2 * length])
    except ValueError as error:
        return str(error)
    return ""


def measure(runs) -> dict:
    out = {}
    for length in PE_LENGTHS:
        out[str(length)] = {str(seed): {"refusal": refusal(t), "L": t.loss(),
                                        "2L": t.loss(2 * length), "4L": t.loss(4 * length)}
                            for seed, t in runs.by_seed(pe_run(length, "learned")).items()}
    return out


def verdict(results):
    refused = {f"L={n}": {s: bool(x["refusal"]) for s, x in r.items()}
               for n, r in results.items()}
    fixed = {f"L={n}": {s: max(x["2L"], x["4L"]) <= x["L"] + MARGIN for s, x in r.items()}
             for n, r in results.items()}
    message = next((x["refusal"] for r in results.values() for x in r.values()
                    if x["refusal"]), "no refusal")
    losses = "; ".join(f"L={n}: loss L/2L/4L " + ", ".join(
        f"seed {s} {x['L']:.3f}/{x['2L']:.3f}/{x['4L']:.3f}" for s, x in r.items())
        for n, r in results.items())
    return {"a": over_regimes(refused, f"without interpolation at 2L: {message!r}"),
            "b": over_regimes(fixed, f"interpolated: {losses}")}


def _example(refusal, loss_4l128):
    run = lambda loss_4l: {"refusal": refusal, "L": 2.0, "2L": 2.05, "4L": loss_4l}
    return {"32": {s: run(2.08) for s in "01"}, "128": {s: run(loss_4l128) for s in "01"}}


EXAMPLES = [
    (_example("input length 64 exceeds model.max_length=32", 2.09),
     {"a": "confirmed", "b": "confirmed"}),
    (_example("", 2.09), {"a": "refuted", "b": "confirmed"}),
    (_example("refused", 2.5), {"a": "confirmed", "b": "scale-dependent"}),
    ({"32": {s: {"refusal": "x", "L": 2.0, "2L": 2.3, "4L": 2.8} for s in "01"},
      "128": {s: {"refusal": "x", "L": 2.0, "2L": 2.3, "4L": 2.8} for s in "01"}},
     {"a": "confirmed", "b": "refuted"}),
]
