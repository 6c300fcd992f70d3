"""The attention explorer: every layer and head of a run on one probe, token by token, in one
self-contained HTML file (``attnjax explore``).

    write_explorer("runs/base", "runs/base/explorer.html", text="def main(argv):")

The page is written by hand (``explorer_page/``: ``page.html``, ``explorer.css``,
``explorer.js``; no library, no build step) and its data is one JSON object inside it, so the
file opens from disk in a current browser, with no server and no network request. Its views:
every head as a small map with its statistics on hover (model view); one head with its tokens
written out, as lines from each query to each key or as a labelled matrix, a token's row or
column on hover, layer and head on the arrow keys (head view); several heads at once, each in
its colour (overlay); and a sortable table of the per-head statistics. Each family's head
groups (``heads.head_groups``) are there: a decoder's or an encoder's self-attention, and an
encoder–decoder's decoder self-attention, cross-attention (target queries over source keys)
and encoder self-attention.

Per example of the probe and head group the file holds the weights ``[layers, heads, T, S]``
over the example's real tokens (a padded batch's pads left out), cut to the first
``max_tokens`` queries and keys, and quantised for display to one byte, ``q = round(255 w)``
(base64): the page shows ``q / 255``, within ``1/510`` of the float32 weight. That is ``L N T
S`` bytes, 4/3 of it in the file: 6 layers of 12 heads on 64 tokens is 295 kB of weights, a
0.4 MB file. Per head group, the per-head statistics over the whole probe, from the float32
weights before any cut: ``diagnostics.head_statistics`` for the self-attention, with the share
on [CLS] and on [SEP] (``ops.stats.attention_to``) for a family that marks them
(``Family.marked``), and ``heatmaps.stream_statistics`` for an encoder–decoder's other two;
and the per-head shares that ``attnjax patch`` (``patching.md``) and ``attnjax heads``
(``knockout.md``) wrote, read from their tables.
"""

from __future__ import annotations

import base64
import html
import json
import re
import sys
from pathlib import Path

import numpy as np
from matplotlib import colormaps

from attnjax.analysis.capture import attention_weights, model_arguments, stream_attention
from attnjax.analysis.diagnostics import head_statistics
from attnjax.analysis.heads import SELF, head_groups
from attnjax.analysis.heatmaps import (check_probe_arguments, checked_probe, probe_config,
                                       stream_statistics, token_labels, truncate)
from attnjax.config import Config
from attnjax.models import family
from attnjax.nn.slots import visible_keys
from attnjax.ops import stats as stats_ops
from attnjax.outputs import output_file

PAGE = Path(__file__).with_name("explorer_page")
SCALE = 255                     # a weight w is stored as round(SCALE * w), one byte
MAX_TOKENS = 128

# name -> (label, what it is); the statistics of diagnostics.head_statistics, the shares on
# the special tokens, and an encoder–decoder's cross-attention alignment
STATISTICS = {
    "entropy": ("entropy", "mean over the query rows of -sum p log p over the keys a query "
                "sees, in nats"),
    "norm_entropy": ("normalised entropy", "row entropy / log(keys the query sees): 1 = "
                     "uniform, 0 = one key"),
    "max_weight": ("max weight", "mean over the query rows of the largest weight"),
    "sink_mass": ("first-token share", "mean weight on the first key (an attention sink)"),
    "cls": ("[CLS] share", "mean weight on the [CLS] tokens"),
    "sep": ("[SEP] share", "mean weight on the [SEP] tokens"),
    "prev_token": ("previous-token share", "mean weight on key i - 1 of query i"),
    "induction": ("induction score", "mean weight on the keys just after an earlier "
                  "occurrence of the query's token (blank where the probe repeats none)"),
    "active_frac": ("share above 0.1", "share of the visible weights above 0.1"),
    "alignment": ("alignment", "share of target tokens whose largest weight is on the source "
                  "token they copy"),
    "max_logit": ("max logit", "largest scaled q.k over the visible pairs"),
    "q_norm": ("query norm", "RMS over tokens of the query vectors' norms"),
    "k_norm": ("key norm", "RMS over tokens of the key vectors' norms"),
    "pos_sim@10": ("position similarity @10", "how alike the position encoding makes "
                   "positions 0 and 10"),
    "pos_sim@100": ("position similarity @100", "how alike the position encoding makes "
                    "positions 0 and 100"),
}

# the columns of the tables of ``attnjax patch`` (patching.md) and ``attnjax heads``
# (knockout.md): header -> (label, what it is)
RESULTS = {
    "recovered by its clean output": ("patch: recovered", "share of the metric the head's "
                                      "clean output restores in the corrupted run"),
    "lost by its corrupted output": ("patch: lost", "share of the metric the head's corrupted "
                                     "output loses in the clean run"),
    "knockout delta loss": ("knockout: loss rise", "validation loss with the head knocked out "
                            "minus the loss with every head"),
    "importance (layer-normalised)": ("importance", "E|dL/d gate| of the head, L2-normalised "
                                      "per layer (Michel et al.)"),
}
RESULT_FILES = ("patching.md", "knockout.md")
_HEAD_CELL = re.compile(r"L(\d+)\.H(\d+)")


def quantise(weights) -> str:
    """``weights`` in [0, 1] as the base64 of the bytes ``round(255 w)`` (C order)."""
    q = np.rint(np.clip(np.asarray(weights, np.float32), 0.0, 1.0) * SCALE).astype(np.uint8)
    return base64.b64encode(q.tobytes()).decode("ascii")


def _titles(config: Config) -> dict[str, tuple[str, str, str]]:
    """group -> (title, query axis, key axis) of the family's head groups."""
    if "cross" in head_groups(config):
        return {SELF: ("decoder self-attention", "target", "target"),
                "cross": ("cross-attention", "target (query)", "source (key)"),
                "encoder": ("encoder self-attention", "source", "source")}
    causal = "causal" if family(config.model).causal else "bidirectional"
    return {SELF: (f"self-attention ({causal})", "query", "key")}


def group_weights(config: Config, params, probe: dict) -> dict[str, tuple]:
    """group -> ``(weights [layers, B, heads, T, S] float32, query tokens [B, T], real queries
    [B, T], key tokens [B, S], real keys [B, S])``: the self-attention over the probe's
    ``inputs`` (real: the scored positions of an encoder–decoder's target, else the
    ``token_mask`` of a padded batch, else all) and an encoder–decoder's ``cross`` (target over
    ``source``) and ``encoder`` (``source`` over itself, real where ``source_mask``)."""
    tokens, arguments = probe["inputs"], model_arguments(config, probe)
    if "source" in probe:
        real = np.asarray(probe["weights"]) > 0
    else:
        real = np.asarray(probe.get("token_mask", np.ones(tokens.shape, bool)), bool)
    out = {SELF: (attention_weights(config, params, tokens, arguments), tokens, real, tokens,
                  real)}
    streams = stream_attention(config, params, tokens, arguments)
    if streams:
        source, known = probe["source"], np.asarray(probe["source_mask"], bool)
        out["cross"] = (streams["cross"], tokens, real, source, known)
        out["encoder"] = (streams["encoder"], source, known, source, known)
    return out


def group_statistics(config: Config, params, probe: dict,
                     weights: dict[str, tuple]) -> dict[str, dict[str, np.ndarray]]:
    """group -> statistic -> ``[layers, heads]`` over the whole probe (see the module
    docstring); ``weights``: ``group_weights``."""
    tokens, arguments = probe["inputs"], model_arguments(config, probe)
    own = head_statistics(config, params, tokens, arguments)
    marked = family(config.model).marked(config.data)
    if marked:
        visible = visible_keys(config.model, tokens.shape[1], arguments.get("token_mask"))
        for name, token in marked.items():
            own[name] = np.asarray(stats_ops.attention_to(weights[SELF][0], tokens == token,
                                                          visible), np.float64)
    out = {SELF: own}
    if "cross" in weights:
        out.update(stream_statistics(probe, {name: weights[name][0]
                                             for name in ("cross", "encoder")}))
    return out


def _number(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return float("nan")             # "—": not measured


def read_result_tables(path) -> dict[str, dict[str, np.ndarray]]:
    """The per-head tables of a ``patching.md`` or ``knockout.md``: group -> column header ->
    ``[layers, heads]`` (NaN where a cell is not a number). A table is one whose header's first
    cell is ``head`` (the model's own heads) or ``<group> head`` and whose rows start
    ``L<l>.H<h>``."""
    found: dict[str, dict[str, dict]] = {}
    header = None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif header[0].endswith("head") and _HEAD_CELL.fullmatch(cells[0]):
            name = header[0].removesuffix("head").strip() or SELF
            at = tuple(int(x) for x in _HEAD_CELL.fullmatch(cells[0]).groups())
            for column, cell in zip(header[1:], cells[1:]):
                found.setdefault(name, {}).setdefault(column, {})[at] = _number(cell)
    tables = {}
    for name, columns in found.items():
        for column, cells in columns.items():
            L, N = (max(at[i] for at in cells) + 1 for i in (0, 1))
            values = np.full((L, N), np.nan)
            for at, value in cells.items():
                values[at] = value
            tables.setdefault(name, {})[column] = values
    return tables


def result_directories(run_dir) -> list[Path]:
    """The directories of ``run_dir`` that hold a ``patching.md`` or a ``knockout.md``
    (``attnjax patch`` / ``heads --out RUN/DIR``), sorted."""
    return sorted(path for path in Path(run_dir).iterdir()
                  if path.is_dir() and any((path / name).is_file() for name in RESULT_FILES))


def _columns(stats: dict, results: list[tuple[str, str, dict]], shape) -> tuple[list, dict]:
    """The page's columns of one head group (statistics, then each result that fits its
    ``shape``) and their values, JSON-ready (NaN as null)."""
    columns, values = [], {}

    def add(key, label, about, kind, array):
        values[key] = [[None if not np.isfinite(v) else float(v) for v in row]
                       for row in np.asarray(array, np.float64)]
        columns.append({"key": key, "label": label, "about": about, "kind": kind})

    order = list(STATISTICS)                  # the shares on special tokens beside the sink
    for name in sorted(stats, key=lambda n: order.index(n) if n in order else len(order)):
        add(name, *STATISTICS.get(name, (name, name)), "stat", stats[name])
    headers = [header for _, header, _ in results]
    for source, header, array in results:
        if np.shape(array) != shape:
            print(f"attnjax: {source}: its {header!r} table has {list(np.shape(array))} "
                  f"heads, the model {list(shape)}; left out", file=sys.stderr)
            continue
        label, about = RESULTS.get(header, (header, header))
        if headers.count(header) > 1:         # two directories of one command's results
            label = f"{label} ({Path(source).parent.name})"
        add(f"{source}:{header}", label, f"{about}; {source}", "share", array)
    return columns, values


def explorer_data(config: Config, params, probe: dict, *, title: str, subtitle: str = "",
                  max_tokens: int = MAX_TOKENS, results=()) -> dict:
    """The page's data (the module docstring): ``title`` / ``subtitle`` head the page;
    ``results``: files of ``attnjax patch`` or ``attnjax heads`` (``patching.md``,
    ``knockout.md``) whose per-head tables go beside the statistics."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    weights = group_weights(config, params, probe)
    stats = group_statistics(config, params, probe, weights)
    tables = [(str(path), read_result_tables(path)) for path in results]
    titles, shapes = _titles(config), head_groups(config)
    groups = []
    for name in weights:
        found = [(path, header, array) for path, table in tables
                 for header, array in table.get(name, {}).items()]
        columns, values = _columns(stats[name], found, shapes[name])
        title_of, query_axis, key_axis = titles[name]
        groups.append({"name": name, "title": title_of, "layers": shapes[name][0],
                       "heads": shapes[name][1], "query_axis": query_axis,
                       "key_axis": key_axis, "columns": columns, "values": values})
    examples = []
    for b in range(probe["inputs"].shape[0]):
        shown = {}
        for name, (w, queries, real_q, keys, real_k) in weights.items():
            rows, cols = np.flatnonzero(real_q[b]), np.flatnonzero(real_k[b])
            part = np.asarray(w)[:, b][:, :, rows][:, :, :, cols]      # [layers, heads, t, s]
            part, q_labels, k_labels, note = truncate(
                part, token_labels(np.asarray(queries)[b, rows], config.data), "", max_tokens,
                token_labels(np.asarray(keys)[b, cols], config.data))
            shown[name] = {"queries": q_labels, "keys": k_labels, "weights": quantise(part),
                           "note": note.strip(" ()")}
        examples.append({"name": f"example {b}", "groups": shown})
    colours = np.rint(colormaps["viridis"](np.linspace(0, 1, 256))[:, :3] * 255)
    return {"title": title, "subtitle": subtitle, "family": config.model.family,
            "scale": SCALE, "colormap": colours.astype(np.uint8).tobytes().hex(),
            "groups": groups, "examples": examples}


def render_page(data: dict) -> str:
    """The HTML of the page with ``data`` (``explorer_data``) inside: one file, no links out."""
    parts = {name: (PAGE / name).read_text(encoding="utf-8")
             for name in ("page.html", "explorer.css", "explorer.js")}
    # inside <script>, "</script" or "<!--" in a token would end or change the element: "<"
    # only occurs inside JSON strings, where "\u003c" is the same character
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    filled = {"TITLE": html.escape(data["title"]), "CSS": parts["explorer.css"],
              "JS": parts["explorer.js"], "DATA": payload}
    return re.sub(r"__(TITLE|CSS|JS|DATA)__", lambda m: filled[m[1]], parts["page.html"])


def write_explorer(run_dir, out, *, text: str | None = None, batch: int | None = None,
                   length: int | None = None, which: str = "best", max_tokens: int = MAX_TOKENS,
                   overrides=(), results=None) -> str:
    """Write the explorer of a run's checkpoint (``which``: best or latest) on a probe (``text``,
    else the first ``batch`` validation examples, default 4, of ``length`` tokens) to the file
    ``out``; ``overrides``: dotted ``KEY=VALUE`` config overrides for this evaluation;
    ``results``: directories of ``attnjax patch`` / ``attnjax heads`` output to show (default:
    those inside the run directory, ``result_directories``). Returns one line saying what was
    written."""
    check_probe_arguments(text=text, batch=batch, length=length, which=which)
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    out = output_file(out, "--out")
    run, config = probe_config(run_dir, overrides)
    directories = result_directories(run_dir) if results is None else [Path(r) for r in results]
    for directory in directories:
        if not directory.is_dir():
            raise ValueError(f"--results {str(directory)!r} is not a directory")
    probe, params, step = checked_probe(run, config, text=text, batch=batch, length=length,
                                        which=which)
    rows, T = probe["inputs"].shape
    source = (f"text probe of {T} tokens" if text is not None else
              f"{rows} validation example{'s' * (rows > 1)} of {T} tokens")
    files = [d / name for d in directories for name in RESULT_FILES if (d / name).is_file()]
    data = explorer_data(config, params, probe, title=f"{Path(run_dir).name} step {step}",
                         subtitle=f"attnjax explorer · {config.model.family} · {source}",
                         max_tokens=max_tokens, results=files)
    page = render_page(data)
    out.write_text(page, encoding="utf-8")
    groups = ", ".join(f"{g['title']} {g['layers']} x {g['heads']}" for g in data["groups"])
    extra = f"; with {', '.join(str(f) for f in files)}" if files else ""
    return (f"wrote {out} ({len(page.encode()) / 1e6:.2f} MB): {groups}, {source}{extra}; "
            "open it in a browser")
