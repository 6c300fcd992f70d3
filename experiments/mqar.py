"""Multi-query associative recall (MQAR, Arora et al. 2023, REFERENCES.md) at length 64 with
a 2-layer softmax-attention model, and a sweep over the attention kernel and over what makes
the task learnable.

    attnjax train experiments/mqar.py --workdir runs/mqar
    attnjax sweep experiments/mqar.py --workdir runs/mqar-sweep --launcher vmap
    attnjax report runs/mqar-sweep
    python experiments/mqar.py curves docs/mqar/curves.png runs/mqar \
        "runs/mqar-sweep/mqar_filler=zero,eval_every=250" \
        "runs/mqar-sweep/embed_scale=None,eval_every=250"
    python experiments/mqar.py shares RUN      # where each layer looks from the queries

Single run (``get_config``): Zoology's first setting on a CPU budget. Length 64, 4 key-value
pairs, vocabulary 64 (keys 1..31, values 32..63), generated as Zoology generates them
(``ZOOLOGY_TASK``: random tokens between the queries, queries placed near the pairs by a
power law with a = 0.01, distinct values); the shared small model (``small_text``: 2 layers,
width 64, RoPE, lr 3e-3) with one head and token embeddings scaled by sqrt(d_model) = 8
(``model.embed_scale``), no weight decay, batch 64, 1500 steps (96k examples), evaluated
every 50. Runtime on 2 CPU cores: about 100 s.

Expected: accuracy at guessing among the 4 values in context (loss ln 4 = 1.39, accuracy
0.25), then a sharp rise once the recall circuit forms: attention solves MQAR (Zoology).
Measured (seed 0): validation accuracy 0.18, 0.23, 0.26, 0.29 at steps 50-200, then 0.38,
0.62, 0.82, 0.91 at steps 250-400, 0.985 at 600 and 1.000 at 1500 (loss 5e-5); seed 1 also
ends at 1.000. docs/mqar/curves.png shows it beside two runs that stay on the plateau.

Why attnjax's MQAR stayed on the plateau (``SETTING`` on attnjax's default generator: 4 heads,
embedding scale 1, validation accuracy 0.28 after 4000 steps): two things, each enough
alone, found by undoing each difference from this run in the sweep below. (1) The filler:
attnjax fills the sequence between the queries with token 0, Zoology with random tokens.
(2) The token embedding scale: N(0, 0.02) embeddings at scale 1 are drowned by what the
blocks add to them (at initialisation the residual stream after the first block has RMS 0.78,
the embeddings 0.020), so the token's identity is lost in the residual stream.
Zoology's query placement and its distinct values make no difference here. A run on the
plateau has built half the circuit: from the query positions its first layer puts 0.80 of
its weight on the 4 values (zero filler; 0.53 at scale 1) and its second layer 0.00 (0.01),
while the solved run's second layer puts 0.63 on the values (``python experiments/mqar.py
shares RUN``, 64 validation sequences). The generator's defaults stay attnjax's
(``data.mqar_*``), so existing runs reproduce.

Sweep (``get_sweep``): the single run's setting, one seed each, with linear attention or a
sliding window of 16 in place of softmax attention, and with each difference from attnjax's
defaults undone alone, then the three generator differences at once. Runtime on 2 CPU cores
with ``--launcher vmap``: about 35 minutes, half of it the linear kernel (10x slower per
token than softmax attention here). Measured (``attnjax report runs/mqar-sweep``: validation
accuracy and loss at length 64 after 1500 steps; the first evaluation, every 250 steps, past
accuracy 0.9):

    run                                       val acc  val loss  past 0.9 at
    softmax (the single run's setting)          1.000    0.0001          500
    linear attention                            0.250    1.454             -
    sliding window 16                           0.750    0.995             -
    zero filler                                 0.324    1.343             -
    queries placed uniformly                    1.000    0.0000          500
    values drawn with replacement               1.000    0.0001          500
    attnjax's generator (all three)             0.291    1.352             -
    embedding scale 1                           0.241    1.485             -

Linear attention (a fixed-size state) guesses among the values, as Zoology finds; the window
recalls the queries that land within 16 tokens of their pair (the power law puts most there)
and not the rest.
"""

from attnjax.config import Config
from attnjax.experiment import small_text

# The shared model and schedule on a 64-token vocabulary at length 64 (experiments/induction.py
# trains it on the induction task)
SETTING = {"model.vocab_size": 64, "data.vocab_size": 64, "model.max_length": 64,
           "data.length": 64, "train.steps": 4000, "train.warmup_steps": 100,
           "train.weight_decay": 0.0, "train.log_every": 100, "train.eval_every": 500,
           "train.checkpoint_every": 500, "train.eval_batches": 8, "train.eval_batch_size": 64}

# Zoology's task: random filler, queries near the pairs (a power law), distinct values
ZOOLOGY_TASK = {"data.mqar_filler": "random", "data.mqar_query_power": 0.01,
                "data.mqar_distinct_values": True}

# The single run: what it changes from SETTING
RECALL = {"data.task": "mqar", "data.num_pairs": 4, **ZOOLOGY_TASK,
          "model.attention.num_heads": 1, "model.embed_scale": 8.0, "train.batch_size": 64,
          "train.steps": 1500, "train.log_every": 10, "train.eval_every": 50,
          "train.checkpoint_every": 500}


def get_config() -> Config:
    return small_text({**SETTING, **RECALL})


KERNELS = [{"model.attention.kernel": "linear"},
           {"model.attention.kernel": "reference", "model.attention.window": 16}]
# one change each to the single run's task or model, then attnjax's defaults for all three
ABLATIONS = [{"data.mqar_filler": "zero"}, {"data.mqar_query_power": None},
             {"data.mqar_distinct_values": False},
             {"data.mqar_filler": "zero", "data.mqar_query_power": None,
              "data.mqar_distinct_values": False},
             {"model.embed_scale": None}]
SWEEP_EVAL = {"train.eval_every": 250}     # the linear kernel evaluates slowly


def get_sweep() -> list[dict]:
    return [{**SWEEP_EVAL, **run} for run in [{}, *KERNELS, *ABLATIONS]]


def plateau(num_pairs: int, vocab_size: int, distinct: bool,
            examples: int = 100_000) -> tuple[float, float]:
    """Loss and accuracy on the queries of the best guess without recall: each of the
    ``num_pairs`` values in context with probability (its count) / ``num_pairs``: ln P and
    1 / P for distinct values, else by Monte Carlo (values drawn with replacement from the
    upper half of the vocabulary)."""
    import numpy as np

    if distinct:
        return float(np.log(num_pairs)), 1 / num_pairs
    rng = np.random.default_rng(0)
    values = rng.integers(vocab_size // 2, vocab_size, (examples, num_pairs))
    counts = (values[:, :, None] == values[:, None, :]).sum(-1)         # [examples, pairs]
    target = rng.integers(num_pairs, size=examples)
    count = counts[np.arange(examples), target]
    top = counts.max(-1)
    ties = np.array([len(set(v[c == m])) for v, c, m in zip(values, counts, top)])
    return float(-np.log(count / num_pairs).mean()), float(((count == top) / ties).mean())


def plot_curves(out: str, *workdirs: str) -> None:
    """Validation loss and accuracy against the step of each run in ``workdirs`` (the
    training loss thin behind), each with the loss and accuracy of guessing among the values
    in context (dotted), into the PNG ``out``; a run is labelled by its directory name."""
    from pathlib import Path

    from attnjax.analysis.figures import subplots
    from attnjax.analysis.sweep_plots import DPI, colors
    from attnjax.rundir import RunDir

    fig, (loss_ax, acc_ax) = subplots(1, 2, figsize=(12, 4.5))
    for workdir, color in zip(workdirs, colors(len(workdirs))):
        run = RunDir(workdir)
        records, data = run.metrics(), run.config().data
        name = Path(workdir).name
        trained = [r for r in records if "loss" in r]
        evals = [r for r in records if "val_loss" in r]
        loss_ax.plot([r["step"] for r in trained], [r["loss"] for r in trained], color=color,
                     lw=0.6, alpha=0.4)
        for ax, key in ((loss_ax, "val_loss"), (acc_ax, "val_accuracy")):
            ax.plot([r["step"] for r in evals], [r[key] for r in evals], color=color,
                    marker="o", ms=3, lw=1.2, label=f"{name} (length {data.length})")
        guess = plateau(data.num_pairs, data.vocab_size, data.mqar_distinct_values)
        loss_ax.axhline(guess[0], color=color, ls=":", lw=1)
        acc_ax.axhline(guess[1], color=color, ls=":", lw=1)
    loss_ax.set_ylim(0, None)
    loss_ax.set_ylabel("loss on the queries (nats)")
    acc_ax.set_ylabel("validation accuracy on the queries")
    for ax in (loss_ax, acc_ax):
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3, which="both")
    acc_ax.legend(fontsize=8, loc="center right")
    fig.suptitle("MQAR, validation (points) and training (thin) loss; dotted: guessing among "
                 "the values in context")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, bbox_inches="tight")


def attention_shares(workdir: str, examples: int = 64) -> dict[str, list[float]]:
    """Where each layer's first head looks from the query positions of ``examples``
    validation sequences, averaged: the shares of its weight on the zero filler, on the values
    of the pairs and on the keys of the pairs (the rest is on the queries and, with random
    filler, on filler tokens)."""
    import numpy as np

    from attnjax.data import Dataset
    from attnjax.models.probe import capture
    from attnjax.rundir import RunDir

    config, params, _ = RunDir(workdir).params()
    data = config.data
    batch = Dataset(data).batch(0, 0, examples, data.length, "val")
    weights, _ = capture(config.model, params, batch["inputs"])
    queries = np.asarray(batch["weights"]) > 0
    tokens = np.asarray(batch["inputs"])[:, None, :].repeat(data.length, 1)[queries]
    in_pairs = np.arange(data.length) < 2 * data.num_pairs
    half = data.vocab_size // 2
    parts = {"filler 0": tokens == 0, "values": (tokens >= half) & in_pairs,
             "keys": (tokens < half) & (tokens > 0) & in_pairs}
    rows = [np.asarray(layer)[:, 0][queries] for layer in weights]   # [queries, keys] each
    return {name: [float((w * mask).sum(-1).mean()) for w in rows] for name, mask in parts.items()}


if __name__ == "__main__":
    import sys

    command, *arguments = sys.argv[1:] or ["help"]
    if command == "curves" and len(arguments) >= 2:
        plot_curves(*arguments)
    elif command == "shares" and len(arguments) == 1:
        for name, shares in attention_shares(arguments[0]).items():
            print(f"{name:>9}: " + "  ".join(f"layer {i} {s:.2f}" for i, s in enumerate(shares)))
    else:
        sys.exit("usage: python experiments/mqar.py curves OUT.png RUN [RUN ...]\n"
                 "       python experiments/mqar.py shares RUN")
