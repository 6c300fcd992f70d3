"""PE12: at 1024+ tokens, a weight below 0.001 from the last token to the first (the opening
topic forgotten) shows that the position encoding failed.

Measure: the PE-sweep checkpoints at L = 128 (S-128, 600 steps, all six kinds, seeds 0 and 1;
learned interpolated past L), on the first 4 validation sequences of T = 1024 bytes
(``analysis.capture.probe_batch``): the attention weights of every layer
(``analysis.capture.attention_weights``), the last query's weight on key 0, its max over the
heads of both layers per sequence, then the mean over the 4 sequences; beside it 1/T (a
uniform row's weight). A run works if loss(1024) - loss(128) <= 0.3.

Left open and resolved here: "head max" is taken over the heads of every layer. The
criterion is kept as written although 1/T = 0.00098 < 0.001 at T = 1024, so a head that
attends uniformly also counts as "forgetting" (noted in the evidence when it matters).

Cost: the 12 PE-sweep runs at L = 128 (shared with PE1, PE4, PE6-PE11, PE13), ~12 units; 12
forward passes at T = 1024 with weights.

    attnjax audit experiments/claims --workdir runs/claims --only PE12
"""

from attnjax.analysis.capture import attention_weights, probe_batch
from attnjax.audit import holds
from attnjax.audit.settings import PE_KINDS, pe_run, pe_sweep
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "PE12"
SOURCE = "002 §5.2"
CLAIM = "at 1024+ tokens a last-to-first weight < 0.001 (opening forgotten) shows a failed encoding"
CRITERION = ("the last query's weight on key 0 (head max) is < 0.001 exactly in the runs that "
             "do not work")
L, T, PROBES = 128, 1024, 4
FORGOTTEN, LONG_GAP = 0.001, 0.3


def get_sweep():
    return pe_sweep(lengths=(L,))


def first_token_weight(config, params) -> float:
    """Mean over the probe sequences of max over layers and heads of w[T - 1, 0]."""
    weights = attention_weights(config, params, probe_batch(config, batch_size=PROBES, length=T))
    return float(weights[:, :, :, -1, 0].max(axis=(0, 2)).mean())


def measure(runs) -> dict:
    out = {"uniform": 1 / T, "runs": {}}
    for kind in PE_KINDS:
        for seed, t in runs.by_seed(pe_run(L, kind)).items():
            config, params, _ = t.dir.params("best")
            out["runs"][f"{kind}/{seed}"] = {"weight": first_token_weight(config, params),
                                             "gap": t.loss(T) - t.loss()}
    return out


def verdict(results):
    runs = results["runs"]
    works = {n: r["gap"] <= LONG_GAP for n, r in runs.items()}
    wrong = [n for n, r in runs.items() if (r["weight"] < FORGOTTEN) == works[n]]
    table = "; ".join(f"{n} {'works' if works[n] else 'fails'} (loss {T}-{L} {r['gap']:+.3f}):"
                      f" w {r['weight']:.2e}" for n, r in runs.items())
    return holds(not wrong, f"1/T = {results['uniform']:.2e}; mismatches: "
                 f"{', '.join(wrong) or 'none'}; {table}")


EXAMPLES = [
    ({"uniform": 1 / T, "runs": {"rope/0": {"weight": 0.01, "gap": 0.1},
                                 "learned/0": {"weight": 1e-5, "gap": 2.0}}}, "confirmed"),
    ({"uniform": 1 / T, "runs": {"rope/0": {"weight": 1e-4, "gap": 0.1},
                                 "learned/0": {"weight": 1e-5, "gap": 2.0}}}, "refuted"),
    ({"uniform": 1 / T, "runs": {"rope/0": {"weight": 0.01, "gap": 0.1},
                                 "learned/0": {"weight": 0.05, "gap": 2.0}}}, "refuted"),
]
