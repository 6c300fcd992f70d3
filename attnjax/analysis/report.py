"""Sweep reports: ``report.md``, ``results.csv`` and PNG plots from a sweep directory, and the
per-run status table of ``attnjax sweep-status``.

A *configuration* is a run's overrides minus ``seed``; runs of one configuration are averaged
over their finished seeds (mean and sample standard deviation, ``ddof=1``; no std with one
seed). The swept *axes* are the override keys, other than ``seed``, whose value differs between
runs, named by their last dotted part unless two axes share it (as in run names); a run that
sets an axis to None is a configuration of its own (``None`` in the tables; ``-``: the axis is
left at the base config's value).

The sweep directory (layout: ``attnjax.rundir``) is read as the launcher leaves it, finished
or not. The sweep's record gives the runs; each run directory says more where it knows more: its
summary when the record has none yet, its error file (a run with one and no summary counts as
failed), its evaluation variants (which win over the record's; a mapping under "results" or
"eval" is unwrapped), its config (training length and steps) and its metrics.

An experiment names the extra columns it reports with ``get_report()``: *headline metrics* of
a run's metrics.jsonl (``attnjax.sweep.headline``), averaged over seeds like the rest. The
launcher stores them in the sweep's record, which is all the report reads: no code of the
experiment runs here.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from pathlib import Path

from attnjax.analysis import sweep_plots
from attnjax.config import to_dict
from attnjax.outputs import output_directory
from attnjax.rundir import RunDir, SweepDir
from attnjax.sweep.headline import checked_headline, metric_spec
from attnjax.sweep.spec import run_name

ERROR_WIDTH = 80


# ---------------------------------------------------------------------------- loading

def load_sweep(sweep_dir: str | Path) -> dict:
    """The sweep of ``sweep_dir``: ``{"dir", "experiment", "overrides", "launcher",
    "headline", "runs"}`` (``headline``: the record's headline metrics), each run
    ``{"name", "overrides", "status", "error", "summary", "evals", "train_length",
    "total_steps", "metrics"}`` with what its run directory holds merged in."""
    sweep = SweepDir(sweep_dir)
    data = sweep.record()
    experiment = data.get("experiment") or "?"
    return {"dir": str(sweep.path), "experiment": experiment,
            "overrides": list(data.get("overrides") or []), "launcher": data.get("launcher"),
            "headline": checked_headline(data.get("headline") or [], str(sweep.record_path)),
            "runs": [_load_run(sweep, entry) for entry in data["runs"]]}


def _load_run(sweep: SweepDir, entry) -> dict:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise ValueError(f"{sweep.record_path}: every run needs a 'name', got {str(entry)[:60]}")
    if not isinstance(entry.get("overrides", {}), dict):
        raise ValueError(f"{sweep.record_path}: 'overrides' of run {entry['name']!r} is not a "
                         "dict")
    run_dir = sweep.run(entry["name"])
    summary = entry.get("summary") or run_dir.summary()
    status, error = _status(entry, summary, run_dir)
    config = to_dict(run_dir.config()) if run_dir.exists() else {}    # checked: one line
    lengths = sorted(int(k) for k in ((summary or {}).get("eval") or {}))
    train_length = config.get("data", {}).get("length") or (lengths[0] if lengths else None)
    return {"name": entry["name"], "overrides": dict(entry.get("overrides") or {}),
            "status": status, "error": error, "summary": summary,
            "evals": _evals(entry, run_dir), "train_length": train_length,
            "total_steps": config.get("train", {}).get("steps"),
            "metrics": run_dir.metrics()}


def _status(entry: dict, summary, run_dir: RunDir) -> tuple[str, str | None]:
    """The record's status and error, unless the run directory says more: a finished summary,
    or an error traceback (its last line is the error). A run the launcher judged failed (e.g.
    diverged, with a summary) stays failed."""
    status, error = entry.get("status") or "pending", entry.get("error")
    if status == "failed" and error:
        return status, error
    if summary and summary.get("status") == "finished":
        return "finished", error
    trace = run_dir.error() if status != "finished" else None
    if trace is not None:
        lines = [line for line in trace.splitlines() if line.strip()]
        return "failed", error or (lines[-1].strip() if lines else "")
    return status, error


def _evals(entry: dict, run_dir: RunDir) -> dict:
    """Evaluation variants, label -> {"<length>": {"loss", ...}}: the record's, then the run
    directory's (which win); keys that are not lengths are dropped."""
    evals = dict(entry.get("evals") or {})
    for label, data in run_dir.evals().items():
        data = data or {}
        evals[label] = data.get("results") or data.get("eval") or data
    return {label: {k: v for k, v in results.items() if str(k).isdigit() and isinstance(v, dict)}
            for label, results in evals.items() if isinstance(results, dict)}


def _finished(run: dict) -> bool:
    return run["status"] == "finished" and bool((run["summary"] or {}).get("eval"))


# ------------------------------------------------------------------ configurations, axes

def short_names(keys: list[str]) -> dict[str, str]:
    """Each dotted key -> its last part, or the whole key where two keys share that part."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: part if last.count(part) == 1 else key for key, part in zip(keys, last)}


def sweep_axes(runs: list[dict]) -> list[str]:
    """Override keys other than ``seed`` whose value differs between runs (first-seen order)."""
    keys = list(dict.fromkeys(k for run in runs for k in run["overrides"] if k != "seed"))
    return [key for key in keys if len({
        json.dumps([key in run["overrides"], run["overrides"].get(key)], default=str)
        for run in runs}) > 1]


def configurations(sweep: dict) -> tuple[list[str], list[dict]]:
    """``(axes, groups)``: one group per configuration in first-seen order, ``{"label",
    "values" (axis -> value), "runs" (all), "finished" (runs with a final evaluation)}``."""
    runs = sweep["runs"]
    axes = sweep_axes(runs)
    groups: dict[str, dict] = {}
    for run in runs:
        values = {axis: run["overrides"].get(axis) for axis in axes}
        chosen = {axis: run["overrides"][axis] for axis in axes if axis in run["overrides"]}
        # a run that sets an axis to None is not one that leaves it at the base config's value
        key = json.dumps([[axis in chosen, value] for axis, value in values.items()],
                         default=str)
        group = groups.setdefault(key, {"label": run_name(chosen), "values": values,
                                        "set_to_none": {a for a in chosen if chosen[a] is None},
                                        "runs": [], "finished": []})
        group["runs"].append(run)
        if _finished(run):
            group["finished"].append(run)
    return axes, list(groups.values())


# ---------------------------------------------------------------------- headline metrics

def headline_value(records: list[dict], name: str):
    """Headline metric ``name`` of one run's metrics records; None when no record has its key.
    ``min``/``max`` skip NaN; a tie goes to the earliest step."""
    key, how = metric_spec(name)
    logged = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    if how == "last":
        return logged[-1][1] if logged else None
    logged = [(step, value) for step, value in logged if not math.isnan(value)]
    if not logged:
        return None
    step, value = (min if how.endswith("min") else max)(logged, key=lambda pair: pair[1])
    return step if how.startswith("arg") else value


def describe_metric(name: str) -> str:
    """``best_val_step`` -> ``step of the lowest `val_loss```: what a headline column holds."""
    key, how = metric_spec(name)
    what = {"last": "last logged", "min": "lowest", "max": "highest",
            "argmin": "step of the lowest", "argmax": "step of the highest"}[how]
    return f"{what} `{key}`"


# ---------------------------------------------------------------------------- statistics

def mean_std(values) -> tuple[float | None, float | None]:
    """Mean and sample std (ddof=1) of the values that are not None; std None for one value."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def eval_loss(results: dict, length: int):
    """The loss at ``length`` of an evaluation mapping ``{"<length>": {"loss": ...}}``."""
    return (results.get(str(length)) or {}).get("loss")


def eval_lengths(groups: list[dict]) -> list[int]:
    """Every evaluation length of the finished runs and their variants, ascending."""
    lengths = set()
    for run in (r for g in groups for r in g["finished"]):
        for results in [run["summary"]["eval"], *run["evals"].values()]:
            lengths.update(int(k) for k in results)
    return sorted(lengths)


def extra_lengths(groups: list[dict]) -> list[int]:
    """Evaluation lengths other than one every finished run was trained at."""
    finished = [r for g in groups for r in g["finished"]]
    common = {r["train_length"] for r in finished}
    common = common if len(common) == 1 else set()
    return [n for n in eval_lengths(groups) if n not in common]


def results_rows(sweep: dict) -> list[dict]:
    """One row per configuration: the axes (short names), ``n_seeds`` (finished), mean/std of
    the final val loss and accuracy (at the training length) and train loss, mean tokens/s,
    mean/std of ``val_loss@<length>`` for each extra evaluation length, then mean/std of each
    headline metric (``<name>_mean``, ``<name>_std``)."""
    axes, groups = configurations(sweep)
    short = short_names(axes)
    extra = extra_lengths(groups)
    rows = []
    for group in groups:
        done = group["finished"]
        at_train = [r["summary"]["eval"].get(str(r["train_length"])) or {} for r in done]
        row = {short[axis]: "None" if axis in group["set_to_none"] else value
               for axis, value in group["values"].items()}
        row["n_seeds"] = len(done)
        row["val_loss_mean"], row["val_loss_std"] = mean_std(e.get("loss") for e in at_train)
        row["val_accuracy_mean"], row["val_accuracy_std"] = mean_std(
            e.get("accuracy") for e in at_train)
        row["train_loss_mean"], row["train_loss_std"] = mean_std(
            r["summary"].get("train_loss") for r in done)
        row["tokens_per_s_mean"] = mean_std(r["summary"].get("tokens_per_s") for r in done)[0]
        for length in extra:
            row[f"val_loss@{length}_mean"], row[f"val_loss@{length}_std"] = mean_std(
                eval_loss(r["summary"]["eval"], length) for r in done)
        for name in sweep["headline"]:
            row[f"{name}_mean"], row[f"{name}_std"] = mean_std(
                headline_value(r["metrics"], name) for r in done)
        rows.append(row)
    return rows


def extrapolation_rows(groups: list[dict]) -> list[dict]:
    """Loss against evaluation length: one row per configuration, then one per evaluation
    variant of it, ``{"label", "group", "variant", "losses": {length: (mean, std, n)}}``."""
    lengths = eval_lengths(groups)
    rows = []
    for index, group in enumerate(groups):
        if not group["finished"]:
            continue
        sources = {None: [r["summary"]["eval"] for r in group["finished"]]}
        for run in group["finished"]:
            for label, results in run["evals"].items():
                sources.setdefault(label, []).append(results)
        for variant, results in sources.items():
            losses = {}
            for length in lengths:
                values = [eval_loss(r, length) for r in results]
                values = [v for v in values if v is not None]
                if values:
                    losses[length] = (*mean_std(values), len(values))
            label = group["label"] if variant is None else f"{group['label']} + {variant}"
            rows.append({"label": label, "group": index, "variant": variant, "losses": losses})
    return rows


def mean_curve(metrics: list[list[dict]], key: str):
    """``(steps, mean, min, max)`` of ``key`` over runs, at the steps every run logged it;
    None when no step is shared."""
    per_run = [{r["step"]: r[key] for r in records if r.get(key) is not None}
               for records in metrics]
    steps = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    if not steps:
        return None
    columns = [[d[s] for d in per_run] for s in steps]
    return (steps, [statistics.fmean(c) for c in columns], [min(c) for c in columns],
            [max(c) for c in columns])


# ---------------------------------------------------------------------------- formatting

def std_decimals(stds) -> int:
    """Decimals that show the median of the (finite, positive) stds to two significant digits,
    between 2 and 4; 3 when there is none. One choice per table column keeps it aligned."""
    stds = sorted(s for s in stds if s is not None and math.isfinite(s) and s > 0)
    if not stds:
        return 3
    return min(4, max(2, 1 - math.floor(math.log10(stds[len(stds) // 2]))))


def format_mean_std(mean, std, decimals: int | None = None) -> str:
    """``1.235 ± 0.012`` with ``decimals`` (default :func:`std_decimals` of this std); the mean
    alone without a std; empty without a mean."""
    if mean is None:
        return ""
    decimals = std_decimals([std]) if decimals is None else decimals
    if std is None or not math.isfinite(std):
        return f"{mean:.{decimals}f}"
    return f"{mean:.{decimals}f} ± {std:.{decimals}f}"


def format_value(value) -> str:
    """An axis value as in run names (``true``, ``4``, ``rope``); None as ``-``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def render_table(header: list[str], rows: list[list[str]], markdown: bool,
                 right: set[int] = frozenset()) -> str:
    """A markdown table, or aligned plain-text columns; columns in ``right`` right-aligned."""
    if markdown:
        rule = ["---:" if i in right else "---" for i in range(len(header))]
        return "\n".join("| " + " | ".join(cells) + " |" for cells in [header, rule, *rows])
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    lines = []
    for cells in [header, *rows]:
        lines.append("  ".join(c.rjust(w) if i in right else c.ljust(w)
                               for i, (c, w) in enumerate(zip(cells, widths))).rstrip())
    return "\n".join(lines)


def _mean_std_column(pairs: list[tuple], whole: bool = False) -> list[str]:
    """Cells ``mean ± std`` of one column, all with the same decimals; with ``whole``, none
    when every mean and std is a whole number (steps, counts)."""
    numbers = [v for pair in pairs for v in pair if v is not None]
    if whole and all(math.isfinite(v) and v == int(v) for v in numbers):
        decimals = 0
    else:
        decimals = std_decimals(std for _, std in pairs)
    return [format_mean_std(mean, std, decimals) for mean, std in pairs]


def _results_table(sweep: dict, markdown: bool, with_extra: bool) -> str:
    axes, groups = configurations(sweep)
    names = list(short_names(axes).values())
    extra = extra_lengths(groups) if with_extra else []
    rows = results_rows(sweep)
    headline = sweep["headline"]
    stats = ["val_loss", "val_accuracy", "train_loss", *(f"val_loss@{n}" for n in extra),
             *headline]
    columns = {k: _mean_std_column([(r[f"{k}_mean"], r[f"{k}_std"]) for r in rows],
                                   whole=k in headline)
               for k in stats}
    header = [*names, "n", "val loss", "val acc", "train loss", "tokens/s",
              *(f"val loss@{n}" for n in extra), *headline]
    body = []
    for i, row in enumerate(rows):
        tokens = row["tokens_per_s_mean"]
        body.append([*(format_value(row[n]) for n in names), str(row["n_seeds"]),
                     *(columns[k][i] for k in stats[:3]),
                     "" if tokens is None else f"{tokens:,.0f}",
                     *(columns[k][i] for k in stats[3:])])
    return render_table(header, body, markdown, set(range(len(names), len(header))))


def _extrapolation_table(sweep: dict, markdown: bool) -> str:
    _, groups = configurations(sweep)
    lengths = eval_lengths(groups)
    trained = {r["train_length"] for g in groups for r in g["finished"]}
    rows = extrapolation_rows(groups)
    columns = [_mean_std_column([row["losses"].get(n, (None, None))[:2] for row in rows])
               for n in lengths]
    header = ["configuration", *(f"{n}{' (train)' if n in trained else ''}" for n in lengths)]
    body = [[row["label"], *(column[i] for column in columns)] for i, row in enumerate(rows)]
    return render_table(header, body, markdown, set(range(1, len(header))))


# ------------------------------------------------------------------------- run progress

def _progress(run: dict) -> str:
    done = run["metrics"][-1]["step"] if run["metrics"] else 0
    if run["summary"] and run["summary"].get("step") is not None:
        done = max(done, run["summary"]["step"])
    total = run["total_steps"]
    return f"{done}/{'?' if total is None else total}"


def _short_error(error) -> str:
    text = " ".join(str(error or "").split()).replace("|", "/")
    return text if len(text) <= ERROR_WIDTH else text[:ERROR_WIDTH - 3] + "..."


def _status_counts(runs: list[dict]) -> str:
    counts: dict[str, int] = {}
    for run in runs:
        counts[run["status"]] = counts.get(run["status"], 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"{len(runs)} run{'s' if len(runs) != 1 else ''}: {parts}" if runs else "0 runs"


def sweep_status_table(sweep_dir: str | Path) -> str:
    """One line per run (name, status, steps done/total, final val loss when finished, error
    when failed), then the number of runs per status."""
    runs = load_sweep(sweep_dir)["runs"]
    body = []
    for run in runs:
        loss = (eval_loss(run["summary"]["eval"], run["train_length"]) if _finished(run)
                else None)
        body.append([run["name"], run["status"], _progress(run),
                     "" if loss is None else f"{loss:.4f}", _short_error(run["error"])])
    table = render_table(["run", "status", "steps", "val loss", "error"], body, False, {2, 3})
    return f"{table}\n\n{_status_counts(runs)}"


# ------------------------------------------------------------------------------ writing

def write_csv(sweep: dict, path: str | Path) -> Path:
    """``results.csv``: :func:`results_rows`, empty cells for missing values."""
    rows = results_rows(sweep)
    path = Path(path)
    fields = list(rows[0]) if rows else ["n_seeds"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    return path


def _markdown(sweep: dict, images: list[Path]) -> str:
    _, groups = configurations(sweep)
    runs = sweep["runs"]
    lengths = eval_lengths(groups)
    trained = sorted({r["train_length"] for g in groups for r in g["finished"]} - {None})
    overrides = " ".join(f"`{o}`" for o in sweep["overrides"]) or "none"
    launcher = f"; launcher: {sweep['launcher']}" if sweep["launcher"] else ""
    out = [f"# Sweep report: {sweep['experiment']}", "",
           f"CLI overrides applied to every run: {overrides}{launcher}. "
           f"{_status_counts(runs)}.", "", "## Results", "",
           "Mean ± sample standard deviation (ddof=1) over the finished seeds of each "
           "configuration; n = finished seeds; the std is left out where n = 1. Val loss and "
           f"accuracy are the final evaluation at the training length "
           f"({', '.join(map(str, trained)) or '?'} tokens); losses in nats per token.", "",
           _results_table(sweep, True, with_extra=len(lengths) <= 1)]
    if sweep["headline"]:
        out += ["", "Headline metrics of the experiment (its `get_report()`), from each run's "
                "metrics.jsonl: " + "; ".join(f"`{name}` = {describe_metric(name)}"
                                              for name in sweep["headline"]) + "."]
    if len(lengths) > 1:
        out += ["", "## Extrapolation", "",
                "Final validation loss at each evaluation length (mean ± std over seeds); "
                "`+ label` rows are evaluation variants of the same checkpoints.", "",
                _extrapolation_table(sweep, True)]
    unfinished = [r for r in runs if not _finished(r)]
    if unfinished:
        out += ["", "## Runs that did not finish", "",
                "Not included in the averages above.", "",
                render_table(["run", "status", "steps", "error"],
                             [[r["name"], r["status"], _progress(r), _short_error(r["error"])]
                              for r in unfinished], True, {2})]
    if images:
        out += ["", "## Plots", ""]
        out += [f"![{p.stem.replace('_', ' ')}]({p.name})\n" for p in images]
    return "\n".join(out).rstrip() + "\n"


def _plot_all(sweep: dict, out_dir: Path) -> list[Path]:
    axes, groups = configurations(sweep)
    short = short_names(axes)
    images = []
    curves = []
    for group in groups:
        metrics = [r["metrics"] for r in group["finished"]]
        train = mean_curve(metrics, "loss")
        if train:
            curves.append({"label": group["label"], "train": train,
                           "val": mean_curve(metrics, "val_loss")})
    if curves:
        images.append(sweep_plots.plot_loss_curves(curves, out_dir / "loss_curves.png"))
    for axis in axes:
        lines: dict[str, dict] = {}
        for group in groups:
            mean, std = mean_std(eval_loss(r["summary"]["eval"], r["train_length"])
                                 for r in group["finished"])
            if mean is None:
                continue
            others = {a: v for a, v in group["values"].items() if a != axis}
            line = lines.setdefault(run_name(others) if others else "",
                                    {"x": [], "mean": [], "std": []})
            line["x"].append(group["values"][axis])
            line["mean"].append(mean)
            line["std"].append(std)
        if lines:
            name = re.sub(r"[^A-Za-z0-9._+-]", "_", short[axis])
            images.append(sweep_plots.plot_final(
                short[axis], [{"label": k, **v} for k, v in lines.items()],
                out_dir / f"final_{name}.png"))
    if len(eval_lengths(groups)) > 1:
        trained = sorted({r["train_length"] for g in groups for r in g["finished"]} - {None})
        images.append(sweep_plots.plot_extrapolation(
            extrapolation_rows(groups), trained, out_dir / "extrapolation.png"))
    return images


def write_report(sweep_dir: str | Path, out_dir: str | Path | None = None) -> str:
    """Write ``report.md``, ``results.csv`` and the PNG plots into ``out_dir`` (default: the
    sweep directory); return the results table (and the extrapolation table when there are
    several evaluation lengths) as aligned plain text for a terminal."""
    sweep = load_sweep(sweep_dir)
    out = Path(out_dir) if out_dir is not None else Path(sweep_dir)
    output_directory(out, "--out" if out_dir is not None else "--out (default: SWEEP_DIR)")
    write_csv(sweep, out / "results.csv")
    images = _plot_all(sweep, out)
    (out / "report.md").write_text(_markdown(sweep, images))
    _, groups = configurations(sweep)
    several = len(eval_lengths(groups)) > 1
    text = _results_table(sweep, False, with_extra=not several)
    if several:
        text += "\n\nval loss by evaluation length:\n" + _extrapolation_table(sweep, False)
    unfinished = sum(not _finished(r) for r in sweep["runs"])
    if unfinished:
        text += f"\n\n{unfinished} run(s) did not finish: see report.md"
    return text
