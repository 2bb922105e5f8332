"""Past one machine, with real processes on the harness's own hosts (`infra.local.hosts`: network
namespaces on a bridge): Redis, PostgreSQL and the instant LLM on host0; two front-door replicas
(host1, host2) behind nginx's `grpc_pass` on `lb` with active gRPC health checks
(`infra.local.balancer`); tier-A worker pools on host3 and host4. Clients know one address, the
balancer's, and behave as a good client does (`lab.harness.load_client.LoadClient.request`: a
failed call is sent again with the same client_request_id).

- the balancer spreads Answers over both replicas;
- one replica SIGKILLed under steady load: every request the client sent resolves (OK), the
  time to recover is measured and printed;
- a worker host killed whole (every process SIGKILLed, its link cut) under steady load while
  host4's pools keep serving, on the product's defaults (a 15-minute visibility timeout): every
  accepted request is answered within 30 s of the kill. The messages the dead host had reserved
  come back when its consumer lease runs out (`workers.redis_broker`); a message Redis handed it
  in the instant it died, which it never recorded, is published again by a front door that finds
  the broker holds it nowhere (`adaptive_rag.serving.upkeep.republish_lost`).

Run: `.venv/bin/python -m pytest -q -s tests/integration/test_multihost.py` (as root: namespaces).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import text

from lab.harness.load_client import LoadClient, Outcome, open_loop
from lab.harness.stack import Hosts, LabStack, lab_stack
from tests.support.pools import POOL_PARTS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]

QUERY = "capital of France"  # the rules: tier A, no retrieval, the instant LLM
LLM_LATENCY_MS = 400.0  # each run holds a worker this long: kills find work in flight
BUDGET_S = 60.0  # a client's budget per request (resends included)
CALL_TIMEOUT_S = 30.0
RECOVERY_TARGET_S = 30.0


@dataclass
class Stack:
    lab: LabStack
    key: str

    def client(self) -> LoadClient:
        return LoadClient(self.lab.address, self.key, reconnect_fast=True)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("multihost")
    settings = dict(
        llm_api="completions", llm_max_retries=0, router="rules", concurrency={"A": 3},
        time_limit_s={"A": 5.0, "B": 5.0, "C": 5.0}, time_limit_grace_s=2.0,
        tenant_rate_per_s=0, tenant_slots={"A": 0, "B": 0, "C": 0},
    )
    hosts = Hosts(pools={"host3": ("A",), "host4": ("A",)})
    with lab_stack(workdir, POOL_PARTS, hosts=hosts, settings=settings, tenants=("acme",), dotenv=False,
                   llm_latency_ms=LLM_LATENCY_MS) as lab:
        yield Stack(lab, lab.api_key("acme"))


async def steady_load(stack: Stack, rate: float, seconds: float, fault_at_s: float, fault,
                      burst: int) -> tuple[list[Outcome], float, LoadClient]:
    """`rate` requests/s for `seconds`; at `fault_at_s` a burst of `burst` more requests (so the
    fault finds calls in flight), then `fault()` (in a thread) 0.2 s later. Returns every
    request's outcome, the fault's time (UNIX) and the client (its call records)."""
    client = stack.client()
    await client.ready()

    async def one(_: int) -> Outcome:
        return await client.request(QUERY, budget_s=BUDGET_S, call_timeout_s=CALL_TIMEOUT_S)

    fault_time: list[float] = []

    async def inject() -> list[Outcome]:
        await asyncio.sleep(fault_at_s)
        extra = [asyncio.create_task(one(-1)) for _ in range(burst)]
        await asyncio.sleep(0.2)
        fault_time.append(time.time())
        await asyncio.to_thread(fault)
        return list(await asyncio.gather(*extra))

    loop, extra = await asyncio.gather(open_loop(one, rate, count=int(rate * seconds)), inject())
    await client.close()
    return [*loop.results, *extra], fault_time[0], client


def unresolved(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.final != "OK"]


def test_the_balancer_spreads_answers_over_both_replicas(stack):
    since = time.time()

    async def run() -> list[Outcome]:
        client = stack.client()
        try:
            return list(await asyncio.gather(*(client.request(QUERY, budget_s=BUDGET_S, call_timeout_s=CALL_TIMEOUT_S)
                                               for _ in range(20))))
        finally:
            await client.close()

    outcomes = asyncio.run(run())
    assert not unresolved(outcomes)
    deadline = time.monotonic() + 5  # nginx logs a call once it has ended on its side too
    while len(used := stack.lab.balancer.upstreams_used(since)) < 20 and time.monotonic() < deadline:
        time.sleep(0.1)
    replicas = [d.listen for d in stack.lab.frontdoors.values()]
    counts = {r: used.count(r) for r in replicas}
    assert sum(counts.values()) >= 20 and all(c >= 5 for c in counts.values()), counts


def test_a_replica_killed_under_load_loses_no_request(stack, capsys):
    lab = stack.lab
    killed = lab.frontdoors["host1"].listen
    outcomes, killed_at, client = asyncio.run(
        steady_load(stack, rate=6.0, seconds=12.0, fault_at_s=4.0, fault=lambda: lab.kill_frontdoor("host1"), burst=6))
    lost = unresolved(outcomes)
    assert not lost, [(o.final, o.attempts) for o in lost]
    retried = [o for o in outcomes if o.attempts > 1]
    failed_calls = [c for c in client.records if c.code != "OK"]
    # the kill found calls in flight on that replica: they failed, were sent again, and resolved
    assert retried and all(c.code in ("UNAVAILABLE", "CANCELLED", "DEADLINE_EXCEEDED") for c in failed_calls), \
        {c.code for c in failed_calls}
    recovery_s = max(o.done for o in retried) - killed_at
    assert recovery_s <= RECOVERY_TARGET_S
    # the watcher took the dead replica out of the upstream
    watcher = lab.balancer.watcher
    marked = [t for t, down in watcher.changes if killed in down and t >= killed_at]
    assert marked, watcher.changes
    after = [c for c in client.records if c.start > killed_at + 1.0]
    assert after and all(c.ok for c in after), {c.code for c in after}
    with capsys.disabled():
        print(f"\nreplica killed: {len(outcomes)} requests, 0 lost; {len(retried)} resent "
              f"({len(failed_calls)} failed calls: {sorted({c.code for c in failed_calls})}); every affected "
              f"request answered {recovery_s:.1f} s after the kill; health check marked it down "
              f"{marked[0] - killed_at:.2f} s after the kill")
    # back for the next test: a new replica on the same address, taken up by the watcher
    lab.start_frontdoor_on("host1")
    deadline = time.monotonic() + 30
    while killed in watcher.down and time.monotonic() < deadline:
        time.sleep(0.2)
    assert killed not in watcher.down


def test_a_worker_host_killed_whole_loses_no_accepted_request(stack, capsys):
    lab = stack.lab
    started = time.time()
    outcomes, killed_at, client = asyncio.run(
        steady_load(stack, rate=5.0, seconds=14.0, fault_at_s=4.0, fault=lambda: lab.kill_host("host3"), burst=6))
    lost = unresolved(outcomes)
    if lost:  # what the records say of each, for the report
        with lab.store.engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT request_id, status, deliveries, runs, created_at, enqueued_at FROM requests "
                "WHERE request_id = ANY(:ids)"), {"ids": [r for o in lost for r in o.request_ids]}).all()
        pytest.fail(f"{len(lost)} of {len(outcomes)} requests lost (killed at {killed_at:.3f}): "
                    f"{[(o.final, o.attempts, o.request_ids) for o in lost]}; records: {rows}")
    assert not lab.host("host3").pids()
    request_ids = sorted({r for o in outcomes for r in o.request_ids})
    with lab.store.engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT r.request_id, r.status, r.deliveries, s.worker, s.created_at FROM requests r "
            "LEFT JOIN results s ON s.request_id = r.request_id "
            "WHERE r.created_at >= to_timestamp(:since)"), {"since": started}).all()
    by_id = {row.request_id: row for row in rows}
    # every request the front doors accepted in the run has its result
    assert set(request_ids) <= set(by_id) and all(row.worker for row in rows), \
        [row for row in rows if not row.worker]
    # the dead host's tasks ran again on host4, delivered a second time
    redelivered = [row for row in rows if row.deliveries > 1]
    assert redelivered and all("@host4/" in row.worker for row in redelivered), redelivered
    slowest = max(o.done for o in outcomes if set(o.request_ids) & {r.request_id for r in redelivered}) - killed_at
    last = max(o.done for o in outcomes) - killed_at  # every request of the run, the lost one's included
    assert last <= RECOVERY_TARGET_S, f"the last request was answered {last:.1f} s after the kill"
    logs = "".join(path.read_text(errors="replace") for path in lab.logs())
    reclaimed, republished = logs.count("lease ran out"), logs.count("lost_messages_republished")
    after = [row for row in rows if row.created_at.timestamp() > killed_at + 0.5]
    assert after and all("@host4/" in row.worker for row in after)
    with capsys.disabled():
        print(f"\nworker host killed whole: {len(outcomes)} requests, 0 lost; {len(redelivered)} tasks of the dead "
              f"host delivered again and answered by host4, the last {slowest:.1f} s after the kill "
              f"(sweeps that reclaimed a dead consumer's messages: {reclaimed}; front-door republishes of "
              f"messages lost in transit: {republished})")
