"""``attnjax import`` (``attnjax.pretrained.run``): a Hugging Face fixture (``tests/data/hf``)
becomes a run directory whose checkpoint holds the checkpoint's parameters bit for bit, whose
data is text under the model's own tokenizer, and which the commands read: a probe of text is
the references' ids and the attention they computed, heatmaps are labelled with the
tokenizer's strings, ``generate`` continues text as a full forward pass would, masked-language
batches use the tokenizer's special tokens, and ``train.init_from`` fine-tunes from it. What
cannot be imported is refused before anything is written."""

from __future__ import annotations

import json
import math
import re
import shutil

import jax
import numpy as np
import pytest
from tokenizers import Tokenizer

from attnjax.analysis.capture import attention_weights, probe_examples
from attnjax.analysis.heads import knockout_losses, write_head_report
from attnjax.analysis.heatmaps import token_labels, write_attention_report
from attnjax.analysis.occlusion import embedding_occlusion
from attnjax.config import apply_overrides
from attnjax.data import Dataset
from attnjax.data.chat import read_chat, render_chat
from attnjax.data.encoder import mlm_specials
from attnjax.data.text import TextCorpus
from attnjax.data.tokenizer import TextTokenizer
from attnjax.generate import sample
from attnjax.models import build
from attnjax.pretrained import load_pretrained
from attnjax.pretrained.run import import_run, sha256
from attnjax.rundir import RunDir
from attnjax.train.state import start_state
from helpers import REPO, raises_one_line, run_cli

FIXTURES = REPO / "tests" / "data" / "hf"
NAMES = ("gpt2", "llama", "bert_mlm", "bert")          # bert: a BertModel, no head
SENTENCE = "The dog sat on the mat by the door."     # the references' first input


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Each fixture imported once (with a small corpus and evaluation): name -> its run
    directory."""
    root = tmp_path_factory.mktemp("imported")
    (root / "corpus.txt").write_text(" ".join([SENTENCE] * 300))     # a small corpus to read
    for name in NAMES:
        import_run(FIXTURES / name, root / name, [f"data.path={root / 'corpus.txt'}",
                                                  "train.eval_batches=2",
                                                  "train.eval_batch_size=4"])
    return {name: RunDir(root / name) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_the_run_holds_the_checkpoint_exactly_and_records_where_it_came_from(imported, name):
    run = imported[name]
    model, params = load_pretrained(FIXTURES / name)
    config, stored, step = run.params()
    assert config.model == model and step == 0
    jax.tree_util.tree_map(np.testing.assert_array_equal, stored, params)
    assert config.data.task == {"bert_mlm": "mlm", "bert": "sentences"}.get(name, "text")
    assert config.data.tokenizer == str(run.path / "tokenizer.json")
    assert (run.path / "tokenizer.json").read_bytes() == (
        FIXTURES / name / "tokenizer.json").read_bytes()
    record = run.imported()
    assert record["source"] == str(FIXTURES / name) and record["model_type"] in (
        "gpt2", "llama", "bert")
    assert record["files"]["config.json"] == sha256(FIXTURES / name / "config.json")
    read = ("config.json", "tokenizer.json", "model.safetensors.index.json")  # and the weights
    assert sorted(record["files"]) == sorted(
        p.name for p in (FIXTURES / name).iterdir() if p.suffix == ".safetensors"
        or p.name in read)


@pytest.mark.parametrize("name", NAMES)
def test_a_text_probe_is_the_tokenizers_ids_and_gives_the_references_attention(imported, name):
    config, params, _ = imported[name].params()
    reference = np.load(FIXTURES / name / "reference.npz")
    probe = probe_examples(config, text=SENTENCE)
    np.testing.assert_array_equal(probe["inputs"][0], reference["input_ids"][0])
    weights = attention_weights(config, params, probe["inputs"])
    np.testing.assert_allclose(weights[:, 0], reference["attentions"][:, 0], rtol=0, atol=1e-5)
    labels = token_labels(probe["inputs"][0], config.data)
    assert labels == TextTokenizer(FIXTURES / name / "tokenizer.json").labels(probe["inputs"][0])
    if name.startswith("bert"):
        assert labels[0] == "[CLS]" and labels[-1] == "[SEP]" and labels[1] == "the"


def test_text_data_is_the_corpus_through_the_tokenizer_without_special_tokens(imported,
                                                                           tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(SENTENCE * 20)
    config = imported["llama"].config()
    data = TextCorpus(str(corpus), tokenizer=config.data.tokenizer)
    tokenizer = TextTokenizer(FIXTURES / "llama" / "tokenizer.json")
    np.testing.assert_array_equal(data.tokens, tokenizer.encode(SENTENCE * 20, special=False))
    assert data.vocab_size == tokenizer.vocab_size == 300


def test_masked_language_batches_use_the_tokenizers_special_tokens(imported, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join([SENTENCE] * 200))
    config = imported["bert_mlm"].config()
    data = config.data.__class__(**{**config.data.__dict__, "path": str(corpus), "length": 24,
                                    "mlm_rate": 0.5})
    specials = mlm_specials(data)
    assert tuple(specials) == (0, 2, 3, 4)           # [PAD] [CLS] [SEP] [MASK] of the file
    batch = jax.device_get(Dataset(data).batch(0, 0, 64, 24, "train"))
    inputs, targets, chosen = batch["inputs"], batch["targets"], batch["weights"] > 0
    assert (inputs[:, 0] == specials.cls).all() and (inputs[:, -1] == specials.sep).all()
    special_ids = [0, 1, 2, 3, 4]                    # [UNK] too: never chosen, never drawn
    assert not np.isin(targets[chosen], special_ids).any() and chosen.mean() > 0.3
    assert (inputs[chosen] == specials.mask).mean() > 0.6
    replaced = chosen & (inputs != specials.mask) & (inputs != targets)
    assert replaced.any() and not np.isin(inputs[replaced], special_ids).any()
    np.testing.assert_array_equal(inputs[~chosen], targets[~chosen])


def test_generate_continues_the_text_as_greedy_full_forward_passes_do(imported, capsys):
    """Each generated token is the argmax of a full forward pass over the prompt and the
    tokens before it: one causal pass over the whole text gives every such pass's last
    logits at once."""
    config, params, _ = imported["gpt2"].params()
    tokenizer = TextTokenizer(FIXTURES / "gpt2" / "tokenizer.json")
    prompt = list(tokenizer.encode("The dog"))
    ids = prompt + sample(config, params, prompt, 6, temperature=0.0)
    logits, _ = build(config.model).apply({"params": params}, np.asarray([ids]))
    np.testing.assert_array_equal(ids[len(prompt):],
                                  np.argmax(logits[0, len(prompt) - 1:-1], axis=-1))
    code, out, err = run_cli(capsys, "generate", str(imported["gpt2"].path), "--prompt",
                             "The dog", "--tokens", "6", "--temperature", "0")
    assert code == 0, err
    assert out.rstrip("\n") == tokenizer.decode(ids)


def test_fine_tuning_starts_from_the_imported_parameters(imported, tmp_path, capsys):
    source = imported["gpt2"]
    config = source.config()
    tuned = config.__class__(model=config.model, data=config.data, train=config.train.__class__(
        **{**config.train.__dict__, "init_from": str(source.path)}))
    jax.tree_util.tree_map(np.testing.assert_array_equal, start_state(tuned).params,
                           source.params()[1])
    code, _, err = run_cli(capsys, "train", str(source.path / "config.json"), "--workdir",
                           str(source.path), "train.steps=2")
    assert code == 2 and "holds an imported model; fine-tune it into a new run directory " \
        f"with train.init_from='{source.path}'" in err
    code, _, err = run_cli(capsys, "train", str(source.path / "config.json"), "--workdir",
                           str(tmp_path / "tuned"), f"train.init_from={imported['llama'].path}",
                           "train.steps=2")
    assert code == 2 and "its parameter 'block_0/attention/key/kernel' has shape (32, 2, 8), " \
        "this model's (32, 4, 8): the models differ" in err
    assert not (tmp_path / "tuned").exists()         # refused before anything was written


def test_what_cannot_be_imported_is_refused_before_anything_is_written(imported, tmp_path):
    raises_one_line(lambda: import_run(FIXTURES / "gpt2", imported["gpt2"].path),
                    "exists; an import writes a new run directory")
    headless = tmp_path / "headless"                 # a BertModel said to have an MLM head
    shutil.copytree(FIXTURES / "bert", headless)
    hf = json.loads((headless / "config.json").read_text())
    (headless / "config.json").write_text(json.dumps({**hf, "architectures": ["BertForMaskedLM"]}))
    raises_one_line(lambda: import_run(headless, tmp_path / "bare"), "no masked-language head")
    raises_one_line(lambda: import_run(FIXTURES / "gpt2", tmp_path / "bad", ["data.nope=1"]),
                    "nope")
    big = tmp_path / "big"                           # a tokenizer with more ids than rows
    big.mkdir()
    for path in (FIXTURES / "bert_mlm").iterdir():
        (big / path.name).write_bytes(path.read_bytes())
    tokenizer = Tokenizer.from_file(str(big / "tokenizer.json"))
    tokenizer.add_tokens([f"extra{i}" for i in range(5)])
    tokenizer.save(str(big / "tokenizer.json"))
    raises_one_line(lambda: import_run(big, tmp_path / "big_run"),
                    "tokenizer.json has 165 ids but the model's vocabulary (model.vocab_size) "
                    "is 160")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "headless"]


def test_a_directorys_chat_template_is_kept_and_a_run_without_one_refuses_chat(imported,
                                                                            tmp_path, capsys):
    """A Hugging Face directory's ``tokenizer_config.json`` chat template and special tokens
    (as transformers writes them, a token as ``{"content": ...}``) travel into the run, its
    file's digest recorded; a template that raises is one line, and so is ``generate --chat``
    on a run that keeps none, before anything is loaded."""
    source = tmp_path / "chat"
    shutil.copytree(FIXTURES / "llama", source)
    template = ("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}"
                "{% endif %}{% for m in messages %}{{ bos_token + m['content'] + eos_token }}"
                "{% endfor %}")
    (source / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": template, "bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    import_run(source, tmp_path / "run")
    chat = read_chat(tmp_path / "run")
    assert chat == {"chat_template": template, "bos_token": "<s>", "eos_token": "</s>"}
    assert "tokenizer_config.json" in RunDir(tmp_path / "run").imported()["files"]
    assert render_chat(chat, [{"role": "user", "content": "hi"}]) == "<s>hi</s>"
    raises_one_line(lambda: render_chat(chat, [{"role": "system", "content": "x"}]),
                    "the run's chat template fails: user first")
    code, out, err = run_cli(capsys, "generate", str(imported["gpt2"].path), "--chat",
                             "--prompt", "hi")
    assert code == 2 and err.count("\n") == 1 and "keeps no chat template" in err, err


def test_a_bert_model_without_a_head_is_analysed_and_fine_tuned_with_a_new_one(imported,
                                                                              capsys):
    source = imported["bert"]
    batch = jax.device_get(Dataset(source.config().data).batch(0, 0, 2, 12, "val"))
    np.testing.assert_array_equal(batch["targets"], batch["inputs"])
    assert (batch["inputs"][:, 0] == 2).all() and not batch["weights"].any()   # [CLS], unscored
    code, _, err = run_cli(capsys, "eval", str(source.path))
    assert code == 2 and "model.classifier='hidden' outputs hidden states" in err
    base = source.config()
    tuned = apply_overrides(base, ["model.classifier=cls", "data.task=first_repeat",
                                   "data.vocab_size=160", "data.path=None", "data.tokenizer=None",
                                   f"train.init_from={source.path}"])
    params = start_state(tuned).params
    assert "initialised anew: classifier/out/bias, classifier/out/kernel" in \
        capsys.readouterr().err
    imported_params = source.params()[1]
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           {k: v for k, v in params.items() if k != "classifier"},
                           imported_params)


def sentence_embedding(model, params, tokens, **kwargs) -> np.ndarray:
    """The mean of the last hidden states over the tokens, in float64 (the test's own)."""
    hidden, _ = model.apply({"params": params}, np.asarray(tokens), **kwargs)
    return np.asarray(hidden, np.float64).mean(1)


def drift(a, b) -> np.ndarray:
    return 1.0 - (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_occluding_a_token_of_a_bert_model_measures_its_sentence_embeddings_drift(imported):
    config, params, _ = imported["bert"].params()
    model = build(config.model)
    tokens = probe_examples(config, text=SENTENCE)["inputs"]
    mask = TextTokenizer(FIXTURES / "bert" / "tokenizer.json").token_id("[MASK]")
    found = embedding_occlusion(config, params, tokens, mask)
    base = sentence_embedding(model, params, tokens)
    for j in range(tokens.shape[1]):
        occluded = tokens.copy()
        occluded[0, j] = mask
        np.testing.assert_allclose(found[0, j],
                                   drift(sentence_embedding(model, params, occluded), base)[0],
                                   rtol=0, atol=1e-6)
    raises_one_line(lambda: embedding_occlusion(imported["gpt2"].config(), params, tokens, 0),
                    "embedding occlusion needs a model that outputs hidden states")


def test_heads_of_a_bert_model_are_judged_by_its_sentence_embeddings_drift(imported, tmp_path):
    config, params, _ = imported["bert"].params()
    model = build(config.model)
    batches = [jax.device_get(Dataset(config.data).batch(0, 0, 4, 16, "val"))]
    delta = knockout_losses(config, params, batches)
    base = sentence_embedding(model, params, batches[0]["inputs"])
    for layer, head in ((0, 1), (1, 3)):
        gates = np.ones(delta.shape)
        gates[layer, head] = 0.0
        knocked = sentence_embedding(model, params, batches[0]["inputs"], head_gates=gates)
        np.testing.assert_allclose(delta[layer, head], drift(knocked, base).mean(), rtol=0,
                                   atol=1e-6)
    report = write_head_report(imported["bert"].path, tmp_path / "heads")
    assert re.search(r"Baseline validation loss -?0\.0000, accuracy 1\.0000", report)
    assert "| L1.H3 |" in report and "| — |" in report and "Knockout order removed" in report
    assert not (tmp_path / "heads" / "importance.png").exists()


def test_attention_with_occlusion_on_a_bert_model_sets_its_cls_row_beside_the_drift(imported,
                                                                                    tmp_path):
    report = write_attention_report(imported["bert"].path, tmp_path / "bert", text=SENTENCE,
                                    occlusion=True)
    assert "sentence embedding's drift when the token is masked" in report
    rows = (tmp_path / "bert" / "occlusion.csv").read_text().splitlines()
    assert rows[0] == "position,token,cls_attention,embedding_drift"
    assert [r.split(",")[1] for r in rows[1:4]] == ["the", "do", "##g"]    # no [CLS] or [SEP]
    assert (tmp_path / "bert" / "occlusion.png").is_file()
    raises_one_line(lambda: write_attention_report(imported["bert_mlm"].path, tmp_path / "mlm",
                                                   text=SENTENCE, occlusion=True),
                    "--occlusion needs a next-token model or one that outputs hidden states",
                    "this run trains 'mlm'")


def test_eval_scores_text_under_the_tokenizer_with_its_perplexity(imported, capsys):
    code, out, err = run_cli(capsys, "eval", str(imported["gpt2"].path), "--lengths", "16")
    assert code == 0, err
    header, row = out.splitlines()[-2:]
    assert header.split() == ["length", "val", "loss", "accuracy", "perplexity"]
    length, loss, _, perplexity = row.split()
    assert length == "16" and abs(float(perplexity) - math.exp(float(loss))) < 1e-3 * float(
        perplexity)
    code, out, err = run_cli(capsys, "eval", str(imported["bert_mlm"].path), "--lengths", "16")
    assert code == 0 and out.splitlines()[-2].split() == ["length", "val", "loss", "accuracy"]


def test_an_imported_run_copied_elsewhere_reads_its_own_tokenizer(imported, tmp_path, capsys):
    """The run keeps its tokenizer relative to itself: a copy is read where it is, with the
    original out of reach."""
    original = imported["gpt2"].path
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(original, copy)
    assert json.loads((copy / "config.json").read_text())["data"]["tokenizer"] == (
        "tokenizer.json")
    away = original.with_name("gpt2-away")
    original.rename(away)
    try:
        assert RunDir(copy).config().data.tokenizer == str(copy / "tokenizer.json")
        code, out, err = run_cli(capsys, "generate", str(copy), "--prompt", SENTENCE[:12],
                                 "--tokens", "3", "--temperature", "0")
        assert code == 0 and out.startswith(SENTENCE[:12]), err
        code, out, err = run_cli(capsys, "eval", str(copy))
        assert code == 0 and "perplexity" in out, err
    finally:
        away.rename(original)
