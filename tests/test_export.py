"""``attnjax export`` (``attnjax.pretrained.export``): a run directory written back as a Hugging
Face model directory through the import's own name table. Each Hugging Face fixture
(``tests/data/hf``), read and exported, gives back its tensors (names, shapes, values), the
config.json keys the import reads and its tokenizer, and reads back as the same model bit for
bit; one per architecture goes through the commands (import, export, import) to bit-identical
logits. So do runs of models configured here (random parameters saved as training saves them:
fused and per-head q, k, v, a knocked-out head, grouped queries, Llama 3.1's RoPE bands, no
segment embeddings, a [CLS] classifier), each written as the architecture that expresses it.
A model none expresses is one line naming the field, before the checkpoint is read, with
nothing written; an export cut short leaves nothing. ``scripts/check_export_transformers.py``
compares the same exports with ``transformers`` where it is installed."""

from __future__ import annotations

import importlib.util
import json
import math

import jax
import numpy as np
import pytest

from attnjax.models import build
from attnjax.pretrained import load_pretrained
from attnjax.pretrained import export as export_module
from attnjax.pretrained.export import choose, export_model, hf_export
from attnjax.pretrained.run import import_run
from attnjax.pretrained.weights import Weights
from attnjax.rundir import RunDir
from helpers import (REPO, TINY_CLASSIFY, TINY_MLM, TINY_SEQ2SEQ, TINY_TEXT, raises_one_line,
                     run_cli, tiny_config)

FIXTURES = REPO / "tests" / "data" / "hf"
NAMES = ("gpt2", "llama", "llama3", "mistral", "qwen2", "bert", "bert_mlm")
LLAMA = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
         "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
         "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "rope_parameters",
         "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window")
# the config.json keys the import reads, by model_type: an export writes each as it was
READ_KEYS = {
    "gpt2": ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions", "n_inner",
             "activation_function", "layer_norm_epsilon", "scale_attn_weights",
             "scale_attn_by_inverse_layer_idx", "tie_word_embeddings"),
    "llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA,
    "bert": ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
             "layer_norm_eps", "position_embedding_type", "tie_word_embeddings")}


def load_script(name: str):
    """The module ``scripts/<name>.py``."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# tiny runs of models configured here that scripts/check_export_transformers.py also compares
# with transformers -> what each is exported as (its bert-mlm-like maps as the bert_mlm
# fixture does, and costs a compilation more)
CHECK = load_script("check_export_transformers")
TRAINED = {"gpt2-like": "gpt2 (GPT2LMHeadModel)", "llama-like": "llama (LlamaForCausalLM)",
           "bert-cls-like": "bert (BertForSequenceClassification)"}
BERT_LIKE = CHECK.BERT


def logits(model, params, tokens) -> np.ndarray:
    return np.asarray(build(model).apply({"params": params}, tokens)[0])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each fixture read by the import and exported as its own architecture: name -> (model,
    parameters, exported directory, ``Exported``)."""
    root = tmp_path_factory.mktemp("exported")
    done = {}
    for name in NAMES:
        model, params = load_pretrained(FIXTURES / name)
        kind = json.loads((FIXTURES / name / "config.json").read_text())["model_type"]
        done[name] = (model, params, root / name, export_model(
            model, params, root / name, choose(model, [kind])[0],
            FIXTURES / name / "tokenizer.json"))
    return done


@pytest.mark.parametrize("name", NAMES)
def test_an_exported_fixture_has_its_tensors_config_and_tokenizer(exported, name):
    _, _, out, done = exported[name]
    hf = json.loads((FIXTURES / name / "config.json").read_text())
    assert (done.kind, done.class_name) == (hf["model_type"], hf["architectures"][0])
    original, written = Weights(FIXTURES / name), Weights(out)
    assert [p.name for p in written.files] == ["model.safetensors"]
    assert sorted(written.headers) == sorted(original.headers)      # no copy of a tied one
    for tensor, header in written.headers.items():
        assert header.dtype == "F32" and header.shape == original.headers[tensor].shape
        np.testing.assert_array_equal(written.load(tensor), original.load(tensor),
                                      err_msg=tensor)
    config = json.loads((out / "config.json").read_text())
    for key in ("model_type", "architectures", *READ_KEYS[hf["model_type"]]):
        if key in hf:
            assert config[key] == hf[key], key
    assert (out / "tokenizer.json").read_bytes() == (
        FIXTURES / name / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("name", NAMES)
def test_an_exported_fixture_reads_back_as_the_same_model_bit_for_bit(exported, name):
    model, params, out, _ = exported[name]
    again, read = load_pretrained(out)
    assert again == model
    jax.tree_util.tree_map(np.testing.assert_array_equal, read, params)


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "bert_mlm"])
def test_an_imported_run_exports_and_imports_again_to_its_logits_bit_for_bit(name, tmp_path,
                                                                            capsys):
    """One fixture per architecture through the commands: ``attnjax import``, ``attnjax
    export``, then the import again (as a run for Qwen2, with its tokenizer): the same model,
    parameters and logits."""
    run, out = tmp_path / "run", tmp_path / "hf"
    import_run(FIXTURES / name, run)
    code, stdout, err = run_cli(capsys, "export", str(run), "--out", str(out))
    assert code == 0, err
    kind, class_name = exported_as(FIXTURES / name)
    headers = Weights(out).headers
    megabytes = sum(math.prod(header.shape) for header in headers.values()) * 4 / 1e6
    assert stdout.splitlines() == [
        f"exported {run} (best checkpoint, step 0) as {kind} ({class_name}): the "
        "architecture it was imported from",
        f"wrote {out}: config.json, model.safetensors ({len(headers)} tensors, "
        f"{megabytes:.1f} MB float32), tokenizer.json"]
    config, params, _ = RunDir(run).params()
    if name == "qwen2":
        again = RunDir(tmp_path / "again")
        import_run(out, again.path)
        assert again.imported()["model_type"] == kind
        assert (again.path / "tokenizer.json").read_bytes() == (
            run / "tokenizer.json").read_bytes()
        model, read, _ = again.params()
        model = model.model
    else:
        model, read = load_pretrained(out)
    assert model == config.model
    tokens = np.load(FIXTURES / name / "reference.npz")["input_ids"]
    np.testing.assert_array_equal(logits(model, read, tokens),
                                  logits(config.model, params, tokens))


def exported_as(directory) -> tuple[str, str]:
    hf = json.loads((directory / "config.json").read_text())
    return hf["model_type"], hf["architectures"][0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The runs of ``TRAINED`` (``CHECK.TINY``: random parameters), in one directory."""
    root = tmp_path_factory.mktemp("trained")
    for seed, name in enumerate(TRAINED):
        CHECK.tiny_run(root / name, CHECK.tiny_config(name), seed)
    return root


@pytest.mark.parametrize("name", TRAINED)
def test_a_run_configured_here_exports_as_the_architecture_that_expresses_it(trained, name,
                                                                             capsys):
    out = trained / f"{name}-hf"
    code, stdout, err = run_cli(capsys, "export", str(trained / name), "--out", str(out))
    assert code == 0, err
    first, second = stdout.splitlines()
    assert first.startswith(f"exported {trained / name} (best checkpoint, step 0) as "
                            f"{TRAINED[name]}: the first architecture that expresses the model")
    assert ("(gpt2 needs model.position.kind='learned')" in first) == (name == "llama-like")
    tensors = len(Weights(out).headers)
    assert second.startswith(f"wrote {out}: config.json, model.safetensors ({tensors} tensors")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert (out / "model.safetensors").stat().st_mode == (out / "config.json").stat().st_mode
    config, params, _ = RunDir(trained / name).params()
    model, exported = load_pretrained(out)
    tokens = CHECK.inputs(CHECK.TINY[name][0])
    np.testing.assert_array_equal(logits(model, exported, tokens),
                                  logits(config.model, params, tokens))


def test_a_fine_tuned_qwen2_whose_output_learned_a_bias_is_written_as_llama():
    """Qwen2 has no bias on the output projection (the import reads it as zero): once it is
    not zero, Llama with ``attention_bias`` holds it, the tensors otherwise the same."""
    model, params = load_pretrained(FIXTURES / "qwen2")
    choice, tensors = hf_export(model, params, ("qwen2", "gpt2", "llama"))
    assert choice.kind == "qwen2" and "model.layers.0.self_attn.o_proj.bias" not in tensors
    params["block_0"]["attention"]["out"]["bias"] = np.full(32, 0.5, np.float32)
    choice, llama = hf_export(model, params, ("qwen2", "gpt2", "llama"))
    assert choice.kind == "llama" and choice.hf["attention_bias"]
    assert sorted(llama) == sorted([*tensors, *(f"model.layers.{i}.self_attn.o_proj.bias"
                                                for i in range(2))])
    np.testing.assert_array_equal(llama["model.layers.0.self_attn.o_proj.bias"], 0.5)
    raises_one_line(lambda: hf_export(model, params, ("qwen2",)),
                    "parameter block_0/attention/out/bias is not zero, but qwen2 has no tensor "
                    "'model.layers.0.self_attn.o_proj.bias' to hold it")


LLAMA_LIKE = {"model.norm": "rms", "model.mlp": "swiglu"}
REFUSED = [
    (TINY_TEXT, {"model.position.kind": "alibi", "model.attention.use_bias": True},
     "model.position.kind='alibi': no Hugging Face architecture attnjax exports expresses it "
     "(gpt2 needs 'learned', llama needs 'rope')"),
    (TINY_TEXT, {}, "model.position.kind='rope': no Hugging Face architecture attnjax exports "
     "expresses it (gpt2 needs 'learned', llama needs model.norm='rms')"),
    (TINY_TEXT, {**LLAMA_LIKE, "model.attention.kernel": "linear"},
     "model.attention.kernel='linear': no Hugging Face architecture attnjax exports expresses "
     "it (gpt2 needs model.position.kind='learned', llama needs 'reference')"),
    (TINY_TEXT, {**LLAMA_LIKE, "model.position.rope_fraction": 0.5},
     "model.position.rope_fraction=0.5: no Hugging Face"),
    (TINY_MLM, {}, "model.position.kind='rope': no Hugging Face architecture attnjax exports "
     "expresses it (bert needs 'learned')"),
    (TINY_CLASSIFY, {**BERT_LIKE, "model.classifier": "mean"},
     "model.classifier='mean': no Hugging Face architecture attnjax exports expresses it (bert "
     "needs 'cls')"),
    (TINY_SEQ2SEQ, {}, "model.family='seq2seq': no Hugging Face architecture attnjax exports "
     "expresses it (decoder: gpt2, llama, mistral, qwen2; encoder: bert)"),
]


@pytest.mark.parametrize("base, overrides, message", REFUSED,
                         ids=[m.split(":")[0] for _, _, m in REFUSED])
def test_a_model_no_architecture_expresses_is_one_line_before_anything_is_read(
        tmp_path, capsys, base, overrides, message):
    run = RunDir(tmp_path / "run")
    run.prepare(tiny_config(base, **overrides))       # a config, no checkpoint to read
    code, out, err = run_cli(capsys, "export", str(run.path), "--out", str(tmp_path / "hf"))
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_an_export_cut_short_leaves_nothing_and_the_next_one_cleans_up(trained, tmp_path,
                                                                       capsys, monkeypatch):
    run, out = trained / "llama-like", tmp_path / "hf"

    def failing(tensors, path, metadata=None):
        with open(path, "wb") as file:
            file.write(b"half")
        raise OSError(28, "No space left on device", path)
    monkeypatch.setattr(export_module, "save_file", failing)
    code, _, err = run_cli(capsys, "export", str(run), "--out", str(out))
    assert code == 2 and "No space left on device" in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    stale = tmp_path / ".exporting-hf-4194304"           # a pid above the kernel's limit
    (stale / "half").mkdir(parents=True)
    (tmp_path / "hf").mkdir()                            # an empty --out is replaced
    code, _, err = run_cli(capsys, "export", str(run), "--out", str(out))
    assert code == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["hf"], err
    for where, fragment in ((out, "exists and is not an empty directory"),
                            (out / "config.json" / "x", "is a file, not a directory")):
        code, _, err = run_cli(capsys, "export", str(run), "--out", str(where))
        assert code == 2 and fragment in err and err.count("\n") == 1, err
    code, _, err = run_cli(capsys, "export", str(tmp_path / "nowhere"), "--out",
                           str(tmp_path / "x"))
    assert code == 2 and "is not a run directory" in err and not (tmp_path / "x").exists()
