"""A fault campaign past one machine: with front doors behind a load balancer, worker pools on two
hosts, the broker under Sentinel and the records on a promotable replica, does any request a client
sent go unanswered, or get two different answers, when one part (or one whole host) fails, and how
long until clients are served again?

    .venv/bin/python -m lab.experiments.multihost_chaos                # full run (~30 min): reports/reliability_multihost/
    .venv/bin/python -m lab.experiments.multihost_chaos --quick        # ~10 min, one repetition: var/multihost_chaos/quick/report/
    .venv/bin/python -m lab.experiments.multihost_chaos --render DIR   # the report again from a run's scratch DIR

Needs root (network namespaces). The stack is the lab's one stack over the harness's own hosts
(`lab.harness.stack.lab_stack(hosts=...)`, `infra.local.hosts`: network namespaces on a private
bridge): Redis under Sentinel (a primary, a replica, three Sentinels, quorum 2), PostgreSQL with a
streaming replica (the services on a multi-host URL, `target_session_attrs=read-write`) and the
instant LLM (`lab/harness/instant_llm.py`, a measurement device using no CPU) on host0; two
front-door replicas on host1 and host2 behind nginx (`grpc_pass`, with the active gRPC health
watcher of `infra.local.balancer`) on `lb`; worker pools A, B and C on host3 and on host4. The
rules route (no Triton past one machine). The client, in the root namespace, knows only the
balancer's address.

The load and the accounting are the single-host campaign's (`lab.experiments.chaos`, imported):
the same good client at a steady open-loop rate, one window per fault with a quiet period
before it, lost = sent minus answered as the client sees it within the grace, stranded /
duplicates / runs per request from the records, the same recovery rule, p50/p95 latency. What
this file adds is the faults past one machine and one more check: **answers delivered twice with
different content** (`delivered_twice_different`: a client request whose OK replies name more
than one (request id, answer digest), or whose delivered answer differs from the result the
records keep for that request, which a later GetResult or resend would deliver).

Faults, each repeated `--repeat` times (the two repetitions hit different replicas / hosts):
one front-door replica SIGKILLed and started again; one worker host killed whole (every process
SIGKILLed, its link cut; it comes back empty, new pools started there after `--host-down`
seconds); one worker host partitioned for 30 s (link down, then up; its processes live on);
the Redis primary SIGKILLed (Sentinel fails over; the old primary then rejoins as a replica);
the PostgreSQL primary SIGKILLed, the lab noticing it as a failover manager would (probes every
second, `--pg-probes` failed in a row) and promoting the replica (`pg_ctl promote`), the old
primary rebuilt as the new replica; the load balancer restarted.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import shlex
import shutil
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.experiments import chaos
from lab.experiments.chaos import _f, _mark
from lab.experiments.chaos import (
    RECOVERY_GOAL_S, TENANT, CampaignLoad, FaultSpec, Record, analyse, drain_and_save_records, log, machine,
    plan_runs, run_campaign, window_of,
)
from lab.harness.load_client import CallRecord, LoadClient

REPO = Path(__file__).resolve().parents[2]
FRONTDOOR_HOSTS = ("host1", "host2")
WORKER_HOSTS = ("host3", "host4")
PARTITION_S = 30.0
# Sentinel's down-after-milliseconds here: "several seconds" as Sentinel advises for production
# (its own default is 30 s); counted in the recovery like everything else after the kill.
SENTINEL_DOWN_AFTER_MS = 5000
PG_PROBE_EVERY_S = 1.0
PG_PROBES = 3  # failed probes in a row before the promotion (the failover manager's detection)

FAULTS: dict[str, FaultSpec] = {f.name: f for f in (
    FaultSpec("frontdoor-kill", "front-door replica SIGKILL",
              "SIGKILL to one front-door replica (host1 in repetition 1, host2 in 2); a new one started on its "
              "address 5 s later (as a supervisor would); the balancer's health watcher takes it back",
              hold_s=5.0, dependency=False),
    FaultSpec("host-kill", "worker host killed whole",
              "every process on one worker host SIGKILLed at once and its link cut (host3, then host4); after "
              "the hold the link is set up and new pools start there (a replaced machine)", hold_s=20.0),
    FaultSpec("host-partition", "worker host partitioned 30 s",
              "one worker host's link down for 30 s, then up; its processes stay alive (host4, then host3)",
              hold_s=PARTITION_S),
    FaultSpec("redis-failover", "Redis primary SIGKILL (Sentinel)",
              f"SIGKILL to the Redis primary; the Sentinels (down-after-milliseconds {SENTINEL_DOWN_AFTER_MS}, "
              "quorum 2 of 3) promote the replica; the old primary then started again (it rejoins as a replica)"),
    FaultSpec("postgres-failover", "PostgreSQL primary SIGKILL (promotion)",
              f"SIGKILL to the PostgreSQL primary; probed every {PG_PROBE_EVERY_S:g} s, {PG_PROBES} failed probes "
              "in a row and the replica is promoted (`pg_ctl promote`: what Patroni does); the old primary's "
              "place rebuilt as a streaming replica of the new one (`pg_basebackup`)"),
    FaultSpec("balancer-restart", "load balancer restart",
              "nginx stopped (SIGTERM, its fast shutdown: open connections dropped) and started again on the "
              "same address", dependency=False),
)}


# --- accounting: answers delivered twice ---------------------------------------------------------------


def delivered_twice_different(window: str, attempts: Sequence[CallRecord],
                              stored: Mapping[str, str]) -> list[str]:
    """Client requests of `window` that were given two different answers: their OK replies name
    more than one (request id, answer digest), or a delivered answer differs from the digest of
    the result the records keep for that request id (`stored`: request id -> digest), which a
    later GetResult or resend with the same client_request_id would deliver. Replies without a
    digest (a log from before it) are left out. Sorted client_request_ids."""
    delivered: dict[str, set[tuple[str | None, str]]] = defaultdict(set)
    for a in attempts:
        if a.code == "OK" and a.answer_digest is not None and a.client_request_id \
                and window_of(a.client_request_id) == window:
            delivered[a.client_request_id].add((a.request_id, a.answer_digest))
    bad = []
    for cid, seen in delivered.items():
        differs_from_records = any(rid in stored and stored[rid] != digest for rid, digest in seen)
        if len(seen) > 1 or differs_from_records:
            bad.append(cid)
    return sorted(bad)


def runs_per_request(window: str, records: Sequence[Record]) -> dict[str, Any]:
    """Primary runs begun per accepted request of `window` (`requests.runs`): how many requests
    ran 0, 1, 2, ... times, the mean and the most."""
    runs = [r.run_count for r in records if window_of(r.cid) == window]
    return {"histogram": {str(k): v for k, v in sorted(Counter(runs).items())},
            "mean": round(sum(runs) / len(runs), 3) if runs else None, "max": max(runs, default=None)}


def slowest_ms(window: str, outcomes: Sequence[Any]) -> float | None:
    """The slowest request of `window` the client got OK for, first send to OK (ms): what the
    requests caught by the fault (run again elsewhere, resent) cost at most."""
    return max((1000.0 * (o.done - o.sent) for o in outcomes
                if o.final == "OK" and window_of(o.client_request_id) == window), default=None)


def window_goals(row: Mapping[str, Any]) -> dict[str, bool]:
    """The campaign's goals for one window: 0 lost as the client sees it, 0 answers delivered
    twice with different content, recovery within the goal; and the single-host campaign's other
    goals (0 stranded, 0 duplicates, 0 INTERNAL/UNKNOWN)."""
    rec = row.get("recovery_s")
    return {"lost": row["lost"] == 0, "twice_different": row["twice_different"] == 0,
            "recovery": rec is not None and rec <= RECOVERY_GOAL_S, "stranded": row["stranded"] == 0,
            "duplicates": row["duplicates"] == 0, "wrong_codes": row["wrong_codes"] == 0}


def stored_digests(store: Any) -> dict[str, str]:
    """request id -> answer digest of its primary result, for the campaign's tenant."""
    from sqlalchemy import text

    from lab.harness.load_client import answer_digest

    with store.engine.connect() as conn:
        rows = conn.execute(text("select q.request_id, q.answer from results q join requests r on "
                                 "r.request_id = q.request_id where r.tenant = :t and q.kind = 'primary'"),
                            {"t": TENANT}).all()
    return {rid: answer_digest(answer) for rid, answer in rows}


def account(scratch: Path, quiet_s: float) -> dict[str, Any]:
    """The single-host campaign's analysis of the scratch folder (`chaos.analyse`), each window
    with its answers delivered twice, its runs per request and this campaign's goals."""
    result = analyse(scratch, quiet_s)
    attempts = chaos.read_jsonl(scratch / "client.jsonl")
    _, _, outcomes, _, _, records = chaos.read_scratch(scratch)
    stored = json.loads((scratch / "answers.json").read_text()) if (scratch / "answers.json").exists() else {}
    for row in [*result["rows"], result["tail"]]:
        twice = delivered_twice_different(row["window"], attempts, stored)
        row["twice_different"] = len(twice)
        row["twice_different_cids"] = twice[:10]
        row["runs_per_request"] = runs_per_request(row["window"], records)
        row["max_ms"] = slowest_ms(row["window"], outcomes)
    for row in result["rows"]:
        row["goals"] = window_goals(row)
        if "error" in row["details"]:
            row["goals"]["injected"] = False
        row["pass"] = all(row["goals"].values())
    per_fault: dict[str, dict[str, Any]] = {}
    for row in result["rows"]:
        agg = per_fault.setdefault(row["fault"], {"windows": 0, "passes": 0, "sent": 0, "lost": 0,
                                                  "twice_different": 0, "accepted": 0, "extra_runs": 0,
                                                  "reruns": 0, "stranded": 0, "recovery_s": []})
        agg["windows"] += 1
        agg["passes"] += row["pass"]
        for k in ("sent", "lost", "twice_different", "accepted", "extra_runs", "reruns", "stranded"):
            agg[k] += row[k]
        agg["recovery_s"].append(row["recovery_s"])
    result["per_fault"] = per_fault
    result["totals"]["twice_different"] = sum(r["twice_different"] for r in [*result["rows"], result["tail"]])
    return result


# --- the faults ------------------------------------------------------------------------------------------


def _pg_answers(server: Any) -> bool:
    import psycopg

    try:
        psycopg.connect(server.admin_url, connect_timeout=1).close()
        return True
    except Exception:  # noqa: BLE001 - down, refused, timed out: not answering
        return False


@dataclass
class MultiHostHandles:
    """What the faults act on: the lab's stack over hosts. `prepare` and `inject` are what
    `chaos.run_campaign` calls."""

    stack: Any  # lab.harness.stack.LabStack
    done: Counter = field(default_factory=Counter)
    # the burst before each fault: `burst` tier-B questions sent on the campaign's load (its event
    # loop), so the fault finds work in flight on every worker host and replica
    burst: int = 0
    load: CampaignLoad | None = None
    loop: asyncio.AbstractEventLoop | None = None
    picker: Any = None  # a QueryPicker of tier-B questions
    sent: list[Any] = field(default_factory=list)  # the burst's futures

    def prepare(self, name: str) -> dict[str, Any]:
        return {}

    def send_burst(self, lead_s: float = 0.3) -> int:
        """`burst` requests on the load's loop (counted in the current window), then `lead_s` for
        them to reach the workers; how many."""
        if not self.burst or self.load is None or self.loop is None:
            return 0
        for _ in range(self.burst):
            self.sent.append(asyncio.run_coroutine_threadsafe(self.load.request(self.picker.next()), self.loop))
        time.sleep(lead_s)
        return self.burst

    def inject(self, name: str) -> dict[str, Any]:
        self.done[name] += 1
        burst = self.send_burst()
        details = getattr(self, "_" + name.replace("-", "_"))(FAULTS[name], self.done[name])
        return {**details, **({"burst": burst} if burst else {})}

    @staticmethod
    def _pick(hosts: Sequence[str], n: int) -> str:
        return hosts[(n - 1) % len(hosts)]

    def _wait_watcher_up(self, address: str, timeout_s: float = 30.0) -> float | None:
        """Seconds until the balancer's health watcher lists `address` as up again (None: not
        within `timeout_s`)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            watcher = self.stack.balancer.watcher
            if watcher is not None and address not in watcher.down:
                return time.monotonic() - started
            time.sleep(0.1)
        return None

    def _frontdoor_kill(self, spec: FaultSpec, n: int) -> dict[str, Any]:
        host = self._pick(FRONTDOOR_HOSTS, n)
        door = self.stack.kill_frontdoor(host)
        killed = time.time()
        watcher = self.stack.balancer.watcher
        time.sleep(spec.hold_s)
        marked = [t - killed for t, down in (watcher.changes if watcher else []) if t >= killed and door.listen in down]
        new = self.stack.start_frontdoor_on(host)
        back = self._wait_watcher_up(new.listen)
        return {"restored": time.time(), "host": host, "killed_pid": door.pid, "new_pid": new.pid,
                "marked_down_after_s": round(marked[0], 2) if marked else None,
                "back_in_upstream_after_start_s": None if back is None else round(back, 2)}

    def _host_kill(self, spec: FaultSpec, n: int) -> dict[str, Any]:
        host = self._pick(WORKER_HOSTS, n)
        killed = self.stack.kill_host(host)
        at = time.time()
        time.sleep(spec.hold_s)
        started = time.time()
        self.stack.start_pools_on(host)
        return {"restored": time.time(), "host": host, "killed_processes": len(killed),
                "down_s": round(started - at, 1), "pools_start_s": round(time.time() - started, 1)}

    def _host_partition(self, spec: FaultSpec, n: int) -> dict[str, Any]:
        host_name = self._pick(tuple(reversed(WORKER_HOSTS)), n)
        host = self.stack.host(host_name)
        host.cut()
        cut = time.time()
        time.sleep(spec.hold_s)
        host.reconnect()
        pools = self.stack.host_pools[host_name].pools
        return {"restored": time.time(), "host": host_name, "cut_s": round(time.time() - cut, 1),
                "pools_alive_after": {name: pool.process.poll() is None for name, pool in pools.items()}}

    def _redis_failover(self, spec: FaultSpec, n: int) -> dict[str, Any]:
        sentinel = self.stack.sentinel
        old = sentinel.primary()
        old.kill()
        killed = time.monotonic()
        failover_s = sentinel.wait_for_failover(old.port, timeout_s=60.0)
        restored = time.time()
        new = sentinel.primary()
        rejoin = time.monotonic()
        old.start()
        sentinel.wait_settled(60.0)
        return {"restored": restored, "old_primary_port": old.port, "new_primary_port": new.port,
                "down_after_ms": sentinel.down_after_ms, "failover_s": round(failover_s, 2),
                "old_rejoined_as": old.role(), "rejoin_s": round(time.monotonic() - rejoin, 1),
                "since_kill_s": round(time.monotonic() - killed, 1)}

    def _postgres_failover(self, spec: FaultSpec, n: int) -> dict[str, Any]:
        from infra.local.failover import LocalPostgresReplica

        stack = self.stack
        primary, replica = stack.postgres, stack.postgres_replica
        lag_note = ""
        try:
            replica.wait_caught_up(5.0)
        except Exception as exc:  # noqa: BLE001 - a replica behind is part of what is measured
            lag_note = f"replica not caught up before the kill: {exc}"[:200]
        primary.kill()
        killed = time.monotonic()
        # the failover manager's detection: probes every second, PG_PROBES failures in a row
        failures = 0
        while failures < PG_PROBES:
            probe = time.monotonic()
            failures = 0 if _pg_answers(primary) else failures + 1
            time.sleep(max(0.0, PG_PROBE_EVERY_S - (time.monotonic() - probe)))
        detected_s = time.monotonic() - killed
        promote_s = replica.promote()
        restored = time.time()
        # the old primary's place: a new streaming replica of the promoted one, on the same port
        # (the services' multi-host URL lists both ports), as Patroni re-initialises a lost member
        rebuild = time.monotonic()
        fresh = LocalPostgresReplica(replica, port=primary.port,
                                     log=stack.workdir / "logs" / f"postgres-replica-{n + 1}.log")
        if primary.host is not None:
            fresh.on_host(primary.host)
        try:
            fresh.start()
        except Exception:
            fresh.close()
            raise
        stack._started.callback(fresh.close)
        stack.postgres, stack.postgres_replica = replica, fresh
        return {"restored": restored, "old_primary_port": primary.port, "new_primary_port": replica.port,
                "detection_s": round(detected_s, 2), "probes": f"{PG_PROBES} x {PG_PROBE_EVERY_S:g} s",
                "promote_s": round(promote_s, 2), "rebuild_s": round(time.monotonic() - rebuild, 1),
                **({"note": lag_note} if lag_note else {})}

    def _balancer_restart(self, spec: FaultSpec, n: int) -> dict[str, Any]:
        balancer = self.stack.balancer
        old = balancer.pid
        started = time.monotonic()
        balancer.restart(mode="fast")
        return {"restored": time.time(), "old_pid": old, "new_pid": balancer.pid,
                "restart_s": round(time.monotonic() - started, 2)}


# --- the stack ---------------------------------------------------------------------------------------------


@contextmanager
def started_stack(args: argparse.Namespace, scratch: Path, info: dict[str, Any]) -> Iterator[MultiHostHandles]:
    """The lab's stack over hosts for the campaign (see the module docstring)."""
    from rich.console import Console

    from lab.harness.stack import TIER_POOLS, Hosts, Parts, lab_stack

    parts = Parts(broker="redis-sentinel", records="postgres-replica", classifier="rules", llm="instant")
    hosts = Hosts(servers="host0", frontdoors=FRONTDOOR_HOSTS, pools={h: TIER_POOLS for h in WORKER_HOSTS},
                  balancer="lb")
    # Only what differs from the product's defaults (no .env read): the rules route, as no Triton
    # runs past one machine here.
    settings: dict[str, Any] = {"router": "rules"}
    if args.visibility_timeout is not None:
        settings["visibility_timeout_s"] = args.visibility_timeout
    info["settings"] = dict(settings)
    log("starting the stack over hosts (Redis + Sentinel, PostgreSQL + replica, the instant LLM on host0; front "
        "doors on host1, host2; nginx on lb; pools A, B, C on host3, host4)")
    with lab_stack(scratch / "stack", parts, hosts=hosts, settings=settings, tenants=(TENANT,),
                   llm_latency_ms=args.llm_latency_ms, postgres_durability="server-crash",
                   sentinel_down_after_ms=SENTINEL_DOWN_AFTER_MS, dotenv=False, console=Console(width=160)) as stack:
        info.update(stack.facts())
        info["hosts"] = {h.name: h.address for h in stack.network.hosts.values()}
        info["sentinel_down_after_ms"] = stack.sentinel.down_after_ms
        info["database_url"] = stack.settings.library.database_url \
            if hasattr(stack.settings.library, "database_url") else None
        info["redis_url"] = stack.sentinel.url
        # the settings that decide what a dead or cut-off worker host costs
        info["recovery_settings"] = {
            "visibility_timeout_s": stack.settings.workers.visibility_timeout_s,
            "consumer_lease_s": getattr(stack.settings.workers, "consumer_lease_s", None),
            "lost_after_s": getattr(stack.settings.frontdoor, "lost_after_s", None),
            "lost_check_every_s": getattr(stack.settings.frontdoor, "lost_check_every_s", None),
            "unpublished_after_s": getattr(stack.settings.frontdoor, "unpublished_after_s", None),
            "queued_expiry_s": getattr(stack.settings.frontdoor, "queued_expiry_s", None)}
        yield MultiHostHandles(stack, burst=args.burst)
    info["leftovers"] = stack.leftovers


# --- the report ----------------------------------------------------------------------------------------------

RAW_FILES = ("client.jsonl", "records.jsonl", "faults.jsonl", "health.jsonl", "answers.json", "run.json")


def copy_raw(scratch: Path, out: Path) -> None:
    """The raw records the figures recompute from (`--render` over the report folder), gzipped."""
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name in RAW_FILES:
        src = scratch / name
        if src.exists():
            with src.open("rb") as f_in, gzip.open(raw / f"{name}.gz", "wb") as f_out:
                shutil.copyfileobj(f_in, f_out)


def unpack_raw(folder: Path, into: Path) -> Path:
    """A scratch folder from a report's `raw/` (the reverse of `copy_raw`)."""
    into.mkdir(parents=True, exist_ok=True)
    for name in RAW_FILES:
        src = folder / "raw" / f"{name}.gz"
        if src.exists():
            with gzip.open(src, "rb") as f_in, (into / name).open("wb") as f_out:
                shutil.copyfileobj(f_in, f_out)
    return into


def headline(result: Mapping[str, Any]) -> str:
    """One line: windows that met every goal, lost, delivered twice, slowest recovery."""
    rows = result["rows"]
    counted = [*rows, result["tail"]]
    recs = [r["recovery_s"] for r in rows]
    slowest = "not recovered in one window" if any(r is None for r in recs) else f"slowest recovery {max(recs, default=0):.0f} s"
    return (f"{sum(r['pass'] for r in rows)} of {len(rows)} windows met every goal; "
            f"{sum(r['lost'] for r in counted)} lost, {sum(r['twice_different'] for r in counted)} delivered twice "
            f"differently of {sum(r['sent'] for r in counted):,} sent; {slowest}")


def write_report(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(result, indent=1, default=str))
    has_plot = chaos.plot_timeline(result, out / "timeline.png", FAULTS, "Multi-host fault campaign")
    run, rows = result["run"], result["rows"]
    cfg, m, info = run["config"], run["machine"], run.get("stack_info", {})
    L = ["# Multi-host fault campaign: one part or one host at a time, under steady load through the balancer", "",
         f"Goals per fault and repetition: **0 lost as the client sees it** (answered within {cfg['grace']:g} s of "
         f"its window's last send), **0 answers delivered twice with different content**, **recovery <= "
         f"{RECOVERY_GOAL_S:g} s** (detection included); also shown and checked: 0 stranded, 0 duplicates, 0 "
         "INTERNAL/UNKNOWN. Runs per request are reported.", "", "```", run["command"], "```", "",
         f"Source: `lab/experiments/multihost_chaos.py` (load, windows, accounting and recovery rule imported from "
         f"`lab/experiments/chaos.py`). Started {run['started']}, finished {run.get('finished', '-')}; load average "
         f"at the start {m['load_average']}, at the end {run.get('load_average_end')} ({m['cpus']} CPUs, shared "
         "with other jobs).", "", "## Result", "", f"**{headline(result)}.**", "",
         "| window | fault | rep | outage s | sent | answered in time | lost (why) | delivered twice differently | "
         "runs per request (histogram) | stranded | duplicates | wrong codes | recovery s | p50 ms | p95 ms | slowest ms | "
         "goals |",
         "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        why = ", ".join(f"{k} {v}" for k, v in r["lost_reasons"].items())
        rpr = r["runs_per_request"]
        missed = [g for g, ok in r["goals"].items() if not ok]
        rec = _f(r["recovery_s"], 0) if r["recovery_s"] is not None else "> " + _f(r["recovery"]["evaluated_until_s"], 0)
        L.append(f"| {r['window']} | {FAULTS[r['fault']].title} | {r['repetition']} | {_f(r['outage_s'], 1)} | "
                 f"{r['sent']} | {r['client_answered']} | {r['lost']}{f' ({why})' if why else ''} | "
                 f"{r['twice_different']} | mean {_f(rpr['mean'], 3) if rpr['mean'] is not None else '-'} "
                 f"({', '.join(f'{k}: {v}' for k, v in rpr['histogram'].items())}) | {r['stranded']} | "
                 f"{r['duplicates']} | {r['wrong_codes']} | {rec} | {_f(r['p50_ms'])} | {_f(r['p95_ms'])} | "
                 f"{_f(r.get('max_ms'))} | "
                 f"{'pass' if r['pass'] else '**FAIL** ' + ', '.join(missed)} |")
    tail = result["tail"]
    L += ["", f"After the last window (tail, {cfg['quiet']:g} s of quiet load): sent {tail['sent']}, lost "
          f"{tail['lost']}, delivered twice differently {tail['twice_different']}.", "",
          "Per fault (all repetitions):", "",
          "| fault | windows | all goals met | sent | lost | delivered twice differently | accepted | run more than "
          "once (extra runs) | stranded | recovery s (each) |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for name, agg in result["per_fault"].items():
        recs = ", ".join(_f(x, 0) if x is not None else "not recovered" for x in agg["recovery_s"])
        L.append(f"| {FAULTS[name].title} | {agg['windows']} | {agg['passes']} | {agg['sent']} | {agg['lost']} | "
                 f"{agg['twice_different']} | {agg['accepted']} | {agg['reruns']} ({agg['extra_runs']}) | "
                 f"{agg['stranded']} | {recs} |")
    L += ["", "Status codes per window (Answer and GetResult, 'still running' polls left out):", ""]
    for r in rows:
        L.append(f"- {r['window']}: {r['codes']}; client outcomes {r['finals']}"
                 + (f"; lost: {', '.join(r['lost_cids'][:4])}" if r["lost"] else "")
                 + (f"; stranded {r['stranded_status']}" if r["stranded"] else "")
                 + (f"; run more than once: {', '.join(r['rerun_ids'][:3])}" if r["reruns"] else "")
                 + (f"; delivered twice differently: {', '.join(r['twice_different_cids'][:3])}" if r["twice_different"] else ""))
    if has_plot:
        L += ["", "![timeline](timeline.png)", ""]
    L += ["## Failures and their evidence", ""]
    fails = [(r, g) for r in rows for g, ok in r["goals"].items() if not ok]
    evidence = {(f["window"], f["goal"]): f["evidence"] for f in result.get("failures", [])}
    if not fails:
        L.append("None: every goal was met in every window.")
    for r, g in fails:
        L.append(f"- **{r['window']}** ({FAULTS[r['fault']].title}, repetition {r['repetition']}): goal `{g}` missed.")
        extra = evidence.get((r["window"], g), [])
        if g == "twice_different":
            extra = [f"client request {c}" for c in r["twice_different_cids"][:5]]
        for e in extra[:8]:
            L.append(f"    - `{str(e).replace('`', chr(39))[:400]}`")
    L += ["", "## Faults", "", "| fault | what is done | details of each injection |", "| --- | --- | --- |"]
    for name in dict.fromkeys(r["fault"] for r in rows):
        det = "; ".join(f"#{r['repetition']}: {json.dumps(r['details'], default=str)[:320]}" for r in rows
                        if r["fault"] == name)
        L.append(f"| {FAULTS[name].title} | {FAULTS[name].action} | {det} |")
    L += ["", "## Setup", ""]
    for k, v in info.get("stack", {}).items():
        L.append(f"- {k}: {v}")
    L += [f"- hosts (network namespaces on a private bridge): {info.get('hosts')}",
          f"- broker: `{info.get('redis_url')}` (down-after-milliseconds {info.get('sentinel_down_after_ms')}, quorum 2 "
          "of 3 Sentinels, all on host0); records: PostgreSQL primary + streaming replica on host0, the services on "
          "the multi-host URL with `target_session_attrs=read-write`",
          f"- worker pools per host: concurrency {info.get('concurrency')}, prefetch {info.get('prefetch')}; task "
          f"retries {info.get('task_max_retries')}; what a dead or cut-off host costs is set by "
          f"{json.dumps(info.get('recovery_settings', {}))}",
          f"- settings given (over the product's defaults): {json.dumps(info.get('settings', {}))}"]
    for note in run.get("notes", []):
        L.append(f"- {note}")
    L += ["", "## How it is measured", "",
          f"- Load: the single-host campaign's client (`chaos.CampaignLoad`), open loop at {cfg['rate']:g} new "
          f"requests/s, the demo query pools in the mix {cfg['mix']}, per-call deadline {cfg['call_timeout']:g} s, "
          f"per-request budget {cfg['budget']:g} s; a good client (UNAVAILABLE / RESOURCE_EXHAUSTED / CANCELLED -> the "
          "same client_request_id again after `retry-after`; DEADLINE_EXCEEDED -> GetResult). It talks only to "
          "the balancer's address; health (through the balancer) polled every second.",
          f"- Windows: {cfg['quiet']:g} s of quiet load, {cfg.get('burst', 0)} more tier-B requests 0.3 s before "
          "the fault (so it finds work in flight on every host; counted in the window), the fault (held as the "
          "table says, then restored), "
          f"{cfg['observe']:g} s of load after the restore; a request belongs to the window it was sent in.",
          f"- **lost** = sent - answered in time (OK, or a final error of its run the contract allows, at most "
          f"{cfg['grace']:g} s after the window's last send), from the client's own log; **delivered twice "
          "differently** = client requests whose OK replies carry more than one (request id, answer digest), or "
          "whose delivered answer's digest differs from the primary result the records keep for that request "
          "(what a GetResult or a resend would return); the instant LLM answers every question with the same "
          "text, so with it this check sees a second request id or a result rewritten after delivery, not a "
          "reworded answer; **runs per request** = primary runs begun per accepted request (`requests.runs`), "
          "with a histogram; **stranded**, **duplicates**, **wrong codes**, **recovery** and p50/p95 exactly as "
          "in reports/reliability/ (recovery: seconds from the injection until OK calls per second and the OK "
          "share are back to 95 % of the pre-fault level and health SERVING, and stay so until the next window).",
          f"- The records are read after the load stopped and nothing is queued or running (at most "
          f"{cfg['drain_s']:g} s of waiting: {run.get('drain')}).", ""]
    if run.get("error"):
        L += ["## Run error", "", f"`{run['error']}`", ""]
    (out / "report.md").write_text("\n".join(L) + "\n")
    write_readme(result, out)


FINDINGS_FILE = "findings.md"  # optional, beside the report: what a human read in the run (kept on --render)


def write_readme(result: Mapping[str, Any], out: Path) -> None:
    """README.md: the question, the headline with each fault's figures, how it was run, the records."""
    run, rows = result["run"], result["rows"]
    cfg, m = run["config"], run["machine"]
    info = run.get("stack_info", {})
    L = ["# Fault campaign past one machine", "",
         "**Question.** With two front-door replicas behind the gRPC load balancer, worker pools on two hosts, "
         "Redis under Sentinel and PostgreSQL with a promotable replica, does any request a client sent go "
         "unanswered, or get two different answers, when a replica, a whole worker host, the link of one, the "
         "Redis primary, the PostgreSQL primary or the balancer fails under steady load, and how long until "
         "clients are served again?", "",
         f"**Answer.** **{headline(result)}** ({len(FAULTS)} faults; {cfg['repeat']} repetition(s) each; goal "
         f"per window: 0 lost as the client sees it, 0 delivered twice differently, recovery <= "
         f"{RECOVERY_GOAL_S:g} s). Per fault:", ""]
    for name, agg in result["per_fault"].items():
        recs = ", ".join(_f(x, 0) + " s" if x is not None else "not recovered" for x in agg["recovery_s"])
        p50 = [r["p50_ms"] for r in rows if r["fault"] == name]
        p95 = [r["p95_ms"] for r in rows if r["fault"] == name]
        slow = [r.get("max_ms") for r in rows if r["fault"] == name]
        L.append(f"- {FAULTS[name].title}: {agg['passes']} of {agg['windows']} windows met every goal; "
                 f"{agg['lost']} lost of {agg['sent']} sent, {agg['twice_different']} delivered twice differently, "
                 f"{agg['reruns']} requests ran more than once (+{agg['extra_runs']} runs), {agg['stranded']} "
                 f"stranded; recovery {recs}; p50 {', '.join(_f(x) for x in p50)} ms, p95 "
                 f"{', '.join(_f(x) for x in p95)} ms, slowest {', '.join(_f(x) for x in slow)} ms.")
    findings = run.get("findings") or []
    if findings:
        L += ["", "**Findings.**", ""] + [f"- {x}" for x in findings]
    L += ["", f"**How measured.** `{run['command']}` (as root: network namespaces; {run['started']}, until "
          f"{run.get('finished', '-')}). Open loop {cfg['rate']:g} requests/s plus a burst of {cfg.get('burst', 0)} "
          f"tier-B requests just before each fault, through the balancer only; instant LLM at "
          f"{cfg['llm_latency_ms']:g} ms per completion. Sentinel down-after-milliseconds "
          f"{info.get('sentinel_down_after_ms')}; PostgreSQL promotion after {PG_PROBES} failed probes "
          f"{PG_PROBE_EVERY_S:g} s apart (Patroni's own defaults, ttl 30 s and loop_wait 10 s, would notice in up "
          "to 30 s). Both detections are counted in the recovery. Settings that differ from the product's "
          f"defaults: {json.dumps(info.get('settings', {}))}" + (f"; {'; '.join(run['notes'])}" if run.get("notes") else "")
          + f". Load average {m['load_average']} at the start, {run.get('load_average_end')} at the end "
          f"({m['cpus']} shared CPUs).", "",
          "**Records.** `report.md` (every window: sent, answered in time, lost and why, delivered twice, runs per "
          "request, stranded, duplicates, codes, recovery, p50/p95; evidence of every missed goal), "
          "`report.json` (the same, computed), `timeline.png` (client calls per second, faults shaded), `raw/` "
          "(the client's own log of every call, the request rows, the stored answers' digests, the fault log: "
          "`python -m lab.experiments.multihost_chaos --render reports/reliability_multihost` recomputes the "
          "report from them). `python -m lab.results` recounts the headline.", "",
          "**Caveats.** The hosts are network namespaces on one kernel, one clock and two shared cores; links are "
          "cut by setting a veth down (no latency, loss or half-open connections); every server (Redis, "
          "Sentinels, both PostgreSQL servers, the LLM stand-in) runs on one host, so a fault kills processes, "
          "never that host. The rules route (no Triton past one machine here). Small-talk questions (about half "
          "the load) are answered by the front door without a worker."]
    (out / "README.md").write_text("\n".join(L) + "\n")


# --- main ----------------------------------------------------------------------------------------------------


def campaign(args: argparse.Namespace, plan: Sequence[tuple[str, int]], scratch: Path, run: dict[str, Any]) -> int:
    from lab.loadtest.queries import QueryPicker, build_pools, parse_mix
    from services.demo.local import Interrupted

    code = 0
    try:
        with started_stack(args, scratch, run["stack_info"]) as handles:
            stack = handles.stack
            key = stack.api_key(TENANT)
            picker = QueryPicker(build_pools("demo"), parse_mix(args.mix), seed=args.seed)
            handles.picker = QueryPicker(build_pools("demo"), {"B": 1.0}, seed=args.seed + 1)

            async def go() -> list[Any]:
                client = LoadClient(stack.address, key, journal=scratch / "client.jsonl", reconnect_fast=True)
                load = CampaignLoad(client, picker, args.rate, args.call_timeout, args.budget, scratch / "health.jsonl")
                handles.load, handles.loop = load, asyncio.get_running_loop()
                try:
                    log(f"warm-up answered: {await load.warm_up()}")
                    run["t0"] = time.time()
                    runs = await run_campaign(load, handles, plan, args.quiet, args.observe, scratch / "faults.jsonl",
                                              FAULTS)
                    await asyncio.gather(*(asyncio.wrap_future(f) for f in handles.sent), return_exceptions=True)
                    return runs
                finally:
                    run["skipped_sends"] = load.skipped_sends
                    await client.close()

            runs = asyncio.run(go())
            run["window_ends"] = {r.window: r.window_end for r in runs}
            records = drain_and_save_records(stack.store, scratch, run, args.drain_s)
            (scratch / "answers.json").write_text(json.dumps(stored_digests(stack.store)))
            log(f"{len(records)} request rows read; stopping the stack")
    except (KeyboardInterrupt, Interrupted) as exc:
        run["error"] = f"interrupted ({type(exc).__name__})"
        code = 130
    except Exception as exc:  # noqa: BLE001 - write what was measured
        import traceback

        run["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        (scratch / "error.txt").write_text(traceback.format_exc())
        log(f"failed: {run['error']}")
        code = 1
    return code


def with_findings(result: dict[str, Any], out: Path) -> dict[str, Any]:
    """The result with the notes of `out/findings.md` (its "- " lines), when there is one."""
    findings = out / FINDINGS_FILE
    if findings.exists():
        result["run"]["findings"] = [line[2:] for line in findings.read_text().splitlines() if line.startswith("- ")]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.experiments.multihost_chaos",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repetition, short windows; report in "
                                                             "var/multihost_chaos/quick/report")
    parser.add_argument("--repeat", type=int, default=None, help="repetitions of every fault (default 2; --quick 1)")
    parser.add_argument("--faults", default=None, help=f"comma-separated, from {', '.join(FAULTS)} (default all)")
    parser.add_argument("--rate", type=float, default=3.0, help="new requests per second (open loop)")
    parser.add_argument("--mix", default="A=60,B=30,C=10", help="expected-tier mix of the queries")
    parser.add_argument("--llm-latency-ms", type=float, default=300.0, help="the instant LLM's wait per completion")
    parser.add_argument("--burst", type=int, default=6,
                        help="tier-B requests sent 0.3 s before each fault (so it finds work in flight)")
    parser.add_argument("--quiet", type=float, default=None, help="s of load before each fault (default 20; --quick 10)")
    parser.add_argument("--observe", type=float, default=None, help="s of load after each restore (default 40; --quick 25)")
    parser.add_argument("--call-timeout", type=float, default=15.0, help="gRPC deadline of one call (s)")
    parser.add_argument("--budget", type=float, default=90.0, help="s a client spends on one request at most")
    parser.add_argument("--drain-s", type=float, default=120.0, help="s to wait for queued/running requests at the end")
    parser.add_argument("--grace", type=float, default=chaos.GRACE_S,
                        help="s after a window's last send by which each of its requests must be answered")
    parser.add_argument("--visibility-timeout", type=float, default=None,
                        help="ARAG_VISIBILITY_TIMEOUT for the run (default: the product's)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None,
                        help="report folder (default reports/reliability_multihost; --quick: var/multihost_chaos/quick/report)")
    parser.add_argument("--scratch", type=Path, default=None, help="default var/multihost_chaos/<run>")
    parser.add_argument("--render", type=Path, default=None,
                        help="only write the report from this scratch folder (or a report folder with raw/)")
    args = parser.parse_args(argv)
    out = (args.out or (REPO / "var/multihost_chaos/quick/report" if args.quick
                        else REPO / "reports/reliability_multihost")).resolve()
    if args.render:
        scratch = args.render.resolve()
        if (scratch / "raw").is_dir():
            scratch = unpack_raw(scratch, REPO / "var" / "multihost_chaos" / "render")
        run = json.loads((scratch / "run.json").read_text())
        write_report(with_findings(account(scratch, run["config"]["quiet"]), out), out)
        log(f"report: {out / 'report.md'}")
        return 0
    faults = [f.strip() for f in (args.faults.split(",") if args.faults else FAULTS) if f.strip()]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; choose from {', '.join(FAULTS)}")
    if os.geteuid() != 0:
        parser.error("network namespaces need root")
    repeat = args.repeat or (1 if args.quick else 2)
    args.quiet = args.quiet if args.quiet is not None else (10.0 if args.quick else 20.0)
    args.observe = args.observe if args.observe is not None else (25.0 if args.quick else 40.0)
    plan = plan_runs(faults, repeat)
    started = datetime.now(timezone.utc)
    scratch = (args.scratch or REPO / "var" / "multihost_chaos" /
               ("quick" if args.quick else f"full-{started:%Y%m%d-%H%M%S}")).resolve()
    if scratch.exists() and args.quick:
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    config = {k: getattr(args, k) for k in ("rate", "mix", "llm_latency_ms", "quiet", "observe", "call_timeout",
                                            "budget", "drain_s", "grace", "visibility_timeout", "burst", "seed")}
    config.update(faults=faults, repeat=repeat)
    run: dict[str, Any] = {
        "command": shlex.join([".venv/bin/python", "-m", "lab.experiments.multihost_chaos",
                               *(sys.argv[1:] if argv is None else argv)]),
        "started": started.isoformat(timespec="seconds"), "machine": machine(), "config": config,
        "scratch": str(scratch.relative_to(REPO) if scratch.is_relative_to(REPO) else scratch), "notes": [],
        "stack_info": {"versions": chaos.versions_of_servers()},
    }
    if args.visibility_timeout is not None:
        run["notes"].append(f"ARAG_VISIBILITY_TIMEOUT set to {args.visibility_timeout:g} s for this run (not the "
                            "product's default)")
    est = sum(args.quiet + args.observe + FAULTS[f].hold_s + 10 for f, _ in plan) / 60
    log(f"{len(plan)} fault windows ({', '.join(faults)} x {repeat}), about {est:.0f} min + start-up; scratch {scratch}")
    from services.demo.local import install_stop_signals

    install_stop_signals()
    code = campaign(args, plan, scratch, run)
    run["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    run["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    run.setdefault("t0", time.time())
    (scratch / "run.json").write_text(json.dumps(run, indent=1, default=str))
    if (scratch / "faults.jsonl").exists() and (scratch / "client.jsonl").exists():
        result = with_findings(account(scratch, args.quiet), out)
        write_report(result, out)
        if not args.quick:
            copy_raw(scratch, out)
        for row in result["rows"]:
            log(f"{row['window']}: sent {row['sent']}, lost {row['lost']} {row['lost_reasons'] or ''}, twice "
                f"{row['twice_different']}, runs {row['runs_per_request']['histogram']}, stranded {row['stranded']}, "
                f"recovery {row['recovery_s']} s -> {'pass' if row['pass'] else 'FAIL'}")
        log(f"{headline(result)}; report: {out / 'report.md'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
