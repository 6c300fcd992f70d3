"""The PNG plots of a sweep report, drawn from data :mod:`attnjax.analysis.report` prepares.

- :func:`plot_loss_curves`: train loss (solid) and validation loss (dashed, dots) against step,
  mean over seeds with a min-max band; the whole run on a log scale and the second half zoomed.
- :func:`plot_final`: final validation loss (mean, std error bars) against one axis's values,
  one line per combination of the other axes.
- :func:`plot_extrapolation`: validation loss against evaluation length (log2 axis), one line
  per configuration and per evaluation variant, training length dashed; values far above the
  rest are drawn at a cap and labelled with their true value.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
from matplotlib.artist import setp
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter
from matplotlib.transforms import offset_copy

from attnjax.analysis.figures import subplots

LOSS_LABEL = "loss (nats/token)"
CAP_FACTOR = 10.0       # extrapolation: values above CAP_FACTOR x the lowest are capped
DPI = 120


def colors(n: int) -> list:
    """``n`` distinguishable colours: tab10, tab20, then a sampled viridis."""
    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        cmap = matplotlib.colormaps["tab20"]
        return [cmap(i) for i in range(n)]
    return [matplotlib.colormaps["viridis"](i / (n - 1)) for i in range(n)]


def _legend_outside(fig, ax, handles=None, labels=None, title=None):
    """A legend to the right of the axes, in two columns when it is long."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    ncol = 1 if len(handles) <= 18 else 2
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8,
               ncol=ncol, title=title, title_fontsize=8, frameon=False)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def log_ticks(low: float, high: float) -> list[float]:
    """Round tick values in ``[low, high]`` for a log axis, at most ten where possible: the
    finest of 12, 8, 3 or 1 per decade (1, 1.2, 1.4, ... 8; 1, 1.5, 2, ... 8; 1, 2, 5; 1)."""
    for mantissas in ((1, 1.2, 1.4, 1.6, 1.8, 2, 2.5, 3, 4, 5, 6, 8), (1, 1.5, 2, 3, 4, 5, 6, 8),
                      (1, 2, 5), (1,)):
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(low)) - 1,
                                               math.ceil(math.log10(high)) + 1)
                 for m in mantissas]
        ticks = [t for t in ticks if low <= t <= high]
        if len(ticks) <= 10:
            return ticks
    return ticks


def _log_y(ax, low: float, high: float):
    """A log y axis with round, plainly written ticks between ``low`` and ``high``."""
    ax.set_yscale("log")
    ticks = log_ticks(low, high)
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_formatter(NullFormatter())


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return "-" if value is None else str(value)


def plot_loss_curves(curves: list[dict], path: str | Path) -> Path:
    """``curves``: ``{"label", "train": (steps, mean, lo, hi), "val": same or None}`` per
    configuration. Left: the whole run (log loss); right: the second half, zoomed."""
    fig, (full, zoom) = subplots(1, 2, figsize=(12, 4.8))
    last = max(c["train"][0][-1] for c in curves)
    zoom_values = []
    for curve, color in zip(curves, colors(len(curves))):
        for ax in (full, zoom):
            steps, mean, lo, hi = curve["train"]
            ax.plot(steps, mean, color=color, lw=1.4, label=curve["label"])
            ax.fill_between(steps, lo, hi, color=color, alpha=0.18, lw=0)
            if curve["val"]:
                vsteps, vmean, vlo, vhi = curve["val"]
                ax.plot(vsteps, vmean, color=color, ls="--", marker="o", ms=3.5, lw=1)
        for steps, _, lo, hi in filter(None, (curve["train"], curve["val"])):
            zoom_values += [v for s, a, b in zip(steps, lo, hi) if s >= last / 2
                            for v in (a, b) if math.isfinite(v)]
    everything = [v for c in curves for part in (c["train"], c["val"]) if part
                  for v in part[2] + part[3] if math.isfinite(v)]
    if everything and min(everything) > 0:
        _log_y(full, min(everything), max(everything))
    full.set_title("Whole run (log scale)")
    zoom.set_xlim(last / 2, last * 1.01)
    if zoom_values:
        low, high = min(zoom_values), max(zoom_values)
        pad = 0.05 * (high - low) or 0.05 * abs(high) or 0.05
        zoom.set_ylim(low - pad, high + pad)
    zoom.set_title("Second half of training (zoom)")
    for ax in (full, zoom):
        ax.set_xlabel("training step")
        ax.set_ylabel(LOSS_LABEL)
        ax.grid(alpha=0.3, which="both")
    handles, labels = full.get_legend_handles_labels()
    style = [Line2D([], [], color="k", lw=1.4), Line2D([], [], color="k", ls="--", marker="o",
                                                      ms=3.5, lw=1)]
    _legend_outside(fig, full, handles + style, labels + ["train loss", "validation loss"],
                    title="configuration")
    fig.suptitle("Loss curves: mean over seeds, band = min-max over seeds")
    fig.tight_layout()
    return _save(fig, path)


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def plot_final(axis: str, lines: list[dict], path: str | Path) -> Path:
    """``lines``: ``{"label", "x", "mean", "std"}`` (std None for one seed). Numeric axis
    values on a numeric scale (log when they span 8x or more), others as categories."""
    fig, ax = subplots(figsize=(7.5, 4.8))
    numeric = _numeric([v for line in lines for v in line["x"]])
    if not numeric:     # categories by their text (lists and None are values too)
        lines = [{**line, "x": [_text(v) for v in line["x"]]} for line in lines]
    values = list(dict.fromkeys(v for line in lines for v in line["x"]))
    logx = numeric and min(values) > 0 and max(values) / min(values) >= 8
    position = {v: i for i, v in enumerate(values)}
    for k, (line, color) in enumerate(zip(lines, colors(len(lines)))):
        order = sorted(range(len(line["x"])),
                       key=lambda i: line["x"][i] if numeric else position[line["x"][i]])
        xs = [line["x"][i] if numeric else position[line["x"][i]] for i in order]
        errors = [line["std"][i] or 0.0 for i in order]
        # each line shifted a few points sideways so that error bars do not overlap
        shift = (k - (len(lines) - 1) / 2) * min(6.0, 40.0 / len(lines))
        means = [line["mean"][i] for i in order]
        ax.errorbar(xs, means, yerr=errors, color=color, marker="o", ms=5, capsize=3, lw=1.4,
                    label=line["label"] or None,
                    transform=offset_copy(ax.transData, fig=fig, x=shift, units="points"))
        # an offset transform hides the points from autoscaling: add them by hand
        ax.update_datalim([(x, m + sign * e) for x, m, e in zip(xs, means, errors)
                           for sign in (-1, 1)])
    ax.autoscale_view()
    if logx:
        ax.set_xscale("log", base=2 if all(_is_power_of_two(v) for v in values) else 10)
    if numeric:
        ax.set_xticks(sorted(values), [_text(v) for v in sorted(values)])
        ax.minorticks_off()
    else:
        ax.set_xticks(range(len(values)), [_text(v) for v in values])
        ax.set_xlim(-0.5, len(values) - 0.5)
    if len(values) > 8:
        setp(ax.get_xticklabels(), rotation=45, ha="right")
    ax.set_xlabel(axis + (" (log scale)" if logx else ""))
    ax.set_ylabel("final validation " + LOSS_LABEL)
    ax.set_title(f"Final validation loss vs {axis}\n(mean over seeds, error bars = std)")
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        _legend_outside(fig, ax, title="other axes")
    fig.tight_layout()
    return _save(fig, path)


def _is_power_of_two(value) -> bool:
    return value > 0 and float(value).is_integer() and int(value) & (int(value) - 1) == 0


def plot_extrapolation(rows: list[dict], train_lengths: list[int], path: str | Path) -> Path:
    """``rows``: ``{"label", "group", "variant", "losses": {length: (mean, std, n)}}``; a
    variant is dashed in its configuration's colour. Losses above ``CAP_FACTOR`` times the
    lowest one (and non-finite ones) are drawn at that cap as triangles with their value."""
    fig, ax = subplots(figsize=(9, 5.2))
    finite = [m for row in rows for m, _, _ in row["losses"].values() if math.isfinite(m)]
    low, high = (min(finite), max(finite)) if finite else (1.0, 1.0)
    cap = CAP_FACTOR * low if low > 0 else math.inf
    logy = low > 0 and high / low >= 3
    palette = colors(max((row["group"] for row in rows), default=0) + 1)
    lengths = sorted({n for row in rows for n in row["losses"]})
    clipped = []
    for row in rows:
        xs = sorted(row["losses"])
        means = [row["losses"][n][0] for n in xs]
        stds = [row["losses"][n][1] or 0.0 for n in xs]
        shown = [m if math.isfinite(m) and m <= cap else cap for m in means]
        color = palette[row["group"]]
        variant = row["variant"] is not None
        ax.errorbar(xs, shown, yerr=[s if m == v else 0 for s, m, v in zip(stds, means, shown)],
                    color=color, ls="--" if variant else "-", marker="s" if variant else "o",
                    ms=4.5, capsize=3, lw=1.4, label=row["label"])
        for n, m, v in zip(xs, means, shown):
            if m != v:
                clipped.append((n, m, color))
    stacked: dict[int, int] = {}
    for n, m, color in clipped:     # labels of one length stacked below the cap
        stacked[n] = stacked.get(n, 0) + 1
        ax.plot([n], [cap], marker="^", ms=9, color=color, ls="none")
        ax.annotate(f"{m:.3g}", (n, cap), textcoords="offset points",
                    xytext=(0, -6 - 10 * stacked[n]), ha="center", fontsize=7, color=color)
    for k, n in enumerate(train_lengths):
        ax.axvline(n, color="0.35", ls=":", lw=1.2,
                   label="training length" if k == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    if logy:
        _log_y(ax, low, min(high, cap))
    if clipped:
        ax.set_ylim(top=cap * (1.08 if logy else 1.03))
    ax.set_xlabel("evaluation length (tokens, log2 scale)")
    ax.set_ylabel("validation " + LOSS_LABEL + (", log scale" if logy else ""))
    odd = " or not finite" if any(not math.isfinite(m) for _, m, _ in clipped) else ""
    note = f"\n▲ = above {cap:.3g}{odd}, drawn at the cap (true value below)" if clipped else ""
    ax.set_title("Length extrapolation: validation loss vs evaluation length\n"
                 "(mean over seeds, error bars = std; dashed = evaluation variant)" + note,
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    _legend_outside(fig, ax, title="configuration")
    fig.tight_layout()
    return _save(fig, path)
