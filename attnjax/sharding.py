"""Where a run's arrays live on its mesh: the mesh from ``train.mesh``, every parameter's and
optimizer moment's sharding from its logical axes (``attnjax.nn.axes``) and the rules table
(``attnjax.config.mesh``), and the refusals of meshes a config cannot use.

A parameter of logical axes ``(a_1, ..., a_r)`` gets a ``PartitionSpec`` from the rules
table, applied in order (``spec``): each rule gives its mesh axes to a dimension of its
logical axis, unless another dimension took them or they do not divide it. Adam's moments are
laid out as their parameters, the step and counters replicated. With ``fsdp = F`` and
``tensor = T`` a matrix ``[d, h]`` of axes ``(embed, mlp)`` is held as ``[d / F, h / T]`` on
each device; the compiler gathers it over ``fsdp`` in the layer that uses it (ZeRO-3) and
sums its gradient back to the shards (XLA:CPU all-reduces it and keeps its slice).

References: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models"; Shoeybi et al. 2019, "Megatron-LM" (tensor parallelism by column, then by
row).
"""

from __future__ import annotations

import contextlib
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from attnjax.config import Config, ModelConfig, apply_overrides
from attnjax.config.mesh import MESH_AXES, MeshConfig, mesh_axes_of
from attnjax.models import build
from attnjax.nn import axes
from attnjax.nn.transformer import mlp_width
from attnjax.ops import context
from attnjax.train.optim import make_optimizer


def mesh_sizes(mesh: MeshConfig, devices: int) -> dict[str, int]:
    """``{axis: size}`` for ``devices`` devices, the ``-1`` axis resolved; a product other
    than the device count is refused in one line."""
    sizes = mesh.sizes()
    known = math.prod(size for size in sizes.values() if size != -1)
    for name, size in sizes.items():
        if size == -1:
            sizes[name] = devices // known if devices % known == 0 else 0
    if math.prod(sizes.values()) != devices:
        given = " x ".join(f"{name}={size}" for name, size in mesh.sizes().items())
        raise ValueError(f"train.mesh {given} does not fit {devices} device(s): the sizes' "
                         f"product must be the device count across processes (one axis may "
                         "be -1: the devices the others leave)")
    return sizes


def make_mesh(mesh: MeshConfig, devices) -> Mesh:
    """The ``data x fsdp x tensor`` mesh of ``devices`` (every process's, in ``jax.devices``
    order: a process's devices are neighbours along the last axes)."""
    devices = list(devices)
    sizes = mesh_sizes(mesh, len(devices))
    return jax.make_mesh(tuple(sizes[a] for a in MESH_AXES), MESH_AXES,
                         (AxisType.Auto,) * len(MESH_AXES), devices=devices)


def check(config: Config, devices: int) -> None:
    """Refuse, in one line and before anything compiles, a mesh this config cannot train on:
    its size, a batch its data axes do not divide, a length its sequence axis does not divide,
    and tensor parallelism over heads or an MLP width it does not divide, or over a layout
    whose heads are not one axis."""
    sizes = mesh_sizes(config.train.mesh, devices)
    cfg, model = config.train, config.model
    rows = sizes["data"] * sizes["fsdp"]
    if cfg.batch_size % (rows * cfg.grad_accum):
        raise ValueError(f"train.batch_size={cfg.batch_size} must be divisible by the mesh's "
                         f"data x fsdp = {rows} x train.grad_accum={cfg.grad_accum}")
    # the context-parallel kernels lay a causal sequence out in 2 chunks per device (zig-zag)
    chunks = sizes["sequence"] * (2 if model.attention.kernel in context.KERNEL_NAMES
                                  and model.causal and model.window is None else 1)
    for name, length in zip(("data.length", *("data.eval_lengths",) * len(
            config.data.eval_lengths)), config.data.lengths):
        if length % chunks:
            raise ValueError(f"train.mesh.sequence={sizes['sequence']} splits {name}="
                             f"{length} into {chunks} equal chunks (model.attention.kernel="
                             f"{model.attention.kernel!r}): it must divide")
    check_model(model, sizes)


def check_model(model: ModelConfig, sizes: dict[str, int]) -> None:
    """The refusals of ``check`` that concern the model alone (tensor parallelism), for a
    mesh of ``sizes`` that trains or decodes it."""
    tensor = sizes["tensor"]
    if tensor == 1:
        return
    att = model.attention
    if att.fused_qkv or att.per_head_projections:
        field = "fused_qkv=True" if att.fused_qkv else "per_head_projections=True"
        raise ValueError(f"model.attention.{field} has no axis of query heads to split over "
                         f"train.mesh.tensor={tensor}: set model.attention.fused_qkv=false "
                         "(the separate layout: the same function, its own parameters)")
    if att.num_heads % tensor:
        raise ValueError(f"train.mesh.tensor={tensor} must divide model.attention.num_heads="
                         f"{att.num_heads}")
    if mlp_width(model) % tensor:
        raise ValueError(f"train.mesh.tensor={tensor} must divide the MLP's width "
                         f"{mlp_width(model)} (model.mlp_hidden / mlp_ratio)")


def mesh_overrides(text: str) -> dict:
    """``"fsdp=2,tensor=2"`` (a command's ``--mesh`` or ``--meshes`` entry) -> the
    ``train.mesh`` overrides it names, ``data`` taking the devices left (-1)."""
    sizes = {"data": -1, "fsdp": 1, "sequence": 1, "tensor": 1}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if name not in sizes or not size.lstrip("-").isdigit():
            raise ValueError(f"mesh {text!r}: write AXIS=SIZE[,AXIS=SIZE] with axes "
                             f"{', '.join(sizes)}")
        sizes[name] = int(size)
    return {f"train.mesh.{name}": size for name, size in sizes.items()}


def inference_mesh(config: Config, text: str, devices) -> tuple[Config, Mesh]:
    """The config with the mesh ``text`` names (``mesh_overrides``) and that mesh over
    ``devices``, refused in one line where the model cannot be split so (decoding: the
    training batch and length do not matter, and a step of one token splits no sequence)."""
    config = apply_overrides(config, mesh_overrides(text))
    if config.train.mesh.sequence != 1:
        raise ValueError(f"mesh {text!r}: decoding feeds one token per step, which no "
                         "sequence axis can split; use data, fsdp and tensor")
    devices = list(devices)
    check_model(config.model, mesh_sizes(config.train.mesh, len(devices)))
    return config, make_mesh(config.train.mesh, devices)


def place_parameters(config: Config, params, mesh: Mesh):
    """``params`` (host or one device's) split over ``mesh`` as the rules say, shard by
    shard."""
    return jax.device_put(params, Layout(config, mesh).parameters())


def traced_on(config: Config, mesh: Mesh | None):
    """Decorator: the function traced within ``config``'s activation layout on ``mesh``
    (``Layout.activations``); unchanged without a mesh."""
    def decorate(fn):
        if mesh is None:
            return fn

        @functools.wraps(fn)
        def traced(*args):
            with Layout(config, mesh).activations():
                return fn(*args)
        return traced
    return decorate


def spec(names, shape, sizes: dict[str, int], table) -> PartitionSpec:
    """The mesh axes of an array of logical axes ``names`` and ``shape`` under the rules
    ``table``. The rules are taken in the table's order, each giving its mesh axes (those of
    size > 1; a rule with none is passed over) to the first dimension of its logical axis not
    yet given any, when they are not taken by another dimension and their size divides it; so
    each logical axis gets its first rule that fits, and a dimension none fits is not split.
    Trailing ``None``s are dropped."""
    taken, parts = set(), [None] * len(names)
    for logical, target in table:
        used = tuple(a for a in mesh_axes_of(target) if sizes[a] > 1)
        if not used or taken & set(used):
            continue
        for i, (name, size) in enumerate(zip(names, shape)):
            if name == logical and parts[i] is None and size % math.prod(
                    sizes[a] for a in used) == 0:
                parts[i] = used[0] if len(used) == 1 else used
                taken |= set(used)
                break
    while parts and parts[-1] is None:
        parts.pop()
    return PartitionSpec(*parts)


@functools.lru_cache(maxsize=32)
def _declared(model: ModelConfig):
    """The model's parameters as ``jax.ShapeDtypeStruct``s and their logical axes."""
    module = build(model)
    with axes.declaring():
        boxed = jax.eval_shape(lambda: module.init(jax.random.key(0),
                                                   jnp.zeros((1, 1), jnp.int32))["params"])
    return nn.unbox(boxed), nn.get_partition_spec(boxed)


def parameter_axes(model: ModelConfig):
    """The logical axes of every parameter (a tree of ``PartitionSpec``s of logical names;
    ``PartitionSpec()`` for one made without ``attnjax.nn.axes.with_axes``)."""
    return _declared(model)[1]


def layout_lines(config: Config, devices: int) -> list[str]:
    """The mesh ``config`` gives ``devices`` devices, and each parameter's logical axes, mesh
    axes and the shape one device holds (``attnjax info CONFIG``)."""
    sizes = mesh_sizes(config.train.mesh, devices)
    check(config, devices)
    table = config.train.mesh.table()
    shapes, names = _declared(config.model)
    lines = [f"mesh {' x '.join(f'{a}={s}' for a, s in sizes.items())} over {devices} "
             "device(s)", f"  {'parameter':<40} {'shape':<16} {'logical axes':<36} "
             f"{'mesh axes':<24} per device"]
    flat = jax.tree_util.tree_leaves(names, is_leaf=lambda x: isinstance(x, PartitionSpec))
    for (path, shape), logical in zip(jax.tree_util.tree_leaves_with_path(shapes), flat):
        mesh = spec(tuple(logical), shape.shape, sizes, table)
        held = [n // math.prod(sizes[a] for a in ((m,) if isinstance(m, str) else m or ()))
                for n, m in zip(shape.shape, tuple(mesh) + (None,) * len(shape.shape))]
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        lines.append(f"  {name:<40} {str(shape.shape):<16} {str(tuple(logical)):<36} "
                     f"{str(tuple(mesh)):<24} {tuple(held)}")
    return lines


class Layout:
    """A mesh and the rules table in force: ``parameters`` and ``state`` shardings, and the
    activations' (``constrain`` inside a program traced under ``activations``)."""

    def __init__(self, config: Config, mesh: Mesh):
        self.config, self.mesh = config, mesh
        self.sizes = dict(zip(mesh.axis_names, mesh.devices.shape))
        self.table = config.train.mesh.table()
        self.replicated = NamedSharding(mesh, PartitionSpec())

    def sharding(self, names, shape) -> NamedSharding:
        return NamedSharding(self.mesh, spec(names, shape, self.sizes, self.table))

    def parameters(self):
        """The sharding of every parameter of the config's model."""
        shapes, names = _declared(self.config.model)
        return jax.tree_util.tree_map(lambda s, n: self.sharding(tuple(n), s.shape), shapes,
                                      names, is_leaf=lambda x: isinstance(x, PartitionSpec))

    def state(self, abstract_state):
        """The sharding of every leaf of a ``TrainState`` (``jax.eval_shape`` of one): the
        parameters', each optimizer moment as its parameter, the rest replicated."""
        params = self.parameters()
        moments = optax.tree_map_params(
            make_optimizer(self.config.train), lambda _, sharding: sharding,
            abstract_state.opt_state, params,
            transform_non_params=lambda _: self.replicated)
        return abstract_state.replace(step=self.replicated, skipped=self.replicated,
                                      params=params, opt_state=moments)

    def batch(self, leading: int = 0) -> NamedSharding:
        """A batch's sharding: its rows (after ``leading`` unsplit axes) over the data axes."""
        rows = spec(("batch",), (math.prod(self.sizes.values()),), self.sizes, self.table)
        return NamedSharding(self.mesh, PartitionSpec(*(None,) * leading, *rows))

    @contextlib.contextmanager
    def activations(self):
        """A context within which ``attnjax.nn.axes.constrain`` lays activations out and, on a
        mesh with a ``sequence`` axis, the context-parallel kernels (``ring``, ``allgather``)
        split the sequence over it (``ops.context.sequence_parallel``)."""
        with axes.laid_out(self.sharding), context.sequence_parallel(self.mesh, "sequence"):
            yield
