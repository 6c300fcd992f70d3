"""The logit lens (``attnjax.analysis.lens``): on imported decoders (``tests/data/hf``) the last
layer's readout is the model's own logits (and the ``transformers`` reference), an earlier
layer's is its residual stream through the final norm and the output layer computed here in
float64 NumPy, and ``attnjax lens`` writes its picture and table; an encoder is refused."""

from __future__ import annotations

import numpy as np
import pytest

from attnjax.analysis.lens import lens_logits, logit_lens
from attnjax.models import build
from attnjax.models.probe import capture_streams
from attnjax.pretrained.run import import_run
from attnjax.rundir import RunDir
from helpers import REPO, raises_one_line, run_cli

FIXTURES = REPO / "tests" / "data" / "hf"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lens")
    for name in ("gpt2", "llama", "bert"):
        import_run(FIXTURES / name, root / name)
    return {name: RunDir(root / name) for name in ("gpt2", "llama", "bert")}


def readout_float64(config, params, stream) -> np.ndarray:
    """The final norm (LayerNorm with bias, or RMSNorm) and the output layer, in float64."""
    x = np.asarray(stream, np.float64)
    norm = {k: np.asarray(v, np.float64) for k, v in params["final_norm"].items()}
    eps = config.model.norm_eps
    if config.model.norm == "layer":
        x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
        x = x * norm["scale"] + norm["bias"]
    else:
        x = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * norm["scale"]
    if config.model.tie_embeddings:
        return x @ np.asarray(params["embed"]["embedding"], np.float64).T
    return x @ np.asarray(params["unembed"]["kernel"], np.float64)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_last_layer_is_the_models_logits_and_earlier_ones_their_stream_read_out(runs, name):
    config, params, _ = runs[name].params()
    tokens = np.load(FIXTURES / name / "reference.npz")["input_ids"]
    lens = lens_logits(config, params, tokens)                      # [layers, B, T, V]
    assert lens.shape == (config.model.num_layers, *tokens.shape, config.model.vocab_size)
    logits, _ = build(config.model).apply({"params": params}, tokens)
    np.testing.assert_allclose(lens[-1], logits, rtol=0, atol=1e-5)
    np.testing.assert_allclose(lens[-1], np.load(FIXTURES / name / "reference.npz")["logits"],
                               rtol=0, atol=1e-5)
    stream = capture_streams(config.model, params, tokens)["residual"][0]
    np.testing.assert_allclose(lens[0], readout_float64(config, params, stream), rtol=0,
                               atol=1e-5)
    assert np.abs(lens[0] - lens[-1]).max() > 1e-2                # layer 0 is not the output


def test_the_lens_command_writes_its_picture_and_table_and_refuses_an_encoder(runs, capsys,
                                                                             tmp_path):
    config, params, _ = runs["gpt2"].params()
    text = "The dog sat on the mat by the door."
    code, out, err = run_cli(capsys, "lens", str(runs["gpt2"].path), "--text", text, "--out",
                             str(tmp_path / "lens"))
    assert code == 0, err
    table = (tmp_path / "lens" / "lens.md").read_text()
    tokens = np.load(FIXTURES / "gpt2" / "reference.npz")["input_ids"][:1]
    result = logit_lens(config, params, tokens)
    assert table.count("\n| ") == 1 + tokens.shape[1] - 1          # header + one row per target
    first = table.splitlines()[6].split(" | ")                     # position 0; L0, L1 last
    for layer, cell in enumerate(first[2:]):
        assert cell.rstrip(" |").endswith(f"true {result['target_prob'][layer, 0]:.2f}")
        assert f" {result['top_probs'][layer, 0, 0]:.2f}," in cell
    assert (tmp_path / "lens" / "lens.png").stat().st_size > 10_000
    bert, bert_params, _ = runs["bert"].params()
    raises_one_line(lambda: lens_logits(bert, bert_params, tokens),
                    "the logit lens reads a decoder's residual stream; this run's model.family "
                    "is 'encoder'")
