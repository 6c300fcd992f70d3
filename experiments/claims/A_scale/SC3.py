"""SC3: training without the 1/sqrt(d_k) scale (a) collapses with a wildly oscillating loss
(000), (b) leaves the loss flat with zero attention gradients (002), and (c) is rescued by
clipping the scores after scaling (002).

Measure: S-text at 300 steps (cut from 600 for the budget; the default's arms are the same
300-step runs as SC5, SC8, SC9 and SC12 use) in four regimes, head_dim 16 (the default) and 64
(``model.attention.head_dim=64``, 4 heads) x lr 3e-3, 1e-2. Per regime: default and unscaled
(``model.attention.scale=constant``, m = 1) with clipping on (``train.clip_norm=1``, the
default), at head_dim 64 also with clipping off (``train.clip_norm=None``; not at head_dim 16,
for the budget: there unscaled is only 4x the logits), and unscaled with ``logit_soft_cap=30``
(clipping on). Seeds 0, 1. Per run: spikes, final training loss, validation loss; for the
unscaled runs (the ones (a) and (b) judge) also divergence (conventions of CLAIMS.md, below),
step-0 loss and the attention gradient norm at every logged step.

Resolved here:

- spike and diverged: as CLAIMS.md defines them (``attnjax.audit.dynamics``; the step-0 loss
  is the run's ``initial_loss``, the validation loss of its initial parameters);
- "attention gradient norm": attnjax logs gradient norms per module (``grad_norm/block_<l>/
  attention``, before clipping: W_qkv and W_o together), not per parameter; (b) takes the
  largest over layers and logged steps. The W_qkv-only norm is not logged (gap reported);
- clipping on/off are regimes of (a) and (b) (6 regimes each: the unscaled run against the
  default with the same clipping); (c)'s control is the default with clipping on, same regime.

    attnjax audit experiments/claims --workdir runs/claims --only SC3

Budget: 16 arms x 2 seeds at 300 steps (the head_dim-16 default is the shared 300-step arm);
``NOCLIP_HEAD_DIMS = ()`` drops the 4 clipping-off arms.
"""


from attnjax.audit import over_regimes
from attnjax.audit.dynamics import attention_grad_max, diverged, seeds_text, spikes
from attnjax.audit.settings import EPS, get_config, with_seeds  # noqa: F401  (S-text)

ID = "SC3"
SOURCE = "000 §3.1; 002 §3.2"
CLAIM = ("without 1/sqrt(d_k): (a) collapse with wildly oscillating loss; (b) flat loss, zero "
         "attention gradients; (c) clipping scores after scaling rescues it")
CRITERION = ("(a) diverged or >= 3 more spikes; (b) final training loss within 0.05 of step 0's, "
             "attention gradient norm < 1e-8 throughout; (c) capped loss within eps of control")

# the 300-step S-text arm every group-A training claim builds on (spell it this way to share)
STEPS = {"train.steps": 300, "train.eval_every": 300, "train.checkpoint_every": 300}
HEAD_DIMS = {16: {}, 64: {"model.attention.head_dim": 64}}
LRS = {3e-3: {}, 1e-2: {"train.learning_rate": 0.01}}
ARMS = {
    "default": {},
    "default_noclip": {"train.clip_norm": None},
    "unscaled": {"model.attention.scale": "constant"},
    "unscaled_noclip": {"model.attention.scale": "constant", "train.clip_norm": None},
    "capped": {"model.attention.scale": "constant", "model.attention.logit_soft_cap": 30.0},
}
CLIPS = {"clip": ("default", "unscaled"), "noclip": ("default_noclip", "unscaled_noclip")}
NOCLIP_HEAD_DIMS = (64,)            # clipping off is run at head_dim 64 only (budget)
MORE_SPIKES, FLAT, ZERO_GRAD = 3, 0.05, 1e-8


def arm(head_dim: int, lr: float, name: str) -> dict:
    return {**STEPS, **HEAD_DIMS[head_dim], **LRS[lr], **ARMS[name]}


def regime(head_dim: int, lr: float) -> str:
    return f"head_dim {head_dim}, lr {lr:g}"


def arm_names(head_dim: int) -> list[str]:
    return [name for name in ARMS if "noclip" not in name or head_dim in NOCLIP_HEAD_DIMS]


def get_sweep():
    return with_seeds([arm(h, lr, name) for h in HEAD_DIMS for lr in LRS
                       for name in arm_names(h)])


def describe(trained, unscaled: bool) -> dict:
    """Spikes and losses of a run; for an unscaled one (the runs (a) and (b) judge) also its
    divergence, step-0 loss and attention gradients."""
    ok = trained.dir.error() is None and trained.dir.summary() is not None
    out = {"spikes": spikes(trained) if ok else None,
           "train_loss": trained.summary["train_loss"] if ok else None,
           "loss": trained.loss() if ok else None}
    if unscaled:
        out.update(diverged=diverged(trained),
                   step0_loss=trained.summary["initial_loss"] if ok else None,
                   attention_grad_max=attention_grad_max(trained))
    return out


def measure(runs):
    out = {}
    for h in HEAD_DIMS:
        for lr in LRS:
            out[regime(h, lr)] = {
                name: {str(seed): describe(t, name.startswith("unscaled"))
                       for seed, t in runs.by_seed(arm(h, lr, name)).items()}
                for name in arm_names(h)}
    return out


def _collapsed(unscaled: dict, default: dict) -> bool:
    return (unscaled["diverged"] is not None
            or (default["spikes"] is not None
                and unscaled["spikes"] - default["spikes"] >= MORE_SPIKES))


def _flat(run: dict) -> bool:
    return (run["train_loss"] is not None
            and abs(run["train_loss"] - run["step0_loss"]) <= FLAT
            and run["attention_grad_max"] < ZERO_GRAD)


def _within(capped: dict, control: dict) -> bool:
    return (capped["loss"] is not None and control["loss"] is not None
            and abs(capped["loss"] - control["loss"]) <= EPS)


def verdict(results):
    a, b, c, ev_a, ev_b, ev_c = {}, {}, {}, [], [], []
    for name, r in results.items():
        for clip, (default, unscaled) in CLIPS.items():
            if unscaled not in r:
                continue
            a[f"{name}, {clip}"] = {s: _collapsed(r[unscaled][s], r[default][s])
                                    for s in r[unscaled]}
            b[f"{name}, {clip}"] = {s: _flat(r[unscaled][s]) for s in r[unscaled]}
            div = sum(x["diverged"] is not None for x in r[unscaled].values())
            ev_a.append(f"{name} {clip}: spikes unscaled {seeds_text(r[unscaled], 'spikes', 'd')}"
                        f" vs {seeds_text(r[default], 'spikes', 'd')}, {div} diverged")
            ev_b.append(f"{name} {clip}: loss {_pairs(r[unscaled], 'step0_loss', 'train_loss')}"
                        f", max attn grad {seeds_text(r[unscaled], 'attention_grad_max', '.2g')}")
        c[name] = {s: _within(r["capped"][s], r["default"][s]) for s in r["capped"]}
        ev_c.append(f"{name}: capped {seeds_text(r['capped'], 'loss')} vs "
                    f"{seeds_text(r['default'], 'loss')}")
    return {"a": over_regimes(a, "; ".join(ev_a)), "b": over_regimes(b, "; ".join(ev_b)),
            "c": over_regimes(c, "; ".join(ev_c))}


def _pairs(by_seed: dict, first: str, last: str) -> str:
    text = lambda v: "-" if v is None else format(v, ".2f")
    return "/".join(f"{text(x[first])}->{text(x[last])}" for x in by_seed.values())


def _example(spikes_unscaled: int, flat: bool, capped_loss: float) -> dict:
    run = lambda spikes, loss, grad=0.1, train=1.5: {
        "diverged": None, "spikes": spikes, "step0_loss": 5.6, "train_loss": train,
        "loss": loss, "attention_grad_max": grad}
    unscaled = run(spikes_unscaled, 2.0, *((1e-9, 5.58) if flat else ()))
    seeds = lambda r: {"0": r, "1": r}
    arms = {"default": seeds(run(0, 1.60)), "default_noclip": seeds(run(0, 1.60)),
            "unscaled": seeds(unscaled), "unscaled_noclip": seeds(unscaled),
            "capped": seeds(run(0, capped_loss))}
    return {regime(h, lr): {name: arms[name] for name in arm_names(h)}
            for h in HEAD_DIMS for lr in LRS}


EXAMPLES = [
    (_example(5, True, 1.61), {"a": "confirmed", "b": "confirmed", "c": "confirmed"}),
    (_example(1, False, 1.70), {"a": "refuted", "b": "refuted", "c": "refuted"}),
]
