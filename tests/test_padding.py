"""BOS windows and padded batches (``attnjax.data.padding``), the key-padding mask through
``DecoderLM``, the train step and evaluation, and their refusals.

The model tests compare a padded batch against the same real tokens run unpadded, one example
at a time (the independent reference), for every position encoding and every exact kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.config import Config, DataConfig, apply_overrides
from attnjax.data import Dataset, load_dataset
from attnjax.data.padding import frame
from attnjax.models.decoder import DecoderLM
from attnjax.config.kernel import kernel_request
from attnjax.nn.slots import padding_arguments
from attnjax.registry import KERNELS, POSITIONS
from attnjax.train import loop
from attnjax.train.state import init_state
from attnjax.train.step import make_train_step
from helpers import TINY_TEXT, tiny_config

L = 12                                  # padded row length
LENGTHS = np.array([7, 1])              # real lengths: partly padded, a single token
RNG = np.random.default_rng(0)
CORPUS = RNG.integers(0, 256, (len(LENGTHS), L + 1))


DATA = np.random.default_rng(1).integers(0, 256, 4096).astype(np.uint8)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "bytes.bin"
    path.write_bytes(DATA.tobytes())
    return path


@pytest.fixture(scope="module")
def corpora(corpus_file):
    """``{task: data.path}``: the same tokens as bytes and as a uint16 token file."""
    tokens = corpus_file.with_name("tokens.bin")
    DATA.astype(np.uint16).tofile(tokens)
    return {"text": str(corpus_file), "tokens": str(tokens)}


def in_corpus(row) -> bool:
    """Whether ``row`` is a run of consecutive corpus tokens."""
    views = np.lib.stride_tricks.sliding_window_view(DATA, len(row))
    return bool((views == np.asarray(row)).all(1).any())


def text_config(corpus_file, **overrides) -> Config:
    return tiny_config(TINY_TEXT, **{"data.path": str(corpus_file), **overrides})


def padded(side: str, pads, lengths=LENGTHS) -> dict:
    return frame(jnp.asarray(CORPUS), jnp.asarray(lengths), pads, bos_token=None, padding=side)


def logits_of(model_config, params, batch=None, tokens=None) -> np.ndarray:
    """The logits of a padded ``batch`` (with its positions and mask), or of ``tokens``."""
    model = DecoderLM(model_config)
    if batch is None:
        return np.asarray(model.apply({"params": params}, tokens)[0])
    return np.asarray(model.apply({"params": params}, batch["inputs"],
                                  batch["positions"], token_mask=batch["token_mask"])[0])


def unpadded_logits(model_config, params, batch) -> list[np.ndarray]:
    """The reference: each example's real tokens run as an unpadded sequence, by the model's
    unpadded path (no positions, no mask). A causal model runs them all in one call, each at the
    start of its row: its first n outputs do not see what follows; otherwise one by one."""
    inputs, mask = np.asarray(batch["inputs"]), np.asarray(batch["token_mask"])
    real = [row[keep] for row, keep in zip(inputs, mask)]
    if not model_config.attention.causal:
        return [logits_of(model_config, params, tokens=r[None])[0] for r in real]
    front = np.zeros_like(inputs)
    for row, tokens in zip(front, real):
        row[:len(tokens)] = tokens
    logits = logits_of(model_config, params, tokens=front)
    return [out[:len(tokens)] for out, tokens in zip(logits, real)]


def real_token_ce(model_config, params, batch) -> float:
    """The mean cross-entropy of the real targets under the unpadded reference."""
    targets, mask = np.asarray(batch["targets"]), np.asarray(batch["token_mask"])
    ce = [jax.nn.logsumexp(out, -1) - out[np.arange(len(out)), y[keep]]
          for out, y, keep in zip(unpadded_logits(model_config, params, batch), targets, mask)]
    return float(np.mean(np.concatenate(ce)))


def init(model_config):
    return DecoderLM(model_config).init(jax.random.key(0), jnp.zeros((1, L), jnp.int32))["params"]


def assert_real_logits_equal_unpadded(model_config, params, batch, atol=1e-5):
    """The padded batch's logits on each example's real tokens equal the unpadded reference
    (float32); and no logit, pad rows included, is NaN."""
    out = logits_of(model_config, params, batch)
    assert np.isfinite(out).all()
    mask = np.asarray(batch["token_mask"])
    for row, keep, alone in zip(out, mask, unpadded_logits(model_config, params, batch)):
        np.testing.assert_allclose(row[keep], alone, atol=atol, rtol=0)


# ------------------------------------------------------------------------------------ data

def test_frame_by_hand():
    corpus = np.array([[10, 11, 12, 13, 14]])      # L = 4
    left = frame(corpus, np.array([2]), 0, bos_token=None, padding="left", xp=np)
    np.testing.assert_array_equal(left["inputs"], [[0, 0, 10, 11]])
    np.testing.assert_array_equal(left["targets"], [[0, 0, 11, 12]])
    np.testing.assert_array_equal(left["weights"], [[0, 0, 1, 1]])
    np.testing.assert_array_equal(left["positions"], [[0, 0, 0, 1]])
    right = frame(corpus, np.array([3]), 9, bos_token=None, padding="right", xp=np)
    np.testing.assert_array_equal(right["inputs"], [[10, 11, 12, 9]])
    np.testing.assert_array_equal(right["targets"], [[11, 12, 13, 9]])
    np.testing.assert_array_equal(right["positions"], [[0, 1, 2, 3]])
    np.testing.assert_array_equal(right["token_mask"], [[True, True, True, False]])
    bos = frame(corpus[:, :4], np.array([3]), 0, bos_token=7, padding="left", xp=np)
    np.testing.assert_array_equal(bos["inputs"], [[0, 7, 10, 11]])      # BOS at position 0
    np.testing.assert_array_equal(bos["targets"], [[0, 10, 11, 12]])    # BOS is never a target
    np.testing.assert_array_equal(bos["positions"], [[0, 0, 1, 2]])
    # jax.numpy (the on-device path) agrees with numpy
    jax_left = frame(jnp.asarray(corpus), jnp.asarray([2]), 0, bos_token=None, padding="left")
    for key, value in left.items():
        np.testing.assert_array_equal(np.asarray(jax_left[key]), value)


@pytest.mark.parametrize("task", ["text", "tokens"])
def test_bos_windows(task, corpora):
    config = DataConfig(task=task, path=corpora[task], length=16, bos_token=256,
                        vocab_size=256)
    ds = Dataset(config)
    batch = {k: np.asarray(v) for k, v in ds.batch(3, 5, 8, 16, "train").items()}
    assert set(batch) == {"inputs", "targets", "weights"}
    x, y = batch["inputs"], batch["targets"]
    assert (x[:, 0] == 256).all() and (x[:, 1:] < 256).all()    # BOS before every window
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])          # then the corpus, shifted
    np.testing.assert_array_equal(batch["weights"], 1.0)         # every target is corpus text
    assert all(in_corpus(row) for row in y)                     # targets: unshifted corpus
    again = ds.batch(3, 5, 8, 16, "train")
    for key in batch:
        np.testing.assert_array_equal(batch[key], np.asarray(again[key]))
    assert not np.array_equal(x, np.asarray(ds.batch(3, 6, 8, 16, "train")["inputs"]))


@pytest.mark.parametrize("task", ["text", "tokens"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batches(task, side, corpora):
    base = dict(task=task, path=corpora[task], length=L, vocab_size=256)
    unpadded = load_dataset(DataConfig(**base)).batch(2, 7, 16, L, "val")
    assert set(unpadded) == {"inputs", "targets", "weights"}    # as before padding existed
    ds = Dataset(DataConfig(**base, padding=side, min_length=3, pad_token=0))
    batch = {k: np.asarray(v) for k, v in ds.batch(2, 7, 16, L, "val").items()}
    again = ds.batch(2, 7, 16, L, "val")
    for key in batch:                                           # a function of (seed, step, split)
        np.testing.assert_array_equal(batch[key], np.asarray(again[key]))
    mask = batch["token_mask"]
    np.testing.assert_array_equal(batch["weights"], mask)       # no loss on pads
    n = mask.sum(1)
    assert n.min() >= 3 and n.max() <= L and len(set(n)) > 1
    random = Dataset(DataConfig(**base, padding=side, min_length=3, pad_token=None))
    rand = {k: np.asarray(v) for k, v in random.batch(2, 7, 16, L, "val").items()}
    for b, length in enumerate(n):
        real = np.flatnonzero(mask[b])
        assert real[0] == (L - length if side == "left" else 0)  # contiguous on its side
        np.testing.assert_array_equal(real, real[0] + np.arange(length))
        np.testing.assert_array_equal(batch["positions"][b][real], np.arange(length))
        for key in ("inputs", "targets"):                       # the unpadded window's prefix
            prefix = np.asarray(unpadded[key])[b][:length]
            np.testing.assert_array_equal(batch[key][b][real], prefix)
            assert (batch[key][b][~mask[b]] == 0).all()
    # random pad content changes the pads and nothing else
    for key in ("inputs", "targets"):
        np.testing.assert_array_equal(rand[key][mask], batch[key][mask])
    assert len(np.unique(rand["inputs"][~mask])) > 10
    for key in ("weights", "positions", "token_mask"):
        np.testing.assert_array_equal(rand[key], batch[key])


# ----------------------------------------------------------------------------------- model

@pytest.mark.parametrize("kind", POSITIONS.names())
def test_padded_logits_equal_unpadded_for_every_position_encoding(kind, corpus_file):
    model = text_config(corpus_file, **{"model.position.kind": kind}).model
    params = init(model)
    for side in ("left", "right"):
        assert_real_logits_equal_unpadded(model, params,
                                          padded(side, RNG.integers(0, 256, CORPUS[:, 1:].shape)))


@pytest.mark.parametrize("key_padding_mask", [True, False])
def test_padding_arguments(key_padding_mask, corpus_file):
    """What a padded batch asks of the kernel: its positions for every position-based mask and
    bias (the relative ALiBi and T5 biases are shift-invariant, so on contiguous real tokens they
    agree with the index; the positions decide what unmasked pads are), and the key-padding
    mask as segment ids."""
    att = text_config(corpus_file, **{"data.padding": "left", "model.attention.key_padding_mask":
                                      key_padding_mask}).model.attention
    batch = padded("left", 0)
    arguments = padding_arguments(att, batch["positions"], batch["token_mask"])
    for name in ("query_positions", "key_positions"):
        np.testing.assert_array_equal(arguments[name], batch["positions"])
    assert ("segment_ids" in arguments) == key_padding_mask
    if key_padding_mask:
        np.testing.assert_array_equal(arguments["segment_ids"], batch["token_mask"])


EXACT = [name for name, spec in KERNELS.items() if spec.exact and spec.available()
         and {"positions", "segment"} <= spec.supports]


@pytest.mark.parametrize("kernel, causal, layers", [  # reference, one layer: as above
    (k, True, 1) for k in EXACT if k != "reference"] + [("reference", True, 2),
                                                         ("reference", False, 1)])
def test_padded_logits_equal_unpadded_for_every_kernel(kernel, causal, layers, corpus_file):
    """ALiBi (a bias function of the positions); two layers: a pad could also reach the real
    tokens through a later layer's keys; ``causal=False`` leaves the padding mask alone
    (SC8(c)): the real tokens then see each other both ways, exactly as unpadded."""
    settings = {f"model.attention.{k}": v for k, v in KERNELS.get(kernel).test_options}
    model = text_config(corpus_file, **{"model.num_layers": layers, "model.position.kind": "alibi",
                                        "model.attention.kernel": kernel,
                                        "model.attention.causal": causal, **settings}).model
    assert_real_logits_equal_unpadded(model, init(model), padded("left", 0))


def test_without_the_key_padding_mask_left_pads_move_the_logits(corpus_file):
    """The MK7 premise: unmasked left pads change the real tokens' logits with their content;
    right pads (the control) are hidden by the causal mask and change nothing."""
    model = text_config(corpus_file, **{"data.padding": "left",
                                        "model.attention.key_padding_mask": False}).model
    params = init(model)
    zeros, noise = 0, RNG.integers(0, 256, CORPUS[:, 1:].shape)
    real = np.asarray(padded("left", zeros)["token_mask"])
    left = [logits_of(model, params, padded("left", p))[real] for p in (zeros, noise)]
    assert np.abs(left[0] - left[1]).max() > 1e-3
    right = padded("right", zeros)
    assert_real_logits_equal_unpadded(model, params, right)
    real = np.asarray(right["token_mask"])
    np.testing.assert_array_equal(logits_of(model, params, padded("right", noise))[real],
                                  logits_of(model, params, right)[real])


def test_train_step_and_evaluation_score_the_real_tokens_only(corpus_file):
    """One train step on a left-padded batch: its cross-entropy is the unpadded reference's
    over the real tokens, and neither it nor the update depends on the pad content;
    ``evaluate`` (what ``attnjax eval`` runs) gives the reference's validation loss."""
    configs = [text_config(corpus_file, **{"data.padding": "left", "data.min_length": 2,
                                           "data.pad_token": pad, "train.batch_size": 2,
                                           "train.eval_batch_size": 2}) for pad in (0, None)]
    step = jax.jit(make_train_step(configs[0]))
    state = init_state(configs[0])
    datasets = [Dataset(config.data) for config in configs]
    batches = [ds.batch(0, 0, configs[0].train.batch_size, L, "train") for ds in datasets]
    assert not np.array_equal(batches[0]["inputs"], batches[1]["inputs"])
    (new, metrics), (new_other, metrics_other) = [step(state, batch) for batch in batches]
    model = configs[0].model
    np.testing.assert_allclose(metrics["ce"], real_token_ce(model, state.params, batches[0]),
                               rtol=1e-6)
    np.testing.assert_allclose(metrics_other["loss"], metrics["loss"], rtol=1e-6)
    for a, b in zip(*(jax.tree_util.tree_leaves(s.params) for s in (new, new_other))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    loss = loop.evaluate(configs[0], state.params, datasets[0])[L]["loss"]    # eval_batches=1
    val = datasets[0].batch(configs[0].seed, 0, configs[0].train.eval_batch_size, L, "val")
    np.testing.assert_allclose(loss, real_token_ce(model, state.params, val), rtol=1e-6)


# ------------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("overrides, message", [
    ({"data.bos_token": 256}, r"^data\.bos_token=256 must be in \[0, model\.vocab_size=256\)$"),
    ({"data.padding": "left", "data.pad_token": 300},
     r"^data\.pad_token=300 must be in \[0, model\.vocab_size=256\)$"),
    ({"data.min_length": 4}, r"^data\.min_length=4 means nothing with padding='none'"),
    ({"data.pad_token": None}, r"^data\.pad_token=None means nothing with padding='none'"),
    ({"data.padding": "right", "data.min_length": 13},
     r"^data\.min_length=13 exceeds the shortest length 12"),
    ({"data.padding": "right", "data.min_length": 6, "data.eval_lengths": [4]},
     r"^data\.min_length=6 exceeds the shortest length 4"),
    ({"data.padding": "left", "model.attention.kernel": "linear"},
     r"^data\.padding='left' needs per-example positions and a key-padding mask, which "
     r"model\.attention\.kernel='linear' does not support: positions, segment; kernels that "
     r"do: .*chunked"),
    ({"model.attention.key_padding_mask": False},
     r"^model\.attention\.key_padding_mask=False means nothing with data\.padding='none'"),
    ({"model.attention.causal": False, "model.attention.window": 4},
     r"^model\.attention\.causal=False means nothing with window=4"),
])
def test_refusals(overrides, message):
    with pytest.raises(ValueError, match=message) as info:
        tiny_config(TINY_TEXT, **overrides)
    assert "\n" not in str(info.value)


def test_synthetic_tasks_refuse_bos_and_padding():
    for field, value in (("bos_token", 1), ("padding", "left")):
        with pytest.raises(ValueError, match=rf"^data\.{field}={value!r} means nothing with "
                                             r"task='copy'; it is read by task='text' or "
                                             r"'tokens'"):
            DataConfig(task="copy", **{field: value})


def test_decoding_refuses_a_non_causal_model_and_a_padded_batch():
    model = tiny_config(TINY_TEXT, **{"model.attention.causal": False}).model
    with pytest.raises(ValueError, match=r"^decoding with the KV cache: model\.attention\."
                                         r"causal=False cannot decode"):
        kernel_request(model, decode=True)
    causal = apply_overrides(Config(), TINY_TEXT).model
    tokens = jnp.zeros((1, 4), jnp.int32)
    with pytest.raises(ValueError, match="token_mask"):
        DecoderLM(causal).init(jax.random.key(0), tokens, decode=True,
                               token_mask=jnp.ones((1, 4), bool))
