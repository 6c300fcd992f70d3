"""The ``flash`` kernel (``attnjax.ops.flash``) beyond the registry-wide kernel tests of
test_attention.py, which check its output and ``dq``, ``dk``, ``dv`` on every scenario there:

- the gradient of every parameter a call differentiates (per-head scale, sink, ALiBi slopes,
  a T5 table) against the reference kernel, on test_context_parallel's three scenarios, in
  tiles of a few tokens and in the default tiles, and against the float64 oracle;
- lengths no tile divides, at the default tiles, against the oracle (causal, bidirectional,
  cross-attention), and examples split into groups;
- which tiles it computes: a causal mask's hidden tiles are skipped, the wholly visible ones
  run unmasked, only the diagonal ones select.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from attnjax.ops import dot_product_attention
from attnjax.ops.flash import FULL, HIDDEN, MIXED, _Plan, _runs, default_blocks, group_size
from attnjax.parity import oracle_attention, oracle_grads
from test_context_parallel import TOLERANCE, _cotangent, _error, _program, _scenarios

SCENARIOS = _scenarios()


@pytest.mark.parametrize("blocks", [dict(block_q=4, block_k=5), {}], ids=["tiles_4x5", "default"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_parameter_gradient_matches_reference(scenario, blocks):
    q, k, v, params, dynamic, call, oracle = SCENARIOS[scenario]
    cot = _cotangent(q, v)
    got = _program(call, None, implementation="flash", **blocks)(q, k, v, params, dynamic, cot)
    want = _program(call, None, implementation="reference")(q, k, v, params, dynamic, cot)
    assert _error(got[0], want[0]) <= TOLERANCE
    for g, w in zip(got[1][:3], want[1][:3]):
        assert _error(g, w) <= TOLERANCE
    assert set(got[1][3]) == set(params)
    for name in params:
        assert _error(got[1][3][name], want[1][3][name]) <= TOLERANCE, name
    if oracle is not None:
        assert _error(got[0], oracle_attention(q, k, v, **oracle)) <= TOLERANCE
        for g, w in zip(got[1][:3], oracle_grads(q, k, v, cot, **oracle)):
            assert _error(g, w) <= TOLERANCE


@pytest.mark.parametrize("case", ["causal", "bidirectional", "cross"])
def test_lengths_no_tile_divides_match_the_oracle(case):
    """300 queries (and 300 or 520 keys) in the default tiles of 128 by 128: the last tile
    of each side is mostly padding; four examples, two heads: two groups of two."""
    rng = np.random.default_rng(1)
    S = 520 if case == "cross" else 300
    q = rng.normal(size=(4, 300, 2, 8)).astype(np.float32)
    k, v = (rng.normal(size=(4, S, 2, 8)).astype(np.float32) for _ in range(2))
    cot = rng.normal(size=q.shape).astype(np.float32)
    causal = case == "causal"
    mask = np.tril(np.ones((300, S), bool)) if causal else None
    out, pull = jax.vjp(lambda q, k, v: dot_product_attention(
        q, k, v, is_causal=causal, implementation="flash"), q, k, v)
    assert _error(out, oracle_attention(q, k, v, mask=mask)) <= TOLERANCE
    for g, w in zip(pull(cot), oracle_grads(q, k, v, cot, mask=mask)):
        assert _error(g, w) <= TOLERANCE


def test_examples_are_grouped_to_keep_a_tile_in_cache():
    assert default_blocks(256) == (128, 128) and default_blocks(1024) == (128, 256)
    assert default_blocks(4096) == (256, 256)
    # a tile of 8 heads of 128 x 128 float32 logits is 512 KiB: two examples per MiB
    assert group_size(16, 8, 128, 128) == 2
    assert group_size(16, 8, 128, 256) == 1
    assert group_size(6, 1, 64, 64) == 6          # small tiles: the whole batch at once
    assert group_size(7, 4, 128, 128) == 1        # a batch of 7 splits only into ones


def _plan(**mask) -> _Plan:
    fields = dict(T=16, S=16, block_q=4, block_k=4, is_causal=False, window=None,
                  causal_block_size=None, dynamic_mask=False, positions_given=False,
                  logit_soft_cap=None, bias_fn=None, dropout_rate=None, dropout_traced=False,
                  dropout_shared=False)
    return _Plan(**{**fields, **mask})


def _kinds(plan: _Plan) -> list[str]:
    return ["".join(plan.kind(q0, k0)[0] for k0 in plan.k_tiles) for q0 in plan.q_tiles]


def test_tiles_follow_the_static_mask():
    """h(idden), f(ull), m(ixed) per query tile (rows) and key tile (columns)."""
    assert _kinds(_plan(is_causal=True)) == ["mhhh", "fmhh", "ffmh", "fffm"]
    assert _kinds(_plan()) == ["ffff"] * 4
    # a causal window of 5 keys (the query and 4 before it)
    assert _kinds(_plan(is_causal=True, window=(4, 0))) == ["mhhh", "mmhh", "hmmh", "hhmm"]
    # 14 keys in tiles of 4: the last tile is half padding, every row's tile there mixed
    assert _kinds(_plan(S=14)) == ["fffm"] * 4
    # padding lengths or segments are known only when it runs: every shown tile selects
    assert _kinds(_plan(is_causal=True, dynamic_mask=True)) == ["mhhh", "mmhh", "mmmh",
                                                                "mmmm"]
    assert _kinds(_plan(is_causal=True, positions_given=True)) == ["mmmm"] * 4
    assert (HIDDEN, FULL, MIXED) == ("hidden", "full", "mixed")


def test_runs_of_one_kind_become_one_loop():
    assert _runs(["full", "full", "full", "mixed", "hidden"]) == [("full", 0, 3),
                                                                   ("mixed", 3, 1)]
    assert _runs(["mixed", "hidden", "mixed", "mixed"]) == [("mixed", 0, 1), ("mixed", 2, 2)]
    assert _runs(["hidden", "hidden"]) == []
