"""The real SmolLM2-135M-Instruct (``make smollm``: its GGUF Q4_1 file), imported: the model
its metadata describes, a tokenizer that splits digits one by one as SmolLM's does and gives
text back, and greedy decoding that completes a fact. Skipped, saying how to install it,
when the file is absent."""

from __future__ import annotations

import pytest

from attnjax.data.tokenizer import load_tokenizer
from attnjax.generate import sample
from attnjax.pretrained.run import import_run, sha256
from attnjax.rundir import RunDir
from helpers import REPO

MODEL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = ("The year 2024 had 366 days.", "naïve café – 東京 🙂", "  two spaces\n\nand lines")

pytestmark = pytest.mark.skipif(not MODEL.is_file(), reason=f"SmolLM2-135M-Instruct is not "
                                f"installed ({MODEL} is absent): 'make smollm' installs it")


@pytest.fixture(scope="module")
def smollm(tmp_path_factory):
    run = RunDir(tmp_path_factory.mktemp("smollm") / "run")
    import_run(MODEL, run.path)
    return run


def test_the_import_is_the_model_its_metadata_describes(smollm):
    model = smollm.config().model
    assert (model.num_layers, model.d_model, model.vocab_size, model.mlp_hidden) == (
        30, 576, 49152, 1536)
    assert (model.attention.num_heads, model.attention.kv_heads) == (9, 3)
    assert model.position.rope_base == 100000.0 and model.tie_embeddings
    assert smollm.imported()["files"] == {MODEL.name: sha256(MODEL)}


def test_its_tokenizer_splits_digits_and_gives_text_back(smollm):
    tokenizer = load_tokenizer(smollm.config().data.tokenizer)
    digits = tokenizer.encode("12345", special=False)
    assert tokenizer.labels(digits) == list("12345")
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.token_id("<|im_start|>") is not None


def test_greedy_decoding_completes_a_fact(smollm):
    config, params, _ = smollm.params()
    tokenizer = load_tokenizer(config.data.tokenizer)
    prompt = [int(t) for t in tokenizer.encode("The capital of France is")]
    tokens = sample(config, params, prompt, 3, temperature=0.0)
    assert tokenizer.decode(tokens).startswith(" Paris")
