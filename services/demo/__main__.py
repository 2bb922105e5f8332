"""`python -m services.demo` (`make demo`): the real service on one machine, end to end.

On a fresh machine, with no server running, it
1. builds the demo index (the fictional Lumora help center, `demo/knowledge_base.jsonl`);
2. starts the local Triton serving the newest classifier version of the model repository; with no
   version published (a fresh clone) nothing is served and the front door routes with the rules,
   each decision flagged as a fallback (the demo install has no torch to export a model);
3. applies the migrations to SQLite and starts the tier worker pools (tier-a, tier-b, tier-c and
   shadow) as real `celery worker` processes on the server-less filesystem broker, each loading the
   embedded index and LLM;
4. starts the gRPC front door (`python -m services.frontdoor`) as a subprocess and creates an API key;
5. sends the example questions of every tier (`demo/questions.json`) through a real gRPC channel
   and prints, per query, tier, strategy, who routed it (model version or rules fallback), answer,
   sources and latency;
6. stops everything, also on Ctrl-C, SIGTERM and errors, and checks no process it started is left.

Whatever is configured is used instead of being started: `REDIS_URL` (broker + results),
`DATABASE_URL` (records), `OPENSEARCH_URL` (retriever; the demo index goes to `ARAG_OPENSEARCH_INDEX`,
default `arag-demo`), `TRITON_GRPC_URL`/`TRITON_URL` (classifier; its model repository is
`ARAG_MODEL_REPOSITORY`), `LLM_BASE_URL` (generator).

The in-process demo without any service (rules routing) remains `arag demo`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from adaptive_rag.routing.model_repository import open_version, versions
from adaptive_rag.settings import Settings
from infra.local.servers import free_port

from services.demo.stack import StackSettings

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo"
# Every process the demo starts carries this variable, so leftovers can be found and removed.
RUN_MARKER = "ARAG_DEMO_RUN"
TIER_NAME = {1: "A", 2: "B", 3: "C"}
console = Console(width=None if sys.stdout.isatty() else 160)


class Interrupted(Exception):
    """SIGTERM (or SIGHUP) received: unwind and stop everything, like Ctrl-C."""


@dataclass
class Plan:
    """What this run uses: configured servers, or what it starts itself."""

    settings: StackSettings
    start_triton: bool
    using: dict[str, str] = field(default_factory=dict)


def plan(workdir: Path) -> Plan:
    """Settings for this run: the environment's servers where set, embedded parts otherwise."""
    stack = StackSettings()
    library = stack.library
    overrides: dict[str, Any] = {
        "grpc_listen": f"127.0.0.1:{free_port()}",
        "metrics_port": stack.frontdoor.metrics_port if stack.configured("metrics_port") else free_port(),
    }
    using: dict[str, str] = {}
    if stack.configured("redis_url"):
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
        if not stack.configured("opensearch_index"):
            overrides["opensearch_index"] = "arag-demo"
        using["retriever"] = f"OpenSearch {library.opensearch_url} index {overrides.get('opensearch_index', library.opensearch_index)}"
    else:
        overrides["index_dir"] = (workdir / "index").resolve()
        using["retriever"] = f"embedded tantivy index {workdir / 'index'}"
    using["llm"] = (f"OpenAI-compatible endpoint {library.llm_base_url}" if library.llm_base_url
                    else "embedded llama.cpp (Gemma 3 270M)")
    # One process per pool unless configured: two shared cores, one LLM copy per process.
    if not stack.configured("concurrency"):
        overrides["concurrency"] = {"A": 1, "B": 1, "C": 1, "shadow": 1}
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
            "rules fallback; `arag retrain`, or `arag model bootstrap` with the train extras, "
            "publishes one)"
        )
    return Plan(stack.updated(**overrides), start_triton, using)


def build_demo_index(settings: Settings, knowledge_base: Path) -> int:
    from adaptive_rag.evaluation.corpus import read_jsonl_corpus
    from adaptive_rag.retrieval import build_index

    passages = list(read_jsonl_corpus(knowledge_base))
    build_index(settings, passages)
    return len(passages)


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


def load_questions(path: Path, per_tier: int | None) -> list[dict[str, Any]]:
    questions = json.loads(path.read_text(encoding="utf-8"))
    if per_tier is None:
        return questions
    kept: dict[str, int] = {}
    chosen = []
    for question in questions:
        tier = question.get("expected_tier", "?")
        if kept.get(tier, 0) < per_tier:
            kept[tier] = kept.get(tier, 0) + 1
            chosen.append(question)
    return chosen


def ask(stub: Any, auth: tuple, question: str, timeout_s: float) -> dict[str, Any]:
    """One Answer through gRPC; the reply (or the status) as a row."""
    import grpc

    from services.frontdoor.stubs import pb2

    started = time.perf_counter()
    try:
        reply = stub.Answer(pb2.AnswerRequest(query=question.encode()), metadata=auth, timeout=timeout_s)
    except grpc.RpcError as exc:
        return {"status": exc.code().name, "error": exc.details(),
                "latency_s": time.perf_counter() - started}
    info = reply.classifier
    return {
        "status": "OK", "request_id": reply.request_id, "tier": TIER_NAME.get(reply.tier, "?"),
        "strategy": reply.strategy, "steps": reply.steps, "answer": reply.answer,
        "sources": [{"id": s.id, "title": s.title, "score": s.score} for s in reply.sources],
        "routed_by": (f"rules fallback ({info.reason})" if info.fallback
                      else f"{info.model_name} v{info.model_version}"),
        "fallback": info.fallback, "model_version": info.model_version,
        "probabilities": dict(info.probabilities),
        "timings_ms": {"classify": reply.timings.classify_ms, "queue_wait": reply.timings.queue_wait_ms,
                       "strategy": reply.timings.strategy_ms, "total": reply.timings.total_ms},
        "latency_s": time.perf_counter() - started,
    }


def results_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="answers through gRPC (front door -> tier queue -> worker)", show_lines=True)
    for column, style in (("#", "dim"), ("question", ""), ("expected", "dim"), ("tier", "bold"),
                          ("strategy", ""), ("routed by", ""), ("answer", "green"),
                          ("sources", "cyan"), ("latency", "")):
        table.add_column(column, style=style or None, overflow="fold")
    for number, row in enumerate(rows, 1):
        if row["status"] != "OK":
            table.add_row(str(number), row["question"], row["expected"], "-", "-", "-",
                          f"[red]{row['status']}[/]: {row.get('error', '')}", "-",
                          f"{row['latency_s']:.1f} s")
            continue
        timings = row["timings_ms"]
        sources = "\n".join(f"{s['id']} {s['title']}" for s in row["sources"][:3]) or "-"
        answer = row["answer"] or "(empty)"
        table.add_row(
            str(number), row["question"], row["expected"], row["tier"],
            f"{row['strategy']} ({row['steps']} step{'s' if row['steps'] != 1 else ''})",
            row["routed_by"], answer if len(answer) <= 160 else answer[:157] + "...", sources,
            f"{row['latency_s']:.2f} s\n[dim]queue {timings['queue_wait']:.0f} ms\n"
            f"run {timings['strategy']:.0f} ms[/]",
        )
    return table


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    workdir: Path = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    marker = os.environ.get(RUN_MARKER) or uuid.uuid4().hex  # a caller may choose it (tests)
    os.environ[RUN_MARKER] = marker  # inherited by every child process
    p = plan(workdir)
    settings = p.settings
    leftovers: list[tuple[int, str]] = []
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        stack.callback(lambda: leftovers.extend(stop_leftovers(marker)))
        console.rule("[bold]Adaptive-RAG demo: the real service on this machine")
        for part, what in p.using.items():
            console.print(f"  {part:<10} {what}")
        if not settings.configured("redis_url"):
            shutil.rmtree(settings.workers.broker_dir, ignore_errors=True)  # messages of an earlier run

        with console.status("building the demo index"):
            count = build_demo_index(settings.library, args.knowledge_base)
        console.print(f"indexed {count} help-center passages from {args.knowledge_base.relative_to(REPO) if args.knowledge_base.is_relative_to(REPO) else args.knowledge_base}")

        if p.start_triton:
            from services.classifier.local import TritonProcess

            classifier = settings.classifier
            newest = open_version(classifier.model_repository, classifier.classifier_model)
            version, untrained = newest.version, newest.untrained
            with console.status(f"starting Triton (classifier version {version})"):
                triton = stack.enter_context(TritonProcess(classifier.model_repository, workdir / "triton.log"))
            settings = settings.updated(triton_grpc_url=triton.url)
            console.print(f"Triton serving {classifier.classifier_model} v{version} from "
                          f"{classifier.model_repository} on {triton.url} (pid {triton.proc.pid})")
            if untrained:
                console.print(
                    "[yellow]the classifier is the untrained bootstrap model: its routing is close to "
                    "random; the routing policy (C whenever P(C) >= its threshold) applies to its "
                    "probabilities, and the rules fallback decides whenever Triton does not answer. "
                    "Train one with `arag relabel` + `arag retrain` (or `arag classifier train|export`).[/]"
                )

        from workers.pools import WorkerPools

        pools = WorkerPools(settings.workers, pools=("A", "B", "C", "shadow"), library=settings.library,
                            log_dir=workdir / "logs" / "workers", extra_env={RUN_MARKER: marker})
        stack.callback(pools.stop)
        with console.status("applying migrations and starting the worker pools (each loads the LLM)"):
            pools.start()
        for name, pool in pools.pools.items():
            console.print(f"pool {name:<6} queue {pool.queue:<7} pid {pool.pid} concurrency "
                          f"{settings.workers.pool_concurrency(name)} prefetch {settings.workers.pool_prefetch(name)}")

        from services.demo.stack import FrontDoorProcess

        with console.status("starting the gRPC front door"):
            frontdoor = stack.enter_context(
                FrontDoorProcess(settings.env(**{RUN_MARKER: marker}), workdir / "logs" / "frontdoor.log",
                                 settings.frontdoor.grpc_listen)
            )
        console.print(f"front door on {settings.frontdoor.grpc_listen} (pid {frontdoor.pid}), metrics on "
                      f"http://127.0.0.1:{settings.frontdoor.metrics_port}/metrics")

        import grpc

        from adaptive_rag.storage import RecordStore, make_engine
        from services.frontdoor.stubs import pb2_grpc

        store = RecordStore(make_engine(settings.library.database_url))
        stack.callback(store.engine.dispose)
        key = store.create_api_key("demo")
        console.print(f"API key for tenant 'demo': {key[:12]}... (stored hashed)")
        channel = grpc.insecure_channel(settings.frontdoor.grpc_listen)
        stack.callback(channel.close)
        stub = pb2_grpc.AdaptiveRagStub(channel)
        auth = (("authorization", f"Bearer {key}"),)

        questions = load_questions(args.questions, args.per_tier)
        console.rule(f"{len(questions)} questions through gRPC")
        for question in questions:
            with console.status(f"[dim]{question['question']}"):
                row = ask(stub, auth, question["question"], args.timeout)
            row.update(question=question["question"], expected=question.get("expected_tier", "?"),
                       reference=question.get("answer"))
            rows.append(row)
            console.print(f"  {row.get('tier', '-')} {row['status']:<3} {row['latency_s']:6.2f} s  "
                          f"{question['question']}")
        console.print(results_table(rows))
        by_tier: dict[str, list[float]] = {}
        for row in rows:
            if row["status"] == "OK":
                by_tier.setdefault(row["tier"], []).append(row["latency_s"])
        console.print("per tier: " + ", ".join(
            f"{tier}: {len(v)} answered, median {sorted(v)[len(v) // 2]:.2f} s"
            for tier, v in sorted(by_tier.items())))
        console.rule("stopping")
    failed = [r for r in rows if r["status"] != "OK"]
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps({"rows": rows, "leftovers": leftovers}, indent=2))
    console.print(f"stopped the front door, the worker pools{' and Triton' if p.start_triton else ''}; "
                  + ("no process left" if not leftovers else
                     f"[red]{len(leftovers)} leftover process(es) killed: {leftovers}[/]"))
    console.print(f"{len(rows) - len(failed)}/{len(rows)} answered; demo took "
                  f"{time.perf_counter() - started:.1f} s")
    return 1 if failed or leftovers else 0


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


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_interrupted(signum: int, _frame: Any) -> None:
    """The first Ctrl-C / SIGTERM unwinds the run; further ones must not cut the cleanup short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=Path, default=DEMO / "questions.json")
    parser.add_argument("--knowledge-base", type=Path, default=DEMO / "knowledge_base.jsonl")
    parser.add_argument("--workdir", type=Path, default=Path("var/demo"),
                        help="index, SQLite database, broker folders and logs of the demo")
    parser.add_argument("--per-tier", type=int, default=None,
                        help="only the first N questions of each expected tier")
    parser.add_argument("--timeout", type=float, default=300.0, help="gRPC deadline per question (s)")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_interrupted)
    try:
        return run(args)
    except (KeyboardInterrupt, Interrupted) as exc:
        console.print(f"[yellow]interrupted ({type(exc).__name__} {exc}); everything it started is stopped[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
