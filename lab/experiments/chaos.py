"""A fault campaign as a benchmark: does the serving stack lose, duplicate or mislabel requests
when its parts fail one at a time under a steady load, and how long until clients are served again?

    .venv/bin/python -m lab.experiments.chaos                # full run (~25 min): reports/reliability/
    .venv/bin/python -m lab.experiments.chaos --quick        # ~4 min smoke run: var/chaos/quick/report/
    .venv/bin/python -m lab.experiments.chaos --render DIR   # the report again from a run's scratch DIR

Operator goals, checked per fault and per repetition: 0 requests lost as the client sees it (every
request it sent answered, OK or a final status the contract allows, within 30 s (`--grace`) of its
window's last send), 0 accepted requests stranded without a result, 0 duplicated results, 0
INTERNAL / UNKNOWN statuses, and clients served again within 30 s of the fault's injection. A
request whose task ran more than once (`requests.runs`) is reported per fault, not a goal.

The stack is the lab's (`lab.harness.stack`), real and on loopback (started here, stopped
afterwards): Redis as broker and result backend and PostgreSQL as the records database (a commit
survives a crash of the server), each restartable on its port; the tier worker pools A, B, C and
shadow as `celery worker` processes under the pool supervisor of `workers.pools` (it restarts a
pool that exits), the gRPC front door as a subprocess, the local Triton (`nvidia-pytriton`)
serving the classifier (an untrained bootstrap version when the repository has none; with none at
all the rules route, and the report says so), and, when an OpenSearch fault is selected, a
two-node OpenSearch 2.19 cluster (a cluster-manager + data node the workers talk to, a data-only
node; the tenant's index with one replica) as the tenant's knowledge-base backend. The LLM is the
instant OpenAI-compatible endpoint of `lab/harness/instant_llm.py` with a fixed latency per
completion (a measurement device: it uses no CPU, so what is measured is the stack's own
behaviour). The faults act through the stack's handles.

The load is the lab's gRPC load client (`lab.harness.load_client`) at a fixed offered rate (open
loop, default 5 queries/s, the load test's query pools and its 60/30/10 A/B/C mix). It behaves like
a good client: UNAVAILABLE / RESOURCE_EXHAUSTED / CANCELLED -> the same `client_request_id` again
after the `retry-after` hint; DEADLINE_EXCEEDED -> `GetResult` with the `x-request-id` trailer
until the answer is there; every request bounded by a total budget. Every call is logged (client
request id, attempt, method, start, end, status, tier, request id); health is polled every second.

Faults, one at a time, each repeated `--repeat` times, with a quiet period before each: a prefork
child of pool B killed (SIGKILL), pool B's main process killed (SIGKILL; the supervisor restarts
it), Redis stopped for 5 s, PostgreSQL stopped for 15 s (immediate shutdown, a crash), the
OpenSearch node the workers query stopped for 10 s, Triton stopped for 30 s, the front door
killed (SIGKILL) and started again, the data node of the OpenSearch cluster killed (the replica
must keep the queries answered).

Per fault window the accounting reads the client's own log first (sent, answered in time, lost and
why) and then the PostgreSQL records after the campaign drained (accepted, answered, stranded,
duplicated, run more than once), with wrong codes, seconds to recovery and p50/p95 latency (definitions in the report, logic in the functions below `# --- accounting`, unit-tested
in lab/tests/test_chaos_accounting.py). Scratch (logs of every process, the client log, the
records) goes to `var/chaos/<run>/`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adaptive_rag.contracts import NEVER_RAN
from lab.harness.load_client import GAVE_UP, CallRecord, LoadClient, Outcome, open_loop, read_jsonl
from lab.harness.stats import percentile

REPO = Path(__file__).resolve().parents[2]
TENANT = "chaos"
WINDOW_S = 5.0  # sliding window of the recovery rule
SHARE = 0.95  # of the pre-fault success rate that counts as recovered
RECOVERY_GOAL_S = 30.0
WRONG_CODES = ("INTERNAL", "UNKNOWN")
# A request counts as answered when the client got its resolution no later than this many seconds
# after the last request of its window was sent: the recovery goal again (clients served within
# 30 s), so a request answered only after it was no answer for an operator.
GRACE_S = RECOVERY_GOAL_S
# statuses of accepted requests that never ran and that a resend runs (rejected, expired): not lost
NEVER_RAN_STATUSES = frozenset(status.value for status in NEVER_RAN)

# --- faults -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultSpec:
    """One kind of fault: what is done, how long the part stays away, what it depends on."""

    name: str
    title: str
    action: str
    hold_s: float = 0.0  # how long the part stays away before it is started again
    opensearch: bool = False  # needs the OpenSearch cluster
    dependency: bool = True  # a dependency outage (INTERNAL is always a wrong code; listed for the report)


FAULTS: dict[str, FaultSpec] = {f.name: f for f in (
    FaultSpec("pool-child-kill", "pool B child SIGKILL",
              "SIGKILL to a prefork child of pool B while a tier-B request runs (Celery's main process forks a new one)"),
    FaultSpec("worker-kill", "pool B worker SIGKILL",
              "SIGKILL to pool B's main `celery worker` process; the pool supervisor reaps its children and starts it again"),
    FaultSpec("redis-restart", "Redis restart",
              "redis-server stopped (SIGTERM), 5 s down, started again on the same port and directory (AOF kept)",
              hold_s=5.0),
    FaultSpec("postgres-down", "PostgreSQL down 15 s",
              "immediate shutdown (as `pg_ctl stop -m immediate`: no checkpoint, a crash recovery at the next "
              "start), 15 s down, started again on the same port", hold_s=15.0),
    FaultSpec("opensearch-down", "OpenSearch node down 10 s",
              "the OpenSearch node the workers query (cluster manager + data) stopped (SIGTERM) for 10 s, then "
              "started again", hold_s=10.0, opensearch=True),
    FaultSpec("triton-down", "Triton down 30 s",
              "the Triton server stopped for 30 s, then started again on the same gRPC port", hold_s=30.0),
    FaultSpec("frontdoor-kill", "front door SIGKILL",
              "SIGKILL to the front door process, then a new one started on the same port", dependency=False),
    FaultSpec("opensearch-node-loss", "OpenSearch loses a node",
              "SIGKILL to the data-only node of the two-node cluster (the tenant's index has one replica), "
              "20 s away, started again (rejoins, green)", hold_s=20.0, opensearch=True),
)}
QUICK_FAULTS = ("pool-child-kill", "redis-restart", "postgres-down")


# --- the records ---------------------------------------------------------------------------------------


@dataclass
class Record:
    """One request row of the records database after the drain, with its results."""

    request_id: str
    cid: str | None
    status: str
    primary_results: int
    results: int
    error_code: str | None = None
    attempts: int | None = None
    tier: str | None = None
    fallback: bool | None = None  # the rules routed it (the classifier did not answer)
    created: float | None = None  # when the request row was written (UNIX time)
    runs: int | None = None  # primary runs begun over its life (`requests.runs`)
    deliveries: int | None = None  # ... by its last message (`requests.deliveries`)

    @property
    def run_count(self) -> int:
        """Primary runs begun (records without `runs`: the attempt that wrote the result)."""
        return self.runs if self.runs is not None else (self.attempts or 0)


@dataclass
class FaultRun:
    """One injection: when, where, what the fault did."""

    window: str
    fault: str
    repetition: int
    window_start: float
    injected: float
    restored: float
    window_end: float | None = None  # the next window's injection (or the end of the load)
    details: dict[str, Any] = field(default_factory=dict)


def window_of(cid: str | None) -> str | None:
    """The window label a client_request_id was sent in ("w03-redis-restart-r1.00042" -> "w03-...")."""
    if not cid or "." not in cid:
        return None
    return cid.rpartition(".")[0]


# --- accounting -----------------------------------------------------------------------------------------


def serving_at(health: Sequence[tuple[float, bool]], t: float) -> bool:
    """Health at `t`: the last sample at or before it (serving before the first sample)."""
    state = True
    for when, serving in health:
        if when > t:
            break
        state = serving
    return state


@dataclass
class Recovery:
    """When clients were served again after one injection."""

    seconds: float | None  # None: not recovered before the window ended
    pre_ok_per_s: float
    pre_ok_share: float
    first_bad_s: float | None  # first moment after the injection the rule failed
    last_bad_s: float | None
    evaluated_until_s: float
    reason: str = ""


def window_counts(attempts: Sequence[CallRecord], lo: float, hi: float) -> tuple[int, int]:
    """(OK calls, finished calls) that ended in (lo, hi]; "still running" polls are not counted."""
    ok = fin = 0
    for a in attempts:
        if lo < a.end <= hi and not a.is_poll:
            fin += 1
            ok += a.code == "OK"
    return ok, fin


def recovery(
    attempts: Sequence[CallRecord], health: Sequence[tuple[float, bool]], injected: float, end: float,
    pre_s: float, step_s: float = 1.0, window_s: float = WINDOW_S, share: float = SHARE,
) -> Recovery:
    """Seconds from `injected` until the client is served as before and stays so until `end`.

    The rule at time t, over the calls that ended in (t - window_s, t]: OK calls per second at
    least `share` of the pre-fault rate (over the `pre_s` before the injection; minus one standard
    deviation of a count, sqrt(n), so the noise of a steady load is not an outage), the share of
    OK among the finished calls at least `share` of the pre-fault share, and health SERVING. The
    recovery is the first t (on a `step_s` grid from the injection) after which the rule holds at
    every grid point up to `end`; 0 when it never failed; None when it fails at `end`.
    """
    pre_ok, pre_fin = window_counts(attempts, injected - pre_s, injected)
    pre_rate = pre_ok / pre_s if pre_s > 0 else 0.0
    pre_share = pre_ok / pre_fin if pre_fin else 1.0
    expected = pre_rate * window_s
    need_ok = share * expected - math.sqrt(expected)

    def good(t: float) -> tuple[bool, str]:
        ok, fin = window_counts(attempts, t - window_s, t)
        if ok < need_ok:
            return False, f"{ok} OK calls in {window_s:g} s < {need_ok:.1f}"
        if fin and ok / fin < share * pre_share:
            return False, f"{ok}/{fin} calls OK < {share:.0%} of {pre_share:.0%}"
        if not serving_at(health, t):
            return False, "health NOT_SERVING"
        return True, ""

    grid = [injected + k * step_s for k in range(int((end - injected) / step_s) + 1)]
    if not grid:
        return Recovery(0.0, pre_rate, pre_share, None, None, 0.0, "no time after the injection")
    verdicts = [good(t) for t in grid]
    bad = [i for i, (ok, _) in enumerate(verdicts) if not ok]
    horizon = grid[-1] - injected
    if not bad:
        return Recovery(0.0, pre_rate, pre_share, None, None, horizon)
    first_bad, last_bad = bad[0], bad[-1]
    reason = verdicts[last_bad][1]
    if last_bad == len(grid) - 1:
        return Recovery(None, pre_rate, pre_share, grid[first_bad] - injected, grid[last_bad] - injected,
                        horizon, reason)
    return Recovery(grid[last_bad + 1] - injected, pre_rate, pre_share, grid[first_bad] - injected,
                    grid[last_bad] - injected, horizon, reason)


@dataclass
class ClientRequest:
    """One logical request as the client's own log tells it."""

    cid: str
    sent: float  # its first send
    resolved: float | None  # end of the first call that resolved it (`CallRecord.resolves`)
    code: str | None  # that call's status
    final: str | None  # how the client ended it (`Outcome.final`); None: no ending in the log
    last: CallRecord | None  # its last call


def client_requests(window: str, outcomes: Sequence[Outcome], attempts: Sequence[CallRecord],
                    sends: Mapping[str, float] | None = None) -> list[ClientRequest]:
    """Every logical request sent in `window`, from the client's log: its send notes (written
    before its first call), its outcomes and its calls; a request with a send note or calls and
    no outcome was sent and never ended. In send order."""
    ends = {o.client_request_id: o for o in outcomes if window_of(o.client_request_id) == window}
    calls: dict[str, list[CallRecord]] = defaultdict(list)
    for a in attempts:
        if a.client_request_id and window_of(a.client_request_id) == window:
            calls[a.client_request_id].append(a)
    noted = {cid: t for cid, t in (sends or {}).items() if window_of(cid) == window}
    out = []
    for cid in ends.keys() | calls.keys() | noted.keys():
        mine = sorted(calls.get(cid, ()), key=lambda a: a.end)
        first = next((a for a in mine if a.resolves), None)
        outcome = ends.get(cid)
        sent = outcome.sent if outcome else noted.get(cid, min((a.start for a in mine), default=0.0))
        out.append(ClientRequest(cid, sent, first.end if first else None, first.code if first else None,
                                 outcome.final if outcome else None, mine[-1] if mine else None))
    return sorted(out, key=lambda r: r.sent)


def lost_reason(request: ClientRequest, deadline: float) -> str | None:
    """Why the client has no answer to `request` by `deadline` (None: it has one)."""
    if request.resolved is not None:
        return None if request.resolved <= deadline else "late"
    if request.final is None:
        return "unfinished"
    if request.final == GAVE_UP:
        return "gave_up"
    code = request.last.error_code if request.last is not None and request.last.error_code else ""
    return f"final {request.final}" + (f" ({code})" if code else "")


def account_window(
    window: str, records: Sequence[Record], outcomes: Sequence[Outcome], attempts: Sequence[CallRecord],
    grace_s: float = GRACE_S, sends: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Counts of one window (every request whose client_request_id was sent in it).

    As the client sees it (the headline):
    - sent: logical requests in the client's log (`sends`: the campaign's send notes, cid -> time);
    - client_answered: resolved (OK, or a final error of its run the contract allows:
      `CallRecord.resolves`) no later than `grace_s` after the window's last send;
    - lost: sent - client_answered, whatever the records say: it gave up (budget spent), ended on
      another status, never ended, or was answered late; lost_unrecorded: those of them without
      a request row (the front door never recorded them).

    From the records (the second view):
    - accepted: request rows (the front door recorded the request);
    - answered: rows with a primary result (answered_ok: without an error code);
    - stranded: accepted, never marked never-run (`rejected` or `expired`) and without a primary
      result after the drain: nobody can ever read an answer for it;
    - duplicates: requests with more than one primary result row, plus client requests that were
      given more than one request id that was recorded or answered (two requests for one
      client_request_id);
    - reruns: requests whose primary run began more than once (`requests.runs`: a message
      delivered again, a retry, a resend after a retryable error), extra_runs the runs past the
      first; they have one result row each, so duplicates cannot see them;
    - wrong codes: INTERNAL or UNKNOWN statuses the client got, and results stored with the
      `internal` error code.
    """
    recs = [r for r in records if window_of(r.cid) == window]
    outs = [o for o in outcomes if window_of(o.client_request_id) == window]
    atts = [a for a in attempts if window_of(a.client_request_id) == window]
    asked = client_requests(window, outcomes, attempts, sends)
    deadline = max((r.sent for r in asked), default=0.0) + grace_s
    recorded_cids = {r.cid for r in recs}
    lost = [(r, why) for r in asked if (why := lost_reason(r, deadline)) is not None]
    stranded = [r for r in recs if r.primary_results == 0 and r.status not in NEVER_RAN_STATUSES]
    dup_rows = [r for r in recs if r.primary_results > 1]
    # A request id counts once it was recorded or answered: a refusal's x-request-id trailer may
    # name an id whose request was never written (the records database was away).
    recorded = {r.request_id for r in records}
    answered_ids: dict[str, set[str]] = defaultdict(set)
    for a in atts:
        if a.code == "OK" and a.request_id:
            answered_ids[a.client_request_id].add(a.request_id)
    dup_ids = [o for o in outs
               if len({rid for rid in o.request_ids if rid in recorded} | answered_ids[o.client_request_id]) > 1]
    wrong = [a for a in atts if a.code in WRONG_CODES]
    internal_rows = [r for r in recs if r.error_code == "internal"]
    errors = Counter(r.error_code for r in recs if r.primary_results and r.error_code)
    finals = Counter(o.final for o in outs)
    latency = [1000.0 * (o.done - o.sent) for o in outs if o.final == "OK"]
    codes = Counter(a.code for a in atts if not a.is_poll)
    reran = sorted((r for r in recs if r.run_count > 1), key=lambda r: -r.run_count)
    return {
        "window": window,
        "sent": len(asked),
        "client_answered": len(asked) - len(lost),
        "client_ok": finals.get("OK", 0),
        "client_not_ok": len(outs) - finals.get("OK", 0),
        "finals": dict(finals),
        "lost": len(lost),
        "lost_reasons": dict(Counter(why for _, why in lost)),
        "lost_unrecorded": sum(1 for r, _ in lost if r.cid not in recorded_cids),
        "lost_cids": [f"{r.cid}: {why}" + ("" if r.cid in recorded_cids else ", never recorded") for r, why in lost],
        "grace_s": grace_s,
        "accepted": len(recs),
        "answered": sum(1 for r in recs if r.primary_results > 0),
        "answered_ok": sum(1 for r in recs if r.primary_results > 0 and not r.error_code),
        "never_ran": sum(1 for r in recs if r.status in NEVER_RAN_STATUSES),
        "stranded": len(stranded),
        "stranded_ids": [r.request_id for r in stranded],
        "stranded_status": dict(Counter(r.status for r in stranded)),
        "duplicates": len(dup_rows) + len(dup_ids),
        "duplicate_ids": [r.request_id for r in dup_rows] + [o.client_request_id for o in dup_ids],
        "wrong_codes": len(wrong) + len(internal_rows),
        "wrong_examples": [a.as_dict() for a in wrong[:5]],
        "internal_results": [r.request_id for r in internal_rows],
        "error_results": dict(errors),
        "reruns": len(reran),
        "extra_runs": sum(r.run_count - 1 for r in reran),
        "reruns_same_message": sum(1 for r in reran if (r.deliveries or 0) > 1),
        "reruns_resent": sum(1 for r in reran if r.runs is not None and r.deliveries is not None
                             and r.runs > r.deliveries),
        "rerun_ids": [f"{r.request_id}: {r.run_count} runs" for r in reran[:5]],
        "fallbacks": sum(1 for r in recs if r.fallback),
        "last_fallback": max((r.created for r in recs if r.fallback and r.created), default=None),
        "codes": dict(codes),
        "attempts": len([a for a in atts if not a.is_poll]),
        "polls": len([a for a in atts if a.is_poll]),
        "p50_ms": percentile(latency, 50),
        "p95_ms": percentile(latency, 95),
    }


def goals(row: dict[str, Any]) -> dict[str, bool]:
    """The operator's goals for one fault window."""
    rec = row.get("recovery_s")
    return {
        "lost": row["lost"] == 0,
        "stranded": row["stranded"] == 0,
        "duplicates": row["duplicates"] == 0,
        "wrong_codes": row["wrong_codes"] == 0,
        "recovery": rec is not None and rec <= RECOVERY_GOAL_S,
    }


def per_second(attempts: Sequence[CallRecord], start: float, end: float) -> dict[str, list[int]]:
    """OK and failed calls ended per second (polls left out), for the timeline."""
    n = max(1, int(math.ceil(end - start)))
    ok, bad = [0] * n, [0] * n
    for a in attempts:
        if a.is_poll or not start <= a.end < end:
            continue
        i = int(a.end - start)
        (ok if a.code == "OK" else bad)[i] += 1
    return {"ok": ok, "failed": bad}


# --- the load client --------------------------------------------------------------------------------------


class CampaignLoad:
    """The campaign's load on the shared client: open loop at `rate`, each request a good
    client's (`LoadClient.request`), its client_request_id "<window>.<sequence>"; health polled
    every second."""

    def __init__(self, client: LoadClient, picker: Any, rate: float, call_timeout_s: float, budget_s: float,
                 health_path: Path) -> None:
        self.client = client
        self.picker = picker
        self.rate = rate
        self.call_timeout_s = call_timeout_s
        self.budget_s = budget_s
        self.window = "warmup"
        self.outcomes: list[Outcome] = []
        self.health: list[tuple[float, bool]] = []
        self.skipped_sends = 0
        self._health_path = health_path
        self._seq = itertools.count(1)

    async def request(self, query: Any) -> Outcome:
        cid = f"{self.window}.{next(self._seq):05d}"
        # In the journal before the first call: a request that never ends is still counted as sent.
        self.client.note({"type": "send", "client_request_id": cid, "t": time.time()})
        out = await self.client.request(
            query.text, budget_s=self.budget_s, call_timeout_s=self.call_timeout_s,
            client_request_id=cid, tags={"query_tier": query.expected_tier})
        self.outcomes.append(out)
        self.client.note({"type": "outcome", **asdict(out)})
        return out

    async def send_until(self, stop: asyncio.Event) -> None:
        """One new request every 1/rate s until `stop`, then wait for those in flight; a loop that
        fell behind (a stalled event loop) skips the missed sends instead of bursting."""
        sent = await open_loop(lambda _: self.request(self.picker.next()), self.rate, stop=stop,
                               max_lag_periods=5)
        self.skipped_sends += sent.skipped

    async def watch_health(self, stop: asyncio.Event, every_s: float = 1.0) -> None:
        """Health.Check every second; no answer counts as not serving."""
        with self._health_path.open("a") as health_log:
            while not stop.is_set():
                t = time.time()
                serving, status = await self.client.health(timeout=1.0)
                self.health.append((t, serving))
                health_log.write(json.dumps({"t": t, "serving": serving, "status": status}) + "\n")
                try:
                    await asyncio.wait_for(stop.wait(), timeout=max(0.0, every_s - (time.time() - t)))
                except asyncio.TimeoutError:
                    pass

    async def warm_up(self, tries: int = 30) -> list[str]:
        """Sequential requests until one of each expected tier is answered (not counted)."""
        seen: list[str] = []
        for _ in range(tries):
            out = await self.request(self.picker.next())
            seen.append(f"{out.tags['query_tier']}:{out.final}:{out.tier}")
            if out.final != "OK":
                raise RuntimeError(f"warm-up request failed: {out}")
            if {s.split(':')[0] for s in seen} >= {"A", "B", "C"} and len(seen) >= 6:
                break
        return seen


# --- the campaign -----------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Handles:
    """What the faults act on: the lab's stack, a handle on each of its processes."""

    stack: Any  # lab.harness.stack.LabStack

    @property
    def opensearch(self) -> Any:
        """The two-node cluster (`infra.local.opensearch.OpenSearchCluster`), None with tantivy."""
        return self.stack.opensearch

    def node(self, i: int) -> str:
        """The name of the cluster's node `i` (1: cluster manager + data, the workers' URL; 2: data)."""
        return self.opensearch.node_name(i, self.opensearch.name)

    def running_b_request(self, wait_s: float = 5.0) -> bool:
        """Wait (up to `wait_s`) until a tier-B request runs, so a kill lands mid-task."""
        from sqlalchemy import text

        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                with self.stack.store.engine.connect() as conn:
                    n = conn.execute(text(
                        "select count(*) from requests r join routing_decisions d on d.request_id = r.request_id "
                        "where r.status = 'running' and d.tier = 'B'")).scalar()
                if n:
                    return True
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.05)
        return False

    def prepare(self, name: str) -> dict[str, Any]:
        """What a fault needs before its quiet period: for the node loss, the primary copy of the
        tenant's index on the node that will be lost (so the replica must take over)."""
        if name != "opensearch-node-loss" or self.opensearch is None:
            return {}
        from adaptive_rag.knowledge.indexes import tenant_slug

        os_ = self.opensearch
        alias = f"arag-chaos-{tenant_slug(TENANT)}"
        shards = os_.request("GET", f"/_cat/shards/{alias}?format=json", timeout=10)
        primary = [s for s in shards if s.get("prirep") == "p"]
        if primary and primary[0].get("node") == self.node(1):
            # fail the primary on node 1: the replica on node 2 is promoted, node 1 gets a new replica
            os_.request("POST", "/_cluster/reroute", {"commands": [{"cancel": {
                "index": primary[0]["index"], "shard": int(primary[0]["shard"]), "node": self.node(1),
                "allow_primary": True}}]}, timeout=30)
            os_.wait_health("green", 2, 120.0)
        shards = os_.request("GET", f"/_cat/shards/{alias}?format=json", timeout=10)
        return {"shards": [(s.get("prirep"), s.get("node"), s.get("state")) for s in shards]}

    def inject(self, name: str) -> dict[str, Any]:
        """Do fault `name` (inject, hold, restore); returns its details, `restored` included."""
        return getattr(self, "_" + name.replace("-", "_"))(FAULTS[name])

    def _pool_child_kill(self, spec: FaultSpec) -> dict[str, Any]:
        pool = self.stack.pools.pools["B"]
        busy = self.running_b_request()
        children = pool.child_pids()
        if not children:
            return {"restored": time.time(), "note": "pool B had no child process"}
        victim = random.choice(children)
        os.kill(victim, signal.SIGKILL)
        killed = time.time()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # Celery forks a replacement
            now = pool.child_pids()
            if now and victim not in now:
                break
            time.sleep(0.1)
        return {"restored": time.time(), "killed_pid": victim, "b_task_running": busy,
                "replaced_after_s": round(time.time() - killed, 2), "children_after": pool.child_pids()}

    def _worker_kill(self, spec: FaultSpec) -> dict[str, Any]:
        pools = self.stack.pools
        old = pools.pools["B"]
        busy = self.running_b_request()
        os.kill(old.pid, signal.SIGKILL)
        killed = time.time()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and pools.pools["B"].pid == old.pid:
            time.sleep(0.1)
        new = pools.pools["B"]
        ready_note = ""
        try:
            pools.wait_ready("B", timeout=max(1.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - recorded; the campaign goes on
            ready_note = f"not ready: {exc}"[:300]
        return {"restored": time.time(), "killed_pid": old.pid, "new_pid": new.pid, "b_task_running": busy,
                "restarted_after_s": round(time.time() - killed, 2), "supervisor_restarts": pools.restarts.get("B"),
                **({"note": ready_note} if ready_note else {})}

    def _redis_restart(self, spec: FaultSpec) -> dict[str, Any]:
        redis = self.stack.redis
        redis.stop()
        time.sleep(spec.hold_s)
        redis.start()
        return {"restored": time.time(), "port": redis.port}

    def _postgres_down(self, spec: FaultSpec) -> dict[str, Any]:
        postgres = self.stack.postgres
        postgres.stop("immediate")
        time.sleep(spec.hold_s)
        postgres.start()
        return {"restored": time.time(), "port": postgres.port}

    def _opensearch_down(self, spec: FaultSpec) -> dict[str, Any]:
        assert self.opensearch is not None
        self.opensearch.stop_node(1, "fast")
        stopped = time.time()
        time.sleep(max(0.0, spec.hold_s - (time.time() - stopped)))
        started = time.time()
        self.opensearch.start_node(1)
        health = self.opensearch.wait_health("yellow", 2, 180.0)
        return {"restored": time.time(), "down_s": round(started - stopped, 2),
                "node_start_s": round(time.time() - started, 2), "health": health.get("status")}

    def _triton_down(self, spec: FaultSpec) -> dict[str, Any]:
        old = self.stack.triton
        if old is None:
            return {"restored": time.time(), "note": "no Triton in this stack (rules routing)"}
        old.stop()
        time.sleep(spec.hold_s)
        started = time.time()
        new = self.stack.restart_triton()  # on the same port
        return {"restored": time.time(), "port": new.grpc_port, "start_s": round(time.time() - started, 2)}

    def _frontdoor_kill(self, spec: FaultSpec) -> dict[str, Any]:
        killed = self.stack.frontdoor.pid
        started = time.time()
        new = self.stack.restart_frontdoor(signal.SIGKILL)  # on the same address
        return {"restored": time.time(), "killed_pid": killed, "new_pid": new.pid,
                "start_s": round(time.time() - started, 2)}

    def _opensearch_node_loss(self, spec: FaultSpec) -> dict[str, Any]:
        assert self.opensearch is not None
        os_ = self.opensearch
        before = os_.request("GET", "/_cat/shards?format=json", timeout=10)
        os_.stop_node(2, "kill")
        lost = time.time()
        during = None
        time.sleep(3.0)
        try:
            during = os_.request("GET", "/_cluster/health", timeout=10).get("status")
        except Exception as exc:  # noqa: BLE001
            during = f"health failed: {exc}"
        time.sleep(max(0.0, spec.hold_s - (time.time() - lost)))
        os_.start_node(2)
        health = os_.wait_health("green", 2, 180.0)
        return {"restored": time.time(), "lost_node": self.node(2), "health_during": during,
                "health_after": health.get("status"),
                "primary_before": [s.get("node") for s in before
                                   if str(s.get("index", "")).startswith("arag-chaos") and s.get("prirep") == "p"]}


def plan_runs(faults: Sequence[str], repeat: int) -> list[tuple[str, int]]:
    """Every fault once per round, `repeat` rounds (a fault's repetitions spread over the run)."""
    return [(f, r) for r in range(1, repeat + 1) for f in faults]


async def run_campaign(load: CampaignLoad, handles: Any, plan: Sequence[tuple[str, int]],
                       quiet_s: float, observe_s: float, faults_path: Path,
                       faults: Mapping[str, FaultSpec] = FAULTS) -> list[FaultRun]:
    """Each fault of `plan` in its window (quiet load, `handles.inject`, load while observing)
    under one open-loop load; `faults`: the specs the fault names refer to (`handles`: anything
    with `prepare(name)` and `inject(name)`, like `Handles`). The windows, as they ran."""
    stop = asyncio.Event()
    health_stop = asyncio.Event()
    health = asyncio.create_task(load.watch_health(health_stop))
    sender = asyncio.create_task(load.send_until(stop))
    runs: list[FaultRun] = []
    try:
        for i, (fault, rep) in enumerate(plan, start=1):
            label = f"w{i:02d}-{fault}-r{rep}"
            try:
                prepared = await asyncio.to_thread(handles.prepare, fault)
            except Exception as exc:  # noqa: BLE001 - the fault still runs; the report says so
                prepared = {"prepare_error": f"{type(exc).__name__}: {exc}"[:300]}
            load.window = label
            start = time.time()
            log(f"{label}: {quiet_s:g} s quiet, then {faults[fault].title}" + (f" (prepared: {prepared})" if prepared else ""))
            await asyncio.sleep(quiet_s)
            injected = time.time()
            if runs:
                runs[-1].window_end = injected
            try:
                details = await asyncio.to_thread(handles.inject, fault)
            except Exception as exc:  # noqa: BLE001 - recorded; the stack may be broken from here on
                details = {"restored": time.time(), "error": f"{type(exc).__name__}: {exc}"[:500]}
                log(f"{label}: the fault's restore failed: {details['error']}")
            restored = float(details.pop("restored"))
            if prepared:
                details = {"before": prepared, **details}
            run = FaultRun(label, fault, rep, start, injected, restored, details=details)
            runs.append(run)
            with faults_path.open("a") as f:
                f.write(json.dumps(asdict(run)) + "\n")
            log(f"{label}: injected, restored after {restored - injected:.1f} s {details}")
            await asyncio.sleep(observe_s)
        load.window = "tail"
        log(f"tail: {quiet_s:g} s quiet")
        await asyncio.sleep(quiet_s)
        if runs:
            runs[-1].window_end = time.time()
    finally:
        stop.set()
        log(f"load stopping; waiting for the requests in flight (budget {load.budget_s:g} s)")
        await sender
        health_stop.set()
        await health
    return runs


def drain_records(store: Any, timeout_s: float) -> dict[str, Any]:
    """Wait until no request of the campaign is queued or running (at most `timeout_s`)."""
    from sqlalchemy import text

    t0 = time.monotonic()
    left = None
    while time.monotonic() - t0 < timeout_s:
        try:
            with store.engine.connect() as conn:
                left = conn.execute(text("select count(*) from requests where tenant = :t and status in "
                                         "('queued', 'running')"), {"t": TENANT}).scalar()
            if not left:
                break
        except Exception as exc:  # noqa: BLE001
            left = f"error: {exc}"
        time.sleep(2.0)
    return {"waited_s": round(time.monotonic() - t0, 1), "still_in_flight": left}


def read_records(store: Any) -> list[Record]:
    from sqlalchemy import text

    sql = text("""
        select r.request_id, r.client_request_id, r.status, d.tier, d.fallback, r.created_at, r.runs, r.deliveries,
               (select count(*) from results q where q.request_id = r.request_id and q.kind = 'primary') as primary_results,
               (select count(*) from results q where q.request_id = r.request_id) as results,
               (select max(q.error_code) from results q where q.request_id = r.request_id and q.kind = 'primary') as error_code,
               (select max(q.attempts) from results q where q.request_id = r.request_id and q.kind = 'primary') as attempts
        from requests r left join routing_decisions d on d.request_id = r.request_id
        where r.tenant = :t""")
    with store.engine.connect() as conn:
        rows = conn.execute(sql, {"t": TENANT}).mappings().all()
    return [Record(r["request_id"], r["client_request_id"], r["status"], int(r["primary_results"]),
                   int(r["results"]), r["error_code"], r["attempts"], r["tier"],
                   None if r["fallback"] is None else bool(r["fallback"]),
                   r["created_at"].timestamp() if r["created_at"] is not None else None,
                   r["runs"], r["deliveries"]) for r in rows]


# --- stack ------------------------------------------------------------------------------------------------


def drain_and_save_records(store: Any, scratch: Path, run: dict[str, Any], drain_s: float) -> list[Record]:
    """After the faults: wait for the records to drain (noted in `run`), read every request row
    and write them to `scratch/records.jsonl`."""
    log("waiting for the records to drain")
    run["drain"] = drain_records(store, drain_s)
    log(f"drain: {run['drain']}")
    records = read_records(store)
    with (scratch / "records.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(asdict(r)) + "\n")
    return records


def ensure_model_repository(repository: Path, scratch: Path) -> tuple[bool, str]:
    """A classifier version for Triton: the newest in `repository`, or an untrained one bootstrapped
    (`arag model bootstrap`, needs the train extras); none -> the rules route."""
    from adaptive_rag.routing.model_repository import versions
    from adaptive_rag.settings import ClassifierSettings

    model = ClassifierSettings(_env_file=None).classifier_model
    found = versions(repository / model)
    if found:
        meta = repository / model / str(max(found)) / "classifier.json"
        untrained = meta.exists() and json.loads(meta.read_text()).get("untrained")
        return True, (f"version {max(found)} in {repository}"
                      + (" (the untrained bootstrap of `arag model bootstrap`: its routing is noise; what is "
                         "measured is the serving of it)" if untrained else ""))
    proc = subprocess.run([str(Path(sys.executable).parent / "arag"), "model", "bootstrap", "--repository",
                           str(repository)], cwd=REPO, capture_output=True, text=True)
    (scratch / "bootstrap.log").write_text(proc.stdout + proc.stderr)
    found = versions(repository / model)
    if found:
        return True, f"untrained version {max(found)} bootstrapped into {repository} (`arag model bootstrap`)"
    return False, f"no classifier version and `arag model bootstrap` failed ({proc.returncode}): the rules route"


def machine() -> dict[str, Any]:
    from lab.harness.instant_llm import cpu_model, mem_total_gb

    return {"cpus": os.cpu_count(), "cpu": cpu_model(), "mem_gb": round(mem_total_gb() or 0, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def versions_of_servers() -> dict[str, str]:
    from infra.local.servers import PG_BIN, REDIS_SERVER

    out = {}
    for name, cmd in (("redis", [REDIS_SERVER, "--version"]), ("postgres", [str(PG_BIN / "postgres"), "--version"]),
                      ("java", ["java", "-version"])):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
            out[name] = (proc.stdout or proc.stderr).strip().splitlines()[0]
        except Exception as exc:  # noqa: BLE001
            out[name] = f"? ({exc})"
    try:
        from importlib.metadata import version

        out["nvidia-pytriton"] = version("nvidia-pytriton")
    except Exception:  # noqa: BLE001
        out["nvidia-pytriton"] = "not installed"
    return out


def quiet_port() -> int:
    """A free loopback port below the kernel's ephemeral range: `free_port()` ports are handed out
    from that range, so another server started meanwhile (Triton, a node) cannot take this one
    before the process it is meant for binds it."""
    import socket

    for port in random.sample(range(20000, 30000), 200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-29999")


@contextmanager
def started_stack(args: argparse.Namespace, scratch: Path, use_opensearch: bool,
                  info: dict[str, Any]) -> Iterator[Handles]:
    """The lab's stack for the campaign: Redis, PostgreSQL (a commit survives a crash of the
    server, as in production), a two-node OpenSearch cluster when an OpenSearch fault is chosen,
    the instant LLM, Triton, pools A, B, C and shadow under their supervisor, the front door."""
    from lab.harness.stack import Parts, lab_stack
    from workers.pools import RestartPolicy

    has_model, model_note = ensure_model_repository(args.model_repository.resolve(), scratch)
    info["classifier"] = model_note
    parts = Parts(broker="redis", records="postgres", classifier="triton" if has_model else "rules",
                  retriever="opensearch-cluster" if use_opensearch else "tantivy", llm="instant")
    settings: dict[str, Any] = {
        # a port the restarted front door can bind again (see quiet_port)
        "metrics_port": quiet_port(), "concurrency": {"A": 2, "B": 1, "C": 1, "shadow": 1},
        "shadow_share": args.shadow_share,
        # The load repeats a small pool of questions, which the front door's routing cache would
        # answer without Triton: off, so every question is classified (as unique production
        # traffic is) and a Triton outage shows.
        "routing_cache": 0,
        **({"kb_index_prefix": "arag-chaos"} if use_opensearch else {}),
    }
    info["settings"] = dict(settings)
    log("starting the lab stack (Redis, PostgreSQL" + (", a two-node OpenSearch cluster" if use_opensearch else "")
        + ", the instant LLM; Triton; pools A, B, C, shadow; front door; knowledge base)")
    from rich.console import Console

    with lab_stack(scratch / "stack", parts, pools=("A", "B", "C", "shadow"), settings=settings, tenants=(TENANT,),
                   model_repository=args.model_repository.resolve(), llm_latency_ms=args.llm_latency_ms,
                   postgres_durability="server-crash", opensearch_heap=args.opensearch_heap,
                   supervise=RestartPolicy(), supervise_poll_s=0.5, console=Console(width=160)) as stack:
        info.update(stack.facts())
        cluster = stack.opensearch
        if cluster is not None:
            from adaptive_rag.knowledge.indexes import tenant_slug

            alias = f"arag-chaos-{tenant_slug(TENANT)}"
            cluster.request("PUT", f"/{alias}/_settings", {"index": {"number_of_replicas": 1}})
            health = cluster.wait_health("green", 2, 120.0)
            shards = cluster.request("GET", f"/_cat/shards/{alias}?format=json")
            handles = Handles(stack)
            info["opensearch"] = {"nodes": {handles.node(1): "cluster_manager,data (workers' URL)",
                                            handles.node(2): "data"},
                                  "index": alias, "replicas": 1, "health": health.get("status"),
                                  "shards": [(s["prirep"], s["node"], s["state"]) for s in shards]}
        yield Handles(stack)
    info["leftovers"] = stack.leftovers


# --- evidence and report ---------------------------------------------------------------------------------------


def log_files(scratch: Path) -> list[Path]:
    """The stack's logs, workers first (where a request's run is told), then the front door's and
    the servers' (`lab.harness.stack.stack_logs`)."""
    from lab.harness.stack import stack_logs

    return stack_logs(scratch / "stack")


def grep_logs(files: Iterable[Path], needles: Sequence[str], limit: int = 6, width: int = 400,
              skip: str = "is still running") -> list[str]:
    """Lines of the stack's logs that mention any of `needles` (at most `limit`; lines with `skip`,
    a waiting client's polls, left out)."""
    out: list[str] = []
    needles = [n for n in needles if n]
    if not needles:
        return out
    for path in files:
        try:
            with path.open(errors="replace") as f:
                for line in f:
                    if any(n in line for n in needles) and skip not in line:
                        out.append(f"{path.name}: {line.strip()[:width]}")
                        if len(out) >= limit:
                            return out
        except OSError:
            continue
    return out


def lines_between(files: Iterable[Path], t0: float, t1: float, pattern: str, limit: int = 6) -> list[str]:
    """JSON log lines with a timestamp in [t0, t1] whose text matches `pattern`."""
    rx = re.compile(pattern)
    out = []
    for path in files:
        try:
            with path.open(errors="replace") as f:
                for line in f:
                    if not rx.search(line):
                        continue
                    try:
                        ts = datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00")).timestamp()
                    except Exception:  # noqa: BLE001 - not a JSON line with a timestamp
                        continue
                    if t0 <= ts <= t1:
                        out.append(f"{path.name}: {line.strip()[:400]}")
                        if len(out) >= limit:
                            return out
        except OSError:
            continue
    return out


def read_scratch(scratch: Path) -> tuple[dict, list[CallRecord], list[Outcome], list[tuple[float, bool]], list[FaultRun], list[Record]]:
    run = json.loads((scratch / "run.json").read_text())
    attempts = read_jsonl(scratch / "client.jsonl")
    outcomes = [Outcome(**{k: v for k, v in item.items() if k != "type"})
                for item in map(json.loads, (scratch / "client.jsonl").read_text().splitlines())
                if item.get("type") == "outcome"]
    health = [(h["t"], h["serving"]) for h in map(json.loads, (scratch / "health.jsonl").read_text().splitlines())]
    runs = [FaultRun(**json.loads(line)) for line in (scratch / "faults.jsonl").read_text().splitlines() if line.strip()]
    ends = run.get("window_ends", {})
    for r in runs:
        r.window_end = r.window_end or ends.get(r.window)
    records = [Record(**json.loads(line)) for line in (scratch / "records.jsonl").read_text().splitlines()
               if line.strip()] if (scratch / "records.jsonl").exists() else []
    return run, attempts, outcomes, sorted(health), runs, records


def read_sends(scratch: Path) -> dict[str, float]:
    """client_request_id -> when the campaign sent it (the journal's send notes; none in a run
    from before them, whose requests are known by their calls and outcomes)."""
    sends = {}
    for line in (scratch / "client.jsonl").read_text().splitlines():
        if '"send"' in line:
            item = json.loads(line)
            if item.get("type") == "send":
                sends[item["client_request_id"]] = item["t"]
    return sends


def analyse(scratch: Path, quiet_s: float) -> dict[str, Any]:
    run, attempts, outcomes, health, runs, records = read_scratch(scratch)
    sends = read_sends(scratch)
    grace_s = run["config"].get("grace", GRACE_S)
    files = log_files(scratch)
    rows, failures = [], []
    order = {fr.window: i for i, fr in enumerate(runs)}
    order["tail"] = len(runs)
    for i, fr in enumerate(runs):
        end = fr.window_end or max((a.end for a in attempts), default=fr.restored)
        row = account_window(fr.window, records, outcomes, attempts, grace_s, sends)
        # the calls of requests sent from this window on: an earlier fault's stragglers are its own
        mine = [a for a in attempts if order.get(window_of(a.client_request_id) or "", -1) >= i]
        rec = recovery(mine, health, fr.injected, end, pre_s=quiet_s)
        lf = row.pop("last_fallback")
        row["last_fallback_after_restore_s"] = None if lf is None else lf - fr.restored
        row.update(fault=fr.fault, repetition=fr.repetition, injected_s=fr.injected - run["t0"],
                   outage_s=fr.restored - fr.injected, recovery_s=rec.seconds, recovery=asdict(rec),
                   details=fr.details, window_end_s=end - run["t0"])
        row["goals"] = goals(row)
        if "error" in fr.details:  # the fault itself failed: nothing was measured
            row["goals"]["injected"] = False
        row["pass"] = all(row["goals"].values())
        rows.append(row)
        for goal, ok in row["goals"].items():
            if ok:
                continue
            evidence: list[str] = []
            if goal == "lost":
                evidence += [f"client request {c}" for c in row["lost_cids"][:5]]
                cids = [c.split(":")[0] for c in row["lost_cids"][:3]]
                evidence += [f"request {r.request_id} of {r.cid}: status {r.status}, {r.run_count} runs"
                             for r in records if r.cid in cids]
                evidence += grep_logs(files, cids, limit=6)
            elif goal == "stranded":
                evidence += [f"request {rid}: status {s}" for rid, s in
                             [(r.request_id, r.status) for r in records if r.request_id in row["stranded_ids"]][:5]]
                evidence += grep_logs(files, row["stranded_ids"][:3], limit=8)
            elif goal == "duplicates":
                evidence += [f"duplicate: {d}" for d in row["duplicate_ids"][:5]]
                evidence += grep_logs(files, row["duplicate_ids"][:3], limit=6)
            elif goal == "wrong_codes":
                for ex in row["wrong_examples"][:3]:
                    evidence.append(f"client: {ex['method']} {ex['client_request_id']} -> {ex['code']}: "
                                    f"{ex.get('detail', '')}")
                rids = [ex["request_id"] for ex in row["wrong_examples"] if ex.get("request_id")] + row["internal_results"]
                evidence += grep_logs(files, rids[:3], limit=6)
                evidence += lines_between(files, fr.injected - 1, end, r"rpc_failed|Traceback|task\.failure", limit=4)
            elif goal == "injected":
                evidence.append(f"the fault could not be injected or restored: {fr.details['error'][:300]}")
            elif goal == "recovery":
                evidence.append(f"recovery rule last failed {rec.last_bad_s} s after the injection: {rec.reason} "
                                f"(evaluated until {rec.evaluated_until_s:.0f} s; pre-fault {rec.pre_ok_per_s:.2f} OK/s, "
                                f"{rec.pre_ok_share:.0%} OK)")
                bad_codes = Counter(a.code for a in mine if fr.injected <= a.end <= end and a.code != "OK"
                                    and not a.is_poll)
                evidence.append(f"non-OK statuses in the window: {dict(bad_codes)}")
                if rec.last_bad_s is not None:  # the calls that kept the rule failing last
                    t_bad = fr.injected + rec.last_bad_s
                    last = [a for a in mine if t_bad - WINDOW_S < a.end <= t_bad and a.code != "OK" and not a.is_poll]
                    for a in last[-3:]:
                        evidence.append(f"client: {a.method} {a.client_request_id} sent {a.start - fr.injected:.1f} s after the "
                                        f"injection -> {a.code} at {a.end - fr.injected:.1f} s: {a.detail[:160]}")
                evidence += lines_between(files, fr.injected, end, r'"level": "(error|warning)"', limit=3)
            failures.append({"window": fr.window, "fault": fr.fault, "repetition": fr.repetition, "goal": goal,
                             "evidence": evidence})
    per_fault: dict[str, dict[str, Any]] = {}
    for row in rows:
        agg = per_fault.setdefault(row["fault"], {k: 0 for k in SUMMED} | {"recovery_s": [], "passes": 0,
                                                                          "windows": 0})
        for k in SUMMED:
            agg[k] += row[k]
        agg["recovery_s"].append(row["recovery_s"])
        agg["passes"] += row["pass"]
        agg["windows"] += 1
    warm = account_window("warmup", records, outcomes, attempts, grace_s, sends)
    tail = account_window("tail", records, outcomes, attempts, grace_s, sends)
    t0 = run["t0"]
    t_end = max([a.end for a in attempts] + [t0 + 1])
    series = per_second(attempts, t0, t_end)
    return {"run": run, "rows": rows, "per_fault": per_fault, "failures": failures, "warmup": warm, "tail": tail,
            "series": series, "health_down": health_intervals(health, t0), "totals": totals(rows, tail)}


# The counts of a window that add up over windows (per fault, and in the totals).
SUMMED = ("sent", "client_answered", "client_ok", "lost", "lost_unrecorded", "accepted", "answered", "answered_ok",
          "never_ran", "stranded", "duplicates", "wrong_codes", "reruns", "extra_runs")


def totals(rows: Sequence[dict[str, Any]], tail: dict[str, Any]) -> dict[str, int]:
    return {k: sum(r[k] for r in rows) + tail[k] for k in SUMMED}


def health_intervals(health: Sequence[tuple[float, bool]], t0: float) -> list[tuple[float, float]]:
    out, start = [], None
    for t, serving in health:
        if not serving and start is None:
            start = t
        elif serving and start is not None:
            out.append((start - t0, t - t0))
            start = None
    if start is not None and health:
        out.append((start - t0, health[-1][0] - t0))
    return out


def plot_timeline(result: dict[str, Any], path: Path, faults: Mapping[str, FaultSpec] = FAULTS,
                  title: str = "Fault campaign") -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return False
    series = result["series"]
    xs = list(range(len(series["ok"])))
    fig, ax = plt.subplots(figsize=(max(12, len(xs) / 60), 4.8))
    ax.bar(xs, series["ok"], width=1.0, color="tab:green", label="OK calls / s", align="edge")
    ax.bar(xs, series["failed"], width=1.0, bottom=series["ok"], color="tab:red", label="failed calls / s",
           align="edge")
    top = max([o + f for o, f in zip(series["ok"], series["failed"])] + [1])
    colours = plt.get_cmap("tab10")
    names = list(faults)
    for row in result["rows"]:
        c = colours(names.index(row["fault"]) % 10)
        x0 = row["injected_s"]
        ax.axvspan(x0, x0 + max(row["outage_s"], 1.0), color=c, alpha=0.35, lw=0)
        rec = row["recovery_s"]
        ax.axvspan(x0, x0 + (rec if rec is not None else row["window_end_s"] - x0), color=c, alpha=0.12, lw=0)
        ax.text(x0 + 0.5, top * 1.04, f"{faults[row['fault']].title} #{row['repetition']}", rotation=90,
                fontsize=7, va="bottom", ha="left")
    for a, b in result["health_down"]:
        ax.plot([a, b], [-top * 0.04, -top * 0.04], color="black", lw=4, solid_capstyle="butt")
    ax.set_ylim(-top * 0.08, top * 2.1)
    ax.set_xlim(0, len(xs))
    ax.set_xlabel("seconds since the load started (dark: fault until restored; light: until recovered; "
                  "black bar: health NOT_SERVING)")
    ax.set_ylabel("calls ended per second")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"{title}: client calls per second (Answer + GetResult, 'still running' polls left out)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _f(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _mark(ok: bool) -> str:
    return "pass" if ok else "**FAIL**"


def write_report(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(result, indent=1, default=str))
    has_plot = plot_timeline(result, out / "timeline.png")
    run = result["run"]
    m = run["machine"]
    L = ["# Fault campaign: reliability of the serving stack under one fault at a time", ""]
    grace = run["config"].get("grace", GRACE_S)
    L += [f"Goals (operator): **0 lost as the client sees it (every request answered within {grace:g} s of its "
          "window's last send), 0 stranded in the records, 0 duplicates, 0 INTERNAL/UNKNOWN for a dependency "
          f"outage, recovery <= {RECOVERY_GOAL_S:g} s for every fault, every repetition.** Second runs of a "
          "request are reported, not a goal.", "", "```", run["command"], "```", "",
          f"Source: `lab/experiments/chaos.py` (`make chaos`). Started {run['started']}, finished {run.get('finished', '-')}. "
          f"Scratch (every process's log, the client log, the records): `{run['scratch']}`.", ""]
    rows = result["rows"]
    passed = sum(r["pass"] for r in rows)
    L += ["## Result", "", f"**{passed} of {len(rows)} fault windows met every goal.** Totals over the fault windows "
          "and the tail: " + ", ".join(f"{k} {v}" for k, v in result["totals"].items()) + ".", ""]
    L += ["As the client sees it (its own log) and from the records (the second view):", "",
          "| window | fault | rep | outage s | sent | answered in time | lost (why) | never recorded of them | "
          "accepted | answered rows (OK / error) | never ran | stranded | duplicates | run twice or more (extra runs) | "
          "wrong codes | recovery s | p50 ms | p95 ms | lost | stranded | dup | codes | recovery |",
          "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | "
          "---: | ---: | --- | --- | --- | --- | --- |"]
    for r in rows:
        g = r["goals"]
        why = ", ".join(f"{k} {v}" for k, v in r["lost_reasons"].items())
        L.append(f"| {r['window']} | {FAULTS[r['fault']].title} | {r['repetition']} | {_f(r['outage_s'], 1)} | "
                 f"{r['sent']} | {r['client_answered']} | {r['lost']}{f' ({why})' if why else ''} | "
                 f"{r['lost_unrecorded']} | {r['accepted']} | {r['answered']} ({r['answered_ok']} / "
                 f"{r['answered'] - r['answered_ok']}) | {r['never_ran']} | {r['stranded']} | {r['duplicates']} | "
                 f"{r['reruns']} ({r['extra_runs']}) | {r['wrong_codes']} | "
                 f"{_f(r['recovery_s'], 0) if r['recovery_s'] is not None else '> ' + _f(r['recovery']['evaluated_until_s'], 0)} | "
                 f"{_f(r['p50_ms'])} | {_f(r['p95_ms'])} | {_mark(g['lost'])} | {_mark(g['stranded'])} | "
                 f"{_mark(g['duplicates'])} | {_mark(g['wrong_codes'])} | {_mark(g['recovery'])}"
                 f"{' (**fault not injected**)' if 'injected' in g else ''} |")
    L += ["", "Per fault (all repetitions):", "",
          "| fault | windows | all goals met | sent | answered in time | lost | never recorded | accepted | "
          "answered OK | stranded | duplicates | wrong codes | run twice or more | extra runs | recovery s (each) |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, agg in result["per_fault"].items():
        recs = ", ".join(_f(x, 0) if x is not None else "not recovered" for x in agg["recovery_s"])
        L.append(f"| {FAULTS[name].title} | {agg['windows']} | {agg['passes']} | {agg['sent']} | "
                 f"{agg['client_answered']} | {agg['lost']} | {agg['lost_unrecorded']} | {agg['accepted']} | "
                 f"{agg['answered_ok']} | {agg['stranded']} | {agg['duplicates']} | {agg['wrong_codes']} | "
                 f"{agg['reruns']} | {agg['extra_runs']} | {recs} |")
    L += ["", "Status codes the client saw per window (every Answer / GetResult except 'still running' polls):", ""]
    for r in rows:
        L.append(f"- {r['window']}: {r['codes']}; client outcomes {r['finals']}"
                 + (f"; routed by the rules fallback {r['fallbacks']} (the last "
                    f"{_f(r['last_fallback_after_restore_s'], 1)} s after the restore)" if r.get("fallbacks") else "")
                 + (f"; error results stored {r['error_results']}" if r["error_results"] else "")
                 + (f"; run twice or more {r['reruns']} (its last message began more than one run, "
                    f"a redelivery or a retry: {r['reruns_same_message']}; run again after a resend {r['reruns_resent']}; e.g. {', '.join(r['rerun_ids'][:3])})"
                    if r["reruns"] else "")
                 + (f"; lost: {', '.join(r['lost_cids'][:3])}" if r["lost"] else ""))
    if has_plot:
        L += ["", "![timeline](timeline.png)", ""]
    L += ["## Failures and their evidence", ""]
    if not result["failures"]:
        L.append("None: every goal was met in every window.")
    for f in result["failures"]:
        L.append(f"- **{f['window']}** ({FAULTS[f['fault']].title}, repetition {f['repetition']}): goal "
                 f"`{f['goal']}` missed.")
        for e in f["evidence"]:
            L.append(f"    - `{e.replace('`', chr(39))}`")
    L.append("")
    if run.get("findings"):
        L += ["## Findings and fixes", ""] + [f"- {x}" for x in run["findings"]] + [""]
    L += ["## Faults", "", "| fault | what is done | details of each injection |", "| --- | --- | --- |"]
    for name in dict.fromkeys(r["fault"] for r in rows):
        det = "; ".join(f"#{r['repetition']}: {json.dumps(r['details'], default=str)[:300]}" for r in rows if r["fault"] == name)
        L.append(f"| {FAULTS[name].title} | {FAULTS[name].action} | {det} |")
    cfg = run["config"]
    L += ["", "## How it is measured", "",
          f"- Load: asyncio gRPC client (generated stubs), open loop at {cfg['rate']:g} new requests/s, the load "
          f"test's demo query pools (`lab/loadtest/queries.py`) in the mix {cfg['mix']} of expected tiers; tenant "
          f"`{TENANT}` with the demo help centre as its knowledge base. Per-call deadline {cfg['call_timeout']:g} s, "
          f"per-request budget {cfg['budget']:g} s. A good client: UNAVAILABLE / RESOURCE_EXHAUSTED / CANCELLED -> "
          "the same client_request_id again after the `retry-after` trailer (1 s without one, +0-20 % jitter); "
          "DEADLINE_EXCEEDED -> GetResult(request id of the `x-request-id` trailer) every second (a 'never ran' "
          "answer sends the Answer again); INTERNAL, UNKNOWN and other statuses end the request.",
          f"- Windows: each fault gets {cfg['quiet']:g} s of quiet load before it (its pre-fault baseline), the "
          f"injection (the part stopped, held away, started again), then {cfg['observe']:g} s of load after the "
          "restore. A request belongs to the window it was sent in (its client_request_id starts with the "
          "window's name); the recovery of a fault is evaluated until the next fault's injection, over the "
          "calls of the requests sent from its window on (an earlier fault's stragglers are left to that fault).",
          f"- **As the client sees it** (the headline, from the load client's own log of every call and every "
          "logical request): **sent** = logical requests (client_request_ids) of the window; **answered in time** = "
          "resolved by a call that ended with OK or with a final error of the request's run that the contract "
          "allows (`DEADLINE_EXCEEDED` `answer_time_limit`, `INTERNAL` `answer_failed`: docs/operating.md, status "
          f"codes; read from the `x-error-code` trailer), at most {grace:g} s (the grace, `--grace`) after the "
          "window's last send; **lost** = sent - answered in time, whatever the records say: the client gave up "
          "(its budget spent), ended on another status, never ended, or was answered late; **never recorded** = "
          "lost requests without a request row. **client OK** = the client got OK eventually; **wrong codes** = "
          "INTERNAL or UNKNOWN statuses (plus results stored with the `internal` error code); p50/p95 = first "
          "send to OK, over the requests answered.",
          "- From the records (the second view; PostgreSQL, read after the load stopped, every client request "
          f"ended and no request was queued or running, at most {cfg['drain_s']:g} s of waiting): **accepted** = "
          "a request row exists; **answered rows** = it has a primary result row (OK or an error result); "
          "**stranded** = accepted, not marked never-run (`rejected` or `expired`) and without a primary result "
          "row; **duplicates** = more than one primary result row for a request, or more than one request id "
          "given to one client_request_id; **run twice or more** = requests whose primary run began more than "
          "once (`requests.runs`, counted by the worker as it begins a run: a message delivered again after its "
          "worker died, a retry, a resend after a retryable error), with the **extra runs** past the first; "
          "the unique result key keeps one row per request, so duplicates cannot see these.",
          f"- **Recovery**: seconds from the injection until the rule holds and keeps holding until the window "
          f"ends; the rule at time t over the calls that ended in (t - {WINDOW_S:g} s, t]: OK calls/s at least "
          f"{SHARE:.0%} of the pre-fault rate (the {cfg['quiet']:g} s before the injection) minus one standard "
          f"deviation of the count (sqrt n), the OK share of finished calls at least {SHARE:.0%} of the pre-fault "
          "share, and the front door's health (polled every second) SERVING. 'Still running' GetResult polls are "
          "not counted. 0 = the rule never failed.",
          "", "## Setup", ""]
    stack = run.get("stack_info", {})
    for k, v in stack.get("stack", {}).items():
        L.append(f"- {k}: {v}")
    L += [f"- classifier: {stack.get('classifier')}",
          f"- worker pools: concurrency {stack.get('concurrency')}, prefetch {stack.get('prefetch')}, supervised "
          f"(`WorkerPools.start_supervisor`); Celery visibility timeout {stack.get('visibility_timeout_s')} s, task "
          f"retries {stack.get('task_max_retries')} (backoff from {stack.get('task_retry_backoff_s')} s); "
          f"UNAVAILABLE retry-after {stack.get('unavailable_retry_s')} s; shadow share {cfg['shadow_share']}",
          f"- LLM: the instant OpenAI-compatible endpoint (`lab/harness/instant_llm.py`), {cfg['llm_latency_ms']:g} ms "
          "per completion, no CPU: a **measurement device** standing for a remote inference endpoint, so the "
          "figures are the stack's own behaviour, not a model's."]
    if stack.get("opensearch"):
        L.append(f"- OpenSearch: {json.dumps(stack['opensearch'])}")
    L.append(f"- server versions: {stack.get('versions')}")
    for note in run.get("notes", []):
        L.append(f"- {note}")
    L += ["", "## Machine", "",
          f"- {m['cpus']} CPUs ({m['cpu']}), {m['mem_gb']} GB RAM, {m['platform']}, Python {m['python']}; load "
          f"average at the start {m['load_average']}, at the end {run.get('load_average_end')}. Every process of "
          "the stack, the OpenSearch nodes, the LLM stand-in and the load client share these cores with other "
          "jobs (an LLM benchmark ran beside this one).", ""]
    if run.get("error"):
        L += ["## Run error", "", f"`{run['error']}`", ""]
    (out / "report.md").write_text("\n".join(L) + "\n")


# --- main ----------------------------------------------------------------------------------------------------


FINDINGS_FILE = "findings.md"  # optional, beside the report: notes a human added (kept on --render)


class StartFailed(Exception):
    """The stack did not come up (raised before any load was sent)."""


def campaign(args: argparse.Namespace, plan: Sequence[tuple[str, int]], scratch: Path, use_opensearch: bool,
             run: dict[str, Any]) -> int:
    """Start the stack, run the load and the faults, read the records; the exit code."""
    from lab.loadtest.queries import QueryPicker, build_pools, parse_mix
    from services.demo.local import Interrupted

    code = 0
    started = False
    try:
        with started_stack(args, scratch, use_opensearch, run["stack_info"]) as handles:
            started = True
            running = handles.stack
            if running.triton is None:
                run["notes"].append("Triton was not started (no classifier version): the front door routed with the rules")
            key = running.api_key(TENANT)
            picker = QueryPicker(build_pools("demo"), parse_mix(args.mix), seed=args.seed)

            async def go() -> list[FaultRun]:
                client = LoadClient(running.address, key, journal=scratch / "client.jsonl", reconnect_fast=True)
                load = CampaignLoad(client, picker, args.rate, args.call_timeout, args.budget, scratch / "health.jsonl")
                try:
                    seen = await load.warm_up()
                    log(f"warm-up answered: {seen}")
                    run["t0"] = time.time()
                    return await run_campaign(load, handles, plan, args.quiet, args.observe, scratch / "faults.jsonl")
                finally:
                    run["skipped_sends"] = load.skipped_sends
                    await client.close()

            runs = asyncio.run(go())
            run["window_ends"] = {r.window: r.window_end for r in runs}
            records = drain_and_save_records(running.store, scratch, run, args.drain_s)
            log(f"{len(records)} request rows read; stopping the stack")
    except (KeyboardInterrupt, Interrupted) as exc:
        run["error"] = f"interrupted ({type(exc).__name__})"
        code = 130
    except Exception as exc:  # noqa: BLE001 - write what was measured
        import traceback

        if not started:
            raise StartFailed(f"{type(exc).__name__}: {exc}") from exc
        run["error"] = f"{type(exc).__name__}: {exc}"
        (scratch / "error.txt").write_text(traceback.format_exc())
        log(f"failed: {run['error']}")
        code = 1
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.experiments.chaos", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"one repetition of {', '.join(QUICK_FAULTS)} (~4 min), report in var/chaos/quick/report")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions of every fault (default 2; --quick 1)")
    parser.add_argument("--faults", default=None, help=f"comma-separated, from {', '.join(FAULTS)} (default all)")
    parser.add_argument("--rate", type=float, default=5.0, help="new requests per second (open loop)")
    parser.add_argument("--mix", default="A=60,B=30,C=10", help="expected-tier mix of the queries")
    parser.add_argument("--llm-latency-ms", type=float, default=80.0, help="the instant LLM's wait per completion")
    parser.add_argument("--quiet", type=float, default=15.0, help="s of load before each fault (its baseline)")
    parser.add_argument("--observe", type=float, default=30.0, help="s of load after each restore")
    parser.add_argument("--call-timeout", type=float, default=15.0, help="gRPC deadline of one call (s)")
    parser.add_argument("--budget", type=float, default=90.0, help="s a client spends on one request at most")
    parser.add_argument("--drain-s", type=float, default=120.0, help="s to wait for queued/running requests at the end")
    parser.add_argument("--grace", type=float, default=GRACE_S,
                        help="s after a window's last send by which each of its requests must be answered (the "
                             "recovery goal's 30 s by default); answered later counts as lost")
    parser.add_argument("--shadow-share", type=float, default=0.1, help="ARAG_SHADOW_SHARE of the stack")
    parser.add_argument("--opensearch-heap", default="512m", help="heap of each OpenSearch node")
    parser.add_argument("--model-repository", type=Path, default=REPO / "var" / "chaos" / "model_repository",
                        help="classifier versions Triton serves (an untrained one is bootstrapped when empty)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="report folder (default reports/reliability; "
                                                                "--quick: var/chaos/quick/report)")
    parser.add_argument("--scratch", type=Path, default=None, help="default var/chaos/<run>")
    parser.add_argument("--render", type=Path, default=None, help="only write the report from this scratch folder")
    args = parser.parse_args(argv)
    out = (args.out or (REPO / "var/chaos/quick/report" if args.quick else REPO / "reports/reliability")).resolve()
    if args.render:
        scratch = args.render.resolve()
        run = json.loads((scratch / "run.json").read_text())
        result = analyse(scratch, run["config"]["quiet"])
        findings = out / FINDINGS_FILE
        if findings.exists():
            result["run"]["findings"] = [line[2:] for line in findings.read_text().splitlines() if line.startswith("- ")]
        write_report(result, out)
        log(f"report: {out / 'report.md'}")
        return 0
    faults = [f.strip() for f in (args.faults.split(",") if args.faults else
                                  (QUICK_FAULTS if args.quick else FAULTS)) if f.strip()]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; choose from {', '.join(FAULTS)}")
    repeat = args.repeat or (1 if args.quick else 2)
    plan = plan_runs(faults, repeat)
    use_opensearch = any(FAULTS[f].opensearch for f in faults)
    started = datetime.now(timezone.utc)
    scratch = (args.scratch or REPO / "var" / "chaos" / ("quick" if args.quick else f"full-{started:%Y%m%d-%H%M%S}")).resolve()
    if scratch.exists() and args.quick:
        import shutil

        shutil.rmtree(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    for name in ("client.jsonl", "health.jsonl", "faults.jsonl", "records.jsonl"):
        (scratch / name).unlink(missing_ok=True)
    random.seed(args.seed)
    config = {k: getattr(args, k) for k in ("rate", "mix", "llm_latency_ms", "quiet", "observe", "call_timeout",
                                            "budget", "drain_s", "grace", "shadow_share", "seed")}
    config.update(faults=faults, repeat=repeat)
    run: dict[str, Any] = {
        "command": shlex.join([".venv/bin/python", "-m", "lab.experiments.chaos", *(sys.argv[1:] if argv is None else argv)]),
        "started": started.isoformat(timespec="seconds"), "machine": machine(), "config": config,
        "scratch": str(scratch.relative_to(REPO) if scratch.is_relative_to(REPO) else scratch), "notes": [],
        "stack_info": {"versions": versions_of_servers()},
    }
    if not use_opensearch:
        run["notes"].append("no OpenSearch fault selected: the tenant's knowledge base is the embedded tantivy index")
    est = len(plan) * (args.quiet + args.observe + 20) / 60
    log(f"{len(plan)} fault windows ({', '.join(faults)} x {repeat}), about {est:.0f} min + start-up; scratch {scratch}")
    from services.demo.local import install_stop_signals

    install_stop_signals()
    code = 0
    for attempt in (1, 2):
        try:
            code = campaign(args, plan, scratch, use_opensearch, run)
            break
        except StartFailed as exc:  # a port taken between choosing and binding it, mostly
            run["notes"].append(f"stack start attempt {attempt} failed: {exc.__cause__}"[:500])
            log(f"the stack did not start ({exc.__cause__}); {'trying again' if attempt == 1 else 'giving up'}")
            if attempt == 2:
                run["error"] = f"the stack did not start: {exc.__cause__}"[:1000]
                code = 1
    run["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    run["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    run.setdefault("t0", time.time())
    (scratch / "run.json").write_text(json.dumps(run, indent=1, default=str))
    if (scratch / "faults.jsonl").exists() and (scratch / "client.jsonl").exists():
        result = analyse(scratch, args.quiet)
        findings = out / FINDINGS_FILE
        if findings.exists():
            result["run"]["findings"] = [line[2:] for line in findings.read_text().splitlines() if line.startswith("- ")]
        write_report(result, out)
        for row in result["rows"]:
            log(f"{row['window']}: sent {row['sent']}, answered in time {row['client_answered']}, lost {row['lost']} "
                f"{row['lost_reasons'] or ''} (never recorded {row['lost_unrecorded']}); records: accepted "
                f"{row['accepted']}, answered {row['answered']} (OK {row['answered_ok']}), stranded {row['stranded']}, "
                f"run twice or more {row['reruns']} (+{row['extra_runs']} runs), dup {row['duplicates']}, wrong "
                f"{row['wrong_codes']}, recovery {row['recovery_s']} s -> {'pass' if row['pass'] else 'FAIL'}")
        log(f"report: {out / 'report.md'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
