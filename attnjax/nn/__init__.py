"""Thin Flax Linen modules: parameters and slots; all math lives in ``attnjax.ops``."""

from attnjax.nn.attention import MultiHeadAttention
from attnjax.nn.positions import PositionEncoding
from attnjax.nn.transformer import Block, FeedForward
