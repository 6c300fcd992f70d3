"""Compare two runs' checkpoints: config, parameters, attention patterns, validation loss.

``compare_runs(A, B, out)`` and ``compare_sweep(SWEEP, baseline, out)`` write ``report.md`` and
PNGs and return a short text summary. The math, as pure functions:

- parameters, for each path both runs have with one shape (``a`` from run A, the baseline):
  relative L2 ``||a - b||_2 / max(||a||_2, tiny)`` and cosine ``<a, b> / (||a|| ||b||)`` of the
  flattened tensors (1 for two zero tensors, NaN when exactly one is zero);
- attention, on one probe batch (``capture.probe_examples`` of run A's config): for each query
  row, the Jensen-Shannon divergence (``ops.stats.js_divergence``) of the two key
  distributions P (run A) and Q (run B), ``JS = KL(P||M)/2 + KL(Q||M)/2`` with
  ``M = (P + Q)/2``, natural log and ``0 log 0 = 0``, so ``0 <= JS <= ln 2`` (0 iff P = Q,
  ln 2 iff disjoint supports); then the mean over query rows (row 0 sees only itself: always
  0 for causal models) and examples, per layer and head.

Runs are only read: checkpoints are opened read-only, so a run that is still training (no
``summary.json`` and a fresh ``metrics.jsonl``, or an unfinished orbax save) is untouched.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from pathlib import Path

import jax
import numpy as np

from attnjax.analysis import compare_plots as plots
from attnjax.analysis.capture import attention_weights, model_arguments, probe_examples
from attnjax.config import Config
from attnjax.nn.transformer import VOCAB_PARAMS
from attnjax.ops.stats import cosine, js_divergence
from attnjax.outputs import output_directory
from attnjax.rundir import (ABSENT, WHICH, NoCheckpointError, RunDir, SweepDir, config_differences,
                            inside)

# ---------------------------------------------------------------------------------- the math

def relative_l2(a, b) -> float:
    """``||a - b||_2 / max(||a||_2, tiny)`` of the flattened arrays (relative to ``a``)."""
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if b.size != a.size:
        raise ValueError(f"b has {b.size} elements, a has {a.size}; they must match")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), np.finfo(np.float64).tiny))


def _natural(path: str):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path)]


def _flatten(params) -> dict:
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    name = lambda k: str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
    return {"/".join(map(name, path)): np.asarray(x) for path, x in leaves}


def parameter_differences(params_a, params_b) -> tuple[list[dict], list[dict]]:
    """``(rows, not_comparable)``: a row ``{path, shape, relative_l2, cosine}`` per parameter
    both trees have with one shape; ``{path, reason}`` for the rest. Paths ``a/b/c``, naturally
    sorted (``block_2`` before ``block_10``)."""
    flat_a, flat_b = _flatten(params_a), _flatten(params_b)
    rows, other = [], []
    for path in sorted(set(flat_a) | set(flat_b), key=_natural):
        if path not in flat_b:
            other.append({"path": path, "reason": "missing in B"})
        elif path not in flat_a:
            other.append({"path": path, "reason": "missing in A"})
        elif flat_a[path].shape != flat_b[path].shape:
            other.append({"path": path, "reason": f"shape {flat_a[path].shape} vs "
                                                  f"{flat_b[path].shape}"})
        else:
            a, b = flat_a[path], flat_b[path]
            rows.append({"path": path, "shape": a.shape, "relative_l2": relative_l2(a, b),
                         "cosine": cosine(a, b)})
    return rows, other


def attention_divergence(weights_a, weights_b) -> np.ndarray:
    """Mean JS divergence ``[layers, heads]`` over examples and query rows, for the layers and
    heads (by index) both ``[L, B, H, T, T]`` stacks have."""
    wa, wb = np.asarray(weights_a), np.asarray(weights_b)
    if wa.ndim != 5 or wb.ndim != 5 or wa.shape[1] != wb.shape[1] or wa.shape[3:] != wb.shape[3:]:
        raise ValueError(f"weights_b {wb.shape} and weights_a {wa.shape} must be [L, B, H, T, T] "
                         "of one probe batch")
    layers, heads = min(wa.shape[0], wb.shape[0]), min(wa.shape[2], wb.shape[2])
    js = js_divergence(wa[:layers, :, :heads], wb[:layers, :, :heads])   # [L, B, H, T]
    return js.mean(axis=(1, 3))


# ---------------------------------------------------------------------------------- the runs

@dataclasses.dataclass
class Run:
    """What a run directory holds, read once."""
    path: Path
    label: str
    config: Config
    config_dict: dict
    summary: dict | None
    metrics: list[dict]
    params: object = None
    step: int | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    _weights: dict = dataclasses.field(default_factory=dict, repr=False)

    def weights(self, probe: dict) -> np.ndarray:
        """The attention weights on a probe batch (``_probe``), computed once per probe."""
        key = b"".join(probe[name].tobytes() + str(probe[name].shape).encode()
                       for name in sorted(probe))
        if key not in self._weights:
            self._weights[key] = attention_weights(self.config, self.params, probe["inputs"],
                                                   model_arguments(self.config, probe))
        return self._weights[key]


@functools.lru_cache(maxsize=8)
def _probe(config: Config) -> dict[str, np.ndarray]:
    """The probe batch of run A's config (one per config: a sweep's baseline is probed once),
    with what its family's model reads of it (a padded batch's mask, segment ids)."""
    probe = probe_examples(config, seed=config.seed)
    for value in probe.values():
        value.flags.writeable = False
    return probe


def load_run(path: str | Path, label: str, which: str = "best") -> Run:
    """Read a run directory; ``ValueError`` if it is not one."""
    if which not in WHICH:
        raise ValueError(f"which={which!r} is not valid; choices: {', '.join(WHICH)}")
    run_dir = RunDir(path)
    config_dict = run_dir.config_dict()          # ValueError: not a run directory
    run = Run(run_dir.path, label, run_dir.config(), config_dict, run_dir.summary(),
              run_dir.metrics())
    running = run_dir.is_running()
    try:
        _, run.params, run.step = run_dir.params("latest" if running else which)
    except NoCheckpointError:
        pass                                     # compared on its config and metrics only
    logged = run.metrics[-1]["step"] if run.metrics else 0
    if run.params is None:
        run.notes.append(f"{label} has no usable checkpoint: only its config and metrics are "
                         "compared")
    elif running:
        run.notes.append(f"{label} is still running; compared its latest checkpoint at step "
                         f"{run.step}")
    elif run_dir.imported() is not None:
        run.notes.append(f"{label} is a model imported from {run_dir.imported()['source']} "
                         "(no training metrics)")
    elif run.summary is None:
        run.notes.append(f"{label} has no summary.json (stopped at step {logged} before "
                         f"finishing); compared its {which} checkpoint at step {run.step}")
    return run


def _attention_skip(a: Run, b: Run, length: int) -> str | None:
    """Why the attention comparison cannot run on A's probe of ``length``, or None."""
    for run in (a, b):
        if run.params is None:
            return f"{run.label} has no checkpoint"
    vocab = lambda r: (r.config.model.vocab_size, r.config.data.vocab_size)
    if vocab(a) != vocab(b):
        return (f"different vocabularies (model.vocab_size, data.vocab_size): {vocab(a)} in "
                f"{a.label}, {vocab(b)} in {b.label}")
    model = b.config.model
    if (length > model.max_length and model.position.kind == "learned"
            and not model.position.learned_interpolate):
        return (f"the probe has length {length} but {b.label}'s learned position table has "
                f"model.max_length={model.max_length} rows")
    return None


# ------------------------------------------------------------------------------ comparisons

def comparison(a: Run, b: Run, out_dir: Path) -> dict:
    """Every part of the comparison, as data, with its PNGs written into ``out_dir``."""
    output_directory(out_dir, "--out")
    result = {"a": a, "b": b, "notes": [*a.notes, *b.notes], "pngs": {},
              "config": config_differences(a.config_dict, b.config_dict)}
    if a.params is not None and b.params is not None:
        rows, other = parameter_differences(a.params, b.params)
        if (a.config.model.vocab_size, a.config.data.vocab_size) != (
                b.config.model.vocab_size, b.config.data.vocab_size):
            embedding = [r for r in rows if r["path"].split("/")[0] in VOCAB_PARAMS]
            rows = [r for r in rows if r not in embedding]
            other += [{"path": r["path"], "reason": "different vocabularies"} for r in embedding]
        result["params"] = (rows, other)
        if rows:
            result["pngs"]["params"] = plots.parameter_bars(rows, out_dir / "parameters.png",
                                                            a.label, b.label)
    result["attention_skip"] = _attention_skip(a, b, a.config.data.length)  # the probe's length
    if result["attention_skip"] is None:
        probe = _probe(a.config)
        tokens = probe["inputs"]
        result["probe"] = tokens.shape
        wa, wb = a.weights(probe), b.weights(probe)
        result["attention"] = attention_divergence(wa, wb)
        result["attention_shapes"] = ((wa.shape[0], wa.shape[2]), (wb.shape[0], wb.shape[2]))
        if tokens.shape[1] > b.config.model.max_length:
            result["notes"].append(f"the probe (length {tokens.shape[1]}) is longer than "
                                   f"{b.label}'s model.max_length={b.config.model.max_length}: "
                                   "its attention there is extrapolated")
        result["pngs"]["attention"] = plots.js_heatmap(result["attention"],
                                                       out_dir / "attention_js.png", a.label,
                                                       b.label)
    ev_a, ev_b = ((r.summary or {}).get("eval", {}) for r in (a, b))
    result["eval"] = [(length, ev_a[length], ev_b[length])
                      for length in sorted(set(ev_a) & set(ev_b), key=int)]
    result["eval_only"] = {a.label: sorted(set(ev_a) - set(ev_b), key=int),
                           b.label: sorted(set(ev_b) - set(ev_a), key=int)}
    if any("val_loss" in r for r in a.metrics + b.metrics):
        result["pngs"]["loss"] = plots.loss_curves(a.metrics, b.metrics,
                                                   out_dir / "loss_curves.png", a.label, b.label)
    return result


def _labels(path_a: Path, path_b: Path) -> tuple[str, str]:
    name_a, name_b = (Path(os.path.abspath(p)).name for p in (path_a, path_b))
    return (f"A ({name_a})", f"B ({name_b})") if name_a != name_b else ("A", "B")


def compare_runs(run_a, run_b, out_dir, *, which: str = "best") -> str:
    """Compare run B against run A; write ``out_dir/report.md`` and PNGs; return a summary."""
    label_a, label_b = _labels(run_a, run_b)
    a, b = load_run(run_a, label_a, which), load_run(run_b, label_b, which)
    out_dir = Path(out_dir)
    result = comparison(a, b, out_dir)
    report, summary = render_pair(result, which)
    (out_dir / "report.md").write_text(report)
    return summary + f"\nreport: {out_dir / 'report.md'}"


def compare_sweep(sweep_dir, baseline, out_dir, *, which: str = "best") -> str:
    """Compare every run of a sweep against ``baseline`` (a run directory, or the name of a run
    in the sweep); ``out_dir/report.md`` is the overview, ``out_dir/<run>/`` each comparison."""
    sweep, out_dir = SweepDir(sweep_dir), Path(out_dir)
    entries = sweep.record()["runs"]
    names = [entry["name"] for entry in entries]
    if RunDir(baseline).exists():
        base_dir = Path(baseline)
    elif str(baseline) in names and sweep.run(str(baseline)).exists():
        base_dir = sweep.run(str(baseline)).path
    else:
        raise ValueError(f"baseline {str(baseline)!r} is neither a run directory nor a started "
                         f"run of the sweep ({', '.join(names) or 'no runs'})")
    base = load_run(base_dir, f"baseline ({Path(os.path.abspath(base_dir)).name})", which)
    results = []
    for entry in entries:
        run_dir = sweep.run(entry["name"])
        if run_dir.path.resolve() == base_dir.resolve():
            continue
        if not run_dir.exists():
            results.append({"name": entry["name"], "status": entry.get("status", "?"),
                            "missing": "no config.json in its directory" if run_dir.path.is_dir()
                            else "no run directory yet"})
            continue
        run = load_run(run_dir.path, entry["name"], which)
        pair_dir = inside(out_dir, entry["name"], f"run name in {sweep.record_path}")
        result = comparison(base, run, pair_dir)
        report, _ = render_pair(result, which)
        (pair_dir / "report.md").write_text(report)
        results.append({"name": entry["name"], "status": entry.get("status", "?"),
                         "result": result})
    output_directory(out_dir, "--out")
    compared = [(item["name"], _stats(item["result"])) for item in results if "result" in item]
    overview = plots.sweep_overview(
        [name for name, _ in compared], [s["js"][0] if s["js"] else None for _, s in compared],
        [s["val"][1:] if s["val"] else None for _, s in compared], out_dir / "overview.png",
        base.label) if compared else None
    report, summary = render_sweep(base, results, overview, which)
    (out_dir / "report.md").write_text(report)
    return summary + f"\nreport: {out_dir / 'report.md'}"


# --------------------------------------------------------------------------------- the report

def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return "n/a" if math.isnan(x) else f"{x:.{digits}g}"
    return str(x)


def _table(header: list[str], rows: list) -> list[str]:
    cell = lambda c: str(c).replace("|", "\\|")
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows] + [""])


def _stats(result: dict) -> dict:
    """The headline numbers of one comparison (None where that part was not compared)."""
    a = result["a"]
    stats = {"config": [key for key, _, _ in result["config"]], "l2": None, "js": None,
             "val": None, "not_comparable": len(result.get("params", ((), ()))[1])}
    rows = result.get("params", ((), ()))[0]
    if rows:
        worst = max(rows, key=lambda r: r["relative_l2"])
        stats["l2"] = (float(np.median([r["relative_l2"] for r in rows])), worst["relative_l2"],
                       worst["path"])
    if "attention" in result:
        js = result["attention"]
        layer, head = np.unravel_index(np.argmax(js), js.shape)
        stats["js"] = (float(js.mean()), float(js[layer, head]), int(layer), int(head))
    evals = result["eval"]
    train_length = str(a.config.data.length)
    pick = [e for e in evals if e[0] == train_length] or evals
    if pick:
        length, ea, eb = pick[0]
        stats["val"] = (length, ea["loss"], eb["loss"])
        # the family's own metrics (e.g. an encoder-decoder's exact_match and alignment)
        stats["scores"] = [(name, ea[name], eb[name]) for name in ea
                           if name not in ("loss", "accuracy") and name in eb]
    return stats


def _checkpoint(run: Run, which: str) -> str:
    if run.params is None:
        return "no checkpoint"
    kind = "latest" if "still running" in " ".join(run.notes) else which
    return f"{kind} checkpoint, step {run.step}"


def _summary_lines(result: dict, which: str) -> list[str]:
    a, b, s = result["a"], result["b"], _stats(result)
    lines = [f"{a.label}: {a.path} ({_checkpoint(a, which)})",
             f"{b.label}: {b.path} ({_checkpoint(b, which)})"]
    lines += [f"note: {note}" for note in result["notes"]]
    keys = [key + (" (absent in A)" if va is ABSENT else " (absent in B)" if vb is ABSENT else "")
            for key, va, vb in result["config"]]
    lines.append(f"config: {len(keys)} difference(s)" + (
        ": " + ", ".join(keys[:4]) + (" ..." if len(keys) > 4 else "") if keys else ""))
    if s["l2"]:
        lines.append(f"parameters: {len(result['params'][0])} compared, relative L2 median "
                     f"{s['l2'][0]:.4g}, max {s['l2'][1]:.4g} ({s['l2'][2]}); "
                     f"{s['not_comparable']} not comparable")
    else:
        lines.append("parameters: not compared (a run has no checkpoint)")
    if s["js"]:
        lines.append(f"attention JS (nats, at most ln 2 = 0.693): mean {s['js'][0]:.4f}; "
                     f"largest {s['js'][1]:.4f} at layer {s['js'][2]} head {s['js'][3]}")
    else:
        lines.append(f"attention: skipped ({result['attention_skip']})")
    if s["val"]:
        length, la, lb = s["val"]
        lines.append(f"val loss @ length {length}: {a.label} {la:.4f}, {b.label} {lb:.4f} "
                     f"(B - A = {lb - la:+.4f})")
        for name, va, vb in s.get("scores", ()):
            lines.append(f"val {name} @ length {length}: {a.label} {va:.4f}, {b.label} "
                         f"{vb:.4f} (B - A = {vb - va:+.4f})")
    return lines


def _param_section(result: dict) -> list[str]:
    lines = ["## 2. Parameters", ""]
    if "params" not in result:
        return lines + ["Not compared: a run has no usable checkpoint.", ""]
    rows, other = result["params"]
    lines += ["For each parameter both runs have with one shape: relative L2 "
              f"`||a - b|| / ||a||` (a = {result['a'].label}) and the cosine of the flattened "
              "tensors. "
              "Identical tensors give 0 and 1. Tensors that start at zero (biases, norm "
              "offsets) have small norms, so their relative L2 can exceed 1.", ""]
    if "params" in result["pngs"]:
        lines += [f"![relative L2 per parameter]({result['pngs']['params']})", ""]
    lines += _table(["parameter", "shape", "relative L2", "cosine"],
                    [(f"`{r['path']}`", "×".join(map(str, r["shape"])) or "scalar",
                      _fmt(r["relative_l2"]), _fmt(r["cosine"])) for r in rows])
    if other:
        lines += ["Not comparable:", ""]
        lines += _table(["parameter", "reason"], [(f"`{o['path']}`", o["reason"]) for o in other])
    return lines


def _attention_section(result: dict) -> list[str]:
    lines = ["## 3. Attention patterns", ""]
    if result["attention_skip"]:
        return lines + [f"Skipped: {result['attention_skip']}.", ""]
    js, (ba, bb) = result["attention"], result["attention_shapes"]
    batch, length = result["probe"]
    lines += [f"Probe: {batch} validation examples of run A's data, length {length}. For each "
              "query row, the Jensen–Shannon divergence between the two runs' attention "
              "distributions over keys (natural log: 0 = identical, ln 2 ≈ 0.693 = disjoint), "
              "averaged over rows and examples. Row 0 attends only to itself in both runs, so "
              "it always contributes 0.", ""]
    if ba != bb:
        lines += [f"Not comparable: A has {ba[0]} layers × {ba[1]} heads, B has {bb[0]} × "
                  f"{bb[1]}; only the first {js.shape[0]} layers × {js.shape[1]} heads (by "
                  "index) are compared.", ""]
    lines += [f"![JS divergence per layer and head]({result['pngs']['attention']})", ""]
    lines += _table(["layer"] + [f"head {h}" for h in range(js.shape[1])] + ["mean"],
                    [[str(i)] + [f"{v:.4f}" for v in row] + [f"{row.mean():.4f}"]
                     for i, row in enumerate(js)])
    return lines


def _loss_section(result: dict) -> list[str]:
    a, b = result["a"], result["b"]
    lines = ["## 4. Validation loss", ""]
    if result["eval"]:
        lines += ["From each run's summary.json (the final evaluation):", ""]
        lines += _table(["length", f"{a.label} loss", f"{b.label} loss", "B − A",
                         f"{a.label} accuracy", f"{b.label} accuracy"],
                        [(n, f"{ea['loss']:.4f}", f"{eb['loss']:.4f}",
                          f"{eb['loss'] - ea['loss']:+.4f}", f"{ea['accuracy']:.4f}",
                          f"{eb['accuracy']:.4f}") for n, ea, eb in result["eval"]])
    else:
        lines += ["No evaluation length is in both runs' summary.json.", ""]
    for run in (a, b):
        only = result["eval_only"][run.label]
        if only:
            lines += [f"Only {run.label} was evaluated at length(s) {', '.join(only)}.", ""]
        if run.summary is None:
            logged = [r for r in run.metrics if "val_loss" in r]
            latest = (f"its latest logged val_loss is {logged[-1]['val_loss']:.4f} at step "
                      f"{logged[-1]['step']}" if logged else "it has logged no val_loss")
            lines += [f"{run.label} has no summary.json; {latest}.", ""]
    if "loss" in result["pngs"]:
        lines += [f"![loss curves]({result['pngs']['loss']})", ""]
    return lines


def render_pair(result: dict, which: str) -> tuple[str, str]:
    """``(report.md text, short summary)`` of one comparison."""
    a, b = result["a"], result["b"]
    lines = [f"# Checkpoint comparison: {b.label} against {a.label}", ""]
    lines += [f"- {r.label}: `{r.path}` ({_checkpoint(r, which)})" for r in (a, b)] + [""]
    lines += [f"> **Note:** {note}\n" for note in result["notes"]]
    lines += ["## 1. Config differences", ""]
    if result["config"]:
        value = lambda v: repr(v) if v is ABSENT else json.dumps(v)
        lines += _table(["key", a.label, b.label],
                        [(f"`{k}`", value(va), value(vb)) for k, va, vb in result["config"]])
        if any(ABSENT in (va, vb) for _, va, vb in result["config"]):
            lines += ["(absent): not in that run's config.json, typically a field added to the "
                      "config after the run was started; loading the run gives it the default.",
                      ""]
    else:
        lines += ["The configs are identical.", ""]
    lines += _param_section(result) + _attention_section(result) + _loss_section(result)
    return "\n".join(lines), "\n".join(_summary_lines(result, which))


def render_sweep(base: Run, results: list[dict], overview: str | None,
                 which: str) -> tuple[str, str]:
    """``(report.md text, short summary)`` of a sweep against its baseline."""
    lines = [f"# Sweep comparison against {base.label}", "",
             f"Baseline: `{base.path}` ({_checkpoint(base, which)}).", ""]
    lines += [f"> **Note:** {note}\n" for note in base.notes]
    if overview:
        lines += [f"![overview]({overview})", ""]
    rows, summary = [], [f"baseline: {base.path} ({_checkpoint(base, which)})"]
    for item in results:
        if "missing" in item:
            rows.append((item["name"], item["status"], "—", "—", "—", "—", item["missing"]))
            summary.append(f"{item['name']}: {item['status']}, {item['missing']}")
            continue
        s = _stats(item["result"])
        l2 = f"{s['l2'][0]:.3g} / {s['l2'][1]:.3g}" if s["l2"] else "—"
        js = f"{s['js'][0]:.4f} / {s['js'][1]:.4f}" if s["js"] else "skipped"
        val = f"{s['val'][1]:.4f} → {s['val'][2]:.4f}" if s["val"] else "—"
        rows.append((item["name"], item["status"], ", ".join(f"`{k}`" for k in s["config"]) or
                     "none", l2, js, val, f"[report](<{item['name']}/report.md>)"))
        summary.append(f"{item['name']}: {item['status']}; params rel. L2 median/max {l2}; "
                       f"attention JS mean/max {js}; val loss {val}")
    lines += _table(["run", "status", "config differences", "params rel. L2 median / max",
                     "attention JS mean / max (nats)", "val loss baseline → run", "details"],
                    rows)
    lines += ["Relative L2 is `||run - baseline|| / ||baseline||` per parameter; JS divergence "
              "is in [0, ln 2 ≈ 0.693], averaged over query rows and probe examples (see each "
              "run's report for the per-layer, per-head table and the notes).", ""]
    return "\n".join(lines), "\n".join(summary)
