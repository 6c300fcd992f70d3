"""Sweep reports on hand-built sweep directories: aggregation over seeds, results.csv, report.md,
extrapolation, unfinished runs, plots, the status table, headline metrics, and the input checks."""

import csv
import json
import math
from pathlib import Path

import pytest

from attnjax.analysis import report, sweep_plots
from attnjax.config import Config, DataConfig, TrainConfig, to_dict
from attnjax.sweep import run_name
from attnjax.sweep.headline import headline_metrics, metric_spec

HEADS = "model.attention.num_heads"
LONG_ERROR = "ValueError: " + "x" * 200
MIN_INCHES = 4     # a sweep plot's least side: figures are >= 4.8 in high, "tight" trims margins
MADE_UP = "experiments/made_up.py"      # no such file: the report has no headline metrics


def write_sweep(root: Path, runs: list[dict], steps: int = 100, length: int = 64,
                experiment: str | Path = MADE_UP, headline: list | None = None) -> Path:
    """A sweep directory as the launcher leaves it, its record naming ``experiment`` and its
    ``headline`` metrics (the record has none when not given). Each run:
    ``overrides``, ``status``, and optionally ``val`` ({length: loss}), ``acc``, ``train``,
    ``tokens``, ``metrics`` (lines of metrics.jsonl, written verbatim), ``error``, ``evals``."""
    config = to_dict(Config(data=DataConfig(length=length), train=TrainConfig(steps=steps)))
    entries = []
    for run in runs:
        name = run_name(run["overrides"])
        run_dir = root / name
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps(config))
        (run_dir / "metrics.jsonl").write_text(
            "".join(line + "\n" for line in run.get("metrics", [])))
        summary = None
        if run["status"] == "finished":
            summary = {"status": "finished", "step": steps, "skipped_updates": 0,
                       "train_loss": run["train"], "best_step": steps,
                       "tokens_per_s": run["tokens"],
                       "eval": {str(n): {"loss": loss, "accuracy": run["acc"]}
                                for n, loss in run["val"].items()}}
            (run_dir / "summary.json").write_text(json.dumps(summary))
        entries.append({"name": name, "overrides": run["overrides"], "status": run["status"],
                        "error": run.get("error"), "summary": summary,
                        "evals": run.get("evals", {})})
    record = {"experiment": str(experiment), "overrides": ["train.steps=100"],
              "launcher": "vmap", "runs": entries}
    (root / "sweep.json").write_text(json.dumps(
        record if headline is None else {**record, "headline": headline}))
    return root


def curve(final: float) -> list[str]:
    """metrics.jsonl lines: loss 2*final, 1.5*final, final at steps 10, 20, 30; val at 30."""
    return [json.dumps({"step": 10, "loss": 2 * final, "lr": 1e-3}),
            json.dumps({"step": 20, "loss": 1.5 * final, "lr": 1e-3}),
            json.dumps({"step": 30, "loss": final, "lr": 1e-3, "val_loss": final + 0.1})]


def heads_runs() -> list[dict]:
    """num_heads=2: val 1, 2, 3 (@128: 2, 3, 4), acc .1 .2 .3, train .5 1 1.5, tokens 100..300;
    num_heads=4: val 4, 4, 4 (@128: 8); yarn variant on every num_heads=2 run; one failed run."""
    runs = []
    for seed, (val, acc, train, tokens) in enumerate(
            [(1.0, 0.1, 0.5, 100.0), (2.0, 0.2, 1.0, 200.0), (3.0, 0.3, 1.5, 300.0)], start=1):
        runs.append({"overrides": {HEADS: 2, "seed": seed}, "status": "finished",
                     "val": {64: val, 128: val + 1}, "acc": acc, "train": train,
                     "tokens": tokens, "metrics": curve(train),
                     "evals": {"yarn": {"64": {"loss": val, "accuracy": acc},
                                        "128": {"loss": val + 0.5, "accuracy": acc}}}})
        runs.append({"overrides": {HEADS: 4, "seed": seed}, "status": "finished",
                     "val": {64: 4.0, 128: 8.0}, "acc": 0.5, "train": 2.0, "tokens": 50.0,
                     "metrics": curve(2.0)})
    runs.append({"overrides": {HEADS: 4, "seed": 4}, "status": "failed", "error": LONG_ERROR,
                 "metrics": curve(9.0)[:1]})
    return runs


@pytest.fixture(scope="module", autouse=True)
def small_pngs():
    """Plots at a low resolution: the tests check files, not pixels (faster)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep_plots, "DPI", 30)
        yield


@pytest.fixture(scope="module")
def heads_report(tmp_path_factory, small_pngs):
    """The heads sweep, reported once: (directory, returned text)."""
    root = write_sweep(tmp_path_factory.mktemp("heads"), heads_runs())
    return root, report.write_report(root)


def by_heads(rows):
    return {row["num_heads"]: row for row in rows}


def test_rows_average_finished_seeds_only(tmp_path):
    rows = by_heads(report.results_rows(report.load_sweep(write_sweep(tmp_path, heads_runs()))))
    two, four = rows[2], rows[4]
    assert list(two) == ["num_heads", "n_seeds", "val_loss_mean", "val_loss_std",
                         "val_accuracy_mean", "val_accuracy_std", "train_loss_mean",
                         "train_loss_std", "tokens_per_s_mean", "val_loss@128_mean",
                         "val_loss@128_std"]
    assert two["n_seeds"] == 3 and four["n_seeds"] == 3        # the failed seed 4 is left out
    assert two["val_loss_mean"] == pytest.approx(2.0) and two["val_loss_std"] == pytest.approx(1.0)
    assert two["val_accuracy_mean"] == pytest.approx(0.2)
    assert two["val_accuracy_std"] == pytest.approx(0.1)
    assert two["train_loss_mean"] == pytest.approx(1.0)
    assert two["train_loss_std"] == pytest.approx(0.5)
    assert two["tokens_per_s_mean"] == pytest.approx(200.0)
    assert two["val_loss@128_mean"] == pytest.approx(3.0)
    assert two["val_loss@128_std"] == pytest.approx(1.0)
    assert four["val_loss_mean"] == 4.0 and four["val_loss_std"] == 0.0
    assert four["val_loss@128_mean"] == 8.0


def test_one_seed_has_no_std(tmp_path):
    root = write_sweep(tmp_path, [
        {"overrides": {HEADS: h, "seed": 0}, "status": "finished", "val": {64: 1.5}, "acc": 0.5,
         "train": 1.25, "tokens": 10.0} for h in (2, 4)])
    rows = report.results_rows(report.load_sweep(root))
    assert [(r["num_heads"], r["n_seeds"], r["val_loss_mean"], r["val_loss_std"]) for r in rows] \
        == [(2, 1, 1.5, None), (4, 1, 1.5, None)]
    assert report.format_mean_std(1.5, None) == "1.500"


def test_a_run_setting_an_axis_to_none_is_not_averaged_with_the_base_run(tmp_path):
    """``{}`` leaves ``embed_scale`` at the base config's value; ``{embed_scale: None}`` sets
    it: two configurations, not two seeds of one."""
    done = {"status": "finished", "acc": 0.5, "train": 1.0, "tokens": 10.0}
    root = write_sweep(tmp_path, [{"overrides": {}, "val": {64: 0.5}, **done},
                                  {"overrides": {"model.embed_scale": None}, "val": {64: 1.5},
                                   **done}])
    rows = report.results_rows(report.load_sweep(root))
    assert [(r["embed_scale"], r["n_seeds"], r["val_loss_mean"]) for r in rows] \
        == [(None, 1, 0.5), ("None", 1, 1.5)]
    _, groups = report.configurations(report.load_sweep(root))
    assert [g["label"] for g in groups] == ["base", "embed_scale=None"]


def test_results_csv_reads_back(heads_report):
    root, _ = heads_report
    with (root / "results.csv").open() as f:
        rows = {row["num_heads"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"2", "4"}
    assert float(rows["2"]["val_loss_mean"]) == pytest.approx(2.0)
    assert float(rows["2"]["val_loss_std"]) == pytest.approx(1.0)
    assert float(rows["2"]["val_loss@128_mean"]) == pytest.approx(3.0)
    assert rows["4"]["n_seeds"] == "3" and float(rows["4"]["val_loss_std"]) == 0.0


def test_report_md_has_tables_unfinished_runs_and_images(heads_report):
    root, _ = heads_report
    text = (root / "report.md").read_text()
    assert text.startswith(f"# Sweep report: {MADE_UP}\n")
    assert "`train.steps=100`" in text and "sample standard deviation (ddof=1)" in text
    assert "| 2 | 3 | 2.00 ± 1.00 | 0.20 ± 0.10 | 1.00 ± 0.50 | 200 |" in text
    assert "| 4 | 3 | 4.00 ± 0.00 | 0.50 ± 0.00 | 2.00 ± 0.00 | 50 |" in text
    assert "| num_heads=2 + yarn | 2.00 ± 1.00 | 2.50 ± 1.00 |" in text   # extrapolation
    assert "| 64 (train) | 128 |" in text
    unfinished = text.split("## Runs that did not finish")[1].split("##")[0]
    assert "| num_heads=4,seed=4 | failed | 10/100 | ValueError: xxx" in unfinished
    assert "x" * 80 not in unfinished and "..." in unfinished       # error truncated
    for image in ("loss_curves.png", "final_num_heads.png", "extrapolation.png"):
        assert f"]({image})" in text


def test_returned_text_is_an_aligned_table(heads_report):
    _, text = heads_report
    results = text.split("\n\n")[0].splitlines()
    assert results[0].split() == ["num_heads", "n", "val", "loss", "val", "acc", "train", "loss",
                                  "tokens/s"]
    assert results[1].split() == ["2", "3", "2.00", "±", "1.00", "0.20", "±", "0.10", "1.00",
                                  "±", "0.50", "200"]
    assert len({len(line) for line in results}) == 1            # right-aligned last column
    assert "num_heads=2 + yarn" in text and "1 run(s) did not finish" in text


def test_extrapolation_rows_include_variants(tmp_path):
    _, groups = report.configurations(report.load_sweep(write_sweep(tmp_path, heads_runs())))
    rows = {row["label"]: row["losses"] for row in report.extrapolation_rows(groups)}
    assert list(rows) == ["num_heads=2", "num_heads=2 + yarn", "num_heads=4"]
    assert rows["num_heads=2"][128] == pytest.approx((3.0, 1.0, 3))
    assert rows["num_heads=2 + yarn"][128] == pytest.approx((2.5, 1.0, 3))
    assert rows["num_heads=4"][64] == (4.0, 0.0, 3)


def test_pngs_are_written(heads_report, assert_png):
    root, _ = heads_report
    for name in ("loss_curves.png", "final_num_heads.png", "extrapolation.png"):
        assert_png(root / name, min_side=MIN_INCHES * sweep_plots.DPI)


def test_two_axes_with_strings_and_out_dir(tmp_path, assert_png):
    runs = [{"overrides": {HEADS: h, "model.attention.qk_norm": q, "seed": s},
             "status": "finished", "val": {64: h + s + (q == "rms")}, "acc": 0.5, "train": 1.0,
             "tokens": 1.0}
            for h in (1, 8) for q in ("none", "rms") for s in (0, 1)]
    out = tmp_path / "out"
    text = report.write_report(write_sweep(tmp_path / "sweep", runs), out)
    assert text.splitlines()[0].split()[:3] == ["num_heads", "qk_norm", "n"]
    assert "val loss by evaluation length" not in text              # one length only
    for name in ("final_num_heads.png", "final_qk_norm.png"):
        assert_png(out / name, min_side=MIN_INCHES * sweep_plots.DPI)
    assert not (out / "extrapolation.png").exists()                 # one length
    assert not (out / "loss_curves.png").exists()                   # no metrics logged
    assert "![final qk norm](final_qk_norm.png)" in (out / "report.md").read_text()
    rows = report.results_rows(report.load_sweep(tmp_path / "sweep"))
    assert [(r["num_heads"], r["qk_norm"], r["val_loss_mean"]) for r in rows] == [
        (1, "none", 1.5), (1, "rms", 2.5), (8, "none", 8.5), (8, "rms", 9.5)]


def test_extrapolation_plot_caps_runaway_losses(tmp_path, assert_png):
    rows = [{"label": "sinusoidal", "group": 0, "variant": None,
             "losses": {64: (1.5, None, 1), 128: (40.0, None, 1), 256: (math.inf, None, 1)}},
            {"label": "alibi", "group": 1, "variant": None,
             "losses": {64: (1.4, 0.1, 2), 128: (1.5, 0.1, 2), 256: (1.6, 0.1, 2)}}]
    path = sweep_plots.plot_extrapolation(rows, [64], tmp_path / "x.png")
    assert_png(path, min_side=MIN_INCHES * sweep_plots.DPI)


def records(**series) -> list[dict]:
    """metrics.jsonl records at steps 10, 20, 30: ``records(val_loss=[3, 2, 2.5])``; a None
    value leaves the key out of that record."""
    return [{"step": step, **{k: v[i] for k, v in series.items() if v[i] is not None}}
            for i, step in enumerate((10, 20, 30))]


def test_headline_value_aggregations():
    logged = records(val_loss=[3.0, 2.0, 2.5], max_attn_logit=[None, 4.0, None],
                     loss=[1.0, math.nan, 1.0])
    assert report.headline_value(logged, "best_val_loss") == 2.0
    assert report.headline_value(logged, "best_val_step") == 20
    assert report.headline_value(logged, "max_attn_logit") == 4.0       # last record with it
    assert report.headline_value(logged, "val_loss") == 2.5
    assert report.headline_value(logged, "val_loss:last") == 2.5
    assert report.headline_value(logged, "val_loss:max") == 3.0
    assert report.headline_value(logged, "val_loss:argmax") == 10
    assert report.headline_value(logged, "loss:min") == 1.0             # NaN skipped
    assert report.headline_value(logged, "loss:argmin") == 10           # tie: earliest step
    assert report.headline_value(logged, "skipped") is None             # never logged
    assert report.describe_metric("best_val_step") == "step of the lowest `val_loss`"
    for bad in ("val_loss:median", ":min", "", 3):
        with pytest.raises(ValueError, match="write KEY or KEY:AGG"):
            metric_spec(bad)


HEADLINE = ["max_attn_logit", "best_val_loss", "best_val_step", "skipped"]


def write_experiment(path: Path, report_spec) -> Path:
    path.write_text("from attnjax.config import Config\n\n\ndef get_config():\n"
                    "    return Config()\n\n\n"
                    f"def get_report():\n    return {report_spec!r}\n")
    return path


def headline_runs() -> list[dict]:
    """num_heads=2, seeds 0 and 1: best val 2.0 and 2.2, both @ 20, last max logit 6 and 8,
    1 and 0 skipped updates; num_heads=4, one seed: best 1.5 @ 10, max logit 3, 0 skipped."""
    series = [(2, 0, [3.0, 2.0, 2.5], [5.0, 7.0, 6.0], [0, 0, 1]),
              (2, 1, [2.8, 2.2, 2.6], [5.0, 9.0, 8.0], [0, 0, 0]),
              (4, 0, [1.5, 1.6, 1.7], [1.0, None, 3.0], [0, 0, 0])]
    return [{"overrides": {HEADS: heads, "seed": seed}, "status": "finished",
             "val": {64: val[-1]}, "acc": 0.5, "train": 1.0, "tokens": 1.0,
             "metrics": [json.dumps(r) for r in records(
                 loss=[3.0, 2.0, 1.0], val_loss=val, max_attn_logit=logit, skipped=skipped)]}
            for heads, seed, val, logit, skipped in series]


def test_headline_metrics_from_the_experiment(tmp_path):
    experiment = write_experiment(tmp_path / "exp.py", {"metrics": HEADLINE})
    assert headline_metrics(experiment) == HEADLINE     # what the launcher stores
    root = write_sweep(tmp_path / "sweep", headline_runs(), experiment=experiment,
                       headline=HEADLINE)
    sweep = report.load_sweep(root)
    assert sweep["headline"] == HEADLINE
    two, four = by_heads(report.results_rows(sweep)).values()
    assert list(two)[-8:] == [f"{name}_{stat}" for name in HEADLINE for stat in ("mean", "std")]
    assert two["max_attn_logit_mean"] == 7.0
    assert two["max_attn_logit_std"] == pytest.approx(math.sqrt(2))
    assert two["best_val_loss_mean"] == pytest.approx(2.1)
    assert two["best_val_loss_std"] == pytest.approx(0.2 / math.sqrt(2))
    assert (two["best_val_step_mean"], two["best_val_step_std"]) == (20.0, 0.0)
    assert (two["skipped_mean"], two["skipped_std"]) == (0.5, pytest.approx(0.5 ** 0.5))
    assert (four["max_attn_logit_mean"], four["best_val_loss_mean"], four["best_val_step_mean"],
            four["skipped_mean"], four["best_val_step_std"]) == (3.0, 1.5, 10.0, 0.0, None)

    text = report.write_report(root)
    lines = text.splitlines()
    assert lines[0].split()[-4:] == HEADLINE
    assert lines[1].split()[-12:] == ["7.00", "±", "1.41", "2.10", "±", "0.14",
                                      "20", "±", "0", "0.50", "±", "0.71"]    # steps: whole
    assert lines[2].split()[-4:] == ["3.00", "1.50", "10", "0.00"]
    markdown = (root / "report.md").read_text()
    assert "| 2 | 2 |" in markdown
    assert "| 7.00 ± 1.41 | 2.10 ± 0.14 | 20 ± 0 | 0.50 ± 0.71 |" in markdown
    assert "`best_val_step` = step of the lowest `val_loss`" in markdown
    assert "`max_attn_logit` = last logged `max_attn_logit`" in markdown
    with (root / "results.csv").open() as f:
        csv_rows = {row["num_heads"]: row for row in csv.DictReader(f)}
    assert float(csv_rows["2"]["best_val_step_mean"]) == 20.0
    assert csv_rows["4"]["best_val_step_std"] == ""

    experiment.unlink()                         # the record is all the report reads
    assert report.load_sweep(root)["headline"] == HEADLINE
    root = write_sweep(tmp_path / "older", headline_runs(), experiment=experiment)
    assert report.load_sweep(root)["headline"] == []    # a record without: no such columns
    assert "max_attn_logit" not in report.write_report(root)


def test_bad_report_spec_is_refused(tmp_path):
    for i, (spec, match) in enumerate([({"metrics": ["loss:median"]}, "write KEY or KEY:AGG"),
                        ({"columns": ["loss"]}, "a dict with only 'metrics'"),
                        (["loss"], "a dict with only 'metrics'"),
                        ({"metrics": ["val_loss"]}, "has that column already"),
                        ({"metrics": ["val_loss@128"]}, "has that column already"),
                        ({"metrics": ["skipped", "skipped"]}, "has that column already")]):
        experiment = write_experiment(tmp_path / f"exp{i}.py", spec)
        with pytest.raises(ValueError, match=match):        # refused when the sweep starts
            headline_metrics(experiment)
        if isinstance(spec, dict) and "metrics" in spec:    # and in a record, when read
            root = write_sweep(tmp_path / f"sweep{i}", headline_runs(), experiment=experiment,
                               headline=spec["metrics"])
            with pytest.raises(ValueError, match=match):
                report.load_sweep(root)


def test_torn_metrics_line_is_ignored(tmp_path):
    lines = curve(1.0)[:2] + ['{"step": 30, "loss": 0.']
    root = write_sweep(tmp_path, [{"overrides": {"seed": 0}, "status": "pending",
                                   "metrics": lines}])
    run = report.load_sweep(root)["runs"][0]
    assert [r["step"] for r in run["metrics"]] == [10, 20]
    assert "20/100" in report.sweep_status_table(root)


def test_status_table(tmp_path):
    root = write_sweep(tmp_path, [
        {"overrides": {HEADS: 2, "seed": 0}, "status": "finished", "val": {64: 1.25},
         "acc": 0.5, "train": 1.0, "tokens": 1.0, "metrics": curve(1.0)},
        {"overrides": {HEADS: 4, "seed": 0}, "status": "pending",
         "metrics": [json.dumps({"step": s, "loss": 1.0}) for s in (25, 50)]},
        {"overrides": {HEADS: 8, "seed": 0}, "status": "failed", "error": LONG_ERROR}])
    lines = report.sweep_status_table(root).splitlines()
    assert lines[0].split() == ["run", "status", "steps", "val", "loss", "error"]
    assert lines[1].split() == ["num_heads=2,seed=0", "finished", "100/100", "1.2500"]
    assert lines[2].split() == ["num_heads=4,seed=0", "pending", "50/100"]
    assert lines[3].split()[:3] == ["num_heads=8,seed=0", "failed", "0/100"]
    assert lines[3].endswith(("ValueError: " + "x" * 200)[:77] + "...")   # 80 characters
    assert lines[-1] == "3 runs: 1 finished, 1 pending, 1 failed"


def test_run_directory_overrides_stale_sweep_json(tmp_path):
    root = write_sweep(tmp_path, [
        {"overrides": {"seed": s}, "status": "finished", "val": {64: 1.0}, "acc": 0.5,
         "train": 1.0, "tokens": 1.0} for s in (0, 1, 2)])
    sweep = json.loads((root / "sweep.json").read_text())
    for entry in sweep["runs"]:                  # as if written before the runs finished
        entry.update(status="pending", summary=None)
    (root / "sweep.json").write_text(json.dumps(sweep))
    (root / "seed=2" / "summary.json").unlink()
    (root / "seed=2" / "error.txt").write_text("Traceback ...\nRuntimeError: out of memory\n")
    (root / "seed=0" / "evals").mkdir()
    (root / "seed=0" / "evals" / "yarn.json").write_text(json.dumps(
        {"checkpoint": "best", "step": 100, "results": {"64": {"loss": 0.5}}}))
    runs = report.load_sweep(root)["runs"]
    assert [(r["status"], r["error"]) for r in runs] == [
        ("finished", None), ("finished", None), ("failed", "RuntimeError: out of memory")]
    assert runs[0]["evals"] == {"yarn": {"64": {"loss": 0.5}}}
    assert report.results_rows(report.load_sweep(root)) == [{
        "n_seeds": 2, "val_loss_mean": 1.0, "val_loss_std": 0.0, "val_accuracy_mean": 0.5,
        "val_accuracy_std": 0.0, "train_loss_mean": 1.0, "train_loss_std": 0.0,
        "tokens_per_s_mean": 1.0}]


def test_missing_or_bad_sweep_json(tmp_path):
    with pytest.raises(ValueError, match=f"no {tmp_path / 'sweep.json'}"):
        report.load_sweep(tmp_path)
    (tmp_path / "sweep.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        report.load_sweep(tmp_path)
    (tmp_path / "sweep.json").write_text('{"runs": [{"overrides": {}}]}')
    with pytest.raises(ValueError, match="every run needs a 'name'"):
        report.load_sweep(tmp_path)


def test_axes_and_short_names():
    runs = [{"overrides": {"a.drop": 0.1, "b.drop": 0.0, "c.kind": "x", "seed": s}}
            for s in (0, 1)]
    runs.append({"overrides": {"a.drop": 0.2, "b.drop": 0.0, "c.kind": "y", "seed": 0}})
    assert report.sweep_axes(runs) == ["a.drop", "c.kind"]           # constant and seed left out
    assert report.short_names(["a.drop", "b.drop", "c.kind"]) == {
        "a.drop": "a.drop", "b.drop": "b.drop", "c.kind": "kind"}


def test_mean_curve_uses_shared_steps():
    a = [{"step": 10, "loss": 2.0}, {"step": 20, "loss": 1.0}, {"step": 30, "loss": 0.5}]
    b = [{"step": 10, "loss": 4.0}, {"step": 20, "loss": 3.0, "val_loss": 3.5}]
    assert report.mean_curve([a, b], "loss") == ([10, 20], [3.0, 2.0], [2.0, 1.0], [4.0, 3.0])
    assert report.mean_curve([a, b], "val_loss") is None


def test_number_formatting():
    assert report.format_mean_std(1.23456, 0.0123) == "1.235 ± 0.012"
    assert report.format_mean_std(2.0, 1.0) == "2.00 ± 1.00"
    assert report.format_mean_std(1.5, 0.00001) == "1.5000 ± 0.0000"
    assert report.format_mean_std(None, None) == ""
    assert report.std_decimals([0.5, 0.01, 0.02]) == 3              # median 0.02
    assert sweep_plots.log_ticks(1.4, 9.7) == [1.4, 1.6, 1.8, 2, 2.5, 3, 4, 5, 6, 8]
    assert sweep_plots.log_ticks(1.0, 100.0) == [1, 2, 5, 10, 20, 50, 100]
