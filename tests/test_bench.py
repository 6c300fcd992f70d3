"""The benchmarks run and write what they measured (no timing assertions: speed is measured by
``attnjax bench``, not asserted): the kernel benchmark with the requested dtype; the compiled
memory of a training step (parameter bytes by hand, temporaries growing with length and batch,
smaller with the chunked kernel); the evaluation at each number of tokens per forward pass;
generation with and without the cache (the cached step's
logits equal the full forward's)."""

import json

import jax
import numpy as np
import pytest

from attnjax.bench.attention import run_attention_benchmark
from attnjax.bench.flops import model_flops_per_token, run_flops
from attnjax.bench.generate import run_generate_benchmark
from attnjax.bench.memory import decode_step_memory, train_step_memory
from attnjax.bench.patch import run_patch_benchmark
from attnjax.bench.startup import run_startup_benchmark
from attnjax.bench.translate import run_translation_benchmark
from attnjax.config import apply_overrides
from attnjax.generate import decode_step, empty_cache
from attnjax.models.decoder import DecoderLM
from attnjax.train import loop
from attnjax.train.loop import PHASES
from attnjax.train.state import init_params
from helpers import TINY_INDUCTION, TINY_SEQ2SEQ, run_cli, tiny_config


def test_attention_benchmark_measures_the_requested_dtype(tmp_path, capsys):
    out = tmp_path / "attention.json"
    rows = run_attention_benchmark(lengths=[32], kernels=["reference", "chunked"], out=str(out),
                                   dtype="bfloat16", heads=2, head_dim=8)
    written = json.loads(out.read_text())["rows"]
    assert [r["kernel"] for r in written] == ["reference", "chunked"] == [r["kernel"] for r in rows]
    assert all(r["dtype"] == "bfloat16" and r["length"] == 32 for r in written)
    assert all(r["forward_s"] > 0 and r["grad_temp_mb"] >= 0 for r in written)
    assert written[0]["grad_mem_vs_reference"] == 1.0
    assert "bfloat16" in capsys.readouterr().out


# ---------------------------------------------------------------- training-step memory

def memory_of(buffers_only: bool = False, **overrides) -> dict:
    config = tiny_config(TINY_INDUCTION, **{"data.length": 128, "model.max_length": 256,
                                            **overrides})
    return train_step_memory(config, buffers_only=buffers_only)


@pytest.fixture(scope="module")
def memory() -> dict:
    """Compiled memory of the tiny induction model's training step: batch 4, length 128; the
    same at length 256, at batch 8, and with the chunked kernel at length 256 (these three
    compiled with unoptimised machine code, whose buffers are the same: see
    ``test_unoptimised_machine_code_leaves_every_buffer_as_it_is``)."""
    long = {"data.length": 256}
    return {"base": memory_of(), "2T": memory_of(True, **long), "2B": memory_of(True, **{
        "train.batch_size": 8}), "2T chunked": memory_of(True, **long, **{
            "model.attention.kernel": "chunked", "model.attention.block_q": 32,
            "model.attention.block_k": 32})}


def test_parameter_and_optimizer_bytes_are_counted_by_hand(memory):
    d, vocab, hidden = 16, 16, 64               # TINY_MODEL: one layer, 2 heads of 8, gelu x4
    params = (vocab * d                         # tied embedding (RoPE has no parameters)
              + d * 3 * d + d * d               # fused q/k/v and output projections, no bias
              + 3 * 2 * d                       # attention, mlp and final layer norms
              + d * hidden + hidden + hidden * d + d)   # MLP up and down, with biases
    row = memory["base"]
    assert row["parameter_bytes"] == 4 * params == 14016
    # AdamW's two moments, plus two int32 step counts (Adam's and the schedule's)
    assert row["optimizer_bytes"] == 2 * row["parameter_bytes"] + 2 * 4
    assert row["peak_bytes"] == (row["argument_bytes"] + row["output_bytes"]
                                 - row["alias_bytes"] + row["temp_bytes"])
    # the state is donated: its buffers are the outputs' and the arguments' both
    assert row["alias_bytes"] >= row["parameter_bytes"] + row["optimizer_bytes"]


def test_temporaries_grow_with_length_and_batch(memory):
    assert memory["2T"]["temp_bytes"] > 1.5 * memory["base"]["temp_bytes"]
    assert memory["2B"]["temp_bytes"] > 1.5 * memory["base"]["temp_bytes"]
    assert memory["2T"]["parameter_bytes"] == memory["base"]["parameter_bytes"]


def test_the_chunked_kernel_needs_fewer_temporaries_at_length(memory):
    assert memory["2T chunked"]["temp_bytes"] < 0.5 * memory["2T"]["temp_bytes"]


def test_unoptimised_machine_code_leaves_every_buffer_as_it_is(memory):
    """``buffers_only``: LLVM at -O0 changes the generated code, not XLA's buffer assignment."""
    quick, row = memory_of(buffers_only=True), memory["base"]
    assert {k: v for k, v in quick.items() if k != "code_bytes"} == \
        {k: v for k, v in row.items() if k != "code_bytes"}


def test_a_decoding_step_holds_its_cache_by_hand_and_donates_it():
    """``decode_step_memory``: the cache is 2 (key, value) x layers x batch x heads x slots x
    head_dim in the compute dtype; it is donated (the updated cache reuses its buffers), and
    bfloat16 parameters are half the float32 ones' bytes."""
    config = tiny_config(TINY_INDUCTION, **{"model.dtype": "bfloat16", "data.length": 64,
                                            "model.max_length": 256})
    row = decode_step_memory(config, 4, param_dtype="bfloat16")
    keys_values = 2 * 1 * 4 * 2 * 256 * 8 * 2
    assert 0 <= row["cache_bytes"] - keys_values <= 16                  # + int32 counters
    assert row["alias_bytes"] >= keys_values
    assert 2 * row["parameter_bytes"] == 14016          # float32: as in the training step's
    assert row["peak_bytes"] == (row["argument_bytes"] + row["output_bytes"]
                                 - row["alias_bytes"] + row["temp_bytes"])


def test_memory_command_prints_and_writes_the_row(tmp_path, capsys):
    out = tmp_path / "memory.json"
    code, printed, err = run_cli(capsys, "bench", "memory", *[f"{k}={v}" for k, v in {
        **TINY_INDUCTION, "data.length": 128, "model.max_length": 256}.items()],
        "--out", str(out))
    assert code == 0, err[-2000:]
    written = json.loads(out.read_text())
    assert written["temp_bytes"] > 0 and written["length"] == 128 and "peak" in printed
    code, _, err = run_cli(capsys, "bench", "attention", "model.d_model=8")
    assert code == 2 and "bench attention takes no config" in err


def test_eval_pass_benchmark_times_the_evaluation_program_at_each_size(tmp_path, capsys):
    out = tmp_path / "eval.json"
    overrides = {**TINY_INDUCTION, "train.eval_batch_size": 64}
    code, printed, err = run_cli(capsys, "bench", "eval", *[f"{k}={v}" for k, v in
                                                            overrides.items()], "--out", str(out))
    assert code == 0, err[-2000:]
    rows = json.loads(out.read_text())["rows"]
    length = overrides["data.length"]
    assert [r["rows"] for r in rows] == [16, 32, 64, 128, 256]      # 256 to 8192 tokens, of 256
    assert all(r["tokens_per_pass"] == r["rows"] * length and r["tokens_per_s"] > 0
               for r in rows)
    assert [r["rows"] for r in rows if r["chosen"]] == [loop.eval_chunk_rows(64, length)] == [64]
    assert max(r["vs_fastest"] for r in rows) == 1.0 and "tokens/pass" in printed


def test_patch_benchmark_times_captures_and_batched_against_looped_patches(tmp_path):
    config = tiny_config(TINY_INDUCTION, **{"model.num_layers": 2})
    result = run_patch_benchmark(config, worlds=4, examples=(1, 2), repeats=1,
                                 out=str(tmp_path / "patch.json"))
    rows = json.loads((tmp_path / "patch.json").read_text())["rows"]
    assert [(r["capture"], r["points"]) for r in rows] == [("none", 0), ("z", 2),
                                                           ("every point", 20)]
    assert rows[0]["vs_none"] == 1.0 and rows[2]["output_bytes"] > rows[0]["output_bytes"]
    assert [(p["worlds"], p["examples"]) for p in result["patching"]] == [(4, 1), (4, 2)]
    assert all(p["speedup"] == p["looped_seconds"] / p["batched_seconds"] > 0
               and p["grouped_speedup"] == p["looped_seconds"] / p["grouped_seconds"] > 0
               for p in result["patching"])
    assert [p["group"] for p in result["patching"]] == [32, 16]    # 32 sequences a group


# ---------------------------------------------------------------- generation timing

def test_the_cached_step_of_token_t_equals_the_full_forward_over_t_tokens():
    config = tiny_config(TINY_INDUCTION)
    params, t = init_params(config), 11
    tokens = jax.random.randint(jax.random.key(1), (2, t), 0, config.model.vocab_size)
    step = jax.jit(decode_step(config))
    cache, _ = step(params, empty_cache(config, batch=2), tokens[:, :t - 1])
    _, logits = step(params, cache, tokens[:, t - 1:])
    full, _ = jax.jit(DecoderLM(config.model).apply)({"params": params}, tokens)
    np.testing.assert_allclose(logits[:, 0], full[:, -1], atol=1e-5, rtol=1e-5)


def test_generation_benchmark_rows(tmp_path, capsys):
    config = tiny_config(TINY_INDUCTION)
    out = tmp_path / "generate.json"
    rows = run_generate_benchmark(config, lengths=[8], fills=[4, 8], repeats=1,
                                  loops=[(2, 3, 5, 12)], out=str(out))
    assert json.loads(out.read_text())["rows"] == rows
    forward = [r for r in rows if r["kind"] == "forward"]
    cached = [r for r in rows if r["kind"] == "cached"]
    assert [r["n"] for r in forward] == [8]
    assert all(set(r) == {"kind", "n", "batch", "forward_s", "uncached_generation_s"}
               and r["uncached_generation_s"] == r["n"] * r["forward_s"] > 0 for r in forward)
    assert [(r["layout"], r["max_length"], r["t"]) for r in cached] == [
        ("max_length=8", 8, 4), ("max_length=8", 8, 8), ("max_length=t", 4, 4),
        ("max_length=t", 8, 8)]
    assert all(set(r) == {"kind", "layout", "max_length", "t", "batch", "step_s"}
               and r["step_s"] > 0 for r in cached)
    [loop] = [r for r in rows if r["kind"] == "loop"]      # both loops chose the same tokens
    assert (loop["batch"], loop["prompt"], loop["tokens"], loop["max_length"]) == (2, 3, 5, 12)
    assert loop["speedup"] == loop["python_per_token_s"] / loop["compiled_per_token_s"] > 0
    text = capsys.readouterr().out
    assert "cached step of token t" in text and "whole greedy generation" in text
    with pytest.raises(ValueError, match="--fills must be 2 or more"):
        run_generate_benchmark(config, lengths=[8], fills=[1, 4], loops=[])


def test_translation_benchmark_rows(tmp_path, capsys):
    config = tiny_config(TINY_SEQ2SEQ)
    out = tmp_path / "translate.json"
    rows = run_translation_benchmark(config, sources=(8, 24), beams=(1, 2), tokens=5,
                                     repeats=1, out=str(out))
    assert json.loads(out.read_text())["rows"] == rows
    cross = [r for r in rows if r["kind"] == "cross cache"]
    assert [r["source"] for r in cross] == [8, 24]
    assert all(r["speedup"] == r["recompute_step_s"] / r["static_step_s"] > 0 for r in cross)
    beams = [r for r in rows if r["kind"] == "beam"]
    assert [r["beams"] for r in beams] == ["greedy", 1, 2] and beams[0]["vs_greedy"] == 1.0
    assert all(r["per_token_s"] > 0 and r["source"] == 8 for r in beams)
    text = capsys.readouterr().out
    assert "per decoding step, 5 steps after BOS" in text and "vs greedy" in text


def test_a_second_process_training_the_same_run_compiles_nothing(tmp_path, capsys):
    """``bench startup``: the run's programs are in the shared cache after the first process,
    and the second process adds none (it loaded every one); the table has every phase."""
    experiment = tmp_path / "tiny.py"
    experiment.write_text("from attnjax.config import Config, apply_overrides\n\n\n"
                          f"def get_config():\n    return apply_overrides(Config(), "
                          f"{TINY_INDUCTION!r})\n")
    rows = run_startup_benchmark(str(experiment), ["train.steps=10", "train.eval_every=10",
                                                   "train.checkpoint_every=10"])
    assert [r["process"] for r in rows] == [1, 2]
    assert rows[0]["new_cache_entries"] > 0 and rows[1]["new_cache_entries"] == 0
    assert all(set(r["seconds"]) == {*PHASES, "total"} for r in rows)
    text = capsys.readouterr().out
    assert all(phase in text for phase in PHASES) and "cache files added" in text


def test_sweep_benchmark_times_each_launcher_and_the_runs_agree(tmp_path, capsys):
    """Two seeds of a tiny experiment with the in-process and the worker launchers: one row
    per launcher, ratios to the first, the same validation losses from every launcher."""
    experiment = tmp_path / "tiny.py"
    experiment.write_text("from attnjax.config import Config, apply_overrides\n\n\n"
                          f"def get_config():\n    return apply_overrides(Config(), "
                          f"{TINY_INDUCTION!r})\n")
    out = tmp_path / "sweep.json"
    code, text, err = run_cli(capsys, "bench", "sweep", str(experiment), "--seeds", "2",
                              "--steps", "20", "--launchers", "sequential",
                              "vmap-processes", "--out", str(out))
    assert code == 0, err[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["launcher"] for r in rows] == ["sequential", "vmap-processes"]
    assert rows[0]["speedup"] == 1.0 and all(r["seconds"] > 0 for r in rows)
    assert all(r["max_loss_difference"] < 1e-5 for r in rows)
    assert "vmap-processes" in text and "vs sequential" in text
    result = json.loads(out.read_text())      # the floor: the sweep's FLOPs at the peak
    config = apply_overrides(tiny_config(TINY_INDUCTION), {"train.steps": 20})
    assert result["evaluations_per_run"] == 3            # steps 10 and 20, the initial loss
    assert result["model_flops"] == 2 * run_flops(config, 3) > 0
    assert result["floor_s"] == result["model_flops"] / result["peak_flops"]
    assert all(r["peak_fraction"] == result["floor_s"] / r["seconds"] for r in rows)
    assert "matmul peak" in text and "of peak" in text


def test_run_flops_count_training_and_every_evaluated_token_by_hand():
    """``bench.flops.run_flops``: ``steps B T f(T)`` trained plus, per evaluation, a third of
    ``f(n)`` for each of ``eval_batches x eval_batch_size x n`` tokens at every length n, with
    ``f(n) = 6 N + 12 L d n`` (``model_flops_per_token`` at context n)."""
    config = apply_overrides(tiny_config(TINY_INDUCTION), {
        "train.steps": 7, "train.batch_size": 4, "train.eval_batches": 3,
        "train.eval_batch_size": 2, "data.eval_lengths": [32]})
    m, T = config.model, config.data.length
    f = lambda n: model_flops_per_token(config) + 12 * m.num_layers * m.d_model * (n - T)
    assert model_flops_per_token(config, 32) == f(32)
    assert run_flops(config, 5) == 7 * 4 * T * f(T) + 5 * 3 * 2 * (T * f(T) + 32 * f(32)) / 3
