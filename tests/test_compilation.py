"""Quick compilation (XLA CPU optimisation level 1) is added to the flags of worker processes
without touching this process's, and never overrides a level someone chose."""

import os

from attnjax.compilation import QUICK_COMPILE, quick_compile_flags, quick_compiling_workers


def test_flags_are_added_once_and_a_chosen_level_is_kept():
    devices = "--xla_force_host_platform_device_count=2"
    assert quick_compile_flags(None) == QUICK_COMPILE
    assert quick_compile_flags(devices) == f"{devices} {QUICK_COMPILE}"
    assert quick_compile_flags(quick_compile_flags(devices)) == f"{devices} {QUICK_COMPILE}"
    assert quick_compile_flags("--xla_backend_optimization_level=3") == \
        "--xla_backend_optimization_level=3"
    assert quick_compile_flags(None, level=0) == "--xla_backend_optimization_level=0"


def test_workers_get_the_flags_and_this_process_keeps_its_own(monkeypatch):
    devices = "--xla_force_host_platform_device_count=2"
    monkeypatch.setenv("XLA_FLAGS", devices)
    with quick_compiling_workers():
        assert os.environ["XLA_FLAGS"] == f"{devices} {QUICK_COMPILE}"
    assert os.environ["XLA_FLAGS"] == devices
    monkeypatch.delenv("XLA_FLAGS")
    with quick_compiling_workers():
        assert os.environ["XLA_FLAGS"] == QUICK_COMPILE
    assert "XLA_FLAGS" not in os.environ
