"""Servers listen where they were told: the ``jax.distributed`` coordinator of a multi-process
run on localhost, and a local Ray instance started for a sweep, listen on loopback only (the
socket table of every process the run started, read with psutil)."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
import time

import psutil
import pytest

from attnjax.distributed import bind_address
from attnjax.sweep import ray_launcher
from helpers import subprocess_env


def address(text: str) -> str:
    """``::ffff:127.0.0.1`` (an IPv6 socket bound to an IPv4 address) as ``127.0.0.1``."""
    ip = ipaddress.ip_address(text.split("%")[0])
    return str(getattr(ip, "ipv4_mapped", None) or ip)


def listening(processes: list[psutil.Process]) -> list[tuple[str, str, int]]:
    """``(process name, address, port)`` of every TCP socket these processes listen on."""
    found = []
    for process in processes:
        try:
            name = process.name()
            sockets = process.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        found += [(name, address(s.laddr.ip), s.laddr.port) for s in sockets
                  if s.status == psutil.CONN_LISTEN]
    return found


def processes_running(parent: psutil.Process, word: str) -> list[psutil.Process]:
    """The descendants of ``parent`` whose command line has ``word`` in it."""
    found = []
    for process in parent.children(recursive=True):
        try:
            if any(word in part for part in process.cmdline()):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def beyond_loopback(sockets) -> list:
    return [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


JOIN = """
import sys
from attnjax import distributed
from jax.experimental import multihost_utils
distributed.initialize(distributed.cluster_from(sys.argv[1], 2, int(sys.argv[2])))
multihost_utils.sync_global_devices("joined")       # a collective: gloo is up too
print("joined", flush=True)
sys.stdin.read()                                    # until the test closes stdin
distributed.barrier("done")
"""


def test_the_coordinator_of_a_localhost_run_listens_on_loopback_only():
    """``--coordinator 127.0.0.1:PORT``: JAX's coordinator listened on every interface
    (``*:PORT``). Two real processes join as ``attnjax train`` joins them, run a collective
    and hold still while their sockets are read."""
    port = free_port()
    processes = [subprocess.Popen([sys.executable, "-c", JOIN, f"127.0.0.1:{port}", str(i)],
                                  env=subprocess_env(), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(2)]
    try:
        for p in processes:         # (gloo prints a line of its own before)
            lines = iter(p.stdout.readline, "")
            assert "joined\n" in lines, f"process {processes.index(p)} did not join"
        sockets = listening([psutil.Process(p.pid) for p in processes])
    finally:
        for p in processes:
            p.stdin.close()
        for p in processes:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert ("127.0.0.1", port) in [(a, p) for _, a, p in sockets], sockets
    assert len(sockets) > 1, sockets               # the collectives' listeners were seen too
    assert not beyond_loopback(sockets), sockets


@pytest.mark.parametrize("coordinator, bound", [
    ("127.0.0.1:12355", "127.0.0.1:12355"),
    ("localhost:12355", "localhost:12355"),
    ("198.51.100.7:12355", None),          # not this host's (TEST-NET-2): JAX's default
    ("node0.example.invalid:12355", None),  # a name: the other hosts may know it otherwise
    (None, None),                           # a detected cluster
])
def test_the_coordinator_binds_the_host_it_was_given(coordinator, bound):
    assert bind_address(coordinator, environ={}) == bound
    assert bind_address(coordinator, environ={"JAX_COORDINATOR_BIND_ADDRESS": "[::]:1"}) is None


def test_the_coordinator_binds_an_address_of_this_host_that_others_reach():
    own = [a.address for addresses in psutil.net_if_addrs().values() for a in addresses
           if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback]
    for ip in own:
        assert bind_address(f"{ip}:12355", environ={}) == f"{ip}:12355"


def test_a_local_ray_instance_for_a_sweep_listens_on_loopback_only(monkeypatch):
    """``--launcher ray`` with no ``--address``: the local instance's GCS, raylet, workers,
    runtime-env agent and the autoscaler's metrics server listened on every interface (or
    the host's address). Read: every process Ray started, and this one (the driver)."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    driver = psutil.Process()
    before = set(listening([driver]))
    metrics = free_port()               # not Ray's fixed 44217: another instance may hold it
    monkeypatch.setenv("AUTOSCALER_METRIC_PORT", str(metrics))
    started = ray_launcher.connect(ray, None)
    try:
        assert started
        assert ray.get(ray.remote(lambda: 7).remote()) == 7    # a worker runs (and listens)
        deadline = time.monotonic() + 30
        # the autoscaler's monitor starts alongside and serves its metrics a moment later
        while not (monitor := listening(processes_running(driver, "autoscaler"))):
            assert time.monotonic() < deadline, "the autoscaler's monitor never listened"
            time.sleep(0.2)
        sockets = listening(driver.children(recursive=True))
        sockets += [s for s in listening([driver]) if s not in before]
    finally:
        ray.shutdown()
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet", "ray::IDLE"} <= names, sockets
    assert [port for _, _, port in monitor] == [metrics] and monitor[0] in sockets, monitor
    assert not beyond_loopback(sockets), sorted(beyond_loopback(sockets))


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1:6379", True), ("localhost:6379", True), ("127.0.1.1:6379", True),
    ("[::1]:6379", True), ("ray://127.0.0.1:10001", True), ("10.1.2.3:6379", False),
    ("head-node:6379", False), ("auto", False)])
def test_a_cluster_at_a_loopback_address_is_joined_as_a_loopback_node(address, loopback):
    """Joined from a host address, a driver of a loopback instance would register where no
    raylet of it is, and wait forever (test_ray joins one with --address)."""
    assert ray_launcher._is_loopback(address) is loopback
