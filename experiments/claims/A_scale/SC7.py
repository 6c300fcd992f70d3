"""SC7: (a) in a healthy model the query and key norms are 1-3 and the largest q.k^T is within
+-10; (b) a largest q.k^T above 50 always blows up.

Measure: the trained runs of SC3, SC5 and SC8, TR1's if its claim file exists
(``G_dynamics/TR1.py``), and the S-text baseline ``{}`` (600 steps); seeds 0, 1. Per run:
divergence (CLAIMS.md's, ``attnjax.audit.dynamics``), validation loss, and the unscaled
causal max q.k^T (as the article prints it: without the scale) at every logged step,
``max_attn_logit / s`` (s = m x the fixed scale policy; the logged value is taken before
soft-capping); for the healthy runs, at the final checkpoint on 8 validation windows:
``q_norm`` and ``k_norm`` per head (RMS over positions i >= 8 of the vectors that meet in
the scores) and the unscaled causal max q.k^T over rows i >= 8.

Resolved here: healthy = not diverged and validation loss within 0.1 of the best run of its
setting (same data, width, depth and step count); (a) reads every head of every layer at the
end; (b) counts a non-finite logged maximum as past 50 (inf), and is untestable if no run
passes 50.

    attnjax audit experiments/claims --workdir runs/claims --only SC7

Budget: no runs of its own (SC3's, SC5's, SC8's, TR1's and the shared default arm).
"""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.capture import probe_batch
from attnjax.audit import dynamics, load_claim, over_regimes, untestable
from attnjax.audit.settings import get_config, with_seeds  # noqa: F401  (S-text)
from attnjax.models.probe import capture
from attnjax.ops import stats
from attnjax.registry import SCALES
from attnjax.sweep.spec import run_name

HERE = Path(__file__).parent
SC3 = load_claim(HERE / "SC3.py").module
SOURCES = [load_claim(HERE / f"{name}.py").module for name in ("SC3", "SC5", "SC8")]
TR1 = HERE.parent / "G_dynamics" / "TR1.py"
if TR1.is_file():
    SOURCES.append(load_claim(TR1).module)

ID = "SC7"
SOURCE = "002 §5.1"
CLAIM = "(a) healthy Q/K norms are 1-3 and max QK^T within +-10; (b) max QK^T > 50 always blows up"
CRITERION = ("(a) every healthy run ends with all heads in [1, 3] and |max| <= 10; (b) every run "
             "past 50 diverged")
NORMS, MAX_HEALTHY, BLOW_UP, HEALTHY_MARGIN = (1.0, 3.0), 10.0, 50.0, 0.1
FIRST_ROW, PROBE_EXAMPLES = 8, 8


def get_sweep():
    entries = {}
    for module in SOURCES:
        for entry in module.get_sweep():
            entries.setdefault(run_name(entry), entry)
    for entry in with_seeds([{}]):
        entries.setdefault(run_name(entry), entry)
    return list(entries.values())


def setting(config) -> str:
    d, m, t = config.data, config.model, config.train
    return (f"{d.task}:{d.path}:{d.padding}, L {d.length}, d {m.d_model}, layers {m.num_layers}, "
            f"steps {t.steps}")


def logit_scale(config) -> float | None:
    """The fixed logit scale m x policy(head_dim) (None for a learned one)."""
    att = config.model.attention
    policy = SCALES.get(att.scale)
    return None if policy.host_multiplier else float(policy.scale(None, att,
                                                                  config.model.head_dim))


@functools.lru_cache(maxsize=32)
def _end_fn(model):
    """``(q_norm [L, N], k_norm [L, N], max unscaled causal q.k over rows >= 8 [L, N])``."""
    def end(params, tokens):
        _, sown = capture(model, params, tokens)
        q_norm, k_norm, top = [], [], []
        for layer in sown:
            q, k = layer["queries"], layer["keys"]
            k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)
            norms = stats.qk_statistics(q[:, FIRST_ROW:], k[:, FIRST_ROW:], 1.0)
            s = jnp.einsum("bqnh,bknh->bnqk", q, k, preferred_element_type=jnp.float32)
            T = s.shape[-1]
            s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)[:, :, FIRST_ROW:]
            q_norm.append(norms["q_norm"])
            k_norm.append(norms["k_norm"])
            top.append(s.max(axis=(0, 2, 3)))
        return jnp.stack(q_norm), jnp.stack(k_norm), jnp.stack(top)
    return jax.jit(end)


def end_stats(trained) -> dict:
    config, params, _ = trained.dir.params("latest")
    q_norm, k_norm, top = _end_fn(config.model)(params, probe_batch(config,
                                                                    batch_size=PROBE_EXAMPLES))
    return {"q_norm": np.asarray(q_norm).tolist(), "k_norm": np.asarray(k_norm).tolist(),
            "max": np.asarray(top).tolist()}


def logged_max(trained) -> float | None:
    """The largest logged unscaled max q.k (inf if any logged value is not finite)."""
    scale = logit_scale(trained.config)
    logits = [r["max_attn_logit"] for r in trained.dir.metrics()]
    if scale is None or not logits:
        return None
    return float(np.max(logits) / scale) if np.isfinite(logits).all() else float("inf")


def measure(runs):
    out = {}
    for t in runs.all:
        finished = t.dir.error() is None and t.dir.summary() is not None
        out[t.run.name] = {"seed": t.config.seed, "setting": setting(t.config),
                           "loss": t.loss() if finished else None, "logged_max": logged_max(t)}
    best = {}
    for r in out.values():
        if r["loss"] is not None and np.isfinite(r["loss"]):
            best[r["setting"]] = min(best.get(r["setting"], np.inf), r["loss"])
    for t in runs.all:
        r = out[t.run.name]
        near = r["loss"] is not None and r["loss"] <= best[r["setting"]] + HEALTHY_MARGIN
        r["diverged"] = dynamics.diverged(t)
        r["healthy"] = near and r["diverged"] is None
        r["end"] = end_stats(t) if r["healthy"] else None
    return out


def _in_range(end: dict) -> bool:
    low, high = NORMS
    norms = np.asarray(end["q_norm"] + end["k_norm"])
    return bool(np.all((norms >= low) & (norms <= high))
                and np.all(np.abs(end["max"]) <= MAX_HEALTHY))


def verdict(results):
    runs = list(results.values())
    seeds = sorted({r["seed"] for r in runs})
    healthy = [r for r in runs if r["healthy"]]
    if healthy:
        norms = np.concatenate([np.ravel(r["end"][k]) for r in healthy for k in ("q_norm",
                                                                                   "k_norm")])
        tops = np.concatenate([np.ravel(r["end"]["max"]) for r in healthy])
        inside = sum(_in_range(r["end"]) for r in healthy)
        a = over_regimes({"all runs": {s: all(_in_range(r["end"]) for r in healthy
                                              if r["seed"] == s) for s in seeds}},
                         f"{inside}/{len(healthy)} healthy runs (of {len(runs)}) inside; their "
                         f"q/k norms {norms.min():.2f}-{norms.max():.2f}, unscaled max q.k "
                         f"{tops.min():.1f}-{tops.max():.1f}")
    else:
        a = untestable(f"not reached here: no healthy run among {len(runs)}")
    past = [r for r in runs if r["logged_max"] is not None and not r["logged_max"] <= BLOW_UP]
    logged = [r["logged_max"] for r in runs if r["logged_max"] is not None]
    largest = f"largest logged unscaled max q.k {np.nanmax(logged):.1f}" if logged else ""
    if not past:
        b = untestable(f"not reached here: no run passes {BLOW_UP:g} ({largest})")
    else:
        blew = sum(r["diverged"] is not None for r in past)
        b = over_regimes({"all runs": {s: all(r["diverged"] is not None for r in past
                                              if r["seed"] == s) for s in seeds}},
                         f"{blew}/{len(past)} runs past {BLOW_UP:g} diverged; {largest}")
    return {"a": a, "b": b}


def _run(seed: int, healthy: bool, norm: float, top: float, logged: float, diverged=None):
    end = {"q_norm": [[norm] * 4] * 2, "k_norm": [[norm] * 4] * 2, "max": [[top] * 4] * 2}
    return {"seed": seed, "setting": "s", "diverged": diverged, "loss": 1.5,
            "logged_max": logged, "healthy": healthy, "end": end if healthy else None}


EXAMPLES = [
    ({f"r{s}": _run(s, True, 2.0, 6.0, 8.0) for s in (0, 1)}
     | {f"x{s}": _run(s, False, 0, 0, 80.0, "non-finite loss") for s in (0, 1)},
     {"a": "confirmed", "b": "confirmed"}),
    ({f"r{s}": _run(s, True, 5.0, 30.0, 60.0) for s in (0, 1)},
     {"a": "refuted", "b": "refuted"}),
    ({f"r{s}": _run(s, False, 0, 0, 8.0, "non-finite loss") for s in (0, 1)},
     {"a": "untestable", "b": "untestable"}),
]
