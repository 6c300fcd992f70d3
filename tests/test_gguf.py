"""GGUF import (``attnjax.pretrained.gguf``): the tiny Llama fixture written by
``scripts/make_gguf_fixtures.py`` as llama.cpp's converter writes it (its names, its permuted
query and key rows, the tokenizer in the metadata) imports to the Hugging Face checkpoint it
came from: bit for bit in F32 and F16 (the fixture's weights are float16), within each
quantisation's rounding in Q8_0 and Q4_1; its tokenizer, rebuilt from the metadata, gives the
original tokenizer.json's ids; a damaged file is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from tokenizers import Tokenizer

from attnjax.data.chat import read_chat, render_chat
from attnjax.data.tokenizer import TextTokenizer
from attnjax.generate import sample
from attnjax.pretrained import load_pretrained
from attnjax.pretrained.gguf import GGUFModel
from attnjax.pretrained.run import import_run
from attnjax.rundir import RunDir
from helpers import REPO, run_cli

GGUF = REPO / "tests" / "data" / "gguf"
HF = REPO / "tests" / "data" / "hf" / "llama"
# the largest rounding error of a weight w in a block of the quantisation, as a share of the
# tensor's range: Q8_0 rounds w / (max|w| / 127), Q4_1 (w - min) / ((max - min) / 15)
ROUNDING = {"q8_0": lambda w: np.abs(w).max() / 127 / 2,
            "q4_1": lambda w: (w.max() - w.min()) / 15 / 2}
TEXTS = ["The dog sat on the mat.", "  two  spaces", "tabs\tand\nnewlines\n\n", "digits 12345",
         "3.14159 and 2,718", "ünïcödé façade", "日本語のテキスト", "emoji 🙂👍", "<s>", "a<s>b",
         "MiXeD CaSe", "don't won't it's", "trailing space ", " leading space", "", "x",
         "punctuation!?;:", "a\r\nb", "line1\nline2", "repeat repeat repeat"]


@pytest.fixture(scope="module")
def reference():
    """The Hugging Face fixture's model config and parameters, by path."""
    config, params = load_pretrained(HF)
    return config, flatten_dict(params, sep="/")


@pytest.mark.parametrize("kind", ["f32", "f16", "q8_0", "q4_1"])
def test_a_gguf_file_imports_to_the_checkpoint_it_was_converted_from(reference, kind):
    config, params = load_pretrained(GGUF / f"llama-{kind}.gguf")
    assert config == reference[0]
    got = flatten_dict(params, sep="/")
    assert got.keys() == reference[1].keys()
    rounded = []
    for name, expected in reference[1].items():
        expected, found = np.asarray(expected), np.asarray(got[name])
        if kind in ROUNDING:      # within a block's rounding (its scale is stored in f16)
            assert np.abs(found - expected).max() <= ROUNDING[kind](expected) * 1.001, name
            rounded += [name] if not np.array_equal(found, expected) else []
        else:
            np.testing.assert_array_equal(found, expected, err_msg=name)
    if kind in ROUNDING:          # the matrices were quantised, the norms kept in F32
        assert "embed/embedding" in rounded and not any("norm" in n for n in rounded)


def test_the_tokenizer_rebuilt_from_the_metadata_gives_the_originals_ids():
    rebuilt = Tokenizer.from_str(GGUFModel(GGUF / "llama-q4_1.gguf").tokenizer_json())
    original = Tokenizer.from_file(str(HF / "tokenizer.json"))
    for text in TEXTS:
        assert rebuilt.encode(text).ids == original.encode(text).ids, text
        assert rebuilt.decode(rebuilt.encode(text).ids) == original.decode(
            original.encode(text).ids), text


def test_attnjax_import_of_a_gguf_file_writes_a_run_with_its_tokenizer(tmp_path, capsys):
    source = GGUF / "llama-q8_0.gguf"
    code, out, err = run_cli(capsys, "import", str(source), "--workdir", str(tmp_path / "run"))
    assert code == 0, err
    run = RunDir(tmp_path / "run")
    record = run.imported()
    assert record["model_type"] == "llama" and list(record["files"]) == [source.name]
    assert json.loads((run.path / "config.json").read_text())["data"]["tokenizer"] == (
        "tokenizer.json")
    tokenizer = TextTokenizer(run.path / "tokenizer.json")
    assert tokenizer.encode(TEXTS[0]).tolist() == Tokenizer.from_file(
        str(HF / "tokenizer.json")).encode(TEXTS[0]).ids
    code, out, err = run_cli(capsys, "generate", str(run.path), "--prompt", "The dog",
                             "--tokens", "3", "--temperature", "0")
    assert code == 0 and out.startswith("The dog"), err


def test_the_chat_template_is_kept_and_generate_chat_replies_under_it(tmp_path, capsys):
    """The file's ``tokenizer.chat_template`` (and its EOS token) travels into the run;
    ``generate --chat`` sends the prompt as the user's turn of it and prints the reply
    alone, greedy or with beams ending at EOS."""
    source = GGUFModel(GGUF / "llama-q8_0.gguf")
    import_run(source.path, tmp_path / "run")
    run, chat = RunDir(tmp_path / "run"), read_chat(tmp_path / "run")
    assert chat["chat_template"] == source.field("tokenizer.chat_template")
    assert chat["eos_token"] == source.field("tokenizer.ggml.tokens")[
        source.field("tokenizer.ggml.eos_token_id")]
    text = render_chat(chat, [{"role": "user", "content": "The dog"}])
    assert text == "<|im_start|>user\nThe dog<|im_end|>\n<|im_start|>assistant\n"
    config, params, _ = run.params()
    tokenizer = TextTokenizer(run.path / "tokenizer.json")
    reply = sample(config, params, tokenizer.encode(text, special=False).tolist(), 3,
                   temperature=0.0)
    code, out, err = run_cli(capsys, "generate", str(run.path), "--chat", "--prompt",
                             "The dog", "--tokens", "3", "--temperature", "0")
    assert code == 0 and out.rstrip("\n") == tokenizer.decode(reply), err
    code, out, err = run_cli(capsys, "generate", str(run.path), "--chat", "--prompt",
                             "The dog", "--tokens", "3", "--beams", "2")
    assert code == 0 and len(out.splitlines()) == 2, err


def test_a_gguf_import_exports_with_its_chat_template_and_reads_back_bit_for_bit(tmp_path,
                                                                                   capsys):
    """``attnjax export`` of a GGUF run: a Llama directory with the tokenizer and the chat
    template (tokenizer_config.json, as transformers keeps it); imported again, the same
    parameters bit for bit, the same tokenizer and the same template."""
    import_run(GGUF / "llama-q4_1.gguf", tmp_path / "run")
    code, out, err = run_cli(capsys, "export", str(tmp_path / "run"), "--out",
                             str(tmp_path / "hf"))
    assert code == 0 and out.splitlines()[-1].endswith(
        "tokenizer.json, tokenizer_config.json (its chat template)"), err
    import_run(tmp_path / "hf", tmp_path / "again")
    run, again = RunDir(tmp_path / "run"), RunDir(tmp_path / "again")
    assert read_chat(again.path) == read_chat(run.path) is not None
    assert (again.path / "tokenizer.json").read_bytes() == (
        run.path / "tokenizer.json").read_bytes()
    (config, params, _), (read_config, read, _) = run.params(), again.params()
    assert read_config.model == config.model
    for name, value in flatten_dict(params, sep="/").items():
        np.testing.assert_array_equal(flatten_dict(read, sep="/")[name], value, err_msg=name)


@pytest.mark.parametrize("damage, fragment", [
    (lambda raw: raw[: len(raw) // 2], "llama-q8_0.gguf"),
    (lambda raw: b"GGUF" + bytes(64), "llama-q8_0.gguf"),
    (lambda raw: raw.replace(b"llama", b"llamb", 1), "general.architecture='llamb' is not "
                                                      "supported; supported: llama, qwen2"),
])
def test_a_damaged_gguf_file_is_one_line(tmp_path, capsys, damage, fragment):
    path = tmp_path / "llama-q8_0.gguf"
    path.write_bytes(damage((GGUF / "llama-q8_0.gguf").read_bytes()))
    code, out, err = run_cli(capsys, "import", str(path), "--workdir", str(tmp_path / "run"))
    assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "run").exists()
