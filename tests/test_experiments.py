"""Every experiment file imports and builds a valid config, so none rots."""

from pathlib import Path

import pytest

from attnjax.config import Config
from attnjax.experiment import experiment_config, load_experiment

EXPERIMENTS = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*.py"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiment_builds_its_config(path):
    module = load_experiment(path)
    assert module.__doc__ and "attnjax train" in module.__doc__   # the command is documented
    config = experiment_config(path, ["seed=1"])
    assert isinstance(config, Config) and config.seed == 1


def test_missing_experiment_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_experiment(tmp_path / "nope.py")
