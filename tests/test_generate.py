"""Generation as one compiled program (``attnjax.generate``), against two independent
references: the full forward's argmax fed back token by token (no cache), and the jitted
one-token cached step called once per token from Python."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.generate import decode_step, empty_cache, generate, sample
from attnjax.models.decoder import DecoderLM
from attnjax.train.state import init_params
from helpers import TINY_TEXT, tiny_config

CONFIG = tiny_config(TINY_TEXT, **{"model.max_length": 32})
PROMPTS = np.array([[5, 17, 200, 3], [9, 9, 9, 9], [250, 1, 64, 128]])
TOKENS = 8


@pytest.fixture(scope="module")
def params():
    return init_params(CONFIG)


def stepwise(params, prompts, num_tokens):
    """Greedy with the cache, one jitted step per token, each token fed back from the host."""
    step = jax.jit(decode_step(CONFIG))
    cache, logits = step(params, empty_cache(CONFIG, len(prompts)), jnp.asarray(prompts))
    out = [np.asarray(jnp.argmax(logits[:, -1], -1))]
    for _ in range(num_tokens - 1):
        cache, logits = step(params, cache, jnp.asarray(out[-1][:, None]))
        out.append(np.asarray(jnp.argmax(logits[:, -1], -1)))
    return np.stack(out, 1)


def uncached(params, prompts, num_tokens):
    """Greedy without a cache: one full causal forward per token over a fixed buffer (the
    not yet generated tail cannot change the logits before it), one compiled program."""
    model, length = DecoderLM(CONFIG.model), prompts.shape[1]
    forward = jax.jit(lambda params, seq: model.apply({"params": params}, seq)[0])
    seq = np.zeros((len(prompts), length + num_tokens), np.int32)
    seq[:, :length] = prompts
    for t in range(length, length + num_tokens):
        seq[:, t] = np.asarray(jnp.argmax(forward(params, seq)[:, t - 1], -1))
    return seq[:, length:]


def test_greedy_generation_equals_the_stepwise_loop_and_the_uncached_argmax(params):
    got = generate(CONFIG, params, PROMPTS, TOKENS, temperature=0.0)
    assert got.shape == (3, TOKENS) and got.dtype.kind == "i"
    np.testing.assert_array_equal(got, stepwise(params, PROMPTS, TOKENS))
    np.testing.assert_array_equal(got, uncached(params, PROMPTS, TOKENS))


def test_each_row_is_generated_as_if_alone(params):
    together = generate(CONFIG, params, PROMPTS, TOKENS, temperature=0.0)
    for row, prompt in zip(together, PROMPTS):
        np.testing.assert_array_equal(row, generate(CONFIG, params, [prompt], TOKENS,
                                                    temperature=0.0)[0])
    assert sample(CONFIG, params, PROMPTS[0].tolist(), TOKENS,
                  temperature=0.0) == together[0].tolist()


def test_sampling_is_a_function_of_the_seed_and_keeps_to_the_top_k(params):
    draw = lambda seed, **kw: generate(CONFIG, params, PROMPTS, TOKENS, temperature=1.0,
                                       seed=seed, **kw)
    np.testing.assert_array_equal(draw(3), draw(3))
    assert not np.array_equal(draw(3), draw(4))
    # top_k=1 leaves only the argmax: sampling at any temperature is greedy
    np.testing.assert_array_equal(draw(3, top_k=1), generate(CONFIG, params, PROMPTS, TOKENS,
                                                             temperature=0.0))


@pytest.mark.parametrize("prompts, tokens, message", [
    ([[]], 4, "length >= 1"),
    ([1, 2], 4, r"\[batch, length\]"),
    ([[1, 2]], 0, "must be >= 1, got 0"),
    ([[1, 2]], 31, "prompt \\+ tokens = 33 exceeds the cache"),
])
def test_bad_requests_are_refused_before_compiling(params, prompts, tokens, message):
    with pytest.raises(ValueError, match=message):
        generate(CONFIG, params, prompts, tokens)
