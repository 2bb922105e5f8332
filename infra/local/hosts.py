"""Several "hosts" on one machine: network namespaces joined by veth links to one bridge.

A `HostNetwork` is the harness's own small network, made on `start()` and removed on `close()`:

- one bridge `arag<N>br` in the root namespace with the address 10.77.N.1/24 (the harness, in the
  root namespace, reaches every host through it: the tests' clients, the servers' readiness
  checks), no NAT, no forwarding rule, no route beyond 10.77.N.0/24;
- per host a network namespace `arag<N>-<host>` with its loopback and one veth link to the bridge
  (`eth0` inside, address 10.77.N.(10+i)); a host has no default route, so nothing in it reaches
  any other network.

No address is added anywhere but on loopbacks, in those namespaces and on that bridge, and all of
them are in 10.77.0.0/16 (private). `N` is the first number in 1..250 no other live network of
this harness holds (a state file per network under `/run/arag-hosts/`, created exclusively, with
the owner's pid and start time): several runs on one machine get networks of their own.

A process runs on a host through `Host.wrap(command)` (`ip netns exec`, which execs: the pid
Popen returns is the process's own, so the usual stops and SIGKILLs work). A host dies whole
with `Host.kill_all()` (SIGKILL to every process in its namespace, frozen first) and `cut()`
(its link set down on both ends); `reconnect()` sets the link up again.

Clean-up: `close()` kills every process left in the namespaces, deletes them (their veth links go
with them) and the bridge, and removes the state file. A network whose owner died without
closing it (a crashed run, a SIGKILLed pytest) is removed by the next `start()` of any network
(`remove_stale_networks`), and by `python -m infra.local hosts --clean`.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and `ip` (iproute2).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infra.local.servers import ServerStartError, Started, _processes

IP = shutil.which("ip") or "/usr/sbin/ip"
STATE_DIR = Path(os.environ.get("ARAG_HOSTS_STATE_DIR", "/run/arag-hosts"))
SUBNET = "10.77"  # 10.77.N.0/24 per network
PREFIX = "arag"  # names: arag<N>br, arag<N>-<host>, arag<N>v<i>
NETWORKS = range(1, 251)
_HOST_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")


class HostNetworkError(ServerStartError):
    """The network could not be made (no root, no `ip`, no free network number)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise HostNetworkError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), to tell a pid from its reuse."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def namespace_pids(netns: str) -> list[int]:
    """The pids of every process in the network namespace `netns`."""
    proc = _ip("netns", "pids", netns, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def kill_namespace(netns: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL to every process in `netns` (each frozen first, so none forks a survivor after the
    list was taken), until none is left; the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        pids = [p for p in namespace_pids(netns) if p != os.getpid()]
        table = _processes()
        live = [p for p in pids if p in table and table[p][1] != "Z"]
        if not live:
            return killed
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in live:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        killed.extend(p for p in live if p not in killed)
        if time.monotonic() > deadline:
            raise HostNetworkError(f"processes in {netns} survive SIGKILL: {live}")
        time.sleep(0.05)


@dataclass(frozen=True)
class Host:
    """One host: a network namespace, its address, and the root-side end of its link."""

    name: str
    netns: str
    address: str
    link: str  # the veth end on the bridge (root namespace); `eth0` is the end inside

    def wrap(self, command: Sequence[str], user: tuple[int, int] | None = None) -> list[str]:
        """`command` run on this host (`ip netns exec`), as `user` (uid, gid) when given
        (setpriv: the namespace switch needs root, a program such as PostgreSQL refuses it)."""
        if user is None:
            return [IP, "netns", "exec", self.netns, *command]
        uid, gid = user
        return [IP, "netns", "exec", self.netns, "setpriv", f"--reuid={uid}", f"--regid={gid}",
                "--clear-groups", "--", *command]

    def pids(self) -> list[int]:
        return namespace_pids(self.netns)

    def kill_all(self) -> list[int]:
        """SIGKILL to every process on this host at once (a machine that dies); the pids."""
        return kill_namespace(self.netns)

    def cut(self) -> None:
        """The host's link down on both ends: nothing reaches it, it reaches nothing."""
        _ip("link", "set", "dev", self.link, "down", check=False)
        _ip("-n", self.netns, "link", "set", "dev", "eth0", "down", check=False)

    def reconnect(self) -> None:
        """The link up again (addresses stay)."""
        _ip("-n", self.netns, "link", "set", "dev", "eth0", "up")
        _ip("link", "set", "dev", self.link, "up")

    def endpoint(self, port: int) -> str:
        return f"{self.address}:{port}"


def _state_file(number: int) -> Path:
    return STATE_DIR / f"{number}.json"


def _names(number: int) -> tuple[str, str]:
    """(bridge, namespace prefix) of network `number`."""
    return f"{PREFIX}{number}br", f"{PREFIX}{number}-"


def _remove_network(number: int, namespaces: Sequence[str] | None = None) -> None:
    """Kill what runs in network `number`'s namespaces, delete them and its bridge, forget it."""
    bridge, prefix = _names(number)
    if namespaces is None:
        listed = _ip("netns", "list", check=False).stdout.split("\n")
        namespaces = [line.split()[0] for line in listed if line.startswith(prefix)]
    for netns in namespaces:
        if Path(f"/run/netns/{netns}").exists():
            try:
                kill_namespace(netns)
            finally:
                _ip("netns", "delete", netns, check=False)
    # a deleted namespace takes its veth pairs along, but asynchronously: delete the root-side
    # ends too and wait until they are gone, so the number can be used again at once
    links = lambda: [p.name for p in Path("/sys/class/net").glob(f"{PREFIX}{number}v*")]  # noqa: E731
    for link in links():
        _ip("link", "delete", link, check=False)
    _ip("link", "delete", bridge, check=False)
    deadline = time.monotonic() + 10
    while (links() or Path(f"/sys/class/net/{bridge}").exists()) and time.monotonic() < deadline:
        time.sleep(0.05)
    _state_file(number).unlink(missing_ok=True)


def remove_stale_networks() -> list[int]:
    """Remove every network of this harness whose owner process is gone (a crashed run); the
    numbers removed. Also namespaces and bridges of ours with no state file at all."""
    removed = []
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    known: set[int] = set()
    for path in STATE_DIR.glob("*.json"):
        try:
            number = int(path.stem)
            state = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
        known.add(number)
        if _start_time(int(state.get("pid", 0))) != state.get("start_time"):
            _remove_network(number, state.get("namespaces"))
            removed.append(number)
    # names of ours without a state file: made by a run that died before writing it is impossible
    # (the state is written first), but a deleted /run (reboot-less cleanup) leaves them
    pattern = re.compile(rf"^{PREFIX}(\d+)(?:br|-)")
    orphans: set[int] = set()
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        if (m := pattern.match(line.split()[0] if line.split() else "")) and int(m.group(1)) not in known:
            orphans.add(int(m.group(1)))
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip() if ":" in line else ""
        if (m := pattern.match(name)) and int(m.group(1)) not in known:
            orphans.add(int(m.group(1)))
    for number in sorted(orphans):
        _remove_network(number)
        removed.append(number)
    return removed


@dataclass
class HostNetwork(Started):
    """The hosts `names` (short lowercase names: host0, lb, ...) on one bridge; see the module."""

    names: Sequence[str]
    hosts: dict[str, Host] = field(default_factory=dict)
    number: int | None = None

    def __post_init__(self) -> None:
        bad = [n for n in self.names if not _HOST_NAME.match(n)]
        if bad or len(set(self.names)) != len(self.names) or not self.names:
            raise ValueError(f"host names are distinct, 1-8 lowercase letters or digits: {list(self.names)}")

    @property
    def gateway(self) -> str:
        """The bridge's address in the root namespace (where the harness itself is seen from)."""
        return f"{SUBNET}.{self.number}.1"

    @property
    def subnet(self) -> str:
        return f"{SUBNET}.{self.number}.0/24"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def _claim(self) -> int:
        """The first free network number, claimed by creating its state file exclusively."""
        for number in NETWORKS:
            bridge, _ = _names(number)
            if Path(f"/sys/class/net/{bridge}").exists() or any(Path("/sys/class/net").glob(f"{PREFIX}{number}v*")):
                continue
            try:
                fd = os.open(_state_file(number), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                continue
            _, prefix = _names(number)
            with os.fdopen(fd, "w") as out:
                json.dump({"pid": os.getpid(), "start_time": _start_time(os.getpid()),
                           "namespaces": [prefix + n for n in self.names]}, out)
            return number
        raise HostNetworkError("no free network number in 10.77.1-250")

    def start(self) -> None:
        if self.number is not None:
            return
        if os.geteuid() != 0:
            raise HostNetworkError("network namespaces need root (ip netns)")
        if not Path(IP).exists():
            raise HostNetworkError(f"no `ip` at {IP} (apt package iproute2)")
        remove_stale_networks()
        self.number = self._claim()
        bridge, prefix = _names(self.number)
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(self.names):
            netns, link = prefix + name, f"{PREFIX}{self.number}v{i}"
            address = f"{SUBNET}.{self.number}.{10 + i}"
            _ip("netns", "add", netns)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
            _ip("link", "set", link, "master", bridge, "up")
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("-n", netns, "link", "set", "eth0", "up")
            self.hosts[name] = Host(name, netns, address, link)
        self.wait_reachable()

    def wait_reachable(self, timeout_s: float = 10.0) -> None:
        """Until every host's link is up (a fresh veth takes a moment: its state goes UP after
        the bridge port leaves the listening state; no STP here, so it is quick)."""
        deadline = time.monotonic() + timeout_s
        for host in self.hosts.values():
            while "state UP" not in _ip("-n", host.netns, "link", "show", "eth0", check=False).stdout \
                    and "LOWER_UP" not in _ip("-n", host.netns, "link", "show", "eth0", check=False).stdout:
                if time.monotonic() > deadline:
                    raise HostNetworkError(f"host {host.name}'s link not up after {timeout_s:.0f} s")
                time.sleep(0.05)

    def close(self) -> None:
        if self.number is None:
            return
        try:
            _remove_network(self.number, [h.netns for h in self.hosts.values()] or None)
        finally:
            self.number, self.hosts = None, {}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m infra.local.hosts --clean`: remove the networks of crashed runs."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m infra.local.hosts", description=main.__doc__)
    parser.add_argument("--clean", action="store_true", help="remove networks whose owner is gone")
    args = parser.parse_args(argv)
    if args.clean:
        removed = remove_stale_networks()
        print(f"removed networks {removed}" if removed else "no stale network")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
