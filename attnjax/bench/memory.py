"""Training-step memory (``attnjax bench memory``): the compiled memory of a training step
(claims HD2, CX3), without running it.

``train_step_memory(config)`` lowers and compiles the program ``attnjax train`` dispatches for
the config (``train.parallel.Runner``: the train step of ``train.step``, jit over the device
mesh or pmap, ``train.steps_per_dispatch`` steps per dispatch with on-device data) at the
config's batch and length, and reads XLA's memory analysis of it:

- ``argument_bytes``: the inputs (training state, hyperparameter values, a host batch), live
  for the whole dispatch;
- ``output_bytes``: the outputs (the new state and the metrics); ``alias_bytes`` of them reuse
  donated input buffers (the state is donated);
- ``temp_bytes``: XLA's temporary allocation, activations and gradients included (buffers
  whose lifetimes do not overlap already share it);
- ``code_bytes``: the generated code, reported apart (not device data).

``train_step_memory(config, buffers_only=True)`` compiles the machine code unoptimised
(``BUFFERS_ONLY``): for a program that is measured and never run. XLA's
``xla_backend_optimization_level`` chooses only LLVM's code-generation level; the buffer
assignment is made before, from the HLO, so every byte count but ``code_bytes`` is the same
(``tests/test_bench.py`` checks), and XLA:CPU compiles a training step faster at level 0 than
at level 1 (``attnjax.compilation``) or at its default level.

``peak_bytes = argument_bytes + output_bytes - alias_bytes + temp_bytes``: the device memory
one dispatch needs when every input, every output that is not a donated input, and the whole
temporary allocation are live at once, an upper bound from XLA's buffer assignment (the
program's data; not the allocator's fragmentation, nor memory held outside the dispatch).
``parameter_bytes`` and ``optimizer_bytes`` are the bytes of the parameters and of the
optimizer state, from their shapes and dtypes (per device; both are replicated).
"""

from __future__ import annotations

import jax

from attnjax.bench.common import write_json
from attnjax.compilation import flags_level
from attnjax.config import Config
from attnjax.data import load_dataset
from attnjax.generate import decode_step, empty_cache
from attnjax.train import hyper
from attnjax.train.parallel import Runner
from attnjax.train.state import init_params, init_state


def tree_bytes(tree) -> int:
    """Bytes of every array of a pytree, from its shapes and dtypes."""
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(tree))


BUFFERS_ONLY = {"xla_backend_optimization_level": 0}


def compile_buffers_only(lowered):
    """``lowered`` compiled with ``BUFFERS_ONLY``, for a program that is measured and never run.
    Where this process's ``XLA_FLAGS`` already choose that level (the test suite's processes),
    with no options: the same machine code, and a program ``jit`` already compiled for a run
    (a test that trains on the mesh it then measures) is reused rather than compiled again."""
    level = BUFFERS_ONLY["xla_backend_optimization_level"]
    return lowered.compile(compiler_options=None if flags_level() == level else BUFFERS_ONLY)


def buffer_memory(lowered):
    """``memory_analysis()`` of ``lowered`` compiled by ``compile_buffers_only`` (its
    generated-code size is of unoptimised code)."""
    return compile_buffers_only(lowered).memory_analysis()


def train_step_memory(config: Config, *, buffers_only: bool = False) -> dict:
    """The compiled memory of one training dispatch of ``config`` (see the module docstring),
    with the setting it was measured at; ``buffers_only``: compiled by ``buffer_memory``."""
    lowered, state, runner = _lower_train_step(config)
    stats = buffer_memory(lowered) if buffers_only else lowered.compile().memory_analysis()
    return _memory_row(config, stats, state, runner)


def _lower_train_step(config: Config) -> tuple:
    """The lowered training dispatch of ``config``, its state's shapes and its runner (nothing
    is run or initialised: the state is ``jax.eval_shape`` of ``init_state``)."""
    dataset, cfg = load_dataset(config.data), config.train
    runner = Runner(config, dataset)
    state = jax.eval_shape(lambda: init_state(config))
    host_batch = None if dataset.on_device else dataset.batch(
        config.seed, 0, cfg.batch_size, config.data.length, "train")
    lowered = runner.lower(runner.abstract(state), hyper.as_arrays([config], stacked=False),
                           host_batch)
    return lowered, state, runner


def _memory_row(config: Config, stats, state, runner: Runner) -> dict:
    cfg, model = config.train, config.model
    row = {"d_model": model.d_model, "num_layers": model.num_layers,
           "num_heads": model.attention.num_heads, "kernel": model.attention.kernel,
           "batch": cfg.batch_size, "length": config.data.length,
           "steps_per_dispatch": runner.steps_per_call, "devices": len(runner.devices),
           "argument_bytes": stats.argument_size_in_bytes,
           "output_bytes": stats.output_size_in_bytes, "alias_bytes": stats.alias_size_in_bytes,
           "temp_bytes": stats.temp_size_in_bytes,
           "code_bytes": stats.generated_code_size_in_bytes,
           "parameter_bytes": tree_bytes(state.params),
           "optimizer_bytes": tree_bytes(state.opt_state)}
    row["peak_bytes"] = (row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"]
                         + row["temp_bytes"])
    return row


def run_memory_benchmark(config: Config, out: str | None = None) -> dict:
    """``train_step_memory`` of ``config`` as a table; JSON to ``out`` if given."""
    row = train_step_memory(config)
    print(f"training step: d_model {row['d_model']}, {row['num_layers']} layers, "
          f"{row['num_heads']} heads, kernel {row['kernel']}, batch {row['batch']}, length "
          f"{row['length']} ({row['steps_per_dispatch']} step(s) per dispatch, "
          f"{row['devices']} device(s), {jax.default_backend()})")
    state = row["parameter_bytes"] + row["optimizer_bytes"]
    lines = [("arguments", row["argument_bytes"]), ("outputs", row["output_bytes"]),
             ("aliased (donated)", row["alias_bytes"]), ("temporaries", row["temp_bytes"]),
             ("peak = args + outputs - aliased + temps", row["peak_bytes"]),
             ("parameters", row["parameter_bytes"]), ("optimizer state", row["optimizer_bytes"]),
             ("generated code (not in peak)", row["code_bytes"])]
    for label, value in lines:
        print(f"  {label:<42} {value / 2**20:>10.2f} MB")
    print(f"  parameters + optimizer state are {state / max(row['peak_bytes'], 1):.1%} of the "
          "peak")
    write_json(out, {"backend": jax.default_backend(), **row})
    return row


def decode_step_memory(config: Config, batch: int, *, param_dtype: str | None = None,
                       buffers_only: bool = True) -> dict:
    """The compiled memory of one decoding step of ``config``'s model
    (``attnjax.generate.decode_step``): one token for each of ``batch`` sequences into a KV
    cache of ``model.max_length`` slots, the cache donated (the updated one reuses its
    buffers), as ``sample`` and ``beam_generate`` run it; nothing is run or initialised. The
    cache's dtype is the model's compute dtype (``model.dtype``); ``param_dtype`` casts the
    floating parameters (default: float32, as stored). Returns the setting, XLA's
    ``argument_bytes``, ``output_bytes``, ``alias_bytes``, ``temp_bytes`` and ``peak_bytes``
    (as ``train_step_memory``'s), and the ``parameter_bytes`` and ``cache_bytes`` of the
    arguments, from their shapes and dtypes."""
    def cast(leaf):
        dtype = (param_dtype if param_dtype and jax.numpy.issubdtype(leaf.dtype,
                                                                     jax.numpy.floating)
                 else leaf.dtype)
        return jax.ShapeDtypeStruct(leaf.shape, dtype)

    params = jax.tree_util.tree_map(cast, jax.eval_shape(lambda: init_params(config)))
    cache = jax.eval_shape(lambda: empty_cache(config, batch))
    tokens = jax.ShapeDtypeStruct((batch, 1), jax.numpy.int32)
    lowered = jax.jit(decode_step(config), donate_argnums=(1,)).lower(params, cache, tokens)
    stats = buffer_memory(lowered) if buffers_only else lowered.compile().memory_analysis()
    row = {"batch": batch, "max_length": config.model.max_length, "dtype": config.model.dtype,
           "param_dtype": param_dtype or "float32", "kernel": config.model.attention.kernel,
           "argument_bytes": stats.argument_size_in_bytes,
           "output_bytes": stats.output_size_in_bytes, "alias_bytes": stats.alias_size_in_bytes,
           "temp_bytes": stats.temp_size_in_bytes, "parameter_bytes": tree_bytes(params),
           "cache_bytes": tree_bytes(cache)}
    row["peak_bytes"] = (row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"]
                         + row["temp_bytes"])
    return row
