"""``attnjax train | eval | generate``: train a run directory, evaluate its checkpoint, sample
from it."""

from __future__ import annotations

import math
import sys
import time

from attnjax.cli.arguments import (OVERRIDES, add_checkpoint, add_command, check_range,
                                   utf8_text)
from attnjax.config.fields import LENGTH


def _train(args) -> int:
    from attnjax import distributed
    cluster = distributed.cluster_from(args.coordinator, args.num_processes, args.process_id,
                                       detect=args.distributed)
    from attnjax.experiment import experiment_config
    from attnjax.train import footprint, format_summary, train
    from attnjax.compilation import enable_compile_cache
    config = experiment_config(args.experiment, args.overrides)   # bad input fails first
    distributed.initialize(cluster)
    footprint.check_training(config)           # a model that cannot fit, before it is built
    enable_compile_cache()
    summary = train(config, args.workdir, progress=not args.no_progress)
    if distributed.is_primary():
        print(format_summary(summary))
    return 0


def add_train(commands) -> None:
    train = add_command(commands, "train", "train an experiment's config into a run directory "
                        "(rerun to resume)", "Train the config returned by EXPERIMENT.py's "
                        "get_config() into --workdir. Rerunning the same command resumes from "
                        "the latest checkpoint; a finished run is not trained again.")
    train.add_argument("experiment", metavar="EXPERIMENT.py",
                       help="experiment file defining get_config(), e.g. experiments/baseline.py")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=OVERRIDES)
    train.add_argument("--workdir", required=True, metavar="DIR",
                       help="run directory for config.json, metrics.jsonl, TensorBoard events "
                       "and checkpoints")
    train.add_argument("--no-progress", action="store_true",
                       help="do not show a progress bar (for logs and batch jobs)")
    train.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                       help="multi-process run: process 0's address, which every process "
                       "names (or $ATTNJAX_COORDINATOR); see docs/CLUSTER.md")
    train.add_argument("--num-processes", type=int, default=None, metavar="N",
                       help="multi-process run: how many processes train the run together "
                       "(or $ATTNJAX_NUM_PROCESSES)")
    train.add_argument("--process-id", type=int, default=None, metavar="I",
                       help="multi-process run: this process's index, 0 to N-1 (or "
                       "$ATTNJAX_PROCESS_ID); process 0 writes the run directory")
    train.add_argument("--distributed", action="store_true",
                       help="multi-process run in a cluster JAX detects (SLURM's srun, Open "
                       "MPI, a Cloud TPU pod slice, Kubernetes) instead of the three flags")
    train.set_defaults(run=_train)


def _eval(args) -> int:
    """Print the evaluation of a run's checkpoint and keep it in RUN/eval.json. A run it cannot
    write into (read-only, full, another user's) still has its checkpoint read and evaluated:
    the results are printed, one line on stderr says eval.json was not saved, and the exit
    status is 0 (the evaluation was done and shown)."""
    from attnjax.config import apply_overrides
    from attnjax.data import Dataset
    from attnjax.models import check_same_parameters, family
    from attnjax.outputs import NotSavedError
    from attnjax.rundir import RunDir
    from attnjax.train import evaluate, footprint
    from attnjax.train.strided import strided_options
    for length in args.lengths or ():
        check_range("--lengths", length, 1, LENGTH)
    run_dir = RunDir(args.workdir)
    stored = run_dir.config()
    config = apply_overrides(stored, args.overrides) if args.overrides else stored
    check_same_parameters(stored.model, config.model, args.overrides)
    lengths = args.lengths or [config.data.length, *config.data.eval_lengths]
    strided = strided_options(config.data.length, args.window, args.stride, args.score_last,
                              causal=config.model.causal)
    windows = dict(zip(("window", "stride", "score_last"), strided or ()))
    footprint.check_evaluation(config, lengths, windows.get("window"),   # before params load
                               "--lengths" if args.lengths else "data.length/eval_lengths")
    _, params, step = run_dir.params(args.checkpoint)
    results = evaluate(config, params, Dataset(config.data), lengths, train_mode=args.train_mode,
                       **windows)
    mode = ", dropout on (--train-mode)" if args.train_mode else ""
    if windows:
        mode += (f", windows of {windows['window']} tokens every {windows['stride']}, each "
                 f"after the first scoring its last {windows['score_last']} targets")
    print(f"{args.checkpoint} checkpoint (step {step}) of {args.workdir}{mode}")
    perplexity = family(config.model).objective(config.model) == "next_token"   # per token
    print(f"{'length':>8} {'val loss':>10} {'accuracy':>10}"
          + (f" {'perplexity':>11}" if perplexity else ""))
    for length, r in results.items():
        print(f"{length:>8} {r['loss']:>10.4f} {r['accuracy']:>10.4f}"
              + (f" {math.exp(min(r['loss'], 700.0)):>11.3f}" if perplexity else ""))
    try:
        run_dir.write_eval({"checkpoint": args.checkpoint, "step": step,
                            "overrides": args.overrides, "train_mode": args.train_mode,
                            **({"strided": windows} if windows else {}),
                            "results": {str(k): v for k, v in results.items()}})
    except NotSavedError as error:
        print(f"attnjax: {error}: the results above are not kept", file=sys.stderr)
    return 0


def add_eval(commands) -> None:
    evaluate = add_command(commands, "eval", "evaluate a trained run's checkpoint, e.g. at other "
                           "lengths or with a RoPE scaling override", "Evaluate a run's "
                           "checkpoint on validation data at one or more sequence lengths, "
                           "optionally with config overrides (e.g. "
                           "model.position.rope_scaling=yarn). Writes eval.json into the run "
                           "directory.")
    evaluate.add_argument("workdir", metavar="RUN_DIR", help="run directory written by "
                          "'attnjax train'")
    evaluate.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                          help="config overrides for evaluation only, e.g. "
                          "model.position.rope_scale=4")
    evaluate.add_argument("--lengths", type=int, nargs="+", default=None, metavar="N",
                          help="sequence lengths to evaluate at (default: the training length "
                          "and data.eval_lengths)")
    add_checkpoint(evaluate)
    evaluate.add_argument("--train-mode", action="store_true",
                          help="evaluate with dropout on, as the model trains (the gap to the "
                          "default shows what dropout costs at evaluation)")
    evaluate.add_argument("--stride", type=int, default=None, metavar="N",
                          help="strided evaluation: score each sequence by windows of --window "
                          "tokens starting every N tokens (default: the window, disjoint "
                          "segments); N must divide length - window")
    evaluate.add_argument("--window", type=int, default=None, metavar="W",
                          help="strided evaluation: the tokens each window encodes, at "
                          "positions 0..W-1 (default: the training length data.length)")
    evaluate.add_argument("--score-last", type=int, default=None, metavar="K",
                          help="strided evaluation: each window after the first scores its "
                          "last K targets, the first all; K must equal --stride (default), "
                          "so every target is scored once, as without windows")
    evaluate.set_defaults(run=_eval)


TEXT_TASKS = {"next_token": "text", "seq2seq": "letters"}   # text runs, per objective


def _text_codec(data):
    """``(encode, decode)`` of a text run's tokens: ``data.tokenizer``'s ids (with its special
    tokens), or UTF-8 bytes."""
    if data.tokenizer is not None:
        from attnjax.data.tokenizer import load_tokenizer
        tokenizer = load_tokenizer(data.tokenizer)
        return (lambda text: [int(t) for t in tokenizer.encode(text)]), tokenizer.decode
    return (lambda text: list(text.encode("utf-8")),
            lambda ids: bytes(t for t in ids if t < 256).decode("utf-8", errors="replace"))


def _generate(args) -> int:
    from attnjax.beam import check_beams
    from attnjax.data.seq2seq import seq2seq_specials
    from attnjax.generate import check_sampling
    from attnjax.models import family
    from attnjax.rundir import RunDir
    from attnjax.translate import check_translation
    started = time.perf_counter()
    utf8_text("--prompt", args.prompt)
    run_dir = RunDir(args.workdir)
    config = run_dir.config()
    objective = family(config.model).objective(config.model)
    if config.data.task != TEXT_TASKS.get(objective):
        raise ValueError("generate needs a text run (data.task='text', or 'letters' with "
                         f"model.family='seq2seq'), got data.task={config.data.task!r}")
    encode, text = _text_codec(config.data)
    prompt, eos = encode(args.prompt), None
    if args.chat:
        prompt, eos = _chat_prompt(run_dir, config, args.prompt)
    if objective == "seq2seq":                  # the prompt is the source, then EOS
        eos = seq2seq_specials(config.model.vocab_size).eos
        prompt, _, tokens = check_translation(config, [prompt + [eos]], None,
                                              min(args.tokens, config.model.max_length - 1))
    else:
        check_sampling(config, [prompt], args.tokens, args.temperature, args.top_k, args.seed)
        tokens = args.tokens
    if args.beams is not None:                  # the hypotheses there are, the memory
        check_beams(args.beams, args.length_penalty, config, num_tokens=tokens,
                    prompt=1 if objective == "seq2seq" else len(prompt))
    _, params, _ = run_dir.params(args.checkpoint)    # after the checks: nothing loaded yet
    loaded = time.perf_counter()
    lines = _generated(args, config, params, objective == "seq2seq", prompt, tokens, eos,
                       text)
    done = time.perf_counter()
    print("\n".join(lines))
    if args.timings:
        print(f"timings: run checked and loaded in {loaded - started:.3f} s, its tokens "
              f"{done - loaded:.3f} s after that", file=sys.stderr)
    return 0


def _generated(args, config, params, seq2seq: bool, prompt, tokens: int, eos,
               text) -> list[str]:
    """The lines ``generate`` prints: the hypotheses with their scores (``--beams``), the
    translation (seq2seq: ``prompt`` is its checked source), the reply (``--chat``) or the
    prompt with its continuation."""
    from attnjax.beam import beam_generate, beam_translate
    from attnjax.generate import sample
    from attnjax.translate import translate
    if args.beams is not None:
        found = (beam_translate(config, params, prompt, None, tokens, beams=args.beams,
                                alpha=args.length_penalty) if seq2seq else
                 beam_generate(config, params, [prompt], tokens, beams=args.beams,
                               alpha=args.length_penalty, eos=eos))
        return [f"{score:9.4f}  " + (text(ids[:length]) if seq2seq or args.chat
                                     else text(prompt + list(ids)))
                for ids, score, length in zip(found.tokens[0], found.scores[0],
                                              found.lengths[0])]
    if seq2seq:
        return [text(translate(config, params, prompt, None, tokens)[0])]
    tokens = [int(t) for t in sample(config, params, prompt, tokens,
                                     temperature=args.temperature, top_k=args.top_k,
                                     seed=args.seed)]
    if args.chat:                               # the reply alone, up to the end of its turn
        return [text(tokens[:tokens.index(eos)] if eos in tokens else tokens)]
    return [text(prompt + tokens)]


def _chat_prompt(run_dir, config, prompt: str) -> tuple[list[int], int | None]:
    """``(ids, eos)``: ``prompt`` as the user's message under the run's chat template
    (``attnjax.data.chat``), with the assistant's turn opened, tokenized as the template's text
    (its special tokens written out, none added), and the id of the token that ends a turn
    (None if the run names none); a run without a template is refused in one line."""
    from attnjax.data.chat import CHAT_FILE, read_chat, render_chat
    from attnjax.data.tokenizer import load_tokenizer
    chat = read_chat(run_dir.path)
    if chat is None or config.data.tokenizer is None:
        raise ValueError(f"--chat: {run_dir.path} keeps no chat template ({CHAT_FILE}: an "
                         "imported model's own, from its GGUF metadata or Hugging Face "
                         "tokenizer_config.json; import it again to keep it)")
    tokenizer = load_tokenizer(config.data.tokenizer)
    text = render_chat(chat, [{"role": "user", "content": prompt}])
    eos = tokenizer.token_id(chat["eos_token"]) if chat.get("eos_token") else None
    return [int(t) for t in tokenizer.encode(text, special=False)], eos


def add_generate(commands) -> None:
    generate = add_command(commands, "generate", "sample text from a text run with the KV "
                           "cache", "Continue a prompt with a text run (data.task=text: bytes, "
                           "or the ids of its data.tokenizer, as an imported model's), decoding "
                           "token by token with the KV cache, or translate it with a seq2seq "
                           "run (data.task=letters: greedy, the encoder once and a static "
                           "cross-attention cache). Prompt plus tokens must fit in "
                           "model.max_length. With --beams, the K best hypotheses with their "
                           "length-penalised scores, best first.")
    generate.add_argument("workdir", metavar="RUN_DIR", help="run directory of a text run")
    generate.add_argument("--prompt", required=True, metavar="TEXT",
                          help="text to continue (or, seq2seq, the source), e.g. \"def main(\"")
    generate.add_argument("--tokens", type=int, default=100, metavar="N",
                          help="number of tokens (bytes, or the tokenizer's) to generate after "
                          "the prompt (default: %(default)s)")
    generate.add_argument("--temperature", type=float, default=0.8, metavar="T",
                          help="sampling temperature; 0 is greedy (default: %(default)s)")
    generate.add_argument("--top-k", type=int, default=None, metavar="K",
                          help="sample only among the K most likely tokens (default: all)")
    generate.add_argument("--seed", type=int, default=0,
                          help="random seed of the sampler (default: %(default)s)")
    generate.add_argument("--chat", action="store_true",
                          help="send --prompt as the user's message under the run's chat "
                          "template (an imported instruction-tuned model's, e.g. SmolLM2-"
                          "Instruct's) and print the reply alone, up to the end of its turn")
    generate.add_argument("--beams", type=int, default=None, metavar="K",
                          help="beam search of width K instead of sampling (default: sample)")
    generate.add_argument("--length-penalty", type=float, default=0.6, metavar="A",
                          help="beam search: scores are log P / ((5 + L) / 6)^A, GNMT's length "
                          "penalty (default: %(default)s)")
    generate.add_argument("--timings", action="store_true",
                          help="print to stderr the seconds until the run is loaded and from "
                          "there to its tokens (a second call loads its program and its "
                          "compilation from the caches: attnjax bench warm)")
    add_checkpoint(generate)
    generate.set_defaults(run=_generate)
