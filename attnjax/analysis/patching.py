"""Capturing and patching the named points of a forward pass (``attnjax.nn.points``), as pure
functions over a model's ``apply``, for every family.

- ``point_names(config)``: every point of the model, in the order the forward pass reaches
  them (``block_0.resid_pre``, ``block_0.attention.q``, ..., ``block_1.resid_post``);
  ``match_points`` selects them by shell-style patterns (``block_*.attention.z``).
- ``run(config, params, batch, capture=..., patches=...)``: ``(logits, captured)``: the
  forward pass with ``patches`` (``{name: patch(...)}``) applied and the values of the
  ``capture`` points (after their patches) returned; jit-compiled once per selection.
- ``run_worlds``: the same over a leading "worlds" axis of the patches' arrays (``stack``):
  W interventions in one batched program instead of a loop of W passes, all in one vmapped
  pass or mapped over groups of worlds (``default_group``).
- ``patch``: ``where(where, value, x) + add`` at a point: activation patching (``value`` from
  another run, ``where`` selecting heads / positions), zero / mean / resample ablation
  (``ablation``: a value of zeros, of a mean, of another example's capture) and steering
  (``add``).
  ``heads_where`` and ``positions_where`` build ``where`` for a point's axes.

References: Meng et al. 2022, "Locating and Editing Factual Associations in GPT" (activation
patching); Wang et al. 2023, "Interpretability in the Wild" (path patching); Nanda and Bloom
2022, TransformerLens; penzai (batched interventions in JAX).
"""

from __future__ import annotations

import fnmatch
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

from attnjax.config import Config
from attnjax.models import build, family
from attnjax.nn.attention import MultiHeadAttention
from attnjax.nn.points import ATTENTION_POINTS, BLOCK_POINTS, CAPTURE, PATCH, SELECT
from attnjax.nn.transformer import Block

# the axis of heads and of positions in each kind of point (None: it has none)
HEAD_AXIS = {"q": 2, "k": 2, "v": 2, "z": 2, "scores": 1, "masked_scores": 1, "probs": 1}
POSITION_AXIS = {"q": 1, "k": 1, "v": 1, "z": 1, "scores": 2, "masked_scores": 2, "probs": 2,
                 "resid_pre": 1, "resid_mid": 1, "resid_post": 1}


def _arguments(config: Config, batch: dict) -> dict:
    return family(config.model).arguments(batch)


def point_names(config: Config, batch: dict) -> list[str]:
    """Every point of ``config``'s model on ``batch`` (its inputs and arguments), in forward
    order: per block its ``resid_pre``, its attention modules' points, ``resid_mid``,
    ``resid_post``."""
    found = []

    def note(module, method):
        if method == "__call__" and isinstance(module, (MultiHeadAttention, Block)):
            found.append((".".join(module.scope.path), isinstance(module, Block)))
        return False

    model = build(config.model)
    tokens = jnp.asarray(batch["inputs"])
    jax.eval_shape(lambda: model.init_with_output(
        jax.random.key(0), tokens, **_arguments(config, batch),
        capture_intermediates=note))
    blocks = list(dict.fromkeys(path for path, is_block in found if is_block))
    names = []
    for block in blocks:
        inside = [path for path, is_block in dict.fromkeys(found)
                  if not is_block and path.startswith(block + ".")]
        names += [f"{block}.resid_pre"]
        names += [f"{path}.{name}" for path in inside for name in ATTENTION_POINTS]
        names += [f"{block}.{name}" for name in BLOCK_POINTS[1:]]
    return names


def match_points(names: list[str], patterns) -> list[str]:
    """The names matching any of ``patterns`` (shell-style: ``*``, ``?``, ``[...]``), in
    forward order; a pattern that matches nothing is one line naming a few names."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    for pattern in patterns:
        if not fnmatch.filter(names, pattern):
            raise ValueError(f"point pattern {pattern!r} matches no point of this model; "
                             f"points are like {', '.join(names[:3])}, ... "
                             f"({len(names)} in all)")
    return [name for name in names if any(fnmatch.fnmatchcase(name, p) for p in patterns)]


def patch(value=0.0, *, where=True, add=0.0) -> dict:
    """A point's patch: ``where(where, value, x) + add`` (arrays broadcastable to the point;
    the defaults leave it alone but for the zeros ``value`` puts where ``where`` holds)."""
    return {"where": jnp.asarray(where, bool), "value": jnp.asarray(value, jnp.float32),
            "add": jnp.asarray(add, jnp.float32)}


ABLATIONS = ("zero", "mean", "resample")


def ablation(kind: str, captured, where=True, seed: int = 0) -> dict:
    """A patch ablating a point where ``where`` holds, from its ``captured`` value ``[B, ...]``
    on a reference batch: ``zero``; ``mean``, its mean over the batch's examples; ``resample``,
    another example's value (each example's a random other one's, from ``seed``)."""
    captured = jnp.asarray(captured)
    if kind == "zero":
        return patch(0.0, where=where)
    if kind == "mean":
        return patch(captured.mean(0, keepdims=True), where=where)
    if kind == "resample":
        B = captured.shape[0]
        if B < 2:
            raise ValueError("resample ablation needs a reference batch of >= 2 examples")
        shift = np.random.default_rng(seed).integers(1, B, size=B)   # never the example itself
        return patch(captured[(np.arange(B) + shift) % B], where=where)
    raise ValueError(f"ablation {kind!r} is not one of: {', '.join(ABLATIONS)}")


def _axis_where(shape_rank: int, axis: int, size: int, chosen) -> np.ndarray:
    where = np.zeros(size, bool)
    where[list(chosen)] = True
    shape = [1] * shape_rank
    shape[axis] = size
    return where.reshape(shape)


def heads_where(name: str, heads, num_heads: int) -> np.ndarray:
    """``where`` selecting ``heads`` of the point ``name`` (its head axis, ``HEAD_AXIS``)."""
    kind = name.rsplit(".", 1)[-1]
    if kind not in HEAD_AXIS:
        raise ValueError(f"point {name!r} has no head axis; points with one: "
                         f"{', '.join(HEAD_AXIS)}")
    return _axis_where(4, HEAD_AXIS[kind], num_heads, heads)


def positions_where(name: str, positions, length: int) -> np.ndarray:
    """``where`` selecting ``positions`` (query positions) of the point ``name``."""
    kind = name.rsplit(".", 1)[-1]
    rank = 3 if kind.startswith("resid") else 4
    return _axis_where(rank, POSITION_AXIS[kind], length, positions)


def _tree(names_to_values: dict) -> dict:
    return unflatten_dict({tuple(name.split(".")): value
                           for name, value in names_to_values.items()})


@functools.lru_cache(maxsize=16)
def _compiled(model_config, capture: tuple[str, ...], arguments: tuple[str, ...]):
    model = build(model_config)
    select = _tree(dict.fromkeys(capture, 0))

    def forward(params, inputs, arguments_values, patches):
        variables = {"params": params, **({PATCH: patches} if patches else {}),
                     **({SELECT: select} if select else {})}
        kwargs = dict(zip(arguments, arguments_values))
        if not select:
            return model.apply(variables, inputs, **kwargs)[0], {}
        (logits, _), state = model.apply(variables, inputs, **kwargs, mutable=[CAPTURE])
        captured = {".".join(path): values[0]
                    for path, values in flatten_dict(state[CAPTURE]).items()}
        return logits, {name: captured[name] for name in capture}

    return jax.jit(forward)


def run(config: Config, params, batch: dict, *, capture=(), patches=None):
    """``(logits, {name: value})``: the forward pass on ``batch`` with ``patches``
    (``{name: patch(...)}``) and the values of the ``capture`` points (names, in any order)."""
    arguments = _arguments(config, batch)
    names = tuple(capture)
    patches = _tree(patches) if patches else {}
    return _compiled(config.model, names, tuple(arguments))(
        params, jnp.asarray(batch["inputs"]), tuple(arguments.values()), patches)


def lower(config: Config, params, batch: dict, *, capture=(), patches=None):
    """The lowered program of ``run`` (``.as_text()``, ``.compile().memory_analysis()``)."""
    arguments = _arguments(config, batch)
    return _compiled(config.model, tuple(capture), tuple(arguments)).lower(
        params, jnp.asarray(batch["inputs"]), tuple(arguments.values()),
        _tree(patches) if patches else {})


def stack(patch_list: list[dict]) -> dict:
    """``[{name: patch}]`` of W interventions on the same points as one ``{name: patch}``
    whose arrays have a leading worlds axis of W (each broadcast to their common shape)."""
    names = list(patch_list[0])
    if any(list(p) != names for p in patch_list):
        raise ValueError("every world must patch the same points (patch a point with "
                         "patch(where=False) to leave it alone)")
    out = {}
    for name in names:
        out[name] = {}
        for field in ("where", "value", "add"):
            arrays = jnp.broadcast_arrays(*[jnp.asarray(p[name][field]) for p in patch_list])
            out[name][field] = jnp.stack(arrays)
    return out


# Sequences (worlds x examples) per group of a grouped ``run_worlds`` on a CPU, where groups
# of this size ran fastest (``attnjax bench patch``; docs/INTERPRETABILITY.md)
GROUP_SEQUENCES = 32


def group_of(examples: int) -> int:
    """Worlds per group when each world runs ``examples`` sequences: as many as make
    ``GROUP_SEQUENCES`` sequences (at least one)."""
    return max(1, GROUP_SEQUENCES // examples)


def default_group(batch: dict) -> int | None:
    """The ``group`` for ``run_worlds`` on ``batch``: on a CPU, ``group_of`` its examples;
    elsewhere ``None`` (one pass: an accelerator is fed best by the biggest batch that
    fits)."""
    if jax.default_backend() != "cpu":
        return None
    return group_of(np.shape(batch["inputs"])[0])


def run_worlds(config: Config, params, batch: dict, patches: dict, *, capture=(),
               group: int | None = None):
    """``run`` for each world of ``patches`` (``stack``: a leading axis W on every array), in
    one compiled program: ``(logits [W, ...], {name: [W, ...]})``. All W worlds run as one
    vmapped pass, or with ``group`` as a sequential map over groups of that many worlds
    (memory for ``group`` worlds at a time; on a CPU also faster where a group's activations
    stay in cache and all W worlds' do not: ``attnjax bench patch``)."""
    if group is not None and group < 1:
        raise ValueError(f"group must be >= 1 worlds (or None: all in one pass), got {group}")
    arguments = _arguments(config, batch)
    worlds = _worlds(config.model, tuple(capture), tuple(arguments), group)
    return worlds(params, jnp.asarray(batch["inputs"]), tuple(arguments.values()),
                  _tree(patches))


@functools.lru_cache(maxsize=16)
def _worlds(model_config, capture: tuple[str, ...], arguments: tuple[str, ...],
            group: int | None):
    forward = _compiled(model_config, capture, arguments)
    if group is None:
        return jax.jit(jax.vmap(forward, in_axes=(None, None, None, 0)))
    return jax.jit(lambda params, inputs, values, patches: jax.lax.map(
        lambda world: forward(params, inputs, values, world), patches, batch_size=group))
