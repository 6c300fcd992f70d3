"""The device mesh a run trains on (``train.mesh``) and the one table that lays logical axes
out on it (``attnjax.sharding`` applies both; ``attnjax.nn.axes`` names the logical axes)."""

from __future__ import annotations

import dataclasses

from attnjax.config.fields import INT32, Validated, number

MESH_AXES = ("data", "fsdp", "sequence", "tensor")
# the config fields that say where a run is placed, not what it computes: a run directory
# resumes with other values (attnjax.rundir)
PLACEMENT = "train.mesh."

# The logical axes of parameters and activations (attnjax.nn.axes), and where each goes:
# ``(logical axis, mesh axes)``, mesh axes joined by "+" to split one axis over several, or
# "none". The entries are applied in order (attnjax.sharding.spec): each gives its mesh axes
# to a dimension of its logical axis that has none yet, unless another dimension of the same
# array took them or their size does not divide it; a dimension no entry fits is not split.
# The batch is split over data and fsdp (FSDP is data parallelism whose parameters are split
# too: ZeRO-3, gathered layer by layer); every matrix over fsdp along its model width; heads,
# the MLP's width and the vocabulary over tensor (Megatron: query/key/value and the MLP's
# first matrix by column, the output projections by row); a vector of heads, MLP or
# vocabulary width (a bias, a learned scale) over tensor, or without one over fsdp, so that
# FSDP leaves nothing whole. Activations are split along their length over sequence (context
# parallelism: attention then runs a context-parallel kernel, ring or allgather, or lets the
# compiler gather keys and values).
RULES = (
    ("batch", "data+fsdp"),
    ("length", "sequence"),
    ("embed", "fsdp"),
    ("norm", "fsdp"),
    ("vocab", "tensor"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("vocab", "fsdp"),
    ("mlp", "fsdp"),
    ("heads", "fsdp"),
    ("kv_heads", "fsdp"),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_mlp", "tensor"),
)
LOGICAL_AXES = ("batch", "length", "vocab", "embed", "embed_out", "norm", "mlp", "heads",
                "kv_heads", "qkv", "head_dim", "position", "buckets", "types", "classes",
                "act_embed", "act_heads", "act_kv_heads", "act_mlp", "act_vocab")


def mesh_axes_of(target: str) -> tuple[str, ...]:
    """The mesh axes of a rule's target: ``"data+fsdp"`` -> ``("data", "fsdp")``, ``"none"``
    -> ``()``."""
    return () if target == "none" else tuple(target.split("+"))


@dataclasses.dataclass(frozen=True)
class MeshConfig(Validated):
    """The mesh's axis sizes, whose product is the device count across every process; one of
    them may be -1, the devices the others leave. ``data`` splits the batch; ``fsdp`` the batch
    and every parameter and optimizer moment; ``sequence`` the activations along their length;
    ``tensor`` the heads, the MLP's width and the vocabulary. ``rules``: ``[logical axis,
    mesh axes]`` entries that replace ``RULES``' entries for their logical axes (``attnjax
    info`` prints the table a config gives)."""
    PATH = "train.mesh"
    data: int = number(-1, ge=-1, le=INT32)
    fsdp: int = number(1, ge=-1, le=INT32)
    sequence: int = number(1, ge=-1, le=INT32)
    tensor: int = number(1, ge=-1, le=INT32)
    rules: tuple[tuple[str, ...], ...] = ()

    def _validate(self):
        sizes = self.sizes()
        for name, size in sizes.items():
            if size == 0:
                self._fail(name, "=0: an axis size is a positive number of devices, or -1 for "
                           "the devices the other axes leave")
        if list(sizes.values()).count(-1) > 1:
            raise ValueError(f"train.mesh has {list(sizes.values()).count(-1)} axes of size -1 "
                             f"({', '.join(n for n, s in sizes.items() if s == -1)}); at most "
                             "one may take the devices the others leave")
        for i, entry in enumerate(self.rules):
            if len(entry) != 2 or entry[0] not in LOGICAL_AXES:
                self._fail(f"rules[{i}]", f"={list(entry)} must be [logical axis, mesh axes] "
                           f"with a logical axis among {', '.join(LOGICAL_AXES)}")
            unknown = [a for a in mesh_axes_of(entry[1]) if a not in MESH_AXES]
            if unknown or not entry[1]:
                self._fail(f"rules[{i}]", f"={list(entry)}: mesh axes are {', '.join(MESH_AXES)} "
                           "joined by '+', or 'none'")

    def sizes(self) -> dict[str, int]:
        """``{axis: size}`` as configured (-1 unresolved)."""
        return {name: getattr(self, name) for name in MESH_AXES}

    def model_axes(self) -> bool:
        """Whether parameters are split (``fsdp`` or ``tensor`` not 1)."""
        return self.fsdp != 1 or self.tensor != 1

    def splits_a_run(self) -> bool:
        """Whether one run's parameters or activations are split (not ``data`` alone)."""
        return self.model_axes() or self.sequence != 1

    def table(self) -> tuple[tuple[str, str], ...]:
        """The rules in force: ``rules``' entries, then ``RULES``' for the other logical axes."""
        own = {logical for logical, _ in self.rules}
        return tuple(tuple(e) for e in self.rules) + tuple(
            entry for entry in RULES if entry[0] not in own)
