"""Typed, frozen, validated configuration: dataclasses, dict/JSON round-trip, dotted overrides.

Every field is checked when a config is built, with a one-line ``ValueError`` that names the
dotted field (``model.attention.num_heads``) and, for a choice, the valid values:

- its type, its valid range, and the condition under which it means anything, all declared
  once, on the field's own line (``attnjax.config.fields``: ``number``, ``choice``, ``when``);
- a choice that is a registry name (kernel, position encoding, qk-norm, scale policy, sink,
  dropout placement, data task) is looked up in ``attnjax.registry``;
- a field that only one registry entry reads (``qk_kappa`` for ``qk_norm='kappa'``,
  ``block_q`` for the chunked kernel, the ``rope_*`` fields for RoPE, ...) is refused under any
  other entry when it is set to anything but its default: it would mean nothing;
- impossible combinations (width not divisible by heads, a kernel that cannot honour an option,
  ``attnjax.config.kernel``; a learned position table evaluated past its rows) fail here,
  before anything is traced, compiled or written.

Modules: ``fields`` (declarations, checks, dict / JSON / overrides), ``kernel`` (the kernel a
model runs and the options it asks), ``model`` (attention, position, model), ``run`` (data,
train, the top-level ``Config``).
"""

from attnjax.config.fields import (apply_overrides, field_default, from_dict, from_json,
                                   parse_overrides, program_arguments, range_text, to_dict,
                                   to_json)
from attnjax.config.mesh import MeshConfig
from attnjax.config.model import AttentionConfig, ModelConfig, PositionConfig
from attnjax.config.run import Config, DataConfig, TrainConfig
