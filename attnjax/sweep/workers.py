"""Worker processes for the ``processes`` and ``vmap-processes`` launchers.

Each worker is a spawned process pinned to its own share of the cores (XLA's threads of two
workers do not fight over the same cores) that trains one task at a time: one run, or a
vmapped group of runs of one structure (``attnjax.train.loop.train_group``). The driver
hands out tasks, records each result as it arrives, and watches every worker's process:

- a worker that dies (SIGKILL, as the out-of-memory killer sends it) costs only its task,
  whose runs are recorded as failed with the signal named (``--retry-failed`` resumes them
  from their last checkpoints); a new worker takes its place and the sweep goes on;
- a run reported as interrupted (its worker got SIGTERM) stops the handing out of tasks;
- when the driver itself is interrupted (Ctrl-C, SIGTERM) its workers get SIGTERM, save a
  checkpoint and report their runs interrupted; a worker whose driver died stops the same
  way, so no worker trains on unobserved;
- a run is marked running (with its worker's pid) only once a worker has it, and never stays
  so: sweep.json claims a run is running only while a process trains it.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
import traceback

from attnjax.allocator import keep_freed_memory
from attnjax.compilation import enable_compile_cache
from attnjax.config import Config, from_dict, to_dict
from attnjax.interrupts import raise_interrupt
from attnjax.train.loop import train, train_group

STOP_WAIT_SECONDS = 120    # how long interrupted workers get to save their checkpoints


def core_shares(jobs: int) -> list[list[int]]:
    """This process's CPU cores split into ``jobs`` disjoint, contiguous shares (as even as
    possible; with fewer cores than jobs, workers share cores round-robin), so the XLA threads
    of two workers do not compete for one core."""
    cores = sorted(os.sched_getaffinity(0))
    if jobs >= len(cores):
        return [[cores[i % len(cores)]] for i in range(jobs)]
    bounds = [round(i * len(cores) / jobs) for i in range(jobs + 1)]
    return [cores[bounds[i]:bounds[i + 1]] for i in range(jobs)]


def _watch_driver(driver: int) -> None:
    """Worker thread: once the driver process is gone, SIGTERM this worker (the training
    loop saves a checkpoint and stops)."""
    while os.getppid() == driver:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def _serve(conn, share: list[int], driver: int) -> None:
    """Worker body: pinned to ``share``, train the tasks ``conn`` brings until it brings None."""
    os.sched_setaffinity(0, share)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the driver's to handle
    threading.Thread(target=_watch_driver, args=(driver,), daemon=True).start()
    enable_compile_cache()
    keep_freed_memory()
    while (task := conn.recv()) is not None:
        conn.send(train_task(*task))


def train_task(configs: list[dict], run_dirs: list[str]) -> list[dict]:
    """Per run ``{"summary": ...}`` or ``{"error", "trace"}``; a vmapped group that raises is
    retried run by run to find the culprit."""
    configs = [from_dict(Config, c) for c in configs]
    if len(configs) > 1:
        try:
            return [{"summary": s} for s in train_group(configs, run_dirs, progress=False)]
        except Exception:  # noqa: BLE001  (isolate the failing run below)
            pass
    results = []
    for config, run_dir in zip(configs, run_dirs):
        try:
            results.append({"summary": train(config, run_dir, progress=False)})
        except Exception as error:  # noqa: BLE001
            results.append({"error": f"{type(error).__name__}: {error}",
                            "trace": traceback.format_exc()})
    return results


class _Worker:
    def __init__(self, context, share: list[int]):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, share, os.getpid()),
                                       daemon=True)
        self.process.start()
        child.close()
        self.share, self.task = share, None

    def give(self, task: list, run_dirs: list) -> None:
        """Hand the worker ``task``. A worker that died before it could take it (the send
        finds the pipe broken) keeps the task: ``run_tasks`` finds the death by its sentinel
        and records the task's runs as failed, as for a worker that dies while training."""
        self.task = task
        try:
            self.conn.send(([to_dict(r.config) for r in task], [str(d) for d in run_dirs]))
        except OSError:
            pass

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


def death(exitcode: int | None) -> str:
    """How a worker process ended, in words."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        hint = " (as the out-of-memory killer does)" if name == "SIGKILL" else ""
        return f"its worker process was killed by {name}{hint}"
    return f"its worker process exited with code {exitcode}"


def run_tasks(sweep, tasks: list[list], jobs: int) -> None:
    """Train ``tasks`` (lists of runs, trained together) in ``jobs`` pinned worker processes,
    reporting every run through ``sweep.finish`` as its task ends (see the module docstring
    for what happens when a worker dies or anything is interrupted)."""
    context = multiprocessing.get_context("spawn")
    shares = core_shares(jobs)
    pending, workers, stopping = list(tasks), [], False
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        while True:
            idle = [w for w in workers if w.task is None]
            while pending and not stopping and (idle or len(workers) < jobs):
                worker = idle.pop() if idle else _Worker(context, _free_share(shares, workers))
                if worker not in workers:
                    workers.append(worker)
                task = pending.pop(0)
                sweep.mark_running(task, pid=worker.process.pid)
                worker.give(task, [sweep.run_dir(r).path for r in task])
            busy = [w for w in workers if w.task is not None]
            if not busy:
                return
            ready = multiprocessing.connection.wait(
                [w.conn for w in busy] + [w.process.sentinel for w in busy])
            for worker in busy:
                results = _receive(worker) if worker.conn in ready else None
                if results is not None:
                    for run, result in zip(worker.task, results):
                        sweep.finish(run, result.get("summary"), result.get("error"),
                                     result.get("trace"))
                        summary = result.get("summary")
                        stopping |= summary is not None and summary["status"] == "interrupted"
                    worker.task = None
                elif not worker.process.is_alive() or worker.process.sentinel in ready:
                    worker.process.join()
                    cause = death(worker.process.exitcode)
                    for run in worker.task:
                        sweep.finish(run, error=f"WorkerDied: {cause} while training this "
                                     "run; rerun with --retry-failed to resume it from its "
                                     "last checkpoint")
                    workers.remove(worker)
    except BaseException:
        _interrupt(sweep, workers)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        for worker in workers:
            worker.close()


def _free_share(shares: list[list[int]], workers: list[_Worker]) -> list[int]:
    taken = [w.share for w in workers]
    return next((s for s in shares if s not in taken), shares[len(workers) % len(shares)])


def _receive(worker: _Worker) -> list[dict] | None:
    try:
        return worker.conn.recv()
    except (EOFError, OSError):
        return None


def _interrupt(sweep, workers: list[_Worker]) -> None:
    """The driver is stopping: SIGTERM every busy worker, record what each reports (an
    interrupted run, or a finished one), and any run whose worker does not answer within
    ``STOP_WAIT_SECONDS`` as interrupted."""
    busy = [w for w in workers if w.task is not None]
    for worker in busy:
        if worker.process.is_alive():
            os.kill(worker.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    for worker in busy:
        results = (_receive(worker) if worker.conn.poll(max(0.0, deadline - time.monotonic()))
                   else None)
        for i, run in enumerate(worker.task):
            result = results[i] if results else {"summary": {"status": "interrupted"}}
            sweep.finish(run, result.get("summary"), result.get("error"), result.get("trace"))
        worker.task = None
