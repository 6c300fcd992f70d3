"""Context-parallel attention (``attnjax.ops.context``): the ``ring`` and ``allgather`` kernels
split a sequence over a mesh axis and must compute what one device computes.

Outside ``sequence_parallel`` both run the chunked kernel's program, so the registry-wide
tests of test_attention.py check them there. Here: the layouts' load balance and block
counts (NumPy, in process), the context manager and the refusals, and, in ONE subprocess
with 8 fake CPU devices, outputs and gradients (q, k, v and every parameter: sink, per-head
scale, ALiBi slopes, a T5 table) of both kernels on meshes whose sequence axis has 2, 4 and
8 devices (beside data and tensor axes) against the reference kernel on one device, and
against the float64 oracle where no dropout is involved. Three scenarios cover the options
(``PLAN`` says which kernel runs which on which mesh: nine compilations, every kernel
and device count meeting every scenario once, to keep the suite's cold time). The
subprocess is this file run as a script; it prints one JSON line per check.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from attnjax.ops import dot_product_attention
from attnjax.ops.context import (chunk_table, choose_layout, current, layout_work,
                                 sequence_parallel)
from attnjax.ops.masks import MaskSpec
from attnjax.ops.positions import alibi_bias, t5_bias
from attnjax.parity import oracle_attention, oracle_grads
from helpers import REPO, subprocess_env

# Errors are measured as in test_attention.assert_close: |got - want| / max(1, max|want|).
TOLERANCE = 1e-5


# ------------------------------------------------------------------------------ in process


def test_zigzag_layout_balances_a_causal_mask_and_contiguous_does_not():
    """Causal, T = 64: contiguous device d sees about (2d + 1)/2n of the pairs (max/mean
    2 - 1/n); zig-zag (chunks d and 2n - 1 - d) gives every device the same pairs and the
    same number of computed blocks."""
    for n in (4, 8):
        zigzag = layout_work(64, n, block_q=4, block_k=4)
        contiguous = layout_work(64, n, layout="contiguous", block_q=4, block_k=4)
        assert zigzag["layout"] == "zigzag" and contiguous["layout"] == "contiguous"
        assert zigzag["pairs"].sum() == contiguous["pairs"].sum() == 64 * 65 // 2
        assert zigzag["pairs_max_over_mean"] <= 1.1 and zigzag["blocks_max_over_mean"] <= 1.1
        assert 2 - 1 / n - 0.05 <= contiguous["pairs_max_over_mean"] <= 2 - 1 / n + 0.05
        assert contiguous["blocks_max_over_mean"] >= 1.7
    np.testing.assert_array_equal(chunk_table(4, True), [[0, 7], [1, 6], [2, 5], [3, 4]])


def test_a_sliding_window_computes_blocks_in_proportion_to_the_window():
    """Causal window of w keys back over T = 256 on 4 devices, blocks of 8: each query block
    computes the ceil((w + 8) / 8) + 1 key blocks it may see at most, against the T/8 ... of
    plain causal attention; doubling w about doubles the count."""
    T, n, b = 256, 4, 8
    counts = {}
    for w in (8, 16, 32):
        work = layout_work(T, n, block_q=b, block_k=b,
                           mask=MaskSpec(is_causal=True, window=(w, 0)))
        assert work["layout"] == "contiguous"
        counts[w] = int(work["blocks"].sum())
        assert counts[w] <= (T // b) * (w // b + 2)
    causal = int(layout_work(T, n, block_q=b, block_k=b)["blocks"].sum())
    assert counts[8] * 4 < causal and 1.5 < counts[32] / counts[16] < 2.1


def test_sequence_parallel_is_a_context():
    mesh = jax.make_mesh((1,), ("sequence",), devices=jax.devices()[:1])
    assert current() is None
    with sequence_parallel(mesh) as inside:
        assert inside is mesh and current() == (mesh, "sequence")
        with sequence_parallel(mesh, "sequence"):
            assert current() == (mesh, "sequence")
        assert current() == (mesh, "sequence")
    assert current() is None
    with pytest.raises(ValueError, match="the mesh has no axis 'context'"):
        with sequence_parallel(mesh, "context"):
            pass
    with pytest.raises(ValueError, match="layout='striped' is not one of"):
        choose_layout("striped", MaskSpec(), 16, 2)


@pytest.mark.parametrize("kernel", ["ring", "allgather"])
def test_refusals_are_one_line(kernel):
    """A dense bias or mask array and return_weights are refused whatever the devices; a
    sequence axis of one device runs the chunked kernel's program."""
    q = k = v = jnp.zeros((1, 8, 2, 4))
    cases = [(dict(bias=jnp.zeros((8, 8))), "does not support: dense_bias"),
             (dict(mask=jnp.ones((8, 8), bool)), "does not support: mask"),
             (dict(return_weights=True), "does not support: return_weights")]
    for kwargs, fragment in cases:
        with pytest.raises(ValueError, match=fragment) as info:
            dot_product_attention(q, k, v, implementation=kernel, **kwargs)
        assert "\n" not in str(info.value)
    with sequence_parallel(jax.make_mesh((1,), ("sequence",), devices=jax.devices()[:1])):
        out = dot_product_attention(q, k, v, implementation=kernel, is_causal=True)
    assert out.shape == q.shape


# ------------------------------------------------------------------------- several devices


def _normal(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


def _scenarios():
    """name -> (q, k, v, params, dynamic, call(q, k, v, params, dynamic, **kernel), oracle
    keyword arguments or None). ``params`` are differentiated; ``dynamic`` are arrays."""
    rng = np.random.default_rng(0)
    out = {}
    # 1. causal (zig-zag), packed documents, key padding, GQA, soft cap, sink, per-head
    #    scale, ALiBi (learned slopes), dropout on the probabilities.
    T = 32
    segments = np.array([[0] * 10 + [1] * 14 + [2] * 8, [0] * 20 + [1] * 12], np.int32)
    params = dict(slopes=np.array([0.5, 0.25, 0.125, 0.0625], np.float32),
                  sink=np.array([0.0, 1.0, -1.0, 2.0], np.float32),
                  scale=np.array([0.3, 0.35, 0.4, 0.45], np.float32))
    dynamic = dict(segment_ids=segments, key_value_seq_lengths=np.array([32, 28], np.int32),
                   dropout_rng=jax.random.key(3))

    def packed(q, k, v, p, d, **kernel):
        return dot_product_attention(
            q, k, v, bias=lambda qp, kp: alibi_bias(p["slopes"], qp, kp), sink=p["sink"],
            scale=p["scale"], is_causal=True, logit_soft_cap=5.0, dropout_rate=0.3, **d,
            **kernel)

    out["causal_packed_gqa_softcap_sink_scale_alibi_dropout"] = (
        _normal(rng, 2, T, 4, 8) * 2, _normal(rng, 2, T, 2, 8) * 2, _normal(rng, 2, T, 2, 8),
        params, dynamic, packed, None)

    # 2. causal sliding window (3 keys back) and block-causal, given positions (offset 7),
    #    MQA, a value width of its own (6), a T5 bias (learned table).
    positions = (np.arange(T) + 7)[None].astype(np.int32)
    table = _normal(rng, 8, 4)
    dynamic = dict(query_positions=positions, key_positions=positions)

    def window(q, k, v, p, d, **kernel):
        return dot_product_attention(
            q, k, v, bias=lambda qp, kp: t5_bias(p["table"], qp, kp, bidirectional=False,
                                                 num_buckets=8, max_distance=16),
            is_causal=True, local_window_size=(3, 0), causal_block_size=4, **d, **kernel)

    pos = positions[0]
    mask = ((pos[None, :] <= pos[:, None]) & (pos[None, :] >= pos[:, None] - 3)
            & (pos[None, :] // 4 <= pos[:, None] // 4))
    bias = np.asarray(t5_bias(table, positions, positions, bidirectional=False, num_buckets=8,
                              max_distance=16), np.float64)
    out["window_block_causal_positions_mqa_value_width_t5"] = (
        _normal(rng, 2, T, 4, 8), _normal(rng, 2, T, 1, 8), _normal(rng, 2, T, 1, 6),
        dict(table=table), dynamic, window, dict(mask=mask, bias=bias))

    # 3. bidirectional cross-attention, 16 queries over 32 keys (both split), query padding,
    #    the source's pads a segment of their own, GQA, soft cap, sink.
    q_len, kv_len = np.array([16, 12], np.int32), np.array([32, 25], np.int32)
    kv_ids = (np.arange(32)[None] < kv_len[:, None]).astype(np.int32)
    dynamic = dict(query_seq_lengths=q_len, segment_ids=(np.ones((2, 16), np.int32), kv_ids))

    def cross(q, k, v, p, d, **kernel):
        return dot_product_attention(q, k, v, sink=p["sink"], logit_soft_cap=5.0, **d,
                                     **kernel)

    mask = ((np.arange(16)[None, :, None] < q_len[:, None, None])
            & (kv_ids[:, None, :] == 1))[:, None]
    out["bidirectional_cross_16x32_padding_segments_softcap_sink"] = (
        _normal(rng, 2, 16, 4, 8) * 2, _normal(rng, 2, 32, 2, 8) * 2, _normal(rng, 2, 32, 2, 8),
        dict(sink=np.array([0.5, -0.5, 1.0, 0.0], np.float32)), dynamic, cross,
        dict(mask=mask, logit_soft_cap=5.0, sink=np.array([0.5, -0.5, 1.0, 0.0])))
    return out


# (device count, kernel, scenario index, kernel settings, mesh axes, flag): every kernel runs
# every scenario, every device count sees every scenario, and the causal one (zig-zag, the
# most moving parts) runs on every device count. Sequence axes beside data and tensor axes
# (batch and heads split there too); flags: a mesh of explicit axis types (the project's are
# automatic), bfloat16 inputs, and "count": the blocks computed are counted (jax 0.12's
# debug.callback fails under a shard_map that leaves two mesh axes automatic, so those
# meshes have one at most). Blocks that do not divide the local lengths in some.
PLAN = [
    (2, "ring", 0, dict(block_q=4, block_k=4), dict(sequence=2, tensor=4), "count"),
    (2, "allgather", 2, dict(block_q=3), dict(data=2, sequence=2, tensor=2), ""),
    (4, "ring", 0, dict(block_q=3), dict(data=2, sequence=4), "explicit"),
    (4, "allgather", 0, dict(block_q=2, block_k=3), dict(data=2, sequence=4), ""),
    (4, "ring", 1, dict(block_k=3), dict(data=2, sequence=4), "count"),
    (8, "ring", 0, {}, dict(sequence=8), ""),
    (8, "allgather", 0, dict(block_k=2), dict(sequence=8), "bfloat16"),
    (8, "ring", 2, {}, dict(sequence=8), ""),
    (8, "allgather", 1, dict(block_q=4), dict(sequence=8), ""),
]


def _mesh(axes: dict, explicit: bool = False):
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    return jax.make_mesh(tuple(axes.values()), tuple(axes), axis_types=(kind,) * len(axes))


def _error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


def _program(call, mesh, **kernel):
    def run(q, k, v, params, dynamic, cot):
        scope = contextlib.nullcontext() if mesh is None else sequence_parallel(mesh)
        if mesh is not None:    # laid out on the mesh as training lays parameters out: their
            params = jax.tree.map(       # types then name it, which shard_map's body must take
                lambda p: jax.lax.with_sharding_constraint(p, NamedSharding(mesh, P())), params)
        with scope:
            out, pull = jax.vjp(lambda q, k, v, p: call(q, k, v, p, dynamic, **kernel),
                                q, k, v, params)
            return out, pull(cot)
    return jax.jit(run)


def _cotangent(q, v):
    return np.random.default_rng(7).normal(size=q.shape[:3] + v.shape[3:]).astype(np.float32)


def _tokens(mesh, x):
    """``x`` ``[B, T, heads, .]`` split along its length, its batch over data and its heads
    over tensor where they divide."""
    tensor = mesh.shape.get("tensor", 1)
    return jax.device_put(x, NamedSharding(mesh, P(
        "data" if "data" in mesh.shape else None, "sequence",
        "tensor" if tensor > 1 and x.shape[2] % tensor == 0 else None)))


def _check(entry, scenario, reference) -> dict:
    """One PLAN entry against the reference run (and the oracle where it has one)."""
    n, kernel, _, settings, axes, flag = entry
    q, k, v, params, dynamic, call, oracle = scenario
    mesh = _mesh(axes, flag == "explicit")
    blocks = []
    count = lambda which, device, q0, k0: blocks.append((which, int(device)))
    cot = _cotangent(q, v)
    if flag == "bfloat16":
        q, k, v, cot = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, cot))
    with jax.set_mesh(mesh):
        got = _program(call, mesh, implementation=kernel,
                       on_block=count if flag == "count" else None, **settings)(
            *(_tokens(mesh, x) for x in (q, k, v)), params, dynamic, cot)
        jax.block_until_ready(got)
    name = lambda key: "d" + key if isinstance(key, str) else ("dq", "dk", "dv")[key]
    grads = lambda run: {name(key): g for key, g in [*enumerate(run[1][:3]),
                                                      *run[1][3].items()]}
    row = dict(n=n, kernel=kernel, dtype=str(q.dtype), out=_error(got[0], reference[0]),
               **{key: _error(g, grads(reference)[key]) for key, g in grads(got).items()})
    if oracle is not None:
        row["oracle"] = max(_error(got[0], oracle_attention(q, k, v, **oracle)), *(
            _error(g, w) for g, w in zip(got[1][:3], oracle_grads(q, k, v, cot, **oracle))))
    if flag == "count":
        row["blocks"] = {which: [Counter(blocks)[which, d] for d in range(n)]
                         for which in ("forward", "backward")}
    return row


def _refuse(T: int, layout: str, fragment: str):
    x = jnp.zeros((1, T, 2, 4))
    try:
        jax.eval_shape(lambda x: dot_product_attention(
            x, x, x, implementation="ring", is_causal=True, layout=layout), x)
    except ValueError as error:
        assert fragment in str(error) and "\n" not in str(error), error
    else:
        raise AssertionError(f"T={T} {layout} was not refused")


def _device_checks():
    """The subprocess: one JSON line per PLAN entry, then one for the refusals."""
    assert jax.device_count() == 8, jax.devices()
    scenarios = _scenarios()
    names = list(scenarios)
    references = {}
    for entry in PLAN:
        name = names[entry[2]]
        q, k, v, params, dynamic, call, oracle = scenarios[name]
        cot = _cotangent(q, v)
        # bfloat16: the reference in float32 on the same (rounded) inputs and cotangent
        rounded = entry[-1] == "bfloat16"
        if rounded:
            q, k, v, cot = (np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)
                            for x in (q, k, v, cot))
        if (name, rounded) not in references:
            references[name, rounded] = _program(call, None, implementation="reference")(
                q, k, v, params, dynamic, cot)
        row = _check(entry, scenarios[name], references[name, rounded])
        print(json.dumps(dict(scenario=name, **row)), flush=True)
    # lengths the split cannot take are refused in one line, before anything compiles
    mesh = _mesh(dict(data=2, sequence=4))
    with jax.set_mesh(mesh), sequence_parallel(mesh):
        _refuse(30, "auto", "query length 30 must divide by 4")
        _refuse(36, "zigzag", "query length 36 must divide by 8")
    print(json.dumps(dict(refusals="ok")), flush=True)


def _expected_blocks(n, kernel, index, settings, *_):
    """The blocks layout_work counts for a PLAN entry: what the kernel must compute."""
    q, k, v, params, dynamic, call, oracle = _scenarios()[list(_scenarios())[index]]
    T = q.shape[1]
    if index == 0:
        mask = MaskSpec(is_causal=True, q_segment_ids=dynamic["segment_ids"],
                        kv_segment_ids=dynamic["segment_ids"],
                        key_value_seq_lengths=dynamic["key_value_seq_lengths"])
    else:
        mask = MaskSpec(is_causal=True, window=(3, 0), causal_block_size=4,
                        q_positions=dynamic["query_positions"],
                        kv_positions=dynamic["key_positions"])
    return layout_work(T, n, mask=mask, **settings)["blocks"].tolist()


@pytest.fixture(scope="module")
def device_rows():
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=8",
                         JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, __file__], env=env, capture_output=True,
                            text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_ring_and_allgather_equal_one_device_on_2_4_and_8_devices(device_rows):
    rows = [r for r in device_rows if "kernel" in r]
    assert [(r["n"], r["kernel"], r["scenario"]) for r in rows] == [
        (n, kernel, list(_scenarios())[index]) for n, kernel, index, *_ in PLAN]
    for row in rows:
        errors = {key: value for key, value in row.items()
                  if key not in ("n", "kernel", "scenario", "blocks", "dtype")}
        if row["dtype"] == "bfloat16":   # as test_attention's low-precision test: 4u, 8u
            u = 2.0 ** -8
            assert errors.pop("out") <= 4 * u and max(errors.values()) <= 8 * u, row
        else:
            assert max(errors.values()) <= TOLERANCE, row
    assert {r["scenario"] for r in rows} == set(_scenarios())
    assert {"dsink", "dscale", "dslopes", "dtable"} <= {key for r in rows for key in r}
    assert any(r for r in device_rows if r.get("refusals") == "ok")


def test_the_kernel_computes_exactly_the_blocks_the_mask_shows(device_rows):
    """Forward and backward compute, on each device, the block pairs layout_work counts
    (the rest are skipped: packed documents and padding skip more on some devices, so these
    are not balanced; a causal mask alone is, test_zigzag_layout_balances...)."""
    counted = [(entry, row) for entry, row in zip(PLAN, [r for r in device_rows if "n" in r])
               if entry[-1] == "count"]
    assert len(counted) == 2 and all("blocks" in row for _, row in counted)
    for entry, row in counted:
        expected = _expected_blocks(*entry)
        assert row["blocks"]["forward"] == row["blocks"]["backward"] == expected, row


if __name__ == "__main__":
    _device_checks()
