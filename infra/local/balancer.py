"""A real gRPC load balancer in front of front-door replicas: nginx (Debian's `nginx-light` or
`nginx`) with `grpc_pass`, one address for every client.

`GrpcBalancer` writes an nginx config with one upstream of the replicas and runs nginx in the
foreground (on loopback, or on a host of `infra.local.hosts`); it is a `LocalServer`, so it stops,
crashes and starts again on its port like the other local servers. nginx spreads calls (HTTP/2
streams) over the replicas round-robin, keeps HTTP/2 connections to them (`keepalive`), and
passes a call whose connection to a replica fails (refused, reset before the request was sent,
connect timeout) to the next replica (`grpc_next_upstream error timeout`): a dead replica costs
new calls nothing, while a call already running on it when it died ends with UNAVAILABLE (nginx's
502), which a client resends with the same `client_request_id`.

Health: open-source nginx has only passive checks (`max_fails`/`fail_timeout`: a replica whose
connection failed is skipped for `fail_timeout`, then tried with one live call). They see only
connection errors, on real calls. Three cases they miss are why `HealthWatcher` exists: a replica
that is up but says NOT_SERVING through the standard gRPC health service (its records database or
broker away, no worker answering, draining), which nginx would keep sending calls to; a replica
behind a cut link, where every new call first waits `grpc_connect_timeout`; and a replica that
comes back, which passive checks only find by risking a live call. The watcher asks each replica's
`grpc.health.v1.Health/Check` (service "", the front door's readiness) every `interval_s`, and
when the set of SERVING replicas changes it rewrites the upstream (the others marked `down`) and
reloads nginx (SIGHUP: new workers take the new list, old ones finish their calls). With none
serving it lists them all and leaves it to the passive checks. This is what an active health check
of a managed balancer (or nginx Plus's `health_check`, or Envoy's) does in production.

Start-up refuses a configuration that cannot serve: when no replica says SERVING within
`startup_timeout_s`, `start()` raises `NoHealthyReplica` naming each replica and what it answered,
before nginx is even started (`python -m infra.local grpc-lb --replica HOST:PORT ...` prints it and
exits 1).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from infra.local.servers import LocalServer, ServerStartError

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
# A replica whose connection failed is skipped this long by nginx's passive check.
FAIL_TIMEOUT_S = 2
# How long nginx waits to connect to a replica before it passes the call to the next one.
CONNECT_TIMEOUT_S = 1
# How often the watcher asks each replica's health, and how long it waits for an answer.
CHECK_INTERVAL_S = 0.5
CHECK_TIMEOUT_S = 0.5
# Access log: when, which replica, HTTP status, the replica's grpc-status, seconds, method.
LOG_FORMAT = "$msec $upstream_addr $status $upstream_trailer_grpc_status $request_time $uri"


class NoHealthyReplica(ServerStartError):
    """The balancer's upstream names no replica that says SERVING."""


def check_health(address: str, timeout_s: float = CHECK_TIMEOUT_S, channel: Any = None) -> str:
    """What `address`'s standard gRPC health service says for readiness (service ""): SERVING,
    NOT_SERVING, ..., or UNREACHABLE (<gRPC status>) when it does not answer."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    own = channel is None
    channel = channel or grpc.insecure_channel(address)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                           timeout=timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.RpcError as exc:
        return f"UNREACHABLE ({exc.code().name})"
    finally:
        if own:
            channel.close()


def nginx_config(listen: str, replicas: Sequence[str], down: Sequence[str], workdir: Path) -> str:
    """The nginx config: `listen` (HOST:PORT, HTTP/2 cleartext) passing every gRPC call to the
    upstream of `replicas`, those in `down` marked down (unless that is all of them)."""
    marked = set(down) if set(down) != set(replicas) else set()
    servers = "\n".join(
        f"    server {r} max_fails=1 fail_timeout={FAIL_TIMEOUT_S}s{' down' if r in marked else ''};"
        for r in replicas)
    temp = workdir / "tmp"
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""# written by infra.local.balancer; rewritten when a replica's health changes
{user}worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log stderr notice;
events {{ worker_connections 4096; }}
http {{
  log_format grpc '{LOG_FORMAT}';
  access_log {workdir}/access.log grpc;
  client_body_temp_path {temp}/body;
  proxy_temp_path {temp}/proxy;
  fastcgi_temp_path {temp}/fastcgi;
  uwsgi_temp_path {temp}/uwsgi;
  scgi_temp_path {temp}/scgi;
  # a client keeps its HTTP/2 connection for its whole life (nginx's default closes it after
  # 1000 calls; gRPC reconnects, but a call racing the close would fail)
  keepalive_requests 1000000;
  keepalive_timeout 3600s;
  upstream frontdoors {{
{servers}
    keepalive 64;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
  }}
  server {{
    listen {listen} http2;
    location / {{
      grpc_pass grpc://frontdoors;
      grpc_next_upstream error timeout;
      grpc_next_upstream_tries 2;
      grpc_connect_timeout {CONNECT_TIMEOUT_S}s;
      grpc_read_timeout 600s;
      grpc_send_timeout 600s;
      grpc_socket_keepalive on;
    }}
  }}
}}
"""


class GrpcBalancer(LocalServer):
    """nginx on `port` passing gRPC calls to `replicas` (HOST:PORT each), with a `HealthWatcher`
    keeping its upstream to the SERVING ones (`watch=False`: passive checks only). `address` is
    where clients connect (`target`)."""

    name = "nginx"

    def __init__(self, replicas: Sequence[str], workdir: Path | None = None, port: int | None = None, *,
                 watch: bool = True, startup_timeout_s: float = 10.0, interval_s: float = CHECK_INTERVAL_S,
                 log: Path | None = None) -> None:
        super().__init__(workdir, port, log=log)
        if not replicas:
            raise ValueError("a load balancer needs at least one replica")
        self.replicas = list(replicas)
        self.down: list[str] = []
        self.watch = watch
        self.startup_timeout_s = startup_timeout_s
        self.interval_s = interval_s
        self.config = self.workdir / "nginx.conf"
        self.access_log = self.workdir / "access.log"
        self.watcher: HealthWatcher | None = None

    @property
    def target(self) -> str:
        """HOST:PORT, the one address clients use."""
        return f"{self.address}:{self.port}"

    @property
    def url(self) -> str:
        return f"grpc://{self.target}"

    def write_config(self) -> None:
        (self.workdir / "tmp").mkdir(parents=True, exist_ok=True)
        text = nginx_config(self.target, self.replicas, self.down, self.workdir)
        fresh = self.config.with_suffix(".tmp")
        fresh.write_text(text)
        fresh.replace(self.config)

    def prepare(self) -> None:
        if not Path(NGINX).exists():
            raise ServerStartError(f"no nginx at {NGINX} (apt-get install nginx-light)")
        health = self.wait_for_a_healthy_replica()
        self.down = [r for r, status in health.items() if status != "SERVING"]
        self.write_config()

    def wait_for_a_healthy_replica(self) -> dict[str, str]:
        """Each replica's health, once one says SERVING; `NoHealthyReplica` after
        `startup_timeout_s` without one (the message names each replica and its answer)."""
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            health = {r: check_health(r) for r in self.replicas}
            if "SERVING" in health.values():
                return health
            if time.monotonic() > deadline:
                said = "; ".join(f"{r}: {s}" for r, s in health.items())
                raise NoHealthyReplica(
                    f"the gRPC load balancer points at no healthy front door (none says SERVING on the "
                    f"standard gRPC health service within {self.startup_timeout_s:.0f} s): {said}. "
                    "Check the replica addresses and that each front door runs and reaches its "
                    "records database, broker and workers.")
            time.sleep(0.2)

    def command(self) -> list[str]:
        return [NGINX, "-p", str(self.workdir), "-c", str(self.config), "-e", "stderr"]

    def ready(self) -> bool:
        with socket.create_connection((self.address, self.port), timeout=1):
            pass
        return check_health(self.target, timeout_s=2.0) == "SERVING"

    def after_start(self) -> None:
        if self.watch and self.watcher is None:
            self.watcher = HealthWatcher(self.replicas, self.set_down, self.interval_s, initial=self.down)
            self.watcher.start()

    def set_down(self, down: Sequence[str]) -> None:
        """Mark `down` (the rest up) and reload nginx: new calls go to the others."""
        self.down = list(down)
        self.write_config()
        if self.is_running():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGHUP)

    def stop(self, mode: Any = "fast") -> None:
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        super().stop(mode)

    def upstreams_used(self, since: float = 0.0) -> list[str]:
        """The replica of each call in the access log from `since` (UNIX time) on, in order."""
        used = []
        try:
            lines = self.access_log.read_text().splitlines()
        except OSError:
            return used
        for line in lines:
            parts = line.split()
            if len(parts) >= 2 and float(parts[0]) >= since and "/grpc.health" not in line:
                used.append(parts[1])
        return used


class HealthWatcher:
    """A thread asking each replica's gRPC health every `interval_s`; `on_change(down)` with the
    replicas not SERVING whenever that set changes. `changes`: (time, down) of each change."""

    def __init__(self, replicas: Sequence[str], on_change: Callable[[Sequence[str]], None],
                 interval_s: float = CHECK_INTERVAL_S, initial: Sequence[str] = ()) -> None:
        import grpc

        self.replicas = list(replicas)
        self.on_change = on_change
        self.interval_s = interval_s
        self.down = sorted(initial)
        self.changes: list[tuple[float, list[str]]] = []
        self.last: dict[str, str] = {}
        # a channel per replica, reconnecting quickly once it is back
        options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 500)]
        self._channels = {r: grpc.insecure_channel(r, options=options) for r in self.replicas}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="grpc-lb-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for channel in self._channels.values():
            channel.close()

    def check_once(self) -> list[str]:
        self.last = {r: check_health(r, channel=self._channels[r]) for r in self.replicas}
        down = sorted(r for r, status in self.last.items() if status != "SERVING")
        if down != self.down:
            self.down = down
            self.changes.append((time.time(), down))
            self.on_change(down)
        return down

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check_once()
            except Exception:  # noqa: BLE001 - a failed round is retried on the next tick
                continue
