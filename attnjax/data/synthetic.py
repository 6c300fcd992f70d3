"""Synthetic sequence tasks as pure functions of a PRNG key (jittable, generated on device).

Every task returns a batch ``{"inputs", "targets", "weights"}`` of shape ``[B, L]``: the model
reads ``inputs`` causally and is scored on predicting ``targets`` where ``weights`` is 1.
Token 0 is filler, the last token of the vocabulary is a separator.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attnjax.data.task import register_synthetic


def _next_token(seq: jax.Array, scored: jax.Array) -> dict:
    """``seq`` ``[B, L+1]`` -> inputs/targets shifted by one; ``scored`` marks targets."""
    return {"inputs": seq[:, :-1].astype(jnp.int32), "targets": seq[:, 1:].astype(jnp.int32),
            "weights": scored.astype(jnp.float32)}


def mqar(key, batch_size: int, length: int, vocab_size: int, num_pairs: int,
         mqar_filler: str = "zero", mqar_query_power: float | None = None,
         mqar_distinct_values: bool = False) -> dict:
    """Multi-query associative recall: ``k1 v1 ... kP vP`` then the P keys again, shuffled, at
    distinct positions of the remaining sequence. At a query position the target is the key's
    value; only those positions are scored. Keys come from ``[1, V/2)``, values from
    ``[V/2, V)``; keys within an example are distinct.

    Three choices, each Zoology's when set as ``experiments/mqar.py`` sets them:

    - ``mqar_filler``: the tokens between the queries, ``zero`` (token 0) or ``random``
      (uniform over ``[1, V)``; Zoology's ``random_non_queries``);
    - ``mqar_query_power``: ``None`` puts the queries at uniformly drawn positions; ``a`` puts
      query ``i`` at ``2P + 2 g_i``, the gaps ``g`` drawn without replacement from
      ``[0, (L - 2P) / 2)`` with ``p(g) ∝ (g + 1)^(a - 1)`` (Zoology: ``a = 0.01``, most
      queries close to the pairs);
    - ``mqar_distinct_values``: values drawn without replacement (Zoology) or with it.

    References: Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient
    Language Models" (MQAR).
    """
    half = vocab_size // 2
    region = length - 2 * num_pairs

    def query_slots(key):
        if mqar_query_power is None:
            return 2 * num_pairs + jax.random.permutation(key, region)[:num_pairs]
        gaps = jnp.arange(1, region // 2 + 1, dtype=jnp.float32) ** (mqar_query_power - 1)
        chosen = jax.random.choice(key, region // 2, (num_pairs,), replace=False,
                                   p=gaps / gaps.sum())
        return 2 * num_pairs + 2 * chosen

    def example(key):
        k_keys, k_vals, k_order, k_pos = jax.random.split(key, 4)
        k_fill = jax.random.fold_in(key, 1)    # apart from those four: zero filler's stream kept
        keys = jax.random.choice(k_keys, jnp.arange(1, half), (num_pairs,), replace=False)
        if mqar_distinct_values:
            values = jax.random.choice(k_vals, jnp.arange(half, vocab_size), (num_pairs,),
                                       replace=False)
        else:
            values = jax.random.randint(k_vals, (num_pairs,), half, vocab_size)
        order = jax.random.permutation(k_order, num_pairs)
        slots = query_slots(k_pos)
        inputs = (jnp.zeros(length, jnp.int32) if mqar_filler == "zero"
                  else jax.random.randint(k_fill, (length,), 1, vocab_size))
        inputs = inputs.at[0:2 * num_pairs:2].set(keys)
        inputs = inputs.at[1:2 * num_pairs:2].set(values).at[slots].set(keys[order])
        targets = jnp.zeros(length, jnp.int32).at[slots].set(values[order])
        weights = jnp.zeros(length, jnp.float32).at[slots].set(1.0)
        return inputs, targets, weights

    inputs, targets, weights = jax.vmap(example)(jax.random.split(key, batch_size))
    return {"inputs": inputs, "targets": targets, "weights": weights}


def copy(key, batch_size: int, length: int, vocab_size: int) -> dict:
    """``x SEP x`` with ``x`` of ``length // 2`` random tokens; scored on the copy."""
    return _copy_like(key, batch_size, length, vocab_size, transform=lambda x: x)


def sort(key, batch_size: int, length: int, vocab_size: int) -> dict:
    """``x SEP sorted(x)``; scored on the sorted half."""
    return _copy_like(key, batch_size, length, vocab_size, transform=lambda x: jnp.sort(x, -1))


def _copy_like(key, batch_size, length, vocab_size, transform) -> dict:
    n = length // 2
    x = jax.random.randint(key, (batch_size, n), 1, vocab_size - 1)
    sep = jnp.full((batch_size, 1), vocab_size - 1)
    pad = jnp.zeros((batch_size, length + 1 - (2 * n + 1)), x.dtype)
    seq = jnp.concatenate([x, sep, transform(x), pad], axis=1)
    scored = (jnp.arange(length) >= n) & (jnp.arange(length) < 2 * n)
    return _next_token(seq, jnp.broadcast_to(scored, (batch_size, length)))


def induction(key, batch_size: int, length: int, vocab_size: int) -> dict:
    """Random tokens with a block ``A`` of ``length // 4`` tokens at the start and again after
    a random gap; scored on predicting ``A[1:]`` in the second copy. The random gap means the
    copy cannot be found by position alone: it needs an induction head (>= 2 layers).

    References: Olsson et al. 2022, "In-context Learning and Induction Heads".
    """
    m = length // 4

    def example(key):
        k_seq, k_gap = jax.random.split(key)
        seq = jax.random.randint(k_seq, (length + 1,), 1, vocab_size)
        start = m + jax.random.randint(k_gap, (), 0, length + 2 - 2 * m)
        seq = jax.lax.dynamic_update_slice(seq, seq[:m], (start,))
        t = jnp.arange(length)
        return seq, (t >= start) & (t < start + m - 1)

    seq, scored = jax.vmap(example)(jax.random.split(key, batch_size))
    return _next_token(seq, scored)


def uniform(key, batch_size: int, length: int, vocab_size: int) -> dict:
    """I.i.d. uniform tokens, every target scored: nothing in the context predicts the next
    token, so the best model is the uniform distribution (loss ln vocab_size) and averaging
    attention loses nothing."""
    seq = jax.random.randint(key, (batch_size, length + 1), 0, vocab_size)
    return _next_token(seq, jnp.ones((batch_size, length), bool))


def _check_mqar(config):
    spread = config.mqar_query_power is not None     # one even slot per query: 4 per pair
    needed = (4 if spread else 3) * config.num_pairs
    for n in config.lengths:
        if n < needed:
            raise ValueError(f"data.length={n} must be >= {needed // config.num_pairs} * "
                             f"num_pairs = {needed} for mqar (pairs, then one "
                             f"{'even slot' if spread else 'position'} per query)")
    values = config.vocab_size - config.vocab_size // 2
    if config.mqar_distinct_values and config.num_pairs > values:
        raise ValueError(f"data.mqar_distinct_values needs num_pairs={config.num_pairs} <= the "
                         f"{values} values of vocab_size={config.vocab_size}")


register_synthetic("mqar", mqar, reads=("num_pairs", "mqar_filler", "mqar_query_power",
                                         "mqar_distinct_values"), check=_check_mqar)
register_synthetic("copy", copy)
register_synthetic("sort", sort)
register_synthetic("induction", induction)
register_synthetic("uniform", uniform)
