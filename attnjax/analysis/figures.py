"""Figures drawn with matplotlib's object-oriented API: a plain ``Figure`` needs no backend and
keeps no global state, so the plotting modules work in any process (headless ones included)
and a figure is freed like any other object once saved."""

from __future__ import annotations

from matplotlib.figure import Figure


def subplots(nrows: int = 1, ncols: int = 1, *, figsize, layout: str | None = None, **kwargs):
    """``(figure, axes)`` of a new ``Figure(figsize=..., layout=...)``; ``kwargs`` go to
    ``Figure.subplots`` (``sharey``, ``squeeze``...). Write it with ``figure.savefig``."""
    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **kwargs)
