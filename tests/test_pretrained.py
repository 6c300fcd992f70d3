"""Pretrained checkpoints (``attnjax.pretrained``): tiny random Hugging Face models of each
supported architecture (``tests/data/hf``, made by ``scripts/make_hf_fixtures.py`` with
``transformers``) load into attnjax models whose logits and every layer's attention weights
equal the ``transformers`` outputs stored beside them, at 1e-5 in float32; a decoder decodes
with its KV cache as its full forward computes; what the mapping cannot express is refused in
one line; each tokenizer gives the references' ids and their text back. With ``transformers``
installed, the references are recomputed live too."""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from attnjax.config import Config, from_dict, to_dict
from attnjax.generate import decode_step, empty_cache
from attnjax.models import build
from attnjax.data.tokenizer import TextTokenizer, check_vocabulary
from attnjax.pretrained import load_pretrained
from helpers import REPO, raises_one_line

FIXTURES = REPO / "tests" / "data" / "hf"
MODELS = ["bert", "bert_mlm", "gpt2", "llama", "llama3", "mistral", "qwen2"]  # bert: no head
DECODERS = ["gpt2", "llama", "llama3", "mistral", "qwen2"]
# the sentences scripts/make_hf_fixtures.py tokenized into each reference's input_ids (cut to
# the shorter one's length)
SENTENCES = ("The dog sat on the mat by the door.", "Attention heads rotate the queries.")


def forward(name):
    config, params = load_pretrained(FIXTURES / name)
    reference = np.load(FIXTURES / name / "reference.npz")
    logits, aux = build(config).apply({"params": params}, reference["input_ids"],
                                      return_weights=True)
    return config, params, reference, np.asarray(logits), np.stack(aux["attn_weights"])


@pytest.mark.parametrize("name", MODELS)
def test_logits_and_every_layers_attention_equal_the_transformers_outputs(name):
    config, _, reference, logits, weights = forward(name)
    output = "last_hidden_state" if name == "bert" else "logits"   # a BertModel has no head
    np.testing.assert_allclose(logits, reference[output], rtol=0, atol=1e-5)
    np.testing.assert_allclose(weights, reference["attentions"], rtol=0, atol=1e-5)
    hf = json.loads((FIXTURES / name / "config.json").read_text())
    assert config.num_layers == weights.shape[0] == hf["num_hidden_layers" if "n_layer" not in
                                                       hf else "n_layer"]


def test_llama3_bands_are_what_makes_its_logits_right():
    """Without Llama 3.1's bands (the plain rotation at the same base) the fixture's logits are
    off by far more than the tolerance: the exactness test sees the schedule."""
    config, params = load_pretrained(FIXTURES / "llama3")
    reference = np.load(FIXTURES / "llama3" / "reference.npz")
    plain = dataclasses.replace(config, position=dataclasses.replace(
        config.position, rope_scaling="default", rope_scale=1.0, train_length=None))
    logits, _ = build(plain).apply({"params": params}, reference["input_ids"])
    assert np.abs(np.asarray(logits) - reference["logits"]).max() > 1e-2


def test_what_each_architecture_maps_to():
    gpt2, llama, qwen2, bert = (load_pretrained(FIXTURES / n)[0]
                                for n in ("gpt2", "llama", "qwen2", "bert_mlm"))
    assert (gpt2.position.kind, gpt2.norm, gpt2.mlp, gpt2.tie_embeddings) == (
        "learned", "layer", "gelu", True)
    assert (llama.position.kind, llama.position.rope_base, llama.norm, llama.mlp,
            llama.mlp_hidden, llama.tie_embeddings) == ("rope", 500000.0, "rms", "swiglu", 88,
                                                        False)
    assert (llama.attention.num_heads, llama.attention.kv_heads, llama.attention.use_bias) == (
        4, 2, False)
    assert qwen2.attention.use_bias                       # q, k, v biases (o: zero)
    llama3 = load_pretrained(FIXTURES / "llama3")[0].position
    assert (llama3.rope_scaling, llama3.rope_base, llama3.rope_scale, llama3.train_length,
            llama3.rope_low_freq_factor, llama3.rope_high_freq_factor) == (
        "llama3", 100.0, 8.0, 64, 1.0, 4.0)
    assert (bert.family, bert.norm_position, bert.embed_norm, bert.mlp, bert.norm_eps,
            bert.classifier) == ("encoder", "post", True, "gelu_exact", 1e-12, "none")
    assert load_pretrained(FIXTURES / "bert")[0].classifier == "hidden"     # a BertModel


@pytest.mark.parametrize("name", DECODERS)
def test_an_imported_decoder_decodes_with_its_cache_as_its_full_forward(name):
    model, params, reference, logits, _ = forward(name)
    config = from_dict(Config, {"model": to_dict(model), "data": {
        "task": "uniform", "vocab_size": model.vocab_size, "length": 16}})
    step = jax.jit(decode_step(config))
    tokens = reference["input_ids"]
    cache, first = step(params, empty_cache(config, len(tokens)), tokens[:, :5])
    pieces = [first]
    for t in range(5, tokens.shape[1]):
        cache, out = step(params, cache, tokens[:, t:t + 1])
        pieces.append(out)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), logits, rtol=1e-5, atol=1e-5)


def copy_fixture(tmp_path, name):
    target = tmp_path / name
    shutil.copytree(FIXTURES / name, target)
    return target


def edit_config(directory, **changes):
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("name, changes, message", [
    ("llama", {"model_type": "falcon"}, "model_type='falcon' is not supported; supported: gpt2"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu' is not supported for model_type "
                                      "'llama'; supported: 'silu'"),
    ("llama", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 5e5, "factor": 8.0}},
     "rope scaling type 'longrope' is not supported for model_type 'llama'; supported: "
     "'default', 'llama3'"),
    ("mistral", {"sliding_window": 4096}, "sliding_window=4096 is not supported"),
    ("gpt2", {"activation_function": "relu"}, "activation_function='relu' is not supported"),
    ("bert_mlm", {"position_embedding_type": "relative_key"},
     "position_embedding_type='relative_key' is not supported"),
])
def test_unsupported_settings_are_one_line_refusals(tmp_path, name, changes, message):
    directory = copy_fixture(tmp_path, name)
    edit_config(directory, **changes)
    raises_one_line(lambda: load_pretrained(directory), message)


def test_pickles_missing_files_and_unread_tensors_are_refused(tmp_path):
    directory = copy_fixture(tmp_path, "llama")
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    raises_one_line(lambda: load_pretrained(directory),
                    "has only pickled weights (pytorch_model.bin), which attnjax never loads")
    raises_one_line(lambda: load_pretrained(tmp_path / "nowhere"), "is not a directory")
    headless = copy_fixture(tmp_path / "headless", "bert")
    edit_config(headless, architectures=["BertForMaskedLM"])
    raises_one_line(lambda: load_pretrained(headless), "architectures names one of "
                    "BertForMaskedLM, BertForPreTraining but the checkpoint has no "
                    "masked-language head (cls.predictions.*)")
    sharded = copy_fixture(tmp_path, "gpt2")
    (sharded / "model-00003-of-00005.safetensors").unlink()
    raises_one_line(lambda: load_pretrained(sharded),
                    "lists model-00003-of-00005.safetensors, which is missing")
    extra = copy_fixture(tmp_path / "extra", "qwen2")
    edit_config(extra, num_hidden_layers=1)              # layer 1's tensors are left unread
    raises_one_line(lambda: load_pretrained(extra),
                    "tensor(s) this mapping does not read, e.g. 'model.layers.1.")


def test_the_references_recomputed_live_with_transformers():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    for name in MODELS:
        hf = json.loads((FIXTURES / name / "config.json").read_text())
        model_class = getattr(transformers, hf["architectures"][0])
        model = model_class.from_pretrained(FIXTURES / name, dtype=torch.float32,
                                            attn_implementation="eager").eval()
        _, _, reference, logits, weights = forward(name)
        with torch.no_grad():
            out = model(torch.as_tensor(reference["input_ids"]), output_attentions=True)
        np.testing.assert_allclose(logits, out.logits.numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(weights, np.stack([a.numpy() for a in out.attentions]),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_the_tokenizer_gives_the_references_ids_and_their_text_back(name):
    tokenizer = TextTokenizer(FIXTURES / name / "tokenizer.json")
    ids = np.load(FIXTURES / name / "reference.npz")["input_ids"]
    for sentence, row in zip(SENTENCES, ids, strict=True):
        np.testing.assert_array_equal(tokenizer.encode(sentence)[:len(row)], row)
    text = tokenizer.decode(tokenizer.encode(SENTENCES[0]))
    assert text == (SENTENCES[0].lower() if name == "bert" else SENTENCES[0])
    labels = tokenizer.labels(tokenizer.encode(SENTENCES[0]))
    if name == "bert":                                    # [CLS] the do ##g ... [SEP]
        assert labels[:4] == ["[CLS]", "the", "do", "##g"] and labels[-1] == "[SEP]"
    else:                                                 # byte-level pieces as text
        assert "".join(labels) == SENTENCES[0]


def test_padding_saved_in_the_tokenizer_file_is_turned_off(tmp_path):
    padded = Tokenizer.from_file(str(FIXTURES / "gpt2" / "tokenizer.json"))
    padded.enable_padding(length=40, pad_id=0)
    padded.enable_truncation(max_length=5)
    padded.save(str(tmp_path / "tokenizer.json"))
    ids = TextTokenizer(tmp_path / "tokenizer.json").encode(SENTENCES[0])
    want = np.load(FIXTURES / "gpt2" / "reference.npz")["input_ids"][0]
    np.testing.assert_array_equal(ids, want)              # all 19 ids, no pads


def test_a_tokenizer_with_ids_the_model_cannot_embed_is_refused(tmp_path):
    config, _ = load_pretrained(FIXTURES / "qwen2")
    tokenizer = TextTokenizer(FIXTURES / "bert" / "tokenizer.json")    # 160 ids: fits in 300
    check_vocabulary(tokenizer, config.vocab_size)
    raises_one_line(lambda: check_vocabulary(tokenizer, 100),
                    "tokenizer.json has 160 ids but the model's vocabulary (model.vocab_size) "
                    "is 100")
    raises_one_line(lambda: TextTokenizer(tmp_path / "none.json"), "no tokenizer file")


def rewrite_weights(directory, change):
    """Save ``directory``'s single safetensors file again with ``change(tensors)`` applied."""
    path = directory / "model.safetensors"
    tensors = {k: np.asarray(v, np.float32) if v.dtype.kind == "f" else v
               for k, v in load_file(path).items()}
    save_file(change(tensors), path)


def test_older_checkpoints_names_and_buffers_load_to_the_same_model(tmp_path):
    """gamma / beta norms, BERT's integer position-id buffer and next-sentence head, Llama's
    saved RoPE frequencies: read or skipped, the logits unchanged."""
    bert = copy_fixture(tmp_path, "bert_mlm")
    rewrite_weights(bert, lambda t: {
        **{k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                    "LayerNorm.beta"): v
           for k, v in t.items()},
        "bert.embeddings.position_ids": np.arange(64, dtype=np.int64)[None],
        "cls.seq_relationship.weight": np.zeros((2, 32), np.float32)})
    llama = copy_fixture(tmp_path, "llama")
    rewrite_weights(llama, lambda t: {
        **t, "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)})
    for name, directory in (("bert_mlm", bert), ("llama", llama)):
        config, params = load_pretrained(directory)
        reference = np.load(FIXTURES / name / "reference.npz")
        logits, _ = build(config).apply({"params": params}, reference["input_ids"])
        np.testing.assert_allclose(np.asarray(logits), reference["logits"], rtol=0, atol=1e-5)
    broken = copy_fixture(tmp_path / "int", "qwen2")
    rewrite_weights(broken, lambda t: {**t, "model.norm.weight": np.ones(32, np.int32)})
    raises_one_line(lambda: load_pretrained(broken),
                    "tensor 'model.norm.weight' is int32; supported: float32, float16, bfloat16")
