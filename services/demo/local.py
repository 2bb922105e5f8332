"""The whole service on this machine as one context manager, `local_stack`: what `make demo`
(`python -m services.demo`) starts, and the core the lab's stack (`lab/harness/stack.py`: backing
servers, measurement devices, fault handles) is built on.

Embedded defaults unless the environment configures a server (`plan`): each tenant's knowledge
base (tantivy, or OpenSearch with `OPENSEARCH_URL`), filled through the KnowledgeBase gRPC API, the local Triton serving the newest published
classifier version (none published: the front door routes with the rules), SQLite (or
`DATABASE_URL`), the tier worker pools on the server-less filesystem broker (or `REDIS_URL`), the
gRPC front door as a subprocess. A caller may hand it the settings instead (`settings=`: what it
configures is used, the rest is planned as above). Everything it starts carries
`ARAG_DEMO_RUN=<marker>` in its environment; leaving the block stops it all (also on an error or Ctrl-C) and kills whatever is
still marked, recording it in `LocalStack.leftovers`.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from adaptive_rag.contracts import DEFAULT_SCOPES, Scope
from adaptive_rag.routing.model_repository import describe_version, open_version, versions
from infra.local.servers import free_port

from services.demo.stack import FrontDoorProcess, StackSettings

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo"
# Every process a local stack starts carries this variable, so leftovers can be found and removed.
RUN_MARKER = "ARAG_DEMO_RUN"
ALL_POOLS = ("A", "B", "C", "shadow")
# Where the reader runs when no LLM endpoint is configured: "server", one shared llama-server the
# pools call over HTTP (the model loaded once, its slots decoded together); "embedded", a copy of
# the model in every worker process (what `arag ask` does in one process).
LocalLLM = Literal["server", "embedded"]
# llama-server's parallel slots on 2 cores (reports/llm_serving/: 4 slots keep the throughput as
# clients grow) and the pools' processes that fill them (HTTP clients, not model copies).
LLM_SLOTS = 4
SERVER_CONCURRENCY = {"A": 2, "B": 2, "C": 2, "shadow": 1}


class Interrupted(Exception):
    """SIGTERM (or SIGHUP) received: unwind and stop everything, like Ctrl-C."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_interrupted(signum: int, _frame: Any) -> None:
    """The first Ctrl-C / SIGTERM unwinds the run; further ones must not cut the cleanup short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signal.Signals(signum).name)


def install_stop_signals() -> None:
    """Ctrl-C, SIGTERM and SIGHUP unwind the run (so `local_stack` stops everything); SIGHUP stays
    ignored when the process was started ignoring it (`nohup`). SIGINT is taken even when ignored:
    a shell starts background jobs ignoring it, and Ctrl-C sent to the run's group must still stop it."""
    for sig in STOP_SIGNALS:
        if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
            continue
        signal.signal(sig, _raise_interrupted)
    _relay_stop_signals_to_the_main_thread()


_stop_signal_wakeup: Any = None  # the relay's end of the wakeup fd, once installed


def _relay_stop_signals_to_the_main_thread() -> None:
    """The kernel may hand a process's signal to any of its threads (gRPC's, a pool supervisor's).
    Python then runs the handler in the main thread only when that thread next runs Python code:
    a main thread blocked in a long wait (a sleep, a child's exit) would not unwind until it ends.
    Python writes every caught signal's number to the wakeup fd; a daemon thread reading it sends
    each stop signal once more to the main thread itself, which interrupts the wait. A wakeup fd
    set before (an event loop's) is left alone, and one set later replaces the relay: either way
    the behaviour is the one before it."""
    import socket
    import threading

    global _stop_signal_wakeup
    if threading.current_thread() is not threading.main_thread():
        return
    if _stop_signal_wakeup is not None:  # relaying already
        return
    receiving, sending = socket.socketpair()
    sending.setblocking(False)  # Python's C handler must never block on it
    theirs = signal.set_wakeup_fd(sending.fileno(), warn_on_full_buffer=False)
    if theirs != -1:  # a wakeup fd someone else relies on (an event loop's): it stays theirs
        signal.set_wakeup_fd(theirs)
        receiving.close()
        sending.close()
        return
    _stop_signal_wakeup = sending  # kept open for the life of the process
    main = threading.main_thread().ident

    def relay() -> None:
        relayed: set[int] = set()
        while received := receiving.recv(64):
            for number in received:
                if number in STOP_SIGNALS and number not in relayed and signal.getsignal(number) is _raise_interrupted:
                    relayed.add(number)  # once: the main thread's own delivery writes here again
                    signal.pthread_kill(main, number)

    threading.Thread(target=relay, name="stop-signal-relay", daemon=True).start()


@dataclass
class Plan:
    """What this run uses: configured servers, or what it starts itself."""

    settings: StackSettings
    start_triton: bool
    using: dict[str, str] = field(default_factory=dict)
    start_llm_server: bool = False


def plan(workdir: Path, base: StackSettings | None = None, llm: LocalLLM = "server") -> Plan:
    """Settings for this run: the servers `base` configures (default: the environment's), local
    parts otherwise (`llm`: where the reader runs when no endpoint is configured)."""
    stack = base or StackSettings()
    library = stack.library
    overrides: dict[str, Any] = {
        "grpc_listen": f"127.0.0.1:{free_port()}",
        "metrics_port": stack.frontdoor.metrics_port if stack.configured("metrics_port") else free_port(),
    }
    using: dict[str, str] = {}
    if stack.workers.redis_url:
        using["broker"] = f"Redis {stack.workers.redis_url}"
    else:
        overrides["broker_dir"] = workdir / "broker"
        using["broker"] = f"filesystem broker {workdir / 'broker'} (no server)"
    if stack.configured("database_url"):
        using["records"] = library.database_url
    else:
        overrides["database_url"] = f"sqlite:///{(workdir / 'arag.db').resolve()}"
        using["records"] = f"SQLite {workdir / 'arag.db'}"
    if stack.configured("opensearch_url") and not stack.configured("retriever"):
        overrides["retriever"] = "opensearch"
    if (overrides.get("retriever") or library.retriever) == "opensearch":
        if not stack.configured("kb_index_prefix"):
            overrides["kb_index_prefix"] = "arag-demo"
        prefix = overrides.get("kb_index_prefix", library.kb_index_prefix)
        using["retriever"] = f"OpenSearch {library.opensearch_url}, one index per tenant behind the aliases {prefix}-<tenant>"
    else:
        overrides["kb_dir"] = (workdir / "kb").resolve()
        using["retriever"] = f"embedded tantivy, one index per tenant under {workdir / 'kb'}"
    start_llm_server = not library.llm_base_url and llm == "server"
    if library.llm_base_url:
        using["llm"] = f"OpenAI-compatible endpoint {library.llm_base_url}"
    elif start_llm_server:
        using["llm"] = f"one shared llama-server (started here), reader {library.reader}, {LLM_SLOTS} slots"
    else:
        using["llm"] = f"embedded llama.cpp in every worker process, reader {library.reader}"
    if not stack.configured("concurrency"):
        # a model copy per process on two shared cores: one process per pool; with the shared
        # server the processes are HTTP clients, enough of them to fill its slots
        overrides["concurrency"] = (dict(SERVER_CONCURRENCY) if start_llm_server or library.llm_base_url
                                    else {"A": 1, "B": 1, "C": 1, "shadow": 1})
    repository = stack.classifier.model_repository.resolve()
    if not stack.configured("model_repository"):
        overrides["model_repository"] = repository
    published = versions(repository / stack.classifier.classifier_model)
    start_triton = not stack.configured("triton_grpc_url") and bool(published)
    if stack.configured("triton_grpc_url"):
        using["classifier"] = f"Triton {stack.classifier.triton_grpc_url}"
    elif published:
        using["classifier"] = f"local Triton (started here), model versions {published}"
    else:
        using["classifier"] = (
            f"the rules (no classifier version in {repository}: every decision is the flagged "
            "rules fallback; `arag model ship` publishes the router the repository ships)"
        )
    return Plan(stack.updated(**overrides), start_triton, using, start_llm_server)


def processes_with_marker(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries `marker`."""
    needle = f"{RUN_MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append((int(entry.name), cmdline.strip()))
        except OSError:
            continue
    return found


def stop_leftovers(marker: str, wait_s: float = 5.0) -> list[tuple[int, str]]:
    """Kill anything this run started that is still alive (after the orderly stops); returns it."""
    deadline = time.monotonic() + wait_s
    found = processes_with_marker(marker)
    while found and time.monotonic() < deadline:  # exiting children may take a moment
        time.sleep(0.2)
        found = processes_with_marker(marker)
    for pid, _ in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found


class _Quiet:
    """A console stand-in that prints nothing (for callers without one)."""

    def print(self, *_: Any, **__: Any) -> None:
        pass

    @contextmanager
    def status(self, *_: Any, **__: Any) -> Iterator[None]:
        yield


@dataclass
class LocalStack:
    """A running local stack (inside `local_stack`)."""

    plan: Plan
    settings: StackSettings
    marker: str
    workdir: Path
    # What every process the stack starts gets in its environment besides its settings: the run
    # marker, where traces go, and the caller's `extra_env`.
    child_env: dict[str, str] = field(default_factory=dict)
    pools: Any = None  # workers.pools.WorkerPools
    frontdoor: FrontDoorProcess | None = None
    triton: Any = None  # services.classifier.local.TritonProcess, when started here
    llm_server: Any = None  # infra.local.llama_server.LlamaServerProcess, when started here
    store: Any = None  # adaptive_rag.storage.RecordStore
    # Processes still marked after the orderly stop (killed then); filled when the block exits.
    leftovers: list[tuple[int, str]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.settings.frontdoor.grpc_listen

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.frontdoor.metrics_port}/metrics"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def create_api_key(self, tenant: str, scopes: frozenset[Scope] = DEFAULT_SCOPES) -> str:
        return self.store.create_api_key(tenant, scopes)

    def start_frontdoor(self, log_path: Path, settings: StackSettings | None = None,
                        wrap: Callable[[list[str]], list[str]] | None = None, **env: str) -> FrontDoorProcess:
        """A front door (`python -m services.frontdoor`) on `settings` (default: the stack's),
        marked as this run's, run through `wrap` (another host: `infra.local.hosts.Host.wrap`);
        the caller stops it."""
        settings = settings or self.settings
        return FrontDoorProcess(settings.env(**self.child_env, **env), log_path, settings.frontdoor.grpc_listen,
                                wrap=wrap)

    def start_triton(self, log_path: Path, repository: Path | None = None,
                     grpc_port: int | None = None) -> Any:
        """The local Triton serving `repository` (default: the stack's model repository), on
        `grpc_port` when given (where clients already point); the caller stops it."""
        from services.classifier.local import TritonProcess

        return TritonProcess(repository or self.settings.classifier.model_repository, log_path,
                             grpc_port=grpc_port, extra_env=self.child_env)

    def import_knowledge(self, tenant: str, path: Path) -> Any:
        """Import the documents of `path` into `tenant`'s knowledge base the way a client does:
        a `kb:write` key and the KnowledgeBase gRPC service. Returns its ChangeReply."""
        import grpc

        from adaptive_rag.knowledge.importers import import_path
        from services.frontdoor.knowledge import upload_documents

        key = self.create_api_key(tenant, frozenset({Scope.KB_WRITE}))
        with grpc.insecure_channel(self.address) as channel:
            return upload_documents(channel, key, import_path(path))


def traces_env(folder: Path) -> dict[str, str]:
    """Every started process writes its spans under `folder` (`python -m infra.local.trace_tree
    <folder> --last`), unless the environment already chose (`ARAG_TRACES=off`, or `otlp` with a
    collector). Costs about 0.7 ms of CPU per request (`reports/tracing/overhead.md`)."""
    if "ARAG_TRACES" in os.environ:
        return {}
    return {"ARAG_TRACES": "file", "ARAG_TRACES_DIR": os.environ.get("ARAG_TRACES_DIR") or str(folder)}


@contextmanager
def local_stack(
    workdir: Path,
    *,
    settings: StackSettings | None = None,
    knowledge_base: Path = DEMO / "knowledge_base.jsonl",
    tenants: Iterable[str] = ("demo",),
    pools: Iterable[str] = ALL_POOLS,
    frontdoor: bool = True,
    extra_env: Mapping[str, str] | None = None,
    console: Any = None,
    marker: str | None = None,
    llm: LocalLLM = "server",
    llm_slots: int = LLM_SLOTS,
    llm_threads: int | None = None,
) -> Iterator[LocalStack]:
    """Start the stack `plan(workdir, settings, llm)` describes (printing each step on `console`, a
    rich Console): the shared llama-server (`llm_slots` slots, `llm_threads` threads: default all
    cores) unless an LLM endpoint is configured or `llm` is "embedded", Triton when a classifier
    version is published, the worker `pools`, the front door (unless `frontdoor` is False);
    import `knowledge_base` into each of `tenants` through the KnowledgeBase API; yield it, then
    stop everything it started and any marked leftover. `extra_env` goes to every process it
    starts, on top of the settings."""
    console = console or _Quiet()
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    marker = marker or os.environ.get(RUN_MARKER) or uuid.uuid4().hex  # a caller may choose it (tests)
    p = plan(workdir, settings, llm)
    settings = p.settings
    child_env = {**traces_env(workdir / "traces"), **(extra_env or {}), RUN_MARKER: marker}
    running = LocalStack(plan=p, settings=settings, marker=marker, workdir=workdir, child_env=child_env)
    with ExitStack() as stack:
        stack.callback(lambda: running.leftovers.extend(stop_leftovers(marker)))
        for part, what in p.using.items():
            console.print(f"  {part:<10} {what}")
        if not settings.workers.redis_url:
            shutil.rmtree(settings.workers.broker_dir, ignore_errors=True)  # messages of an earlier run

        if p.start_llm_server:
            from adaptive_rag.llm import embedded_model_path
            from infra.local.llama_server import LlamaServerProcess

            model = embedded_model_path(settings.library)
            with console.status(f"starting llama-server ({model.name}, {llm_slots} slots; builds once if missing)"):
                server = stack.enter_context(LlamaServerProcess(
                    model, parallel=llm_slots, threads=llm_threads or os.cpu_count() or 2,
                    log_path=running.logs / "llama_server.log", extra_env=child_env))
            running.llm_server = server
            # The project's prompts are few-shot completions: the completions API keeps the
            # embedded model's answers (a chat template would wrap them).
            settings = running.settings = settings.updated(llm_base_url=server.base_url, llm_api="completions")
            console.print(f"llama-server on {server.base_url} (pid {server.process.pid}), {llm_slots} slots")

        if p.start_triton:
            classifier = settings.classifier
            newest = open_version(classifier.model_repository, classifier.classifier_model)
            version, untrained = newest.version, newest.untrained
            with console.status(f"starting Triton (classifier version {version})"):
                triton = stack.enter_context(running.start_triton(workdir / "triton.log"))
            running.triton = triton
            settings = running.settings = settings.updated(triton_grpc_url=triton.url)
            console.print(f"Triton serving {classifier.classifier_model} v{version} from "
                          f"{classifier.model_repository} on {triton.url} (pid {triton.proc.pid})")
            console.print(f"router: {describe_version(newest)}")
            if untrained:
                console.print(
                    "[yellow]the classifier is the untrained bootstrap model: its routing is close to "
                    "random; the routing policy (C whenever P(C) >= its threshold) applies to its "
                    "probabilities, and the rules fallback decides whenever Triton does not answer. "
                    "Train one with `arag relabel` + `arag retrain` (or `arag classifier train|export`).[/]"
                )

        from workers.pools import WorkerPools

        worker_pools = WorkerPools(settings.workers, pools=tuple(pools), library=settings.library,
                                   log_dir=running.logs / "workers", extra_env=child_env)
        stack.callback(worker_pools.stop)
        running.pools = worker_pools
        with console.status("applying migrations and starting the worker pools (each loads the LLM)"):
            worker_pools.start()
        for name, pool in worker_pools.pools.items():
            console.print(f"pool {name:<6} queue {pool.queue:<7} pid {pool.pid} concurrency "
                          f"{settings.workers.pool_concurrency(name)} prefetch {settings.workers.pool_prefetch(name)}")

        if frontdoor:
            with console.status("starting the gRPC front door"):
                running.frontdoor = running.start_frontdoor(running.logs / "frontdoor.log")
            # the one running now (a caller may replace it: a restart after a fault)
            stack.callback(lambda: running.frontdoor.stop())
            console.print(f"front door on {settings.frontdoor.grpc_listen} (pid {running.frontdoor.pid}), "
                          f"metrics on {running.metrics_url}")

        from adaptive_rag.storage import RecordStore, make_engine

        running.store = RecordStore(make_engine(settings.library.database_url))
        stack.callback(running.store.engine.dispose)
        shown = knowledge_base.relative_to(REPO) if knowledge_base.is_relative_to(REPO) else knowledge_base
        for tenant in tenants:
            with console.status(f"importing {shown} into tenant {tenant!r} through the KnowledgeBase API"):
                reply = running.import_knowledge(tenant, knowledge_base)
            console.print(f"tenant {tenant!r}: {reply.added + reply.updated + reply.unchanged} help-centre "
                          f"documents from {shown} ({reply.chunks_written} chunks written, "
                          f"{reply.unchanged} unchanged)")
        yield running
