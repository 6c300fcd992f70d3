"""attnjax: a JAX/Flax research framework for attention mechanisms."""

from attnjax.config import (AttentionConfig, Config, ModelConfig, PositionConfig, apply_overrides,
                            from_dict, from_json, to_dict, to_json)
from attnjax.registry import KERNELS, POSITIONS

__version__ = "0.1.0"
