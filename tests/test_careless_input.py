"""Careless input to the commands that read text or size a probe:
text that is not UTF-8, a probe text longer than the model takes, clean and corrupted texts
of different lengths, and beams, probe lengths and batches that cannot exist or cannot fit
in memory are each one line on stderr and exit status 2, before anything compiles or any
output is written; a cut text is said on stderr."""

from __future__ import annotations

import numpy as np
import pytest

from attnjax.analysis.capture import probe_examples, text_tokens
from attnjax.beam import check_beams
from attnjax.data.encoder import encoder_specials
from attnjax.pretrained.run import import_run
from attnjax.rundir import RunDir
from attnjax.translate import check_translation
from helpers import REPO, TINY_MLM, TINY_SEQ2SEQ, raises_one_line, run_cli, tiny_config
from test_limits import compile_events, refusal

FIXTURES = REPO / "tests" / "data" / "hf"
LONG = "The dog sat on the mat by the door. " * 8        # past the imports' 64 tokens
NOT_UTF8 = "ab\udcff"        # argv b"ab\xff" as Python receives it (surrogateescape)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """gpt2 (learned positions, 64 of them) and llama (RoPE) imported from the Hugging Face
    fixtures, each with its tokenizer: no training."""
    root = tmp_path_factory.mktemp("careless")
    for name in ("gpt2", "llama"):
        import_run(FIXTURES / name, root / name)
    return {name: root / name for name in ("gpt2", "llama")}


def refused(capsys, *argv) -> str:
    """``attnjax ARGV`` exits 2 with one line on stderr and nothing on stdout, compiling
    nothing; that line."""
    events, stop = compile_events()
    try:
        code, out, err = run_cli(capsys, *argv)
    finally:
        stop()
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("attnjax: error: ") and err.count("\n") == 1, err
    assert not events, events
    return err


# ------------------------------------------------------------------ text in, said out

@pytest.mark.parametrize("argv, flag", [
    (["generate", "{run}", "--prompt", NOT_UTF8, "--tokens", "2"], "--prompt"),
    (["attention", "{run}", "--text", NOT_UTF8, "--out", "{out}"], "--text"),
    (["lens", "{run}", "--text", NOT_UTF8, "--out", "{out}"], "--text"),
    (["patch", "{run}", "--clean", NOT_UTF8, "--corrupt", "abc", "--metric",
      "logit_diff:a,b", "--out", "{out}"], "--clean"),
    (["patch", "{run}", "--clean", "abc", "--corrupt", NOT_UTF8, "--metric",
      "logit_diff:a,b", "--out", "{out}"], "--corrupt"),
    (["patch", "{run}", "--clean", "abc", "--corrupt", "abd", "--metric",
      f"logit_diff:a,{NOT_UTF8[-1]}", "--out", "{out}"], "--metric"),
], ids=["generate", "attention", "lens", "patch-clean", "patch-corrupt", "patch-metric"])
def test_text_that_is_not_utf8_is_refused_naming_its_flag(runs, tmp_path, capsys, argv, flag):
    """A run with a tokenizer died with ``TypeError: TextInputSequence must be str``."""
    out = tmp_path / "out"
    err = refused(capsys, *(a.format(run=runs["gpt2"], out=out) for a in argv))
    assert f"error: {flag} must be UTF-8 text;" in err and "0xff" in err, err
    assert not out.exists()


def test_a_probe_text_longer_than_the_model_takes_is_cut_and_said_so(runs, capsys):
    config = RunDir(runs["gpt2"]).config()
    count = text_tokens(config, LONG).size
    assert count > config.data.length == 64
    assert probe_examples(config, text=LONG)["inputs"].shape == (1, 64)
    assert capsys.readouterr().err == (f"attnjax: --text is {count} tokens; cut to the first "
                                       "64 (data.length)\n")
    assert probe_examples(config, text=LONG, length=40)["inputs"].shape == (1, 40)
    assert "cut to the first 40 (the probe length)" in capsys.readouterr().err
    probe_examples(config, text="The dog sat.")                  # short: nothing said
    assert capsys.readouterr().err == ""
    mlm = tiny_config(TINY_MLM)                 # framed [CLS] ... [SEP]: the [SEP] is kept
    tokens = probe_examples(mlm, text="x" * 20)["inputs"][0]
    specials = encoder_specials(mlm.data)
    assert tokens.size == 12 and (tokens[0], tokens[-1]) == (specials.cls, specials.sep)
    assert "--text is 22 tokens; cut to the first 12" in capsys.readouterr().err


def test_patch_compares_the_token_counts_before_cutting(runs, tmp_path, capsys):
    """Both texts were cut to data.length first, so texts of different lengths passed."""
    config = RunDir(runs["gpt2"]).config()
    longer = LONG + "And then it left."
    counts = [text_tokens(config, text).size for text in (LONG, longer)]
    assert 64 < counts[0] < counts[1]
    err = refused(capsys, "patch", str(runs["gpt2"]), "--clean", LONG, "--corrupt", longer,
                  "--metric", "logit_diff:a,b", "--out", str(tmp_path / "out"))
    assert (f"--clean and --corrupt must have as many tokens, got {counts[0]} and "
            f"{counts[1]}") in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ sizes before compiling

def test_more_beams_than_hypotheses_are_refused(runs, capsys):
    """300 tokens have 300 continuations of one token, 90000 of two."""
    err = refused(capsys, "generate", str(runs["gpt2"]), "--prompt", "The dog", "--tokens",
                  "1", "--beams", "301")
    assert ("beams (--beams) must be at most 300 = 300**1, the sequences there are of 1 "
            "token(s) (--tokens) over model.vocab_size=300, got 301") in err
    config = RunDir(runs["gpt2"]).config()
    check_beams(300, 0.6, config, num_tokens=1)
    check_beams(90_000, 0.6, config, num_tokens=2)
    raises_one_line(lambda: check_beams(90_001, 0.6, config, num_tokens=2), "--beams",
                    "300**2")


def test_a_beam_search_too_big_for_memory_is_refused(runs, capsys):
    """--beams 1000000 allocated 41 GB and died with a traceback."""
    err = refused(capsys, "generate", str(runs["gpt2"]), "--prompt", "The dog", "--tokens",
                  "10", "--beams", "1000000000")
    needed, _ = refusal(err)
    assert "--beams 1000000000: a beam search of 1000000000 rows" in err
    # the KV cache alone: 2 layers x 64 slots x 4 heads x (8 + 8) key and value features
    assert needed >= 10**9 * 2 * 64 * 4 * 16 * 4


def test_seq2seq_tokens_zero_is_refused_not_read_as_the_default():
    """``min(--tokens, ...)`` of 0 was falsy, so the default max_length - 1 tokens ran."""
    config = tiny_config(TINY_SEQ2SEQ)
    raises_one_line(lambda: check_translation(config, np.ones((1, 3), np.int32), None, 0),
                    "num_tokens=0 (--tokens) must be in [1, 15]")


@pytest.mark.parametrize("run, options, shown", [
    ("gpt2", ["--length", "65"], "error: --length must be at most 64 (model.max_length: "
                                 "model.position.kind='learned' has no positions past it), "
                                 "got 65"),
    ("gpt2", ["--length", "1"], "error: --length must be in [2, 1073741824], got 1"),
    ("gpt2", ["--length", "2000000000"], "error: --length must be in [2, 1073741824]"),
    ("gpt2", ["--batch", "0"], "error: --batch must be in [1, 2147483647], got 0"),
    ("llama", ["--length", "100000"], "error: --length 100000: attention on 4 x 100000 "
                                      "tokens needs at least"),
    ("gpt2", ["--batch", "1000000000"], "error: --batch 1000000000: attention on "
                                        "1000000000 x 64 tokens needs at least"),
], ids=["past-learned-positions", "length-1", "length-past-LENGTH", "batch-0",
        "length-memory", "batch-memory"])
def test_attention_lengths_and_batches_are_checked_before_compiling(runs, tmp_path, capsys,
                                                                    run, options, shown):
    """--length 100000 and --batch 1000000 aborted in C++ (exit status 134)."""
    err = refused(capsys, "attention", str(runs[run]), *options, "--out", str(tmp_path / "o"))
    assert shown in err, err
    if "needs at least" in shown:
        needed, _ = refusal(err)
        rows, T = (4, 100_000) if run == "llama" else (10**9, 64)
        assert needed >= 2 * rows * 4 * T * T * 4     # 2 layers x 4 heads of float32 weights
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, shown", [
    (["patch", "{run}", "--examples", "0"], "--examples must be in [1, 2147483647], got 0"),
    (["heads", "{run}", "--steps", "0"], "--steps must be in [1, 8], got 0"),
    (["heads", "{run}", "--steps", "9"], "--steps must be in [1, 8], got 9"),
    (["recall", "{run}", "--batches", "0"], "--batches must be in [1, 2147483647], got 0"),
    (["recall", "{run}", "--batches", "2000000000"], "--batches 2000000000: scoring "
                                                     "2000000000 batches needs at least"),
], ids=["patch-examples-0", "heads-steps-0", "heads-steps-9", "recall-batches-0",
        "recall-batches-memory"])
def test_the_other_commands_counts_are_checked_before_compiling(runs, tmp_path, capsys, argv,
                                                                shown):
    """gpt2 has 2 layers x 4 heads: a pruning curve of 9 steps removes more than there are."""
    err = refused(capsys, *(a.format(run=runs["gpt2"]) for a in argv),
                  "--out", str(tmp_path / "o"))
    assert f"error: {shown}" in err, err
    assert not (tmp_path / "o").exists()
