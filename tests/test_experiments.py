"""Every experiment file imports, builds a valid config, expands its sweep and names valid
report columns, so none rots.

No training here: configs are built and validated only (fast).
"""

import pytest

from attnjax.sweep.headline import headline_metrics
from attnjax.config import Config
from attnjax.experiment import experiment_config, load_experiment
from attnjax.sweep import expand
from attnjax.sweep.launch import vmap_groups
from attnjax.sweep.variants import eval_variants, variant_config
from helpers import REPO

EXPERIMENTS = sorted((REPO / "experiments").glob("*.py"))
SWEEPS = [p for p in EXPERIMENTS if hasattr(load_experiment(p), "get_sweep")]


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiment_builds_its_config(path):
    module = load_experiment(path)
    config = experiment_config(path, ["seed=1"])
    assert isinstance(config, Config) and config.seed == 1
    # the command that runs it is documented in the module docstring
    assert module.__doc__
    command = (f"attnjax sweep experiments/{path.name}" if hasattr(module, "get_sweep")
               else f"attnjax train experiments/{path.name}")
    assert command in module.__doc__, f"{path.name}: docstring lacks {command!r}"
    if hasattr(module, "get_sweep"):
        assert "attnjax report" in module.__doc__


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_sweep_expands_to_valid_uniquely_named_runs(path):
    runs = expand(path)                         # validates every config, refuses duplicate names
    assert runs and len({r.name for r in runs}) == len(runs)
    assert all(isinstance(r.config, Config) for r in runs)
    for run in runs:                            # every override names a real field
        for key in run.overrides:
            node = run.config
            for part in key.split("."):
                assert hasattr(node, part), f"{path.name}: run {run.name}: no field {key}"
                node = getattr(node, part)


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_seed_replicas_share_one_vmapped_program(path):
    """Runs that differ only in the seed must land in one vmap group (the cheap way to repeat
    a noisy comparison)."""
    runs = expand(path)
    by_config = {}
    for run in runs:
        rest = tuple(sorted((k, repr(v)) for k, v in run.overrides.items() if k != "seed"))
        by_config.setdefault(rest, set()).add(run.name)
    groups = [{r.name for r in group} for group in vmap_groups(runs)]
    for names in by_config.values():
        assert any(names <= group for group in groups), f"{path.name}: {sorted(names)} split"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_eval_variants_apply_to_runs_and_build(path):
    module = load_experiment(path)
    runs = expand(path)
    variants = eval_variants(path, runs)        # raises when a variant matches no run
    assert len({v["label"] for v in variants}) == len(variants)
    for variant in variants:
        for key in list(variant["run"]) + list(variant.get("overrides", {})):
            node = runs[0].config
            for part in key.split("."):
                assert hasattr(node, part), f"{path.name}: variant {variant['label']}: {key}"
                node = getattr(node, part)
        for run in runs:
            config = run.config
            for length in (config.data.length,) + config.data.eval_lengths:
                if all(_get(config, k) == v for k, v in variant["run"].items()):
                    scaled = variant_config(config, variant, length)
                    if variant.get("scale_with_length"):
                        assert scaled.model.position.rope_scale == max(
                            1.0, length / config.data.length)
    assert not hasattr(module, "get_eval_variants") or variants


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_report_columns_are_valid_and_documented(path):
    module = load_experiment(path)
    names = headline_metrics(path)              # raises on a bad get_report()
    assert not hasattr(module, "get_report") or names
    for name in names:                          # the docstring says what each column shows
        assert f"`{name}`" in module.__doc__, f"{path.name}: docstring lacks `{name}`"


def _get(config, key):
    for part in key.split("."):
        config = getattr(config, part)
    return config


def test_demo_sweep_is_small():
    """``make demo`` runs experiments/demo.py: keep it a few minutes on 2 CPU cores."""
    runs = expand(EXPERIMENTS[0].with_name("demo.py"))
    tokens = sum(r.config.train.steps * r.config.train.batch_size * r.config.data.length
                 for r in runs)
    assert len(runs) <= 8 and tokens <= 8_000_000
    assert len(vmap_groups(runs)) <= 4          # few compilations


def test_missing_experiment_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_experiment(tmp_path / "nope.py")
