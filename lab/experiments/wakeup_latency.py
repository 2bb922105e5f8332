"""What one round trip to each backing service costs back to back and paced, with and without a
CPU wake-up latency limit: the price of idle CPUs for a lightly loaded stack.

An Answer crosses about eight processes (client, front door, Triton and its Python backend,
PostgreSQL, Redis, a worker's main process and its pool process). Under a closed loop they never
sleep; under an open-loop load below the ceiling each of them sleeps between calls, and on a
virtual machine an idle vCPU halts, so every hop first pays for waking it. This measures one
hop of each kind the front door and the workers make:
- Redis `PING` (redis-py, hiredis);
- PostgreSQL `SELECT 1` (psycopg, autocommit);
- Triton: one inference of the shipped router (tritonclient gRPC, as `arag` publishes it), with
  Triton's own split of it (its inference statistics: queue, and `compute_infer`, the Python
  backend's round trip to its stub and the model's run).

Each call is made after a pause of `gap` ms (0: back to back). Every gap is measured in blocks
that alternate between no limit and a held PM QoS limit of 0 us (`lab.harness.stats.hold_cpu_latency`:
idle CPUs poll instead of halting), so a change of the machine's load touches both alike.

    .venv/bin/python -m lab.experiments.wakeup_latency --out reports/load/wakeup-latency

Writes `report.md` and `report.json`. Holding the limit needs root; without it, `--no-limit`
measures the machine as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.harness.stats import CpuLatencyUnavailable, hold_cpu_latency, median, percentile

REPO = Path(__file__).resolve().parents[2]
SETTINGS = ("no limit", "PM QoS 0 us")


def timed(call: Callable[[], object], calls: int, gap_s: float) -> list[float]:
    """`calls` round trips, each after a pause of `gap_s`; ms each."""
    out = []
    for _ in range(calls):
        if gap_s:
            time.sleep(gap_s)
        started = time.perf_counter()
        call()
        out.append(1000 * (time.perf_counter() - started))
    return out


TRITON = "Triton inference (shipped router)"
# Triton's cumulative inference statistics: (count, ns) per phase.
ServerStats = Callable[[], dict[str, tuple[int, int]]]
PHASES = ("success", "queue", "compute_infer")


def service_calls(stack: ExitStack, workdir: Path) -> tuple[dict[str, Callable[[], object]], ServerStats]:
    """One round-trip call per service, on servers the lab's stack starts on loopback (its servers
    only), and Triton's statistics."""
    import numpy as np
    import psycopg
    import redis
    import tritonclient.grpc as triton

    from adaptive_rag.contracts import CLASSIFIER_MODEL
    from lab.experiments.frontdoor_overhead import model_repository
    from lab.harness.stack import Parts, lab_stack

    workdir.mkdir(parents=True, exist_ok=True)
    repository = model_repository(workdir / "model_repositories", "shipped", workdir / "setup.log")
    servers = stack.enter_context(lab_stack(
        workdir / "servers", Parts(broker="redis", records="postgres", classifier="triton"), pools=(),
        frontdoor=False, tenants=(), model_repository=repository, postgres_durability="full"))
    client = redis.Redis.from_url(servers.redis.url)
    url = servers.settings.library.database_url.replace("postgresql+psycopg://", "postgresql://")
    conn = stack.enter_context(psycopg.connect(url, autocommit=True))
    infer = triton.InferenceServerClient(servers.triton.url)
    ids = np.array([[5, 17, 300, 42, 9, 1000, 7, 8]], dtype=np.int64)

    def classify() -> object:
        inputs = [triton.InferInput("input_ids", ids.shape, "INT64"),
                  triton.InferInput("attention_mask", ids.shape, "INT64")]
        inputs[0].set_data_from_numpy(ids)
        inputs[1].set_data_from_numpy(np.ones_like(ids))
        return infer.infer(CLASSIFIER_MODEL, inputs)

    def triton_stats() -> dict[str, tuple[int, int]]:
        stats = infer.get_inference_statistics(CLASSIFIER_MODEL, as_json=True)
        phases = stats["model_stats"][0]["inference_stats"]
        return {k: (int(phases[k].get("count", 0)), int(phases[k].get("ns", 0))) for k in PHASES}

    calls = {"Redis PING": client.ping, "PostgreSQL SELECT 1": lambda: conn.execute("SELECT 1").fetchone(),
             TRITON: classify}
    return calls, triton_stats


def measure(calls: dict[str, Callable[[], object]], gaps_ms: list[float], blocks: int,
            block_size: int, limit: bool, server_stats: ServerStats | None = None,
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """samples[service][gap][setting] -> ms, blocks alternating between the settings; and
    Triton's own mean ms per phase [gap][setting] over the same calls (with `server_stats`)."""
    samples: dict[str, dict[str, dict[str, list[float]]]] = {
        name: {str(g): {s: [] for s in SETTINGS} for g in gaps_ms} for name in calls}
    totals = {str(g): {s: dict.fromkeys(PHASES, (0, 0)) for s in SETTINGS} for g in gaps_ms}
    for name, call in calls.items():
        timed(call, 50, 0.0)  # warm: connections open, code paths loaded
        for gap in gaps_ms:
            for block in range(blocks):
                order = SETTINGS if block % 2 == 0 else SETTINGS[::-1]
                for setting in order:
                    if setting != SETTINGS[0] and not limit:
                        continue
                    track = server_stats is not None and name == TRITON
                    before = server_stats() if track else {}
                    with hold_cpu_latency(0 if setting != SETTINGS[0] else None):
                        samples[name][str(gap)][setting] += timed(call, block_size, gap / 1000)
                    if track:
                        after, seen = server_stats(), totals[str(gap)][setting]
                        for k in PHASES:
                            seen[k] = (seen[k][0] + after[k][0] - before[k][0], seen[k][1] + after[k][1] - before[k][1])
            row = samples[name][str(gap)]
            print(f"{name:36s} gap {gap:5g} ms: " + "  ".join(
                f"{s} p50 {median(v):.3f} ms" for s, v in row.items() if v), flush=True)
    triton = {g: {s: {k: (ns / n / 1e6 if n else None) for k, (n, ns) in by.items()} for s, by in row.items()}
              for g, row in totals.items()} if server_stats is not None else {}
    return samples, triton


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# One round trip, back to back and paced, with and without a CPU wake-up latency limit\n",
        f"Command: `{report['command']}`  ",
        f"Run: {report['started']} -> {report['finished']}; {report['machine']}\n",
        "Each call follows a pause of `gap` (0: back to back); blocks of "
        f"{report['block_size']} calls alternate between no limit and a PM QoS limit of 0 us held "
        "on `/dev/cpu_dma_latency` (idle CPUs poll instead of halting), "
        f"{report['blocks']} blocks per setting and gap. Servers on loopback, started by the run.\n",
        "| round trip | gap ms | no limit p50 / p90 / p99 ms | x back to back (p50) | PM QoS 0 us p50 / p90 / p99 ms | x back to back (p50) |",
        "| --- | ---: | --- | ---: | --- | ---: |",
    ]
    for name, by_gap in report["samples"].items():
        base = {s: by_gap[str(report["gaps_ms"][0])][s] for s in SETTINGS}
        for gap in report["gaps_ms"]:
            cells = []
            for s in SETTINGS:
                values = by_gap[str(gap)][s]
                if not values:
                    cells += ["-", "-"]
                    continue
                p50 = median(values)
                cells += [f"{p50:.3f} / {percentile(values, 90):.3f} / {percentile(values, 99):.3f}",
                          f"{p50 / median(base[s]):.1f}x" if base[s] else "-"]
            lines.append(f"| {name} | {gap:g} | " + " | ".join(cells) + " |")
    if report.get("triton"):
        lines += ["", "Triton's own split of the same inferences (its inference statistics, mean ms per "
                  "inference): `success` = in the server, from the request's arrival to its response; "
                  "`compute_infer` = the Python backend's round trip to its stub process and the model's run.\n",
                  "| gap ms | setting | success | queue | compute_infer |", "| ---: | --- | ---: | ---: | ---: |"]
        for gap in report["gaps_ms"]:
            for s in SETTINGS:
                phases = report["triton"][str(gap)][s]
                if phases.get("success") is not None:
                    lines.append(f"| {gap:g} | {s} | " + " | ".join(f"{phases[k]:.3f}" for k in PHASES) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.experiments.wakeup_latency",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--gaps-ms", default="0,2,20,100", help="pauses before each call, comma-separated")
    parser.add_argument("--blocks", type=int, default=4, help="blocks per setting and gap")
    parser.add_argument("--block-size", type=int, default=40, help="calls per block")
    parser.add_argument("--no-limit", action="store_true", help="only the machine as it is (no PM QoS)")
    parser.add_argument("--workdir", type=Path, default=REPO / "var" / "wakeup-latency")
    parser.add_argument("--out", type=Path, default=REPO / "var" / "wakeup-latency" / "report")
    args = parser.parse_args(argv)
    gaps = [float(g) for g in args.gaps_ms.split(",") if g.strip()]
    if not args.no_limit:
        try:
            with hold_cpu_latency(0):
                pass
        except CpuLatencyUnavailable as exc:
            parser.error(f"{exc}; run as root or pass --no-limit")
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    load = os.getloadavg()
    with ExitStack() as stack:
        calls, triton_stats = service_calls(stack, args.workdir)
        samples, triton = measure(calls, gaps, args.blocks, args.block_size, not args.no_limit, triton_stats)
    report = {
        "command": " ".join([".venv/bin/python", "-m", "lab.experiments.wakeup_latency",
                             *(argv if argv is not None else sys.argv[1:])]),
        "started": started, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": (f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
                    f"{platform.platform()}; load average at start {load[0]:.2f}, at end {os.getloadavg()[0]:.2f}"),
        "gaps_ms": gaps, "blocks": args.blocks, "block_size": args.block_size, "samples": samples,
        "triton": triton,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    (args.out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
