"""``--launcher ray``: each vmapped group of runs (``vmap_groups``; a run alone when nothing
shares its structure) is one Ray task, on an existing cluster (``--address``, else
``RAY_ADDRESS``; ``auto`` finds a local one) or on a local instance started for the sweep,
listening on 127.0.0.1 only, and stopped after it, with ``--cpus-per-run`` CPUs (and
``--gpus-per-run`` GPUs) reserved for each task: a vmapped group is one program on one
device, so it reserves what one run does. A request no node can grant is refused before
anything is submitted.

The contract is the local launchers': the run directories (on storage every node sees) are
the truth, so a rerun of the driver skips finished runs and resumes interrupted ones from
their checkpoints; a task that raises, or whose worker dies (SIGKILL, as the out-of-memory
killer sends it: Ray reports the crash), records its runs as failed with the error, and the
other tasks go on; Ray does not retry a task (``max_retries=0``): ``--retry-failed`` does, from
the last checkpoint. Ctrl-C cancels the tasks and records their runs as interrupted.

Needs the optional extra: ``pip install 'attnjax[ray]'``.
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import os

from attnjax.compilation import enable_compile_cache
from attnjax.config import to_dict
from attnjax.sweep.workers import train_task

LOOPBACK = "127.0.0.1"      # where a local instance started for a sweep listens


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--launcher ray needs Ray: pip install 'attnjax[ray]'") from None
    return ray


def _train_on_ray(configs: list[dict], run_dirs: list[str]) -> list[dict]:
    """Ray task body: train one task (see ``attnjax.sweep.workers.train_task``)."""
    enable_compile_cache()
    return train_task(configs, run_dirs)


def connect(ray, address: str | None) -> bool:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), else start a local instance
    that listens on loopback only; returns whether this process started it (and so must
    stop it). A cluster at a loopback address is joined as a loopback node too."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    options = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if address is None:
        with _on_loopback():
            ray.init(_node_ip_address=LOOPBACK, **options)
        return True
    with _on_loopback() if _is_loopback(address) else contextlib.nullcontext():
        ray.init(address=address, **options)   # an existing cluster: its nodes are the user's
    return False


def _is_loopback(address: str) -> bool:
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False                        # a host name, or "auto"


@contextlib.contextmanager
def _on_loopback():
    """Ray places a node on 127.0.0.1 (its GCS, raylet, workers, agents and the autoscaler's
    metrics server listening on loopback only) when clusters are off
    (``ENABLE_RAY_CLUSTER``, as on macOS and Windows); otherwise it replaces
    ``_node_ip_address='127.0.0.1'`` by the host's address, and a driver joining a loopback
    instance registers under an address no raylet of it has, and waits forever. Off while
    this process's node starts or joins."""
    constants = importlib.import_module("ray._private.ray_constants")
    clusters = getattr(constants, "ENABLE_RAY_CLUSTER", None)   # (a Ray that moved it keeps
    constants.ENABLE_RAY_CLUSTER = False                        # _node_ip_address as given)
    try:
        yield
    finally:
        if clusters is None:
            del constants.ENABLE_RAY_CLUSTER
        else:
            constants.ENABLE_RAY_CLUSTER = clusters


def _check_fits(ray, options: dict) -> None:
    """Refuse, before anything is submitted, a request no node of the cluster can grant (Ray
    would queue such a task forever)."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        wanted = options.get(key, 0)
        largest = max((n.get(name, 0) for n in nodes), default=0)
        if wanted > largest:
            flag = f"--{key[4:]}-per-run"
            raise ValueError(f"{flag}={wanted:g} but the largest node of the Ray cluster has "
                             f"{largest:g} {name}s")


def _describe(ray, error) -> str:
    """One line for a task that Ray could not finish."""
    first = next(iter(str(error).strip().splitlines()), "")
    if isinstance(error, (ray.exceptions.WorkerCrashedError, ray.exceptions.OutOfMemoryError)):
        return (f"{type(error).__name__}: the Ray worker training this run died (killed, e.g. "
                "by the out-of-memory killer); rerun with --retry-failed to resume it from its "
                f"last checkpoint. Ray: {first}")
    return f"{type(error).__name__}: {first}"


def run_on_ray(sweep, tasks: list[list], *, address: str | None = None,
               cpus_per_run: float = 1.0, gpus_per_run: float = 0.0) -> None:
    """Train ``tasks`` (lists of runs trained together) as Ray tasks, reporting every run
    through ``sweep.finish`` as its task ends."""
    ray = _import_ray()
    started = connect(ray, address)
    remote = ray.remote(max_retries=0)(_train_on_ray)
    options = {"num_cpus": cpus_per_run, **({"num_gpus": gpus_per_run} if gpus_per_run else {})}
    try:
        _check_fits(ray, options)
        refs = {}
        for task in tasks:
            dirs = [str(sweep.run_dir(run).path) for run in task]
            ref = remote.options(**options).remote([to_dict(r.config) for r in task], dirs)
            refs[ref] = task
            sweep.mark_running(task)
        try:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1)
                task = refs.pop(done[0])
                try:
                    results = ray.get(done[0])
                except ray.exceptions.RayError as error:
                    results = [{"error": _describe(ray, error), "trace": str(error)}] * len(task)
                for run, result in zip(task, results):
                    sweep.finish(run, result.get("summary"), result.get("error"),
                                 result.get("trace"))
        except BaseException:
            for ref, task in refs.items():
                ray.cancel(ref)
                for run in task:
                    sweep.finish(run, {"status": "interrupted"})
            raise
    finally:
        if started:
            ray.shutdown()
