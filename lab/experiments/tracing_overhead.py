"""What tracing costs one request: the spans of a tier-C Answer made with the project's own helpers,
with tracing off (no SDK: non-recording spans) and with each local exporter (`ARAG_TRACES=file`,
`console` to /dev/null), each mode in a fresh process (the global tracer provider is set once).

One request = the front door's side (server span, nine `serving.*` stage spans, the producer
span with the header injection) and the worker's (task span, records claim, resources, strategy
span, two retrieve + three generate spans with token attributes, records write): 20 spans, the
shape of `reports/reliability/trace-c-request.txt`. CPU is the process's, all threads, so the
exporter's background thread (JSON encoding, file writes) is counted, up to the final flush.

    python -m lab.experiments.tracing_overhead [--requests 3000] [--out reports/tracing]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGES = ("authenticate", "validate", "knowledge", "classify", "record", "admit", "enqueue", "wait", "reply")


def one_request() -> None:
    from opentelemetry import trace

    from adaptive_rag import tracing
    from adaptive_rag.strategies.base import PhaseTimer

    with tracing.span("/adaptive_rag.v1.AdaptiveRag/Answer", kind=trace.SpanKind.SERVER):
        carrier: dict[str, str] = {}
        for stage in STAGES:
            with tracing.span(f"serving.{stage}"):
                if stage == "enqueue":
                    with tracing.span("send adaptive_rag.answer", kind=trace.SpanKind.PRODUCER,
                                      **{"messaging.destination.name": "tier-c"}):
                        tracing.inject_context(carrier)
        with tracing.span("run/adaptive_rag.answer", kind=trace.SpanKind.CONSUMER,
                          **{"arag.request_id": "0" * 32, "arag.tier": "C"}):
            for name in ("records.claim", "resources"):
                with tracing.span(name):
                    pass
            with tracing.span("strategy ircot", strategy="ircot"):
                timer = PhaseTimer()
                for step in range(3):
                    if step < 2:
                        with timer.phase("retrieve"):
                            pass
                    with timer.phase("generate"):
                        tracing.annotate(**{tracing.INPUT_TOKENS: 650, tracing.OUTPUT_TOKENS: 12})
            with tracing.span("records.write"):
                pass


def measure(mode: str, requests: int) -> dict[str, float]:
    """In this process: install `mode`, run `requests` requests, flush; seconds per request."""
    from workers.telemetry import TracingSettings, configure_tracing, flush_tracing

    folder = Path(tempfile.mkdtemp(prefix="arag-trace-bench-"))
    if mode != "off":
        configure_tracing("bench", TracingSettings(_env_file=None, traces=mode, traces_dir=folder))
    for _ in range(200):  # warm up
        one_request()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(requests):
        one_request()
    caller_wall = time.perf_counter() - wall
    flush_tracing(60_000)
    total_cpu = time.process_time() - cpu
    written = sum(f.stat().st_size for f in folder.glob("*.jsonl"))
    return {"mode": mode, "requests": requests, "wall_us_per_request": 1e6 * caller_wall / requests,
            "cpu_us_per_request": 1e6 * total_cpu / requests,
            "bytes_per_request": written / (requests + 200) if written else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # the child's own run
    args = parser.parse_args(argv)
    if args.mode:
        if args.mode == "console":
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the exporter's stream for the run
        print(json.dumps(measure(args.mode, args.requests)))
        return 0
    rows = []
    for mode in ("off", "file", "console", "off", "file", "console"):  # interleaved, twice
        done = subprocess.run([sys.executable, "-m", "lab.experiments.tracing_overhead", "--mode", mode,
                               "--requests", str(args.requests)], cwd=REPO, capture_output=True,
                              text=True, check=True, env={**os.environ, "ARAG_TRACES": "off"})
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = {}
    for row in rows:  # the better of the two runs per mode (the machine is shared)
        if row["mode"] not in best or row["cpu_us_per_request"] < best[row["mode"]]["cpu_us_per_request"]:
            best[row["mode"]] = row
    off = best["off"]["cpu_us_per_request"]
    lines = [
        "# Tracing overhead per request (20 spans of a tier-C Answer)", "",
        f"Command: `python -m lab.experiments.tracing_overhead --requests {args.requests}`; each mode in a "
        "fresh process, interleaved, run twice, the lower CPU of the two kept (2 shared cores).", "",
        "| ARAG_TRACES | caller's time per request (µs) | CPU per request, all threads (µs) | extra CPU vs off (µs) | bytes written per request |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for mode in ("off", "file", "console"):
        row = best[mode]
        lines.append(f"| {mode} | {row['wall_us_per_request']:.0f} | {row['cpu_us_per_request']:.0f} | "
                     f"{row['cpu_us_per_request'] - off:+.0f} | {row['bytes_per_request']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "overhead.md").write_text(text)
        (args.out / "overhead.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
