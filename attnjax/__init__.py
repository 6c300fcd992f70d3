"""attnjax: a JAX/Flax research framework for attention mechanisms."""

import os

# Before JAX is imported (it reads this once, then): arrays that a traced function closes over
# reach its compiled program as arguments, not as constants embedded in it. Embedded, every
# program that draws batches of a text corpus carries its own copy of the corpus, in the memory
# it compiles in, in its executable and in each of its compilation-cache entries. JAX's coming
# default (docs.jax.dev, "Handling of closed-over constants"); a value already set is kept, and
# a process that imported JAX first keeps JAX's current default.
os.environ.setdefault("JAX_USE_SIMPLIFIED_JAXPR_CONSTANTS", "1")

from attnjax.config import (AttentionConfig, Config, ModelConfig,  # noqa: E402
                            PositionConfig, apply_overrides, from_dict, from_json, to_dict,
                            to_json)
from attnjax.registry import KERNELS, POSITIONS  # noqa: E402

__version__ = "0.1.0"
