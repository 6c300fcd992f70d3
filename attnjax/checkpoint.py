"""Checkpoints with orbax: async saves, the latest two and the best-N by validation loss kept,
the config stored as JSON beside the state, and nothing unreadable ever restored.

A checkpoint holds a training state (step, params, optimizer state, ...) and its metadata: the
config, and SHA-256 digests of the whole state's bytes and of its parameters'. Restores
walk from the newest checkpoint back: one that fails to load or whose bytes do not match its
digest is reported in one line and skipped (orbax's logs and the tracebacks its abandoned
reads leave behind are dropped), so a corrupted latest checkpoint falls back to the previous
good one. Saves that were killed midway stay in orbax's ``*.orbax-checkpoint-tmp``
directories, which are never listed.

``restore`` rebuilds the whole state into a template (training resumes from it);
``restore_params`` needs no template, so reading a model's parameters builds no model and no
optimizer: it reads the state as saved and checks the parameters' digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
import sys
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding
from orbax.checkpoint import checkpoint_managers as policies


# checkpoints saved without a parameter digest: the whole state's, over its fields in this order
READ_ATTEMPTS, READ_PAUSE = 4, 0.5   # a reader's searches of a run being written
LEGACY_FIELDS = ("step", "params", "opt_state", "skipped")


class CheckpointWriteError(ValueError):
    """A checkpoint could not be written (one line: the directory, the step, the cause)."""


_ORBAX = Path(ocp.__file__).parent
_dropping_abandoned = False     # whether a restore made the process drop them for good


def _abandoned(unraisable) -> bool:
    """Whether an error Python could not raise anywhere (``sys.unraisablehook``'s argument)
    is one orbax leaves behind when a save or restore fails midway: it closes its asyncio
    event loop with reads or writes still in flight, and each of them that ends later, on a
    tensorstore thread, fails to hand its result to the closed loop ("Event loop is
    closed"), or is dropped with its orbax coroutine, which raises its own failure again."""
    error, source = unraisable.exc_value, unraisable.object
    if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return True
    code = getattr(source, "cr_code", None)
    return code is not None and Path(code.co_filename).is_relative_to(_ORBAX)


def _quiet_closed_loops(hook):
    """``sys.unraisablehook`` that drops the errors orbax's abandoned reads and writes leave
    behind after a failed save or restore (``_abandoned``), and passes everything else to
    ``hook``."""
    def quiet(unraisable):
        if not _abandoned(unraisable):
            hook(unraisable)
    return quiet


# what asyncio logs of a task or future dropped unfinished, or with an error nobody read: the
# abandoned reads of a failed restore, when they are collected
ABANDONED_TASKS = ("Task exception was never retrieved", "Future exception was never retrieved",
                   "Task was destroyed but it is pending")


def _not_abandoned_task(record: logging.LogRecord) -> bool:
    """Filter of the ``asyncio`` logger: False for its reports of an abandoned task."""
    return not str(record.msg).startswith(ABANDONED_TASKS)


def _quiet_abandoned_reads():
    """From a process's first restore on, drop what the abandoned reads of a failed one leave
    behind (a truncated checkpoint's tracebacks, hundreds of lines) for the rest of the
    process, so that the one line reporting the checkpoint is all that is said: their errors
    (``_abandoned``), and asyncio's reports of their tasks (``ABANDONED_TASKS``; attnjax runs
    no asyncio of its own). They come from tensorstore's threads and the garbage collector,
    from before the failed restore has raised (a race with the main thread) for as long as
    its reads in flight take (a large checkpoint's: seconds, past the reader's close), so no
    narrower scope holds them all; nothing else is dropped. Installed once."""
    global _dropping_abandoned
    if not _dropping_abandoned:
        sys.unraisablehook = _quiet_closed_loops(sys.unraisablehook)
        logging.getLogger("asyncio").addFilter(_not_abandoned_task)
        _dropping_abandoned = True


def _on_host(leaf) -> np.ndarray:
    """A leaf's whole value on this host: an array split over several processes' devices is
    gathered from them (every process computes the same digest)."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(jax.device_get(leaf))


def state_digest(state) -> str:
    """SHA-256 over every leaf's dtype, shape and bytes, in tree order; one leaf at a time on
    the host, so the digest of a state split over a mesh never holds more than one whole
    parameter. It is the same on any mesh."""
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(state):
        array = _on_host(leaf)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


class Checkpoints:
    """Thin wrapper over ``ocp.CheckpointManager`` for one run directory."""

    def __init__(self, directory: str | Path, keep_best: int = 1, read_only: bool = False):
        """``read_only``: for readers of a run that may still be training (evaluation,
        analysis): nothing is created, and unfinished saves are not cleaned up."""
        best = lambda metrics: metrics["val_loss"]
        if read_only:
            options = ocp.CheckpointManagerOptions(
                read_only=True, create=False, save_interval_steps=0,
                enable_async_checkpointing=False, best_fn=best, best_mode="min")
        else:
            options = ocp.CheckpointManagerOptions(
                best_fn=best, best_mode="min", cleanup_tmp_directories=True,
                preservation_policy=policies.AnyPreservationPolicy([
                    policies.LatestN(2),
                    policies.BestN(get_metric_fn=best, reverse=True, n=keep_best)]))
        # orbax warns about read-only managers, logs each damaged checkpoint's metadata file it
        # lists (with its content), and a writer's background threads log each failed save
        # with tracebacks: a failure reaches save / wait / restore as one line instead, so
        # orbax is kept quiet until the manager is closed
        self._read_only, self._pending = read_only, None   # _pending: a save not yet finished
        self._absl = logging.getLogger("absl")
        self._absl_level, self._unraisable = self._absl.level, sys.unraisablehook
        self._absl.setLevel(logging.CRITICAL)
        self._quiet = None if read_only else _quiet_closed_loops(self._unraisable)
        if self._quiet is not None:
            sys.unraisablehook = self._quiet
        try:
            self.manager = self._open(Path(directory).absolute(), options)
        except BaseException:
            self._unquiet()
            raise

    def _open(self, directory: Path, options) -> ocp.CheckpointManager:
        """The manager; a reader's opening reads every checkpoint's metrics, so a writer that
        removes one meanwhile (``FileNotFoundError``) makes it open again, ``READ_ATTEMPTS``
        times in all."""
        for attempt in range(READ_ATTEMPTS if self._read_only else 1):
            try:
                return ocp.CheckpointManager(directory, options=options)
            except FileNotFoundError:
                if attempt == READ_ATTEMPTS - 1 or not self._read_only:
                    raise
                time.sleep(READ_PAUSE)

    def _unquiet(self):
        """orbax's loggers as they were before this manager; the writer's hook is taken off
        unless a restore has put ``_quiet_abandoned_reads``'s over it since."""
        self._absl.setLevel(self._absl_level)
        if self._quiet is not None and sys.unraisablehook is self._quiet:
            sys.unraisablehook = self._unraisable

    def save(self, step: int, state, config_json: dict, val_loss: float):
        """Start an async save of ``state`` at ``step`` (after the previous one finished)."""
        self._save(step, state, state.params, config_json, {"val_loss": float(val_loss)})

    def save_params(self, step: int, params, config_json: dict):
        """Start an async save of ``params`` alone (an imported model's: no optimizer state, no
        validation loss): ``restore_params`` reads it, ``restore`` (a resume) does not."""
        self._save(step, {"params": params}, params, config_json, None)

    def _save(self, step: int, state, params, config_json: dict, metrics: dict | None):
        meta = {"config": config_json, "digest": state_digest(state), "step": int(step),
                "params_digest": state_digest(params)}
        with self._failing_as_one_line(step):
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                metrics=metrics, force=True)
        self._pending = step

    @contextlib.contextmanager
    def _failing_as_one_line(self, step: int):
        """A failed save (a full disk, most often) as one line naming the directory and the
        step whose checkpoint could not be written: the previous save's, if it was still
        unfinished, else ``step``'s."""
        try:
            yield
        except Exception as error:  # noqa: BLE001  orbax raises many types for one failure
            failed = step if self._pending is None else self._pending
            self._pending = None
            # orbax's abandoned write tasks log the same failure with tracebacks when they are
            # collected, possibly after this manager is closed: it is reported here instead
            logging.getLogger("asyncio").setLevel(logging.CRITICAL)
            warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
            # the unfinished checkpoint's temporary directory would keep the disk full for
            # the run's other writers (metrics, TensorBoard) until the next start cleans it up
            for unfinished in Path(self.manager.directory).glob(f"{failed}.orbax-checkpoint-tmp*"):
                shutil.rmtree(unfinished, ignore_errors=True)
            text = str(error)
            cause = ("no space left on device" if "No space left on device" in text
                     else f"{type(error).__name__}: {text.splitlines()[0][:160]}")
            raise CheckpointWriteError(f"the checkpoint of step {failed} could not be written "
                                       f"to {self.manager.directory} ({cause}); the earlier "
                                       "checkpoints are intact: free space and rerun to "
                                       "resume") from None

    def steps(self) -> list[int]:
        """The saved steps, oldest first; a reader lists the directory again each time (the
        run's writer may have saved newer ones and removed older ones since)."""
        return sorted(self._listed(self.manager.all_steps))

    def best_step(self) -> int | None:
        """The step of the lowest validation loss (a reader reads the directory again)."""
        return self._listed(self.manager.best_step)

    def _listed(self, read):
        """``read()`` of the manager's view of the directory. A reader lists the directory
        again first, and again when the writer removed a checkpoint it was reading about
        (``FileNotFoundError``), ``READ_ATTEMPTS`` times in all."""
        if not self._read_only:
            return read()
        for attempt in range(READ_ATTEMPTS):
            try:
                self.manager.reload()
                return read()
            except FileNotFoundError:
                if attempt == READ_ATTEMPTS - 1:
                    raise
                time.sleep(READ_PAUSE)

    def restore(self, template, step: int | None = None):
        """``(state, step)`` of the newest good checkpoint (or of ``step`` and older), with the
        structure and shardings of ``template`` (arrays or ``jax.ShapeDtypeStruct``s; whatever
        mesh the checkpoint was saved from, each device reads its own shards); ``(None,
        None)`` if there is none. A leaf without a sharding is restored on the default device,
        or, in a multi-process run, replicated on every device."""
        if jax.process_count() > 1:
            default = NamedSharding(jax.make_mesh((jax.device_count(),), ("all",)),
                                    PartitionSpec())
        else:
            default = SingleDeviceSharding(jax.devices()[0])
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                           sharding=getattr(x, "sharding", None) or default),
            template)
        return self._first_good(lambda: step, lambda candidate: self._restore(candidate, abstract))

    def restore_params(self, step: int | None = None, best: bool = False):
        """``(params, step)`` of the newest good checkpoint (or of ``step`` and older; with
        ``best``, of the best and older, the best read again at each search), read as saved,
        on the default device; ``(None, None)`` if there is none."""
        bound = self.best_step if best else (lambda: step)
        return self._first_good(bound, lambda candidate: self._restore(candidate, None))

    def saved_config(self) -> dict | None:
        """The config (as JSON) the newest checkpoint whose metadata reads was saved with;
        None without one."""
        _quiet_abandoned_reads()
        for candidate in reversed(self.steps()):
            try:
                meta = self.manager.restore(candidate, args=ocp.args.Composite(
                    meta=ocp.args.JsonRestore())).meta
                return meta["config"]
            except Exception:  # noqa: BLE001  an unreadable one: restore reports it
                continue
        return None

    def _restore(self, candidate: int, abstract):
        """The state at ``candidate`` in the structure of ``abstract``, its digest checked; or,
        without ``abstract``, its parameters as saved (on the default device, whatever mesh
        saved them), their digest checked."""
        restored = self.manager.restore(candidate, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract or self._on_one_device(candidate)),
            meta=ocp.args.JsonRestore()))
        state, meta = restored.state, restored.meta
        if abstract is not None:
            checked, digest = state, meta["digest"]
        elif "params_digest" in meta:
            checked, digest = state["params"], meta["params_digest"]
        else:
            checked, digest = [state[name] for name in LEGACY_FIELDS], meta["digest"]
        if digest != state_digest(checked):
            raise ValueError("its bytes do not match the digest saved with it")
        return state if abstract is not None else state["params"]

    def _on_one_device(self, candidate: int):
        """The saved state's tree of ``jax.ShapeDtypeStruct``s, each on the default device: a
        state saved split over a mesh of other devices is read whole by this process."""
        saved = ocp.StandardCheckpointer().metadata(
            Path(self.manager.directory) / str(candidate) / "state").item_metadata
        device = SingleDeviceSharding(jax.devices()[0])
        return jax.tree_util.tree_map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device), saved)

    def _first_good(self, bound, restore):
        """``(restore(candidate), candidate)`` for the newest checkpoint at or before
        ``bound()`` (None: any) that restores; the list is read again after each failure, so
        a reader whose checkpoint the run's writer removed meanwhile goes on to the writer's
        newer one. A reader that lost every race against a writer saving faster than it reads
        (or whose bound the writer moved past) searches again, ``READ_ATTEMPTS`` times in all,
        ``READ_PAUSE`` seconds apart."""
        reported = set()
        _quiet_abandoned_reads()
        for attempt in range(READ_ATTEMPTS if self._read_only else 1):
            if attempt:
                time.sleep(READ_PAUSE)
            failed, limit = set(), bound()
            while candidates := [s for s in reversed(self.steps())
                                 if (limit is None or s <= limit) and s not in failed]:
                candidate = candidates[0]
                try:
                    return restore(candidate), candidate
                except Exception as error:  # noqa: BLE001  any unreadable checkpoint is skipped
                    failed.add(candidate)
                    if candidate in self.steps() and candidate not in reported:   # not removed
                        reported.add(candidate)                                # by the writer
                        print(f"attnjax: checkpoint {candidate} in {self.manager.directory} "
                              f"is unusable ({type(error).__name__}: "
                              f"{str(error).splitlines()[0][:200]}); trying an earlier one",
                              file=sys.stderr)
            if not self.steps():
                break                       # no checkpoint at all: nothing to wait for
        return None, None

    def wait(self):
        with self._failing_as_one_line(self._pending or 0):
            self.manager.wait_until_finished()
        self._pending = None

    def close(self):
        """Finish the last save, then release the manager (and the quieted loggers)."""
        try:
            if self._pending is not None:
                self.wait()
        finally:
            with contextlib.suppress(Exception):     # a failed save was raised by wait
                self.manager.close()
            self._unquiet()
