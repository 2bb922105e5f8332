"""The lab's local stack: the whole service on loopback with the parts an experiment or a test
chooses, the servers it needs started here, and a handle on every process for fault injection.

    with lab_stack(workdir, Parts(broker="redis", records="postgres", llm="instant"),
                   pools=("A", "B", "C"), settings={"tenant_rate_per_s": 0}, tenants=("acme",)) as stack:
        key = stack.api_key("acme")          # then gRPC to stack.address, /metrics at stack.metrics_url
        stack.redis.restart(down_s=5)        # a fault: the broker away for 5 s
        stack.restart_frontdoor()            # SIGKILL, then a new front door on the same address

It is `services.demo.local.local_stack` (what `make demo` runs: Triton when a classifier version
is published, the worker pools, the front door, each tenant's knowledge base imported through the
KnowledgeBase API, everything it started stopped on exit) with, in front of it, what only the lab
needs:

- `Parts` names each part's implementation: broker Redis or the server-less filesystem broker;
  records PostgreSQL or SQLite; classifier the local Triton or the rules; retriever tantivy or
  OpenSearch (one node, or a two-node cluster); LLM the instant endpoint (a measurement device,
  `lab.harness.instant_llm`), one shared llama-server, or the embedded model in every worker. A
  part left None is what `make demo` would use (the environment's server, else the embedded one).
  A server part named here is started here, unless `settings` gives its address (tests share
  one Redis and PostgreSQL across modules; two stacks of one experiment share servers).
- `settings`: values of the components' settings (`StackSettings.updated` names), over the
  environment and over what the parts chose; `defaults`: values used only where the environment
  sets none; `concurrency`: processes per pool; `env`: more environment for every process started.
- handles: `redis`, `postgres`, `opensearch`, `llm` (each stops and starts again on its port),
  `triton` and `frontdoor` (`restart_triton`, `restart_frontdoor`), `pools` (`workers.pools`:
  kill a pool or a child; `supervise=` restarts what dies), extra front doors and Tritons
  (`start_frontdoor`, `start_triton`, stopped with the stack).

Past one machine (`hosts=Hosts(...)`): the same stack over several "hosts" on this machine
(`infra.local.hosts`: network namespaces joined by veth links to one bridge), e.g. front doors on
host1 and host2 behind the gRPC load balancer on `lb` (nginx, `infra.local.balancer`), worker pools
on host3 and host4, Redis, PostgreSQL, OpenSearch and the instant LLM on host0:

    with lab_stack(workdir, SERVERS, hosts=Hosts(), settings=...) as stack:
        stack.address                        # the balancer: the one address clients use
        stack.kill_frontdoor("host1")        # SIGKILL one replica
        stack.kill_host("host3")             # every process on host3 SIGKILLed, its link cut

Layout under `workdir`: `logs/` (workers/ (per host: workers/<host>/), frontdoor*.log, the LLM's,
the servers'), `redis/`, `opensearch/`, `kb/`, `broker/`, `traces/`, `triton*.log`, `balancer/`
(nginx's config and access log); `stack_logs(workdir)` lists the logs.
"""

from __future__ import annotations

import shutil
import signal
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from adaptive_rag.contracts import DEFAULT_SCOPES, Scope
from infra.local.servers import free_port
from services.demo.local import ALL_POOLS, LocalStack, local_stack
from services.demo.stack import FrontDoorProcess, StackSettings
from workers.pools import RestartPolicy

if TYPE_CHECKING:
    from infra.local.servers import Durability

REPO = Path(__file__).resolve().parents[2]
DEMO_KNOWLEDGE_BASE = REPO / "demo" / "knowledge_base.jsonl"
TIER_POOLS = ("A", "B", "C")


@dataclass(frozen=True)
class Hosts:
    """Where each process runs when the stack spans hosts (each a network namespace of
    `infra.local.hosts`): the servers (Redis, PostgreSQL, OpenSearch, the instant LLM) on
    `servers`, one front-door replica on each of `frontdoors` behind the gRPC load balancer on
    `balancer`, and on each host of `pools` the worker pools it names."""

    servers: str = "host0"
    frontdoors: tuple[str, ...] = ("host1", "host2")
    pools: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {"host3": TIER_POOLS, "host4": TIER_POOLS})
    balancer: str = "lb"
    # the balancer's active health checks (`infra.local.balancer.HealthWatcher`); False: nginx's
    # passive checks only
    watch_health: bool = True

    def names(self) -> list[str]:
        """Every host, each once, in the order of the roles."""
        found = [self.servers, self.balancer, *self.frontdoors, *self.pools]
        return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Parts:
    """Which implementation of each part runs. None: what `make demo` would use (the server the
    environment configures, else the embedded default)."""

    # redis-sentinel: a primary, a replica and three Sentinels (`infra.local.failover`)
    broker: Literal["redis", "redis-sentinel", "filesystem"] | None = None
    # postgres-replica: a primary and a streaming replica, the services on a multi-host URL
    # (`target_session_attrs=read-write`); a promotion is the lab's to do (`infra.local.failover`)
    records: Literal["postgres", "postgres-replica", "sqlite"] | None = None
    # triton: the model repository's newest classifier version (one must be published);
    # rules: no classifier (an empty repository): every decision is the flagged rules fallback
    classifier: Literal["triton", "rules"] | None = None
    retriever: Literal["tantivy", "opensearch", "opensearch-cluster"] | None = None
    llm: Literal["instant", "llama-server", "embedded"] | None = None


# Real servers for what production runs on servers; the model's cost left out.
SERVERS = Parts(broker="redis", records="postgres", llm="instant")


def environment_settings(dotenv: bool = True) -> StackSettings:
    """Every component's settings from the environment (and the `.env` file unless `dotenv` is
    False: tests must not depend on a developer's file)."""
    if dotenv:
        return StackSettings()
    from adaptive_rag.settings import ClassifierSettings, Settings
    from services.frontdoor.settings import FrontDoorSettings
    from workers.settings import WorkerSettings

    no_file = {"_env_file": None}
    return StackSettings(library=Settings(**no_file), classifier=ClassifierSettings(**no_file),
                         frontdoor=FrontDoorSettings(**no_file), workers=WorkerSettings(**no_file))


def stack_logs(workdir: Path) -> list[Path]:
    """The logs of a stack that ran in `workdir`: the workers' first (where a request's run is
    told), then the front doors', Triton's, the LLM's and the servers'."""
    logs = workdir / "logs"
    workers = sorted((logs / "workers").glob("**/*.log"))
    others = sorted(logs.glob("*.log")) + sorted(workdir.glob("triton*.log"))
    servers = sorted((workdir / "redis").glob("*.log")) + sorted((workdir / "opensearch").glob("*.log"))
    return workers + others + servers


@dataclass
class LabStack:
    """A running lab stack (inside `lab_stack`): addresses, keys, and a handle on every process."""

    core: LocalStack
    parts: Parts
    # the servers started here (each stops, or crashes, and starts again on its port and data):
    redis: Any = None  # infra.local.servers.LocalRedis
    postgres: Any = None  # infra.local.servers.LocalPostgres
    opensearch: Any = None  # infra.local.opensearch.OpenSearchNode or OpenSearchCluster
    llm: Any = None  # lab.harness.instant_llm.InstantLLM or infra.local.llama_server.LlamaServerProcess
    sentinel: Any = None  # infra.local.failover.LocalRedisSentinel (broker "redis-sentinel")
    postgres_replica: Any = None  # infra.local.failover.LocalPostgresReplica (records "postgres-replica")
    # what the parts are, in words, for reports
    using: dict[str, str] = field(default_factory=dict)
    # past one machine (`hosts=`): the network, the balancer, the replicas and pools per host
    network: Any = None  # infra.local.hosts.HostNetwork
    balancer: Any = None  # infra.local.balancer.GrpcBalancer
    frontdoors: dict[str, FrontDoorProcess] = field(default_factory=dict)
    host_pools: dict[str, Any] = field(default_factory=dict)  # host -> workers.pools.WorkerPools
    # what stops with the stack (more front doors and Tritons join it)
    _started: ExitStack = field(default_factory=ExitStack, repr=False)
    _restarts: Counter = field(default_factory=Counter, repr=False)

    # --- where it is --------------------------------------------------------------------------
    @property
    def settings(self) -> StackSettings:
        return self.core.settings

    @property
    def workdir(self) -> Path:
        return self.core.workdir

    @property
    def address(self) -> str:
        """The front door's gRPC address (HOST:PORT)."""
        return self.core.address

    @property
    def metrics_url(self) -> str:
        return self.core.metrics_url

    @property
    def store(self) -> Any:
        """The records (`adaptive_rag.storage.RecordStore`)."""
        return self.core.store

    @property
    def pools(self) -> Any:
        """The worker pools (`workers.pools.WorkerPools`)."""
        return self.core.pools

    @property
    def frontdoor(self) -> FrontDoorProcess | None:
        return self.core.frontdoor

    @property
    def triton(self) -> Any:
        """The local Triton (`services.classifier.local.TritonProcess`), None when the rules route."""
        return self.core.triton

    @property
    def leftovers(self) -> list[tuple[int, str]]:
        """Processes still alive after the orderly stop (killed then); filled on exit."""
        return self.core.leftovers

    def api_key(self, tenant: str, scopes: frozenset[Scope] = DEFAULT_SCOPES) -> str:
        return self.core.create_api_key(tenant, scopes)

    def logs(self) -> list[Path]:
        return stack_logs(self.workdir)

    # --- more processes, and restarts ---------------------------------------------------------
    def start_frontdoor(self, name: str, *, settings: StackSettings | None = None, **env: str) -> FrontDoorProcess:
        """Another front door (log `logs/<name>.log`) on the stack's settings with a fresh address
        and metrics port (or on `settings`), `env` added; stopped with the stack at the latest."""
        if settings is None:
            settings = self.settings.updated(grpc_listen=f"127.0.0.1:{free_port()}", metrics_port=free_port())
        door = self.core.start_frontdoor(self.core.logs / f"{name}.log", settings, **env)
        self._started.callback(door.stop)
        return door

    def restart_frontdoor(self, sig: int = signal.SIGKILL) -> FrontDoorProcess:
        """The stack's front door killed with `sig` (its whole process group) and started again on
        the same address; returns the new one."""
        import os

        old = self.core.frontdoor
        assert old is not None, "this stack runs no front door"
        try:
            os.killpg(old.pid, sig)
        except ProcessLookupError:
            pass
        old.process.wait(timeout=30)
        old.stop()
        self._restarts["frontdoor"] += 1
        self.core.frontdoor = self.core.start_frontdoor(
            self.core.logs / f"frontdoor-{self._restarts['frontdoor'] + 1}.log")
        return self.core.frontdoor

    def start_triton(self, name: str, repository: Path | None = None, grpc_port: int | None = None) -> Any:
        """Another local Triton (log `<name>.log` in the work directory) serving `repository`
        (default: the stack's); stopped with the stack at the latest."""
        server = self.core.start_triton(self.workdir / f"{name}.log", repository, grpc_port)
        self._started.callback(server.stop)
        return server

    def restart_triton(self, down_s: float = 0.0) -> Any:
        """The stack's Triton stopped, away `down_s` seconds, then serving the model repository
        again on the same port (a new version published meanwhile is what it serves); returns it."""
        import time

        old = self.core.triton
        assert old is not None, "this stack runs no Triton"
        old.stop()
        time.sleep(down_s)
        self._restarts["triton"] += 1
        self.core.triton = self.start_triton(f"triton-{self._restarts['triton']}", grpc_port=old.grpc_port)
        return self.core.triton

    # --- hosts (a stack started with `hosts=`) -----------------------------------------------
    def host(self, name: str) -> Any:
        """The `infra.local.hosts.Host` called `name`."""
        assert self.network is not None, "this stack runs on one host (start it with hosts=)"
        return self.network[name]

    def kill_frontdoor(self, host: str) -> FrontDoorProcess:
        """SIGKILL to the front-door replica on `host` (its whole process group); returns it."""
        import os

        door = self.frontdoors[host]
        try:
            os.killpg(door.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        door.process.wait(timeout=30)
        door.stop()
        return door

    def start_frontdoor_on(self, host: str) -> FrontDoorProcess:
        """A front door on `host` on the address its replica had (after `kill_frontdoor`)."""
        old = self.frontdoors[host]
        self._restarts[f"frontdoor-{host}"] += 1
        settings = self.settings.updated(grpc_listen=old.listen, metrics_port=free_port())
        door = self.core.start_frontdoor(
            self.core.logs / f"frontdoor-{host}-{self._restarts[f'frontdoor-{host}'] + 1}.log", settings,
            wrap=self.host(host).wrap)
        self._started.callback(door.stop)
        self.frontdoors[host] = door
        return door

    def kill_host(self, name: str, cut: bool = True) -> list[int]:
        """The host dies whole: SIGKILL to every process on it at once, and (`cut`) its link cut;
        the pids killed. Its worker pools are known dead (nothing restarts them)."""
        host = self.host(name)
        killed = host.kill_all()
        if cut:
            host.cut()
        for pool in (self.host_pools.get(name).pools.values() if name in self.host_pools else ()):
            pool.process.wait(timeout=10)
        return killed

    def start_pools_on(self, name: str, pools: Iterable[str] | None = None) -> Any:
        """New worker pools on host `name` (after `kill_host`: its link set up again first), the
        pools it ran unless `pools` says; waits until they are ready; returns them."""
        from workers.pools import WorkerPools

        host = self.host(name)
        host.reconnect()
        old = self.host_pools.get(name)
        names = tuple(pools) if pools is not None else (tuple(old.pool_names) if old is not None else TIER_POOLS)
        self._restarts[f"pools-{name}"] += 1
        settings = self.settings
        fresh = WorkerPools(settings.workers, pools=names, library=settings.library,
                            log_dir=self.core.logs / "workers" / f"{name}-{self._restarts[f'pools-{name}'] + 1}",
                            extra_env=self.core.child_env, migrate=False, wrap=host.wrap, node_host=name)
        self._started.callback(fresh.stop)
        self.host_pools[name] = fresh
        fresh.start(wait=False)
        for pool in fresh.pool_names:
            fresh.wait_ready(pool)
        return fresh

    # --- what it is, for reports --------------------------------------------------------------
    def facts(self) -> dict[str, Any]:
        """The stack's parts and the settings a report states (pool sizes, queue limits, ...)."""
        workers, frontdoor = self.settings.workers, self.settings.frontdoor
        names = list(self.pools.pool_names) if self.pools is not None else []
        return {
            "stack": dict(self.using),
            "concurrency": {p: workers.pool_concurrency(p) for p in names},
            "prefetch": {p: workers.pool_prefetch(p) for p in names},
            "queue_limits": {str(getattr(k, "value", k)): v for k, v in frontdoor.max_queue_depth.items()},
            "visibility_timeout_s": workers.visibility_timeout_s,
            "task_max_retries": workers.task_max_retries,
            "task_retry_backoff_s": workers.task_retry_backoff_s,
            "unavailable_retry_s": frontdoor.unavailable_retry_s,
        }

    def processes(self) -> dict[int, str]:
        """pid -> role of the stack's long-running processes (for CPU accounting)."""
        found: dict[int, str] = {}
        if self.frontdoor is not None:
            found[self.frontdoor.pid] = "front door"
        for host, door in self.frontdoors.items():
            found[door.pid] = f"front door on {host}"
        if self.balancer is not None and self.balancer.pid is not None:
            found[self.balancer.pid] = "load balancer"
        for host, host_pools in self.host_pools.items():
            for name, pool in host_pools.pools.items():
                found[pool.pid] = f"worker pool {name} on {host}"
        for name, pool in (self.pools.pools.items() if self.pools is not None else ()):
            found[pool.pid] = f"worker pool {name}"
        if self.triton is not None:
            found[self.triton.proc.pid] = "triton"
        return found


def _describe_llm(parts: Parts, llm: Any, latency_ms: float) -> str | None:
    if parts.llm == "instant" and llm is not None:
        return (f"instant LLM endpoint (a measurement device, {latency_ms:g} ms per completion, no CPU) "
                f"{llm.url}")
    if llm is not None and hasattr(llm, "parallel"):  # the shared llama-server
        return f"one shared llama-server -np {llm.parallel} -t {llm.threads} ({llm.base_url})"
    return None


def unwind_on_stop_signals() -> None:
    """SIGTERM and SIGHUP unwind a run like Ctrl-C, so the stack stops every process it started
    (by default they end the driver at once and leave its servers and pools running). Only from
    the main thread (where Python delivers signals) and only over the default handlers: a run
    that installed its own keeps them."""
    import threading

    from services.demo.local import install_stop_signals

    if threading.current_thread() is not threading.main_thread():
        return
    # ignored counts as not installed: `nohup` starts a run with SIGHUP ignored, and SIGTERM must
    # still unwind it
    if all(signal.getsignal(sig) in (signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler)
           for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
        install_stop_signals()


@contextmanager
def lab_stack(
    workdir: Path,
    parts: Parts = Parts(),
    *,
    pools: Iterable[str] = ALL_POOLS,
    concurrency: Mapping[str, int] | None = None,
    settings: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    tenants: Iterable[str] = ("demo",),
    knowledge_base: Path = DEMO_KNOWLEDGE_BASE,
    model_repository: Path | None = None,
    frontdoor: bool = True,
    supervise: RestartPolicy | None = None,
    supervise_poll_s: float = 0.5,
    llm_latency_ms: float = 0.0,
    llama_parallel: int = 4,
    llama_threads: int = 2,
    postgres_durability: Durability = "off",
    sentinel_down_after_ms: int | None = None,
    hosts: Hosts | None = None,
    opensearch_heap: str = "512m",
    dotenv: bool = True,
    console: Any = None,
    marker: str | None = None,
) -> Iterator[LabStack]:
    """Start the servers `parts` asks for, then the stack on them (see the module docstring);
    yield it; stop everything on exit (also on an error or Ctrl-C)."""
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    say = console.print if console is not None else (lambda *_: None)
    base = environment_settings(dotenv)
    if defaults:
        base = base.updated(**{k: v for k, v in defaults.items() if not base.configured(k)})
    given = dict(settings or {})
    if concurrency:
        given["concurrency"] = dict(concurrency)
    chosen: dict[str, Any] = {}
    servers: dict[str, Any] = {}
    unwind_on_stop_signals()
    with ExitStack() as started:
        logs.mkdir(exist_ok=True)
        network, server_host = None, None
        if hosts is not None:
            from infra.local.hosts import HostNetwork

            network = started.enter_context(HostNetwork(hosts.names()))
            server_host = network[hosts.servers]
            say(f"hosts {', '.join(f'{h.name} {h.address}' for h in network.hosts.values())} "
                f"on {network.subnet}")

        def placed(server: Any) -> Any:
            return server.on_host(server_host) if server_host is not None else server

        if parts.broker == "redis" and "redis_url" not in given:
            from infra.local.servers import LocalRedis

            shutil.rmtree(workdir / "redis", ignore_errors=True)  # an earlier run's queued messages
            redis = servers["redis"] = started.enter_context(placed(LocalRedis(workdir / "redis")))
            chosen["redis_url"] = redis.url
            say(f"redis-server on {redis.url}")
        elif parts.broker == "redis-sentinel" and "redis_url" not in given:
            from infra.local.failover import DOWN_AFTER_MS, LocalRedisSentinel

            shutil.rmtree(workdir / "redis", ignore_errors=True)
            sentinel = servers["sentinel"] = started.enter_context(placed(LocalRedisSentinel(
                workdir / "redis", down_after_ms=sentinel_down_after_ms or DOWN_AFTER_MS)))
            chosen["redis_url"] = sentinel.url
            say(f"Redis under Sentinel on {sentinel.url} (down-after-milliseconds {sentinel.down_after_ms})")
        elif parts.broker == "filesystem":
            chosen["redis_url"] = None

        if parts.records in ("postgres", "postgres-replica") and "database_url" not in given:
            from infra.local.servers import LocalPostgres

            # a temporary data directory: under root the server runs as its own account, which must enter it
            postgres = servers["postgres"] = started.enter_context(placed(LocalPostgres(
                durability=postgres_durability, max_connections=300, log=logs / "postgres.log")))
            chosen["database_url"] = postgres.url
            if parts.records == "postgres-replica":
                from infra.local.failover import LocalPostgresReplica, multi_host_url

                replica = servers["postgres_replica"] = started.enter_context(placed(LocalPostgresReplica(
                    postgres, log=logs / "postgres-replica.log")))
                chosen["database_url"] = multi_host_url([postgres, replica])
            say(f"PostgreSQL on {chosen['database_url']} (durability {postgres_durability})")
        elif parts.records == "sqlite":
            chosen["database_url"] = f"sqlite:///{workdir / 'arag.db'}"

        if model_repository is not None:
            chosen["model_repository"] = model_repository.resolve()
        if parts.classifier == "rules":  # no version: every decision is the flagged rules fallback
            (workdir / "no-classifier").mkdir(exist_ok=True)
            chosen["model_repository"] = workdir / "no-classifier"
        elif parts.classifier == "triton":
            from adaptive_rag.routing.model_repository import versions

            classifier = base.updated(**{**chosen, **given}).classifier
            if not versions(classifier.model_repository / classifier.classifier_model):
                raise ValueError(f"no classifier version in {classifier.model_repository} for Triton to serve "
                                 "(`arag model ship --repository ...` publishes the shipped router)")

        if parts.retriever == "tantivy":
            chosen["retriever"] = "tantivy"
        elif parts.retriever in ("opensearch", "opensearch-cluster"):
            chosen["retriever"] = "opensearch"
            if "opensearch_url" not in given:
                from infra.local.opensearch import OpenSearchCluster, OpenSearchNode

                shutil.rmtree(workdir / "opensearch", ignore_errors=True)  # a node would rejoin an earlier cluster
                if server_host is not None and parts.retriever != "opensearch":
                    raise ValueError("past one machine the lab runs one OpenSearch node (retriever='opensearch')")
                opensearch = servers["opensearch"] = started.enter_context(
                    placed(OpenSearchNode(workdir / "opensearch", heap=opensearch_heap, log=logs / "opensearch.log"))
                    if parts.retriever == "opensearch" else
                    OpenSearchCluster(workdir / "opensearch", heap=opensearch_heap, name="lab"))
                chosen["opensearch_url"] = opensearch.url
                say(f"OpenSearch ({parts.retriever}) on {opensearch.url}")

        llm = None
        if parts.llm == "instant" and "llm_base_url" not in given:
            from lab.harness.instant_llm import InstantLLM

            llm = started.enter_context(InstantLLM(logs / "instant_llm.log", llm_latency_ms, host=server_host))
            chosen["llm_base_url"] = llm.url
        elif parts.llm == "embedded":
            chosen["llm_base_url"] = None
        # llama-server (or None, what `make demo` runs) without an endpoint given: the core
        # starts the shared llama-server
        local_llm = "embedded" if parts.llm == "embedded" else "server"
        if hosts is not None and parts.llm not in ("instant", "embedded") and "llm_base_url" not in given:
            raise ValueError("past one machine the lab runs the instant LLM, the embedded one, or the one "
                             "`settings` names (llm_base_url)")
        if hosts is not None and parts.classifier != "rules" and "triton_grpc_url" not in given:
            raise ValueError("past one machine the lab routes with the rules (classifier='rules') or the "
                             "Triton `settings` names (triton_grpc_url)")
        core = started.enter_context(local_stack(
            workdir, settings=base.updated(**{**chosen, **given}), knowledge_base=knowledge_base,
            tenants=() if hosts else tenants, pools=() if hosts else pools, frontdoor=frontdoor and not hosts,
            extra_env=env, console=console, marker=marker,
            llm=local_llm, llm_slots=llama_parallel, llm_threads=llama_threads))
        llm = llm or core.llm_server
        described = _describe_llm(parts, llm, llm_latency_ms)
        running = LabStack(core, parts, redis=servers.get("redis"), postgres=servers.get("postgres"),
                           opensearch=servers.get("opensearch"), llm=llm, sentinel=servers.get("sentinel"),
                           postgres_replica=servers.get("postgres_replica"),
                           using={**core.plan.using, **({"llm": described} if described else {})},
                           _started=started, network=network)
        if hosts is not None:
            _start_on_hosts(running, hosts, frontdoor, say)
            for tenant in tenants:  # through the balancer, as a client would
                core.import_knowledge(tenant, knowledge_base)
        if supervise is not None:
            running.pools.start_supervisor(poll_s=supervise_poll_s, policy=supervise)
        yield running


def _start_on_hosts(running: LabStack, hosts: Hosts, frontdoor: bool, say: Any) -> None:
    """The worker pools and front-door replicas on their hosts, then the balancer in front of the
    replicas; the stack's address becomes the balancer's. All stopped with the stack."""
    from infra.local.balancer import GrpcBalancer
    from workers.pools import WorkerPools

    core, network = running.core, running.network
    settings = core.settings
    for name, pool_names in hosts.pools.items():
        host = network[name]
        host_pools = WorkerPools(settings.workers, pools=tuple(pool_names), library=settings.library,
                                 log_dir=core.logs / "workers" / name, extra_env=core.child_env, migrate=False,
                                 wrap=host.wrap, node_host=name)
        running._started.callback(host_pools.stop)
        running.host_pools[name] = host_pools
        host_pools.start(wait=False)
    for name, host_pools in running.host_pools.items():
        for pool in host_pools.pool_names:
            host_pools.wait_ready(pool)
        say(f"worker pools {', '.join(host_pools.pool_names)} on {name}")
    if not frontdoor:
        return
    for name in hosts.frontdoors:
        host = network[name]
        door_settings = settings.updated(grpc_listen=host.endpoint(free_port()), metrics_port=free_port())
        door = core.start_frontdoor(core.logs / f"frontdoor-{name}.log", door_settings, wrap=host.wrap)
        running._started.callback(door.stop)
        running.frontdoors[name] = door
        say(f"front door on {name} {door.listen} (pid {door.pid})")
    balancer = GrpcBalancer([d.listen for d in running.frontdoors.values()], core.workdir / "balancer",
                            watch=hosts.watch_health, log=core.logs / "nginx.log").on_host(network[hosts.balancer])
    running.balancer = running._started.enter_context(balancer)
    core.settings = core.settings.updated(grpc_listen=balancer.target)
    running.using["load balancer"] = (f"nginx grpc_pass on {hosts.balancer} {balancer.target} over "
                                      f"{', '.join(running.frontdoors)}"
                                      f"{' (active gRPC health checks)' if hosts.watch_health else ''}")
    say(f"load balancer {balancer.target} -> {', '.join(d.listen for d in running.frontdoors.values())}")
