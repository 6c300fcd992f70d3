"""docs/PERFORMANCE.md from the benchmark results (``benchmarks/results/*.json``, written by
``make bench``): one section per benchmark with the machine it ran on, its table, and plots of
the attention kernels' scaling and of the framework tax against the plain Flax peer.

Every figure in it is a ratio or a time measured within one benchmark run; runs of different
benchmarks (or days) are not compared with each other.
"""

from __future__ import annotations

from pathlib import Path

from attnjax.analysis.figures import subplots
from attnjax.userfiles import read_json

RESULTS = Path("benchmarks/results")


def _number(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    magnitude = abs(value)
    return (f"{value:.3g}" if magnitude < 1e-2 or magnitude >= 1e5 else
            f"{value:,.0f}" if magnitude >= 100 else f"{value:.3g}")


def table(rows: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    """Markdown lines of ``rows`` under ``columns`` = ``[(header, key)]`` (blank if absent)."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_number(row[k]) if k in row else ""
                                       for _, k in columns) + " |")
    return lines


def _scalar_columns(rows: list[dict]) -> list[tuple[str, str]]:
    keys: list[str] = []
    for row in rows:
        keys += [k for k, v in row.items() if not isinstance(v, (dict, list)) and k not in keys]
    return [(k, k) for k in keys]


SECTIONS = {
    "attention": ("Attention kernels", "Causal attention, forward and gradient of each exact "
                  "kernel: median seconds and compiled temporary memory; ratios against the "
                  "first kernel of the same length; with an interpreter that has torch "
                  "(`--python`), PyTorch's fused SDPA forward and backward at the same shape "
                  "(`vs SDPA`: SDPA's time over the kernel's).",
                  [("kernel", "kernel"), ("length", "length"), ("forward ms", "forward_ms"),
                   ("gradient ms", "grad_ms"), ("gradient MB", "grad_temp_mb"),
                   ("gradient time vs reference", "grad_time_vs_reference"),
                   ("gradient memory vs reference", "grad_mem_vs_reference"),
                   ("SDPA ms", "sdpa_grad_ms"), ("vs SDPA", "vs_sdpa")]),
    "train": ("Training throughput and the framework tax", "Tokens per second of the compiled "
              "training loop, model-FLOPs utilisation against a matmul peak measured in the "
              "same run, and at 10 steps per dispatch the plain Flax peer's (attnjax/bench/"
              "peer_gpt.py) tokens per second: `peer_ratio` = attnjax / peer, the median of "
              "alternating rounds that time both (lowest and highest round beside it).",
              [("setting", "setting"), ("kernel", "kernel"),
               ("steps per dispatch", "steps_per_dispatch"),
               ("tokens/s", "tokens_per_s"), ("MFU", "mfu"), ("peer tokens/s",
                                                              "peer_tokens_per_s"),
               ("peer_ratio", "peer_ratio"), ("lowest round", "peer_ratio_low"),
               ("highest round", "peer_ratio_high")]),
    "sweep": ("Sweep launchers", "Wall time of one sweep with each launcher, compilation "
              "included; speedup against the first; runs must agree. `of peak`: the sweep's "
              "model FLOPs at the best matmul peak measured in the same run, over the wall "
              "time (the arithmetic alone would take `of peak` x `wall s`).",
              [("launcher", "launcher"), ("wall s", "seconds"), ("speedup", "speedup"),
               ("of peak", "peak_fraction"), ("max loss difference", "max_loss_difference")]),
    "startup": ("Per-run overhead", "The same run trained twice, each in a new process, sharing "
                "a compilation cache that starts empty: seconds per phase and the cache files "
                "each process added (the second compiles nothing).", None),
    "warm": ("Warm starts", "`attnjax generate RUN --prompt 'ROMEO:' --tokens 20 "
             "--temperature 0` twice, each call a new process, sharing a compilation cache "
             "that starts empty (`attnjax bench warm RUN --python PYTHON`, `warm.json`; "
             "`warm-<name>.json`: another run): the whole command's wall time, and from "
             "`--timings` the seconds until the run is loaded and from there to its tokens; "
             "transformers (run by PYTHON) generating the same tokens from the run's export, "
             "a new process each time. `make bench`: runs/bench-warm is experiments/baseline.py "
             "trained 10 steps, runs/bench-warm-gpt2 the tiny GPT-2 test fixture imported "
             "(with TORCH_PYTHON set, transformers from its export).",
             [("run", "run"), ("side", "side"), ("call", "call"), ("wall s", "wall_s"),
              ("run loaded s", "loaded_s"), ("to tokens s", "to_tokens_s")]),
    "memory": ("Training-step memory", "Compiled memory of one training dispatch, in bytes "
               "(`memory.json`: the default config; `memory-<name>.json`: the other configs "
               "`make bench` measures, e.g. a whole step at length 8192 with each kernel).",
               None),
    "mesh": ("Sharding over a named mesh", "Per-device megabytes of a training step's state "
             "(parameters and Adam moments), temporaries and peak, and of what its all-gathers "
             "produce beside what FSDP must gather at least (`gather analytic`: every "
             "fsdp-split parameter once) and what its gradient reductions produce, read from the "
             "compiled program on 8 CPU devices (`attnjax bench mesh`: `mesh.json`, a "
             "Llama-shaped 110M model; `mesh-large.json`, 333M parameters with `model.remat`, "
             "trained for two steps). `state vs even`: the per-device state over an even split "
             "of the whole over fsdp x tensor. XLA:CPU all-reduces each gradient whole, where "
             "an accelerator's compiler reduce-scatters it.",
             [("mesh", "mesh"), ("parameters", "parameters"), ("state MB", "state_mb"),
              ("state vs even", "state_vs_even"), ("temps MB", "temp_mb"),
              ("peak MB", "peak_mb"), ("gathered MB", "all_gather_mb"),
              ("gather analytic MB", "gather_analytic_mb"), ("reduced MB", "reduced_mb"),
              ("s per dispatch", "dispatch_s")]),
    "context": ("Context parallelism", "Per-device megabytes of a training step (width 256, 2 "
                "layers, batch 1) split along its length over 8 CPU devices by the `ring` and "
                "`allgather` kernels, against the `chunked` kernel holding the whole sequence "
                "on one device, read from the compiled programs; `sent`: what one step's "
                "collectives produce on a device (loops counted per trip), `analytic`: "
                "`ops.context.traffic` for the attention layers, forward and backward "
                "(`attnjax bench context`, `context.json`).",
                [("length", "length"), ("chunked, 1 device, MB", "chunked_mb"),
                 ("ring MB", "ring_mb"), ("ring sent MB", "ring_sent_mb"),
                 ("ring analytic MB", "ring_analytic_mb"), ("allgather MB", "allgather_mb"),
                 ("allgather sent MB", "allgather_sent_mb"),
                 ("allgather analytic MB", "allgather_analytic_mb")]),
    "torch": ("Against PyTorch", "attnjax against PyTorch with fused "
              "`scaled_dot_product_attention` on the same CPU, the two alternating round by "
              "round in one run (`attnjax bench torch --python PYTHON`, `torch.json`; "
              "PyTorch in its own interpreter; both processes keep freed memory for the next "
              "call, `attnjax/allocator.py`): causal attention forward and backward per "
              "kernel (8 heads of 32, 4096 tokens per call, each side timing one call after "
              "an untimed one; `vs_sdpa` = SDPA's time over attnjax's), and training "
              "tokens/s of the same GPT at 1 and 10 steps per dispatch (`vs_torch` = "
              "attnjax / PyTorch; `default`: the dispatch attnjax chooses); medians of 9 "
              "rounds, lowest and highest beside them.",
              [("setting", "setting"), ("kernel", "kernel"), ("length", "length"),
               ("batch", "batch"), ("attnjax ms", "attnjax_ms"), ("SDPA ms", "sdpa_ms"),
               ("vs_sdpa", "vs_sdpa"), ("steps per dispatch", "steps_per_dispatch"),
               ("default", "default"), ("attnjax tokens/s", "tokens_per_s"),
               ("PyTorch tokens/s", "torch_tokens_per_s"), ("vs_torch", "vs_torch"),
               ("lowest", "low"), ("highest", "high")]),
    "eval": ("Evaluation passes", "Forward tokens per second of the evaluation program against "
             "the tokens each forward pass holds, over the same validation sequences; `chosen`: "
             "the size `train.loop.eval_chunk_rows` picks for the config's evaluation batch "
             "(`eval.json`: experiments/baseline.py; `eval-<name>.json`: a wider model).",
             [("tokens per pass", "tokens_per_pass"), ("rows", "rows"),
              ("tokens/s", "tokens_per_s"), ("vs fastest", "vs_fastest"),
              ("chosen", "chosen")]),
    "patch": ("Capture and patching", "Forward seconds and compiled bytes with no point, "
              "every head output or every point captured (`attnjax bench patch` on "
              "experiments/baseline.py); 64 zero-ablations as one batched pass, and mapped over "
              "groups of worlds, against a loop of 64 passes, for 1 and 4 examples, in "
              "`benchmarks/results/patch.json`.",
              [("capture", "capture"), ("points", "points"), ("seconds", "seconds"),
               ("vs none", "vs_none"), ("temp bytes", "temp_bytes"),
               ("output bytes", "output_bytes"), ("worlds", "worlds"),
               ("examples", "examples"), ("batched s", "batched_seconds"),
               ("looped s", "looped_seconds"), ("looped / batched", "speedup"),
               ("group", "group"), ("grouped s", "grouped_seconds"),
               ("looped / grouped", "grouped_speedup")]),
    "generate": ("Decoding", "Per-token seconds of cached decoding against recomputing the "
                 "prefix, and of a whole compiled generation against a Python loop.", None),
    "translate": ("Encoder-decoder decoding", "Seconds per decoding step with the static "
                  "cross-attention cache against recomputing the cross keys and values at "
                  "every step, by source length; seconds per token of beam search against "
                  "greedy decoding (`attnjax bench generate` on experiments/seq2seq.py at "
                  "width 128).", None),
}


def _rows(name: str, result: dict) -> list[dict]:
    rows = result.get("rows") or [{k: v for k, v in result.items()
                                   if k not in ("machine", "backend")}]
    if name == "attention":
        rows = [{**r, "forward_ms": r["forward_s"] * 1e3, "grad_ms": r["grad_s"] * 1e3}
                for r in rows]
    if name == "patch":
        rows = [*rows, *result["patching"]]
    if name == "mesh":
        megabytes = lambda value: round(value / 2**20, 1)
        rows = [{**r, "state_vs_even": f"{r['state_vs_even']:.3f}",
                 "state_mb": megabytes(r["state_bytes"]), "temp_mb": megabytes(
                    r["temp_bytes"]), "peak_mb": megabytes(r["peak_bytes"]),
                 "all_gather_mb": megabytes(r["all_gather_bytes"]),
                 "gather_analytic_mb": megabytes(r["gather_analytic_bytes"]),
                 "reduced_mb": megabytes(r["reduce_scatter_bytes"] + r["all_reduce_bytes"])}
                for r in rows]
    if name == "context":
        megabytes = lambda value: round(value / 2**20, 1)
        rows = [{"length": r["length"], "chunked_mb": megabytes(r["chunked_peak_bytes"]),
                 **{f"{k}{suffix}_mb": megabytes(r[f"{k}_{key}_bytes"])
                    for k in ("ring", "allgather")
                    for suffix, key in (("", "peak"), ("_sent", "sent"),
                                        ("_analytic", "analytic"))}} for r in rows]
    if name == "torch":
        rows = [*result["attention"], *result["training"]]
    if name == "warm":
        rows = [{"run": result["run"], **r} for r in rows]
    if name == "startup":
        rows = [{"process": r["process"], "wall_s": r["wall_s"], **r["seconds"],
                 "new_cache_entries": r["new_cache_entries"]} for r in rows]
    return rows


def attention_plot(rows: list[dict], path: Path) -> Path:
    fig, (time_ax, memory_ax) = subplots(1, 2, figsize=(10, 4), layout="constrained")
    styles = ["o-", "s--", "^:", "d-."]        # kernels with equal values stay visible
    for i, kernel in enumerate(dict.fromkeys(r["kernel"] for r in rows)):
        mine = sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["length"])
        lengths, style = [r["length"] for r in mine], styles[i % len(styles)]
        time_ax.plot(lengths, [r["grad_s"] * 1e3 for r in mine], style, label=kernel)
        memory_ax.plot(lengths, [r["grad_temp_mb"] for r in mine], style, label=kernel)
    for ax, label in ((time_ax, "gradient time (ms)"), (memory_ax, "gradient temporaries (MB)")):
        ax.set(xscale="log", yscale="log", xlabel="sequence length", ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    time_ax.set_title("causal attention gradient: time")
    memory_ax.set_title("causal attention gradient: memory")
    fig.savefig(path, dpi=110)
    return path


def peer_plot(rows: list[dict], path: Path) -> Path:
    rows = [r for r in rows if "peer_ratio" in r]
    fig, ax = subplots(figsize=(7, 1.4 + 0.5 * len(rows)), layout="constrained")
    names = [r["setting"] for r in rows]
    ratios = [r["peer_ratio"] for r in rows]
    spread = [[m - r.get("peer_ratio_low", m) for m, r in zip(ratios, rows)],
              [r.get("peer_ratio_high", m) - m for m, r in zip(ratios, rows)]]
    ax.barh(names, ratios, height=0.6, color="tab:blue", xerr=spread, capsize=4,
            error_kw={"ecolor": "0.3", "lw": 1})
    ax.set_xlim(0, 1.25 * max(max(r.get("peer_ratio_high", r["peer_ratio"]) for r in rows), 1.0))
    ax.axvline(1.0, color="black", lw=1, zorder=0)
    for y, r in enumerate(rows):
        ax.text(r.get("peer_ratio_high", r["peer_ratio"]), y, f"  {r['peer_ratio']:.2f}x",
                va="center")
    ax.set(xlabel="attnjax tokens/s / plain Flax peer tokens/s, 10 steps per dispatch\n"
                  "(bar: the median round; whiskers: the lowest and highest round)",
           title="framework tax: above 1 attnjax is faster")
    ax.invert_yaxis()
    fig.savefig(path, dpi=110)
    return path


def performance_markdown(results_dir: Path = RESULTS, out: Path = Path("docs/PERFORMANCE.md"),
                         command: str = "make bench") -> Path:
    """Write ``out`` (and its plots into ``<out stem lowercased>/``) from ``results_dir``."""
    images = out.parent / out.stem.lower()
    images.mkdir(parents=True, exist_ok=True)
    lines = ["# Performance", "", f"Regenerate with `{command}` (it writes "
             f"`{results_dir}/*.json`, then this page).", "",
             "Figures are ratios and times measured within one benchmark run on the machine "
             "named under each section; runs of different sections were not interleaved.", ""]
    for name, (title, text, columns) in SECTIONS.items():
        paths = [*results_dir.glob(f"{name}.json"), *sorted(results_dir.glob(f"{name}-*.json"))]
        if not paths:
            continue
        results = [read_json(path) for path in paths]
        rows = [row for result in results for row in _rows(name, result)]
        machines = sorted({r.get("machine", "a machine not recorded") for r in results})
        lines += [f"## {title}", "", text, "", f"Measured on {'; '.join(machines)}.", ""]
        lines += table(rows, columns or _scalar_columns(rows)) + [""]
        plot = {"attention": attention_plot, "train": peer_plot}.get(name)
        if plot is not None and (name != "train" or any("peer_ratio" in r for r in rows)):
            png = plot(rows, images / f"{name}.png")
            lines += [f"![{title}]({images.name}/{png.name})", ""]
    out.write_text("\n".join(lines))
    print(f"wrote {out}")
    return out
