"""Beam search (``attnjax.beam``): exhaustive search on a hand-made Markov chain, width 1 is
greedy decoding, every hypothesis' score is the teacher-forced score of its tokens for both
decoding families, beams of a source share its cross-attention cache, and a deliberately
broken cache (slots not moved with their beams) shows the contamination the reordering
prevents."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.beam import (beam_generate, beam_search, beam_translate, length_penalty,
                          reorder_cache)
from attnjax.data import Dataset
from attnjax.data.seq2seq import seq2seq_specials
from attnjax.generate import generate
from attnjax.models import build
from attnjax.train.state import init_params
from attnjax.translate import compiled_encode, compiled_start, translate
from attnjax.train import train
from helpers import TINY_INDUCTION, TINY_SEQ2SEQ, raises_one_line, run_cli, tiny_config

# ------------------------------------------------------------------------------ Markov chain

# Tokens 0, 1, 2 and EOS = 3 (PAD = 4 marks unused positions); the chain starts in state 0.
EOS, PAD = 3, 4
TRANSITIONS = np.array([[0.05, 0.50, 0.40, 0.05],
                        [0.30, 0.05, 0.30, 0.35],
                        [0.02, 0.04, 0.04, 0.90],
                        [0.25, 0.25, 0.25, 0.25]])      # (after EOS: never used)


def markov_search(beams, num_tokens, alpha, start_state=0, sources=2):
    """``beam_search`` over the chain: the cache is unused and each row's last token is its
    state."""
    rows = sources * beams
    log_t = jnp.log(jnp.asarray(TRANSITIONS, jnp.float32))
    step = lambda cache, tokens: (cache, log_t[tokens[:, 0]][:, None, :])
    logits = jnp.broadcast_to(log_t[start_state], (rows, 4))
    return jax.jit(lambda c, l: beam_search(step, c, l, beams=beams, num_tokens=num_tokens,
                                            eos=EOS, pad=PAD, alpha=alpha))(
        {"rows": jnp.zeros(rows)}, logits)


def exhaustive(num_tokens, alpha, start_state=0):
    """Every sequence ending in EOS within ``num_tokens`` (EOS only at its end) or of
    ``num_tokens`` tokens without EOS, with ``log P / lp(L)``, best first."""
    scored = []
    for L in range(1, num_tokens + 1):
        for body in itertools.product(range(3), repeat=L - 1):
            for last in (EOS, *range(3)) if L == num_tokens else (EOS,):
                y, state, logp = (*body, last), start_state, 0.0
                for token in y:
                    logp += np.log(TRANSITIONS[state, token])
                    state = token
                scored.append((logp / length_penalty(L, alpha), y))
    return sorted(scored, key=lambda s: -s[0])


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
def test_a_beam_wide_enough_returns_the_exhaustive_search(alpha):
    """27 beams never drop a prefix of 4 tokens the best 27 can grow from: the hypotheses and
    scores are exhaustive search's best 27."""
    found = markov_search(27, 4, alpha)
    ranked = exhaustive(4, alpha)
    score_of = {y: score for score, y in ranked}
    cut = ranked[26][0]                      # the 27th score: ties with it may go either way
    for source in range(2):
        np.testing.assert_allclose(found.scores[source], [s for s, _ in ranked[:27]],
                                   rtol=1e-5)
        hypotheses = set()
        for k in range(27):
            L = found.lengths[source, k]
            y = tuple(found.tokens[source, k, :L].tolist())
            assert (found.tokens[source, k, L:] == PAD).all()
            assert found.finished[source, k] == (y[-1] == EOS)
            np.testing.assert_allclose(found.scores[source, k], score_of[y], rtol=1e-5)
            hypotheses.add(y)
        assert {y for score, y in ranked if score > cut + 1e-9} <= hypotheses


def test_two_beams_find_what_greedy_misses():
    """Greedy takes 1 (p 0.5), and its best end is then EOS (0.5 x 0.35 = 0.175); two beams
    also keep 2 (p 0.4), whose EOS (0.4 x 0.9 = 0.36) is the exhaustive optimum."""
    found = markov_search(2, 4, 0.0)
    (best_score, best), (second_score, _) = exhaustive(4, 0.0)[:2]
    assert best == (2, EOS)
    np.testing.assert_allclose(found.scores[0], [best_score, second_score], rtol=1e-5)
    np.testing.assert_array_equal(found.tokens[0, 0, :2], best)
    greedy = markov_search(1, 4, 0.0)
    np.testing.assert_array_equal(greedy.tokens[0, 0, :2], [1, EOS])
    np.testing.assert_allclose(greedy.scores[0, 0], np.log(0.5 * 0.35), rtol=1e-5)


def test_none_finished_returns_the_live_beams():
    never_ends = np.log(np.array([0.5, 0.5, 0.0, 0.0]) + 1e-30)
    step = lambda cache, tokens: (cache, jnp.broadcast_to(never_ends, (tokens.shape[0], 1, 4)))
    found = beam_search(step, {"rows": jnp.zeros(2)}, jnp.broadcast_to(never_ends, (2, 4)),
                        beams=2, num_tokens=3, eos=EOS, pad=PAD, alpha=0.6)
    assert not found.finished.any() and (found.lengths == 3).all()
    np.testing.assert_allclose(found.scores, 3 * np.log(0.5) / length_penalty(3, 0.6),
                               rtol=1e-5)


def test_bad_widths_and_penalties_are_one_line_refusals():
    config = tiny_config(TINY_SEQ2SEQ)
    source = np.zeros((1, 4), np.int32)
    raises_one_line(lambda: beam_translate(config, None, source, beams=0), "--beams")
    raises_one_line(lambda: beam_translate(config, None, source, beams=2, alpha=-1.0),
                    "--length-penalty")


# --------------------------------------------------------------------------------- models

SPECIALS = seq2seq_specials(12)


def seq2seq_setup(**overrides):
    config = tiny_config(TINY_SEQ2SEQ, **{"model.num_layers": 2, **overrides})
    batch = Dataset(config.data).batch(0, 0, 3, 12, "val")
    return config, init_params(config), batch


def teacher_forced(config, params, batch, tokens, lengths):
    """``log P`` of each hypothesis ``tokens`` ``[B, K, N]`` (the first ``lengths`` tokens)
    given its source, from one full forward pass (compiled)."""
    B, K, N = tokens.shape
    inputs = np.concatenate([np.full((B, K, 1), SPECIALS.bos), tokens[..., :-1]], -1)
    logits = jax.jit(build(config.model).apply)(
        {"params": params}, inputs.reshape(B * K, N),
        source=np.repeat(batch["source"], K, 0),
        source_mask=np.repeat(batch["source_mask"], K, 0))[0]
    logp = np.asarray(jax.nn.log_softmax(logits), np.float64).reshape(B, K, N, -1)
    picked = np.take_along_axis(logp, tokens[..., None], -1)[..., 0]
    return (picked * (np.arange(N) < lengths[..., None])).sum(-1)


@pytest.mark.parametrize("alpha", [0.0, 0.8])
def test_seq2seq_hypotheses_score_as_teacher_forcing_scores_their_tokens(alpha):
    config, params, batch = seq2seq_setup()
    found = beam_translate(config, params, batch["source"], batch["source_mask"], 8, beams=3,
                           alpha=alpha)
    assert (np.diff(found.scores, axis=1) <= 1e-6).all()                 # best first
    want = teacher_forced(config, params, batch, found.tokens, found.lengths)
    np.testing.assert_allclose(found.scores, want / length_penalty(found.lengths, alpha),
                               rtol=1e-5, atol=1e-5)


def test_width_one_is_greedy_decoding_for_both_families():
    config, params, batch = seq2seq_setup()
    one = beam_translate(config, params, batch["source"], batch["source_mask"], 8, beams=1,
                         alpha=0.0)
    np.testing.assert_array_equal(one.tokens[:, 0],
                                  translate(config, params, batch["source"],
                                            batch["source_mask"], 8))
    decoder = tiny_config(TINY_INDUCTION)
    decoder_params = init_params(decoder)
    prompts = np.arange(10).reshape(2, 5) % 12
    greedy = generate(decoder, decoder_params, prompts, 6, temperature=0.0)
    found = beam_generate(decoder, decoder_params, prompts, 6, beams=1, alpha=0.0)
    np.testing.assert_array_equal(found.tokens[:, 0], greedy)


def test_decoder_beams_score_their_continuations():
    config = tiny_config(TINY_INDUCTION)
    params = init_params(config)
    prompts = np.arange(10).reshape(2, 5) % 12
    found = beam_generate(config, params, prompts, 6, beams=4, alpha=0.6)
    full = np.concatenate([np.repeat(prompts[:, None], 4, 1), found.tokens], -1).reshape(8, 11)
    logits = jax.jit(build(config.model).apply)({"params": params}, full)[0]
    logp = np.asarray(jax.nn.log_softmax(logits), np.float64)
    picked = np.take_along_axis(logp[:, 4:-1], full[:, 5:, None], -1)[..., 0].sum(-1)
    np.testing.assert_allclose(found.scores.reshape(-1), picked / length_penalty(6, 0.6),
                               rtol=1e-5, atol=1e-5)
    assert len({tuple(t) for t in found.tokens[0]}) == 4                  # distinct beams


def test_beams_share_the_cross_cache_and_a_broken_slot_contaminates_them():
    """The cross-attention cache has a row per source while the self-attention cache has a
    slot per beam; beam search whose slots stay put while beams change parents (each beam
    then attends to another beam's tokens) scores its hypotheses wrongly."""
    config, params, batch = seq2seq_setup()
    encoded = compiled_encode(config)(params, batch["source"], batch["source_mask"])
    cache, _ = compiled_start(config, 3 * 4)(params, encoded, batch["source_mask"])
    assert cache["block_0"]["cross_attention"]["cross_key"].shape[0] == 3
    assert cache["block_0"]["attention"]["cached_key"].shape[0] == 12
    for reorder, right in ((reorder_cache, True), (lambda cache, rows: cache, False)):
        found = beam_translate(config, params, batch["source"], batch["source_mask"], 8,
                               beams=4, alpha=0.0, reorder=reorder)
        want = teacher_forced(config, params, batch, found.tokens, found.lengths)
        error = np.abs(found.scores - want).max()
        assert (error < 1e-4) if right else (error > 1e-2), error


def test_the_generate_command_translates_and_searches_beams(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat, and the dog sat on the log.\n" * 50)
    text_base = {k: v for k, v in TINY_SEQ2SEQ.items() if k != "data.vocab_size"}
    config = tiny_config(text_base, **{"data.task": "letters", "data.path": str(corpus),
                                       "model.vocab_size": 259})
    train(config, tmp_path / "run", progress=False)
    code, out, err = run_cli(capsys, "generate", str(tmp_path / "run"), "--prompt", "a cat,",
                             "--tokens", "6", "--beams", "3", "--length-penalty", "0.5")
    assert code == 0, err
    scores = [float(line.split()[0]) for line in out.splitlines()]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    code, out, err = run_cli(capsys, "generate", str(tmp_path / "run"), "--prompt", "a cat,",
                             "--tokens", "6")
    assert code == 0 and len(out.splitlines()) == 1, err
    code, out, err = run_cli(capsys, "generate", str(tmp_path / "run"), "--prompt", "a",
                             "--beams", "0")
    assert code == 2 and "--beams" in err and len(err.strip().splitlines()) == 1
