"""The serving path's ceiling, two ways: the machinery alone (instant LLM) and end to end (the
embedded model served by one shared llama-server).

    .venv/bin/python -m lab.experiments.ceiling            # full run (~40 min), writes reports/load/ceiling/
    .venv/bin/python -m lab.experiments.ceiling --quick    # ~3 min smoke run, writes var/ceiling/quick/

Per mode (`instant`: `lab/harness/instant_llm.py` behind `LLM_BASE_URL`, the serving path
without the model's cost, a measurement device; `llm-server`: `infra.local.llama_server`, as
`python -m lab.loadtest` does by default) it starts the lab's stack once
(`lab.harness.stack.lab_stack`, the parts `python -m lab.loadtest` starts) and, per tier (mix
`A=100`, then `B=100`, then `C=100`), runs locust (`lab/loadtest/locustfile.py`) as a subprocess
once per point:

1. a closed-loop probe (a few users, no think time): its answers/s is the first guess X of the
   ceiling;
2. open-loop points at fixed offered rates (locust's `constant_throughput(R/users)`, the
   locustfile's `--rate R`, with users = ceil(R x a user period well above the latency)) at
   fractions of X, going up until one is not sustained, then up to two points halving the
   bracket between the last sustained and the first failed rate. A rate is **sustained** when it
   holds in `--trials` (3) trials in a row, each a locust run of its own; a trial holds when, inside
   the measuring window (after a ramp), the calls started are >= R x window - max(5 %, sqrt(n)) (else the
   users fell back to a closed loop because calls got slower than their period), the calls
   answered are >= 93 % of the calls started (minus two), no call failed, the tier's queue
   does not grow (least-squares slope of its depth below max(0.01 R, 0.5)/s, or its depth
   stays <= 2), and the p95 latency of the calls started in the window is within the bound
   (`--p95-bound`: by default 3x the p95 of a light-load reference point at 10 % of the probe's
   throughput, measured first, and with the instant LLM at most 1 s as well; or an absolute
   "800ms", or both "3x,1s"). The ceiling is the highest sustained rate;
3. points at shares of the ceiling (50 % and 90 %; the machinery alone also 10 % and 25 %):
   latency p50/p95/p99, the front door's own overhead per reply (total - queue wait - strategy)
   p50/p95/p99 against the load, and the capacity planner's check (M/M/c of
   `adaptive_rag.capacity` fed the measured service time and worker count, against the measured
   mean queue wait `timings.queue_wait_ms`, bootstrap 95 % interval).

`--cpu-latency-us 0` holds a CPU wake-up latency limit (PM QoS, `lab.harness.stats.hold_cpu_latency`) for
the run, to see what waking idle CPUs costs the path (`lab/experiments/wakeup_latency.py`).

Every point also records the front door's per-stage histogram (`arag_frontdoor_stage_seconds`,
difference of two scrapes around the window), the queue depths (the locustfile's sampler) and
the CPU each process used in the window (`lab.harness.stats.CpuMeter`), so the report can say what limited it.

Scratch (locust CSV/logs per point, the stack) goes to `var/ceiling/<run>/`; the full run writes
`reports/load/ceiling/README.md`, `report.json` and PNGs (the report is rewritten after every
tier, so an interrupted run still leaves what it measured). `--deadline HH:MM` (UTC) skips the
points that would end after it and says so in the report.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from lab.harness.stats import (
    CpuLatencyUnavailable, CpuMeter, hold_cpu_latency, mean_interval, percentile, slope,
)
from infra.local.servers import stop_process

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILE = "lab/loadtest/locustfile.py"
TIERS = ("A", "B", "C")
QUEUE = {"A": "tier-a", "B": "tier-b", "C": "tier-c"}
STAGES = ("authenticate", "validate", "knowledge", "idempotency", "classify", "record", "admit",
          "fair_share", "enqueue", "wait", "reply")

REFERENCES = [
    ("grpc.aio unary, one core", "about 4,300 requests/s"),
    ("Celery no-op tasks", "about 1,000 tasks/s"),
    ("Redis round trip", "about 0.2 ms"),
    ("Triton's own overhead per inference", "about 0.1 ms"),
]


@dataclass
class TierPlan:
    probe_users: int
    probe_window_s: float
    window_s: float  # per open-loop point (at least; slow tiers get longer for >= min_answers)
    max_window_s: float
    fractions: tuple[float, ...]  # of the probe's throughput, tried in order until one fails
    latency_points: bool = True
    min_answers: int = 20
    # Shares of the ceiling measured once it is found: latency and the front door's own overhead
    # against the offered load.
    latency_shares: tuple[float, ...] = (0.5, 0.9)


@dataclass
class ModePlan:
    mode: str
    ramp_s: float
    ramp_cap_s: float = 10.0
    tiers: dict[str, TierPlan] = field(default_factory=dict)


def full_plans() -> list[ModePlan]:
    ladder = (0.6, 0.85, 1.0, 1.15)
    # The machinery alone: the overhead's curve from a nearly idle machine to near the ceiling.
    instant = ModePlan("instant", ramp_s=4.0, tiers={
        t: TierPlan(probe_users=12, probe_window_s=15, window_s=20, max_window_s=20, fractions=ladder,
                    latency_shares=(0.1, 0.25, 0.5, 0.9))
        for t in TIERS})
    del ladder
    llm = ModePlan("llm-server", ramp_s=6.0, ramp_cap_s=40.0, tiers={
        "A": TierPlan(probe_users=8, probe_window_s=20, window_s=25, max_window_s=40, fractions=(0.6, 0.85, 1.0, 1.15)),
        "B": TierPlan(probe_users=4, probe_window_s=40, window_s=40, max_window_s=70, fractions=(0.7, 0.9, 1.05)),
        "C": TierPlan(probe_users=3, probe_window_s=60, window_s=60, max_window_s=120, fractions=(0.8, 1.0),
                      latency_points=False),
    })
    return [instant, llm]


def quick_plans() -> list[ModePlan]:
    return [ModePlan("instant", ramp_s=3.0, tiers={
        "A": TierPlan(probe_users=8, probe_window_s=8, window_s=8, max_window_s=8, fractions=(0.5, 1.3)),
    })]


# --- measuring ------------------------------------------------------------------------------------


def scrape(url: str) -> dict[str, tuple[float, float]]:
    """stage -> (sum s, count) of `arag_frontdoor_stage_seconds{method="Answer"}`."""
    from services.frontdoor.metrics import stage_totals

    with urllib.request.urlopen(url, timeout=5) as response:
        return stage_totals(response.read().decode())


def stage_delta(before: dict, after: dict) -> dict[str, dict[str, float]]:
    out = {}
    for stage, (s1, c1) in after.items():
        s0, c0 = before.get(stage, (0.0, 0.0))
        n = c1 - c0
        if n > 0:
            out[stage] = {"count": n, "mean_ms": (s1 - s0) / n * 1000.0, "total_s": s1 - s0}
    return out


def role_of_command(cmd: str) -> str:
    """The role of a process the stack did not start, from its command line."""
    for needle, label in (("locust", "locust (load generator)"), ("llama-server", "llama-server"),
                          ("llama_server", "llama-server"), ("instant_llm", "instant LLM"),
                          ("tritonserver", "triton"), ("ceiling", "benchmark driver")):
        if needle in cmd:
            return label
    return "other: " + (cmd[:60] or "?")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


@dataclass
class Stack:
    running: Any  # lab.harness.stack.LabStack
    env: dict[str, str]
    info: dict[str, Any]
    cpu: CpuMeter
    queue: Any = None  # workers.client.CeleryTaskQueue on the stack's broker, made when first needed


@contextmanager
def start_stack(mode: str, scratch: Path, console: Any, *, servers: bool = False,
                settings: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Iterator[Stack]:
    """The lab's stack with the parts of `python -m lab.loadtest --instant-llm` or of its default
    (the shared llama-server) (the environment's servers or the embedded ones; with `servers`,
    Redis and a durable PostgreSQL started here), pools A, B and C, the load-test tenant."""
    from lab.harness.stack import TIER_POOLS, Parts, lab_stack

    parts = Parts(broker="redis" if servers else None, records="postgres" if servers else None,
                  llm="instant" if mode == "instant" else "llama-server")
    with lab_stack(scratch / "stack", parts, pools=TIER_POOLS, settings=settings, env=env, tenants=("loadtest",),
                   postgres_durability="full", console=console) as running:
        info: dict[str, Any] = {"mode": mode, "llm": running.using["llm"], **running.facts()}
        env = {**os.environ, **(env or {}), "ARAG_API_KEY": running.api_key("loadtest")}
        yield Stack(running=running, env=env, info=info, cpu=CpuMeter(running.processes(), role_of_command))
    info["leftovers"] = running.leftovers


_POINTS = 0


def drain(st: Stack, timeout_s: float = 120.0) -> float | None:
    """Wait until every tier queue is empty (and 2 s more for the tasks in hand), so that no point
    starts with the backlog of the one before it; the seconds it took, None if still not empty."""
    from workers.celery_app import create_app
    from workers.client import CeleryTaskQueue

    if st.queue is None:
        st.queue = CeleryTaskQueue(create_app(st.running.settings.workers, results=False))
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if all(st.queue.depth(q) == 0 for q in QUEUE.values()):
            time.sleep(2.0)
            return time.monotonic() - started
        time.sleep(0.5)
    return None
DISTINCT = False  # `--distinct`: no query text repeats (no routing-cache hits)


def run_point(st: Stack, *, out: Path, tier: str, rate: float, users: int, ramp_s: float,
              window_s: float, answer_timeout: float, ramp_cap_s: float = 40.0,
              p95_bound_ms: float | None = None) -> dict[str, Any]:
    """One locust run (steady users, open loop at `rate` or closed loop if 0); the numbers of
    its measuring window [ramp, ramp + window], judged by `sustain_reasons`."""
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("locust*"):
        f.unlink()
    drained_s = drain(st)
    running = st.running
    spawn = max(1.0, users / 2.0)  # all started within ~2 s; each then waits a random phase < its period
    if rate > 0:  # the last user starts within spawn time + one period (`users / rate`)
        ramp_s = max(ramp_s, min(ramp_cap_s, users / spawn + users / rate + 1.0))
    run_time = math.ceil(ramp_s + window_s + 2.0)
    cmd = [sys.executable, "-m", "locust", "-f", LOCUSTFILE, "--headless", "--host", running.address,
           "--load-profile", "steady", "--users", str(users), "--spawn-rate", f"{spawn:g}",
           "--run-time", f"{math.ceil(run_time)}s", "--mix", f"{tier}=100", "--query-source", "all",
           "--csv", str(out / "locust"), "--only-summary", "--sample-interval", "1",
           "--answer-timeout", f"{answer_timeout:g}", "--metrics-url", running.metrics_url,
           "--expect-failures", "RESOURCE_EXHAUSTED,DEADLINE_EXCEEDED,UNAVAILABLE,INTERNAL,UNKNOWN",
           "--stop-timeout", "5"]
    redis_url = running.settings.workers.redis_url
    cmd += ["--redis-url", redis_url] if redis_url else ["--broker-dir", str(running.settings.workers.broker_dir)]
    if rate > 0:
        cmd += ["--rate", f"{rate:.4g}"]
    # a new query order per point: the same prompts again would hit llama-server's prompt cache
    global _POINTS
    _POINTS += 1
    cmd += ["--seed", str(int(time.time()) % 100_000 + _POINTS)]
    if DISTINCT:
        cmd += ["--distinct"]
    log = (out / "locust.log").open("w")
    log.write(f"$ {shlex.join(cmd)}\n"); log.flush()
    proc = subprocess.Popen(cmd, cwd=REPO, env=st.env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    samples_path = out / "locust_samples.jsonl"
    try:
        deadline = time.monotonic() + 90
        while not samples_path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        started = time.time()
        time.sleep(ramp_s)
        t0 = time.time(); cpu0 = st.cpu.snapshot(); st0 = scrape(running.metrics_url)
        time.sleep(max(0.0, t0 + window_s - time.time()))
        t1 = time.time(); cpu1 = st.cpu.snapshot(); st1 = scrape(running.metrics_url)
        code = proc.wait(timeout=run_time + 120)
    finally:
        stop_process(proc, signal.SIGINT, 30.0)
        log.close()
    window = t1 - t0
    rows = [r for r in read_jsonl(out / "locust_requests.jsonl")]
    started_in = [r for r in rows if t0 <= r.get("start", 0) < t1]
    finished_ok = [r for r in rows if r.get("ok") and t0 <= r.get("time", 0) < t1]
    ok_started = [r for r in started_in if r.get("ok")]
    failures: dict[str, int] = {}
    for r in rows:
        if not r.get("ok") and r.get("start", 0) >= started:
            failures[r.get("code", "?")] = failures.get(r.get("code", "?"), 0) + 1
    lat = [r["ms"] for r in ok_started]
    routed = {t: sum(1 for r in ok_started if r.get("tier") == t) for t in TIERS}
    samples = [s for s in read_jsonl(samples_path) if t0 - 0.5 <= s.get("time", 0) <= t1 + 0.5]
    depth_series = {q: [(s["time"] - t0, (s.get("queue_depth") or {}).get(q)) for s in samples] for q in QUEUE.values()}
    depth_series = {q: [(x, y) for x, y in pts if y is not None] for q, pts in depth_series.items()}
    q = QUEUE[tier]
    pts = depth_series[q]
    depth_slope = slope(pts)
    depth_last = pts[-1][1] if pts else None
    depth_max = max((y for _, y in pts), default=None)
    offered = len(started_in) / window
    answered = len(finished_ok) / window
    strategies: dict[str, int] = {}
    for r in ok_started:
        strategies[r.get("strategy") or "?"] = strategies.get(r.get("strategy") or "?", 0) + 1
    point: dict[str, Any] = {
        "tier": tier, "rate": rate, "users": users, "window_s": round(window, 2), "exit_code": code,
        "ramp_s": round(ramp_s, 1), "strategies": strategies, "drained_s": drained_s,
        "offered_rps": offered, "answered_rps": answered, "started": len(started_in),
        "answered": len(finished_ok), "failures": failures, "routed": routed,
        "latency_ms": {"p50": percentile(lat, 50), "p95": percentile(lat, 95), "p99": percentile(lat, 99),
                       "mean": (sum(lat) / len(lat)) if lat else None, "n": len(lat)},
        "overhead_ms": overhead_summary(ok_started),
        "depth": {"queue": q, "slope_per_s": depth_slope, "last": depth_last, "max": depth_max,
                  "mean": (sum(y for _, y in pts) / len(pts)) if pts else None,
                  "series": {k: v for k, v in depth_series.items()}},
        "stages": stage_delta(st0, st1),
        "cpu_pct": {role: round(100 * used / window, 1) for role, used in CpuMeter.used(cpu0, cpu1).items()
                    if 100 * used / window >= 1.0},
        "replies": [{k: r.get(k) for k in ("start", "tier", "ms", "queue_wait_ms", "strategy_ms",
                                            "classify_ms", "total_ms")} for r in ok_started],
    }
    if rate > 0:
        reasons = sustain_reasons(rate, window, len(started_in), len(finished_ok), failures, depth_series,
                                  point["latency_ms"]["p95"], p95_bound_ms)
        point["p95_bound_ms"] = p95_bound_ms
        point["sustained"] = not reasons
        point["verdict"] = "sustained" if not reasons else "; ".join(reasons)
    else:
        point["sustained"] = None
        point["verdict"] = f"closed-loop probe, {users} users"
    return point


def sustain_reasons(rate: float, window: float, started: int, answered: int, failures: dict[str, int],
                    depth_series: dict[str, list[tuple[float, float]]], p95_ms: float | None,
                    p95_bound_ms: float | None) -> list[str]:
    """Why one measuring window at offered `rate` was not sustained (empty: it was): fewer calls
    started than offered (the users fell behind), too few answered, any failure, a tier queue
    growing, or the p95 latency of the calls started in it above `p95_bound_ms` (a rate whose
    queue is stable but whose answers come late is not a rate the tier serves)."""
    reasons = []
    expected = rate * window  # calls a user period may leave out at the window's edges: counting noise
    if started < expected - max(0.05 * expected, math.sqrt(expected)):
        reasons.append(f"offered {started / window:.2f}/s < {rate:.3g} - max(5 %, sqrt(n)) (calls slower than the users' period)")
    if answered < 0.93 * started - 2:
        reasons.append(f"answered {answered} < 93 % of {started} started (minus 2)")
    if failures:
        reasons.append(f"failures {failures}")
    for name, series in depth_series.items():  # the tier's own queue and those it routes to
        grow, last = slope(series), (series[-1][1] if series else None)
        if grow is not None and grow > max(GROWTH_PER_S * rate, 0.5) and (last or 0) > 2:
            reasons.append(f"queue {name} growing {grow:+.2f}/s (last {last})")
    if p95_bound_ms is not None:
        if p95_ms is None:
            reasons.append("no answer to take a p95 of")
        elif p95_ms > p95_bound_ms:
            reasons.append(f"p95 {p95_ms:.0f} ms > bound {p95_bound_ms:.0f} ms")
    return reasons


# --- the search -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class P95Bound:
    """The latency a sustained rate must keep: p95 at most `factor` times the p95 of the tier's
    light-load reference point (`REFERENCE_SHARE` of the probe), at most `ms` (absolute), or,
    with both, at most the stricter of the two."""

    factor: float | None = None
    ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> P95Bound:
        """"3x" (relative to the light-load p95), "800ms" or "2s" (absolute), or both, comma
        separated ("3x,1s": the stricter)."""
        factor, ms = None, None
        for part in (p.strip().lower() for p in text.split(",")):
            try:
                if part.endswith("x") and factor is None:
                    factor = float(part[:-1])
                elif part.endswith("ms") and ms is None:
                    ms = float(part[:-2])
                elif part.endswith("s") and ms is None:
                    ms = 1000.0 * float(part[:-1])
                else:
                    raise ValueError
            except ValueError:
                raise ValueError(f"p95 bound {text!r}: expected e.g. 3x, 800ms, 2s or 3x,1s") from None
        if (factor is not None and factor <= 1.0) or (ms is not None and ms <= 0):
            raise ValueError(f"p95 bound {text!r}: a factor above 1 or a positive time")
        return cls(factor=factor, ms=ms)

    def ms_for(self, reference_p95_ms: float | None) -> float | None:
        """The bound in ms for a tier whose light-load p95 is `reference_p95_ms`; None (no bound,
        so no rate is shown sustained) when a relative part has no reference to scale."""
        limits = [] if self.ms is None else [self.ms]
        if self.factor is not None:
            if reference_p95_ms is None:
                return None
            limits.append(self.factor * reference_p95_ms)
        return min(limits)

    def __str__(self) -> str:
        relative = None if self.factor is None else f"{self.factor:g}x the light-load p95"
        absolute = None if self.ms is None else f"{self.ms:g} ms"
        if relative and absolute:
            return f"the stricter of {relative} and {absolute}"
        return relative or absolute or "none"


# The sustained p95 bound's default: 3x the tier's p95 at a light load (10 % of the probe). Why 3:
# - a queue's knee: an M/M/1 tier's p95 (s ln 20 / (1 - rho)) is 3x its idle p95 at rho = 2/3,
#   and with c > 1 workers the curve stays flatter longer and turns up sharper, so 3x marks where
#   waiting starts to dominate, not the flat part below it;
# - the committed runs: from 10 % to 50 % of their ceilings the p95 moved 1.0-1.9x (servers, tier B
#   distinct 28 -> 46 ms, tier A repeated 20 -> 38 ms; filesystem broker 215 -> 215 ms), so the
#   noise of a shared 2-core machine stays well inside 3x; at 90 % it was 3.3-5x on servers, and
#   at the ceilings those runs reported, whose queues held, 16-24x (456 ms against 28 ms): rates an
#   operator would not call served. The ceilings under this bound are lower than those, by design.
# An operator with a latency objective states it instead (`--p95-bound 500ms`).
DEFAULT_P95_BOUND = "3x"
# Per mode, the default adds an absolute cap where one answer has a fixed budget: with the instant
# LLM (the machinery alone, p95 of 15-50 ms at half its ceilings) no answer may take 1 s, the
# product's p95 target for tier A (`reports/load/mixed-ceiling`), whatever the light-load p95 was
# on a busy machine. With the model the tiers' latencies span 0.1-30 s, so the bound stays relative.
DEFAULT_P95_BOUNDS = {"instant": "3x,1s", "llm-server": DEFAULT_P95_BOUND}
REFERENCE_SHARE = 0.1  # the light-load reference point's rate, as a share of the probe's throughput
# Its window: long enough for this many answers (a p95 of a dozen is the second-largest of them),
# at most `REFERENCE_WINDOW_CAP` times the tier's longest point window.
REFERENCE_ANSWERS = 40
REFERENCE_WINDOW_CAP = 3.0
TRIALS = 3  # a rate is sustained when it holds in this many trials in a row


def in_trials(rate: float, trial: Any, trials: int) -> dict[str, Any]:
    """Run `trial(k)` (k = 1..trials) at `rate` until one is not sustained; the rate holds only
    when every one of the `trials` did. The summary keeps each trial's verdict and p95 and, for
    the search, the last trial's numbers."""
    done: list[dict[str, Any]] = []
    for k in range(1, trials + 1):
        p = trial(k)
        if p is None:  # skipped (deadline): the rate is not shown to hold
            break
        done.append(p)
        if not p["sustained"]:
            break
    held = len(done) == trials and all(p["sustained"] for p in done)
    summary = dict(done[-1]) if done else {"rate": rate, "latency_ms": {"p50": None, "p95": None}}
    summary.update(rate=rate, sustained=held, trials=len(done), trials_wanted=trials,
                   trial_verdicts=[p["verdict"] for p in done],
                   trial_p95_ms=[p["latency_ms"]["p95"] for p in done])
    if not held:
        failed = next((i for i, p in enumerate(done, 1) if not p["sustained"]), None)
        summary["verdict"] = (f"trial {failed}/{trials}: {done[failed - 1]['verdict']}" if failed
                              else f"{len(done)} of {trials} trials run (deadline)")
    else:
        summary["verdict"] = f"sustained in {trials} of {trials} trials"
    summary.pop("replies", None)
    return summary


def overhead_summary(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """The front door's own overhead per reply, `total_ms - queue_wait_ms - strategy_ms` (what
    is neither the strategy's run nor waiting in the tier queue): p50/p95/p99/mean and n, with
    the classification's p50 (part of it)."""
    own = [r["total_ms"] - r["queue_wait_ms"] - r["strategy_ms"] for r in replies
           if all(r.get(k) is not None for k in ("total_ms", "queue_wait_ms", "strategy_ms"))]
    classify = [r["classify_ms"] for r in replies if r.get("classify_ms") is not None]
    return {"p50": percentile(own, 50), "p95": percentile(own, 95), "p99": percentile(own, 99),
            "mean": (sum(own) / len(own)) if own else None, "n": len(own),
            "classify_p50": percentile(classify, 50)}


def users_for(rate: float, latency_s: float) -> int:
    """Users so that each user's period (users / rate) is well above the latency seen."""
    period = max(2.0, 2.0 * latency_s)
    return max(2, math.ceil(rate * period))


def fmt_point(p: dict[str, Any]) -> str:
    lat = p["latency_ms"]
    cpu = ", ".join(f"{k} {v:.0f}%" for k, v in list(p["cpu_pct"].items())[:4])
    return (f"  rate {p['rate']:.3g}/s users {p['users']}: offered {p['offered_rps']:.2f}/s answered "
            f"{p['answered_rps']:.2f}/s p50 {lat['p50'] or 0:.0f} p95 {lat['p95'] or 0:.0f} ms, depth last "
            f"{p['depth']['last']} slope {p['depth']['slope_per_s'] if p['depth']['slope_per_s'] is None else round(p['depth']['slope_per_s'], 2)}"
            f" -> {p['verdict']} | cpu {cpu}"
            + (f" | own overhead p50 {p['overhead_ms']['p50']:.1f} ms" if (p.get("overhead_ms") or {}).get("p50") else ""))


def measure_tier(st: Stack, plan: ModePlan, tier: str, tp: TierPlan, scratch: Path, deadline: float | None,
                 console: Any, bound: P95Bound | None = None, trials: int = TRIALS) -> dict[str, Any]:
    bound = bound or P95Bound.parse(DEFAULT_P95_BOUNDS.get(plan.mode, DEFAULT_P95_BOUND))
    res: dict[str, Any] = {"tier": tier, "points": [], "skipped": [], "rates": [], "trials": trials,
                           "p95_bound": str(bound)}
    answer_timeout = 120.0 if plan.mode == "llm-server" else 30.0

    def fits(window: float) -> bool:
        if deadline is None:
            return True
        return time.time() + plan.ramp_cap_s + window + 25 < deadline

    def point(rate: float, users: int, window: float, label: str, trial: int | None = None) -> dict[str, Any] | None:
        if not fits(window):
            res["skipped"].append({"rate": rate, "what": label, "why": "deadline"})
            console.print(f"  [yellow]skipped {label} at {rate:.3g}/s: deadline[/]")
            return None
        name = f"{label}-{rate:.4g}" + (f"-t{trial}" if trial else "")
        p = run_point(st, out=scratch / plan.mode / tier / name, tier=tier, rate=rate,
                      users=users, ramp_s=plan.ramp_s, window_s=window, answer_timeout=answer_timeout,
                      ramp_cap_s=plan.ramp_cap_s, p95_bound_ms=res.get("p95_bound_ms"))
        p["what"] = label
        if trial:
            p["trial"] = trial
        res["points"].append(p)
        console.print(fmt_point(p) + (f" [trial {trial}/{trials}]" if trial else ""))
        return p

    def ladder_rate(rate: float, users: int, window: float, label: str = "ladder") -> dict[str, Any] | None:
        """A rate of the search: sustained only when it holds in `trials` trials."""
        summary = in_trials(rate, lambda k: point(rate, users, window, label, k), trials)
        if not summary["trials"]:
            return None
        res["rates"].append(summary)
        console.print(f"  rate {rate:.3g}/s: {summary['verdict']}")
        return summary

    probe = point(0.0, tp.probe_users, tp.probe_window_s, "probe")
    if probe is None or probe["answered_rps"] <= 0:
        res["ceiling"] = None
        return res
    x = probe["answered_rps"]
    lat_s = (probe["latency_ms"]["p50"] or 100.0) / 1000.0 / max(1, tp.probe_users) * 1.0
    # single-call latency guess: the closed loop's p50 over its users' concurrency, floor 0.05 s
    base_latency = max(0.05, lat_s * 2)
    res["probe_rps"] = x

    def window_for(rate: float) -> float:
        return min(tp.max_window_s, max(tp.window_s, tp.min_answers / rate))

    if bound.factor is not None:  # relative: the tier's p95 at a light load first
        rate = round(x * REFERENCE_SHARE, 3)
        window = min(max(tp.window_s, REFERENCE_ANSWERS / rate), REFERENCE_WINDOW_CAP * tp.max_window_s)
        ref = point(rate, users_for(rate, base_latency), window, "reference")
        res["reference_p95_ms"] = ref["latency_ms"]["p95"] if ref is not None else None
        res["reference_n"] = ref["latency_ms"]["n"] if ref is not None else 0
    res["p95_bound_ms"] = bound.ms_for(res.get("reference_p95_ms"))
    if res["p95_bound_ms"] is None:  # no latency to hold the rates to: no rate is shown sustained
        res["ceiling"] = None
        res["note"] = "no light-load reference p95 (skipped or no answer): no bound, no ceiling"
        return res
    console.print(f"  p95 bound: {res['p95_bound_ms']:.0f} ms ({bound})")

    best: dict[str, Any] | None = None
    fractions = list(tp.fractions)
    i = -1
    while i + 1 < len(fractions):
        i += 1
        f = fractions[i]
        rate = round(x * f, 3)
        p = ladder_rate(rate, users_for(rate, max(base_latency, (probe["latency_ms"]["p50"] or 0) / 1000.0)),
                        window_for(rate))
        if p is None:
            break
        if p["sustained"]:
            best = p
            if i == len(fractions) - 1 and len(fractions) < len(tp.fractions) + 2:
                fractions.append(f * 1.2)  # every rate held: go on up (at most two more)
        else:
            if best is None and i == 0:  # not even the lowest: one lower try
                rate = round(x * f * 0.6, 3)
                p2 = ladder_rate(rate, users_for(rate, (probe["latency_ms"]["p95"] or 0) / 1000.0 * 1.5),
                                 window_for(rate))
                if p2 is not None and p2["sustained"]:
                    best = p2
            elif best is not None:
                best = refine(best, rate, ladder_rate, users_for, window_for,
                              max(base_latency, (probe["latency_ms"]["p50"] or 0) / 1000.0))
            break
    res["ceiling"] = best["rate"] if best else None
    if best and tp.latency_points:
        lat_s = max(0.05, (best["latency_ms"]["p95"] or 100.0) / 1000.0)
        for share in tp.latency_shares:
            rate = round(best["rate"] * share, 3)
            p = point(rate, users_for(rate, lat_s), window_for(rate), f"at{int(share * 100)}")
            if p is not None:
                p["share_of_ceiling"] = share
    return res


# A queue growing faster than this share of the offered rate per second (or 0.5/s) is not
# sustained: at 150/s, 1.5 tasks/s, i.e. a backlog of at most 30 tasks (0.2 s of work) in a 20 s window.
GROWTH_PER_S = 0.01
REFINE_STEPS = 2  # bisection points between the highest sustained and the lowest failed rate
REFINE_UNTIL = 0.04  # stop once the bracket is this narrow (share of the sustained rate)


def refine(best: dict[str, Any], failed_rate: float, point: Any, users_for: Any, window_for: Any,
           latency_s: float) -> dict[str, Any]:
    """Narrow the bracket the ladder left (its steps are 15-25 % apart): up to `REFINE_STEPS`
    points halfway between the highest sustained rate and the lowest failed one; the highest
    sustained point is returned (the ceiling)."""
    low, high = best["rate"], failed_rate
    for _ in range(REFINE_STEPS):
        if high - low < REFINE_UNTIL * low:
            break
        rate = round((low + high) / 2, 3)
        p = point(rate, users_for(rate, latency_s), window_for(rate), "ladder")
        if p is None:
            break
        if p["sustained"]:
            best, low = p, rate
        else:
            high = rate
    return best


# --- planner check --------------------------------------------------------------------------------


def planner_check(mode: str, tier: str, tier_res: dict[str, Any], workers: int) -> list[dict[str, Any]]:
    from adaptive_rag.capacity import CapacityError, evaluate_tier

    out = []
    for p in tier_res["points"]:
        if not p["what"].startswith("at"):
            continue
        reps = [r for r in p["replies"] if r.get("tier") == tier and r.get("queue_wait_ms") is not None]
        if len(reps) < 5:
            continue
        waits = [r["queue_wait_ms"] for r in reps]
        service = [r["strategy_ms"] for r in reps if r.get("strategy_ms") is not None]
        lam = len(reps) / p["window_s"]
        s_mean = sum(service) / len(service) / 1000.0
        row: dict[str, Any] = {
            "mode": mode, "tier": tier, "share_of_ceiling": p.get("share_of_ceiling"), "offered_rps": p["offered_rps"],
            "arrival_rate_tier": lam, "workers": workers, "service_mean_ms": s_mean * 1000,
            "service_cv2": _cv2(service), "measured_wait_mean_ms": sum(waits) / len(waits),
            "measured_wait_p50_ms": percentile(waits, 50), "measured_wait_min_ms": min(waits),
            "measured_wait_ci_ms": (ci.low, ci.high) if (ci := mean_interval(waits)) else None, "n": len(waits),
        }
        starts = sorted(r["start"] for r in reps)
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        row["arrival_cv2"] = _cv2(gaps)
        try:
            plan = evaluate_tier(tier, lam, s_mean, workers, p95_target_s=max(1.0, s_mean * 10))
            row["utilization"] = plan.utilization
            row["prob_wait"] = plan.prob_wait
            row["predicted_wait_mean_ms"] = plan.wq_mean_s * 1000
            # Allen-Cunneen (G/G/c): M/M/c's wait x (ca^2 + cs^2) / 2
            if row["arrival_cv2"] is not None and row["service_cv2"] is not None:
                row["allen_cunneen_wait_mean_ms"] = plan.wq_mean_s * 1000 * (row["arrival_cv2"] + row["service_cv2"]) / 2
        except CapacityError as exc:
            row["predicted_wait_mean_ms"] = None
            row["error"] = str(exc)
        out.append(row)
    return out


def _cv2(values: list[float]) -> float | None:
    if len(values) < 3:
        return None
    m = sum(values) / len(values)
    if m <= 0:
        return None
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return var / (m * m)


# --- report ---------------------------------------------------------------------------------------


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v:,.{digits}f}"
    return str(v)


def write_report(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    slim = json.loads(json.dumps(result, default=str))
    for mode in slim.get("modes", {}).values():
        for tr in mode.get("tiers", {}).values():
            for p in tr.get("points", []):
                p.pop("replies", None)
    (out / "report.json").write_text(json.dumps(slim, indent=1))
    plots = make_plots(result, out)
    L: list[str] = []
    L.append("# The serving path's ceiling: machinery alone (instant LLM) and end to end (llama-server)\n")
    L.append(f"Command: `{result['command']}`  ")
    L.append(f"Run: {result['started']} -> {result.get('finished', '(running)')}; {result['machine']}\n")
    L.append("Load: locust (`lab/loadtest/locustfile.py`), one tier at a time (`--mix A=100`, then B, then C; "
             "the query pools of that expected tier, the router may send some elsewhere: column `routed`), "
             "**open loop** at a fixed offered rate with locust's `constant_throughput(R/users)` (`--rate R`), "
             "users chosen so each user's period (users/R) is >= 2 s and >= 2x the closed-loop probe's p50 latency, each user starting at a random phase within its first period. Each point: a ramp, "
             "then a measuring window; offered = calls started in the window / window, answered = OK "
             "replies finished in the window / window. **Sustained** = held in every one of "
             f"{result.get('trials', 1)} trials (runs of their own, stopped at the first that fails), each with: calls started >= R x window minus max(5 %, sqrt(n)) (counting noise of paced users at the window's edges), answered >= "
             "93 % of started (minus two), no failure, the tier queue not growing (least-squares slope "
             "< max(0.01 R, 0.5)/s, or depth <= 2), and p95 latency within the bound "
             f"({result.get('p95_bound', 'none: a run from before the bound')}; per tier in ms below; a relative "
             "bound is taken from a light-load `reference` point at 10 % of the probe's throughput). Ceiling = highest sustained rate tried (the next rate "
             "up failed, so the true ceiling lies between). A closed-loop probe (no think time) gives the first "
             "guess; rates tried are fractions of it.\n")
    L.append(f"Settings: servers {result.get('servers', 'embedded defaults (SQLite, filesystem broker)')}; "
             f"queries {'distinct (every text tagged `[seed.pass]`: no routing-cache hits)' if result.get('distinct_queries') else 'from the pools as they are (repeats hit the routing cache)'}; "
             f"tenant rate limit {result.get('tenant_rate')}; tracing {result.get('tracing', '-')}; "
             f"CPU wake-up latency limit {result.get('cpu_latency_limit', 'none')}; "
             f"ARAG_CONCURRENCY {result.get('concurrency_env') or 'the stack default'}.\n")
    for mname, mode in result.get("modes", {}).items():
        info = mode.get("stack", {})
        L.append(f"## Mode `{mname}`\n")
        L.append(f"- LLM: {info.get('llm')}")
        L.append(f"- stack: {info.get('stack')}")
        L.append(f"- worker processes per pool: {info.get('concurrency')}, prefetch {info.get('prefetch')}, "
                 f"queue limits {info.get('queue_limits')}\n")
        L.append("### Ceiling per tier\n")
        L.append("| tier | closed-loop probe (answers/s) | light-load p95 ms (n) | p95 bound ms | ceiling (answers/s) | "
                 "rates tried -> verdict (p95 ms of each trial) |")
        L.append("| --- | ---: | ---: | ---: | ---: | --- |")
        for t, tr in mode.get("tiers", {}).items():
            rates = tr.get("rates") or [p for p in tr["points"] if p["what"] == "ladder"]  # runs before trials
            tried = "; ".join(
                f"{p['rate']:.3g}: {'OK' if p['sustained'] else 'no (' + p['verdict'] + ')'}"
                + (f" [{', '.join(_f(x, 0) for x in p['trial_p95_ms'])}]" if p.get("trial_p95_ms") else "")
                for p in rates)
            skipped = "; ".join(f"{s['rate']:.3g} {s['what']} skipped ({s['why']})" for s in tr.get("skipped", []))
            ref_n = f" ({tr['reference_n']})" if tr.get("reference_n") is not None else ""
            L.append(f"| {t} | {_f(tr.get('probe_rps'), 2)} | {_f(tr.get('reference_p95_ms'), 0)}{ref_n} | "
                     f"{_f(tr.get('p95_bound_ms'), 0)} | **{_f(tr.get('ceiling'), 2)}** | {tried}"
                     f"{' ; ' + skipped if skipped else ''}{' ; ' + tr['note'] if tr.get('note') else ''} |")
        L.append("\n### Every point\n")
        L.append("| tier | what | rate | users | window s | offered/s | answered/s | routed A/B/C | p50 ms | p95 ms | p99 ms | "
                 "queue depth last / max / slope per s | top CPU (% of one core) | verdict |")
        L.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- | --- | --- |")
        for t, tr in mode.get("tiers", {}).items():
            for p in tr["points"]:
                lat = p["latency_ms"]; d = p["depth"]
                cpu = ", ".join(f"{k} {v:.0f}" for k, v in list(p["cpu_pct"].items())[:4])
                what = p["what"] + (f" (trial {p['trial']})" if p.get("trial") else "")
                L.append(f"| {t} | {what} | {_f(p['rate'], 2)} | {p['users']} | {_f(p['window_s'], 0)} | "
                         f"{_f(p['offered_rps'], 2)} | {_f(p['answered_rps'], 2)} | "
                         f"{p['routed']['A']}/{p['routed']['B']}/{p['routed']['C']} | {_f(lat['p50'], 0)} | "
                         f"{_f(lat['p95'], 0)} | {_f(lat['p99'], 0)} | {_f(d['last'])} / {_f(d['max'])} / "
                         f"{_f(d['slope_per_s'], 2)} | {cpu} | {p['verdict']} |")
        L.append("\n### Latency and the front door's own overhead at shares of the ceiling\n")
        L.append("Own overhead = `total_ms - queue_wait_ms - strategy_ms` of each reply started in the "
                 "measuring window (the front door's stages plus the worker's claim, result write and "
                 "result publish; neither the strategy nor the wait in the tier queue). CPU: every "
                 "process of the run, locust included (% of one core).\n")
        L.append("| tier | ceiling | share | rate | answered/s | CPU % | p50 ms | p95 ms | p99 ms | "
                 "own overhead p50 / p95 / p99 ms | classify p50 ms | n | sustained |")
        L.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |")
        for t, tr in mode.get("tiers", {}).items():
            for p in tr["points"]:
                if p["what"].startswith("at"):
                    lat, own = p["latency_ms"], p.get("overhead_ms") or {}
                    L.append(f"| {t} | {_f(tr.get('ceiling'), 2)} | {round(p['share_of_ceiling'] * 100)} % | "
                             f"{_f(p['rate'], 2)} | {_f(p['answered_rps'], 2)} | "
                             f"{_f(sum(p['cpu_pct'].values()), 0)} | {_f(lat['p50'], 0)} | "
                             f"{_f(lat['p95'], 0)} | {_f(lat['p99'], 0)} | {_f(own.get('p50'))} / "
                             f"{_f(own.get('p95'))} / {_f(own.get('p99'))} | {_f(own.get('classify_p50'))} | "
                             f"{lat['n']} | {p['sustained']} |")
        L.append("\n### Where an Answer's time goes (front door's `arag_frontdoor_stage_seconds`, mean ms per "
                 "call that went through the stage, measuring windows only)\n")
        L.append("| tier | point | " + " | ".join(STAGES) + " | sum | wait = queue wait + strategy + rest | client p50 |")
        L.append("| --- | --- | " + " | ".join("---:" for _ in STAGES) + " | ---: | --- | ---: |")
        for t, tr in mode.get("tiers", {}).items():
            for p in tr["points"]:
                if not (p["what"].startswith("at") or (p["what"] == "ladder" and p["rate"] == tr.get("ceiling"))):
                    continue
                st = p["stages"]
                tot = sum(v["mean_ms"] for v in st.values())
                label = ("ceiling" + (f", trial {p['trial']}" if p.get("trial") else "") if p["what"] == "ladder"
                         else p["what"].replace("at", "") + " %")
                reps = p.get("replies") or []
                qw = [r["queue_wait_ms"] for r in reps if r.get("queue_wait_ms") is not None]
                sm = [r["strategy_ms"] for r in reps if r.get("strategy_ms") is not None]
                wait = st.get("wait", {}).get("mean_ms")
                split = "-"
                if qw and sm and wait is not None:
                    mq, ms_ = sum(qw) / len(qw), sum(sm) / len(sm)
                    split = f"{_f(mq, 1)} + {_f(ms_, 1)} + {_f(wait - mq - ms_, 1)}"
                L.append(f"| {t} | {label} ({p['rate']:.3g}/s) | " + " | ".join(
                    _f(st.get(s, {}).get("mean_ms"), 2) for s in STAGES) + f" | {_f(tot, 1)} | {split} | "
                    f"{_f(p['latency_ms']['p50'], 0)} |")
        others = sorted({s for tr in mode.get("tiers", {}).values() for p in tr["points"] for s in p["stages"]} - set(STAGES))
        if others:
            L.append(f"\nOther stages seen: {', '.join(others)}.")
        L.append("")
    checks = result.get("planner", [])
    L.append("## Capacity planner check (M/M/c, `adaptive_rag.capacity.evaluate_tier`)\n")
    L.append("Inputs per point: the tier's arrival rate (replies routed to the tier / window), the mean "
             "service time per task = mean `timings.strategy_ms` of those replies, the tier pool's worker "
             "processes. Measured: mean `timings.queue_wait_ms` of the same replies, 95 % percentile-bootstrap "
             "interval (2000 resamples). `cv2`: squared coefficient of variation of service times and of "
             "arrival gaps; Allen-Cunneen = M/M/c wait x (ca2 + cs2)/2 (a G/G/c correction), for comparison.\n")
    L.append("| mode | tier | share | lambda/s | c | s mean ms | rho | P(wait) | predicted Wq ms | Allen-Cunneen ms | "
             "measured Wq ms [95 % CI] | measured p50 / min ms | cs2 | ca2 | n |")
    L.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |")
    for c in checks:
        ci = c.get("measured_wait_ci_ms")
        L.append(f"| {c['mode']} | {c['tier']} | {int((c['share_of_ceiling'] or 0) * 100)} % | {_f(c['arrival_rate_tier'], 2)} | "
                 f"{c['workers']} | {_f(c['service_mean_ms'], 1)} | {_f(c.get('utilization'), 2)} | "
                 f"{_f(c.get('prob_wait'), 2)} | {_f(c.get('predicted_wait_mean_ms'), 1)} | "
                 f"{_f(c.get('allen_cunneen_wait_mean_ms'), 1)} | {_f(c['measured_wait_mean_ms'], 1)} "
                 f"[{_f(ci[0], 1) if ci else '-'}, {_f(ci[1], 1) if ci else '-'}] | "
                 f"{_f(c['measured_wait_p50_ms'], 1)} / {_f(c['measured_wait_min_ms'], 1)} | "
                 f"{_f(c['service_cv2'], 2)} | {_f(c['arrival_cv2'], 2)} | {c['n']} |")
    L.append("")
    L.append("## Reference figures (not measured here)\n")
    L.append("| what | figure |\n| --- | --- |")
    for k, v in REFERENCES:
        L.append(f"| {k} | {v} |")
    L.append("")
    limits = limit_notes(result)
    if limits:
        L.append("## What limited each ceiling (CPU per process, % of one core; the machine has "
                 f"{os.cpu_count()} cores = {100 * (os.cpu_count() or 1)} %)\n")
        L.extend(limits)
        L.append("")
    if result.get("notes"):
        L.append("## Reading\n")
        L.extend(result["notes"])
        L.append("")
    if plots:
        L.append("## Plots\n")
        L.extend(f"![{p}]({p})" for p in plots)
        L.append("")
    L.append("Per-point locust CSV/logs: `var/ceiling/<run>/` (scratch, not committed); every number above: `report.json`.")
    (out / "README.md").write_text("\n".join(L) + "\n")


def limit_notes(result: dict[str, Any]) -> list[str]:
    out = []
    for mname, mode in result.get("modes", {}).items():
        for t, tr in mode.get("tiers", {}).items():
            ladder = [p for p in tr["points"] if p["what"] == "ladder"]
            failed = [p for p in ladder if not p["sustained"]]
            at = failed[0] if failed else (ladder[-1] if ladder else None)
            ceil = [p for p in ladder if p["sustained"] and p["rate"] == tr.get("ceiling")]
            for label, p in (("at the ceiling", ceil[0] if ceil else None), ("first rate not sustained", at if failed else None)):
                if p is None:
                    continue
                total = sum(p["cpu_pct"].values())
                top = ", ".join(f"{k} {v:.0f}" for k, v in list(p["cpu_pct"].items())[:5])
                out.append(f"- {mname}, tier {t}, {label} ({p['rate']:.3g}/s): all processes {total:.0f} %; {top}")
    return out


def make_plots(result: dict[str, Any], out: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return []
    names = []
    for mname, mode in result.get("modes", {}).items():
        tiers = list(mode.get("tiers", {}).items())
        if not tiers:
            continue
        fig, axes = plt.subplots(3, len(tiers), figsize=(4.6 * len(tiers), 11), squeeze=False)
        for i, (t, tr) in enumerate(tiers):
            ax = axes[0][i]
            pts = [p for p in tr["points"] if p["rate"] > 0]
            hi = max([p["offered_rps"] for p in tr["points"]] + [p["rate"] for p in pts] + [0.1])
            ax.plot([0, hi * 1.1], [0, hi * 1.1], color="grey", ls=":", lw=1, label="answered = offered")
            for p in pts:
                ax.scatter(p["offered_rps"], p["answered_rps"], marker="o" if p["sustained"] else "x",
                           color="tab:green" if p["sustained"] else "tab:red", zorder=3)
                ax.annotate(f"{p['rate']:.3g}", (p["offered_rps"], p["answered_rps"]), fontsize=7,
                            xytext=(3, -9), textcoords="offset points")
            probe = [p for p in tr["points"] if p["what"] == "probe"]
            if probe:
                ax.axhline(probe[0]["answered_rps"], color="tab:blue", lw=1, ls="--", label="closed-loop probe")
            if tr.get("ceiling"):
                ax.axvline(tr["ceiling"], color="tab:green", lw=1, ls="--", label=f"ceiling {tr['ceiling']:.3g}/s")
            ax.set_title(f"{mname}: tier {t}")
            ax.set_xlabel("offered Answers/s (o sustained, x not)")
            ax.set_ylabel("answered/s")
            ax.legend(fontsize=7)
            ax2 = axes[1][i]
            for p in sorted(pts, key=lambda p: p["rate"]):
                series = p["depth"]["series"].get(QUEUE[t]) or []
                if series:
                    ax2.plot([x for x, _ in series], [y for _, y in series], label=f"{p['rate']:.3g}/s",
                             ls="-" if p["sustained"] else "--")
            ax2.set_title(f"queue {QUEUE[t]} depth during the window")
            ax2.set_xlabel("s into the measuring window")
            ax2.set_ylabel("messages queued")
            ax2.legend(fontsize=7, title="offered", title_fontsize=7)
            curve = sorted((p for p in pts if p["what"].startswith("at") and (p.get("overhead_ms") or {}).get("n")),
                           key=lambda p: p["rate"])
            if curve:
                ax3 = axes[2][i]
                for q, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
                    ax3.plot([p["offered_rps"] for p in curve], [p["overhead_ms"][q] for p in curve], style,
                             label=f"own overhead {q}")
                for y, what in ((5, "p50 target"), (20, "p99 target")):
                    ax3.axhline(y, color="grey", lw=0.8, ls=":")
                    ax3.annotate(what, (curve[0]["offered_rps"], y), fontsize=7, xytext=(0, 2),
                                 textcoords="offset points")
                for p in curve:
                    ax3.annotate(f"{round(p['share_of_ceiling'] * 100)} %", (p["offered_rps"], p["overhead_ms"]["p50"]),
                                 fontsize=7, xytext=(3, -10), textcoords="offset points")
                ax3.set_ylim(bottom=0)
                ax3.set_title("the front door's own overhead against the load")
                ax3.set_xlabel("offered Answers/s (share of the ceiling)")
                ax3.set_ylabel("ms")
                ax3.legend(fontsize=7)
            else:
                axes[2][i].set_visible(False)
        fig.tight_layout()
        name = f"ceiling_{mname}.png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        names.append(name)
    return names


def machine() -> str:
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return (f"{os.cpu_count()} CPU cores, {platform.platform()}, Python {platform.python_version()}; "
            f"load average at start {load}; the machine is shared with other jobs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.experiments.ceiling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="instant mode, tier A, two rates (~3 min); var/ceiling/quick")
    parser.add_argument("--modes", default="instant,llm-server", help="instant,llm-server (default both)")
    parser.add_argument("--tiers", default="A,B,C")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default reports/load/ceiling, quick: var/ceiling/quick)")
    parser.add_argument("--scratch", type=Path, default=None, help="default var/ceiling/<run>")
    parser.add_argument("--deadline", default=None, help="HH:MM UTC: skip points that would end after it")
    parser.add_argument("--tenant-rate", default=None,
                        help="ARAG_TENANT_RATE for the stack (all load comes from ONE tenant, whose token "
                             "bucket defaults to 50 queries/s, burst 100: 0 lifts it to see the machinery "
                             "behind it; default: the stack's own setting)")
    parser.add_argument("--servers", action="store_true",
                        help="records and broker on servers this run starts on loopback (PostgreSQL with its "
                             "durable defaults, Redis) instead of the embedded SQLite and filesystem broker")
    parser.add_argument("--distinct", action="store_true",
                        help="every query text distinct (locust --distinct): the front door's routing cache never answers")
    parser.add_argument("--trace-sample", type=float, default=None,
                        help="trace this share of requests (OpenTelemetry's parentbased_traceidratio sampler, "
                             "as a production deployment would; default: the local stack's own, every request "
                             "traced to files)")
    parser.add_argument("--cpu-latency-us", type=int, default=None,
                        help="hold this CPU wake-up latency limit (Linux PM QoS, /dev/cpu_dma_latency; "
                             "0 = idle CPUs poll instead of halting; needs root) for the whole run, to "
                             "see what idle vCPUs' wake-ups cost (see lab.harness.stats.hold_cpu_latency)")
    parser.add_argument("--p95-bound", default=None,
                        help="a sustained rate keeps its p95 latency within this: 'Nx' = N times the tier's p95 at "
                             "a light load (a reference point at 10 %% of the probe's throughput), an absolute "
                             "'800ms' / '2s', or both '3x,1s' (the stricter); for every mode (default per mode: "
                             + ", ".join(f"{m} {b}" for m, b in DEFAULT_P95_BOUNDS.items()) + "; see DEFAULT_P95_BOUNDS)")
    parser.add_argument("--trials", type=int, default=TRIALS,
                        help="a rate is sustained when it holds in this many trials in a row (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        bounds = {mode: P95Bound.parse(args.p95_bound or given) for mode, given in DEFAULT_P95_BOUNDS.items()}
    except ValueError as exc:
        parser.error(str(exc))
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    stack_env = ({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": f"{args.trace_sample:g}"}
                 if args.trace_sample is not None else {})
    global DISTINCT
    DISTINCT = args.distinct
    stack_settings = {"tenant_rate_per_s": float(args.tenant_rate)} if args.tenant_rate is not None else {}
    from rich.console import Console

    from services.demo.local import install_stop_signals

    console = Console(width=160)
    started = datetime.now(timezone.utc)
    run = "quick" if args.quick else f"full-{started:%Y%m%d-%H%M%S}"
    out = (args.out or (REPO / "var/ceiling/quick" if args.quick else REPO / "reports/load/ceiling")).resolve()
    scratch = (args.scratch or REPO / "var/ceiling" / run).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    deadline = None
    if args.deadline:
        hh, mm = (int(x) for x in args.deadline.split(":"))
        d = started.replace(hour=hh, minute=mm, second=0, microsecond=0)
        deadline = d.timestamp()
    plans = quick_plans() if args.quick else [p for p in full_plans() if p.mode in args.modes.split(",")]
    tiers_wanted = [t.strip().upper() for t in args.tiers.split(",")]
    result: dict[str, Any] = {
        "command": shlex.join([".venv/bin/python", "-m", "lab.experiments.ceiling", *(argv if argv is not None else sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"), "machine": machine(), "modes": {}, "planner": [],
        "distinct_queries": args.distinct, "p95_bound": "; ".join(f"{m}: {b}" for m, b in bounds.items()), "trials": args.trials,
        "tracing": (f"{args.trace_sample:.0%} of requests (parentbased_traceidratio)" if args.trace_sample is not None
                    else "every request, to JSON-lines files (the local stack's default)"),
        "concurrency_env": os.environ.get("ARAG_CONCURRENCY"),
        "tenant_rate": (args.tenant_rate if args.tenant_rate is not None
                        else os.environ.get("ARAG_TENANT_RATE", "stack default (50/s, burst 100)")),
        "references": dict(REFERENCES), "scratch": str(scratch.relative_to(REPO) if scratch.is_relative_to(REPO) else scratch),
    }
    install_stop_signals()
    code = 0
    held = ExitStack()  # the CPU latency limit, for the whole run
    result["cpu_latency_limit"] = (f"{args.cpu_latency_us} us (PM QoS held for the run)"
                                   if args.cpu_latency_us is not None else "none (the machine's idle states)")
    try:
        held.enter_context(hold_cpu_latency(args.cpu_latency_us))
    except CpuLatencyUnavailable as exc:
        parser.error(str(exc))
    try:
        if args.servers:
            result["servers"] = "PostgreSQL (fsync and synchronous commit on) and Redis, on loopback"
        for plan in plans:
            console.rule(f"[bold]mode {plan.mode}: starting the stack")
            mode_res: dict[str, Any] = {"tiers": {}}
            result["modes"][plan.mode] = mode_res
            with start_stack(plan.mode, scratch / plan.mode, console, servers=args.servers,
                             settings=stack_settings, env=stack_env) as st:
                mode_res["stack"] = st.info
                for tier, tp in plan.tiers.items():
                    if tier not in tiers_wanted:
                        continue
                    console.rule(f"{plan.mode}: tier {tier}")
                    tr = measure_tier(st, plan, tier, tp, scratch, deadline, console, bounds[plan.mode], args.trials)
                    mode_res["tiers"][tier] = tr
                    console.print(f"[bold]{plan.mode} tier {tier}: ceiling {tr.get('ceiling')} answers/s[/]")
                    if tier in ("A", "B"):
                        result["planner"] += planner_check(plan.mode, tier, tr, st.info["concurrency"][tier])
                    write_report(result, out)
            mode_res["leftovers"] = st.info.get("leftovers")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: writing what was measured[/]")
        result["interrupted"] = True
        code = 130
    finally:
        held.close()
        result["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        write_report(result, out)
    for c in result["planner"]:
        console.print(f"planner {c['mode']} {c['tier']} {c['share_of_ceiling']}: predicted "
                      f"{_f(c.get('predicted_wait_mean_ms'), 2)} ms, measured {_f(c['measured_wait_mean_ms'], 2)} ms "
                      f"{c['measured_wait_ci_ms']}")
    console.print(f"report: {out / 'README.md'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
