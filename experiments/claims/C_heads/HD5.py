"""HD5: do attention weights explain a prediction? 000: they are not the whole reason and
mislead as explanations; 002: they are direct evidence of what the model used.

Measure: the plain S-text arm ``{}`` (600 steps), seeds 0 and 1, best checkpoints. The first 8
validation sequences of 64 bytes; 256 queries: rows i = 32..63 of each (every one sees >= 33
keys, so a rank correlation over its keys means something). For query i and key j <= i,
occlusion importance = the rise of the cross-entropy of target i when token j is replaced by a
random other byte, mean over 8 draws (``analysis.occlusion``); Spearman's rho over the keys
between it and the last layer's weights averaged over heads (``occlusion_agreement``); the
median rho over the 256 queries.

Parts: (a) 000's claim, confirmed when the median rho < 0.5 for every seed; (b) 002's claim,
confirmed when it is >= 0.5 for every seed (seeds that disagree refute both).

Cost: no runs of its own (the plain arm is shared).

    attnjax audit experiments/claims --workdir runs/claims --only HD5
"""

import numpy as np

from attnjax.analysis.capture import probe_examples
from attnjax.analysis.occlusion import occlusion_agreement
from attnjax.audit import holds, over_seeds
from attnjax.audit.settings import with_seeds
from attnjax.audit.settings import get_config  # noqa: F401  (the claim's base: S-text)

ID = "HD5"
SOURCE = "000 §4.3; 002 §2.1, §7"
CLAIM = ("000: attention weights are not the whole reason for a prediction and mislead; "
         "002: they are direct evidence of it")
CRITERION = "median rho < 0.5 confirms 000 and refutes 002; >= 0.5 the reverse"
SEQUENCES, FIRST_QUERY, DRAWS, SPLIT = 8, 32, 8, 0.5


def get_sweep():
    return with_seeds([{}])


def measure(runs) -> dict:
    out = {}
    for seed, trained in runs.by_seed({}).items():
        config, params, _ = trained.dir.params("best")
        batch = probe_examples(config, batch_size=SEQUENCES)
        result = occlusion_agreement(config, params, batch, draws=DRAWS)
        rho = result["rho"][:, FIRST_QUERY:]
        scored = rho[result["queries"][:, FIRST_QUERY:]]
        out[str(seed)] = {"median": float(np.median(scored)), "queries": int(scored.size),
                          "quartiles": np.percentile(scored, [25, 75]).tolist()}
    return out


def verdict(r):
    text = "; ".join(f"seed {s}: median Spearman rho {x['median']:.3f} over {x['queries']} "
                     f"queries (quartiles {x['quartiles'][0]:.2f}, {x['quartiles'][1]:.2f})"
                     for s, x in r.items())
    parts = {}
    for part, test in (("a", lambda x: x["median"] < SPLIT), ("b", lambda x: x["median"] >= SPLIT)):
        ok, note = over_seeds({s: test(x) for s, x in r.items()})
        parts[part] = holds(ok, "; ".join(filter(None, [text, note])))
    return parts


def _example(*medians):
    return {str(s): {"median": m, "queries": 256, "quartiles": [m - 0.2, m + 0.2]}
            for s, m in enumerate(medians)}


EXAMPLES = [
    (_example(0.3, 0.35), {"a": "confirmed", "b": "refuted"}),
    (_example(0.6, 0.7), {"a": "refuted", "b": "confirmed"}),
    (_example(0.3, 0.7), {"a": "refuted", "b": "refuted"}),
]
