"""One run trained by several cooperating processes (``jax.distributed``), on one host or many.

Every process runs the same ``attnjax train`` command. After ``initialize``, ``jax.devices()``
lists the devices of every process, and the training mesh spans them all (one global mesh:
``attnjax.train.parallel``); each process feeds its own rows of the global batch (batches
stay functions of (seed, step), so the run's numbers do not depend on how many processes
share it), orbax checkpoints are written and restored by all of them together, and only
process 0 writes the run directory's config, metrics, TensorBoard events and summary. A
SIGTERM to any of them (a scheduler's notice) stops them all at the next log step, after a
checkpoint they write together; after a kill, the same commands again resume the run.

Where the processes learn who they are, first match wins:

1. ``--coordinator HOST:PORT --num-processes N --process-id I`` (all three), or the
   environment variables ``ATTNJAX_COORDINATOR``, ``ATTNJAX_NUM_PROCESSES`` and
   ``ATTNJAX_PROCESS_ID``;
2. ``--distributed``: JAX's own detection of the cluster it runs in (SLURM's ``srun``, Open
   MPI's ``mpirun``, a Cloud TPU pod slice, Kubernetes), with ``JAX_COORDINATOR_ADDRESS``
   where the cluster does not name a coordinator;
3. neither: one process, ``jax.distributed`` not started.

Process 0's coordinator listens on the host it was given (``bind_address``: with
``--coordinator 127.0.0.1:PORT``, on loopback only, not on every interface). On CPU the
processes' collectives go over gloo (TCP). See docs/CLUSTER.md.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from dataclasses import dataclass

import jax
import numpy as np

FLAGS = {"coordinator": "ATTNJAX_COORDINATOR", "num_processes": "ATTNJAX_NUM_PROCESSES",
         "process_id": "ATTNJAX_PROCESS_ID"}


@dataclass(frozen=True)
class Cluster:
    """How this process joins the others: explicit (``coordinator``, ``num_processes``,
    ``process_id``) or, with ``detect``, as JAX finds it in the environment."""
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    detect: bool = False


def cluster_from(coordinator: str | None = None, num_processes: int | None = None,
                 process_id: int | None = None, detect: bool = False,
                 environ=os.environ) -> Cluster | None:
    """The ``Cluster`` the flags (else the ``ATTNJAX_*`` variables) describe, or None for a
    single process; an incomplete or inconsistent description is a one-line ``ValueError``."""
    given = {"coordinator": coordinator, "num_processes": num_processes,
             "process_id": process_id}
    if not any(v is not None for v in given.values()):
        given = {name: environ.get(variable) for name, variable in FLAGS.items()}
    explicit = {name: value for name, value in given.items() if value not in (None, "")}
    if not explicit:
        return Cluster(detect=True) if detect else None
    if detect:
        raise ValueError("--distributed detects the cluster; it does not combine with "
                         f"--{', --'.join(n.replace('_', '-') for n in explicit)}")
    missing = [name for name in given if name not in explicit]
    if missing:
        raise ValueError("a multi-process run needs --coordinator, --num-processes and "
                         f"--process-id (or {', '.join(FLAGS.values())}); missing: "
                         f"{', '.join('--' + n.replace('_', '-') for n in missing)}")
    address = str(explicit["coordinator"])
    if not re.fullmatch(r"[^\s:]+:\d{1,5}", address):
        raise ValueError(f"--coordinator must be HOST:PORT (e.g. 127.0.0.1:12355), got "
                         f"{address!r}")
    count, index = _integer("num_processes", explicit), _integer("process_id", explicit)
    if count < 1:
        raise ValueError(f"--num-processes must be >= 1, got {count}")
    if not 0 <= index < count:
        raise ValueError(f"--process-id must be in [0, {count - 1}] for --num-processes "
                         f"{count}, got {index}")
    return Cluster(address, count, index)


def _integer(name: str, values: dict) -> int:
    try:
        return int(values[name])
    except (TypeError, ValueError):
        raise ValueError(f"--{name.replace('_', '-')} must be an integer, got "
                         f"{values[name]!r}") from None


def initialize(cluster: Cluster | None) -> None:
    """Join the cluster (nothing for None). Call it before anything else touches JAX."""
    if cluster is None:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")    # CPU devices only
    try:
        jax.distributed.initialize(cluster.coordinator, cluster.num_processes,
                                   cluster.process_id,
                                   coordinator_bind_address=bind_address(cluster.coordinator))
    except (ValueError, RuntimeError) as error:
        if cluster.detect:
            raise ValueError("--distributed found no cluster to join (SLURM, Open MPI, a TPU "
                             "pod slice or Kubernetes); name it with --coordinator, "
                             "--num-processes and --process-id "
                             f"({type(error).__name__}: {str(error).splitlines()[0]})") from None
        raise


def bind_address(coordinator: str | None, environ=os.environ) -> str | None:
    """Where process 0's coordinator listens: the ``HOST:PORT`` it was given when HOST is
    ``localhost`` or an IP address of this host (``127.0.0.1``: loopback only); else None,
    JAX's default, every interface (or ``JAX_COORDINATOR_BIND_ADDRESS``): for a detected
    cluster, for a host name (Debian maps the host's own name to 127.0.1.1, while the other
    hosts reach it by another address) and for an address of another machine (a NAT's)."""
    if coordinator is None or environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
        return None
    host = coordinator.rsplit(":", 1)[0]
    if host == "localhost":
        return coordinator
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        with socket.socket(family) as probe:
            probe.bind((host, 0))               # an address of this host's interfaces
    except (ValueError, OSError):
        return None
    return coordinator


def is_primary() -> bool:
    """Whether this process writes the run directory (process 0, or the only process)."""
    return jax.process_index() == 0


def any_process(flag: bool) -> bool:
    """Whether ``flag`` is set in any process (all processes must call this together)."""
    if jax.process_count() == 1:
        return flag
    from jax.experimental import multihost_utils
    return bool(np.asarray(multihost_utils.process_allgather(np.asarray(flag))).any())


def barrier(name: str) -> None:
    """Wait until every process has reached the barrier ``name``."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)
