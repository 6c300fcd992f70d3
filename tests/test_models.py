"""Model families (``attnjax.models``): every registered family builds, trains a step and
evaluates through the seam; nothing above ``attnjax.models`` names a model class; a family is
chosen, refused and defaulted by the config as any registry choice is."""

from __future__ import annotations

import ast

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.config import Config, apply_overrides, from_dict, to_dict
from attnjax.data import Dataset
from attnjax.generate import generate
from attnjax.models import Family, build, family
from attnjax.models.decoder import DecoderLM
from attnjax.models.family import scored_sums
from attnjax.registry import MODELS
from attnjax.train.state import init_params
from attnjax.train.step import make_eval_step
from helpers import REPO, TINY_INDUCTION, TINY_MLM, TINY_SEQ2SEQ, raises_one_line, tiny_config

FAMILIES = MODELS.names()
# a tiny config of each family (a new family adds its own here)
TINY_OF = {"decoder": TINY_INDUCTION, "encoder": TINY_MLM, "seq2seq": TINY_SEQ2SEQ}
# the layers above attnjax.models: they reach a model through family() and build() only
ABOVE_MODELS = ("train", "generate.py", "translate.py", "sweep", "analysis", "audit", "bench",
                "cli")


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_builds_and_scores_a_batch_through_the_seam(name):
    assert name in TINY_OF, f"add a tiny config of the {name!r} family to TINY_OF"
    config = tiny_config(TINY_OF[name])
    batch = Dataset(config.data).batch(0, 0, 2, config.data.length, "val")
    params = init_params(config)
    logits, aux = build(config.model).apply({"params": params}, batch["inputs"],
                                            **family(config.model).arguments(batch),
                                            return_weights=True)
    chex.assert_shape(logits, (2, config.data.length, config.model.vocab_size))
    assert len(aux["attn_weights"]) == config.model.num_layers
    sums = make_eval_step(config)(params, batch, 0)
    expected = family(config.model).sums(logits, batch)
    for key in ("ce", "correct", "weight"):
        np.testing.assert_allclose(sums[key], expected[key], rtol=1e-6, err_msg=key)


def test_the_decoder_is_the_default_and_a_config_without_a_family_loads_as_one():
    assert Config().model.family == "decoder"
    stored = to_dict(Config())
    del stored["model"]["family"]                   # a run directory written before families
    assert from_dict(Config, stored) == Config()
    assert family(Config().model).module is DecoderLM


def test_the_decoder_objective_is_next_token_cross_entropy_on_scored_positions():
    logits = jnp.log(jnp.asarray([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]]))
    batch = {"targets": jnp.asarray([[1, 1]]), "weights": jnp.asarray([[1.0, 0.0]])}
    sums = scored_sums(logits, batch)
    np.testing.assert_allclose(sums["ce"], np.log(4), rtol=1e-6)     # -log 0.25, row 2 unscored
    np.testing.assert_allclose(sums["z"], 0.0, atol=1e-6)            # probabilities: log Z = 0
    assert float(sums["correct"]) == 0.0 and float(sums["weight"]) == 1.0


def test_an_unknown_family_is_refused_with_the_choices():
    raises_one_line(lambda: apply_overrides(Config(), {"model.family": "bert"}),
                    "model.family", "'bert'", "decoder")


@pytest.fixture
def registered():
    """Register families for one test and remove them after it (the registry is global)."""
    names = []

    def register(name: str, entry: Family):
        names.append(name)
        MODELS.register(name, entry)

    yield register
    for name in names:
        MODELS._entries.pop(name)


def test_a_family_trains_the_tasks_of_its_objective_only(registered):
    registered("classifier", family(Config().model)._replace(
        objective=lambda model: "classification"))
    raises_one_line(lambda: tiny_config(TINY_INDUCTION, **{"model.family": "classifier"}),
                    "data.task='induction' trains next_token, not the classification of this "
                    "model.family='classifier'", "tasks: first_repeat")
    raises_one_line(lambda: apply_overrides(Config(), {"data.task": "mlm"}),
                    "data.task='mlm' trains mlm, not the next_token of this "
                    "model.family='decoder'", "tasks: text, tokens")


def test_a_family_that_does_not_decode_is_refused_before_anything_compiles(registered):
    registered("no_cache", family(Config().model)._replace(decodes=False))
    config = tiny_config(TINY_INDUCTION, **{"model.family": "no_cache"})
    message = raises_one_line(lambda: generate(config, None, [[1, 2]], 2),
                              "model.family='no_cache' does not decode token by token")
    assert "decoder" in message


def test_a_new_family_is_one_registration(registered):
    """A family registered from outside the package (here: the decoder's module under another
    name) trains and evaluates with nothing else changed."""
    registered("twin", family(Config().model))
    config = tiny_config(TINY_INDUCTION, **{"model.family": "twin", "seed": 3})
    reference = tiny_config(TINY_INDUCTION, seed=3)
    batch = Dataset(config.data).batch(0, 0, 2, config.data.length, "val")
    a, b = init_params(config), init_params(reference)
    chex.assert_trees_all_equal(a, b)
    chex.assert_trees_all_equal(make_eval_step(config)(a, batch, 0),
                                make_eval_step(reference)(b, batch, 0))


def _names_in(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              for alias in node.names}
    names |= {node.module for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    return names


def test_nothing_above_the_models_names_a_model_class():
    classes = {entry.module.__name__ for _, entry in MODELS.items()}
    modules = {entry.module.__module__ for _, entry in MODELS.items()}
    offenders = []
    for top in ABOVE_MODELS:
        root = REPO / "attnjax" / top
        for path in [root] if root.suffix == ".py" else sorted(root.rglob("*.py")):
            named = _names_in(path) & (classes | modules)
            if named:
                offenders.append(f"{path.relative_to(REPO)}: {sorted(named)}")
    assert "decoder" in FAMILIES and not offenders, offenders
