"""``attnjax import``: a local Hugging Face model directory as an attnjax run directory;
``attnjax export``: a run directory as a Hugging Face model directory."""

from __future__ import annotations

from attnjax.cli.arguments import OVERRIDES, add_checkpoint, add_command


def _import(args) -> int:
    from attnjax.pretrained.run import import_run
    config = import_run(args.directory, args.workdir, args.overrides)
    model = config.model
    text = (f"on {config.data.tokenizer}" if config.data.tokenizer
            else "on bytes (the directory has no tokenizer.json)")
    print(f"imported {args.directory} into {args.workdir}: model.family={model.family}, "
          f"{model.num_layers} layers of {model.attention.num_heads} heads "
          f"({model.attention.num_kv_heads or model.attention.num_heads} key/value), d_model "
          f"{model.d_model}, "
          f"vocabulary {model.vocab_size}; data.task={config.data.task} {text}")
    return 0


def add_import(commands) -> None:
    command = add_command(
        commands, "import", "import a local Hugging Face checkpoint or GGUF file as a run "
        "directory",
        "Read a local Hugging Face model directory (config.json, model.safetensors, sharded or "
        "not, and tokenizer.json when present: a download or a Hugging Face cache snapshot), "
        "or a GGUF file (llama.cpp's: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the "
        "K-quants dequantized to float32; its byte-level BPE tokenizer rebuilt from the "
        "metadata), and write an attnjax run directory that every command reads: config.json, "
        "a checkpoint of the parameters, the tokenizer and imported.json (the source and its "
        "files' SHA-256). Architectures: BERT (with or without the masked-language head), "
        "GPT-2, Llama, Mistral, Qwen2 (GGUF: Llama, Qwen2); anything else, and pickle-only "
        "checkpoints, are refused in one line. Nothing is downloaded.")
    command.add_argument("directory", metavar="HF_DIR|FILE.gguf",
                         help="the model directory, e.g. ~/.cache/huggingface/hub/models--gpt2/"
                         "snapshots/<revision>, or a .gguf file")
    command.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                         help=OVERRIDES + " (data and train fields: the model is the "
                         "checkpoint's)")
    command.add_argument("--workdir", required=True, metavar="DIR",
                         help="the run directory to write (must not exist)")
    command.set_defaults(run=_import)


def _export(args) -> int:
    from attnjax.pretrained.export import export_run
    done = export_run(args.run_dir, args.out, args.checkpoint)
    files = ", ".join(["config.json", f"model.safetensors ({done.tensors} tensors, "
                                      f"{done.nbytes / 1e6:.1f} MB float32)",
                       *["tokenizer.json"] * done.tokenizer,
                       *["tokenizer_config.json (its chat template)"] * done.chat])
    print(f"exported {args.run_dir} ({args.checkpoint} checkpoint, step {done.step}) as "
          f"{done.kind} ({done.class_name}): {done.reason}")
    print(f"wrote {args.out}: {files}")
    return 0


def add_export(commands) -> None:
    command = add_command(
        commands, "export", "export a run directory as a Hugging Face model directory",
        "Write a Hugging Face model directory (config.json, model.safetensors in float32, and "
        "tokenizer.json when the run has one) from a run's checkpoint: the import's mapping "
        "read backwards, so importing the directory again computes the run's logits bit for "
        "bit. An imported run is written as the architecture it came from (GPT-2, Llama, "
        "Mistral, Qwen2, BERT); a run trained here as the first of GPT-2 and Llama (a "
        "decoder) or BERT (an encoder) whose config expresses it, said on stdout. A model no "
        "such architecture expresses (ALiBi, a LayerNorm Llama, a pre-norm BERT, ...) is "
        "refused in one line naming the config field, before anything is written; the "
        "directory appears whole or not at all.")
    command.add_argument("run_dir", metavar="RUN", help="the run directory")
    command.add_argument("--out", required=True, metavar="DIR",
                         help="the directory to write (absent or empty)")
    add_checkpoint(command)
    command.set_defaults(run=_export)
