"""Sweeps: expand an experiment's ``get_sweep()`` into named runs and launch them."""

from attnjax.sweep.spec import Run, cross, expand, product, run_name, zip_axes

__all__ = ["Run", "cross", "expand", "product", "run_name", "zip_axes"]
