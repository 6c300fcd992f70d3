"""An experiment's headline metrics: the extra columns of ``attnjax report``, named by the
experiment file's ``get_report()``, e.g. ::

    def get_report():
        return {"metrics": ["max_attn_logit", "best_val_loss", "best_val_step", "loss:min"]}

each a metric of a run's metrics.jsonl (:func:`metric_spec`). They are read once, when the
sweep is launched, and stored in its record (sweep.json) as data: reading a sweep never runs
the experiment's code.
"""

from __future__ import annotations

from pathlib import Path

from attnjax.experiment import load_experiment

AGGREGATIONS = ("last", "min", "max", "argmin", "argmax")      # arg*: the step where it was
NAMED_METRICS = {"best_val_loss": "val_loss:min", "best_val_step": "val_loss:argmin"}
STANDARD_COLUMNS = ("val_loss", "val_accuracy", "train_loss", "tokens_per_s")


def metric_spec(name: str) -> tuple[str, str]:
    """``(key, aggregation)`` of a headline metric: ``KEY`` is the last logged value of that
    metrics.jsonl key, ``KEY:AGG`` its ``AGG`` (one of ``AGGREGATIONS``; ``argmin`` and
    ``argmax`` give the step) over the logged records, and ``NAMED_METRICS`` are shorthands."""
    key, _, how = (NAMED_METRICS.get(name, name) if isinstance(name, str) else "").partition(":")
    how = how or "last"
    if not key or how not in AGGREGATIONS:
        raise ValueError(f"headline metric {name!r}: write KEY or KEY:AGG with AGG one of "
                         f"{', '.join(AGGREGATIONS)}, or one of {', '.join(NAMED_METRICS)}")
    return key, how


def checked_headline(names, where: str) -> list[str]:
    """``names`` if it is a list of valid headline metrics, each once and none a standard
    column of the report; else a one-line ValueError naming ``where`` they came from."""
    if not isinstance(names, list):
        raise ValueError(f"{where}: headline metrics must be a list, got {names!r}")
    for name in names:
        metric_spec(name)
        if name in STANDARD_COLUMNS or name.startswith("val_loss@") or names.count(name) > 1:
            raise ValueError(f"headline metric {name!r}: the report has that column already")
    return list(names)


def headline_metrics(experiment: str | Path) -> list[str]:
    """The headline metrics the experiment file asks its report for (``get_report()``), each
    checked; none when it defines no ``get_report``."""
    module = load_experiment(experiment)
    spec = module.get_report() if hasattr(module, "get_report") else {}
    if not isinstance(spec, dict) or set(spec) - {"metrics"}:
        raise ValueError(f"get_report() of {str(experiment)!r} must return a dict with only "
                         f"'metrics', got {spec!r}")
    return checked_headline(list(spec.get("metrics", [])), f"get_report() of {str(experiment)!r}")
