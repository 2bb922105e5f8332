"""Local OpenSearch 2.19 nodes on loopback, built from Maven Central artifacts (`infra/opensearch`).

`OpenSearchNode` is one node (`dev.adaptiverag.LocalOpenSearch` in its own JVM): single-node by
default, a member of a cluster when given the settings for it. `OpenSearchCluster` is two such
nodes forming one cluster (the fault campaign's: a node can be lost while the other serves).
Both are `infra.local.servers.LocalServer`s: stopped cleanly ("fast": SIGTERM, the node closes)
or crashed ("kill": SIGKILL) and started again on the same ports and data.

    python -m infra.local opensearch [--port N] [--dir DIR] [--heap 1g]
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.local.servers import LocalServer, ServerStartError, StopMode, free_port

OPENSEARCH_DIR = Path(__file__).resolve().parents[1] / "opensearch"
TARGET = OPENSEARCH_DIR / "target"
LAUNCHER = "dev.adaptiverag.LocalOpenSearch"
JVM_OPTIONS = ("-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true", "-Dfile.encoding=UTF-8",
               "-Dlog4j.shutdownHookEnabled=false", "-Dlog4j2.disable.jmx=true")


def _launcher_is_current() -> bool:
    stamp = TARGET / ".built"
    if not stamp.exists() or not (TARGET / "classes" / (LAUNCHER.replace(".", "/") + ".class")).exists():
        return False
    built = stamp.stat().st_mtime
    sources = [OPENSEARCH_DIR / "pom.xml", *(p for p in (OPENSEARCH_DIR / "src").rglob("*") if p.is_file())]
    return all(p.stat().st_mtime <= built for p in sources)


def build_launcher(mvn: str = "mvn") -> None:
    """Compile the launcher and copy its runtime jars to `target/lib` when the sources changed
    since the last build (the first build downloads about 60 MB of jars into ~/.m2). One build
    at a time per checkout (a file lock), however many processes ask."""
    TARGET.mkdir(exist_ok=True)
    with (TARGET / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _launcher_is_current():
            return
        shutil.rmtree(TARGET / "lib", ignore_errors=True)
        proc = subprocess.run([mvn, "-q", "-B", "-Dstyle.color=never", "compile", "dependency:copy-dependencies"],
                              cwd=OPENSEARCH_DIR, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ServerStartError(f"building the OpenSearch launcher failed ({proc.returncode}):\n"
                                   f"{(proc.stdout + proc.stderr)[-4000:]}")
        (TARGET / ".built").touch()


class OpenSearchNode(LocalServer):
    """One OpenSearch node: HTTP on 127.0.0.1:`port` (on a host: its address), data, logs and home
    under `workdir`.
    `settings` replace the launcher's single-node defaults (a key ending in `[]` is a list)."""

    name = "opensearch"
    start_timeout_s = 180.0
    stop_grace_s = 40.0

    def __init__(self, workdir: Path | None = None, port: int | None = None, *, heap: str = "1g",
                 settings: Mapping[str, str] | None = None, log: Path | None = None,
                 ready_status: str = "yellow") -> None:
        super().__init__(workdir, port, log=log)
        self.heap = heap
        self.settings = dict(settings or {})
        self.ready_status = ready_status

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def prepare(self) -> None:
        build_launcher()

    def command(self) -> list[str]:
        amount, unit = int(self.heap[:-1]), self.heap[-1].lower()
        initial = f"{amount * 512}m" if unit == "g" else f"{amount // 2}{unit}"
        return ["java", f"-Xms{initial}", f"-Xmx{self.heap}", *JVM_OPTIONS,
                "-cp", f"{TARGET / 'classes'}:{TARGET / 'lib'}/*", LAUNCHER, str(self.port), str(self.workdir),
                *(f"{key}={value}" for key, value in
                  {**({"network.host": self.address} if self.host is not None else {}), **self.settings}.items())]

    def ready(self) -> bool:
        health = self.request("GET", f"/_cluster/health?wait_for_status={self.ready_status}&timeout=1s", timeout=5)
        return not health.get("timed_out")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 70.0) -> Any:
        """One REST call; the decoded JSON reply."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return json.loads(response.read() or b"null")

    def wait_health(self, status: str, nodes: int = 1, timeout_s: float = 120.0) -> dict[str, Any]:
        """Wait until the cluster, as this node sees it, is `status` with `nodes` nodes."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.request("GET", f"/_cluster/health?wait_for_status={status}&wait_for_nodes={nodes}"
                                           "&timeout=2s", timeout=10)
                if not last.get("timed_out"):
                    return last
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = str(exc)
            time.sleep(0.5)
        raise RuntimeError(f"OpenSearch not {status} with {nodes} nodes in {timeout_s:.0f} s: {last}")


class OpenSearchCluster:
    """Two nodes on loopback forming the cluster `arag-<name>`: node 1 cluster manager + data (the
    URL clients use), node 2 data only, named `<name>-1` and `<name>-2`. New indices get one
    replica, so either node can be lost while the other serves every shard."""

    def __init__(self, workdir: Path, heap: str = "512m", name: str = "cluster") -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        transport = {1: free_port(), 2: free_port()}
        seeds = ",".join(f"127.0.0.1:{port}" for port in transport.values())
        self.nodes: dict[int, OpenSearchNode] = {}
        for i, roles in ((1, "cluster_manager,data,ingest"), (2, "data,ingest")):
            settings = {
                "cluster.name": f"arag-{name}", "node.name": self.node_name(i, name), "node.roles[]": roles,
                "discovery.type": "zen", "discovery.seed_hosts[]": seeds,
                "cluster.initial_cluster_manager_nodes[]": self.node_name(1, name),
                "transport.port": str(transport[i]), "cluster.default_number_of_replicas": "1",
            }
            self.nodes[i] = OpenSearchNode(workdir / f"node-{i}", heap=heap, settings=settings,
                                           log=workdir / f"node-{i}.log")
        self.name = name

    @staticmethod
    def node_name(i: int, name: str) -> str:
        return f"{name}-{i}"

    @property
    def url(self) -> str:
        return self.nodes[1].url

    def node_url(self, i: int) -> str:
        return self.nodes[i].url

    def start_node(self, i: int) -> None:
        self.nodes[i].start()

    def stop_node(self, i: int, mode: StopMode = "fast") -> None:
        self.nodes[i].stop(mode)

    def request(self, method: str, path: str, body: Any = None, node: int = 1, timeout: float = 70.0) -> Any:
        return self.nodes[node].request(method, path, body, timeout)

    def wait_health(self, status: str, nodes: int, timeout_s: float = 120.0, node: int = 1) -> dict[str, Any]:
        return self.nodes[node].wait_health(status, nodes, timeout_s)

    def start(self) -> None:
        """Both nodes, then a green cluster of two."""
        try:
            self.nodes[1].start()
            self.nodes[2].start()
            self.wait_health("green", 2, 180.0)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for i in (2, 1):
            self.nodes[i].close()

    def __enter__(self) -> OpenSearchCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
