"""MK9: a forward pass on a random input that checks the output's shape and finiteness
"basically validates" an attention implementation.

The planted-bug harness (capability M18). A clean causal multi-head attention layer with
projections and RoPE on q and k,

    q, k, v = x W_q, x W_k, x W_v  ->  [B, T, N, H]  ->  RoPE(q), RoPE(k)
    o = softmax_keys(q k^T / sqrt(H), causal) v  ->  [B, T, N*H]  ->  o W_o,

is written as six steps (projections, head split, RoPE, attention, head merge, output
projection) with attnjax's own ops (``apply_rope``, ``dot_product_attention``); each of 12
planted bugs replaces one step by a small mutated function: no scale; 1/H instead of
1/sqrt(H); softmax over queries instead of keys; q.q instead of q.k; heads split without the
transpose (``reshape(B, N, T, H)`` of a ``[B, T, N*H]`` array, as PyTorch code that forgets
``.transpose(1, 2)``); heads merged out of order (reversed); the causal mask with offset o = 0
and o = 2 in the sense of CLAIMS.md MK5 (masking ``j - i >= o``; o = 1 is causal), through
attnjax's unsafe ``masked_fill`` kernel (its ``causal_offset`` is o - 1); V projected with
W_k; no W_o; RoPE also applied to v; dropout 0.1 left on at evaluation.

Measure: x ~ N(0, 1) of [2, 16, 64], 4 heads of width 16, W ~ N(0, 1/64), fixed seeds. Each
version gets the article's self-check (output shape equals the input's, every entry finite)
and the float64 oracle check: max |out - oracle| / max |oracle| <= 1e-5, the oracle being
``attnjax.parity.oracle_attention`` (float64 NumPy) inside float64 NumPy projections and RoPE.
``measure`` asserts that the clean version passes both checks (else the harness is broken).

Criterion: the claim is confirmed if at most 10% of the bugs pass the shape + finite check.
The oracle's catches are reported beside it.

    attnjax audit experiments/claims --workdir runs/claims --only MK9
"""

import jax
import jax.numpy as jnp
import numpy as np

from attnjax.audit import holds
from attnjax.ops import apply_rope, causal_mask, dot_product_attention, mask_value
from attnjax.parity import oracle_attention

ID = "MK9"
SOURCE = "000 §7.3"
CLAIM = "a random-input forward pass that checks shape and finiteness basically validates attention"
CRITERION = "at most 10% of >= 10 planted bugs pass the shape + finite check"
B, T, N, H = 2, 16, 4, 16
D = N * H
TOLERANCE = 1e-5            # oracle check: max abs error / max |oracle output|
MAX_PASSING = 0.10


def _qkv(x, w):
    return x @ w["q"], x @ w["k"], x @ w["v"]


def _split(t):                       # [B, T, N*H] -> [B, T, N, H]
    return t.reshape(B, T, N, H)


def _rope(q, k, v):
    return apply_rope(q, jnp.arange(T)), apply_rope(k, jnp.arange(T)), v


def _attend(q, k, v, **options):
    return dot_product_attention(q, k, v, is_causal=True, **options)


def _merge(o):                       # [B, T, N, H] -> [B, T, N*H]
    return o.reshape(B, T, D)


def _out(o, w):
    return o @ w["o"]


CLEAN = dict(qkv=_qkv, split=_split, rope=_rope, attend=_attend, merge=_merge, out=_out)


def forward(x, w, **steps):
    """The clean layer, with any of its steps replaced."""
    s = {**CLEAN, **steps}
    q, k, v = (s["split"](t) for t in s["qkv"](x, w))
    o = s["attend"](*s["rope"](q, k, v))
    return s["out"](s["merge"](o), w)


def _softmax_over_queries(q, k, v):
    """Causal logits normalised along the query axis (each key's column sums to 1)."""
    s = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(H)
    s = jnp.where(causal_mask(jnp.arange(T)[None], jnp.arange(T)[None]), s,
                  mask_value(s.dtype))
    return jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(s, axis=-2), v)


def _offset(o):
    """Causal mask ``j - i >= o`` masked (CLAIMS.md MK5): the kernel's offset is o - 1."""
    return lambda q, k, v: _attend(q, k, v, implementation="masked_fill", causal_offset=o - 1)


BUGS = {
    "no scale": dict(attend=lambda q, k, v: _attend(q, k, v, scale=1.0)),
    "1/d scale": dict(attend=lambda q, k, v: _attend(q, k, v, scale=1.0 / H)),
    "softmax over queries": dict(attend=_softmax_over_queries),
    "q.q": dict(attend=lambda q, k, v: _attend(q, q, v)),
    "split without transpose": dict(split=lambda t: t.reshape(B, N, T, H).transpose(0, 2, 1, 3)),
    "heads out of order": dict(merge=lambda o: _merge(o[:, :, ::-1])),
    "causal offset 0": dict(attend=_offset(0)),
    "causal offset 2": dict(attend=_offset(2)),
    "V from K": dict(qkv=lambda x, w: (x @ w["q"], x @ w["k"], x @ w["k"])),
    "no W_o": dict(out=lambda o, w: o),
    "RoPE on v": dict(rope=lambda q, k, v: (*_rope(q, k, v)[:2], apply_rope(v, jnp.arange(T)))),
    "dropout at eval": dict(attend=lambda q, k, v: _attend(q, k, v, dropout_rate=0.1,
                                                           dropout_rng=jax.random.key(0))),
}


def _rope64(t):
    """Half-split RoPE in float64 (attnjax's pairing: feature j with j + H/2, base 10^4)."""
    angles = np.arange(T)[:, None, None] * 1e4 ** (-np.arange(0, H, 2) / H)    # [T, 1, H/2]
    a, b = t[..., : H // 2], t[..., H // 2:]
    return np.concatenate([a * np.cos(angles) - b * np.sin(angles),
                           b * np.cos(angles) + a * np.sin(angles)], axis=-1)


def oracle(x, w) -> np.ndarray:
    """The clean layer in float64 NumPy around ``attnjax.parity.oracle_attention``."""
    x, w = np.float64(x), {n: np.float64(m) for n, m in w.items()}
    q, k, v = ((x @ w[n]).reshape(B, T, N, H) for n in "qkv")
    o = oracle_attention(_rope64(q), _rope64(k), v, mask=np.tril(np.ones((T, T), bool)))
    return o.reshape(B, T, D) @ w["o"]


def _checks(out, x, expected) -> dict:
    out = np.asarray(out, np.float64)
    error = float(np.abs(out - expected).max() / np.abs(expected).max())
    return {"shape_finite": bool(out.shape == x.shape and np.isfinite(out).all()),
            "oracle_error": error if np.isfinite(error) else 1e30,
            "oracle": bool(error <= TOLERANCE)}


def measure() -> dict:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    w = {n: (rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for n in "qkvo"}
    expected = oracle(x, w)
    clean = _checks(forward(x, w), x, expected)
    assert clean["shape_finite"] and clean["oracle"], f"the clean layer fails a check: {clean}"
    return {"clean": clean,
            "bugs": {name: _checks(forward(x, w, **steps), x, expected)
                     for name, steps in BUGS.items()}}


def verdict(r):
    bugs = r["bugs"]
    passing = [name for name, c in bugs.items() if c["shape_finite"]]
    caught = sum(not c["oracle"] for c in bugs.values())
    least = min(bugs, key=lambda name: bugs[name]["oracle_error"])
    return holds(len(bugs) >= 10 and len(passing) <= MAX_PASSING * len(bugs),
                 f"{len(passing)}/{len(bugs)} bugs pass shape + finite "
                 f"({len(passing) / len(bugs):.0%}; limit 10%); the float64 oracle at 1e-5 "
                 f"catches {caught}/{len(bugs)} (smallest error {bugs[least]['oracle_error']:.1e}"
                 f", {least}); clean: error {r['clean']['oracle_error']:.1e}")


def _example(passing: int) -> dict:
    bugs = {f"bug {i}": {"shape_finite": i < passing, "oracle_error": 0.5, "oracle": False}
            for i in range(12)}
    return {"clean": {"shape_finite": True, "oracle_error": 1e-7, "oracle": True}, "bugs": bugs}


EXAMPLES = [(_example(1), "confirmed"), (_example(12), "refuted")]
