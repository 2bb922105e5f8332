"""The harness's hosts and load balancer on their own, with real parts: network namespaces on a
bridge (`infra.local.hosts`), nginx's `grpc_pass` with the health watcher
(`infra.local.balancer`) in front of in-process gRPC health servers.

- hosts reach each other and are reached from the harness; a cut link isolates one; closing
  leaves no namespace, link or state file; a network whose owner was SIGKILLed is removed by the
  next start, its processes killed;
- a balancer that points at no healthy replica refuses to start and says which replica answered
  what (`GrpcBalancer`, and `python -m infra.local grpc-lb`);
- the watcher takes a replica that says NOT_SERVING out of nginx's upstream and puts it back.

Run: `.venv/bin/python -m pytest -q tests/integration/test_hosts.py` (as root: namespaces).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from infra.local import hosts as hostnet
from infra.local.balancer import GrpcBalancer, NoHealthyReplica, check_health
from infra.local.hosts import HostNetwork, remove_stale_networks
from infra.local.servers import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]
REPO = Path(__file__).resolve().parents[2]


def our_namespaces(number: int) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    return [line.split()[0] for line in listed if line.startswith(f"arag{number}-")]


def listener(host, port: int) -> subprocess.Popen:
    """A TCP server on `host` that accepts and closes connections."""
    code = ("import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('0.0.0.0', {port})); s.listen(); print('up', flush=True)\n"
            "while True: s.accept()[0].close()")
    proc = subprocess.Popen(host.wrap([sys.executable, "-c", code]), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def reaches(address: str, port: int, timeout: float = 1.0) -> bool:
    try:
        socket.create_connection((address, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def test_hosts_reach_each_other_until_cut_and_leave_nothing_behind():
    port = free_port()
    with HostNetwork(["alpha", "beta"]) as net:
        number, alpha, beta = net.number, net["alpha"], net["beta"]
        assert alpha.address != beta.address and alpha.address.startswith("10.77.")
        server = listener(beta, port)
        probe = [sys.executable, "-c", f"import socket; socket.create_connection(('{beta.address}', {port}), 1)"]
        assert subprocess.run(alpha.wrap(probe)).returncode == 0  # host to host
        assert reaches(beta.address, port)  # the harness, through the bridge
        assert not reaches("127.0.0.1", port, 0.5)  # beta's loopback is its own
        assert server.pid in beta.pids()
        beta.cut()
        assert not reaches(beta.address, port)
        assert subprocess.run(alpha.wrap(probe), capture_output=True).returncode != 0
        beta.reconnect()
        deadline = time.monotonic() + 5
        while not reaches(beta.address, port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reaches(beta.address, port)
    assert server.wait(timeout=10) == -signal.SIGKILL  # closing killed what ran on the hosts
    assert our_namespaces(number) == []
    assert not list(Path("/sys/class/net").glob(f"arag{number}*"))
    assert not (hostnet.STATE_DIR / f"{number}.json").exists()


def test_a_network_whose_owner_was_killed_is_removed_by_the_next_start():
    code = ("import subprocess, time\n"
            "from infra.local.hosts import HostNetwork\n"
            "net = HostNetwork(['gamma']); net.start()\n"
            "subprocess.Popen(net['gamma'].wrap(['sleep', '300']))\n"
            "print(net.number, flush=True); time.sleep(300)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    number = int(owner.stdout.readline())
    deadline = time.monotonic() + 10
    while not hostnet.namespace_pids(f"arag{number}-gamma") and time.monotonic() < deadline:
        time.sleep(0.1)
    sleeper, = hostnet.namespace_pids(f"arag{number}-gamma")
    owner.kill()  # a crashed run: nothing cleaned up
    owner.wait()
    assert our_namespaces(number) == [f"arag{number}-gamma"]
    assert number in remove_stale_networks()
    assert our_namespaces(number) == [] and not Path(f"/sys/class/net/arag{number}br").exists()
    assert not Path(f"/proc/{sleeper}").exists() or "Z" in Path(f"/proc/{sleeper}/stat").read_text().split()[2]


def health_server(status: int) -> tuple[grpc.Server, health.HealthServicer, str]:
    """A gRPC server on loopback with only the standard health service, saying `status`."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = health.HealthServicer()
    servicer.set("", status)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, servicer, f"127.0.0.1:{port}"


def test_a_balancer_pointing_at_no_healthy_replica_refuses_to_start(tmp_path):
    nobody = f"127.0.0.1:{free_port()}"
    server, _, sick = health_server(health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        with pytest.raises(NoHealthyReplica) as refused:
            GrpcBalancer([nobody, sick], tmp_path / "lb", startup_timeout_s=1.0).start()
        message = str(refused.value)
        assert "points at no healthy front door" in message
        assert f"{nobody}: UNREACHABLE" in message and f"{sick}: NOT_SERVING" in message
        assert not (tmp_path / "lb" / "nginx.pid").exists()  # nginx never started

        cli = subprocess.run(
            [sys.executable, "-m", "infra.local", "grpc-lb", "--replica", nobody, "--replica", sick,
             "--startup-timeout", "1"], cwd=REPO, capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        assert cli.returncode == 1
        assert "points at no healthy front door" in cli.stderr and f"{sick}: NOT_SERVING" in cli.stderr
    finally:
        server.stop(0)


def test_the_watcher_takes_a_replica_that_is_not_serving_out_of_the_upstream(tmp_path):
    first, first_health, one = health_server(health_pb2.HealthCheckResponse.SERVING)
    second, _, two = health_server(health_pb2.HealthCheckResponse.SERVING)
    try:
        with GrpcBalancer([one, two], tmp_path / "lb", interval_s=0.2) as balancer:
            assert check_health(balancer.target, timeout_s=2) == "SERVING"  # through nginx
            first_health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            deadline = time.monotonic() + 5
            while balancer.down != [one] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert balancer.down == [one] and f"server {one} max_fails=1" in balancer.config.read_text()
            assert f"{one} max_fails=1 fail_timeout=2s down;" in balancer.config.read_text()
            time.sleep(1.0)  # the reload taken up
            since = time.time()
            for _ in range(6):
                assert check_health(balancer.target, timeout_s=2) == "SERVING"
            time.sleep(0.5)
            calls = [line for line in balancer.access_log.read_text().splitlines()
                     if float(line.split()[0]) >= since]
            assert calls and all(line.split()[1] == two for line in calls), calls
            first_health.set("", health_pb2.HealthCheckResponse.SERVING)
            deadline = time.monotonic() + 5
            while balancer.down and time.monotonic() < deadline:
                time.sleep(0.05)
            assert balancer.down == []
    finally:
        first.stop(0)
        second.stop(0)
