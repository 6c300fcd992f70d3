"""The plain Flax peer of ``attnjax bench train`` (``attnjax.bench.peer_gpt``) is the same
model: equal parameter counts per setting, and it learns; ``peer_comparison``
(``attnjax.bench.peer``) reports the two throughputs and their ratio."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.bench import peer_gpt as PEER
from attnjax.bench.peer import ROUNDS, peer_comparison
from attnjax.bench.train import train_settings
from attnjax.data.text import read_bytes
from attnjax.train.state import init_params
from helpers import TINY_TEXT, raises_one_line, tiny_config

count = lambda tree: sum(x.size for x in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("name", [name for name, config in train_settings().items()
                                  if config.model.family == "decoder"])
def test_peer_has_attnjax_parameter_count(name):
    """Every decoder setting, which the benchmark compares with the peer."""
    config = train_settings()[name]
    m = config.model
    peer = PEER.GPT(m.vocab_size, m.d_model, m.num_layers, m.attention.num_heads, m.max_length)
    shapes = jax.eval_shape(peer.init, jax.random.PRNGKey(0),
                            jnp.zeros((1, config.data.length), jnp.int32))["params"]
    ours = jax.eval_shape(lambda: init_params(config))
    assert count(shapes) == count(ours)


def test_peer_learns_and_the_comparison_reports_the_ratio():
    corpus = read_bytes(None)[:200_000]
    result = PEER.throughput(corpus, d_model=32, num_layers=1, num_heads=2, length=16,
                             batch_size=8, steps=60, steps_per_dispatch=10,
                             total_steps=80, warmup=10, learning_rate=3e-3)
    assert result["steps"] == 60 and result["tokens_per_s"] > 0
    assert result["loss"] < np.log(256) - 1.0          # well below the uniform 5.55 nats
    config = tiny_config(TINY_TEXT, **{"model.position.kind": "learned",
                                        "train.steps_per_dispatch": 10, "train.log_every": 10,
                                        "train.eval_every": 10, "train.checkpoint_every": 10})
    row = peer_comparison(config, 20, window_s=0.0)
    assert row["tokens_per_s"] > 0 and row["peer_tokens_per_s"] > 0 and row["rounds"] == ROUNDS
    assert 0 < row["peer_ratio_low"] <= row["peer_ratio"] <= row["peer_ratio_high"]


def test_the_pytorch_peer_is_refused_in_one_line_without_a_python_that_has_torch(capsys):
    """``attnjax bench torch`` runs PyTorch in another interpreter: one that cannot be run, or
    that has no torch (this one), is one line, before anything is measured."""
    import sys

    from attnjax.bench.torch_peer import TorchWorker
    raises_one_line(lambda: TorchWorker("/nonexistent/python"), "--python", "cannot be run")
    raises_one_line(lambda: TorchWorker(sys.executable), "PyTorch worker stopped", "torch")
