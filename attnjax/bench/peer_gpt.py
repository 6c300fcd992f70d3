"""A plain JAX/Flax GPT, written the way a careful user would write it without attnjax (it
imports nothing from attnjax): the peer ``attnjax bench train`` measures attnjax's training
loop against (``peer_ratio``, ``attnjax.bench.peer``).

Same shape and training as attnjax's default decoder with learned positions: token embedding
plus a learned position table, pre-norm blocks of ``nn.MultiHeadDotProductAttention`` (causal
mask) and a 4x GELU MLP, a final LayerNorm, logits through the tied embedding; next-byte
cross-entropy; AdamW (b2 0.95, weight decay 0.1 on matrices) after global-norm clipping at
1.0, linear warmup then cosine; ``steps_per_dispatch`` steps scanned in one jitted call that
donates the state, each step's batch sampled on device from the corpus.
"""

from __future__ import annotations

import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax


class Block(nn.Module):
    num_heads: int

    @nn.compact
    def __call__(self, x, mask):
        d = x.shape[-1]
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.num_heads, qkv_features=d,
                                              use_bias=False)(
            nn.LayerNorm()(x), mask=mask)
        h = nn.gelu(nn.Dense(4 * d)(nn.LayerNorm()(x)))
        return x + nn.Dense(d)(h)


class GPT(nn.Module):
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    max_length: int

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab_size, self.d_model,
                         embedding_init=nn.initializers.normal(0.02))
        positions = self.param("positions", nn.initializers.normal(0.02),
                               (self.max_length, self.d_model))
        x = embed(tokens) + positions[: tokens.shape[1]]
        mask = nn.make_causal_mask(tokens)
        for _ in range(self.num_layers):
            x = Block(self.num_heads)(x, mask)
        return embed.attend(nn.LayerNorm()(x))


def make_optimizer(total_steps: int, warmup: int, learning_rate: float):
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, total_steps,
                                                  learning_rate * 0.1)
    decay = lambda params: jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=0.1, mask=decay))


def make_train(model: GPT, tx, corpus: jax.Array, batch_size: int, length: int,
               steps_per_dispatch: int):
    """``train(params, opt_state, key) -> (params, opt_state, key, losses)``: jitted, scanning
    ``steps_per_dispatch`` steps, params and optimizer state donated."""
    def loss_fn(params, window):
        logits = model.apply({"params": params}, window[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, window[:, 1:]).mean()

    def step(carry, _):
        params, opt_state, key = carry
        key, sample = jax.random.split(key)
        starts = jax.random.randint(sample, (batch_size,), 0, corpus.shape[0] - length - 1)
        window = jax.vmap(lambda s: jax.lax.dynamic_slice(corpus, (s,), (length + 1,)))(starts)
        loss, grads = jax.value_and_grad(loss_fn)(params, window.astype(jnp.int32))
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, key), loss

    def train(params, opt_state, key):
        (params, opt_state, key), losses = jax.lax.scan(step, (params, opt_state, key), None,
                                                        length=steps_per_dispatch)
        return params, opt_state, key, losses

    return jax.jit(train, donate_argnums=(0, 1))


def train_loop(corpus: np.ndarray, *, d_model: int, num_layers: int, num_heads: int,
               length: int, batch_size: int, steps_per_dispatch: int = 10,
               total_steps: int = 1000, warmup: int = 100, learning_rate: float = 1e-3,
               vocab_size: int = 256, seed: int = 0):
    """``advance(calls) -> (seconds, last loss)``: the peer's compiled training loop, compiled
    and warmed up by one dispatch (as ``attnjax.bench.throughput.train_loop``), running
    ``calls`` more dispatches of ``steps_per_dispatch`` steps on the state it keeps, the
    learning-rate schedule running over ``total_steps``."""
    model = GPT(vocab_size, d_model, num_layers, num_heads, length)
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, length), jnp.int32))["params"]
    tx = make_optimizer(total_steps, warmup, learning_rate)
    train = make_train(model, tx, jnp.asarray(corpus), batch_size, length, steps_per_dispatch)
    carry = (params, tx.init(params), jax.random.PRNGKey(seed + 1))

    def advance(calls: int) -> tuple[float, float]:
        nonlocal carry
        start = time.perf_counter()
        for _ in range(calls):
            *carry, losses = train(*carry)
        jax.block_until_ready(losses)
        return time.perf_counter() - start, float(losses[-1])

    advance(1)
    return advance


def throughput(corpus: np.ndarray, *, steps: int = 50, steps_per_dispatch: int = 10,
               **shape) -> dict:
    """Tokens/s over ``steps`` steps of ``train_loop`` (``shape``: its other arguments)."""
    advance = train_loop(corpus, steps_per_dispatch=steps_per_dispatch, **shape)
    calls = max(steps // steps_per_dispatch, 1)
    seconds, loss = advance(calls)
    tokens = calls * steps_per_dispatch * shape["batch_size"] * shape["length"]
    return {"tokens_per_s": tokens / seconds, "seconds": seconds,
            "steps": calls * steps_per_dispatch, "loss": loss}
