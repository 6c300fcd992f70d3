"""Model families (``attnjax.registry.MODELS``): ``family(config)`` and ``build(config)`` are
how everything above this package reaches a model. Importing it registers every family."""

from attnjax.models import decoder, encoder, seq2seq  # noqa: F401  they register the families
from attnjax.models.family import (Family, build, check_same_parameters, family, mean_pool,
                                   parameter_shapes)

__all__ = ["Family", "build", "check_same_parameters", "family", "mean_pool",
           "parameter_shapes"]
