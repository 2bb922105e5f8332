"""Fair share between tenants: does a tenant flooding tier C at 10x its share slow a quiet one?

One lab stack (`lab.harness.stack.lab_stack`: real worker pools A, B, C as `celery worker`
processes, the real gRPC front door, each tenant's help-centre knowledge base imported through the
KnowledgeBase API; Redis started here on loopback as broker, result backend and fair-share store,
or the embedded filesystem broker with `--broker filesystem`), routed by the rules (an empty model
repository: no classifier version, so the front door uses the rules; the queries are the demo
questions the rules send to tier C). The LLM is the instant OpenAI-compatible endpoint of
`lab/harness/instant_llm.py` with a fixed per-completion latency (`--llm-latency-ms`, default
300 ms): a measurement device standing for a remote inference endpoint with its own capacity (it
sleeps, it uses no CPU of this machine), so tier C's service time is set by the number of
completions a C query makes, not by two CPU cores running a model.

Tier C pool concurrency 2 (so there is a worker to share). Fair share: every tenant's tier-C slots
are 1 (`ARAG_TENANT_SLOTS='{"C": 1}'`, rate and other tiers at their defaults). Four tenants on the
one stack, so the phases can interleave without restarting anything:

- `quiet`, `flood`: the fair-share limits above;
- `quiet-nofs`, `flood-nofs`: fair share off (`ARAG_TENANT_LIMITS` overrides: rate 0 and C slots 0,
  i.e. unlimited), the same knowledge base.

Phases (each round runs all three; the order alternates per round, solo/fair/off then off/fair/solo):

- `solo`: `quiet` alone;
- `fair`: `quiet` + `flood` (fair share on);
- `off`: `quiet-nofs` + `flood-nofs` (fair share off for both).

The quiet tenant sends one tier-C question every `--quiet-interval` seconds (open loop, real gRPC
`Answer` calls through the generated stubs). The flood tenant sends tier-C questions open loop at
`--flood-factor` (10) times its share, the share being what one slot can serve: 1 / (the C service
time measured at the start with single sequential calls); up to `--flood-inflight` (16) calls in
flight at once (several concurrent senders; a send due while all are busy is skipped and counted).
It ignores retry-after hints (the worst case); every RESOURCE_EXHAUSTED is counted with its
`retry-after` trailing metadata. The flood starts `--lead-in` s before the quiet tenant's first
call and keeps going until the quiet tenant's last answer; then its calls drain before the next
phase.

Reported: the quiet tenant's latency (client side, send to reply) p50/p95/p99 per phase type, the
ratios p95(fair)/p95(solo) and p95(off)/p95(solo) with percentile-bootstrap 95 % intervals
(requests resampled within each phase type), the flood's admitted rate and rejections. Target: the
quiet tenant's p95 with the flood (fair share on) within 20 % of its solo p95.

Every finished phase is appended to `<out>/phases.jsonl`; `--resume` skips the phases already
there (a new stack is started, the C service time measured again). `--render` writes the report
again from that file.

    .venv/bin/python -m lab.experiments.fair_share                 # full run, ~20 min, reports/fair_share
    .venv/bin/python -m lab.experiments.fair_share --quick         # ~3 min smoke, /tmp/arag-fair-share-quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lab.harness.instant_llm import cpu_model, mem_total_gb
from lab.harness.load_client import CallRecord, LoadClient, open_loop
from lab.harness.stats import median, percentile, percentile_ratio_interval

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo"
PHASES = ("solo", "fair", "off")
PHASE_LABEL = {"solo": "quiet alone", "fair": "with flood, fair share on",
               "off": "with flood, fair share off"}
# (quiet tenant, flood tenant) of each phase.
TENANTS = {"solo": ("quiet", None), "fair": ("quiet", "flood"), "off": ("quiet-nofs", "flood-nofs")}
ALL_TENANTS = ("quiet", "flood", "quiet-nofs", "flood-nofs")
UNLIMITED = {"rate_per_s": 0, "slots": {"C": 0}}
TARGET_RATIO = 1.20
WORKDIR_MARK = ".fair_share_workdir"


# --- calls ------------------------------------------------------------------------------------------

@dataclass
class Call:
    """One Answer call and its outcome."""

    tenant: str
    role: str  # quiet | flood | warmup | calibration | check
    phase: str | None
    round: int | None
    sent_s: float  # since the run's start (monotonic)
    latency_ms: float | None = None
    status: str = "OK"
    retry_after_s: float | None = None  # the `retry-after` trailing metadata of a rejection
    tier: str | None = None
    queue_wait_ms: float | None = None
    strategy_ms: float | None = None
    server_total_ms: float | None = None
    detail: str | None = None

    @classmethod
    def of(cls, call: CallRecord, role: str, phase: str | None, round_: int | None, origin: float) -> Call:
        """The stored form of one call of the shared load client (`origin`: the run's start on
        the wall clock)."""
        return cls(call.tenant or "", role, phase, round_, call.start - origin, call.latency_ms, call.code,
                   call.retry_after_s, call.tier, call.queue_wait_ms, call.strategy_ms, call.total_ms,
                   None if call.ok else call.detail[:200])


def c_queries() -> list[str]:
    """The demo questions the rules route to tier C (the front door routes with the rules here)."""
    from adaptive_rag.routing.rules import rules_router

    questions = [q["question"] for q in json.loads((DEMO / "questions.json").read_text())]
    found = [q for q in questions if rules_router(q).tier.value == "C"]
    if not found:
        raise RuntimeError("no demo question is routed to tier C by the rules")
    return found


class Client:
    """The experiment's Answer calls on the shared load client, one API key per tenant: each the
    next tier-C question, labelled with its role, phase and round."""

    def __init__(self, address: str, keys: dict[str, str], queries: list[str], t0: float,
                 timeout_s: float) -> None:
        self.load = LoadClient(address, keys)
        self.queries = queries
        self.origin = time.time() - (time.monotonic() - t0)  # the run's start on the wall clock
        self.timeout_s = timeout_s
        self._n = 0

    async def close(self) -> None:
        await self.load.close()

    async def answer(self, tenant: str, role: str, phase: str | None = None,
                     round_: int | None = None) -> Call:
        query = self.queries[self._n % len(self.queries)]
        self._n += 1
        call = await self.load.answer(query, tenant=tenant, timeout=self.timeout_s)
        return Call.of(call, role, phase, round_, self.origin)


async def quiet_sender(client: Client, tenant: str, start: float, n: int, interval_s: float,
                       phase: str, round_: int) -> list[Call]:
    """Open loop: call k is sent at start + k * interval, whatever the earlier ones are doing."""
    sent = await open_loop(lambda _: client.answer(tenant, "quiet", phase, round_), 1.0 / interval_s,
                           count=n, start=start)
    return sent.results


@dataclass
class FloodResult:
    calls: list[Call] = field(default_factory=list)
    skipped: int = 0  # sends due while `inflight` calls were outstanding
    seconds: float = 0.0  # from the first send to the stop
    max_inflight_seen: int = 0


async def flood_sender(client: Client, tenant: str, rate: float, inflight: int,
                       stop: asyncio.Event, phase: str, round_: int) -> FloodResult:
    """Open loop at `rate` calls/s, at most `inflight` outstanding; returns after the drain."""
    sent = await open_loop(lambda _: client.answer(tenant, "flood", phase, round_), rate, stop=stop,
                           max_in_flight=inflight)
    return FloodResult(sent.results, sent.skipped, sent.seconds, sent.max_in_flight_seen)


# --- statistics -------------------------------------------------------------------------------------

def quiet_latencies(calls: list[dict]) -> list[float]:
    """Latencies of the quiet calls that got an answer, and of those that ran into the deadline
    (their latency, the deadline, is a lower bound); fast rejections are counted apart."""
    return [c["latency_ms"] for c in calls
            if c["status"] in ("OK", "DEADLINE_EXCEEDED") and c["latency_ms"] is not None]


def summarize(phases: list[dict], resamples: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"quiet": {}, "flood": {}, "ratios": {}, "per_round": []}
    by_type = {p: [r for r in phases if r["phase"] == p] for p in PHASES}
    lat: dict[str, list[float]] = {}
    for phase, runs in by_type.items():
        quiet = [c for r in runs for c in r["calls"] if c["role"] == "quiet"]
        lat[phase] = quiet_latencies(quiet)
        ok = [c for c in quiet if c["status"] == "OK"]
        statuses: dict[str, int] = {}
        for c in quiet:
            statuses[c["status"]] = statuses.get(c["status"], 0) + 1
        out["quiet"][phase] = {
            "phases": len(runs), "sent": len(quiet), "answered": len(ok), "statuses": statuses,
            "not_tier_c": sum(1 for c in ok if c["tier"] != "C"),
            **{f"p{q}_ms": percentile(lat[phase], q) for q in (50, 95, 99)},
            "mean_ms": statistics.fmean(lat[phase]) if lat[phase] else None,
            "queue_wait_p50_ms": percentile([c["queue_wait_ms"] for c in ok], 50),
            "queue_wait_p95_ms": percentile([c["queue_wait_ms"] for c in ok], 95),
            "strategy_p50_ms": percentile([c["strategy_ms"] for c in ok], 50),
            "strategy_p95_ms": percentile([c["strategy_ms"] for c in ok], 95),
            # Neither queue nor strategy: the front door, result delivery, gRPC, this client.
            "outside_p50_ms": percentile([c["latency_ms"] - c["queue_wait_ms"] - c["strategy_ms"] for c in ok], 50),
            "outside_p95_ms": percentile([c["latency_ms"] - c["queue_wait_ms"] - c["strategy_ms"] for c in ok], 95),
        }
        if phase == "solo":
            continue
        flood = [c for r in runs for c in r["calls"] if c["role"] == "flood"]
        seconds = sum(r["flood"]["seconds"] for r in runs)
        share = [r["flood"]["share_per_s"] for r in runs]
        rejected = [c for c in flood if c["status"] == "RESOURCE_EXHAUSTED"]
        hints = [c["retry_after_s"] for c in rejected if c["retry_after_s"] is not None]
        fstatus: dict[str, int] = {}
        for c in flood:
            fstatus[c["status"]] = fstatus.get(c["status"], 0) + 1
        ok_f = [c for c in flood if c["status"] == "OK"]
        out["flood"][phase] = {
            "sent": len(flood), "skipped_client_cap": sum(r["flood"]["skipped"] for r in runs),
            "seconds": seconds, "statuses": fstatus,
            "offered_per_s": (len(flood) + sum(r["flood"]["skipped"] for r in runs)) / seconds if seconds else None,
            "sent_per_s": len(flood) / seconds if seconds else None,
            "admitted_per_s": len(ok_f) / seconds if seconds else None,
            "share_per_s": statistics.fmean(share) if share else None,
            "rejected": len(rejected), "rejected_with_retry_after": len(hints),
            "retry_after_min_s": min(hints) if hints else None,
            "retry_after_p50_s": percentile(hints, 50), "retry_after_max_s": max(hints) if hints else None,
            "rejected_latency_p50_ms": percentile([c["latency_ms"] for c in rejected], 50),
            "answered_latency_p50_ms": percentile([c["latency_ms"] for c in ok_f], 50),
            "max_inflight_seen": max((r["flood"]["max_inflight_seen"] for r in runs), default=0),
        }
    for phase in ("fair", "off"):
        base, other = out["quiet"]["solo"], out["quiet"][phase]
        row: dict[str, Any] = {}
        for q in (50, 95):
            point = (other[f"p{q}_ms"] / base[f"p{q}_ms"]) if other[f"p{q}_ms"] and base[f"p{q}_ms"] else None
            row[f"p{q}"] = point
            row[f"p{q}_ci95"] = percentile_ratio_interval(lat[phase], lat["solo"], q, resamples, rng)
        out["ratios"][phase] = row
    for r in phases:
        quiet = quiet_latencies([c for c in r["calls"] if c["role"] == "quiet"])
        out["per_round"].append({"round": r["round"], "phase": r["phase"], "n": len(quiet),
                                 "p50_ms": percentile(quiet, 50), "p95_ms": percentile(quiet, 95),
                                 "load_average": r.get("load_average_start")})
    fair = out["ratios"]["fair"]
    quiet_fair = out["quiet"]["fair"]
    failures = quiet_fair["sent"] - quiet_fair["answered"]
    point, ci = fair["p95"], fair["p95_ci95"]
    if point is None:
        verdict = "no data"
    elif point <= TARGET_RATIO and failures == 0:
        verdict = ("PASS" + (" (the whole 95 % interval is within the target)" if ci and ci[1] <= TARGET_RATIO
                             else " (point estimate within the target; the 95 % interval reaches "
                                  f"{ci[1]:.2f})" if ci else ""))
    elif point <= TARGET_RATIO:
        verdict = f"FAIL: p95 within the target but {failures} quiet call(s) not answered"
    else:
        verdict = (f"FAIL: p95 ratio {point:.2f} > {TARGET_RATIO:.2f} "
                   f"(misses by {100 * (point - TARGET_RATIO):.0f} percentage points)")
    out["verdict"] = verdict
    return out


# --- the run ----------------------------------------------------------------------------------------

def schedule(rounds: int) -> list[tuple[int, str]]:
    """Rounds of the three phases, the order reversed every other round (linear drift cancels)."""
    out = []
    for r in range(rounds):
        order = PHASES if r % 2 == 0 else tuple(reversed(PHASES))
        out += [(r, p) for p in order]
    return out


def _fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


async def run_phases(client: Client, todo: list[tuple[int, str]], args: argparse.Namespace,
                     service_s: float, journal: Path, t_start: float) -> None:
    share = 1.0 / service_s
    rate = args.flood_factor * share
    n_quiet = max(1, int(round(args.phase_s / args.quiet_interval)))
    for i, (round_, phase) in enumerate(todo):
        quiet_tenant, flood_tenant = TENANTS[phase]
        load = os.getloadavg()
        t0 = time.monotonic()
        stop = asyncio.Event()
        flood_task = None
        if flood_tenant:
            flood_task = asyncio.create_task(
                flood_sender(client, flood_tenant, rate, args.flood_inflight, stop, phase, round_))
        quiet = await quiet_sender(client, quiet_tenant, t0 + (args.lead_in if flood_tenant else 0.0),
                                   n_quiet, args.quiet_interval, phase, round_)
        stop.set()
        flood = await flood_task if flood_task else FloodResult()
        drained = time.monotonic()
        record = {
            "round": round_, "phase": phase, "quiet_tenant": quiet_tenant, "flood_tenant": flood_tenant,
            "started_s": t0 - t_start, "seconds": drained - t0, "load_average_start": load,
            "service_s": service_s,
            "flood": {"rate_per_s": rate if flood_tenant else 0.0, "share_per_s": share,
                      "skipped": flood.skipped, "seconds": flood.seconds,
                      "max_inflight_seen": flood.max_inflight_seen},
            "calls": [compact(asdict(c)) for c in [*quiet, *flood.calls]],
        }
        slim_rejections(record)
        with journal.open("a") as f:
            f.write(json.dumps(record) + "\n")
        lat = quiet_latencies([c for c in record["calls"] if c["role"] == "quiet"])
        bad = sum(1 for c in quiet if c.status != "OK")
        fs = {}
        for c in flood.calls:
            fs[c.status] = fs.get(c.status, 0) + 1
        hints = sum(1 for c in flood.calls if c.status == "RESOURCE_EXHAUSTED" and c.retry_after_s is not None)
        flood_txt = (f"; flood {len(flood.calls)} sent ({flood.skipped} skipped at the client cap), "
                     f"{fs.get('OK', 0)} OK = {fs.get('OK', 0) / flood.seconds:.2f}/s, "
                     f"{fs.get('RESOURCE_EXHAUSTED', 0)} RESOURCE_EXHAUSTED ({hints} with retry-after)"
                     + (f", other {dict((k, v) for k, v in fs.items() if k not in ('OK', 'RESOURCE_EXHAUSTED'))}"
                        if set(fs) - {"OK", "RESOURCE_EXHAUSTED"} else "")) if flood_tenant else ""
        left = len(todo) - i - 1
        log(f"round {round_} {phase:<4} ({PHASE_LABEL[phase]}): quiet {len(quiet) - bad}/{len(quiet)} OK, "
            f"p50 {_fmt(percentile(lat, 50))} ms, p95 {_fmt(percentile(lat, 95))} ms{flood_txt}; "
            f"{drained - t0:.0f} s, load {load[0]:.2f}; {left} phase(s) left")
        await asyncio.sleep(args.settle)


async def measure(address: str, keys: dict[str, str], queries: list[str], args: argparse.Namespace,
                  todo: list[tuple[int, str]], journal: Path, t_start: float,
                  calibration_out: dict[str, Any]) -> None:
    client = Client(address, keys, queries, t_start, args.timeout)
    try:
        log("warm-up: 3 sequential calls per tenant (uncounted)")
        for tenant in ALL_TENANTS:
            for _ in range(3):
                c = await client.answer(tenant, "warmup")
                if c.status != "OK":
                    raise RuntimeError(f"warm-up call of {tenant} failed: {c.status} {c.detail}")
                if c.tier != "C":
                    raise RuntimeError(f"warm-up call of {tenant} was routed to {c.tier}, not C")
        log(f"calibration: {args.calibration} sequential tier-C calls of `quiet`")
        cal = [await client.answer("quiet", "calibration") for _ in range(args.calibration)]
        ok = [c.latency_ms for c in cal if c.status == "OK"]
        if len(ok) < len(cal):
            raise RuntimeError(f"calibration calls failed: {[c.status for c in cal]}")
        service_s = median(ok) / 1000
        calibration_out.update(
            service_ms_median=1000 * service_s, service_ms=ok,
            strategy_ms=[c.strategy_ms for c in cal], queue_wait_ms=[c.queue_wait_ms for c in cal],
            share_per_s=1 / service_s, flood_rate_per_s=args.flood_factor / service_s)
        log(f"C service time {1000 * service_s:.0f} ms (median of {len(ok)}; strategy "
            f"{median(c.strategy_ms for c in cal):.0f} ms): one slot serves "
            f"{1 / service_s:.2f}/s, the flood sends {args.flood_factor:g}x = {args.flood_factor / service_s:.2f}/s")
        # Fair share in force? Two concurrent calls of `flood`: one is refused with a hint; of
        # `flood-nofs`: both answered.
        on = await asyncio.gather(*(client.answer("flood", "check") for _ in range(3)))
        off = await asyncio.gather(*(client.answer("flood-nofs", "check") for _ in range(3)))
        calibration_out["check"] = {"flood": [c.status for c in on], "flood-nofs": [c.status for c in off],
                                    "retry_after_s": [c.retry_after_s for c in on if c.retry_after_s is not None],
                                    "detail": [c.detail for c in on if c.detail]}
        if not any(c.status == "RESOURCE_EXHAUSTED" for c in on) or any(c.status != "OK" for c in off):
            raise RuntimeError(f"fair share is not configured as expected: {calibration_out['check']}")
        log(f"check: 3 concurrent calls: flood {[c.status for c in on]} "
            f"(retry-after {calibration_out['check']['retry_after_s']}), flood-nofs {[c.status for c in off]}")
        if any(c.status == "RESOURCE_EXHAUSTED" for c in on):
            log(f"  rejection message: {calibration_out['check']['detail'][0]!r}")
        await asyncio.sleep(args.settle)
        await run_phases(client, todo, args, service_s, journal, t_start)
    finally:
        await client.close()


CALL_FIELDS = tuple(Call.__dataclass_fields__)
ROUNDING = {"sent_s": 4, "latency_ms": 2, "queue_wait_ms": 2, "strategy_ms": 2, "server_total_ms": 2,
            "retry_after_s": 3}


def compact(call: dict[str, Any]) -> dict[str, Any]:
    """A call as stored: no empty fields, times rounded (0.01 ms, 0.1 ms for the send time)."""
    return {k: (round(v, ROUNDING[k]) if k in ROUNDING and v is not None else v)
            for k, v in call.items() if v is not None}


def slim_rejections(record: dict[str, Any]) -> None:
    """Refusals all say the same: keep three messages per phase, not one per call."""
    examples = record["flood"].setdefault("rejection_examples", [])
    for c in record["calls"]:
        if c["status"] == "RESOURCE_EXHAUSTED" and "detail" in c:
            detail = c.pop("detail")
            if len(examples) < 3:
                examples.append(detail)


def read_journal(journal: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    header, phases = None, []
    if journal.exists():
        for line in journal.read_text().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            if "config" in item:
                header = header or item
                continue
            item["calls"] = [{k: c.get(k) for k in CALL_FIELDS} for c in item["calls"]]
            phases.append(item)
    return header, phases


SCHEDULE_KEYS = ("rounds", "phase_s", "quiet_interval", "flood_factor", "flood_inflight",
                 "llm_latency_ms", "c_concurrency", "broker", "lead_in")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.experiments.fair_share",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="~3 min smoke: 1 round of 24 s phases, written under /tmp")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of the three phases (default 6; --quick 1)")
    parser.add_argument("--phase-s", type=float, default=None,
                        help="quiet sending time per phase, s (default 48; --quick 24)")
    parser.add_argument("--quiet-interval", type=float, default=3.0, help="s between quiet calls")
    parser.add_argument("--flood-factor", type=float, default=10.0, help="flood rate / its share")
    parser.add_argument("--flood-inflight", type=int, default=16, help="flood calls in flight at most")
    parser.add_argument("--lead-in", type=float, default=5.0, help="s of flood before the quiet calls")
    parser.add_argument("--settle", type=float, default=3.0, help="s of rest between phases")
    parser.add_argument("--llm-latency-ms", type=float, default=300.0, help="per completion")
    parser.add_argument("--c-concurrency", type=int, default=2, help="tier-C pool processes")
    parser.add_argument("--calibration", type=int, default=None,
                        help="calls measuring the C service time (default 8; --quick 4)")
    parser.add_argument("--timeout", type=float, default=120.0, help="gRPC deadline per call (s)")
    parser.add_argument("--broker", choices=("redis", "filesystem"), default="redis",
                        help="redis: a redis-server started here (broker, results, RedisFairShare); "
                             "filesystem: the embedded broker and InMemoryFairShare")
    parser.add_argument("--bootstrap", type=int, default=4000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, default=None,
                        help="report directory (default reports/fair_share; "
                             "--quick: /tmp/arag-fair-share-quick/report)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="the stack's files (default /tmp/arag-fair-share[-quick]/stack)")
    parser.add_argument("--resume", action="store_true", help="keep the phases already in <out>/phases.jsonl")
    parser.add_argument("--render", action="store_true", help="only write the report from <out>/phases.jsonl")
    args = parser.parse_args(argv)
    defaults = {"rounds": (6, 1), "phase_s": (48.0, 24.0), "calibration": (8, 4)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    base = Path("/tmp/arag-fair-share-quick" if args.quick else "/tmp/arag-fair-share")
    out = (args.out or (base / "report" if args.quick else REPO / "reports" / "fair_share")).resolve()
    workdir = (args.workdir or base / "stack").resolve()
    journal = out / "phases.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join([".venv/bin/python", "-m", "lab.experiments.fair_share",
                          *(sys.argv[1:] if argv is None else argv)])
    if args.render:
        header, phases = read_journal(journal)
        if header is None:
            parser.error(f"nothing to render in {journal}")
        write_report(out, header, phases, args.bootstrap, args.seed)
        return 0

    config = {k: getattr(args, k) for k in SCHEDULE_KEYS}
    header, done = read_journal(journal) if args.resume else (None, [])
    if args.resume and header is not None:
        if header["config"] != config:
            parser.error(f"--resume with other settings than {journal}: {header['config']} != {config}")
    else:
        header = {"config": config, "runs": []}
        done = []
    sched = schedule(args.rounds)
    finished = {(p["round"], p["phase"]) for p in done}
    todo = [s for s in sched if s not in finished]
    n_quiet = max(1, int(round(args.phase_s / args.quiet_interval)))
    per_phase = args.phase_s + args.settle + 5 + args.lead_in * 2 / 3
    log(f"{len(todo)} of {len(sched)} phases to run ({n_quiet} quiet calls each, about "
        f"{len(todo) * per_phase / 60:.0f} min + stack start); report in {out}")
    if not todo:
        write_report(out, header, done, args.bootstrap, args.seed)
        return 0

    from rich.console import Console

    from lab.harness.stack import TIER_POOLS, Parts, lab_stack
    from services.demo.local import Interrupted, install_stop_signals

    queries = c_queries()
    run_info: dict[str, Any] = {
        "command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "load_average_start": os.getloadavg(), "phases": [f"{r}:{p}" for r, p in todo],
        "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "mem_gb": mem_total_gb(),
                    "platform": platform.platform(), "python": platform.python_version()},
        "queries": queries, "calibration": {},
    }
    # A fresh stack every run (its database, indexes and logs): only a folder this script made.
    if (workdir / WORKDIR_MARK).exists():
        shutil.rmtree(workdir)
    elif workdir.exists() and any(workdir.iterdir()):
        parser.error(f"--workdir {workdir} is not empty and was not made by this script")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / WORKDIR_MARK).write_text("lab.experiments.fair_share work directory (removed by each run)\n")
    # The settings of the stack (no classifier version: the rules route).
    settings = {
        "concurrency": {"A": 1, "B": 1, "C": args.c_concurrency, "shadow": 1},
        "tenant_slots": {"C": 1},
        "tenant_limits": {"quiet-nofs": UNLIMITED, "flood-nofs": UNLIMITED},
        "shadow_share": 0.0,
    }
    for name in ("ARAG_TENANT_RATE", "ARAG_TENANT_BURST", "ARAG_TENANT_LEASE", "REDIS_URL",
                 "TRITON_GRPC_URL", "TRITON_URL"):
        if name in os.environ:
            log(f"note: {name} is set in the environment and is kept: {os.environ[name]}")
    run_info["settings"] = settings
    if not args.resume or not journal.exists():
        journal.write_text(json.dumps(header) + "\n")
    install_stop_signals()
    console = Console(width=None if sys.stdout.isatty() else 160)
    t_start = time.monotonic()
    code = 0
    try:
        # Redis started here unless the environment names one (kept, as noted above)
        broker = "redis" if args.broker == "redis" and "REDIS_URL" not in os.environ else None
        parts = Parts(broker=broker, classifier="rules", llm="instant")
        log("starting the lab stack (Redis; the fixed-latency LLM endpoint; pools A, B, C; front door; "
            "4 tenants' knowledge bases)")
        with lab_stack(workdir, parts, pools=TIER_POOLS, settings=settings, tenants=ALL_TENANTS,
                       llm_latency_ms=args.llm_latency_ms, console=console) as running:
            run_info["stack"] = running.using
            run_info["stack_started_s"] = time.monotonic() - t_start
            keys = {t: running.api_key(t) for t in ALL_TENANTS}
            log(f"stack up in {run_info['stack_started_s']:.0f} s; front door {running.address}")
            asyncio.run(measure(running.address, keys, queries, args, todo, journal, t_start,
                                run_info["calibration"]))
            log("stopping the local stack")
        run_info["leftovers"] = running.leftovers
    except (KeyboardInterrupt, Interrupted) as exc:
        log(f"interrupted ({type(exc).__name__}); finished phases are kept in {journal} (--resume)")
        run_info["interrupted"] = True
        code = 130
    except Exception as exc:  # noqa: BLE001 - keep what was measured
        log(f"failed: {type(exc).__name__}: {exc}; finished phases are kept in {journal} (--resume)")
        run_info["error"] = f"{type(exc).__name__}: {exc}"
        code = 1
    finally:
        run_info["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        run_info["load_average_end"] = os.getloadavg()
        run_info["seconds"] = time.monotonic() - t_start
        lines = journal.read_text().splitlines() if journal.exists() else []
        if lines:  # the header carries every run's notes (a resumed report has several)
            head = json.loads(lines[0])
            head["runs"] = [*head.get("runs", []), run_info]
            lines[0] = json.dumps(head)
            journal.write_text("\n".join(lines) + "\n")
    header, phases = read_journal(journal)
    if phases and header is not None:
        summary = write_report(out, header, phases, args.bootstrap, args.seed)
        log(f"verdict: {summary['verdict']}")
    return code


# --- report -----------------------------------------------------------------------------------------

def write_report(out: Path, header: dict[str, Any], phases: list[dict[str, Any]], resamples: int,
                 seed: int) -> dict[str, Any]:
    cfg = header["config"]
    summary = summarize(phases, resamples, seed)
    report = {"config": cfg, "bootstrap": resamples, "seed": seed, "runs": header.get("runs", []),
              "summary": summary}
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    plot(out / "quiet_latency.png", phases, summary)
    (out / "README.md").write_text(markdown(report, phases))
    print()
    for line in table_lines(summary):
        print(line)
    print(f"\nwrote {out / 'README.md'}, {out / 'quiet_latency.png'}, {out / 'report.json'}")
    return summary


def plot(path: Path, phases: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """ECDF of the quiet tenant's latency per phase type (log, all three; linear, solo vs fair
    share on with the target band) and every quiet call over the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    colors = {"solo": "tab:blue", "fair": "tab:green", "off": "tab:red"}
    seconds = FuncFormatter(lambda v, _: f"{v:g}")
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 5))
    solo = summary["quiet"]["solo"]["p95_ms"]
    for ax, shown in ((ax1, PHASES), (ax2, ("solo", "fair"))):
        for phase in shown:
            lat = sorted(quiet_latencies([c for r in phases if r["phase"] == phase for c in r["calls"]
                                          if c["role"] == "quiet"]))
            if not lat:
                continue
            y = np.arange(1, len(lat) + 1) / len(lat)
            q = summary["quiet"][phase]
            ax.step(np.asarray(lat) / 1000, y, where="post", color=colors[phase],
                    label=f"{PHASE_LABEL[phase]} (n={len(lat)}, p95 {q['p95_ms'] / 1000:.2f} s)")
            ax.axvline(q["p95_ms"] / 1000, color=colors[phase], ls=":", lw=1)
        if solo:
            ax.axvspan(solo / 1000, TARGET_RATIO * solo / 1000, color="tab:blue", alpha=0.12,
                       label="target: up to solo p95 + 20 %")
        ax.axhline(0.95, color="grey", lw=0.6)
        ax.set_ylabel("fraction of quiet calls")
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    ax1.set_xscale("log")
    ax1.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax1.xaxis.set_major_formatter(seconds)
    ax1.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax1.set_xlabel("quiet tenant latency, send to reply (s, log scale)")
    ax1.set_title("quiet tenant latency (ECDF), all phases")
    ax2.set_xlabel("quiet tenant latency, send to reply (s)")
    ax2.set_title("zoom: alone vs with the flood, fair share on")
    for r in phases:
        pts = [(c["sent_s"], c["latency_ms"] / 1000) for c in r["calls"]
               if c["role"] == "quiet" and c["latency_ms"] is not None]
        if pts:
            xs, ys = zip(*pts)
            ax3.scatter(np.asarray(xs) / 60, ys, s=8, color=colors[r["phase"]])
    for phase in PHASES:
        ax3.scatter([], [], s=8, color=colors[phase], label=PHASE_LABEL[phase])
    ax3.set_yscale("log")
    ax3.yaxis.set_major_formatter(seconds)
    ax3.yaxis.set_minor_formatter(seconds)
    ax3.set_xlabel("time in the run (min)")
    ax3.set_ylabel("latency (s, log scale)")
    ax3.set_title("every quiet call, phases interleaved")
    ax3.legend(loc="center right", fontsize=8)
    ax3.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _ci(ci: tuple[float, float] | None) -> str:
    return "-" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def table_lines(summary: dict[str, Any]) -> list[str]:
    q, f, r = summary["quiet"], summary["flood"], summary["ratios"]
    lines = ["| phase | quiet calls | answered | quiet p50 (ms) | quiet p95 (ms) | quiet p99 (ms) | "
             "p95 / solo p95 [95 % CI] | quiet queue wait p50 / p95 (ms) | flood sent | flood OK (/s) | "
             "flood RESOURCE_EXHAUSTED (with retry-after) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
    for phase in PHASES:
        row = q[phase]
        ratio = ("1" if phase == "solo" else
                 f"{_fmt(r[phase]['p95'], 2)} {_ci(r[phase]['p95_ci95'])}")
        fl = f.get(phase)
        flood = ("-", "-", "-") if not fl else (
            f"{fl['sent']}", f"{fl['statuses'].get('OK', 0)} ({_fmt(fl['admitted_per_s'], 2)}/s)",
            f"{fl['rejected']} ({fl['rejected_with_retry_after']})")
        lines.append(f"| {PHASE_LABEL[phase]} | {row['sent']} | {row['answered']} | {_fmt(row['p50_ms'])} | "
                     f"{_fmt(row['p95_ms'])} | {_fmt(row['p99_ms'])} | {ratio} | "
                     f"{_fmt(row['queue_wait_p50_ms'])} / {_fmt(row['queue_wait_p95_ms'])} | "
                     f"{' | '.join(flood)} |")
    lines += ["", f"Verdict (quiet p95 with the flood, fair share on, within {100 * (TARGET_RATIO - 1):.0f} % "
              f"of its solo p95): **{summary['verdict']}**"]
    return lines


def markdown(report: dict[str, Any], phases: list[dict[str, Any]]) -> str:
    cfg, s, runs = report["config"], report["summary"], report["runs"]
    run = runs[-1] if runs else {}
    cal = run.get("calibration", {})
    machine = run.get("machine", {})
    f = s["flood"]
    n_quiet = max(1, int(round(cfg["phase_s"] / cfg["quiet_interval"])))
    lines = [
        "# Fair share between tenants: a tier-C flood vs a quiet tenant",
        "",
        "Does one tenant sending tier-C queries at 10x its share slow down another tenant's light, "
        "steady tier-C traffic? Target: the quiet tenant's p95 latency with the flood (fair share on) "
        f"within {100 * (TARGET_RATIO - 1):.0f} % of its p95 alone.",
        "",
        "```",
        run.get("command", ".venv/bin/python -m lab.experiments.fair_share"),
        "```",
        "",
        "Source: `lab/experiments/fair_share.py`. Raw data: `phases.jsonl` (every call), summary: `report.json`.",
        "",
        "## Result",
        "",
        *table_lines(s),
        "",
        "Latency: client side, gRPC `Answer` sent to reply received. Percentiles over the quiet calls "
        "answered (a call that hit the gRPC deadline would count with its deadline as a lower bound; "
        "a fast rejection would be counted apart, under `answered`). Ratio intervals: percentile "
        f"bootstrap, {report['bootstrap']} resamples of the quiet calls of each phase type (each resampled alone). "
        "Queue wait: the task's enqueue to start (from the reply's timings).",
        "",
        "![quiet tenant latency](quiet_latency.png)",
        "",
    ]
    ratios = s["ratios"]
    lines += ["| ratio to solo | p50 [95 % CI] | p95 [95 % CI] |", "| --- | --- | --- |"]
    for phase in ("fair", "off"):
        lines.append(f"| {PHASE_LABEL[phase]} | {_fmt(ratios[phase]['p50'], 2)} {_ci(ratios[phase]['p50_ci95'])} | "
                     f"{_fmt(ratios[phase]['p95'], 2)} {_ci(ratios[phase]['p95_ci95'])} |")
    lines += ["", "### The flood", "",
              "| phase | offered (/s) | sent | skipped at the client cap | answered (admitted/s) | "
              "its share (/s) | RESOURCE_EXHAUSTED | with retry-after | retry-after min / p50 / max (s) | "
              "rejection latency p50 (ms) | answered latency p50 (ms) | other statuses |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for phase in ("fair", "off"):
        fl = f[phase]
        other = {k: v for k, v in fl["statuses"].items() if k not in ("OK", "RESOURCE_EXHAUSTED")}
        lines.append(
            f"| {PHASE_LABEL[phase]} | {_fmt(fl['offered_per_s'], 2)} | {fl['sent']} | {fl['skipped_client_cap']} | "
            f"{fl['statuses'].get('OK', 0)} ({_fmt(fl['admitted_per_s'], 2)}) | {_fmt(fl['share_per_s'], 2)} | "
            f"{fl['rejected']} | {fl['rejected_with_retry_after']} | {_fmt(fl['retry_after_min_s'], 1)} / "
            f"{_fmt(fl['retry_after_p50_s'], 1)} / {_fmt(fl['retry_after_max_s'], 1)} | "
            f"{_fmt(fl['rejected_latency_p50_ms'])} | {_fmt(fl['answered_latency_p50_ms'])} | {other or '-'} |")
    lines += ["", "### Per phase (in run order)", "",
              "| round | phase | quiet calls | p50 (ms) | p95 (ms) | load average at start (1 min) |",
              "| ---: | --- | ---: | ---: | ---: | ---: |"]
    for row in s["per_round"]:
        la = row["load_average"]
        lines.append(f"| {row['round']} | {PHASE_LABEL[row['phase']]} | {row['n']} | {_fmt(row['p50_ms'])} | "
                     f"{_fmt(row['p95_ms'])} | {la[0]:.2f} |" if la else "")
    quiet = s["quiet"]
    lines += ["", "Quiet tenant, server side (p50 / p95, ms): "
              + "; ".join(f"{PHASE_LABEL[p]}: queue wait {_fmt(quiet[p]['queue_wait_p50_ms'])} / "
                          f"{_fmt(quiet[p]['queue_wait_p95_ms'])}, strategy {_fmt(quiet[p]['strategy_p50_ms'])} / "
                          f"{_fmt(quiet[p]['strategy_p95_ms'])}" for p in PHASES) + ".", ""]
    lines += reading_lines(s, cfg, cal)
    lines += [
        "## Setup",
        "",
        "- One lab stack (`lab.harness.stack.lab_stack`) for all phases: "
        + "; ".join(f"{k}: {v}" for k, v in (run.get("stack") or {}).items()) + ".",
        f"- Worker pools A, B, C (`celery worker`, prefork), concurrency A 1, B 1, C "
        f"{cfg['c_concurrency']} (prefetch C 1): two tier-C processes, so there is a worker to share.",
        f"- LLM: the instant OpenAI-compatible endpoint of `lab/harness/instant_llm.py` with "
        f"`--llm-latency-ms {cfg['llm_latency_ms']:g}`: a **measurement device** standing for a remote "
        "inference endpoint with its own capacity. Every completion waits that long (a sleep on its "
        "own thread: no CPU, no queueing in the endpoint) and answers one fixed word; a tier-C query "
        "(`decompose`) makes several completions (with these one-word answers its strategy took "
        f"{_fmt(median(cal['strategy_ms']) if cal.get('strategy_ms') else None)} ms, i.e. "
        f"about {_fmt(median(cal['strategy_ms']) / cfg['llm_latency_ms'] if cal.get('strategy_ms') else None)} "
        "waits plus retrieval), so its service time is set by the endpoint's latency, not by these two cores.",
        "- Fair share: `ARAG_TENANT_SLOTS='{\"C\": 1}'` (every tenant may hold 1 queued + running "
        "tier-C task), rate limit and other tiers at their defaults (50/s, burst 100). Fair share off: "
        "tenants `quiet-nofs` and `flood-nofs` with `ARAG_TENANT_LIMITS` overrides `{\"rate_per_s\": 0, "
        "\"slots\": {\"C\": 0}}` (no limit at all), on the same stack, with the same knowledge base. "
        "(One stack with four tenants instead of a restart per phase: phases interleave every minute "
        "with the same processes, caches and database, and the only thing that differs between the "
        "two flood phases is the tenants' limits.)",
        f"- Queries: the demo questions the rules route to tier C ({len(run.get('queries', []))}: "
        + "; ".join(f"\"{q}\"" for q in run.get("queries", [])) + "), in turn; every answer was "
        f"checked to come from tier C (quiet answers not from C: "
        f"{sum(quiet[p]['not_tier_c'] for p in PHASES)}).",
        f"- C service time measured at the start ({len(cal.get('service_ms', []))} sequential calls of "
        f"`quiet`): median {_fmt(cal.get('service_ms_median'))} ms, so one slot serves "
        f"{_fmt(cal.get('share_per_s'), 2)} calls/s (the flood's share) and the flood offers "
        f"{cfg['flood_factor']:g}x = {_fmt(cal.get('flood_rate_per_s'), 2)} calls/s.",
        f"- Quiet tenant: one call every {cfg['quiet_interval']:g} s, open loop, {n_quiet} calls per "
        f"phase, starting {cfg['lead_in']:g} s after the flood. Flood: open loop at that rate, at "
        f"most {cfg['flood_inflight']} calls in flight (several concurrent senders), ignoring "
        "retry-after hints, until the quiet tenant's last answer; then its calls drain. "
        f"{cfg['rounds']} rounds of the three phases, the order alternating (solo, fair, off / off, "
        "fair, solo), 3 s of rest between phases. gRPC deadline per call: 120 s.",
        f"- Check before the phases: 3 concurrent calls of `flood` -> {cal.get('check', {}).get('flood')} "
        f"(retry-after {cal.get('check', {}).get('retry_after_s')}), of `flood-nofs` -> "
        f"{cal.get('check', {}).get('flood-nofs')}.",
        "",
        "## Machine",
        "",
        f"- {machine.get('cpus')} CPUs ({machine.get('cpu')}), {_fmt(machine.get('mem_gb'), 0)} GB RAM, "
        f"{machine.get('platform')}, Python {machine.get('python')}. Everything (pools, front door, "
        "Redis, SQLite, the LLM stand-in and this client) on these 2 cores.",
        "- The machine is shared: other engineers' jobs ran at the same time. Load average (1/5/15 min) "
        + "; ".join(f"run {i + 1}: start {_la(r.get('load_average_start'))}, end {_la(r.get('load_average_end'))}"
                    f" ({_fmt(r.get('seconds', 0) / 60, 1)} min{', interrupted' if r.get('interrupted') else ''}"
                    f"{', error: ' + r['error'] if r.get('error') else ''})" for i, r in enumerate(runs))
        + ". Interleaving the phases spreads that noise over all three.",
        "",
    ]
    notes = report.get("notes") or []
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(line for line in lines if line is not None) + "\n"


def reading_lines(s: dict[str, Any], cfg: dict[str, Any], cal: dict[str, Any]) -> list[str]:
    """What the figures say, from the figures."""
    q, f, r = s["quiet"], s["flood"], s["ratios"]
    fair, off = f.get("fair") or {}, f.get("off") or {}
    if not (q["solo"]["p95_ms"] and q["fair"]["p95_ms"] and q["off"]["p95_ms"] and fair and off):
        return []
    service = cal.get("service_ms_median")
    lines = ["## Reading", ""]
    lines.append(
        f"- **Fair share on**: the flood offered {_fmt(fair['offered_per_s'], 1)} calls/s and got "
        f"{_fmt(fair['admitted_per_s'], 2)}/s answered ({100 * fair['admitted_per_s'] / fair['share_per_s']:.0f} % of "
        f"its share of {_fmt(fair['share_per_s'], 2)}/s); the other {fair['rejected']} calls were refused at "
        f"admission in {_fmt(fair['rejected_latency_p50_ms'])} ms (p50) with RESOURCE_EXHAUSTED, "
        f"{fair['rejected_with_retry_after']} of them with the `retry-after` trailer. The quiet tenant's "
        f"queue wait stayed at {_fmt(q['fair']['queue_wait_p50_ms'])} / {_fmt(q['fair']['queue_wait_p95_ms'])} ms "
        f"(p50 / p95; alone {_fmt(q['solo']['queue_wait_p50_ms'])} / {_fmt(q['solo']['queue_wait_p95_ms'])} ms): with "
        "one tier-C slot each and two tier-C processes, its calls never queued behind the flood. What "
        f"is left of the difference (p95 x{_fmt(r['fair']['p95'], 2)}, p50 x{_fmt(r['fair']['p50'], 2)}) is "
        "time on the two shared cores: the strategy's own time p50 / p95 "
        f"{_fmt(q['fair']['strategy_p50_ms'])} / {_fmt(q['fair']['strategy_p95_ms'])} ms (alone "
        f"{_fmt(q['solo']['strategy_p50_ms'])} / {_fmt(q['solo']['strategy_p95_ms'])} ms), the rest (front door, "
        f"result delivery, gRPC: latency - queue wait - strategy) {_fmt(q['fair']['outside_p50_ms'])} / "
        f"{_fmt(q['fair']['outside_p95_ms'])} ms (alone {_fmt(q['solo']['outside_p50_ms'])} / "
        f"{_fmt(q['solo']['outside_p95_ms'])} ms), with the front door refusing "
        f"~{_fmt(fair['sent_per_s'] - fair['admitted_per_s'], 0)} calls/s of the flood (each one "
        "authenticated, routed and written to the records twice) and the flood's admitted task running.")
    lines.append(
        f"- **Fair share off**: the flood kept up to {off['max_inflight_seen']} calls in flight (its "
        f"client's cap; {off['skipped_client_cap']} more sends were due meanwhile), so the tier-C queue "
        f"held that many of its tasks; both tier-C processes served it ({_fmt(off['admitted_per_s'], 2)} "
        f"answers/s) and every quiet call waited behind the backlog: queue wait "
        f"{_fmt(q['off']['queue_wait_p50_ms'])} ms p50, latency x{_fmt(r['off']['p95'], 1)} at p95. That "
        "figure scales with the flood's concurrency (FIFO: about cap x service time / 2 processes "
        f"= {off['max_inflight_seen']} x {_fmt(service)} ms / 2); with no cap on the client only the "
        "tier-C queue limit (100 tasks) would bound it.")
    hint = fair.get("retry_after_p50_s")
    if hint and service and hint > 10 * service / 1000:
        lines.append(
            f"- **The retry-after hint is the lease, not the wait**: refusals said retry after "
            f"{_fmt(fair['retry_after_min_s'], 0)}-{_fmt(fair['retry_after_max_s'], 0)} s (p50 {_fmt(hint, 0)} s) "
            f"while the flood's slot came free every ~{_fmt(service)} ms. For a slot refusal the hint is "
            "the time until the tenant's oldest lease *expires* (the tier's `lease_s`, 600 s for C: "
            "`services/frontdoor/fair_share.py:149` in the Redis script, `:298` in memory), not when a "
            "slot is likely to be given back. A client that honours it stops sending tier C for about "
            "ten minutes; the flood here ignored it (the worst case for the quiet tenant).")
    lines.append(
        "- **Scope**: two tenants and two tier-C processes, so with one slot each every tenant in "
        "effect has a process of its own. Slots bound how much of the tier-C queue a tenant may hold; "
        "they do not schedule it: with more busy tenants than tier-C processes the quiet tenant "
        "would still wait behind one task of each of them (FIFO). The flood is a client that waits "
        "for its answers (or takes the refusal); a client that cancels its calls was not measured "
        "(admission keeps a cancelled call's slot until its task ends: `_answer_when_done` in "
        "`adaptive_rag/serving/admission.py`). The LLM is a "
        "fixed-latency stand-in (no CPU), so the CPU interference "
        "measured here is the service's own, not a model's.")
    return [*lines, ""]


def _la(la: Any) -> str:
    return "-" if not la else "/".join(f"{v:.2f}" for v in la)


if __name__ == "__main__":
    sys.exit(main())
