"""Names and sizes the file system or memory cannot hold are refused up front (or, for a run
name, shortened): a run name over 255 bytes, numbers past int32, models and evaluations
that cannot fit in memory, and sampling settings that mean nothing."""

from __future__ import annotations

import json
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax.bench.memory import train_step_memory
from attnjax.config import Config, TrainConfig, apply_overrides
from attnjax.experiment import experiment_config
from attnjax.generate import sample
from attnjax.models.decoder import DecoderLM
from attnjax.rundir import RunDir, SweepDir
from attnjax.sweep import run_name
from attnjax.train import footprint, state, train
from attnjax.train.optim import learning_rate_schedule
from helpers import REPO, TINY_INDUCTION, TINY_TEXT, raises_one_line, run_cli, tiny_config

TEXT = "the quick brown fox jumps over the lazy dog; " * 400
INT32 = 2**31 - 1


def test_a_long_run_name_keeps_a_readable_prefix_and_a_hash_of_the_overrides():
    nineteen = {f"train.axis_{i:02d}": 1_000_000 + i for i in range(19)}     # 19 numeric axes
    full = ",".join(f"axis_{i:02d}={1_000_000 + i}" for i in range(19))
    assert len(full.encode()) > 255
    name = run_name(nineteen)
    assert name == run_name(dict(reversed(list(nineteen.items()))))    # order-free
    assert name.startswith(full[:150]) and len(name.encode()) == 150 + 1 + 16, name
    other = run_name({**nineteen, "train.axis_18": 1_000_019})                # a late axis differs
    assert other != name and other[:150] == name[:150]
    wide = run_name({"x" + "é" * 150: 1})         # the cut would split a two-byte character
    assert wide == "x" + "é" * 74 + "~" + wide[-16:] and len(wide.encode()) == 166
    short = {"model.attention.num_heads": 4, "seed": 1}                   # names that fit stay
    assert run_name(short) == "num_heads=4,seed=1"
    kept = {"data.path": "p" * 230}
    assert run_name(kept) == "path=" + "p" * 230                         # 235 bytes: whole


@pytest.mark.trains
def test_a_sweep_whose_run_name_would_be_300_bytes_trains_and_reports(tmp_path, capsys):
    """A long data.path (or many numeric axes) named a run past the 255 bytes a file name may
    hold: the sweep crashed after writing sweep.json, sweep-status and report on it."""
    corpus = tmp_path
    while len(f"path={corpus / 'corpus.txt'}".encode()) < 300:     # the name in full
        corpus = corpus / ("d" * 60)
    corpus.mkdir(parents=True)
    (corpus / "corpus.txt").write_text(TEXT)
    path = str(corpus / "corpus.txt")
    experiment = tmp_path / "long.py"
    experiment.write_text(textwrap.dedent(f"""
        from attnjax.config import Config, apply_overrides
        def get_config():
            return apply_overrides(Config(), {TINY_TEXT!r})
        def get_sweep():
            return [{{"data.path": {path!r}, "seed": 0}}, {{"data.path": {path!r}, "seed": 1}}]
    """))
    sweep = tmp_path / "sweep"
    code, out, err = run_cli(capsys, "sweep", str(experiment), "--workdir", str(sweep),
                             "--launcher", "sequential", "--no-progress")
    assert code == 0, err
    runs = json.loads((sweep / "sweep.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["finished", "finished"]
    assert [r["overrides"] for r in runs] == [{"data.path": path, "seed": s} for s in (0, 1)]
    names = [r["name"] for r in runs]
    assert len(set(names)) == 2 and all(len(n.encode()) < 255 for n in names), names
    for name, seed in zip(names, (0, 1)):
        config = SweepDir(sweep).run(name).config()
        assert (config.data.path, config.seed) == (path, seed)     # the full overrides
    code, out, err = run_cli(capsys, "sweep-status", str(sweep))
    assert code == 0, err
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:] if line.strip()}
    assert [rows.get(name) for name in names] == ["finished", "finished"], out
    code, out, err = run_cli(capsys, "report", str(sweep))
    assert code == 0, err
    assert (sweep / "report.md").is_file() and (sweep / "results.csv").is_file()


# ------------------------------------------------------------------ numbers JAX holds as int32

MASKED_FILL = {"model.attention.kernel": "masked_fill"}


@pytest.mark.parametrize("overrides, shown", [
    ({"seed": 4294967296}, "seed must be in [0, 2147483647], got 4294967296"),
    ({"seed": 2**31}, "seed must be in [0, 2147483647], got 2147483648"),
    ({"train.steps": 10**12}, "train.steps must be in [1, 2147483647], got 1000000000000"),
    ({"train.warmup_steps": 2**40}, "train.warmup_steps must be in [0, 2147483647]"),
    ({**MASKED_FILL, "model.attention.causal_offset": 2**40},
     "model.attention.causal_offset must be in [-1073741824, 1073741824], got 1099511627776"),
    ({**MASKED_FILL, "model.attention.causal_offset": -2**40},
     "model.attention.causal_offset must be in [-1073741824, 1073741824]"),
    ({"model.max_length": 2**31, "data.length": 2**31},
     "model.max_length must be in [1, 1073741824]"),
    ({"model.vocab_size": 2**32, "data.vocab_size": 2**32, "data.task": "induction"},
     "model.vocab_size must be in [1, 2147483647]"),
    ({"train.eval_every": 2**40}, "train.eval_every must be in [1, 2147483647]"),
])
def test_numbers_past_what_jax_holds_are_refused_when_the_config_is_built(overrides, shown):
    """Each passed validation, then failed in JAX (an OverflowError converting the seed, the
    step count, the warmup or the causal offset to int32) or silently overflowed."""
    raises_one_line(lambda: apply_overrides(Config(), overrides), shown)


@pytest.mark.trains
def test_the_largest_seed_trains(tmp_path):
    config = tiny_config(TINY_INDUCTION, **{"seed": INT32, "train.steps": 5,
                                            "train.log_every": 5, "train.eval_every": 5,
                                            "train.checkpoint_every": 5})
    summary = train(config, tmp_path / "run", progress=False)
    assert summary["step"] == 5 and np.isfinite(RunDir(tmp_path / "run").metrics()[-1]["loss"])


def test_the_schedule_takes_the_largest_step_counts():
    """The learning-rate schedule reads steps and warmup_steps (int32) at the range's end."""
    for warmup in (0, INT32):
        config = TrainConfig(steps=INT32, warmup_steps=warmup)
        schedule = jax.jit(learning_rate_schedule(config))
        rates = [float(schedule(jnp.int32(step))) for step in (0, 2**30, INT32 - 1)]
        assert all(0 < r <= config.learning_rate * (1 + 1e-6) for r in rates), rates


def test_the_largest_causal_offsets_mean_every_key_and_no_key():
    """At the range's ends the shifted diagonal (j <= i + offset) does not overflow int32:
    +2^30 shows every key (as causal=False does), -2^30 none."""
    def logits(**overrides):
        config = tiny_config(TINY_INDUCTION, **MASKED_FILL, **overrides)
        model = DecoderLM(config.model)
        tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 16)
        params = model.init(jax.random.key(0), tokens)["params"]
        return np.asarray(model.apply({"params": params}, tokens)[0])

    every = logits(**{"model.attention.causal_offset": 2**30})
    np.testing.assert_allclose(every, logits(**{"model.attention.causal": False}), rtol=1e-6,
                               atol=1e-6)
    assert not np.allclose(every, logits())
    none = logits(**{"model.attention.causal_offset": -2**30})
    assert np.isfinite(none).all() and not np.allclose(none, logits())


# ------------------------------------------------------------------ memory

def meminfo_available() -> int:
    fields = dict(line.split(":", 1) for line in open("/proc/meminfo") if ":" in line)
    return sum(int(fields[name].split()[0]) * 1024 for name in ("MemAvailable", "SwapFree"))


def compile_events():
    """A list that fills with JAX's compilation events from now until ``stop()`` (tracing,
    as ``jax.eval_shape`` does, is not compiling)."""
    events = []
    def listener(name, *args, **kwargs):
        if name.startswith("/jax/core/compile") and not name.endswith("jaxpr_trace_duration"):
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    stop = lambda: jax.monitoring.unregister_event_duration_listener(listener)
    return events, stop


def refusal(err: str) -> tuple[int, int]:
    """``(needed, available)`` bytes of a one-line memory refusal on stderr."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnjax: error: "), err
    match = re.search(r"needs at least (\d+) bytes .* but (\d+) bytes .* of memory are "
                      r"available \(MemAvailable \+ SwapFree\)", lines[0])
    assert match, lines[0]
    return int(match[1]), int(match[2])


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A tiny byte-level text run, trained (20 steps)."""
    root = tmp_path_factory.mktemp("text")
    train(tiny_config(TINY_TEXT), root / "run", progress=False)
    return root / "run"


def test_a_model_too_big_for_memory_is_refused_before_anything_is_written(tmp_path, capsys):
    experiment = tmp_path / "wide.py"
    experiment.write_text(textwrap.dedent(f"""
        from attnjax.config import Config, apply_overrides
        def get_config():
            return apply_overrides(Config(), {TINY_TEXT!r})
    """))
    events, stop = compile_events()
    try:
        code, out, err = run_cli(capsys, "train", str(experiment), "model.d_model=65536",
                                 "--workdir", str(tmp_path / "run"), "--no-progress")
    finally:
        stop()
    assert code == 2 and out == "", err
    needed, available = refusal(err)
    config = tiny_config(TINY_TEXT, **{"model.d_model": 65536})
    assert needed == sum(footprint.training_needs(config).values())
    # one layer: q, k, v, o (4 d^2) and the MLP (8 d^2) float32 parameters, at least as
    # much again in gradients and twice in AdamW's moments
    assert needed >= 4 * 4 * 12 * 65536**2
    assert 0.7 < available / meminfo_available() < 1.3
    assert "training this config" in err and "model.d_model" in err
    assert not (tmp_path / "run").exists()
    assert not events, events


def test_an_evaluation_too_long_for_memory_is_refused_before_anything_is_written(text_run,
                                                                                  capsys):
    before = sorted(p.name for p in text_run.iterdir())
    code, out, err = run_cli(capsys, "eval", str(text_run), "--lengths", "64", "100000")
    assert code == 2 and out == "", err
    needed, available = refusal(err)
    assert "--lengths 100000: evaluating at length 100000" in err
    params, _ = footprint.state_bytes(tiny_config(TINY_TEXT))
    # one row of 100000 tokens per pass: 2 heads x 100000^2 float32 scores, the logits over
    # 256 bytes, and the 1 x 4 evaluation batch of inputs and targets (int32)
    expected = params + 2 * 100000**2 * 4 + 100000 * 256 * 4 + 4 * 100000 * 8
    assert needed == expected
    assert 0.7 < available / meminfo_available() < 1.3
    assert sorted(p.name for p in text_run.iterdir()) == before     # no eval.json


@pytest.mark.trains
def test_a_model_that_fits_trains_after_the_check(tmp_path, capsys):
    """The check (shapes traced, not run) leaves nothing behind that training trips on."""
    config = tiny_config(TINY_INDUCTION, **{"train.steps": 5, "train.log_every": 5,
                                            "train.eval_every": 5, "train.checkpoint_every": 5,
                                            "train.batch_size": 2})    # a structure of its own
    footprint.check_training(config)
    footprint.check_evaluation(config, [16, 4096])
    assert train(config, tmp_path / "run", progress=False)["step"] == 5


@pytest.mark.trains
@pytest.mark.parametrize("overrides", [
    {},
    {"model.max_length": 128, "data.length": 128, "train.batch_size": 8},
    {"model.max_length": 128, "data.length": 128, "model.attention.kernel": "chunked"},
])
def test_the_estimate_is_below_what_xla_assigns_a_training_step(overrides):
    """A lower bound: never more than XLA's buffer assignment of the step's program."""
    config = tiny_config(TINY_INDUCTION, **overrides)
    needs = footprint.training_needs(config)
    rows = config.train.batch_size // config.train.grad_accum
    step = footprint.forward_bytes(config, rows, config.data.length)
    estimate = needs["parameters"] + needs["optimizer state"] + needs["gradients"] + step
    try:
        assigned = train_step_memory(config, buffers_only=True)["peak_bytes"]
    finally:    # its jax.eval_shape of init_state leaves a tracer in init_state's cached
        state._init_program.cache_clear()      # program: training this structure would fail
    assert 0 < estimate <= assigned, (estimate, assigned)
    if overrides.get("model.attention.kernel") == "chunked":
        assert step == rows * 128 * 16 * 4                        # the logits alone
    elif overrides:
        assert step == 8 * 2 * 128 * 128 * 4 + 8 * 128 * 16 * 4   # scores and logits


def test_the_experiments_need_a_fraction_of_a_laptops_memory():
    """The check refuses none of them: each experiment's config trains in well under 2 GiB
    by the estimate."""
    for path in sorted((REPO / "experiments").glob("*.py")):
        config = experiment_config(path, [])
        total = sum(footprint.training_needs(config).values())
        assert 0 < total < 2 * 2**30, (path.name, total)


# ------------------------------------------------------------------ command-line values

@pytest.mark.parametrize("lengths", [["0"], ["-5"], ["12", "0"], ["1073741825"]])
def test_evaluation_lengths_outside_their_range_are_refused_in_one_line(text_run, capsys,
                                                                        lengths):
    """--lengths 0 was a ZeroDivisionError traceback."""
    before = sorted(p.name for p in text_run.iterdir())
    code, out, err = run_cli(capsys, "eval", str(text_run), "--lengths", *lengths)
    bad = next(n for n in lengths if not 1 <= int(n) <= 2**30)
    assert code == 2 and out == ""
    assert err == f"attnjax: error: --lengths must be in [1, 1073741824], got {bad}\n"
    assert sorted(p.name for p in text_run.iterdir()) == before


def test_length_one_still_evaluates(text_run, capsys):
    code, out, err = run_cli(capsys, "eval", str(text_run), "--lengths", "1")
    assert code == 0, err
    assert out.splitlines()[-1].split()[0] == "1"


@pytest.mark.parametrize("option, value, shown", [
    ("--temperature", "nan", "temperature (--temperature) must be a finite number >= 0 (0 is "
                             "greedy), got nan"),
    ("--temperature", "inf", "temperature (--temperature) must be a finite number >= 0"),
    ("--temperature", "-1", "temperature (--temperature) must be a finite number >= 0 (0 is "
                            "greedy), got -1.0"),
    ("--top-k", "0", "top_k (--top-k) must be in [1, 256] (model.vocab_size), or None for "
                     "every token, got 0"),
    ("--top-k", "257", "top_k (--top-k) must be in [1, 256]"),
    ("--top-k", "-3", "top_k (--top-k) must be in [1, 256]"),
    ("--seed", "-1", "seed (--seed) must be in [0, 2147483647], got -1"),
    ("--seed", "99999999999999999999999", "seed (--seed) must be in [0, 2147483647]"),
])
def test_sampling_settings_that_mean_nothing_are_refused_in_one_line(text_run, capsys, option,
                                                                     value, shown):
    """--temperature nan printed NUL bytes with exit status 0, --top-k 0 sampled from every
    token, --top-k 257 was a raw JAX message, a seed past int64 an OverflowError."""
    events, stop = compile_events()
    try:
        code, out, err = run_cli(capsys, "generate", str(text_run), "--prompt", "ab",
                                 "--tokens", "3", option, value)
    finally:
        stop()
    assert code == 2 and out == "", out
    assert err.startswith("attnjax: error: ") and err.count("\n") == 1, err
    assert shown in err
    assert not events, events


@pytest.mark.parametrize("settings, shown", [
    ({"temperature": float("nan")}, "temperature (--temperature) must be"),
    ({"temperature": -0.5}, "got -0.5"),
    ({"top_k": 0}, "top_k (--top-k) must be in [1, 256]"),
    ({"top_k": 300}, "got 300"),
    ({"top_k": 2.5}, "got 2.5"),
    ({"seed": 2**31}, "seed (--seed) must be in [0, 2147483647], got 2147483648"),
])
def test_the_python_sampler_refuses_them_too(text_run, settings, shown):
    config, params, _ = RunDir(text_run).params()
    raises_one_line(lambda: sample(config, params, [97, 98], 3, **settings), shown)
    # the edges are taken: every token, the largest seed, any finite temperature
    tokens = sample(config, params, [97, 98], 3, temperature=1e6, top_k=256, seed=INT32)
    assert len(tokens) == 3 and all(0 <= t < 256 for t in tokens)


def test_the_compile_listener_sees_a_compilation():
    """Positive control of ``compile_events``: a fresh program is seen."""
    events, stop = compile_events()
    try:
        jax.jit(lambda x: x * 7.0 - 0.125)(jnp.arange(3.0)).block_until_ready()
    finally:
        stop()
    assert "/jax/core/compile/backend_compile_duration" in events, events
