"""Programs kept between processes (``attnjax.programs``): a kept call computes what the jitted
function computes; a later process (here: this one with its in-process programs forgotten)
calls the kept program without tracing the function again; another key, shape or source is
another program; a damaged file is traced again and replaced; without a cache directory
nothing is kept; a second ``attnjax generate`` process reads the program the first kept."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnjax import programs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory of this test's, and no program remembered in this process."""
    monkeypatch.setattr(programs, "_directory", lambda: tmp_path / programs.SUBDIRECTORY)
    monkeypatch.setattr(programs, "_CALLS", {})
    return tmp_path / programs.SUBDIRECTORY


def counted():
    """A jitted function and the list its traces append to."""
    traces = []

    def fn(params, x, key):
        traces.append(x.shape)
        return params["w"] @ x + jax.random.normal(key, x.shape)

    return jax.jit(fn), traces


def arguments(n: int = 3):
    return ({"w": jnp.arange(n * n, dtype=jnp.float32).reshape(n, n)},
            jnp.ones(n, jnp.float32), jax.random.key(1))


def test_a_later_process_calls_the_kept_program_without_tracing(cache):
    fn, traces = counted()
    args = arguments()
    first = programs.kept_call("f", fn, *args)
    np.testing.assert_array_equal(first, fn(*args))
    assert len(traces) == 1 and len(list(cache.glob("*.jaxexport"))) == 1
    programs._CALLS.clear()              # as a new process would start: nothing traced yet
    again, traces = counted()
    np.testing.assert_array_equal(programs.kept_call("f", again, *args), first)
    assert traces == []                  # read back, not traced
    programs.kept_call("g", again, *args)                # another key: another program
    programs.kept_call("f", again, *arguments(4))        # another shape: another program
    assert len(traces) == 2 and len(list(cache.glob("*.jaxexport"))) == 3
    assert not list(cache.glob("*.tmp"))


def test_this_process_holds_the_most_recent_programs(cache, monkeypatch):
    monkeypatch.setattr(programs, "KEPT_IN_PROCESS", 2)
    fn, _ = counted()
    for n in (2, 3, 4, 2):
        programs.kept_call("f", fn, *arguments(n))
    assert len(programs._CALLS) == 2
    assert list(programs._CALLS) == [programs._digest("f", arguments(n)) for n in (4, 2)]


def test_attnjax_source_is_part_of_the_key(cache, monkeypatch):
    fn, _ = counted()
    programs.kept_call("f", fn, *arguments())
    programs._CALLS.clear()
    monkeypatch.setattr(programs, "_source_digest", lambda: "an edited attnjax")
    again, traces = counted()
    programs.kept_call("f", again, *arguments())
    assert len(traces) == 1 and len(list(cache.glob("*.jaxexport"))) == 2


def test_a_damaged_program_is_traced_again_and_replaced(cache):
    fn, _ = counted()
    args = arguments()
    expected = programs.kept_call("f", fn, *args)
    (path,) = cache.glob("*.jaxexport")
    path.write_bytes(path.read_bytes()[:100])
    programs._CALLS.clear()
    again, traces = counted()
    np.testing.assert_array_equal(programs.kept_call("f", again, *args), expected)
    assert len(traces) == 1 and len(path.read_bytes()) > 100


def test_without_a_cache_directory_nothing_is_kept(monkeypatch):
    monkeypatch.setattr(programs, "_directory", lambda: None)
    monkeypatch.setattr(programs, "_CALLS", {})
    fn, _ = counted()
    args = arguments()
    np.testing.assert_array_equal(programs.kept_call("f", fn, *args), fn(*args))
    assert programs._CALLS == {}


def text_run(path):
    """A text run of random parameters (its checkpoint, as training saves it), untrained."""
    from attnjax.rundir import RunDir
    from attnjax.train.state import init_params
    from helpers import TINY_TEXT, tiny_config
    config, run = tiny_config(TINY_TEXT), RunDir(path)
    run.prepare(config)
    checkpoints = run.checkpoints()
    try:
        checkpoints.save_params(0, init_params(config), run.stored(config))
    finally:
        checkpoints.close()
    return path


def test_a_second_generate_process_reads_the_program_the_first_kept(tmp_path):
    """``attnjax generate`` in two processes sharing an empty cache (as ``attnjax bench warm``
    runs them): the first keeps its generation's program, the second reads it (the file is not
    written again) and prints the same text; ``--timings`` is parsed."""
    from attnjax.bench.warm import attnjax_rows
    run, cache = str(text_run(tmp_path / "run")), tmp_path / "cache"
    (first,) = attnjax_rows(run, "ab", 4, cache, calls=1)
    (kept,) = (cache / programs.SUBDIRECTORY).glob("*.jaxexport")
    written = kept.stat().st_mtime_ns
    (second,) = attnjax_rows(run, "ab", 4, cache, calls=1)
    assert kept.stat().st_mtime_ns == written
    assert second["text"] == first["text"] and first["text"].startswith("ab")
    assert all(r["loaded_s"] > 0 and r["to_tokens_s"] > 0 for r in (first, second))
