"""``attnjax attention | explore | heads | lens | patch | recall | compare``: what a trained run's
heads do (``attnjax.analysis``)."""

from __future__ import annotations

import shlex
from pathlib import Path

from attnjax.cli.arguments import add_checkpoint, add_command, check_range, utf8_text
from attnjax.config.fields import INT32, LENGTH


def out_checked_first(handler):
    """``handler`` after its ``--out`` is checked to be a directory it could write into
    (nothing is written): a file, a path under a file or a read-only place is refused in one
    line before any work."""
    def run(args) -> int:
        from attnjax.outputs import output_directory
        output_directory(args.out, "--out", create=False)
        return handler(args)
    return run


def check_probe_options(args) -> None:
    """Refuse, in one line, the probe options (``add_probe_options``) that no run takes."""
    if args.text is not None and args.batch is not None:
        raise ValueError("give --text or --batch, not both")
    utf8_text("--text", args.text)
    if args.batch is not None:
        check_range("--batch", args.batch, 1, INT32)
    if args.length is not None:      # the model's own bound (and the memory) once it is read
        check_range("--length", args.length, 2, LENGTH)


def add_probe_options(parser) -> None:
    """A run and a probe of it: RUN_DIR, KEY=VALUE overrides, --text, --batch, --length."""
    parser.add_argument("workdir", metavar="RUN_DIR", help="run directory written by "
                        "'attnjax train' or 'attnjax import'")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides for this evaluation only, e.g. "
                        "model.attention.scale_multiplier=1e-6")
    parser.add_argument("--text", default=None,
                        help="probe text for text runs (its bytes, or its ids under the "
                        "run's tokenizer), e.g. \"def main(argv):\"")
    parser.add_argument("--batch", type=int, default=None, metavar="N",
                        help="probe with N validation examples of the run's own data "
                        "(default 4 if no --text)")
    parser.add_argument("--length", type=int, default=None, metavar="N",
                        help="probe length in tokens (default: the training length); "
                        "longer shows the heads past it")


def _attention(args) -> int:
    from attnjax.analysis.heatmaps import write_attention_report
    check_probe_options(args)
    if args.draws is not None and not args.occlusion:
        raise ValueError("--draws is read only with --occlusion")
    print(write_attention_report(args.workdir, args.out, text=args.text, batch=args.batch,
                                 length=args.length, which=args.checkpoint,
                                 overrides=args.overrides, occlusion=args.occlusion,
                                 draws=8 if args.draws is None else args.draws))
    extra = ", occlusion.png" if args.occlusion else ""
    print(f"every head, token by token, in one HTML file: {explore_command(args)}")
    print(f"wrote heatmaps, grid.png{extra} and head_stats.md to {args.out}")
    return 0


def explore_command(args) -> str:
    """The ``attnjax explore`` command of the run and probe of an ``attnjax attention``
    command, writing ``explorer.html`` into its ``--out``."""
    probe = (["--text", args.text] if args.text is not None else
             ["--batch", str(args.batch)] if args.batch is not None else [])
    length = ["--length", str(args.length)] if args.length is not None else []
    checkpoint = ["--checkpoint", args.checkpoint] if args.checkpoint != "best" else []
    words = ["attnjax", "explore", args.workdir, *args.overrides, *probe, *length, *checkpoint,
             "--out", str(Path(args.out) / "explorer.html")]
    return shlex.join(words)


def add_attention(commands) -> None:
    attention = add_command(commands, "attention", "attention heatmaps of every layer and head "
                            "on a probe input, a grid of all heads, and per-head statistics",
                            "Run a trained model on a probe input and write one heatmap per "
                            "layer and head, grid.png with every head, and head_stats.md/.csv "
                            "(entropy, sink mass, previous-token and induction scores, ...).")
    add_probe_options(attention)
    attention.add_argument("--out", required=True, metavar="DIR",
                           help="directory to write the heatmaps and statistics into")
    add_checkpoint(attention)
    attention.add_argument("--occlusion", action="store_true",
                           help="also rank the keys by occlusion (loss rise when a key token "
                           "is replaced at random), plot it beside the last layer's weights in "
                           "occlusion.png and print the median Spearman rho")
    attention.add_argument("--draws", type=int, default=None, metavar="N",
                           help="with --occlusion: random replacements per key (default: 8)")
    attention.set_defaults(run=out_checked_first(_attention))


def _explore(args) -> int:
    from attnjax.analysis.explore import write_explorer
    from attnjax.outputs import output_file
    check_probe_options(args)
    check_range("--max-tokens", args.max_tokens, 1, LENGTH)
    output_file(args.out, "--out")
    print(write_explorer(args.workdir, args.out, text=args.text, batch=args.batch,
                         length=args.length, which=args.checkpoint, max_tokens=args.max_tokens,
                         overrides=args.overrides, results=args.results))
    return 0


def add_explore(commands) -> None:
    explore = add_command(commands, "explore", "every layer and head of a run on a probe, token "
                          "by token, in one self-contained HTML file to open in a browser",
                          "Run a trained model on a probe input and write one HTML file (no "
                          "server, no network: the data is inside it) to explore its attention: "
                          "every head as a small map with its statistics on hover, one head with "
                          "its tokens written out (lines or a labelled matrix; hover a token for "
                          "its row or column; arrow keys change layer and head), several heads "
                          "overlaid in colour, and a sortable table of per-head statistics, with "
                          "the shares of 'attnjax patch' and 'attnjax heads' results in the run "
                          "directory. An encoder-decoder's cross-attention and encoder heads too.")
    add_probe_options(explore)
    explore.add_argument("--out", required=True, metavar="FILE.html",
                         help="the HTML file to write")
    explore.add_argument("--max-tokens", type=int, default=128, metavar="N",
                         help="show the first N queries and keys of each example (the weights "
                         "grow as N squared; the statistics use every token; default: "
                         "%(default)s)")
    explore.add_argument("--results", action="append", default=None, metavar="DIR",
                         help="a directory of 'attnjax patch' or 'attnjax heads' output to show "
                         "on the heads (repeatable; default: those inside RUN_DIR)")
    add_checkpoint(explore)
    explore.set_defaults(run=_explore)


def _heads(args) -> int:
    from attnjax.analysis.heads import write_head_report
    from attnjax.rundir import RunDir
    if args.steps is not None:       # a removal of heads per step: at most every head
        model = RunDir(args.workdir).config().model
        check_range("--steps", args.steps, 1, model.num_layers * model.attention.num_heads)
    print(write_head_report(args.workdir, args.out, which=args.checkpoint, steps=args.steps))
    print(f"wrote knockout, importance, pruning and head-similarity tables and plots to "
          f"{args.out}")
    return 0


def add_heads(commands) -> None:
    heads = add_command(commands, "heads", "head knockout, gradient importance (Michel et al.) "
                        "and the pruning curve", "Knock out one head at a time (loss change per "
                        "head), compute gradient head importance (Michel et al.) and plot "
                        "iterative pruning: loss against the fraction of heads removed.")
    heads.add_argument("workdir", metavar="RUN_DIR", help="run directory written by "
                       "'attnjax train'")
    heads.add_argument("--out", required=True, metavar="DIR",
                       help="directory to write the tables and plots into")
    add_checkpoint(heads)
    heads.add_argument("--steps", type=int, default=None, metavar="N",
                       help="points on the pruning curve (default: one per head, at most 10)")
    heads.set_defaults(run=out_checked_first(_heads))


def _recall(args) -> int:
    from attnjax.analysis.recall import write_recall_report
    from attnjax.rundir import RunDir
    from attnjax.train import footprint
    if args.batches is not None:     # all of them held at once: their inputs and targets
        check_range("--batches", args.batches, 1, INT32)
        config = RunDir(args.workdir).config()
        held = args.batches * config.train.eval_batch_size * config.data.length * 2 * 4
        footprint.check_inference(config, {"batches": held},
                                  f"--batches {args.batches}: scoring {args.batches} batches",
                                  "score fewer --batches")
    print(write_recall_report(args.workdir, args.out, which=args.checkpoint,
                              buckets=args.buckets, batches=args.batches))
    print(f"wrote recall.md, recall.csv and recall.png to {args.out}")
    return 0


def add_recall(commands) -> None:
    recall = add_command(commands, "recall", "accuracy of a recall run (induction, mqar) by the "
                         "distance between each query and the key it recalls", "Score a recall "
                         "run's validation batches and bucket the scored targets by query-key "
                         "distance (the query's position minus that of the earlier occurrence of "
                         "its token that is followed by the answer): recall.md, recall.csv, "
                         "recall.png.")
    recall.add_argument("workdir", metavar="RUN_DIR", help="run directory of an induction or "
                        "mqar run")
    recall.add_argument("--out", required=True, metavar="DIR",
                        help="directory to write the table and plot into")
    recall.add_argument("--buckets", default="pow2", metavar="SPEC",
                        help="distance buckets: pow2 (1, 2-3, 4-7, ...), a number N of "
                        "equal-width buckets, or increasing edges e.g. 1,8,32,128 "
                        "(default: %(default)s)")
    recall.add_argument("--batches", type=int, default=None, metavar="N",
                        help="validation batches to score (default: train.eval_batches)")
    add_checkpoint(recall)
    recall.set_defaults(run=out_checked_first(_recall))


def _compare(args) -> int:
    from attnjax.analysis.compare import compare_runs, compare_sweep
    if args.baseline is not None:
        if args.run_b is not None:
            raise ValueError("compare takes RUN_A RUN_B, or SWEEP_DIR --baseline RUN, not both")
        print(compare_sweep(args.run_a, args.baseline, args.out, which=args.checkpoint))
    elif args.run_b is None:
        raise ValueError("compare needs RUN_A RUN_B, or SWEEP_DIR --baseline RUN")
    else:
        print(compare_runs(args.run_a, args.run_b, args.out, which=args.checkpoint))
    return 0


def add_compare(commands) -> None:
    compare = add_command(commands, "compare", "compare two runs, or every run of a sweep with a "
                          "baseline: config, parameters, attention, losses",
                          "Compare RUN_A with RUN_B, or every run of SWEEP_DIR with --baseline: "
                          "config difference, per-parameter relative L2 and cosine, "
                          "Jensen-Shannon divergence of attention per layer and head, "
                          "validation losses.")
    compare.add_argument("run_a", metavar="RUN_A|SWEEP_DIR",
                         help="first run directory, or a sweep directory (with --baseline)")
    compare.add_argument("run_b", metavar="RUN_B", nargs="?", default=None,
                         help="second run directory (omit with --baseline)")
    compare.add_argument("--baseline", default=None, metavar="RUN",
                         help="with SWEEP_DIR: the run every other run is compared with, a "
                         "run name of the sweep (e.g. num_heads=4,seed=0) or a run directory")
    compare.add_argument("--out", required=True, metavar="DIR",
                         help="directory to write the comparison into")
    add_checkpoint(compare)
    compare.set_defaults(run=out_checked_first(_compare))


def _lens(args) -> int:
    from attnjax.analysis.lens import write_lens_report
    utf8_text("--text", args.text)
    print(write_lens_report(args.workdir, args.out, args.text, which=args.checkpoint))
    print(f"wrote lens.png and lens.md to {args.out}")
    return 0


def add_lens(commands) -> None:
    lens = add_command(commands, "lens", "the logit lens: every layer's residual stream read "
                       "out as next-token predictions", "Read each layer's residual stream of a "
                       "decoder through its final norm and output layer, as if it were the "
                       "last, on a text probe: lens.png (layers x positions, the probability "
                       "of the true next token, the top token in each cell) and lens.md (the "
                       "top tokens per layer). The last layer is the model's own prediction.")
    lens.add_argument("workdir", metavar="RUN_DIR", help="run directory written by 'attnjax "
                      "train' or 'attnjax import' (a decoder)")
    lens.add_argument("--text", required=True, metavar="TEXT",
                      help="probe text (its bytes, or its ids under the run's tokenizer)")
    lens.add_argument("--out", required=True, metavar="DIR", help="where to write the "
                      "picture and the table")
    add_checkpoint(lens)
    lens.set_defaults(run=out_checked_first(_lens))


def _patch(args) -> int:
    from attnjax.analysis.circuits import write_patch_report
    for flag in ("--clean", "--corrupt", "--metric"):
        utf8_text(flag, getattr(args, flag[2:]))
    check_range("--examples", args.examples, 1, INT32)
    if args.paths is not None:
        check_range("--paths", args.paths, 0, INT32)
    print(write_patch_report(args.workdir, args.out, clean=args.clean, corrupt=args.corrupt,
                             metric=args.metric, examples=args.examples,
                             which=args.checkpoint, by_position=args.by_position,
                             paths=args.paths))
    pictures = "heads.png, heads_noising.png, " + ("heads_by_position.png, "
                                                     if args.by_position else "")
    paths = "path.png, " if (Path(args.out) / "path.png").is_file() else ""
    print(f"wrote {pictures}positions.png, {paths}patching.md to {args.out}")
    return 0


def add_patch(commands) -> None:
    patching = add_command(
        commands, "patch", "activation and path patching: which heads and paths carry a "
        "behaviour from a clean input to a corrupted one", "Patch each head's output, the "
        "residual stream at each position, and each sender head's path to a later head's "
        "queries, keys or values from a clean run into a corrupted one, all in batched "
        "passes, and report the share of the metric each restores: heads.png, positions.png, "
        "path.png, patching.md; each head's corrupted output in the clean run gives the share "
        "it loses (heads_noising.png). Pairs: --clean/--corrupt texts of as many tokens with "
        "--metric logit_diff:A,B at the last position, or an induction run's own examples "
        "with the first occurrence of the block changed.")
    patching.add_argument("workdir", metavar="RUN_DIR", help="run directory of a decoder")
    patching.add_argument("--out", required=True, metavar="DIR",
                          help="where to write the pictures and the table")
    patching.add_argument("--clean", default=None, metavar="TEXT", help="the clean text")
    patching.add_argument("--corrupt", default=None, metavar="TEXT",
                          help="the corrupted text (as many tokens as --clean)")
    patching.add_argument("--metric", default=None, metavar="logit_diff:A,B",
                          help="the logit of token A minus B at the last position")
    patching.add_argument("--examples", type=int, default=16, metavar="N",
                          help="induction runs: how many validation examples (default: "
                          "%(default)s)")
    patching.add_argument("--by-position", action="store_true",
                          help="also patch each head at each position alone "
                          "(heads_by_position.png)")
    patching.add_argument("--paths", type=int, default=None, metavar="K",
                          help="path patching only among the K heads whose clean output "
                          "recovers the most (a large model's every pair is too many; 0: no "
                          "path patching; default: every pair of heads)")
    add_checkpoint(patching)
    patching.set_defaults(run=out_checked_first(_patch))
