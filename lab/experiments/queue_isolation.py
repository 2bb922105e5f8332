"""Queue isolation: does a backlog of slow C tasks delay tier A?

Everything real except the LLM, two lab stacks (`lab.harness.stack`): redis-server (broker +
result backend) and PostgreSQL (records) started on loopback, the real Triton
(`services/classifier/serve.py`), real `celery worker` pools over the tantivy index of the demo
help center, and the front door (`python -m services.frontdoor`) reached through a real gRPC
channel. The LLM is the instant
OpenAI-compatible endpoint of `lab/harness/instant_llm.py` with a fixed per-completion latency
(`--llm-latency-ms`): a measurement device standing for a remote inference endpoint with its own
capacity (it sleeps, it uses no CPU of this machine), so a task's service time is set by the
number of completions its tier makes (A one, C three: IRCoT's two reasoning steps and the reader),
not by two shared CPU cores running a model. The figure measures queues.

Two setups, both running for the whole run side by side (one Redis server, database 0 and 1;
one PostgreSQL, Triton and LLM endpoint), each with its own front door and pools:
- `separate`: one queue and one pool per tier (tier-a, tier-b, tier-c), as served;
- `shared`: every tier on ONE queue (`ARAG_SHARED_QUEUE`) served by one pool whose size is the
  sum of the tier pools'.
Both use the same prefetch multiplier per process (`--prefetch`, default 1) and the same total
number of worker processes. Two phases:
- `steady`: no backlog;
- `backlog`: first a backlog of real C tasks enqueued directly through `workers.client` (sized
  from the measured C service time so that even the whole shared pool cannot finish it within
  the block: it exists for the whole block in both setups).
Blocks alternate between setups and phases in one run (round 1: separate-steady, shared-steady,
shared-backlog, separate-backlog; round 2 the reverse; ...), so both setups see the same machine
noise. Only one setup carries load at a time; between blocks its queues are purged, unfinished
tasks revoked, and its pools left to go idle.

Load: open loop, one query every 1/`--rate` s for `--duration` s per block, the same planned
sequence (exact tier mix, seeded queries) for all four blocks of a round, so both setups get the
same offered load. Each request may wait until `--drain` s after the last send.

Per cell (setup x phase, all rounds pooled) and tier: the queue wait (enqueue to task start: the
task's `queue_wait_ms`) p50/p95, the strategy time p50, and the front door's overhead p50/p95:
`total - strategy` (queue wait included) and `total - strategy - queue wait` (its own work). A
request whose task had not started when the block ended is *censored*: its queue wait is at least
(block end - receipt); percentiles over censored values are lower bounds (printed with >=). The
headline is the ratio shared / separate of tier A's queue-wait p50 and p95 per phase, with a
percentile-bootstrap 95 % interval (requests resampled within each setup independently; each
separate-setup wait floored at 1 ms, so the denominator is at least 1 ms).

Routing is deterministic so each tier gets the share of traffic asked for: the classifier served
by Triton is a small ONNX graph that routes by token count (A up to 8 tokens, B 10-19, C from 21,
MiniLM tokenizer); the queries are the demo questions (plus short general questions for A, none of
them small talk, which would skip the LLM) bucketed by that rule.

    nice -n 10 .venv/bin/python -m lab.experiments.queue_isolation            # ~12 min, reports/queue_isolation
    nice -n 10 .venv/bin/python -m lab.experiments.queue_isolation --quick    # ~3 min smoke, under /tmp
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import shlex
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from rich.console import Console
from rich.table import Table

from adaptive_rag.contracts import SHARED_QUEUE, AnswerTask, RequestStatus, RoutingDecision, Tier
from adaptive_rag.storage import RecordStore
from adaptive_rag.strategies import strategy_for_tier
from lab.harness.instant_llm import cpu_model, mem_total_gb
from lab.harness.load_client import CallRecord, LoadClient, open_loop
from lab.harness.models import minilm_tokenizer_path, publish_length_router
from lab.harness.stack import LabStack, Parts, lab_stack
from lab.harness.stats import median, percentile, percentile_ranks, percentile_ratio_interval
from services.demo.stack import FrontDoorProcess, StackSettings
from workers.celery_app import QUEUES, create_app
from workers.client import CeleryTaskQueue
from workers.pools import WorkerPools

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo"
TIERS = tuple(t.value for t in Tier)
T = TypeVar("T")
MODES = ("separate", "shared")
PHASES = ("steady", "backlog")
# Short general questions: the demo has few A questions of 8 tokens or less. No greetings: the
# front door answers small talk without the LLM, which would make A's service time bimodal.
EXTRA_A_QUERIES = ("capital of France?", "What is H2O?", "who wrote Hamlet?", "speed of light?",
                   "Who painted the Mona Lisa?", "largest planet?", "What is DNA?",
                   "Who invented the telephone?")
BACKLOG_TENANT = "backlog"
# The ratio's denominator (separate setup's wait) is floored here: a near-zero wait would make it
# explode.
FLOOR_MS = 1.0
MIN_A_PER_CELL = 200
WORKDIR_MARK = ".queue_isolation_workdir"
console = Console(width=None if sys.stdout.isatty() else 160)


# --- the classifier Triton serves ----------------------------------------------------------------

def length_router_repository(root: Path) -> Path:
    """A model repository whose version 1 is the length router (with the MiniLM tokenizer)."""
    publish_length_router(root, 1)
    return root


def queries_by_tier() -> dict[str, list[str]]:
    """Demo questions and short general questions, bucketed by the tier the length router gives
    them; small talk left out (it never reaches the LLM)."""
    from adaptive_rag.routing.classifier_client import QueryTokenizer
    from adaptive_rag.routing.small_talk import small_talk_intent

    tokenize = QueryTokenizer(minilm_tokenizer_path(), 64)
    texts = [q["question"] for q in json.loads((DEMO / "questions.json").read_text())]
    texts = [t for t in dict.fromkeys([*texts, *EXTRA_A_QUERIES]) if small_talk_intent(t) is None]
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


# --- the schedule (pure) -------------------------------------------------------------------------

def block_schedule(rounds: int) -> list[tuple[int, str, str]]:
    """(round, setup, phase) in run order: ABBA within a round, reversed every other round, so
    each setup and phase sees early and late machine states alike."""
    first = [("separate", "steady"), ("shared", "steady"), ("shared", "backlog"), ("separate", "backlog")]
    out = []
    for r in range(rounds):
        order = first if r % 2 == 0 else first[::-1]
        out += [(r + 1, mode, phase) for mode, phase in order]
    return out


def tier_sequence(count: int, mix: dict[str, float], rng: random.Random) -> list[str]:
    """`count` tiers in exactly the mix's proportions (largest remainder), shuffled: every block
    gets the same number of A requests, not a random one."""
    total = sum(mix.values())
    exact = {t: count * w / total for t, w in mix.items()}
    counts = {t: int(math.floor(x)) for t, x in exact.items()}
    for t in sorted(exact, key=lambda t: (counts[t] - exact[t], t))[: count - sum(counts.values())]:
        counts[t] += 1
    seq = [t for t, n in counts.items() for _ in range(n)]
    rng.shuffle(seq)
    return seq


def plan_round(queries: dict[str, list[str]], mix: dict[str, float], count: int,
               seed: int) -> list[tuple[str, str]]:
    """(planned tier, query) per send of one round: the same plan for all its blocks."""
    rng = random.Random(seed)
    return [(tier, rng.choice(queries[tier])) for tier in tier_sequence(count, mix, rng)]


def backlog_size(processes: int, window_s: float, c_service_s: float, margin: float = 1.5) -> int:
    """C tasks that `processes` busy on nothing but C could not finish within `window_s`: the
    backlog then lasts the whole block in either setup."""
    return int(math.ceil(margin * processes * window_s / max(c_service_s, 1e-3)))


# --- one request's outcome -----------------------------------------------------------------------

@dataclass
class Sample:
    """One query sent through gRPC and what became of it."""

    planned_tier: str
    client_request_id: str
    sent_at: float  # wall clock
    late_ms: float = 0.0  # how much later than scheduled it was sent (open-loop check)
    status: str = "OK"  # gRPC status name
    tier: str | None = None  # the routed tier (reply, or the recorded decision)
    queue_wait_ms: float | None = None
    censored: bool = False  # the task had not started when the block ended
    strategy_ms: float | None = None
    total_ms: float | None = None
    classify_ms: float | None = None

    @property
    def answered(self) -> bool:
        return self.status == "OK" and self.total_ms is not None

    @classmethod
    def of(cls, call: CallRecord, planned_tier: str, late_ms: float = 0.0) -> Sample:
        """The sample of one Answer call of the shared load client."""
        return cls(planned_tier, call.client_request_id or "", call.start, late_ms, call.code, call.tier,
                   call.queue_wait_ms, False, call.strategy_ms, call.total_ms, call.classify_ms)


def summarize(samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """Per routed tier: counts, queue wait p50/p95 (censored ones as lower bounds), strategy time,
    overheads."""
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
            "strategy_p50_ms": percentile([s.strategy_ms for s in answered], 50),
        }
        for q in (50, 95):
            row[f"queue_wait_p{q}_ms"] = percentile(waits, q)
            row[f"queue_wait_p{q}_lower_bound"] = lower_bound(waits, censored, q)
            row[f"total_minus_strategy_p{q}_ms"] = percentile(over, q)
            row[f"own_overhead_p{q}_ms"] = percentile(own, q)
        out[tier] = row
    return out


def lower_bound(values: Sequence[float], censored: Sequence[float], q: float) -> bool:
    """Whether the q-th percentile of `values` (censored ones included at their wait so far) is
    only a lower bound: it is when a censored value is one of the two order statistics the
    interpolation uses, or below them (a censored wait can only grow)."""
    if not values or not censored:
        return False
    ordered = sorted(values)
    upper = ordered[percentile_ranks(len(ordered), q)[1]]
    return min(censored) <= upper


def waits_of(samples: list[Sample], tier: str) -> list[float]:
    return [s.queue_wait_ms for s in samples if s.tier == tier and s.queue_wait_ms is not None]


def wait_ratio(shared: list[float], separate: list[float], q: float, resamples: int,
               rng: np.random.Generator) -> dict[str, Any]:
    """pctl_q(shared) / pctl_q(separate floored at FLOOR_MS), with its bootstrap interval (each
    setup's requests resampled on their own)."""
    floored = [max(w, FLOOR_MS) for w in separate]
    num, den = percentile(shared, q), percentile(floored, q)
    ci = percentile_ratio_interval(shared, floored, q, resamples, rng)
    return {"ratio": None if num is None or den is None else num / den,
            "ci95": list(ci) if ci else None, "n_shared": len(shared), "n_separate": len(separate)}


def ratios(cells: dict[tuple[str, str], list[Sample]], summaries: dict[str, dict[str, Any]],
           resamples: int, seed: int) -> dict[str, dict[str, dict[str, Any]]]:
    """Per tier and phase: shared / separate of the queue wait p50 and p95 with 95 % intervals;
    a ratio over censored shared waits is a lower bound (so is its interval)."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for tier in TIERS:
        for phase in PHASES:
            sep, shared = cells.get(("separate", phase)), cells.get(("shared", phase))
            if not sep or not shared:
                continue
            num, den = waits_of(shared, tier), waits_of(sep, tier)
            if not num or not den:
                continue
            row: dict[str, Any] = {}
            for q in (50, 95):
                r = wait_ratio(num, den, q, resamples, rng)
                r["lower_bound"] = bool(summaries[f"shared/{phase}"][tier][f"queue_wait_p{q}_lower_bound"])
                r["denominator_lower_bound"] = bool(
                    summaries[f"separate/{phase}"][tier][f"queue_wait_p{q}_lower_bound"])
                row[f"p{q}"] = r
            out.setdefault(tier, {})[phase] = row
    return out


def busy_share(samples: list[Sample], tiers: Sequence[str], processes: int, window_s: float) -> float | None:
    """Strategy time of the answered tasks of `tiers` / (processes x window): the pool's
    utilisation, a little low (the task's own bookkeeping around the strategy is not in it)."""
    if processes <= 0 or window_s <= 0:
        return None
    busy = sum(s.strategy_ms for s in samples if s.answered and s.tier in tiers) / 1000
    return busy / (processes * window_s)


# --- the running stack of one setup --------------------------------------------------------------

@dataclass
class Stack:
    mode: str
    settings: StackSettings
    store: RecordStore
    pools: WorkerPools
    frontdoor: FrontDoorProcess
    address: str
    key: str
    tenant: str
    queue: CeleryTaskQueue = field(repr=False, default=None)

    @property
    def app(self) -> Any:
        return self.queue.app

    @property
    def queues(self) -> list[str]:
        return [*QUEUES, SHARED_QUEUE] if self.settings.workers.shared_queue else list(QUEUES)

    @property
    def pool_sizes(self) -> dict[str, int]:
        return {name: self.settings.workers.pool_concurrency(name) for name in self.pools.pool_names}


# Real servers and Triton (the length router), the fixed-latency LLM endpoint.
PARTS = Parts(broker="redis", records="postgres", classifier="triton", retriever="tantivy", llm="instant")


@contextmanager
def running_stack(mode: str, workdir: Path, settings: dict[str, Any], llm_latency_ms: float,
                  model_repository: Path) -> Iterator[tuple[Stack, LabStack]]:
    """One setup's lab stack (its own front door and pools; the servers `settings` names, or
    started here)."""
    tenant = f"bench-{mode}"
    with lab_stack(workdir / mode, PARTS, pools=("shared",) if mode == "shared" else TIERS,
                   settings={**settings, "shared_queue": mode == "shared"}, tenants=(tenant, BACKLOG_TENANT),
                   model_repository=model_repository, llm_latency_ms=llm_latency_ms) as lab:
        yield Stack(mode, lab.settings, lab.store, lab.pools, lab.frontdoor, lab.address, lab.api_key(tenant),
                    tenant, CeleryTaskQueue(create_app(lab.settings.workers))), lab


async def send(client: LoadClient, query: str, planned: str, cutoff: float, late_ms: float = 0.0) -> Sample:
    """One Answer within the block's cutoff (monotonic); the reply fills the sample."""
    call = await client.answer(query, timeout=max(0.5, cutoff - time.monotonic()))
    return Sample.of(call, planned, late_ms)


def sending(stack: Stack, load: Callable[[LoadClient], Awaitable[T]]) -> T:
    """`load` run on a load client of the stack's front door (connected first)."""
    async def run() -> T:
        async with LoadClient(stack.address, stack.key) as client:
            await client.ready()
            return await load(client)

    return asyncio.run(run())


def complete_from_records(stack: Stack, samples: list[Sample], phase_end_wall: float) -> None:
    """Fill in tier and queue wait of requests that got no reply, from the records.

    A result row gives the measured queue wait; a request the worker had started gives
    (start - receipt); one still queued is censored at (block end - receipt).
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


def run_load(stack: Stack, plan: list[tuple[str, str]], rate: float, drain_s: float) -> list[Sample]:
    """Open loop: send `plan[i]` at start + i / `rate`, whatever the earlier ones are doing; each
    may wait until `drain_s` after the last is due."""
    async def load(client: LoadClient) -> list[Sample]:
        start = time.monotonic()
        cutoff = start + len(plan) / rate + drain_s

        async def one(i: int) -> Sample:
            tier, query = plan[i]
            return await send(client, query, tier, cutoff, 1000 * max(0.0, time.monotonic() - (start + i / rate)))

        return (await open_loop(one, rate, count=len(plan), start=start)).results

    return sending(stack, load)


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
    """One query per pool process and tier, answered, so first-use costs are not measured."""
    started = time.monotonic()
    cutoff = started + timeout_s
    n = {tier: stack.settings.workers.pool_concurrency(tier) for tier in TIERS}

    async def load(client: LoadClient) -> list[Sample]:
        return list(await asyncio.gather(*(send(client, queries[tier][i % len(queries[tier])], tier, cutoff)
                                           for tier in TIERS for i in range(n[tier]))))

    bad = [s.status for s in sending(stack, load) if not s.answered]
    if bad:
        raise RuntimeError(f"warm-up queries failed: {bad}")
    return time.monotonic() - started


def service_times(stack: Stack, queries: dict[str, list[str]], per_tier: int) -> dict[str, list[float]]:
    """Strategy time (ms) of `per_tier` sequential queries per tier on an idle stack."""
    async def load(client: LoadClient) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for tier in TIERS:
            out[tier] = []
            for i in range(per_tier):
                s = await send(client, queries[tier][i % len(queries[tier])], tier, time.monotonic() + 60)
                if not s.answered or s.tier != tier:
                    raise RuntimeError(f"service-time query for {tier} failed: {s}")
                out[tier].append(s.strategy_ms)
        return out

    return sending(stack, load)


def run_block(
    stack: Stack, round_: int, phase: str, plan: list[tuple[str, str]], args: argparse.Namespace,
    queries: dict[str, list[str]], backlog: int,
) -> tuple[dict[str, Any], list[Sample]]:
    enqueue_started = time.monotonic()
    backlog_ids = enqueue_backlog(stack, queries["C"], backlog) if phase == "backlog" else []
    enqueue_s = time.monotonic() - enqueue_started
    load_before = os.getloadavg()
    depth_before = depths(stack)
    console.print(f"[bold]round {round_} {stack.mode} / {phase}[/]: {len(plan)} queries at "
                  f"{args.rate} q/s (+{args.drain:.0f} s to finish), queues {depth_before}")
    started = time.monotonic()
    samples = run_load(stack, plan, args.rate, args.drain)
    seconds = time.monotonic() - started
    phase_end = time.time()
    depth_after = depths(stack)
    complete_from_records(stack, samples, phase_end)
    sent_ids = [r.request_id for s in samples
                if (r := stack.store.find_request(stack.tenant, s.client_request_id)) is not None]
    backlog_done = sum(1 for rid in backlog_ids if stack.store.get_result(rid) is not None)
    cleanup = reset(stack, backlog_ids + sent_ids, args.idle_timeout)
    sends = sorted(s.sent_at for s in samples)
    block = {
        "round": round_, "mode": stack.mode, "phase": phase, "backlog": len(backlog_ids),
        "backlog_enqueue_s": enqueue_s, "backlog_finished_in_block": backlog_done,
        "seconds": seconds, "send_span_s": sends[-1] - sends[0] if len(sends) > 1 else 0.0,
        "load_average_start": load_before, "load_average_end": os.getloadavg(),
        "queue_depth_start": depth_before, "queue_depth_end": depth_after, "reset": cleanup,
        "tiers": summarize(samples), "samples": [asdict(s) for s in samples],
    }
    time.sleep(args.settle)
    return block, samples


# --- report --------------------------------------------------------------------------------------

def fmt(value: float | None, lower: bool = False, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{'>=' if lower else ''}{value:,.{digits}f}"


def _x(value: float) -> str:
    return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def _ratio(r: dict[str, Any]) -> str:
    """`1.02x [0.91, 1.10]`; over censored shared waits `>=3,208x [2,278, 4,131]` (the interval
    of the bound); both setups censored: no ratio (a bound over a bound bounds nothing)."""
    if r["ratio"] is None:
        return "-"
    if r.get("denominator_lower_bound"):
        return "- (both censored)"
    text = f"{'>=' if r['lower_bound'] else ''}{_x(r['ratio'])}x"
    if r["ci95"]:
        text += f" [{_x(r['ci95'][0])}, {_x(r['ci95'][1])}]"
    return text


def cell_samples(blocks: list[dict[str, Any]]) -> dict[tuple[str, str], list[Sample]]:
    cells: dict[tuple[str, str], list[Sample]] = {}
    for b in blocks:
        cells.setdefault((b["mode"], b["phase"]), []).extend(Sample(**s) for s in b["samples"])
    return cells


def cell_facts(blocks: list[dict[str, Any]], cells: dict[tuple[str, str], list[Sample]],
               pool_sizes: dict[str, dict[str, int]], duration_s: float) -> dict[str, dict[str, Any]]:
    """Per cell: requests, achieved send rate, send lateness and (steady) pool utilisation."""
    out: dict[str, dict[str, Any]] = {}
    for (mode, phase), samples in cells.items():
        mine = [b for b in blocks if b["mode"] == mode and b["phase"] == phase]
        span = sum(b["send_span_s"] for b in mine)
        sent = sum(len(b["samples"]) for b in mine)
        late = [s.late_ms for s in samples]
        facts: dict[str, Any] = {
            "blocks": len(mine), "sent": sent,
            # n sends span (n - 1) intervals of 1/rate
            "achieved_rate": (sent - len(mine)) / span if span else None,
            "late_p95_ms": percentile(late, 95), "late_max_ms": max(late) if late else None,
        }
        if phase == "steady":
            window = duration_s * len(mine)
            pools = pool_sizes[mode]
            facts["busy_share"] = {
                name: busy_share(samples, TIERS if name == "shared" else (name,), n, window)
                for name, n in pools.items()}
        out[f"{mode}/{phase}"] = facts
    return out


def table(summaries: dict[str, dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for col in ("cell", "tier", "sent", "answered", "censored", "wait p50", "wait p95",
                "strategy p50", "own p50", "own p95"):
        t.add_column(col, justify="left" if col == "cell" else "right")
    for cell, tiers in summaries.items():
        for tier, r in tiers.items():
            t.add_row(cell, tier, str(r["sent"]), str(r["answered"]), str(r["censored"]),
                      fmt(r["queue_wait_p50_ms"], r["queue_wait_p50_lower_bound"]),
                      fmt(r["queue_wait_p95_ms"], r["queue_wait_p95_lower_bound"]),
                      fmt(r["strategy_p50_ms"]), fmt(r["own_overhead_p50_ms"]),
                      fmt(r["own_overhead_p95_ms"]))
    return t


def markdown(report: dict[str, Any]) -> str:
    cfg, setups = report["config"], report["setups"]
    load = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    n_a = {cell: s["A"]["sent"] for cell, s in report["cells"].items()}
    lines = [
        "# Queue isolation: tier A's queue wait while C backs up",
        "",
        f"Command: `{report['command']}`  ",
        f"Run: {report['started']} to {report['finished']} ({report['seconds'] / 60:.1f} min) on "
        f"{report['machine']['cpus']} CPU cores ({report['machine']['cpu']}, "
        f"{report['machine']['platform']}); load average (1, 5, 15 min) at start "
        f"{load(report['load_average_start'])}, at end {load(report['load_average_end'])}. The "
        "machine is shared with other jobs.",
        "",
        "Design: the same prefetch and the same number of worker processes in both setups, blocks "
        "of both setups interleaved in one run, the same open-loop load below saturation, an LLM "
        "that uses no CPU. (An earlier version of this benchmark compared setups that also "
        "differed in prefetch, one after the other, with the real model on the loaded machine, "
        "the shared one saturated before any backlog.)",
        "",
        "## Setups",
        "",
        "Both setups ran side by side for the whole run, on loopback: one redis-server "
        f"(database {setups['separate']['redis_db']} for `separate`, {setups['shared']['redis_db']} "
        "for `shared`), one PostgreSQL, one Triton (a length-routing ONNX graph: A <= 8 tokens, "
        "B 10-19, C >= 21, so each tier gets its share of traffic), one LLM endpoint; each setup "
        "its own front door (`python -m services.frontdoor`, gRPC) and `celery worker` pools over "
        "the tantivy index of the demo help center. Tier C runs `ircot` (top-k "
        f"{cfg['top_k']}, max steps {cfg['max_steps']}).",
        "",
        "The LLM is a **measurement device**: the instant OpenAI-compatible endpoint of "
        f"`lab/harness/instant_llm.py` with a fixed latency of {cfg['llm_latency_ms']:g} ms per "
        "completion (it sleeps, it uses no CPU of this machine), standing for a remote inference "
        "endpoint with its own capacity. A task's service time is then set by the number of "
        "completions its tier makes, not by two shared CPU cores running a model, so the figure "
        "measures queues. Measured strategy time, sequential on the idle `separate` stack (ms, "
        "median): " + ", ".join(f"{t} {median(v):,.0f}" for t, v in
                                 report["service_times_ms"].items()) + ".",
        "",
        "| setup | queues | pools: processes, prefetch multiplier | total processes |",
        "| --- | --- | --- | ---: |",
    ]
    for mode in MODES:
        s = setups[mode]
        pools = "; ".join(f"{name}: {p['processes']}, prefetch {p['prefetch']}"
                          for name, p in s["pools"].items())
        lines.append(f"| {mode} | {', '.join(s['queues'])} | {pools} | "
                     f"{sum(p['processes'] for p in s['pools'].values())} |")
    lines += ["", "Worker commands as run:", ""]
    for mode in MODES:
        for name, p in setups[mode]["pools"].items():
            lines.append(f"- {mode} / {name}: `{p['command']}`")
    lines += [
        "",
        "## Load and schedule",
        "",
        f"Open loop: one gRPC `Answer` every {1 / cfg['rate']:.3g} s ({cfg['rate']:g} queries/s) for "
        f"{cfg['duration_s']:.0f} s per block ({cfg['per_block']} queries: exactly "
        + ", ".join(f"{t} {n}" for t, n in cfg["per_block_by_tier"].items())
        + f"), each allowed to wait until {cfg['drain_s']:.0f} s after the last was due. The same "
        "planned sequence (tiers and queries, seeded per round) went to all four blocks of a round: "
        "both setups got the same offered load. Fair-share limits off, queue limits 100000 (no "
        "admission rejections), no shadow runs.",
        "",
        f"Backlog phase: {cfg['backlog']} real C tasks of another tenant enqueued through "
        "`workers.client` just before the block: "
        + (f"{cfg['backlog_margin']:g} x {cfg['total_processes']} processes x "
           f"{cfg['duration_s'] + cfg['drain_s']:.0f} s / {cfg['c_service_s']:.2f} s per C task, so "
           "even the whole shared pool working on C alone could not finish it within a block"
           if cfg.get("backlog_auto") else "set on the command line")
        + ". Between blocks the setup's queues were purged, unfinished tasks revoked, and its "
        f"pools left to go idle; then {cfg['settle_s']:g} s of rest.",
        "",
        f"Blocks interleaved in one run, {cfg['rounds']} round(s): "
        + "; ".join(f"round {r}: " + ", ".join(f"{m}-{p}" for rr, m, p in report["schedule"] if rr == r)
                    for r in sorted({r for r, _, _ in report["schedule"]}))
        + ". Only one setup carries load at a time.",
        "",
        "## Queue wait per cell (all rounds pooled)",
        "",
        "Queue wait = enqueue to task start (`queue_wait_ms`), ms. `strategy` = the task's strategy "
        "time; `own` = total - strategy - queue wait (the front door's work: auth, classify, records, "
        "enqueue, result delivery). `>=`: censored, some requests had not started when the block "
        "ended and count with their wait so far (a lower bound).",
        "",
        "| setup | phase | tier | sent | answered | censored | wait p50 | wait p95 | strategy p50 | own p50 | own p95 |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cell, tiers in report["cells"].items():
        mode, phase = cell.split("/")
        for tier, r in tiers.items():
            lines.append(
                f"| {mode} | {phase} | {tier} | {r['sent']} | {r['answered']} | {r['censored']} | "
                f"{fmt(r['queue_wait_p50_ms'], r['queue_wait_p50_lower_bound'], 1)} | "
                f"{fmt(r['queue_wait_p95_ms'], r['queue_wait_p95_lower_bound'], 1)} | "
                f"{fmt(r['strategy_p50_ms'])} | {fmt(r['own_overhead_p50_ms'])} | "
                f"{fmt(r['own_overhead_p95_ms'])} |")
    lines += [
        "",
        "## Headline: tier A's queue wait, shared / separate",
        "",
        f"Percentile-bootstrap 95 % intervals ({cfg['bootstrap']} resamples; each setup's requests "
        f"resampled on their own; the ratio of the two percentiles). Each separate-setup wait is "
        f"floored at {FLOOR_MS:g} ms, so the denominator is at least {FLOOR_MS:g} ms. `>=`: the "
        "shared percentile is over censored waits, so ratio and interval are lower bounds.",
        "",
        "| phase | A sent (separate / shared) | separate p50 | shared p50 | ratio p50 [95 % CI] | separate p95 | shared p95 | ratio p95 [95 % CI] |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for phase in PHASES:
        r = report["ratios"].get("A", {}).get(phase)
        if r is None:
            continue
        sep, sh = report["cells"][f"separate/{phase}"]["A"], report["cells"][f"shared/{phase}"]["A"]
        lines.append(
            f"| {phase} | {sep['sent']} / {sh['sent']} | "
            f"{fmt(sep['queue_wait_p50_ms'], sep['queue_wait_p50_lower_bound'], 1)} | "
            f"{fmt(sh['queue_wait_p50_ms'], sh['queue_wait_p50_lower_bound'], 1)} | {_ratio(r['p50'])} | "
            f"{fmt(sep['queue_wait_p95_ms'], sep['queue_wait_p95_lower_bound'], 1)} | "
            f"{fmt(sh['queue_wait_p95_ms'], sh['queue_wait_p95_lower_bound'], 1)} | {_ratio(r['p95'])} |")
    for cell, tiers in report["cells"].items():
        a = tiers["A"]
        if a["sent"] and a["answered"] == 0 and a["censored"] == a["sent"]:
            lines += ["", f"In `{cell}` no tier-A task started within its block: every wait there is "
                          "censored, so its percentiles are the censoring horizon (time from receipt "
                          f"to block end, {cfg['drain_s']:.0f}-{cfg['duration_s'] + cfg['drain_s']:.0f} s),"
                          " set by the schedule: tier A waited at least that long, how much longer "
                          "is not measured."]
    lines += ["", "Same ratios for B and C (their own queues in `separate`):", ""]
    for tier in ("B", "C"):
        for phase, r in report["ratios"].get(tier, {}).items():
            lines.append(f"- {tier}, {phase}: p50 {_ratio(r['p50'])}, p95 {_ratio(r['p95'])}")
    short = {cell: n for cell, n in n_a.items() if n < MIN_A_PER_CELL}
    if short:
        lines += ["", f"**Fewer than {MIN_A_PER_CELL} tier-A requests in cell(s) {short}: a smoke "
                      "run, not the figure.**"]
    lines += ["", "## Below saturation? (steady phase)", "",
              "Achieved send rate (sends per second over the sending span) and how late the open-loop "
              "sender was; `busy` = the pool's utilisation, strategy time of its answered tasks / "
              "(processes x sending time), a little low since the task's bookkeeping around the "
              "strategy is not in it.", ""]
    for cell, f in report["cell_facts"].items():
        busy = f.get("busy_share")
        lines.append(
            f"- {cell}: {f['sent']} sent in {f['blocks']} block(s), achieved "
            f"{fmt(f['achieved_rate'], digits=2)} q/s (offered {cfg['rate']:g}); send lateness p95 "
            f"{fmt(f['late_p95_ms'], digits=1)} ms, max {fmt(f['late_max_ms'], digits=1)} ms"
            + (("; busy " + ", ".join(f"{k} {v:.0%}" for k, v in busy.items() if v is not None))
               if busy else ""))
    lines += ["", "## Blocks", "",
              "| round | setup | phase | A wait p50 | A wait p95 | queue depth start -> end | backlog done in block | load 1-min start -> end |",
              "| ---: | --- | --- | ---: | ---: | --- | ---: | --- |"]
    for b in report["blocks"]:
        a = b["tiers"]["A"]
        depth = lambda d: ", ".join(f"{k} {v}" for k, v in d.items() if v) or "0"  # noqa: E731
        lines.append(
            f"| {b['round']} | {b['mode']} | {b['phase']} | "
            f"{fmt(a['queue_wait_p50_ms'], a['queue_wait_p50_lower_bound'], 1)} | "
            f"{fmt(a['queue_wait_p95_ms'], a['queue_wait_p95_lower_bound'], 1)} | "
            f"{depth(b['queue_depth_start'])} -> {depth(b['queue_depth_end'])} | "
            f"{b['backlog_finished_in_block']}/{b['backlog']} | "
            f"{b['load_average_start'][0]:.2f} -> {b['load_average_end'][0]:.2f} |")
    lines += ["", "Queries: `demo/questions.json` plus short general questions for A (no small "
              "talk), bucketed by the length router. Raw samples are in `report.json`.", ""]
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------------

def _interrupt(signum: int, _frame: Any) -> None:
    """SIGTERM / SIGINT unwind like Ctrl-C, so every server and pool started here is stopped
    (a background job started by a non-interactive shell ignores SIGINT unless told otherwise)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def parse_pairs(text: str, kind: type) -> dict[str, Any]:
    return {k.strip(): kind(v) for k, v in (part.split("=") for part in text.split(","))}


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 round of 12 s blocks, written under /tmp")
    parser.add_argument("--rate", type=float, default=3.0, help="queries per second (open loop)")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds of sending per block (default 40; --quick 12)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of the four blocks (default 3; --quick 1)")
    parser.add_argument("--drain", type=float, default=10.0,
                        help="seconds the queries of a block may still take after the last is due")
    parser.add_argument("--mix", default="A=0.6,B=0.3,C=0.1", help="tier shares of the load")
    parser.add_argument("--concurrency", default="A=2,B=2,C=1",
                        help="processes per tier pool; the shared pool gets their sum")
    parser.add_argument("--prefetch", type=int, default=1, help="prefetch multiplier of every pool")
    parser.add_argument("--llm-latency-ms", type=float, default=200.0,
                        help="fixed wait per completion of the instant LLM (no CPU)")
    parser.add_argument("--backlog", type=int, default=0,
                        help="C tasks queued before a backlog block (0: sized from the C service time)")
    parser.add_argument("--backlog-margin", type=float, default=1.5)
    parser.add_argument("--service-queries", type=int, default=4,
                        help="sequential queries per tier measuring the service times")
    parser.add_argument("--idle-timeout", type=float, default=60.0,
                        help="how long to wait for running tasks after a block")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of rest between blocks")
    parser.add_argument("--bootstrap", type=int, default=4000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="the stacks' files (default var/bench-queues; --quick /tmp/...)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report directory (default reports/queue_isolation; --quick /tmp/...)")
    parser.add_argument("--render", type=Path, default=None,
                        help="only write report.md again from this report.json")
    args = parser.parse_args(argv)
    if args.render:
        (args.render.parent / "report.md").write_text(markdown(json.loads(args.render.read_text())))
        return 0
    quick_base = Path("/tmp/arag-queue-isolation-quick")
    args.duration = args.duration or (12.0 if args.quick else 40.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    workdir = (args.workdir or (quick_base / "stack" if args.quick else REPO / "var" / "bench-queues")).resolve()
    out = (args.out or (quick_base / "report" if args.quick else REPO / "reports" / "queue_isolation")).resolve()
    mix = parse_pairs(args.mix, float)
    concurrency = parse_pairs(args.concurrency, int)
    per_block = int(round(args.duration * args.rate))

    # A fresh work directory every run: only a folder this script made is removed.
    if (workdir / WORKDIR_MARK).exists():
        shutil.rmtree(workdir)
    elif workdir.exists() and any(workdir.iterdir()):
        parser.error(f"--workdir {workdir} is not empty and was not made by this script")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / WORKDIR_MARK).write_text("lab.experiments.queue_isolation work directory (removed by each run)\n")

    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    t0 = time.monotonic()
    load_start = os.getloadavg()
    queries = queries_by_tier()
    console.print(f"queries per routed tier: { {t: len(q) for t, q in queries.items()} }")
    schedule = block_schedule(args.rounds)
    plans = {r: plan_round(queries, mix, per_block, args.seed + r) for r in range(1, args.rounds + 1)}
    blocks: list[dict[str, Any]] = []
    setups: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        repository = length_router_repository(workdir / "model_repository")
        settings: dict[str, Any] = dict(
            classifier_timeout_s=2.0, multi_step="ircot",
            concurrency={t: concurrency[t] for t in TIERS},
            prefetch={t: args.prefetch for t in TIERS},
            top_k=3, max_passages=4, max_steps=2,
            # Measure waits, not admission control: no RESOURCE_EXHAUSTED in this run.
            max_queue_depth={t: 100_000 for t in TIERS},
            tenant_rate_per_s=0.0, tenant_slots={t: 0 for t in TIERS}, shadow_share=0.0,
            model_poll_s=3600.0, default_wait_s=600.0,
        )
        running: dict[str, Stack] = {}
        for db, mode in enumerate(MODES):
            r, lab = stack.enter_context(running_stack(mode, workdir, settings, args.llm_latency_ms, repository))
            running[mode] = r
            if db == 0:  # the first setup's servers, Triton and LLM endpoint serve the second too
                console.print(f"fixed-latency LLM endpoint: {lab.using['llm']}")
                shared = lab.settings
                settings.update(database_url=shared.library.database_url, llm_base_url=shared.library.llm_base_url,
                                triton_grpc_url=shared.classifier.triton_grpc_url,
                                redis_url=f"{shared.workers.redis_url.rsplit('/', 1)[0]}/{db + 1}")
            setups[mode] = {
                "redis_db": db, "queues": [SHARED_QUEUE] if mode == "shared" else
                [r.queue.queue_name(Tier(t)) for t in TIERS],
                "pools": {name: {"processes": n, "prefetch": r.settings.workers.pool_prefetch(name),
                                 "command": shlex.join(["celery", *r.pools.command(name)[3:]])}
                          for name, n in r.pool_sizes.items()},
            }
            if any(p["prefetch"] != args.prefetch for p in setups[mode]["pools"].values()):
                raise RuntimeError(f"{mode}: prefetch differs from {args.prefetch}: {setups[mode]['pools']}")
        totals = {m: sum(p["processes"] for p in s["pools"].values()) for m, s in setups.items()}
        if len(set(totals.values())) != 1:
            raise RuntimeError(f"the setups' total worker processes differ: {totals}")
        for mode, r in running.items():
            console.print(f"{mode}: pools ready, warm-up {warm_up(r, queries, timeout_s=600.0):.1f} s")
        service = service_times(running["separate"], queries, args.service_queries)
        c_service_s = median(service["C"]) / 1000
        window_s = args.duration + args.drain
        backlog = args.backlog or backlog_size(totals["shared"], window_s, c_service_s, args.backlog_margin)
        console.print(f"service times (ms, median): { {t: round(median(v)) for t, v in service.items()} }; "
                      f"backlog {backlog} C tasks")
        for round_, mode, phase in schedule:
            block, _ = run_block(running[mode], round_, phase, plans[round_], args, queries, backlog)
            blocks.append(block)
            console.print(table({f"{mode}/{phase}": block["tiers"]}, f"round {round_} {mode}/{phase}"))
    cells = cell_samples(blocks)
    summaries = {f"{m}/{p}": summarize(cells[(m, p)]) for m in MODES for p in PHASES if (m, p) in cells}
    report = {
        "command": "nice -n 10 " + shlex.join([".venv/bin/python", "-m", "lab.experiments.queue_isolation",
                                                *(sys.argv[1:] if argv is None else argv)]),
        "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seconds": time.monotonic() - t0,
        "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "mem_gb": mem_total_gb(),
                    "platform": platform.platform()},
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        "config": {"rate": args.rate, "duration_s": args.duration, "drain_s": args.drain,
                   "rounds": args.rounds, "settle_s": args.settle, "mix": mix, "seed": args.seed,
                   "per_block": per_block,
                   "per_block_by_tier": {t: sum(1 for tier, _ in plans[1] if tier == t) for t in TIERS},
                   "llm_latency_ms": args.llm_latency_ms, "top_k": 3, "max_steps": 2,
                   "prefetch": args.prefetch, "concurrency": concurrency,
                   "total_processes": totals["shared"], "backlog": backlog,
                   "backlog_auto": not args.backlog, "backlog_margin": args.backlog_margin,
                   "c_service_s": c_service_s, "bootstrap": args.bootstrap},
        "setups": setups,
        "service_times_ms": service,
        "schedule": schedule,
        "cells": summaries,
        "cell_facts": cell_facts(blocks, cells, {m: {n: p["processes"] for n, p in s["pools"].items()}
                                                 for m, s in setups.items()}, args.duration),
        "ratios": ratios(cells, summaries, args.bootstrap, args.seed),
        "blocks": blocks,
    }
    console.print(table(summaries, "all rounds pooled (queue wait, ms)"))
    for phase, r in report["ratios"]["A"].items():
        console.print(f"tier A queue wait shared/separate, {phase}: p50 {_ratio(r['p50'])}, "
                      f"p95 {_ratio(r['p95'])}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "report.md").write_text(markdown(report))
    console.print(f"wrote {out / 'report.md'} and {out / 'report.json'} "
                  f"({report['seconds'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
