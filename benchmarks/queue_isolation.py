"""Queue isolation: does a backlog of slow C tasks delay tier A?

Everything real: redis-server (broker + result backend) and PostgreSQL (records) started on
loopback by `infra.local.servers`, the real Triton (`services/classifier/serve.py`), real `celery
worker` pools with the embedded Gemma model and the tantivy index of the demo help center, and
the front door (`python -m services.frontdoor`) reached through a real gRPC channel.

Two configurations, measured in the same run:
- `separate`: one queue and one pool per tier (tier-a, tier-b, tier-c), as served;
- `shared`: every tier on ONE queue (`ARAG_SHARED_QUEUE`) served by one pool with the same total
  concurrency (A + B + C).
Each runs two phases at the same steady request rate through gRPC:
- `steady`: no backlog;
- `backlog`: first `--backlog` real C tasks enqueued directly through `workers.dispatch` (they do
  not all finish in the window: that is the point).
Between phases queues are purged, unfinished tasks revoked, and the pools left to go idle.

Per tier it reports the queue wait (enqueue to task start: the task's `queue_wait_ms`) p50/p95 and
the front door's overhead at p50/p95: `total - strategy` (as the issue defines it, so queue wait
included) and `total - strategy - queue wait` (its own work: auth, classify, records, enqueue,
result delivery). A request whose task had not started when the phase ended is *censored*: its
queue wait is at least (phase end - receipt); percentiles over censored values are lower bounds
(printed with >=). The headline is the ratio shared / separate of tier A's queue wait.

Routing is deterministic so each tier gets the share of traffic asked for: the classifier served
by Triton is a small ONNX graph that routes by token count (A up to 8 tokens, B 10-19, C from 21,
MiniLM tokenizer); the queries are the demo questions (plus short greetings for A) bucketed by
that rule. A trained classifier's routing of any given question changes with every retraining;
this benchmark is about queues.

    nice -n 10 .venv/bin/python -m benchmarks.queue_isolation --out reports/queue_isolation
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import shutil
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from adaptive_rag.contracts import SHARED_QUEUE, AnswerTask, RequestStatus, RoutingDecision, Tier
from adaptive_rag.knowledge.importers import import_path
from adaptive_rag.knowledge.service import open_knowledge_service
from adaptive_rag.storage import RecordStore, make_engine, upgrade_database
from adaptive_rag.strategies import strategy_for_tier
from infra.local.servers import free_port, local_postgres, local_redis
from services.classifier.local import TritonProcess
from tests.support.models import minilm_tokenizer_path, publish_length_router
from services.demo.stack import FrontDoorProcess, StackSettings
from services.frontdoor.stubs import pb2, pb2_grpc
from workers.celery_app import QUEUES, create_app
from workers.client import CeleryTaskQueue
from workers.pools import WorkerPools

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "demo"
TIERS = tuple(t.value for t in Tier)
TIER_NAME = {pb2.TIER_A: "A", pb2.TIER_B: "B", pb2.TIER_C: "C"}
# Short chit-chat and general questions: the demo has few A questions of 8 tokens or less.
EXTRA_A_QUERIES = ("hi there!", "hello!", "thanks a lot!", "good morning!", "capital of France?",
                   "What is H2O?", "who wrote Hamlet?", "bye!")
BACKLOG_TENANT = "backlog"
console = Console(width=None if sys.stdout.isatty() else 160)


# --- the classifier Triton serves ----------------------------------------------------------------

def length_router_repository(root: Path) -> Path:
    """A model repository whose version 1 is the length router (with the MiniLM tokenizer)."""
    publish_length_router(root, 1)
    return root


def queries_by_tier() -> dict[str, list[str]]:
    """Demo questions and short greetings, bucketed by the tier the length router gives them."""
    from adaptive_rag.routing.classifier_client import QueryTokenizer

    tokenize = QueryTokenizer(minilm_tokenizer_path(), 64)
    texts = [q["question"] for q in json.loads((DEMO / "questions.json").read_text())]
    texts = list(dict.fromkeys([*texts, *EXTRA_A_QUERIES]))
    buckets: dict[str, list[str]] = {tier: [] for tier in TIERS}
    for text in texts:
        n = int(tokenize([text])[1].sum())
        if n <= 8:
            buckets["A"].append(text)
        elif 10 <= n <= 19:
            buckets["B"].append(text)
        elif n >= 21:
            buckets["C"].append(text)
    empty = [tier for tier, texts in buckets.items() if not texts]
    if empty:
        raise RuntimeError(f"no query for tier(s) {empty}")
    return buckets


# --- one request's outcome -----------------------------------------------------------------------

@dataclass
class Sample:
    """One query sent through gRPC and what became of it."""

    planned_tier: str
    client_request_id: str
    sent_at: float  # wall clock
    status: str = "OK"  # gRPC status name
    tier: str | None = None  # the routed tier (reply, or the recorded decision)
    queue_wait_ms: float | None = None
    censored: bool = False  # the task had not started when the phase ended
    strategy_ms: float | None = None
    total_ms: float | None = None
    classify_ms: float | None = None

    @property
    def answered(self) -> bool:
        return self.status == "OK" and self.total_ms is not None


def pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return float(values[0])
    return float(statistics.quantiles(values, n=100, method="inclusive")[q - 1])


def summarize(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """Per routed tier: counts, queue wait p50/p95 (censored ones as lower bounds), overheads."""
    out: dict[str, dict[str, Any]] = {}
    for tier in TIERS:
        mine = [s for s in samples if s.tier == tier]
        waits = [s.queue_wait_ms for s in mine if s.queue_wait_ms is not None]
        censored = sorted(s.queue_wait_ms for s in mine if s.censored and s.queue_wait_ms is not None)
        answered = [s for s in mine if s.answered]
        over = [s.total_ms - s.strategy_ms for s in answered]
        own = [s.total_ms - s.strategy_ms - s.queue_wait_ms for s in answered]
        row: dict[str, Any] = {
            "sent": len(mine), "answered": len(answered), "censored": len(censored),
            "errors": {code: sum(1 for s in mine if s.status == code)
                       for code in sorted({s.status for s in mine} - {"OK"})},
        }
        for q in (50, 95):
            value = pct(waits, q)
            row[f"queue_wait_p{q}_ms"] = value
            # With censored values substituted, a percentile is a lower bound once it reaches them.
            row[f"queue_wait_p{q}_lower_bound"] = bool(censored and value is not None
                                                       and censored[0] <= value)
            row[f"total_minus_strategy_p{q}_ms"] = pct(over, q)
            row[f"own_overhead_p{q}_ms"] = pct(own, q)
        out[tier] = row
    return out


# --- the running stack of one configuration ------------------------------------------------------

@dataclass
class Stack:
    mode: str
    settings: StackSettings
    store: RecordStore
    pools: WorkerPools
    frontdoor: FrontDoorProcess
    stub: pb2_grpc.AdaptiveRagStub
    auth: tuple[tuple[str, str], ...]
    tenant: str
    queue: CeleryTaskQueue = field(repr=False, default=None)

    @property
    def queues(self) -> list[str]:
        return [*QUEUES, SHARED_QUEUE] if self.settings.workers.shared_queue else list(QUEUES)


@contextmanager
def running_stack(mode: str, base: StackSettings, workdir: Path) -> Iterator[Stack]:
    settings = base.updated(shared_queue=mode == "shared", grpc_listen=f"127.0.0.1:{free_port()}",
                            metrics_port=free_port())
    pools_wanted = ("shared",) if mode == "shared" else TIERS
    store = RecordStore(make_engine(settings.library.database_url))
    with ExitStack() as stack:
        pools = WorkerPools(settings.workers, pools=pools_wanted, library=settings.library,
                            log_dir=workdir / mode / "workers")
        stack.callback(pools.stop)
        pools.start()
        listen = settings.frontdoor.grpc_listen
        frontdoor = stack.enter_context(
            FrontDoorProcess(settings.env(), workdir / mode / "frontdoor.log", listen)
        )
        channel = grpc.insecure_channel(listen)
        stack.callback(channel.close)
        tenant = f"bench-{mode}"
        key = store.create_api_key(tenant)
        knowledge = open_knowledge_service(settings.library, store.engine)
        for owner in (tenant, BACKLOG_TENANT):
            knowledge.upsert(owner, import_path(DEMO / "knowledge_base.jsonl"))
        yield Stack(mode, settings, store, pools, frontdoor, pb2_grpc.AdaptiveRagStub(channel),
                    (("authorization", f"Bearer {key}"),), tenant,
                    CeleryTaskQueue(create_app(settings.workers)))


def send(stack: Stack, query: str, planned: str, cutoff: float) -> Sample:
    """One Answer within the phase's cutoff (monotonic); the reply fills the sample."""
    cid = uuid.uuid4().hex
    sample = Sample(planned, cid, time.time())
    timeout = max(0.5, cutoff - time.monotonic())
    try:
        reply = stack.stub.Answer(pb2.AnswerRequest(query=query.encode(), client_request_id=cid),
                                  metadata=stack.auth, timeout=timeout)
    except grpc.RpcError as exc:
        sample.status = exc.code().name
        return sample
    sample.tier = TIER_NAME.get(reply.tier)
    sample.queue_wait_ms = reply.timings.queue_wait_ms
    sample.strategy_ms = reply.timings.strategy_ms
    sample.total_ms = reply.timings.total_ms
    sample.classify_ms = reply.timings.classify_ms
    return sample


def complete_from_records(stack: Stack, samples: list[Sample], phase_end_wall: float) -> None:
    """Fill in tier and queue wait of requests that got no reply, from the records.

    A result row gives the measured queue wait; a request the worker had started gives
    (start - receipt); one still queued is censored at (phase end - receipt).
    """
    for sample in samples:
        if sample.answered:
            continue
        request = stack.store.find_request(stack.tenant, sample.client_request_id)
        if request is None:  # rejected before it was recorded
            continue
        decision = stack.store.decision_for(request.request_id)
        sample.tier = decision.tier.value if decision else None
        result = stack.store.get_result(request.request_id)
        if result is not None:
            sample.queue_wait_ms = result.timings.queue_wait_ms
        elif request.status is RequestStatus.RUNNING:
            sample.queue_wait_ms = 1000 * (request.updated_at.timestamp() - request.created_at.timestamp())
        elif request.status is RequestStatus.QUEUED:
            sample.queue_wait_ms = 1000 * (phase_end_wall - request.created_at.timestamp())
            sample.censored = True


def run_load(
    stack: Stack, queries: dict[str, list[str]], mix: dict[str, float], rate: float,
    duration_s: float, drain_s: float, rng: random.Random,
) -> list[Sample]:
    """Send `rate` queries/s for `duration_s`, each allowed to wait until the phase ends."""
    start = time.monotonic()
    cutoff = start + duration_s + drain_s
    count = int(duration_s * rate)
    tiers, weights = zip(*mix.items())
    futures = []
    pool = ThreadPoolExecutor(max_workers=min(512, count + 1), thread_name_prefix="load")
    try:
        for i in range(count):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            tier = rng.choices(tiers, weights)[0]
            futures.append(pool.submit(send, stack, rng.choice(queries[tier]), tier, cutoff))
        return [f.result() for f in futures]
    finally:  # interrupted: calls still in flight end when the stack closes the channel
        pool.shutdown(wait=False, cancel_futures=True)


def enqueue_backlog(stack: Stack, queries: list[str], n: int) -> list[str]:
    """`n` real C tasks sent straight to the queue (recorded first, as the front door would)."""
    strategy = strategy_for_tier(Tier.C, stack.settings.library)
    ids = []
    for i in range(n):
        request_id = uuid.uuid4().hex
        query = queries[i % len(queries)]
        stack.store.create_request(request_id, BACKLOG_TENANT, None, query)
        stack.store.record_decision(request_id, RoutingDecision(
            tier=Tier.C, fallback=True, reason="queue benchmark backlog", strategy=strategy))
        stack.queue.enqueue(AnswerTask(request_id=request_id, tenant=BACKLOG_TENANT, query=query, tier=Tier.C,
                                       strategy=strategy, enqueued_at=time.time()))
        ids.append(request_id)
    return ids


def depths(stack: Stack) -> dict[str, int]:
    return {q: stack.queue.depth(q) for q in stack.queues}


def reset(stack: Stack, request_ids: list[str], idle_timeout_s: float) -> dict[str, Any]:
    """Purge every queue, revoke what was sent and not finished, wait until no task runs."""
    with stack.app.connection_for_write() as connection:
        channel = connection.default_channel
        purged = {q: int(channel.queue_purge(q) or 0) for q in stack.queues}
    pending = [rid for rid in request_ids if stack.store.get_result(rid) is None]
    if pending:
        stack.app.control.revoke(pending)
    deadline = time.monotonic() + idle_timeout_s
    running = -1
    while time.monotonic() < deadline:
        running = sum(1 for rid in pending
                      if (r := stack.store.get_request(rid)) is not None and r.status is RequestStatus.RUNNING)
        if running == 0:
            break
        time.sleep(1.0)
    return {"purged": purged, "revoked": len(pending), "still_running": running}


def warm_up(stack: Stack, queries: dict[str, list[str]], timeout_s: float) -> float:
    """One query per pool process and tier, answered, so model loading is not measured."""
    started = time.monotonic()
    cutoff = started + timeout_s
    n = {tier: stack.settings.workers.pool_concurrency(tier) for tier in TIERS}
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(send, stack, queries[tier][i % len(queries[tier])], tier, cutoff)
                   for tier in TIERS for i in range(n[tier])]
        bad = [f.result().status for f in futures if not f.result().answered]
    if bad:
        raise RuntimeError(f"warm-up queries failed: {bad}")
    return time.monotonic() - started


def run_phase(
    stack: Stack, name: str, args: argparse.Namespace, queries: dict[str, list[str]],
    mix: dict[str, float], rng: random.Random,
) -> dict[str, Any]:
    backlog_ids: list[str] = []
    if name == "backlog":
        backlog_ids = enqueue_backlog(stack, queries["C"], args.backlog)
    load_before = os.getloadavg()
    depth_before = depths(stack)
    console.print(f"[bold]{stack.mode} / {name}[/]: {args.rate} q/s for {args.duration:.0f} s "
                  f"(+{args.drain:.0f} s to finish), queues {depth_before}")
    samples = run_load(stack, queries, mix, args.rate, args.duration, args.drain, rng)
    phase_end = time.time()
    depth_after = depths(stack)
    complete_from_records(stack, samples, phase_end)
    sent_ids = [r.request_id for s in samples
                if (r := stack.store.find_request(stack.tenant, s.client_request_id)) is not None]
    backlog_done = sum(1 for rid in backlog_ids if stack.store.get_result(rid) is not None)
    cleanup = reset(stack, backlog_ids + sent_ids, args.idle_timeout)
    return {
        "mode": stack.mode, "phase": name, "backlog": len(backlog_ids),
        "backlog_finished_in_phase": backlog_done,
        "load_average_start": load_before, "load_average_end": os.getloadavg(),
        "queue_depth_start": depth_before, "queue_depth_end": depth_after, "reset": cleanup,
        "tiers": summarize(samples), "samples": [asdict(s) for s in samples],
    }


# --- report --------------------------------------------------------------------------------------

def fmt(value: float | None, lower: bool = False) -> str:
    if value is None:
        return "-"
    return f"{'>=' if lower else ''}{value:,.0f}"


def ratios(phases: list[dict[str, Any]], tier: str = "A") -> dict[str, dict[str, float | None]]:
    """shared / separate of `tier`'s queue wait p50 and p95, per phase."""
    by = {(p["mode"], p["phase"]): p["tiers"][tier] for p in phases}
    out: dict[str, dict[str, float | None]] = {}
    for phase in ("steady", "backlog"):
        sep, shared = by.get(("separate", phase)), by.get(("shared", phase))
        if not sep or not shared:
            continue
        row: dict[str, float | None] = {}
        for q in (50, 95):
            a, b = sep[f"queue_wait_p{q}_ms"], shared[f"queue_wait_p{q}_ms"]
            # A near-zero wait makes the ratio explode; floor the denominator at 1 ms.
            row[f"p{q}"] = None if a is None or b is None else b / max(a, 1.0)
            row[f"p{q}_lower_bound"] = bool(shared[f"queue_wait_p{q}_lower_bound"])
        out[phase] = row
    return out


def table(phases: list[dict[str, Any]]) -> Table:
    t = Table(title="queue wait and front-door overhead per tier (ms)")
    for col in ("queues", "phase", "tier", "sent", "answered", "censored", "wait p50", "wait p95",
                "total-strategy p50", "total-strategy p95", "own p50", "own p95"):
        t.add_column(col, justify="right" if col not in ("queues", "phase") else "left")
    for p in phases:
        for tier, r in p["tiers"].items():
            t.add_row(p["mode"], p["phase"], tier, str(r["sent"]), str(r["answered"]),
                      str(r["censored"]),
                      fmt(r["queue_wait_p50_ms"], r["queue_wait_p50_lower_bound"]),
                      fmt(r["queue_wait_p95_ms"], r["queue_wait_p95_lower_bound"]),
                      fmt(r["total_minus_strategy_p50_ms"]), fmt(r["total_minus_strategy_p95_ms"]),
                      fmt(r["own_overhead_p50_ms"]), fmt(r["own_overhead_p95_ms"]))
    return t


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Queue isolation: tier A's queue wait while C backs up",
        "",
        f"Command: `{report['command']}`  ",
        f"Run: {report['started']} on {report['machine']['cpus']} CPU cores "
        f"({report['machine']['platform']}), load average at start "
        f"{', '.join(f'{x:.2f}' for x in report['load_average_start'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in report['load_average_end'])} (other jobs share the machine).",
        "",
        f"Steady load: {report['config']['rate']} queries/s through gRPC for "
        f"{report['config']['duration_s']:.0f} s per phase (+{report['config']['drain_s']:.0f} s "
        f"for answers to arrive), tier mix {report['config']['mix']}; backlog phase: "
        f"{report['config']['backlog']} real C tasks enqueued first through `workers.client`. "
        f"Pools: separate = A {report['config']['concurrency']['A']}, B "
        f"{report['config']['concurrency']['B']}, C {report['config']['concurrency']['C']} "
        f"processes on tier-a/b/c; shared = one pool of {report['config']['concurrency']['shared']} "
        "processes on one queue (`ARAG_SHARED_QUEUE=true`). Real Redis, PostgreSQL, Triton, "
        "Celery workers (Gemma 3 270M, tantivy demo index) and front door.",
        "",
        "Queue wait = enqueue to task start (`queue_wait_ms`). `total-strategy` = the front door's "
        "reply time minus strategy time (queue wait included); `own` = total - strategy - queue "
        "wait (auth, classify, records, enqueue, result delivery). `>=`: censored, some requests "
        "never started before the phase ended and count with their wait so far (a lower bound).",
        "",
        "| queues | phase | tier | sent | answered | censored | wait p50 | wait p95 | total-strategy p50 | total-strategy p95 | own p50 | own p95 |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in report["phases"]:
        for tier, r in p["tiers"].items():
            lines.append(
                f"| {p['mode']} | {p['phase']} | {tier} | {r['sent']} | {r['answered']} | "
                f"{r['censored']} | {fmt(r['queue_wait_p50_ms'], r['queue_wait_p50_lower_bound'])} | "
                f"{fmt(r['queue_wait_p95_ms'], r['queue_wait_p95_lower_bound'])} | "
                f"{fmt(r['total_minus_strategy_p50_ms'])} | {fmt(r['total_minus_strategy_p95_ms'])} | "
                f"{fmt(r['own_overhead_p50_ms'])} | {fmt(r['own_overhead_p95_ms'])} |"
            )
    lines += ["", "Tier A queue wait, shared queue / separate queues (same run; separate floored "
              "at 1 ms):", ""]
    for phase, r in report["ratio_a_shared_over_separate"].items():
        lines.append(
            f"- {phase}: p50 {'>=' if r['p50_lower_bound'] else ''}{_ratio(r['p50'])}, "
            f"p95 {'>=' if r['p95_lower_bound'] else ''}{_ratio(r['p95'])}"
        )
    lines.append("")
    by = {(p["mode"], p["phase"]): p["tiers"]["A"] for p in report["phases"]}
    for mode in ("separate", "shared"):
        steady, backlog = by.get((mode, "steady")), by.get((mode, "backlog"))
        if steady and backlog and steady["queue_wait_p50_ms"] is not None:
            lines.append(
                f"- {'separate queues' if mode == 'separate' else 'one shared queue'}, tier A "
                "without -> with the C backlog: p50 "
                f"{fmt(steady['queue_wait_p50_ms'], steady['queue_wait_p50_lower_bound'])} -> "
                f"{fmt(backlog['queue_wait_p50_ms'], backlog['queue_wait_p50_lower_bound'])} ms, p95 "
                f"{fmt(steady['queue_wait_p95_ms'], steady['queue_wait_p95_lower_bound'])} -> "
                f"{fmt(backlog['queue_wait_p95_ms'], backlog['queue_wait_p95_lower_bound'])} ms"
            )
    lines += ["", "Queue depth at the start and end of each phase, and load average:", ""]
    for p in report["phases"]:
        lines.append(
            f"- {p['mode']} / {p['phase']}: start {p['queue_depth_start']}, end "
            f"{p['queue_depth_end']}; backlog tasks finished in the phase "
            f"{p['backlog_finished_in_phase']}/{p['backlog']}; load "
            f"{p['load_average_start'][0]:.2f} -> {p['load_average_end'][0]:.2f}"
        )
    lines += ["", "Routing: a length-based ONNX graph served by Triton (A <= 8 tokens, B 10-19, "
              "C >= 21) so each tier gets its share of traffic; queries from `demo/questions.json` "
              "plus short greetings. Raw samples are in `report.json`.", ""]
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}x"


# --- main -----------------------------------------------------------------------------------------

def _interrupt(signum: int, _frame: Any) -> None:
    """SIGTERM / SIGINT unwind like Ctrl-C, so every server and pool started here is stopped
    (a background job started by a non-interactive shell ignores SIGINT unless told otherwise)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=0.5, help="queries per second")
    parser.add_argument("--duration", type=float, default=90.0, help="seconds of load per phase")
    parser.add_argument("--drain", type=float, default=30.0,
                        help="seconds the queries of a phase may still take after the last is sent")
    parser.add_argument("--backlog", type=int, default=200, help="C tasks queued before phase 2")
    parser.add_argument("--mix", default="A=0.6,B=0.3,C=0.1", help="tier shares of the load")
    parser.add_argument("--modes", default="separate,shared")
    parser.add_argument("--concurrency", default="A=2,B=2,C=1", help="processes per tier pool")
    parser.add_argument("--idle-timeout", type=float, default=120.0,
                        help="how long to wait for running tasks after a phase")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=REPO / "var" / "bench-queues")
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "queue_isolation")
    parser.add_argument("--render", type=Path, default=None,
                        help="only write report.md again from this report.json")
    args = parser.parse_args(argv)
    if args.render:
        (args.render.parent / "report.md").write_text(markdown(json.loads(args.render.read_text())))
        return 0
    mix = {k: float(v) for k, v in (part.split("=") for part in args.mix.split(","))}
    concurrency = {k: int(v) for k, v in (part.split("=") for part in args.concurrency.split(","))}
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]

    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_start = os.getloadavg()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    queries = queries_by_tier()
    console.print(f"queries per routed tier: { {t: len(q) for t, q in queries.items()} }")
    phases: list[dict[str, Any]] = []
    with ExitStack() as stack:
        redis_url = stack.enter_context(local_redis())
        postgres_url = stack.enter_context(local_postgres())
        upgrade_database(postgres_url)
        repository = length_router_repository(args.workdir / "model_repository")
        triton = stack.enter_context(TritonProcess(repository, args.workdir / "triton.log"))
        base = StackSettings().updated(
            database_url=postgres_url, kb_dir=args.workdir / "kb",
            model_repository=repository, triton_grpc_url=triton.url, classifier_timeout_s=2.0,
            concurrency={t: concurrency[t] for t in TIERS}, llm_threads=1, top_k=3,
            max_passages=4, max_steps=2,
            # Measure waits, not admission control: no RESOURCE_EXHAUSTED in this run.
            max_queue_depth={t: 100_000 for t in TIERS},
            model_poll_s=3600.0, default_wait_s=600.0,
        )
        for number, mode in enumerate(modes):
            settings = base.updated(redis_url=f"{redis_url.rsplit('/', 1)[0]}/{number}")
            rng = random.Random(args.seed)  # the same query sequence for every configuration
            with running_stack(mode, settings, args.workdir) as running:
                warm = warm_up(running, queries, timeout_s=600.0)
                console.print(f"{mode}: pools ready and warm ({warm:.1f} s)")
                for phase in ("steady", "backlog"):
                    result = run_phase(running, phase, args, queries, mix, rng)
                    phases.append(result)
                    console.print(table([result]))
    report = {
        "command": "nice -n 10 " + shlex.join([Path(sys.executable).name, "-m",
                                                "benchmarks.queue_isolation", *sys.argv[1:]]),
        "started": started,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        "config": {"rate": args.rate, "duration_s": args.duration, "drain_s": args.drain,
                   "backlog": args.backlog, "mix": mix, "seed": args.seed,
                   "concurrency": {**concurrency, "shared": sum(concurrency.values())}},
        "phases": phases,
        "ratio_a_shared_over_separate": ratios(phases),
    }
    console.print(table(phases))
    for phase, r in report["ratio_a_shared_over_separate"].items():
        console.print(f"tier A queue wait shared/separate, {phase}: p50 {_ratio(r['p50'])}, "
                      f"p95 {_ratio(r['p95'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (args.out / "report.md").write_text(markdown(report))
    console.print(f"wrote {args.out / 'report.md'} and {args.out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
