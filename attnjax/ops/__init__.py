"""Pure jax.numpy attention math: kernels, masks, position encodings. No Flax, no configs."""

from attnjax.ops import chunked, triangular, xla, linear, masked_fill  # noqa: F401  (in order)
from attnjax.ops import context  # noqa: F401  (ring and allgather run chunked on one device)
from attnjax.ops import flash  # noqa: F401  (after context, whose bias closure it uses)
from attnjax.ops.attention import (OPTIONS, Dropout, KernelSpec, check_kernel_supports,
                                   dot_product_attention, dropout_keep, requested_options)
from attnjax.ops.chunked import chunked_attention
from attnjax.ops.linear import elu_feature_map, linear_attention
from attnjax.ops.masks import (MaskSpec, block_causal_mask, causal_mask, combine_masks,
                               lengths_to_valid, mask_value, padding_mask, segment_mask,
                               sliding_window_mask, visibility)
from attnjax.ops.positions import (ROPE_SCHEDULES, alibi_bias, alibi_slopes, apply_rope,
                                   rope_frequencies, rope_rotary_dim, sinusoidal_embedding,
                                   sinusoidal_table, t5_bias, t5_relative_position_bucket)
