"""Datasets: determinism in (seed, step, split), task semantics, splits, token files."""

import re

import chex
import jax
import numpy as np
import pytest

from attnjax.config import DataConfig, apply_overrides
from attnjax.data import Dataset, accuracy
from attnjax.data.text import builtin_corpus_files, split_bounds
from attnjax.registry import TASKS
from attnjax.train import hyper
from attnjax.train.parallel import Runner
from attnjax.train.state import init_state
from helpers import TINY_TEXT, tiny_config

ON_DEVICE = [name for name in TASKS.names() if name != "tokens"]   # tokens: a file, below


def synthetic(task, length=32, **kw):
    pairs = {"num_pairs": 4} if task == "mqar" else {}
    return Dataset(DataConfig(task=task, length=length, **{"vocab_size": 64, **pairs, **kw}))


@pytest.mark.parametrize("task", ON_DEVICE)
def test_batches_are_a_function_of_seed_step_split(task):
    text = "vocab_size" not in TASKS.get(task).reads            # its vocabulary: text's
    ds = Dataset(DataConfig(task=task, length=32)) if text else synthetic(task)
    a = ds.batch(0, 5, 4, 32, "train")
    b = ds.batch(0, 5, 4, 32, "train")
    chex.assert_trees_all_equal(a, b)
    assert a["inputs"].shape == (4, 32)
    per_example = TASKS.get(task).objective == "classification"     # one label per example
    for key in ("targets", "weights"):
        assert a[key].shape == ((4,) if per_example else (4, 32))
    assert not np.array_equal(a["inputs"], ds.batch(0, 6, 4, 32, "train")["inputs"])
    assert not np.array_equal(a["inputs"], ds.batch(1, 5, 4, 32, "train")["inputs"])
    assert not np.array_equal(a["inputs"], ds.batch(0, 5, 4, 32, "val")["inputs"])


def test_mqar_queries_recall_their_values():
    batch = synthetic("mqar", length=40).batch(0, 0, 16, 40, "train")
    inputs, targets, weights = (np.asarray(batch[k]) for k in ("inputs", "targets", "weights"))
    for x, y, w in zip(inputs, targets, weights):
        keys, values = x[0:8:2], x[1:8:2]
        assert len(set(keys)) == 4 and keys.max() < 32 and values.min() >= 32
        scored = np.flatnonzero(w)
        assert len(scored) == 4 and scored.min() >= 8
        lookup = dict(zip(keys, values))
        assert sorted(x[scored]) == sorted(keys)              # every key is queried once
        for t in scored:
            assert y[t] == lookup[x[t]]                     # target = the key's value


ZOOLOGY = {"mqar_filler": "random", "mqar_query_power": 0.01, "mqar_distinct_values": True}


def test_mqar_with_zoologys_choices_still_recalls_and_fills_with_tokens():
    batch = synthetic("mqar", length=40, **ZOOLOGY).batch(0, 0, 64, 40, "train")
    inputs, targets, weights = (np.asarray(batch[k]) for k in ("inputs", "targets", "weights"))
    for x, y, w in zip(inputs, targets, weights):
        keys, values = x[0:8:2], x[1:8:2]
        assert len(set(keys)) == 4 and len(set(values)) == 4           # distinct values too
        scored = np.flatnonzero(w)
        assert len(scored) == 4 and scored.min() >= 8 and (scored % 2 == 0).all()  # even slots
        assert sorted(x[scored]) == sorted(keys)
        lookup = dict(zip(keys, values))
        assert all(y[t] == lookup[x[t]] for t in scored)
    assert inputs.min() >= 1 and len(np.unique(inputs[:, 8:])) > 40     # no zero filler


@pytest.mark.parametrize("power", [0.01, 1.0])
def test_mqar_query_gaps_follow_the_power_law(power):
    """Query slots ``2P + 2g``; the gaps are a draw without replacement with ``p(g) ∝
    (g + 1)^(power - 1)``: their histogram matches numpy's sequential draw (the same law)."""
    pairs, length, n = 4, 48, 4000
    batch = synthetic("mqar", length=length, mqar_query_power=power).batch(0, 0, n, length,
                                                                            "train")
    gaps = (np.flatnonzero(np.asarray(batch["weights"]).ravel()) % length - 2 * pairs) // 2
    space = (length - 2 * pairs) // 2
    p = np.arange(1, space + 1) ** (power - 1.0)
    rng = np.random.default_rng(0)
    reference = np.concatenate([rng.choice(space, pairs, replace=False, p=p / p.sum())
                                for _ in range(n)])
    ours, theirs = (np.bincount(g, minlength=space) / len(g) for g in (gaps, reference))
    np.testing.assert_allclose(ours, theirs, atol=0.02)      # 16k draws each: sd < 0.004
    if power < 1:
        assert ours[:4].sum() > 0.5 > 4 / space                # most queries near the pairs


@pytest.mark.parametrize("settings, message", [
    ({"length": 15, "mqar_query_power": 0.01}, "data.length=15 must be >= 4 * num_pairs = 16"),
    ({"vocab_size": 6, "mqar_distinct_values": True},
     "data.mqar_distinct_values needs num_pairs=4 <= the 3 values of vocab_size=6"),
])
def test_mqar_choices_that_cannot_be_honoured_are_refused(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        synthetic("mqar", **settings)


def test_copy_and_sort_score_the_second_half():
    for task, transform in (("copy", lambda s: s), ("sort", np.sort)):
        batch = synthetic(task, length=20).batch(0, 0, 3, 20, "train")
        x, y, w = (np.asarray(batch[k]) for k in ("inputs", "targets", "weights"))
        assert x[0, 10] == 63                                # separator = last token
        np.testing.assert_array_equal(y[:, 10:20], transform(x[:, :10]))
        np.testing.assert_array_equal(w, np.broadcast_to(np.arange(20) >= 10, (3, 20)))


def test_induction_scores_the_repeated_block():
    batch = synthetic("induction", length=32).batch(0, 0, 8, 32, "train")
    x, y, w = (np.asarray(batch[k]) for k in ("inputs", "targets", "weights"))
    m = 8
    seq = np.concatenate([x, y[:, -1:]], axis=1)
    starts = set()
    for s, wi in zip(seq, w):
        scored = np.flatnonzero(wi)
        assert len(scored) == m - 1
        start = scored[0]
        starts.add(int(start))
        np.testing.assert_array_equal(s[start:start + m], s[:m])   # the block repeats
    assert len(starts) > 1                                          # at a random offset


def test_uniform_tokens_are_iid_and_every_target_is_scored():
    batch = synthetic("uniform", length=64, vocab_size=16).batch(0, 0, 64, 64, "train")
    x, y, w = (np.asarray(batch[k]) for k in ("inputs", "targets", "weights"))
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])                # next-token shift
    assert w.min() == 1.0
    counts = np.bincount(x.ravel(), minlength=16) / x.size
    assert np.abs(counts - 1 / 16).max() < 0.01                      # 4096 draws: ~0.004 sd
    same = np.mean(y[:, :-1] == x[:, :-1])                           # no copy structure
    assert abs(same - 1 / 16) < 0.02


def test_text_split_and_windows(tmp_path):
    text = np.random.default_rng(0).integers(0, 256, 10240, dtype=np.uint8).tobytes()
    (tmp_path / "a.txt").write_bytes(text)
    ds = Dataset(DataConfig(task="text", path=str(tmp_path / "a.txt"), length=16,
                            val_fraction=0.25))
    cut = split_bounds(len(text), "train", 0.25)[1]
    for split in ("train", "val"):
        b = ds.batch(3, 0, 8, 16, split)
        x, y = np.asarray(b["inputs"]), np.asarray(b["targets"])
        np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
        windows = np.concatenate([x, y[:, -1:]], axis=1).astype(np.uint8)
        starts = [text.find(bytes(row)) for row in windows]   # windows are unique in random bytes
        assert all(s >= 0 for s in starts)                   # contiguous bytes of the file
        # whole windows (17 bytes) lie inside their split
        assert all((s + 17 <= cut) if split == "train" else (s >= cut) for s in starts)


def test_a_corpus_reaches_the_programs_that_sample_it_as_an_argument(tmp_path):
    """A corpus is not embedded in the programs that draw its windows (each program and each of
    its compilation-cache entries would carry a copy): the batch program and the training
    program lower to modules of the same size (within 1%) for a corpus of 20 KB and of 2 MB."""
    config = tiny_config(TINY_TEXT)
    texts = {}
    for size in (20_000, 2_000_000):
        path = tmp_path / f"{size}.txt"
        path.write_bytes(np.random.default_rng(size).integers(0, 256, size, np.uint8).tobytes())
        cfg = apply_overrides(config, {"data.path": str(path)})
        dataset = Dataset(cfg.data)
        runner = Runner(cfg, dataset, jax.devices()[:1])
        texts[size] = [Dataset._device_batch.lower(dataset, 0, 0, 4, 12, "train").as_text(),
                       runner.lower(init_state(cfg), hyper.as_arrays([cfg], False)).as_text()]
    for small, large in zip(texts[20_000], texts[2_000_000], strict=True):
        assert len(small) < 200_000 and len(large) < 1.01 * len(small), (len(small), len(large))


def test_directory_corpus_and_builtin(tmp_path):
    (tmp_path / "b.txt").write_text("bbbb")
    (tmp_path / "a.txt").write_text("aaaa")
    # half for validation: each split holds a window of 4 + 1 (a corpus that cannot is refused)
    ds = Dataset(DataConfig(task="text", path=str(tmp_path), length=4, val_fraction=0.5))
    assert bytes(ds._source.tokens) == b"aaaa\n\nbbbb"
    assert len(builtin_corpus_files()) > 50


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.path"):
        Dataset(DataConfig(task="text", path=str(tmp_path / "nope.txt")))


def test_token_file_is_memory_mapped_and_deterministic(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16) % 500
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    ds = Dataset(DataConfig(task="tokens", path=str(path), vocab_size=500, length=8))
    assert not ds.on_device and isinstance(ds._source.tokens, np.memmap)
    a = ds.batch(0, 2, 4, 8, "train")
    np.testing.assert_array_equal(a["inputs"], ds.batch(0, 2, 4, 8, "train")["inputs"])
    np.testing.assert_array_equal((a["inputs"] + 1) % 500, a["targets"])


@pytest.mark.parametrize("dtype, ids, shown", [("uint16", [3, 500, 7], "from 3 to 500"),
                                               ("int32", [-1, 2, 3], "from -1 to 3")])
def test_token_ids_outside_the_vocabulary_are_refused_when_loaded(tmp_path, dtype, ids, shown):
    path = tmp_path / "tokens.bin"
    np.asarray(ids * 20, dtype).tofile(path)
    config = DataConfig(task="tokens", path=str(path), vocab_size=500, length=8,
                        token_dtype=dtype)
    with pytest.raises(ValueError) as info:
        Dataset(config)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and shown in message
    assert "data.vocab_size=500" in message


def test_task_specific_fields_are_refused_for_other_tasks():
    with pytest.raises(ValueError, match=r"^data\.num_pairs=4 means nothing with task='copy'"):
        DataConfig(task="copy", num_pairs=4)
    with pytest.raises(ValueError, match=r"^data\.path='x' means nothing with task='mqar'"):
        DataConfig(task="mqar", path="x")
    with pytest.raises(ValueError, match=r"^data\.task='nope' is not a known data task; "
                                         r"valid choices: .*text, tokens"):
        DataConfig(task="nope")


def test_accuracy_counts_only_scored_positions():
    logits = np.zeros((1, 3, 4), np.float32)
    logits[0, 0, 1] = logits[0, 1, 2] = logits[0, 2, 3] = 1.0
    batch = {"targets": np.array([[1, 0, 3]]), "weights": np.array([[1.0, 1.0, 0.0]])}
    assert float(accuracy(logits, batch)) == 0.5
