"""Sharding over a named mesh (``train.mesh``, ``attnjax.sharding``): every parameter's logical
axes, the rules' choice per dimension, the refusals, and on 8 CPU devices (one subprocess)
training on data, fsdp and tensor meshes against one device, for the three families, with
checkpoints resumed on other meshes."""

import json
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from attnjax import sharding
from attnjax.bench.mesh import collective_bytes, mesh_overrides
from attnjax.checkpoint import Checkpoints
from attnjax.config import Config
from attnjax.config.mesh import LOGICAL_AXES
from attnjax.data import Dataset
from attnjax.registry import POSITIONS, QK_NORMS, SINKS
from attnjax.train.parallel import Runner
from helpers import (TINY_CLASSIFY, TINY_INDUCTION, TINY_MLM, TINY_SEQ2SEQ, raises_one_line,
                     subprocess_env, tiny_config)

SIZES = {"data": 2, "fsdp": 2, "sequence": 1, "tensor": 2}
TABLE = Config().train.mesh.table()

# every parameter kind the models make: the families, the q/k/v layouts, and the slots that
# add parameters of their own
MODELS = {
    "decoder-fused": TINY_INDUCTION,
    "decoder-separate": {**TINY_INDUCTION, "model.attention.fused_qkv": False,
                         "model.attention.num_kv_heads": 1, "model.attention.use_bias": True,
                         "model.mlp": "swiglu", "model.mlp_bias": True},
    "decoder-per-head": {**TINY_INDUCTION, "model.attention.fused_qkv": False,
                         "model.attention.per_head_projections": True,
                         "model.tie_embeddings": False},
    "decoder-slots": {**TINY_INDUCTION, "model.attention.scale": "learned",
                      "model.attention.sink": "learned",
                      "model.attention.qk_norm": "layer", "model.norm": "rms",
                      "model.attention.value_head_dim": 4},
    "encoder-mlm": TINY_MLM,
    "encoder-classify": TINY_CLASSIFY,
    "seq2seq": TINY_SEQ2SEQ,
    **{f"position-{kind}": {**TINY_INDUCTION, "model.position.kind": kind}
       for kind in POSITIONS.names()},
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_parameter_names_a_logical_axis_per_dimension(name):
    config = tiny_config(MODELS[name])
    shapes, names = sharding._declared(config.model)
    flat_shapes = jax.tree_util.tree_leaves_with_path(shapes)
    flat_names = jax.tree_util.tree_leaves(names, is_leaf=lambda x: isinstance(x, PartitionSpec))
    assert len(flat_shapes) == len(flat_names)
    for (path, shape), axes in zip(flat_shapes, flat_names):
        where = jax.tree_util.keystr(path)
        assert len(axes) == len(shape.shape), (where, axes, shape.shape)
        assert set(axes) <= set(LOGICAL_AXES) | {None}, (where, axes)
    # the same tree as the model's own parameters, with no boxes outside ``declaring``
    plain = jax.eval_shape(lambda: config_model_init(config))
    assert jax.tree_util.tree_structure(plain) == jax.tree_util.tree_structure(shapes)


def config_model_init(config):
    from attnjax.models import build
    return build(config.model).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]


def test_qk_norm_and_sink_kinds_are_all_covered():
    """The registry entries that make parameters appear in ``MODELS`` above."""
    assert {"learned"} <= set(SINKS.names()) and {"layer"} <= set(QK_NORMS.names())


@pytest.mark.parametrize("names, shape, expected", [
    (("embed", "mlp"), (16, 64), PartitionSpec("fsdp", "tensor")),
    (("mlp", "embed"), (64, 16), PartitionSpec("tensor", "fsdp")),
    (("vocab", "embed"), (257, 16), PartitionSpec(None, "fsdp")),     # 257: not divisible
    (("heads", "head_dim", "embed"), (4, 8, 16), PartitionSpec("tensor", None, "fsdp")),
    (("embed", "kv_heads", "head_dim"), (16, 1, 8), PartitionSpec("fsdp")),  # MQA: replicated
    (("norm",), (16,), PartitionSpec("fsdp")),
    (("position", "embed"), (16, 16), PartitionSpec(None, "fsdp")),
    (("batch",), (8,), PartitionSpec(("data", "fsdp"))),
    (("batch",), (6,), PartitionSpec()),                                   # 6 % 4
    (("embed", "embed_out"), (16, 16), PartitionSpec("fsdp")),
])
def test_spec_takes_the_first_rule_that_divides(names, shape, expected):
    assert sharding.spec(names, shape, SIZES, TABLE) == expected


def test_a_mesh_axis_is_used_once_per_array_and_rules_override_the_table():
    # the entries apply in order: mlp's fsdp comes first and takes the axis from embed
    table = (("mlp", "fsdp"),) + TABLE
    assert sharding.spec(("embed", "mlp"), (16, 64), SIZES, table) == PartitionSpec(
        None, "fsdp")
    # embed's fsdp before mlp's second choice, fsdp: mlp gets its first one, tensor
    assert sharding.spec(("mlp", "embed"), (64, 16), SIZES, TABLE) == PartitionSpec(
        "tensor", "fsdp")
    # without tensor, a vector of MLP width falls to its second choice, fsdp, and a matrix's
    # embed keeps fsdp
    no_tensor = {"data": 2, "fsdp": 4, "sequence": 1, "tensor": 1}
    assert sharding.spec(("mlp",), (64,), no_tensor, TABLE) == PartitionSpec("fsdp")
    assert sharding.spec(("mlp", "embed"), (64, 16), no_tensor, TABLE) == PartitionSpec(
        None, "fsdp")
    # a config's entries come first and replace the table's for their logical axis: the MLP
    # split by row over fsdp, not over tensor at all
    config = tiny_config(TINY_INDUCTION, **{"train.mesh.rules": [["mlp", "fsdp"]]})
    assert config.train.mesh.table()[0] == ("mlp", "fsdp")
    assert ("mlp", "tensor") not in config.train.mesh.table()
    assert sharding.spec(("embed", "mlp"), (16, 64), SIZES,
                         config.train.mesh.table()) == PartitionSpec(None, "fsdp")
    # axes of size 1 are left out of the spec
    size_one = {"data": 8, "fsdp": 1, "sequence": 1, "tensor": 1}
    assert sharding.spec(("embed", "mlp"), (16, 64), size_one, TABLE) == PartitionSpec()


def test_gqa_with_fewer_kv_heads_than_tensor_replicates_them():
    config = tiny_config(TINY_INDUCTION, **{
        "model.attention.fused_qkv": False, "model.attention.num_heads": 4,
        "model.attention.num_kv_heads": 2, "train.mesh.data": 1, "train.mesh.tensor": 4})
    _, names = sharding._declared(config.model)
    attention = names["block_0"]["attention"]
    sizes = {"data": 1, "fsdp": 1, "sequence": 1, "tensor": 4}
    query = sharding.spec(tuple(attention["query"]["kernel"]), (16, 4, 4), sizes, TABLE)
    key = sharding.spec(tuple(attention["key"]["kernel"]), (16, 2, 4), sizes, TABLE)
    assert query == PartitionSpec(None, "tensor") and key == PartitionSpec()


@pytest.mark.parametrize("overrides, devices, fragments", [
    ({"train.mesh.data": 3}, 8, ("train.mesh data=3 x fsdp=1 x sequence=1 x tensor=1",
                                 "8 device(s)")),
    ({"train.mesh.fsdp": 3, "train.mesh.data": -1}, 8, ("fsdp=3", "product")),
    ({"train.mesh.tensor": 2}, 2, ("fused_qkv=True", "fused_qkv=false")),
    ({"train.mesh.tensor": 4, "train.mesh.data": 1, "model.attention.fused_qkv": False,
      "model.attention.num_heads": 2}, 4, ("tensor=4 must divide", "num_heads=2")),
    ({"train.mesh.tensor": 2, "train.mesh.data": 1, "model.attention.fused_qkv": False,
      "model.mlp_hidden": 9}, 2, ("tensor=2 must divide the MLP's width 9",)),
    ({"train.mesh.fsdp": 8, "train.mesh.data": 1}, 8, ("batch_size=4", "data x fsdp = 8")),
    ({"train.mesh.fsdp": 2, "train.mesh.data": 1, "train.grad_accum": 4}, 2,
     ("data x fsdp = 2", "grad_accum=4")),
    ({"train.mesh.sequence": 3, "train.mesh.data": 1}, 3, ("sequence=3", "data.length=16")),
    # the ring's zig-zag layout: 2 chunks per device under the causal mask, 12 % 8
    ({"train.mesh.sequence": 4, "train.mesh.data": 1, "model.attention.kernel": "ring",
      "data.length": 12}, 4, ("sequence=4", "data.length=12 into 8 equal chunks")),
])
def test_impossible_meshes_are_refused_in_one_line(overrides, devices, fragments):
    config = tiny_config(TINY_INDUCTION, **overrides)
    raises_one_line(lambda: sharding.check(config, devices), *fragments)


@pytest.mark.parametrize("overrides, fragments", [
    ({"train.mesh.fsdp": 0}, ("train.mesh.fsdp=0", "-1")),
    ({"train.mesh.fsdp": -1}, ("train.mesh has 2 axes of size -1", "data, fsdp")),
    ({"train.mesh.rules": [["mlp", "model"]]}, ("train.mesh.rules[0]",
                                                  "data, fsdp, sequence, tensor")),
    ({"train.mesh.rules": [["width", "fsdp"]]}, ("train.mesh.rules[0]", "embed")),
    ({"train.parallel": "pmap", "train.mesh.fsdp": 2}, ("train.parallel='pmap'", "fsdp=2")),
    ({"train.parallel": "pmap", "train.mesh.sequence": 2}, ("train.parallel='pmap'",
                                                            "sequence=2")),
])
def test_impossible_mesh_configs_are_refused_in_one_line(overrides, fragments):
    raises_one_line(lambda: tiny_config(TINY_INDUCTION, **overrides), *fragments)


def test_a_vmapped_group_with_split_parameters_is_refused_before_compiling():
    config = tiny_config(TINY_INDUCTION, **{"train.mesh.fsdp": 2, "train.mesh.data": 1})
    raises_one_line(lambda: Runner(config, Dataset(config.data), jax.devices(), group=2),
                    "train.mesh.fsdp=2", "vmapped group", "launcher")


def test_boxes_appear_only_while_declaring():
    config = tiny_config(TINY_INDUCTION)
    plain = config_model_init(config)
    assert not any(isinstance(x, nn.Partitioned) for x in jax.tree_util.tree_leaves(
        plain, is_leaf=lambda x: isinstance(x, nn.Partitioned)))


def test_decoding_splits_no_sequence():
    config = tiny_config(TINY_INDUCTION, **{"model.attention.fused_qkv": False})
    raises_one_line(lambda: sharding.inference_mesh(config, "sequence=2", [None] * 2),
                    "mesh 'sequence=2'", "one token per step")


def test_info_lays_a_config_out_for_any_device_count():
    config = tiny_config(TINY_INDUCTION, **{"model.attention.fused_qkv": False,
                                            "train.mesh.fsdp": 2, "train.mesh.tensor": 2})
    lines = sharding.layout_lines(config, 8)
    assert lines[0] == "mesh data=2 x fsdp=2 x sequence=1 x tensor=2 over 8 device(s)"
    up = next(line for line in lines if "block_0/mlp/up/kernel" in line).split()
    # [16, 64] of axes (embed, mlp): fsdp splits the rows, tensor the columns
    assert up[-2:] == ["(8,", "32)"] and "('fsdp'," in up and "'tensor')" in up


def test_collective_bytes_are_read_from_a_compiled_programs_text():
    hlo = """
  %all-gather.1 = f32[64,256]{1,0} all-gather(%p), channel_id=1, dimensions={0}
  %all-reduce.2 = (f32[], bf16[8,4]{1,0}) all-reduce(%a, %b), channel_id=2
  %reduce-scatter.3 = f32[16]{0} reduce-scatter(%c), dimensions={0}
  %all-gather-start.4 = (f32[2]{0}, f32[16]{0}) all-gather-start(%d), dimensions={0}
  %add.5 = f32[64,256]{1,0} add(%x, %y)
"""
    assert collective_bytes(hlo) == {"all-gather": 64 * 256 * 4 + (2 + 16) * 4,
                                     "all-reduce": 4 + 8 * 4 * 2, "reduce-scatter": 16 * 4,
                                     "collective-permute": 0, "all-to-all": 0}
    # a ring's hop inside a loop of 3 trips, the loop inside the entry: counted 3 times
    program = """
%body (param: (s32[], f32[2,16])) -> (s32[], f32[2,16]) {
  %ppermute.2 = f32[2,16]{1,0} collective-permute(%x), source_target_pairs={{0,1},{1,0}}
}
%cond (param.1: (s32[], f32[2,16])) -> pred[] {
}
ENTRY %main (param.3: f32[2,16]) -> f32[2,16] {
  %while.9 = (s32[], f32[2,16]{1,0}) while(%t), condition=%cond, body=%body, LOOP
  %all-to-all.1 = f32[4]{0} all-to-all(%y), dimensions={0}
}
"""
    found = collective_bytes(program.replace("LOOP", 'backend_config={"known_trip_count":'
                                                           '{"n":"3"}}'))
    assert found["collective-permute"] == 3 * 2 * 16 * 4 and found["all-to-all"] == 16
    assert mesh_overrides("fsdp=2,tensor=2") == {"train.mesh.data": -1, "train.mesh.fsdp": 2,
                                                 "train.mesh.sequence": 1,
                                                 "train.mesh.tensor": 2}
    raises_one_line(lambda: mesh_overrides("model=2"), "mesh 'model=2'", "fsdp")


# ---------------------------------------------------------------- 8 devices, one subprocess

EIGHT_DEVICES = """
import json, shutil, sys
from pathlib import Path
import jax, numpy as np
from attnjax.config import Config, apply_overrides
from attnjax.bench.mesh import mesh_row
from attnjax.checkpoint import Checkpoints
from attnjax.data import Dataset
from attnjax.train import hyper, train
from attnjax.train.parallel import Runner
assert jax.device_count() == 8
FAMILIES = json.loads(sys.argv[1])
ROOT = Path(sys.argv[2])

def config_of(base, mesh):
    return apply_overrides(Config(), {**base, **{f"train.mesh.{k}": v for k, v in mesh.items()}})

def losses(base, devices, **mesh):
    config = config_of(base, mesh)
    runner = Runner(config, Dataset(config.data), devices)
    state, out = runner.place(runner.start(config)), []
    for _ in range(config.train.steps // config.train.steps_per_dispatch):
        state, metrics = runner.run(state, hyper.as_arrays([config], stacked=False))
        out += list(np.asarray(metrics["loss"]))
    return np.array(out), jax.device_get(state)

def relative(a, b):
    # parameters as a whole (relative L2): Adam's g / (|g| + eps) magnifies last-bit
    # differences of near-zero gradients elementwise
    diff = sum(float(((np.asarray(x) - np.asarray(y)) ** 2).sum())
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
    norm = sum(float((np.asarray(y) ** 2).sum()) for y in jax.tree_util.tree_leaves(b))
    return (diff / norm) ** .5

trained = {}
for family, (base, meshes) in FAMILIES.items():
    one, s1 = losses(base, jax.devices()[:1])
    for mesh in meshes:
        many, s8 = losses(base, jax.devices(), **mesh)
        trained[family] = (s1, s8, mesh)
        worst = float(np.abs(many / one - 1).max())
        assert worst < 1e-5, (family, mesh, worst)
        assert relative(s8.params, s1.params) < 1e-5, (family, mesh)
        assert relative(s8.opt_state, s1.opt_state) < 1e-5, (family, mesh)
        print("EXACT", family, json.dumps(mesh), f"{worst:.1e}",
              f"{relative(s8.params, s1.params):.1e}")

# evaluation is laid out as training: the ring's run evaluated at 4L split along the
# length (params placed on its mesh) equals one device's evaluation of the same parameters
from attnjax import sharding
from attnjax.data import load_dataset
from attnjax.train.loop import evaluate
s1, s8, mesh = trained["decoder-ring"]
ring = config_of(FAMILIES["decoder-ring"][0], mesh)
split = sharding.place_parameters(ring, s8.params, sharding.make_mesh(ring.train.mesh,
                                                                      jax.devices()))
alone = config_of(FAMILIES["decoder-ring"][0], {})
dataset = load_dataset(ring.data)
ours = evaluate(ring, split, dataset, [64])
reference = evaluate(alone, s8.params, dataset, [64])
for length in ours:
    np.testing.assert_allclose(ours[length]["loss"], reference[length]["loss"], rtol=1e-5)
print("EVALUATED", {k: round(v["loss"], 4) for k, v in ours.items()})

# decoding on a mesh: parameters split over fsdp=2 x tensor=4, the KV cache by heads (and
# reordered by beam); beams (tokens and scores) as one device's
from attnjax.beam import beam_generate
from attnjax.train.state import init_params
config = config_of(FAMILIES["decoder"][0], {})
params, prompts = init_params(config), np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
split, mesh = sharding.inference_mesh(config, "data=1,fsdp=2,tensor=4", jax.devices())
placed = sharding.place_parameters(split, params, mesh)
assert placed["block_0"]["attention"]["key"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(
    "fsdp", "tensor")
beams = [beam_generate(c, p, prompts, 4, beams=2, mesh=m)
         for c, p, m in ((config, params, None), (split, placed, mesh))]
assert (beams[0].tokens == beams[1].tokens).all()
np.testing.assert_allclose(beams[1].scores, beams[0].scores, rtol=1e-5)
print("DECODED")

# attnjax bench mesh on the decoder: fsdp=8 holds an eighth of the state per device and
# gathers each parameter whole at least once
row = mesh_row(config_of(FAMILIES["decoder"][0], {"data": 1, "fsdp": 8}))
assert row["state_vs_even"] < 1.05 and row["gather_analytic_bytes"] > 0
# each split parameter gathered once (the rest: a few activations), none twice
assert row["gather_analytic_bytes"] <= row["all_gather_bytes"] < 1.1 * row["gather_analytic_bytes"]
print("BENCH", json.dumps({k: v for k, v in row.items() if k != "mesh"}))

# a run saved on fsdp=8 resumes on data=2 x tensor=4 from the step-10 checkpoint of a run
# stopped there (its later checkpoint and summary removed, as a run killed after step 10's
# checkpoint leaves them); this process's one device then reads that checkpoint (below)
base = FAMILIES["decoder"][0]
def stopped_at_10(run):
    shutil.rmtree(run / "ckpt" / "20")
    (run / "summary.json").unlink()
def final(run, config):
    checkpoints = Checkpoints(run / "ckpt", read_only=True)
    params, step = checkpoints.restore_params()
    checkpoints.close()
    assert step == 20
    return params
plan = [({"data": 1, "fsdp": 8}, jax.devices()), ({"data": 2, "tensor": 4}, jax.devices())]
run = ROOT / "run"
config = config_of(base, plan[0][0])
train(config, run, devices=plan[0][1], progress=False)
reference = final(run, config)
saved = Checkpoints(run / "ckpt", read_only=True)
restored, _ = saved.restore(Runner(config, Dataset(config.data), plan[0][1]).template(config))
saved.close()
kernel = restored.params["block_0"]["mlp"]["up"]["kernel"]     # [d=32, 128]: restored split
assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp"), kernel.sharding
assert {shard.data.shape for shard in kernel.addressable_shards} == {(4, 128)}
for mesh, devices in plan[1:]:
    stopped_at_10(run)
    config = config_of(base, mesh)
    summary = train(config, run, devices=devices, progress=False)
    assert summary["status"] == "finished"
    print("RESUMED", json.dumps(mesh), f"{relative(final(run, config), reference):.1e}")
    assert relative(final(run, config), reference) < 1e-5
print("ALL OK")
"""

SEPARATE = {"model.attention.fused_qkv": False, "train.steps_per_dispatch": 5}
EVERY_AXIS = {"data": 2, "fsdp": 2, "tensor": 2}
# every axis of a run split: parameters over fsdp and tensor, activations along their length
SPLIT_RUN = {"data": 1, "fsdp": 2, "sequence": 2, "tensor": 2}


def test_meshes_of_eight_devices_train_and_resume_as_one_device(tmp_path):
    # the decoder accumulates two micro-batches and regularises its attention's entropy (every
    # layer's weights) on every mesh
    decoder = {**TINY_INDUCTION, **SEPARATE, "model.attention.num_heads": 8,
               "model.d_model": 32, "train.batch_size": 16, "train.grad_accum": 2,
               "train.entropy_reg": 0.01}
    families = {
        # (data parallelism alone: tests/test_train.py, 4 devices)
        "decoder": (decoder, [{"data": 1, "fsdp": 8}, {"data": 1, "tensor": 8}, EVERY_AXIS]),
        # context parallelism: the ring (zig-zag under the causal mask) and all-gather kernels
        "decoder-ring": ({**decoder, "train.entropy_reg": 0.0, "model.attention.kernel": "ring",
                          "model.max_length": 64, "data.eval_lengths": [64]},
                         [{"data": 2, "sequence": 4}]),
        "encoder": ({**TINY_MLM, **SEPARATE, "train.batch_size": 8,
                     "model.attention.kernel": "allgather"}, [SPLIT_RUN]),
        # (the encoder-decoder: two processes on fsdp=4 in tests/test_distributed.py)
    }
    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=8")
    result = subprocess.run([sys.executable, "-c", EIGHT_DEVICES, json.dumps(families),
                             str(tmp_path)], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    print(result.stdout)
    assert result.stdout.count("EXACT") == 5 and result.stdout.count("RESUMED") == 1
    assert all(word in result.stdout for word in ("ALL OK", "BENCH", "DECODED", "EVALUATED"))
    # this process has one device: it reads the checkpoint of step 10, saved split over the
    # fsdp=8 mesh, whole (its parameters' digest, saved with it, checked on the way)
    checkpoints = Checkpoints(tmp_path / "run" / "ckpt", read_only=True)
    params, step = checkpoints.restore_params(step=10)
    checkpoints.close()
    kernel = params["block_0"]["mlp"]["up"]["kernel"]
    assert step == 10 and kernel.shape == (32, 128) and len(kernel.devices()) == 1


@pytest.mark.parametrize("base", [TINY_INDUCTION, TINY_SEQ2SEQ], ids=["decoder", "seq2seq"])
def test_remat_recomputes_the_same_step(base):
    """``model.remat``: the same parameter tree, and one training step (dropout on, so the
    recomputed forward pass must draw the same masks) gives the same loss, gradient norm and
    parameters as keeping the activations."""
    from attnjax.train.state import init_state
    from attnjax.train.step import make_train_step
    results = []
    for remat in (False, True):
        config = tiny_config(base, **{"model.remat": remat, "model.residual_dropout": 0.1,
                                      "model.attention.dropout": "probs_per_head",
                                      "model.attention.dropout_rate": 0.1})
        batch = Dataset(config.data).batch(0, 0, config.train.batch_size, config.data.length,
                                           "train")
        results.append(jax.jit(make_train_step(config))(init_state(config), batch))
    (kept, kept_metrics), (recomputed, recomputed_metrics) = results
    assert jax.tree_util.tree_structure(kept.params) == jax.tree_util.tree_structure(
        recomputed.params)
    for name in ("loss", "grad_norm"):
        np.testing.assert_allclose(recomputed_metrics[name], kept_metrics[name], rtol=1e-6)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                           recomputed.params, kept.params)
