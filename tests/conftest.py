"""Fixtures shared by the test files; plain shared constants and helpers (the repository root,
the tiny configs) are in ``helpers.py``.

- ``compile_cache`` (session, automatic): the one persistent JAX compilation cache of the
  session, ``helpers.COMPILE_CACHE``, on for the test process and, through the environment,
  for every process a test starts. Under ``pytest -n 2`` the workers share the directory
  (JAX writes each entry once, under its key; a half-written one that another worker reads
  is reported as a warning and compiled instead, never used).
- ``release_compiled_programs`` (module, automatic): each file's compiled programs are
  dropped after it (see there).
- ``assert_png``: see ``check_png``.

The session compiles at XLA's CPU optimisation level 0 (set below, before JAX starts).

Order: the files that take longest run first (``SLOWEST_FIRST``, below), so that under
``make test`` (``pytest -n 2 --dist loadfile``: each file on one worker, its module fixtures
and in-process caches of compiled programs built once) no long file starts last while the
other workers have nothing left to do.
"""

import os

from attnjax.compilation import quick_compile_flags
from helpers import SUITE_LEVEL

# Before any test computes (XLA reads its flags when the backend starts): the suite compiles
# thousands of small programs and runs each briefly, so it compiles at XLA's CPU optimisation
# level 0 (attnjax.compilation); processes that tests start inherit it, so runs the suite
# compares bit for bit are compiled at one level
os.environ["XLA_FLAGS"] = quick_compile_flags(os.environ.get("XLA_FLAGS"), SUITE_LEVEL)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from helpers import COMPILE_CACHE, COMPILE_CACHE_ENV  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def compile_cache():
    """The session's compilation cache directory; every program is cached however fast it
    compiled (the JAX default caches only those over a second)."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in COMPILE_CACHE_ENV.items():
            patch.setenv(key, value)        # processes started by tests (workers, CLI runs)
        jax.config.update("jax_compilation_cache_dir", str(COMPILE_CACHE))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        yield COMPILE_CACHE


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """After each test file, ``jax.clear_caches()``: XLA maps every CPU executable it keeps into
    the process's memory, and a worker holding a whole suite's programs passes the kernel's
    ``vm.max_map_count`` (65530 mappings), where compiling segfaults. A program another file
    needs again comes back from the persistent compilation cache."""
    yield
    jax.clear_caches()


def check_png(path, size=None, min_side=300):
    """Assert that ``path`` is a PNG that decodes and is not blank (more than a handful of
    distinct colours), of pixel ``size`` ``(width, height)`` when given, else at least
    ``min_side`` pixels wide and high (figures saved with ``bbox_inches="tight"``, whose size
    follows the data)."""
    with Image.open(path) as image:
        assert image.format == "PNG", f"{path} is {image.format}, not a PNG"
        pixels = np.asarray(image.convert("RGB"))
    width, height = pixels.shape[1], pixels.shape[0]
    if size is None:
        assert min(width, height) >= min_side, (path, (width, height))
    else:
        assert (width, height) == tuple(size), (path, (width, height))
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    assert colours > 16, f"{path} looks blank: {colours} distinct colour(s)"


@pytest.fixture
def assert_png():
    """``assert_png(path, size=None, min_side=300)``: see :func:`check_png`."""
    return check_png


# The files that take longest on a cold run (an empty compilation cache), longest first, as
# ``make test``'s ``--durations`` and per-file totals showed on the 2-core host: test_ray
# waits on Ray and its worker processes, the others compile and train (worker processes,
# two-process runs, the claims' measurements, test_nn's thousands of eager ops). Files not
# listed run after them in their usual order; a new file that takes a minute belongs here.
SLOWEST_FIRST = ("test_sharding.py", "test_ray.py", "test_context_parallel.py", "test_nn.py",
                 "test_sweep.py", "test_claims.py", "test_distributed.py", "test_train.py",
                 "test_bench.py", "test_encoder.py", "test_encoder_commands.py",
                 "test_head_shapes.py", "test_attention.py", "test_analysis.py",
                 "test_seq2seq.py", "test_padding.py", "test_explore.py")


# The quick tier, ``make check`` (``pytest -m quick``): what a person runs before each commit,
# within 3 minutes cold on 2 cores (its target): every kernel and position encoding against its
# references, the model families' shapes and knobs, configs and experiments, run-directory
# integrity, and the refusals of hostile files and careless input: the tests of these files
# but those marked ``trains`` (they train runs, compile training steps or start processes: a
# lock held by a running trainer, a resume after a full disk, signals during an import).
# ``make test`` (CI) runs these and everything else: training, resuming, sweeps on every
# launcher, several devices and processes, analysis, benchmarks, the claims.
QUICK = ("test_attention.py", "test_flash.py", "test_masks.py", "test_positions.py",
         "test_masked_fill.py", "test_head_shapes.py", "test_quantize.py", "test_dense.py",
         "test_regularizers.py", "test_padding.py", "test_cross_attention.py", "test_models.py",
         "test_model_knobs.py", "test_data.py", "test_config.py", "test_experiments.py",
         "test_limits.py", "test_layers.py", "test_pretrained.py", "test_gguf.py",
         "test_rundir.py", "test_run_integrity.py", "test_damaged_runs.py", "test_hostile.py",
         "test_careless_input.py", "test_docs.py", "test_cli.py", "test_cli_help.py",
         "test_cli_functions.py")


def pytest_collection_modifyitems(config, items):
    """Mark the tests of ``QUICK``'s files ``quick``, but those marked ``trains``; put the
    tests of ``SLOWEST_FIRST``'s files first, in its order, the rest keeping theirs (every
    worker sorts the same collection the same way, as pytest-xdist requires)."""
    for item in items:
        if item.path.name in QUICK and item.get_closest_marker("trains") is None:
            item.add_marker(pytest.mark.quick)
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
