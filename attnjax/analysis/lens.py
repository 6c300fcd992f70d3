"""The logit lens: each layer's residual stream read out as if it were the last, through the
decoder's final norm and output layer, ``p_l = softmax(W_U norm(r_l))`` for the stream ``r_l``
after block l. The last layer's readout is the model's own logits; the earlier ones show from
which layer the next token is already decided.

``attnjax lens RUN --text TEXT`` writes ``lens.png`` (layers x positions, coloured by the
probability of the true next token, each cell labelled with the layer's top token) and
``lens.md`` (the same, per position: the top tokens and that probability per layer).

References: nostalgebraist 2020, "interpreting GPT: the logit lens"; Belrose et al. 2023,
"Eliciting Latent Predictions from Transformers with the Tuned Lens".
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.analysis.capture import probe_examples
from attnjax.analysis.figures import subplots
from attnjax.analysis.heatmaps import token_labels
from attnjax.config import Config
from attnjax.models.probe import capture_streams
from attnjax.nn.transformer import Readout
from attnjax.outputs import output_directory
from attnjax.rundir import RunDir
from attnjax.train.footprint import check_inference, forward_bytes

READ_OUT = ("final_norm", "embed", "unembed")      # the decoder parameters the readout uses


def check_lens(config: Config) -> None:
    """Refuse, in one line, a model whose streams do not end in next-token logits."""
    if config.model.family != "decoder":
        raise ValueError(f"the logit lens reads a decoder's residual stream; this run's "
                         f"model.family is {config.model.family!r}")


@functools.lru_cache(maxsize=8)
def _compiled_lens(model_config):
    readout = Readout(model_config)

    def lens(params, tokens):
        residual = capture_streams(model_config, params, tokens)["residual"]  # [L, B, T, d]
        used = {name: params[name] for name in READ_OUT if name in params}
        return readout.apply({"params": used}, residual)

    return jax.jit(lens)


def lens_logits(config: Config, params, tokens) -> np.ndarray:
    """``[layers, B, T, vocab]`` float32: every layer's residual stream read out."""
    check_lens(config)
    return np.asarray(_compiled_lens(config.model)(params, jnp.asarray(tokens, jnp.int32)))


def logit_lens(config: Config, params, tokens, top: int = 3) -> dict:
    """For example 0 of ``tokens`` ``[B, T]``: ``{"target_prob" [layers, T - 1]`` (the
    probability layer l gives the true next token at position i), ``"top_ids"`` and
    ``"top_probs"`` ``[layers, T - 1, top]``."""
    logits = lens_logits(config, params, tokens)[:, 0, :-1]               # [L, T - 1, V]
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    targets = np.asarray(tokens)[0, 1:]
    order = np.argsort(-probs, axis=-1, kind="stable")[..., :top]
    return {"target_prob": np.take_along_axis(probs, targets[None, :, None], -1)[..., 0],
            "top_ids": order, "top_probs": np.take_along_axis(probs, order, -1)}


def plot_logit_lens(result: dict, inputs: list[str], top: list[list[str]], path,
                    title: str) -> None:
    """Layers (rows, the last on top) x positions: colour the true next token's probability,
    text the top token (``top[layer][i]``); ``inputs``: the input tokens' labels."""
    target = result["target_prob"]
    L, T = target.shape
    cell = min(0.62, 22.0 / T)                       # inches per position: at most 22 in all
    fontsize = 7 if cell >= 0.45 else 5
    fig, ax = subplots(figsize=(max(6.0, cell * T + 2.5), 0.55 * L + 2.2))
    image = ax.imshow(target, origin="lower", cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for (layer, i), value in np.ndenumerate(target):
        ax.text(i, layer, top[layer][i], ha="center", va="center", fontsize=fontsize,
                color="k" if value > 0.6 else "w")
    ax.set_xticks(range(T), [f"{inputs[i]}\u2192{inputs[i + 1]}" for i in range(T)],
                  rotation=70, fontsize=fontsize)
    ax.set_yticks(range(L), [f"L{layer}" for layer in range(L)])
    ax.set_xlabel("position: input \u2192 true next token")
    ax.set_ylabel("residual stream after layer")
    fig.colorbar(image, ax=ax, label="probability of the true next token", shrink=0.85)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_lens_report(run_dir, out_dir, text: str, which: str = "best") -> str:
    """``lens.png`` and ``lens.md`` of the run's checkpoint on ``text``; returns the
    Markdown."""
    run = RunDir(run_dir)
    config = run.config()
    check_lens(config)
    tokens = probe_examples(config, text=text)["inputs"]
    model, T = config.model, tokens.shape[1]
    check_inference(config, {"activations": forward_bytes(config, 1, T),
                             "every layer's readout": model.num_layers * T * model.vocab_size * 4},
                    f"--text: the logit lens on {T} tokens", "give a shorter --text")
    _, params, step = run.params(which)
    result = logit_lens(config, params, tokens)
    labels = token_labels(tokens[0], config.data)
    top = [[token_labels(ids[:1], config.data)[0] for ids in layer]
           for layer in result["top_ids"]]
    out = Path(out_dir)
    output_directory(out, "--out")
    name = f"{Path(run_dir).name} step {step}"
    plot_logit_lens(result, labels, top, out / "lens.png", f"{name}: logit lens")
    L = result["target_prob"].shape[0]
    lines = [f"# Logit lens: {name}", "",
             "Per position, each layer's top tokens (probability) and the probability of the "
             "true next token.", "",
             "| position | next | " + " | ".join(f"L{layer}" for layer in range(L)) + " |",
             "|---" * (L + 2) + "|"]
    for i in range(result["target_prob"].shape[1]):
        cells = []
        for layer in range(L):
            best = ", ".join(
                f"{token_labels([t], config.data)[0]!r} {p:.2f}"
                for t, p in zip(result["top_ids"][layer, i], result["top_probs"][layer, i]))
            cells.append(f"{best}; true {result['target_prob'][layer, i]:.2f}")
        row = [f"{i} {labels[i]!r}", repr(labels[i + 1]), *cells]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    markdown = "\n".join(lines) + "\n"
    (out / "lens.md").write_text(markdown)
    return markdown
