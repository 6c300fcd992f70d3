"""Evaluation variants: a finished run evaluated again with overrides applied at evaluation
only, e.g. a RoPE checkpoint with YaRN scaling. An experiment declares them with

    def get_eval_variants():
        return [{"label": "rope+yarn", "run": {"model.position.kind": "rope"},
                 "overrides": {"model.position.rope_scaling": "yarn"},
                 "scale_with_length": True}]

Every finished run whose config matches all of ``run`` is evaluated at its training length
and each ``data.eval_lengths``; ``scale_with_length`` sets ``model.position.rope_scale =
max(1, eval_length / data.length)`` per length (the factor s of PI, NTK and YaRN). Results go
to the run directory (``RunDir.write_eval_variant``) and the sweep record (``evals``).
"""

from __future__ import annotations

from pathlib import Path

from attnjax.config import Config, apply_overrides, to_dict
from attnjax.data import load_dataset
from attnjax.experiment import load_experiment
from attnjax.models import check_same_parameters
from attnjax.sweep.record import entry
from attnjax.sweep.spec import Run
from attnjax.train.loop import evaluate

_KEYS = {"label", "run", "overrides", "scale_with_length"}


def _matches(config: Config, wanted: dict) -> bool:
    flat = to_dict(config)
    for key, value in wanted.items():
        node = flat
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            return False
    return True


def variant_config(config: Config, variant: dict, length: int) -> Config:
    """The config a variant evaluates ``config``'s checkpoint with at ``length``."""
    overrides = dict(variant.get("overrides", {}))
    if variant.get("scale_with_length"):
        overrides["model.position.rope_scale"] = max(1.0, length / config.data.length)
    return apply_overrides(config, overrides)


def eval_variants(experiment: str | Path, runs: list[Run]) -> list[dict]:
    """The experiment's ``get_eval_variants()``, checked against its runs before training."""
    module = load_experiment(experiment)
    variants = module.get_eval_variants() if hasattr(module, "get_eval_variants") else []
    for variant in variants:
        unknown = set(variant) - _KEYS
        if unknown or "label" not in variant or "run" not in variant:
            raise ValueError(f"eval variant {variant.get('label')!r}: needs 'label' and 'run', "
                             f"may have {', '.join(sorted(_KEYS))}; got {sorted(variant)}")
        matching = [r for r in runs if _matches(r.config, variant["run"])]
        if not matching:
            raise ValueError(f"eval variant {variant['label']!r}: no run matches "
                             f"{variant['run']}")
        overrides = [f"{k}={v}" for k, v in dict(variant.get("overrides", {})).items()]
        for run in matching:
            for length in (run.config.data.length,) + run.config.data.eval_lengths:
                try:
                    changed = variant_config(run.config, variant, length)
                    check_same_parameters(run.config.model, changed.model, overrides)
                except ValueError as error:
                    raise ValueError(f"eval variant {variant['label']!r} on {run.name}: "
                                     f"{error}") from None
    return variants


def evaluate_variants(sweep, runs: list[Run], variants: list[dict]):
    """Evaluate each variant on every finished matching run that lacks it."""
    if not variants:
        return
    for run in runs:
        item = entry(sweep.record, run.name)
        if item["status"] != "finished":
            continue
        run_dir = sweep.run_dir(run)
        done = run_dir.evals()
        for variant in (v for v in variants if _matches(run.config, v["run"])):
            label = variant["label"]
            if label not in done:
                config, params, _ = run_dir.params("best")
                results = {}
                for length in (config.data.length,) + config.data.eval_lengths:
                    scaled = variant_config(config, variant, length)
                    results[str(length)] = evaluate(scaled, params, load_dataset(scaled.data),
                                                    [length])[length]
                run_dir.write_eval_variant(label, results)
                done[label] = results
                sweep.log(f"  {run.name} + {label}: " + ", ".join(
                    f"{k}: {v['loss']:.3f}" for k, v in results.items()))
            item.setdefault("evals", {})[label] = done[label]
    sweep.save()
