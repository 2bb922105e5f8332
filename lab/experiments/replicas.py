"""Do two front-door replicas behind the load balancer serve more than one? The ceiling of one
and of two replicas, with the instant LLM (the serving path without the model's cost), and the CPU
each process used at it.

    .venv/bin/python -m lab.experiments.replicas                 # ~10 min, writes reports/replicas/
    .venv/bin/python -m lab.experiments.replicas --quick         # ~3 min smoke run, var/replicas/quick

Per configuration (`one`: a front door on host1; `two`: front doors on host1 and host2) the lab's
stack runs across hosts (`lab.harness.stack.lab_stack(hosts=...)`: network namespaces on one
bridge; Redis, PostgreSQL and the instant LLM on host0, nginx `grpc_pass` on `lb` with its gRPC
health watcher, tier-A worker pools on host3 and host4), started afresh. The load is this process's
grpc.aio client (`lab.harness.load_client`) on the balancer's one address, tier-A questions (the
rules route three-word questions there: no retrieval), each text distinct (no cache answers), traces off:

1. a closed-loop probe (`--clients` clients, no think time, `--window` s); the one-replica
   configuration runs first and its probe's answers/s is X for both configurations (the same
   rates are tried on each);
2. a light-load reference at 25 % of X: its p95 times 3 (at least 100 ms) is the latency bound;
3. open-loop rates at fractions of X (0.3, 0.45, 0.6, 0.8, 0.9, 1.0, 1.1 ...), each held `--trials`
   times for `--window` s; a rate is **sustained** when in every trial all calls of the window
   were answered OK within it (none refused, failed or still running at its end plus 5 s) and the
   p95 latency is within the bound. The ladder stops at the first rate not sustained; the ceiling
   is the highest sustained rate (the true one lies between it and the next).

Every window records each call (start, end, status), the CPU each role's processes used
(`lab.harness.stats.CpuMeter`), the load average. On two shared cores with other jobs beside it,
the figures speak for this machine only, and the processes of both "hosts" share the same cores:
the ratio two/one says whether the front door limits one replica, or which process saturates the
cores first.

Writes `README.md`, `summary.json`, `calls.jsonl.gz` (every call: the figures recompute from it)
and `replicas.png` to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.harness.load_client import CallRecord, LoadClient, open_loop
from lab.harness.stats import CpuMeter, percentile

REPO = Path(__file__).resolve().parents[2]
CONFIGS = {"one": ("host1",), "two": ("host1", "host2")}
LADDER = (0.3, 0.45, 0.6, 0.8, 0.9, 1.0, 1.1, 1.25, 1.4)
REFERENCE_SHARE = 0.25
BOUND_FACTOR, BOUND_FLOOR_MS = 3.0, 100.0
GRACE_S = 5.0  # a call of the window may finish this long after it
POOL_CONCURRENCY = 2  # tier-A worker processes per worker host


def role_of_command(cmd: str) -> str | None:
    """Processes the stack does not list itself, by command line."""
    for needle, role in (("redis-server", "redis"), ("postgres", "postgresql"), ("instant_llm", "instant LLM"),
                         ("nginx", "load balancer"), ("lab.experiments.replicas", "load generator (this process)")):
        if needle in cmd:
            return role
    return None


@dataclass
class Point:
    config: str
    what: str  # probe | reference | ladder
    rate: float  # offered per second (0: closed loop)
    trial: int
    window_s: float
    calls: list[CallRecord] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # role -> CPU seconds in the window
    load: tuple[float, float, float] | None = None

    def ok(self) -> list[CallRecord]:
        return [c for c in self.calls if c.ok]

    def p95_ms(self) -> float | None:
        return percentile([c.latency_ms for c in self.ok()], 95)

    def summary(self, bound_ms: float | None) -> dict[str, Any]:
        started = self.calls[0].start if self.calls else 0.0
        answered = [c for c in self.ok() if c.end <= started + self.window_s + GRACE_S]
        failed = {}
        for c in self.calls:
            if not c.ok:
                failed[c.code] = failed.get(c.code, 0) + 1
        p95 = self.p95_ms()
        reasons = []
        if self.what == "ladder":
            if failed:
                reasons.append(f"calls not OK {failed}")
            if len(answered) < len(self.calls):
                reasons.append(f"{len(self.calls) - len(answered)} of {len(self.calls)} not answered in time")
            if bound_ms is not None and (p95 is None or p95 > bound_ms):
                reasons.append(f"p95 {p95:.0f} ms > bound {bound_ms:.0f} ms" if p95 else "no answer")
        return {
            "config": self.config, "what": self.what, "rate": round(self.rate, 2), "trial": self.trial,
            "window_s": self.window_s, "calls": len(self.calls), "ok": len(self.ok()),
            "answered_per_s": round(len(answered) / self.window_s, 2), "failed": failed,
            "p50_ms": percentile([c.latency_ms for c in self.ok()], 50), "p95_ms": p95,
            "p99_ms": percentile([c.latency_ms for c in self.ok()], 99),
            "cpu_percent_of_one_core": {k: round(100 * v / self.window_s, 1) for k, v in self.cpu.items()},
            "cpu_percent_total": round(100 * sum(self.cpu.values()) / self.window_s, 1),
            "load_average": self.load, "sustained": not reasons if self.what == "ladder" else None,
            "reasons": reasons,
        }


class Run:
    """One configuration's stack and its measurements."""

    def __init__(self, config: str, stack: Any, key: str, window_s: float) -> None:
        self.config, self.stack, self.key, self.window_s = config, stack, key, window_s
        # the servers are this process's children: they are named by their command lines, and this
        # process (the load generator) by its own
        self.meter = CpuMeter(stack.processes(), role_of_command)
        self.counter = 0

    def query(self) -> str:
        self.counter += 1
        return f"capital France {self.counter}"  # three words, no question mark: the rules say tier A

    async def window(self, client: LoadClient, what: str, rate: float, trial: int, clients: int = 0) -> Point:
        point = Point(self.config, what, rate, trial, self.window_s)
        before = self.meter.snapshot()
        started = time.monotonic()
        if rate > 0:
            loop = await open_loop(lambda k: client.answer(self.query(), timeout=self.window_s + GRACE_S, lane=k),
                                   rate, count=max(1, round(rate * self.window_s)))
            point.calls = list(loop.results)
        else:
            stop_at = started + self.window_s

            async def one_client(lane: int) -> list[CallRecord]:
                done = []
                while time.monotonic() < stop_at:
                    done.append(await client.answer(self.query(), timeout=30.0, lane=lane))
                return done

            for calls in await asyncio.gather(*(one_client(i) for i in range(clients))):
                point.calls.extend(calls)
            point.calls.sort(key=lambda c: c.start)
        elapsed = time.monotonic() - started
        point.cpu = CpuMeter.used(before, self.meter.snapshot())
        point.window_s = self.window_s if rate > 0 else elapsed
        point.load = os.getloadavg()
        return point


async def measure(run: Run, clients: int, trials: int, ladder: tuple[float, ...], say: Any,
                  base: float | None = None) -> dict[str, Any]:
    """Probe, reference and ladder of one configuration; the reference and the ladder are shares
    of `base` (the first configuration's probe, so both are tried at the same rates), else of
    this configuration's own probe."""
    client = LoadClient(run.stack.address, run.key, channels=4)
    await client.ready()
    try:
        warm = [await client.answer(run.query(), timeout=30) for _ in range(20)]  # connections, pools
        if not all(c.ok and c.tier == "A" for c in warm):
            raise RuntimeError(f"the stack does not answer tier A: {sorted({(c.code, c.tier, c.detail) for c in warm})}")
        points: list[Point] = []
        probe = await run.window(client, "probe", 0.0, 1, clients)
        points.append(probe)
        probed = len(probe.ok()) / probe.window_s
        x = base or probed
        say(f"{run.config} replica(s): probe: {probed:.1f} answers/s, p95 {probe.p95_ms():.0f} ms; rates are shares of {x:.1f}/s")
        reference = await run.window(client, "reference", REFERENCE_SHARE * x, 1)
        points.append(reference)
        bound = max(BOUND_FLOOR_MS, BOUND_FACTOR * (reference.p95_ms() or 0.0))
        say(f"{run.config} replica(s): reference at {REFERENCE_SHARE * x:.1f}/s: p95 {reference.p95_ms():.0f} ms -> bound {bound:.0f} ms")
        ceiling, first_failed = None, None
        for share in ladder:
            rate = share * x
            held = True
            for trial in range(1, trials + 1):
                point = await run.window(client, "ladder", rate, trial)
                points.append(point)
                verdict = point.summary(bound)
                say(f"{run.config} replica(s): {rate:.1f}/s trial {trial}: answered {verdict['answered_per_s']}/s, "
                    f"p95 {verdict['p95_ms'] or 0:.0f} ms, cpu {verdict['cpu_percent_total']} % "
                    f"{'OK' if verdict['sustained'] else verdict['reasons']}")
                if not verdict["sustained"]:
                    held = False
                    break
            if not held:
                first_failed = rate
                break
            ceiling = rate
        at_ceiling = [p for p in points if p.what == "ladder" and ceiling is not None and abs(p.rate - ceiling) < 1e-9]
        cpu_at_ceiling: dict[str, float] = {}
        for p in at_ceiling:
            for role, seconds in p.cpu.items():
                cpu_at_ceiling[role] = cpu_at_ceiling.get(role, 0.0) + seconds
        window_total = sum(p.window_s for p in at_ceiling) or 1.0
        return {
            "config": run.config, "frontdoors": list(run.stack.frontdoors), "probe_answers_per_s": round(probed, 2),
            "ladder_base_per_s": round(x, 2),
            "p95_bound_ms": round(bound, 1), "ceiling_per_s": None if ceiling is None else round(ceiling, 2),
            "first_not_sustained_per_s": None if first_failed is None else round(first_failed, 2),
            "cpu_percent_of_one_core_at_ceiling": {
                k: round(100 * v / window_total, 1) for k, v in sorted(cpu_at_ceiling.items(), key=lambda kv: -kv[1])},
            "stack": run.stack.using, "facts": run.stack.facts(),
            "points": [p.summary(bound) for p in points], "_points": points,
        }
    finally:
        await client.close()


def run_config(config: str, workdir: Path, args: argparse.Namespace, say: Any,
               base: float | None = None) -> dict[str, Any]:
    from lab.harness.stack import Hosts, Parts, lab_stack

    parts = Parts(broker="redis", records="postgres", classifier="rules", retriever="tantivy", llm="instant")
    hosts = Hosts(frontdoors=CONFIGS[config], pools={"host3": ("A",), "host4": ("A",)})
    settings = dict(llm_api="completions", router="rules", concurrency={"A": args.pool_concurrency},
                    tenant_rate_per_s=0, tenant_slots={"A": 0, "B": 0, "C": 0})
    with lab_stack(workdir / config, parts, hosts=hosts, settings=settings, tenants=("acme",), dotenv=False,
                   env={"ARAG_TRACES": "off"}) as stack:
        run = Run(config, stack, stack.api_key("acme"), args.window)
        ladder = LADDER[2:5] if args.quick else LADDER
        return asyncio.run(measure(run, args.clients, 1 if args.quick else args.trials, ladder, say, base))


def write_report(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "calls.jsonl.gz", "wt", encoding="utf-8") as raw:
        for config in result["configs"]:
            for p in config.pop("_points"):
                for c in p.calls:
                    raw.write(json.dumps({"config": p.config, "what": p.what, "rate": round(p.rate, 2),
                                          "trial": p.trial, **c.as_dict()}) + "\n")
    (out / "summary.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    one, two = (next(c for c in result["configs"] if c["config"] == name) for name in ("one", "two"))
    ratio = (two["ceiling_per_s"] / one["ceiling_per_s"]) if one["ceiling_per_s"] and two["ceiling_per_s"] else None
    plot = make_plot(result, out)

    def cpu_line(config: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v:g}" for k, v in list(config["cpu_percent_of_one_core_at_ceiling"].items())[:8])

    lines = [
        "# One or two front-door replicas behind the gRPC load balancer: the ceiling with the instant LLM",
        "",
        "**Question.** Past one machine the front doors run as replicas behind nginx `grpc_pass`. Do two replicas "
        "serve more Answers per second than one, and if not, which process saturates the machine first?",
        "",
        f"**Answer ({result['started'][:10]}).** One replica: ceiling **{one['ceiling_per_s']}** Answers/s "
        f"(next rate {one['first_not_sustained_per_s']} not sustained); two replicas: **{two['ceiling_per_s']}** "
        f"(next {two['first_not_sustained_per_s']} not sustained)"
        + (f"; two/one = **{ratio:.2f}x**" if ratio else "") + ". "
        + ("The target of 1.7x is not reached on this machine: " if ratio is not None and ratio < 1.7 else "")
        + "CPU at the ceiling (% of one core) with one replica: " + cpu_line(one)
        + "; with two: " + cpu_line(two) + ". The hosts are namespaces of one machine: every process of every "
        "\"host\" shares its 2 cores (with other jobs beside this run), so a second replica adds a process, "
        "not a machine.",
        "",
        "**Reading.** The ceiling is where the p95 leaves its bound, and at it this stack used about "
        + f"{one['points'][-2]['cpu_percent_total'] if len(one['points']) > 1 else '?'} % of one core in all (last "
        "sustained window; the column *CPU total %* below): the rest of the 2 cores went to the other jobs on the "
        "machine (the load average is in every row). Within that share, a second front door halves each one's "
        "CPU but adds a process, its connections and its health cycle to the same cores, so the pair is not "
        "faster here. Whether two replicas reach 1.7x one needs each on cores of its own, which this machine "
        "cannot show.",
        "",
        f"**Records.** `calls.jsonl.gz` (every call), `summary.json` (every window, CPU per role), `{plot}`.",
        "",
        f"Command: `{result['command']}`  ",
        f"Run: {result['started']} -> {result['finished']}; {result['machine']}",
        "",
        "Stack (per configuration, started afresh): " + "; ".join(f"{k}: {v}" for k, v in one["stack"].items()),
        f"Worker pools: tier A on host3 and host4, {result['pool_concurrency']} processes each; traces off; "
        "tenant rate and slots unlimited; every question distinct (no cache answers).",
        "",
        "Method: the one-replica closed-loop probe (no think time) gives X, the rates of both ladders; per "
        "configuration a reference at 25 % of X gives the p95 bound "
        f"({BOUND_FACTOR:g}x its p95, at least {BOUND_FLOOR_MS:g} ms); open-loop rates at {', '.join(f'{s:g}' for s in LADDER)} "
        f"x X, each held {result['trials']} times for {result['window_s']:g} s; **sustained** = in every trial, every "
        f"call of the window answered OK within it plus {GRACE_S:g} s, and p95 within the bound.",
        "",
        "| replicas | closed-loop probe (answers/s) | p95 bound ms | ceiling (answers/s) | first rate not sustained |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for c in (one, two):
        lines.append(f"| {c['config']} | {c['probe_answers_per_s']} | {c['p95_bound_ms']:.0f} | **{c['ceiling_per_s']}** "
                     f"| {c['first_not_sustained_per_s']} |")
    lines += ["", "## Every window", "",
              "| replicas | what | rate/s | trial | calls | answered/s | p50 ms | p95 ms | CPU total % | top CPU (% of one core) | load 1 min | verdict |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for c in (one, two):
        for p in c["points"]:
            top = ", ".join(f"{k} {v:g}" for k, v in list(p["cpu_percent_of_one_core"].items())[:5])
            verdict = ("sustained" if p["sustained"] else "; ".join(p["reasons"])) if p["what"] == "ladder" else ""
            lines.append(f"| {c['config']} | {p['what']} | {p['rate']} | {p['trial']} | {p['calls']} | {p['answered_per_s']} "
                         f"| {p['p50_ms'] or 0:.0f} | {p['p95_ms'] or 0:.0f} | {p['cpu_percent_total']} | {top} "
                         f"| {p['load_average'][0]:.1f} | {verdict} |")
    lines += ["", "Not measured here: separate machines (a second replica on its own cores), network latency "
              "between hosts, the real reader (its cost dwarfs the front door's: `../load/ceiling/`)."]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def make_plot(result: dict[str, Any], out: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for c in result["configs"]:
        ladder = [p for p in c["points"] if p["what"] == "ladder"]
        left.plot([p["rate"] for p in ladder], [p["answered_per_s"] for p in ladder], "o-", label=f"{c['config']} replica(s)")
        right.plot([p["rate"] for p in ladder], [p["p95_ms"] or 0 for p in ladder], "o-", label=f"{c['config']} replica(s)")
    left.set(xlabel="offered Answers/s", ylabel="answered Answers/s", title="throughput")
    right.set(xlabel="offered Answers/s", ylabel="p95 ms", title="latency", yscale="log")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "replicas.png", dpi=110)
    plt.close(fig)
    return "replicas.png"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.experiments.replicas", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one trial, three rates (~3 min); var/replicas/quick")
    parser.add_argument("--out", type=Path, default=None, help="default reports/replicas (quick: var/replicas/quick)")
    parser.add_argument("--scratch", type=Path, default=None, help="default var/replicas/<run>")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per window (default %(default)s)")
    parser.add_argument("--trials", type=int, default=3, help="trials per rate (default %(default)s)")
    parser.add_argument("--clients", type=int, default=16, help="closed-loop probe clients (default %(default)s)")
    parser.add_argument("--pool-concurrency", type=int, default=POOL_CONCURRENCY)
    args = parser.parse_args(argv)
    from rich.console import Console

    from services.demo.local import install_stop_signals

    console = Console(width=160)
    install_stop_signals()
    started = datetime.now(timezone.utc)
    run = "quick" if args.quick else f"full-{started:%Y%m%d-%H%M%S}"
    out = (args.out or (REPO / "var/replicas/quick" if args.quick else REPO / "reports/replicas")).resolve()
    scratch = (args.scratch or REPO / "var/replicas" / run).resolve()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    result: dict[str, Any] = {
        "question": "one vs two front-door replicas behind nginx grpc_pass: ceiling with the instant LLM",
        "command": " ".join([".venv/bin/python -m lab.experiments.replicas", *(argv if argv is not None else sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "machine": (f"{os.cpu_count()} CPU cores, {platform.platform()}, Python {platform.python_version()}; load "
                    f"average at start {load}; the machine is shared with other jobs"),
        "window_s": args.window, "trials": 1 if args.quick else args.trials, "pool_concurrency": args.pool_concurrency,
        "configs": [],
    }
    base = None
    for config in CONFIGS:  # one replica first: its probe sets the rates both ladders try
        console.print(f"[bold]{config} replica(s)[/]")
        result["configs"].append(run_config(config, scratch, args, console.print, base))
        base = base or result["configs"][-1]["probe_answers_per_s"]
    result["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_report(result, out)
    console.print(f"report: {out / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
